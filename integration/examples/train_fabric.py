"""train_ddp.py's model and data under Lightning Fabric (DDPStrategy, CPU, gloo):
`fabric.setup` wraps the model in DistributedDataParallel before the restore,
`fabric.no_backward_sync` skips the gradient sync of the accumulation
micro-steps, `fabric.backward` runs the backward pass; ftrun.save every step
and ftrun.load at start, where a Fabric loop calls fabric.save and
fabric.load (the README's Lightning section; a rank of
tests/integration/test_ddp_exact.py).

    ftrun --num_nodes 2 --num_gpus 2 integration/examples/train_fabric.py --steps 30
    ftrun --num_nodes 2 --num_gpus 2 integration/examples/train_fabric.py --steps 30 --fsdp

--fsdp: Fabric's FSDPStrategy in lit-gpt's configuration (lightning_fsdp.py).
Every rank saves only its own shards: the sharded state dicts of
torch.distributed.checkpoint.state_dict (get_state_dict), restored in place
into the live ones (ftrun.restore_into) and handed to set_state_dict, as the
README's FSDP section shows; where a Fabric loop would call fabric.save,
which writes its own DCP directory.

Fabric finds ftrun's torchrun environment (TORCHELASTIC_RUN_ID, RANK,
LOCAL_RANK, WORLD_SIZE, ...) itself. Killed and restarted, the run ends
bit-identical to the run without failures. Output as train_ddp.py's.
"""
import os
import sys

try:
    import ftrun  # noqa: F401  (train_ddp uses it; a clear message first)
except ImportError as e:
    sys.stderr.write(f"train_fabric.py: cannot import ftrun ({e}); run it under ftrun or ftrun-agent\n")
    sys.exit(2)

import lightning as L
import torch
import torch.nn.functional as F
from lightning.fabric.strategies import DDPStrategy

from lightning_fsdp import fabric_fsdp, full_weights_digest  # noqa: E402  (beside this script)
import train_ddp  # noqa: E402
from train_ddp import TiedGPT, parse_args, resume, train  # noqa: E402
from train_gpt import weights_digest  # noqa: E402
from train_gpt_fsdp import fsdp_restore, fsdp_state  # noqa: E402


def sharded_state(model, optimizer):
    """The sharded state dicts (train_gpt_fsdp's) of the FSDP module and torch optimizer in Fabric's
    wrappers: each rank's own shards, nothing gathered."""
    msd, osd = fsdp_state(model._forward_module, optimizer.optimizer)
    return {"model": msd, "optim": osd}


def put_sharded_state(model, optimizer, state):
    """The restored shards back in place (train_gpt_fsdp.fsdp_restore)."""
    fsdp_restore(model._forward_module, optimizer.optimizer, state)


def main():
    a = parse_args()
    strategy = fabric_fsdp() if a.fsdp else DDPStrategy(process_group_backend="gloo",
                                                          find_unused_parameters=a.find_unused,
                                                          static_graph=a.static_graph)
    fabric = L.Fabric(accelerator="cpu", devices=int(os.environ["LOCAL_WORLD_SIZE"]),
                      num_nodes=int(os.environ["GROUP_WORLD_SIZE"]), strategy=strategy)
    fabric.launch()
    rank = fabric.global_rank
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(a.seed)
    raw = TiedGPT(a)
    if a.fsdp:  # FSDP: the optimizer over the wrapped (sharded) parameters
        model = raw = fabric.setup_module(raw)
        optimizer = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1))
        state, put = sharded_state, put_sharded_state
        digest = lambda m: full_weights_digest(m._forward_module, m, weights_digest)  # noqa: E731
    else:
        optimizer = torch.optim.AdamW(raw.parameters(), lr=3e-3, weight_decay=0.1)
        model, optimizer = fabric.setup(raw, optimizer)  # DDP is built here, before the restore
        state, put, digest = train_ddp.model_state, train_ddp.put_model_state, weights_digest
    torch.manual_seed(a.seed + 1 + rank)

    start = resume(raw, optimizer, rank, put)  # a Fabric loop: fabric.load(path, state)

    def micro_step(x, y, last):
        with fabric.no_backward_sync(model, enabled=not last):
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten()) / a.accum
            fabric.backward(loss)
        return loss

    train(a, rank, raw, optimizer, start, micro_step, state, digest)

if __name__ == "__main__":
    main()
