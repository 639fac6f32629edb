"""An FSDP1 model's and its optimizers' state as each rank holds it: every
FullyShardedDataParallel unit's flat parameter shard (its padding included)
and each optimizer's own state_dict(), whose state is per local shard already.

Taking it costs a reference to each tensor: no collective, no per-parameter
bookkeeping. FSDP's sharded state dicts (SHARDED_STATE_DICT and
FSDP.optim_state_dict, what Lightning's FSDPStrategy saves) cost a large
part of a step in Python on every save: 0.27 s for the model's and 0.62 s
for the optimizer's per save in bench/stack_recovery.py's Lightning FSDP job
here, against 0.05-0.1 s for ftrun's save of the result.

Put back into the same model, wrapped the same way, on the same world size
(a restart under ftrun: the spares keep the world size), it is the state bit
for bit. It is not resharded: a version to load onto another world size is
saved as sharded state dicts (ftrun.lightning.Checkpoint(fsdp="sharded"),
ftrun.dcp).
"""
import torch
import torch.distributed as dist

FORMAT = 1


def _units(model):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return FSDP.fsdp_modules(model)  # every FSDP unit, in the model's module order


def _world():
    return dist.get_world_size() if dist.is_initialized() else 1


def _raw(optimizer):
    return getattr(optimizer, "_optimizer", optimizer)  # (a LightningOptimizer wraps the torch one)


def local_state(model, optimizers):
    """The rank's local state: {"format", "world", "flat": [each unit's flat shard or None], "optimizers":
    [each optimizer's state_dict()]}. The tensors are the live ones (save them before the next step)."""
    flat = []
    for unit in _units(model):
        param = unit._flat_param
        flat.append(None if param is None else param.detach())
    return {"format": FORMAT, "world": _world(), "flat": flat,
            "optimizers": [_raw(o).state_dict() for o in optimizers]}


def restore_local_state(model, optimizers, saved, what="ftrun.fsdp_local"):
    """Puts a local_state back into the live model and optimizers, in place. A state of another world size,
    wrapping, optimizer count or param groups is refused (ValueError naming what differs) before anything is
    changed."""
    if not isinstance(saved, dict) or saved.get("format") != FORMAT:
        raise ValueError(f"{what}: not an FSDP local state of format {FORMAT}: "
                         f"{saved.get('format') if isinstance(saved, dict) else type(saved).__name__}")
    world = _world()
    if saved["world"] != world:
        raise ValueError(f"{what}: saved on {saved['world']} ranks, restored on {world}: FSDP's local shards "
                         "are not resharded (save with sharded state dicts to load onto another world size)")
    units = _units(model)
    if len(saved["flat"]) != len(units):
        raise ValueError(f"{what}: the saved model has {len(saved['flat'])} FSDP units, the live one "
                         f"{len(units)}: wrap it the same way")
    if len(saved["optimizers"]) != len(optimizers):
        raise ValueError(f"{what}: {len(saved['optimizers'])} optimizer states saved, {len(optimizers)} optimizers")
    pairs = []
    for i, (unit, shard) in enumerate(zip(units, saved["flat"])):
        param = unit._flat_param
        if (param is None) != (shard is None) or (param is not None and (
                param.numel() != shard.numel() or param.dtype != shard.dtype)):
            have = None if param is None else (param.numel(), param.dtype)
            want = None if shard is None else (shard.numel(), shard.dtype)
            raise ValueError(f"{what}: FSDP unit {i} ({type(unit.module).__name__}) holds a flat shard of "
                             f"(numel, dtype) {have}, the saved one {want}: wrap the model the same way")
        if param is not None:
            pairs.append((param, shard))
    for i, (optimizer, state) in enumerate(zip(optimizers, saved["optimizers"])):
        have = [len(g["params"]) for g in _raw(optimizer).param_groups]
        want = [len(g["params"]) for g in state["param_groups"]]
        if have != want:
            raise ValueError(f"{what}: optimizer {i} has param groups of {have} parameters, the saved one {want}")
    with torch.no_grad():
        for param, shard in pairs:
            param.copy_(shard.reshape(param.shape))
    for optimizer, state in zip(optimizers, saved["optimizers"]):
        _raw(optimizer).load_state_dict(state)
