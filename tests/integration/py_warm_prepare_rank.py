"""A rank under @ftrun.resilient(prepare=...) (tests/integration/test_warm_prepare.py).

    py_warm_prepare_rank.py FLAGS            the run below
    py_warm_prepare_rank.py FLAGS bad        prepare returns a list: the process must refuse it

prepare() builds the "model" (a dict recording the pid that built it and
whether it was a warm standby then). Generation 0: each rank's ctx.keep
must give the prepared object without calling its factory; both save
version 0; rank 1 waits until a standby has prepared, then SIGKILLs itself.
Generation 1: rank 0 (a survivor) must keep the same object; rank 1 (a
standby now) must get the object it prepared while it was a standby. Each
prints PREPARE OK <rank> <generation> when all held."""
import os
import signal
import sys
import time

import numpy as np

import ftrun
from rank_say import say

FLAGS = sys.argv[1]
BAD = sys.argv[2:] == ["bad"]


def prepare():
    standby = os.environ.get("FTRUN_WARM_STANDBY") == "1"
    if standby:
        open(os.path.join(FLAGS, f"standby-{os.getpid()}"), "w").close()
    return [] if BAD else {"model": {"pid": os.getpid(), "standby": standby}}


def never():
    raise AssertionError("ctx.keep called its factory although prepare made the object")


@ftrun.resilient(prepare=prepare)
def main(ctx):
    model = ctx.keep("model", never)
    assert model["pid"] == os.getpid(), f"the prepared object was made by pid {model['pid']}"
    if ctx.generation == 0:
        assert not model["standby"] and not ctx.standby
        from ftrun.state_client import get_client
        get_client().save(0, {"x": np.arange(16, dtype=np.float32)})
        get_client().wait_committed(0, timeout_ms=30000)
        say(f"PREPARE OK {ctx.rank} 0")
        if ctx.rank == 1:
            while not any(f.startswith("standby-") for f in os.listdir(FLAGS)):
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(120)  # rank 0: until the agent ends this generation
        return
    assert model["standby"] == (ctx.rank == 1) and ctx.standby == (ctx.rank == 1), (model, ctx)
    say(f"PREPARE OK {ctx.rank} {ctx.generation}")


if __name__ == "__main__":
    main()
