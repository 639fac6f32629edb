"""The warm control link (launcher/agent/warm_ranks.h) assumes the process
on its other end may be hostile or broken: real ranks under a real
ftrun-agent send it hellos for another rank, another job, an unknown role,
malformed fields, and frames out of order (py_warm_probe.py). Each is
refused with an error that says what was wrong, nothing of the job is
disturbed, and the ranks then run under @ftrun.resilient and finish."""
import os

from ftrun_testlib import PY, Job

HERE = os.path.dirname(os.path.abspath(__file__))


def test_bad_control_frames_are_refused(check):
    job = Job(2, [], "store:\n  memory_budget: 16MiB\n  chunk_size: 1MiB\nrestart:\n  warm_standbys: 0\n",
              command=[PY, os.path.join(HERE, "py_warm_probe.py")])
    rc = job.wait(timeout=120)
    check(rc == 0, f"agent exit {rc}\n{job.log[-4000:]}")
    check(job.log.count("WARMPROBE") == 2 and "FAILED" not in job.log, f"both probes pass:\n{job.log[-3000:]}")
    check(job.log.count("refused warm hello") >= 12, "the agent logs each refused hello")
