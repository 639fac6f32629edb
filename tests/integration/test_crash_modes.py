"""Each way a rank can fail (segfault, abort, non-zero exit, SIGKILL, hang)
is detected, every rank restarts from the last committed version, and the
run ends in the failure-free state. When restarts run out, the agent exits
with the rank's code (128+signal for a signal)."""
import pytest

from ftrun_testlib import Job, digests, golden

NRANKS = 3
ARGS = ["--state-bytes", "4MiB", "--tensors", "3", "--steps", "25", "--step-ms", "5"]
CONFIG = ("job:\n  max_restarts: 2\n  hang_timeout: 2s\n  stop_grace: 1s\n"
          "store:\n  memory_budget: 256MiB\n  chunk_size: 1MiB\n")


@pytest.fixture(scope="module")
def want():
    return golden(NRANKS, ARGS)


@pytest.mark.parametrize("mode", ["kill", "segv", "abort", "exit", "hang"])
def test_crash_recovers(check, want, mode):
    """A rank that fails this way is restarted from a committed version, and the run ends as the failure-free one."""
    job = Job(NRANKS, ARGS + ["--crash-at-step", "12", "--crash-rank", "1", "--crash-mode", mode], CONFIG)
    rc = job.wait(timeout=120)
    st = job.state()
    check(rc == 0, f"{mode}: agent exit {rc}\n{job.log[-2000:]}")
    check(digests(job.log) == want, f"{mode}: digests differ from golden")
    check(st["restarts"] == 1, f"{mode}: {st['restarts']} restarts")
    rec = st["recoveries"][0]
    check(rec["version"] is not None and 1 <= rec["version"] <= 12, f"{mode}: restored version {rec['version']}")
    check("total_ms" in rec, f"{mode}: recovery has no timing breakdown")
    if mode == "hang":
        check("hung" in rec["reason"], f"hang reason: {rec['reason']}")


@pytest.mark.parametrize("mode, code", [("exit", 3), ("kill", 128 + 9), ("segv", 128 + 11)])
def test_restarts_exhausted(check, mode, code):
    """With no restart left the agent gives up with the rank's exit code (128 + signal for a signal)."""
    job = Job(NRANKS, ARGS + ["--crash-at-step", "5", "--crash-mode", mode],
              CONFIG.replace("max_restarts: 2", "max_restarts: 0"))
    rc = job.wait(timeout=120)
    check(rc == code, f"{mode} with max_restarts 0: exit {rc}, want {code}")
    check("giving up" in job.log, f"{mode}: log does not say it gave up")
