"""train_ddp.py's job under DLRover's flash checkpoint instead of ftrun: a peer bench/stack_recovery.py
can measure ftrun against. Not an ftrun example: nothing of ftrun runs here.

DLRover 0.6.1 as its DDP example (examples/pytorch/nanogpt/train.py) sets it up: dlrover-run's agent
restarts the workers after a failure (--max-restarts); a DdpCheckpointer in DIR (`--checkpoint
dlrover:DIR`) saves {model, optim, step} after every step with StorageType.MEMORY (rank 0 copies it into
the node's shared memory, which the agent keeps across restarts) and every --disk-every steps (default
10; 0: never) with StorageType.DISK (the agent then writes DIR/<steps done>/rank_0.pt in the background).
At start every rank's load_checkpoint gives the state in shared memory, or else the newest in DIR. The
generators are not saved (nor are they in DLRover's example): dropout differs after a restart.

    python -m dlrover.python.master.main --platform local --node_num 1 --job_name JOB --port PORT &
    DLROVER_MASTER_ADDR=127.0.0.1:PORT ELASTIC_JOB_NAME=JOB dlrover-run --nnodes 1 --nproc_per_node 4 \\
        --max-restarts 3 integration/examples/train_dlrover.py --steps 30 --checkpoint dlrover:DIR

The master is started beside dlrover-run because `dlrover-run --standalone`, which would start it,
fails with torch 2.13 (dlrover/trainer/torch/elastic_run.py): `TypeError: SubprocessHandler.__init__()
missing 1 required positional argument: 'numa_options'`. The master outlives the job: stop it after.

Lines as train_ddp.py's (rank 0 `LOSS <step> <hex>`, `RESUMED <rank> <step>` after a restore,
`WEIGHTS <rank> <digest>` at the end) and `STARTED <rank>` when a process begins.
"""
import argparse
import copy
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_ddp import new_model, parse_args  # noqa: E402  (beside this script)
from train_gpt import batch, say, weights_digest  # noqa: E402


def main():
    from dlrover.trainer.torch.flash_checkpoint.ddp import DdpCheckpointer, StorageType

    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--disk-every", type=int, default=10)
    mine, rest = p.parse_known_args()
    a = parse_args(rest, own=("dlrover",))
    if a.checkpoint != "none" and not a.own_dir:
        sys.exit("train_dlrover.py saves through DLRover: --checkpoint dlrover:DIR (or none)")
    rank = int(os.environ["RANK"])
    say(f"STARTED {rank}")
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    raw = new_model(a)
    optimizer = torch.optim.AdamW(raw.parameters(), lr=3e-3, weight_decay=0.1)
    torch.manual_seed(a.seed + 1 + rank)  # dropout: each rank its own stream
    ckpt = DdpCheckpointer(a.own_dir) if a.own_dir else None
    start = 0
    # A state from shared memory is views of it, the same buffers in every rank of the node: copied, else
    # the optimizer's state would be them (load_state_dict keeps CPU tensors) and every rank would step it.
    state = copy.deepcopy(ckpt.load_checkpoint()) if ckpt else None
    if state:
        raw.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])
        start = state["step"] + 1
        say(f"RESUMED {rank} {state['step']}")
    model = DDP(raw)
    for step in range(start, a.steps):
        for micro in range(a.accum):
            x, y = batch(a, step * a.accum + micro, rank, "cpu")
            model.require_backward_grad_sync = micro == a.accum - 1  # nanoGPT's no_sync
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten()) / a.accum
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if rank == 0:
            say(f"LOSS {step} {loss.item().hex()}")
        if ckpt:
            # DLRover's step: the steps done (a step 0 in shared memory is never loaded)
            disk = mine.disk_every and (step + 1) % mine.disk_every == 0
            state = {"model": raw.state_dict(), "optim": optimizer.state_dict(), "step": step}
            ckpt.save_checkpoint(step + 1, state, storage_type=StorageType.DISK if disk else StorageType.MEMORY)
        if a.step_ms:
            time.sleep(a.step_ms / 1000)
    say(f"WEIGHTS {rank} {weights_digest(raw)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
