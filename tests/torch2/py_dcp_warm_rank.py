"""A rank of tests/torch2/test_dcp_warm.py (3 ranks on one node, gloo, CPU),
under @ftrun.resilient: every step its state changes (a function of the
step: a tensor every rank holds, and one of its own) and dcp.async_save with
the process checkpointer saves it into ftrun (ftrun.dcp.StorageWriter).

Generation 0: rank KILLER SIGKILLs itself once its save of step KILL_AT is
done. Generation 1: the survivors (their processes kept: warm) and the new
rank dcp.load the version the agent restores (ftrun.dcp.StorageReader),
compare it with the state of that step, and go on saving with the process
checkpointer. DCP keeps its background process for the life of the rank's
process, in a process group of its own with the other ranks' background
processes: a survivor's must go with generation 0 (ftrun does it when the
survivor leaves), and the next async_save starts one in the new
generation's group whose writer connects to the agent anew.

Prints `GEN <rank> <generation> warm=<0|1> restored=<step|-1> equal=<0|1>`
at the start of every generation and `DONE <rank> <generation>` at the end."""
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

import ftrun
import ftrun.dcp

STEPS, KILL_AT, KILLER = 10, 4, 1


def say(line):
    os.write(1, (line + "\n").encode())


def state_at(step, rank):
    """What a rank holds after `step` (-1: nothing saved yet; a load must overwrite it)."""
    g = torch.Generator().manual_seed(1000 + step)  # the same on every rank (DCP writes it once)
    return {"shared": torch.randn(64, 64, generator=g), f"own{rank}": torch.full((256,), float(step * 10 + rank)),
            "step": torch.tensor(step)}


@ftrun.resilient
def main(ctx):
    rank = ctx.rank
    dist.init_process_group("gloo")
    start, version = 0, ctx.restore_version
    if version is not None:
        state = state_at(-1, rank)
        dcp.load(state, storage_reader=ftrun.dcp.StorageReader())
        want = state_at(version, rank)
        equal = all(torch.equal(state[k], want[k]) for k in want)
        start = version + 1
    else:
        equal = True
    say(f"GEN {rank} {ctx.generation} warm={int(ctx.warm)} restored={-1 if version is None else version} "
        f"equal={int(equal)}")
    future = None
    for step in range(start, STEPS):
        state = state_at(step, rank)
        if future is not None:
            future.result()
        future = dcp.async_save(state, storage_writer=ftrun.dcp.StorageWriter(step),
                                async_checkpointer_type=AsyncCheckpointerType.PROCESS)
        if ctx.generation == 0 and rank == KILLER and step == KILL_AT:
            future.result()
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.05)
    future.result()
    say(f"DONE {rank} {ctx.generation}")
    dist.destroy_process_group()


if __name__ == "__main__":  # (DCP's background process imports this file again: spawn)
    sys.argv = sys.argv[:1]  # (--local_rank=N)
    main()
