"""A rank written in C against include/ftrun/ftrun.h, under ftrun-agent."""
import os

from ftrun_testlib import Job


def test_c_ranks_save_and_load(check, build_dir):
    """Two C ranks run their checks against a real agent and both report OK."""
    job = Job(2, [], "store:\n  memory_budget: 64MiB\n  chunk_size: 256KiB\n",
              command=[os.path.join(build_dir, "tests", "ftrun-c-client")])
    rc = job.wait(timeout=120)
    check(rc == 0, f"agent exit {rc}\n{job.log[-3000:]}")
    check(job.log.count("C CLIENT OK") == 2, "both C ranks report OK")
