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
import time

try:
    import ftrun
except ImportError as e:
    sys.stderr.write(f"train_fabric.py: cannot import ftrun ({e}); run it under ftrun or ftrun-agent\n")
    sys.exit(2)

import lightning as L
import torch
import torch.nn.functional as F
from lightning.fabric.strategies import DDPStrategy

from train_ddp import TiedGPT, parse_args  # noqa: E402  (beside this script)
from train_gpt import batch, say, weights_digest  # noqa: E402


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

    start = 0
    resumed = ftrun.load()  # a Fabric loop: fabric.load(path, state)
    if resumed is not None:
        step, state = resumed
        raw.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])
        ftrun.set_rng_state(state["rng"])
        start = step + 1
        say(f"RESUMED {rank} {step}")

    for step in range(start, a.steps):
        for micro in range(a.accum):
            with fabric.no_backward_sync(model, enabled=micro < a.accum - 1):
                x, y = batch(a, step * a.accum + micro, rank, "cpu")
                loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten()) / a.accum
                fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if rank == 0:
            say(f"LOSS {step} {loss.item().hex()}")
        ftrun.save(step, {"model": raw.state_dict(), "optim": optimizer.state_dict(), "rng": ftrun.rng_state()})
        if a.step_ms:
            time.sleep(a.step_ms / 1000)
    ftrun.wait()
    say(f"WEIGHTS {rank} {weights_digest(raw)}")


if __name__ == "__main__":
    main()
