"""A survivor told to leave in the middle of a backward pass leaves inside it
(ftrun/warm_interrupt.py), not when the pass returns: real ranks under a real
ftrun-agent, one SIGKILLs itself while the other is seconds of C++ away from
the end of its backward pass (py_warm_interrupt_rank.py)."""
import os
import re

from ftrun_testlib import PY, Job, scratch

HERE = os.path.dirname(os.path.abspath(__file__))


def test_restart_lands_inside_backward(check):
    env = dict(os.environ, FTRUN_TEST_FLAG=os.path.join(scratch("ftrun-flag-"), "in-backward"))
    job = Job(2, [], "job:\n  max_restarts: 2\nstore:\n  memory_budget: 16MiB\n  chunk_size: 1MiB\n"
              "restart:\n  warm_standbys: 0\n  abort_timeout: 60s\n",
              command=[PY, os.path.join(HERE, "py_warm_interrupt_rank.py")], env=env)
    rc = job.wait(timeout=300)
    check(rc == 0, f"agent exit {rc}\n{job.log[-4000:]}")
    got = re.search(r"INTERRUPT 0 where=(\S+) ungraded=(\d+) of=(\d+) warm=True", job.log)
    check(got is not None, f"rank 0 ran generation 1 warm and reported generation 0:\n{job.log[-4000:]}")
    if got:
        where, ungraded, of = got.group(1), int(got.group(2)), int(got.group(3))
        check("_on_grad" in where.split(","), f"the Restart was raised in ftrun's gradient hook, not in {where}")
        check(ungraded > 0, f"the backward pass was left before its end: {ungraded} of {of} parameters "
                            "have no gradient")
