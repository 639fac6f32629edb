"""@ftrun.resilient(prepare=...): a process builds what it keeps before its
first generation, a warm standby while it waits for a rank, and ctx.keep
gives that object (py_warm_prepare_rank.py): real ranks under a real
ftrun-agent, one SIGKILLed, its place taken by a standby that prepared. A
prepare that does not return a dict is refused with a clear error."""
import os

from ftrun_testlib import PY, Job, scratch

HERE = os.path.dirname(os.path.abspath(__file__))
RANK = os.path.join(HERE, "py_warm_prepare_rank.py")
CONFIG = "job:\n  max_restarts: %d\nstore:\n  memory_budget: 16MiB\n  chunk_size: 64KiB\nrestart:\n  warm_standbys: 1\n"


def test_standby_takes_a_rank_with_its_prepared_objects(check):
    job = Job(2, [], CONFIG % 2, command=[PY, RANK, scratch("ftrun-prepare-")])
    rc = job.wait(timeout=180)
    check(rc == 0, f"agent exit {rc}\n{job.log[-4000:]}")
    for rank, generation in ((0, 0), (1, 0), (0, 1), (1, 1)):
        check(f"PREPARE OK {rank} {generation}" in job.log, f"rank {rank}, generation {generation}:\n{job.log[-4000:]}")
    check("warm standby pid" in job.log and "takes its place" in job.log, "a standby took rank 1's place")


def test_prepare_must_return_a_dict(check):
    job = Job(1, [], CONFIG % 0, command=[PY, RANK, scratch("ftrun-prepare-"), "bad"])
    rc = job.wait(timeout=60)
    check(rc != 0, "the job fails")
    check("ftrun.resilient(prepare=...) must return a dict of name -> object to keep, not a list" in job.log,
          f"the error says what was wrong:\n{job.log[-3000:]}")
