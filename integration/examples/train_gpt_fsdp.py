"""train_gpt.py --fsdp {1,2}; torch >= 2.4 (FSDP2 from torch.distributed.fsdp: 2.6).

`--fsdp 2` (torch >= 2.6: FSDP2 `fully_shard` on every block and the
root, on a 1-D device mesh over all ranks) or `--fsdp 1` (FSDP1
FullyShardedDataParallel, one unit per block, use_orig_params, a sharded
state dict) replaces train_gpt.py's data parallelism and ZeRO: every rank keeps only its
shard of the parameters and of a plain Adam's state. A save is
`get_state_dict(model, opt)` (torch.distributed.checkpoint.state_dict:
DTensors with FSDP2, ShardedTensors with FSDP1) through ftrun.save, which
stores each rank's LOCAL shards only (ftrun.sharded); a restore copies the
loaded shards into the live state dicts in place (ftrun.restore_into) and
hands them to `set_state_dict`. WEIGHTS is then the digest of the rank's own
local shards (it differs between ranks), and every save prints
`SAVED <rank> <step> <bytes_total of the save> <local shard bytes of the
state> <global bytes of the state>`. `--meta-init` (with `--fsdp 2`): see
sharded_model.
"""
import hashlib
import math

import torch
import torch.distributed as dist

import ftrun


def local_tensors(obj):
    """The local tensors of every tensor in obj, in order (a DTensor's local
    shard, a ShardedTensor's local shards, plain tensors as they are)."""
    from ftrun.sharded import _local_of

    if isinstance(obj, torch.Tensor):
        return list(_local_of(obj))
    if isinstance(obj, dict):
        return [t for k in sorted(obj, key=str) for t in local_tensors(obj[k])]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in local_tensors(v)]
    return []


def global_bytes(obj):
    if isinstance(obj, torch.Tensor):
        # A DTensor's / ShardedTensor's global size (ShardedTensor has no numel()).
        return math.prod(obj.size()) * torch.empty((), dtype=obj.dtype).element_size()
    if isinstance(obj, dict):
        return sum(global_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(global_bytes(v) for v in obj)
    return 0


def local_digest(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def shard_model(version, model, block_class, world, device):
    """Wraps the model with FSDP2 (version 2: every block_class module, then
    the root) or FSDP1 (1: one unit per block_class); returns the model to train."""
    if version == 2:
        try:
            from torch.distributed.fsdp import fully_shard  # torch >= 2.6
        except ImportError:
            from torch.distributed._composable.fsdp import fully_shard  # 2.4, 2.5
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device.type, (world,))
        for blk in (m for m in model.modules() if isinstance(m, block_class)):
            fully_shard(blk, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy, StateDictType
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    # device_id also for the CPU: FSDP1 otherwise computes on cuda:0 wherever CUDA is available.
    model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({block_class}), use_orig_params=True,
                 sharding_strategy=ShardingStrategy.FULL_SHARD, device_id=device)
    FSDP.set_state_dict_type(model, StateDictType.SHARDED_STATE_DICT)
    return model


def sharded_model(a, build, block_class, world, device):
    """The model to train, sharded (shard_model). With --meta-init no rank ever
    holds the whole model: it is built on the meta device, sharded, and each
    rank allocates (to_empty) and initializes only its own shards, from the
    same seed on every rank, with no broadcast; a restore then overwrites them
    with the rank's shards from ftrun (fsdp_restore)."""
    if not a.meta_init:
        return shard_model(a.fsdp, build().to(device), block_class, world, device)
    with torch.device("meta"):
        model = build()
    model = shard_model(a.fsdp, model, block_class, world, device)
    model.to_empty(device=device)
    torch.manual_seed(a.seed)
    with torch.no_grad():
        for m in model.modules():
            if hasattr(m, "reset_parameters"):
                m.reset_parameters()
    return model


def fsdp_state(model, opt):
    """(model state dict, optimizer state dict), sharded, keyed by parameter names."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    return get_state_dict(model, opt)


def fsdp_restore(model, opt, state):
    """Puts a loaded sharded state back: the loaded local shards are copied into
    the live (sharded) state dicts in place, which set_state_dict then loads."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    msd, osd = fsdp_state(model, opt)
    ftrun.restore_into(msd, state["model"])
    ftrun.restore_into(osd, state["optim"])
    set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)


def saved_line(rank, step, stats, state):
    """`SAVED <rank> <step> <bytes_total of the save> <local shard bytes> <global bytes>`."""
    local = sum(t.numel() * t.element_size() for t in local_tensors(state))
    return f"SAVED {rank} {step} {(stats or {}).get('bytes_total', -1)} {local} {global_bytes(state)}"


def fsdp_mean_loss(loss, world):
    """The mean loss over the ranks, for the log (FSDP already reduce-scattered
    the gradients in backward)."""
    lsum = loss.detach().reshape(1).clone()
    dist.all_reduce(lsum)
    return (lsum / world).item()
