"""train_ddp.py's model and data under Lightning Fabric (DDPStrategy, CPU, gloo):
`fabric.setup` wraps the model in DistributedDataParallel before the restore,
`fabric.no_backward_sync` skips the gradient sync of the accumulation
micro-steps, `fabric.backward` runs the backward pass; ftrun.save every step
and ftrun.load at start, where a Fabric loop calls fabric.save and
fabric.load (the README's Lightning section; a rank of
tests/integration/test_ddp_exact.py).

    ftrun --num_nodes 2 --num_gpus 2 integration/examples/train_fabric.py --steps 30

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

from train_ddp import TiedGPT, parse_args, resume, train  # noqa: E402  (beside this script)


def main():
    a = parse_args()
    fabric = L.Fabric(accelerator="cpu", devices=int(os.environ["LOCAL_WORLD_SIZE"]),
                      num_nodes=int(os.environ["GROUP_WORLD_SIZE"]),
                      strategy=DDPStrategy(process_group_backend="gloo", find_unused_parameters=a.find_unused,
                                           static_graph=a.static_graph))
    fabric.launch()
    rank = fabric.global_rank
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(a.seed)
    raw = TiedGPT(a)
    optimizer = torch.optim.AdamW(raw.parameters(), lr=3e-3, weight_decay=0.1)
    model, optimizer = fabric.setup(raw, optimizer)  # DDP is built here, before the restore
    torch.manual_seed(a.seed + 1 + rank)

    start = resume(raw, optimizer, rank)  # a Fabric loop: fabric.load(path, state)

    def micro_step(x, y, last):
        with fabric.no_backward_sync(model, enabled=not last):
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten()) / a.accum
            fabric.backward(loss)
        return loss

    train(a, rank, raw, optimizer, start, micro_step)

if __name__ == "__main__":
    main()
