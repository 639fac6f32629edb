"""The Python client (import ftrun) as real ranks under ftrun-agent."""
import os

from ftrun_testlib import Job, PY

HERE = os.path.dirname(os.path.abspath(__file__))


def test_rank_checks(check):
    """py_rank_checks.py's checks pass in both ranks."""
    job = Job(2, [], "store:\n  memory_budget: 64MiB\n  chunk_size: 1MiB\n",
              command=[PY, os.path.join(HERE, "py_rank_checks.py")])
    rc = job.wait(timeout=120)
    check(rc == 0, f"py_rank_checks: agent exit {rc}\n{job.log[-4000:]}")
    check(job.log.count("PYRANK OK") == 2, "both ranks report OK")
    check(job.log.count("PYRANK CUDA INPUTS OK") == 2, "both ranks refuse malformed CUDA memory descriptions")


def test_mapped_loads(check):
    """py_rank_mapped.py's mapped loads pass in both ranks."""
    job = Job(2, [], "job:\n  max_restarts: 0\nstore:\n  memory_budget: 32MiB\n  chunk_size: 1MiB\n",
              command=[PY, os.path.join(HERE, "py_rank_mapped.py")])
    rc = job.wait(timeout=120)
    check(rc == 0, f"py_rank_mapped: agent exit {rc}\n{job.log[-4000:]}")
    check(job.log.count("PYRANK OK mapped") == 2, "both ranks report OK for mapped loads")


def test_memory_budget(check):
    """A save over the store's budget is refused (the rank sees it, the agent logs it)."""
    job = Job(1, [], "job:\n  max_restarts: 0\nstore:\n  memory_budget: 8MiB\n  chunk_size: 1MiB\n",
              command=[PY, os.path.join(HERE, "py_rank_budget.py")])
    rc = job.wait(timeout=120)
    check(rc == 0, f"py_rank_budget: agent exit {rc}\n{job.log[-4000:]}")
    check("PYRANK OK budget" in job.log, "budget rank reports OK")
    check("snapshot store full" in job.log, "the agent logs the refused save")
