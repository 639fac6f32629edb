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

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_ddp import new_model, parse_args, train  # noqa: E402  (beside this script)
from train_gpt import say  # noqa: E402


class DlroverCheckpoint:
    """DLRover's flash checkpoint of {model, optim, step}, as own_checkpoint.py's checkpoints are used by
    train_ddp.train: to the node's shared memory after every step, to DIR every `disk_every` steps."""

    def __init__(self, directory, disk_every):
        from dlrover.trainer.torch.flash_checkpoint.ddp import DdpCheckpointer, StorageType

        self.ckpt, self.disk_every, self.types = DdpCheckpointer(directory), disk_every, StorageType

    def load(self, raw, optimizer):
        """The step saved last (its state put into raw and optimizer), or None."""
        # A state from shared memory is views of it, the same buffers in every rank of the node: copied, else
        # the optimizer's state would be them (load_state_dict keeps CPU tensors) and every rank would step it.
        state = copy.deepcopy(self.ckpt.load_checkpoint())
        if not state:
            return None
        raw.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])
        return state["step"]

    def before_update(self):
        pass

    def save(self, step, raw, optimizer):
        # DLRover's step: the steps done (a step 0 in shared memory is never loaded)
        disk = self.disk_every and (step + 1) % self.disk_every == 0
        state = {"model": raw.state_dict(), "optim": optimizer.state_dict(), "step": step}
        self.ckpt.save_checkpoint(step + 1, state, storage_type=self.types.DISK if disk else self.types.MEMORY)

    def finish(self):
        pass


def main():
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
    ckpt = DlroverCheckpoint(a.own_dir, mine.disk_every) if a.own_dir else None
    step = ckpt.load(raw, optimizer) if ckpt else None
    if step is not None:
        say(f"RESUMED {rank} {step}")
    model = DDP(raw)

    def micro_step(x, y, last):
        model.require_backward_grad_sync = last  # nanoGPT's no_sync
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten()) / a.accum
        loss.backward()
        return loss

    train(a, rank, raw, optimizer, 0 if step is None else step + 1, micro_step, own=ckpt)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
