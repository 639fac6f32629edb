"""A rank under @ftrun.resilient whose survivor is told to leave in the
middle of a long backward pass (tests/integration/test_warm_interrupt.py).

Generation 0, rank 0: a forward pass through LAYERS wide linear layers; in
the backward pass, right after the last layer's gradient, a custom autograd
node creates FLAG, rank 1 (waiting for it) SIGKILLs itself, and the node
returns once rank 1 is dead (its pid in FLAG.pid: a zombie until its agent
reaps it), so that the agent's notice comes while the rest of the backward
pass runs, however loaded the machine: seconds of C++ (every layer's matrix
products). (A notice that comes during the wait itself is not acted on
there: the node silences ftrun's interrupt signal, and the gradient hook's
own check raises the Restart.) The
Restart must come out of loss.backward() before it is over: it is raised by
ftrun's gradient hook, so some parameters (or all: the hook runs before
the gradient lands) have no gradient yet. Generation 1
(rank 0 warm, rank 1 a new process) prints what generation 0 saw:

    INTERRUPT <rank> where=<the innermost three functions> ungraded=<parameters without a gradient> of=<all>
"""
import os
import signal
import time
import traceback

import torch

import ftrun
from ftrun import warm
from rank_say import say

LAYERS, WIDTH, BATCH = 24, 1024, 512
FLAG = os.environ["FTRUN_TEST_FLAG"]
REPORT = {}  # what generation 0 saw, for generation 1 (this process's; ctx.keep starts afresh: nothing is saved)


class Announce(torch.autograd.Function):
    """Identity; its backward (a Python node, after the last layer's) creates FLAG."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        # The agent's notice may come while this node waits (a loaded machine runs the agent before this
        # process's next poll): its signal must not raise the Restart here, in the test's own Python, but in
        # ftrun's gradient hook, where a real backward pass gets it. So the signal does nothing for the rest of
        # generation 0: once the notice is in, the hook's check raises the Restart at the next gradient.
        signal.signal(warm._SIGNAL, lambda signum, frame: None)
        with open(FLAG, "w") as f:
            f.write("backward\n")
        deadline = time.time() + 120
        while time.time() < deadline and not rank1_dead():
            time.sleep(0.001)
        return g


def rank1_dead():
    try:
        with open(FLAG + ".pid") as f:
            pid = int(f.read())
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ValueError):
        return os.path.exists(FLAG + ".pid")  # (reaped already)


@ftrun.resilient
def main(ctx):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    report = REPORT
    if ctx.generation > 0:
        say(f"INTERRUPT {ctx.rank} where={report.get('where')} ungraded={report.get('ungraded')} "
            f"of={report.get('of')} warm={ctx.warm}")
        return
    if ctx.rank == 1:
        with open(FLAG + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(FLAG + ".tmp", FLAG + ".pid")
        while not os.path.exists(FLAG):
            time.sleep(0.005)
        os.kill(os.getpid(), signal.SIGKILL)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    x = torch.randn(BATCH, WIDTH)
    loss = Announce.apply(model(x)).square().mean()
    try:
        loss.backward()
    except ftrun.Restart as e:
        report["where"] = ",".join(f.name for f in traceback.extract_tb(e.__traceback__)[-3:])
        report["ungraded"] = sum(p.grad is None for p in model.parameters())
        report["of"] = len(list(model.parameters()))
        raise
    say(f"INTERRUPT {ctx.rank} backward finished: never interrupted")
    time.sleep(60)


if __name__ == "__main__":
    main()
