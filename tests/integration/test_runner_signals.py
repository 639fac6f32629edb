"""SIGINT and SIGTERM to the `ftrun` runner stop the whole job cleanly: every
agent and every rank is gone when the runner exits, and the exit code is
128 + the signal (INTEGRATION.md section 2; DeepSpeed's runner exits 0 here)."""
import signal
import time

import pytest

from ftrun_testlib import ClusterJob

ARGS = ["--steps", "100000", "--state-bytes", "4MiB", "--step-ms", "20"]


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_stops_the_job(check, sig):
    """The signal to the runner: it exits 128 + the signal, says why, and no agent or rank outlives it."""
    job = ClusterJob(2, 2, ARGS, config="store:\n  memory_budget: 256MiB\n", spares=1)

    def seen(s):
        """Every process of the job, once each agent's status (written after the runner's) lists its ranks."""
        out = []
        for i, a in enumerate(s.get("agents", [])):
            out.append(a["pid"])
            out += [r["pid"] for r in (job.agent_state(i) or {}).get("ranks", []) if r.get("pid")]
        return out

    st = job.wait_for(lambda s: s.get("phase") == "running" and (s.get("committed_version") or 0) >= 3
                      and len(seen(s)) == 2 + 1 + 4, timeout=90)
    pids = []
    if check(st is not None, f"{sig.name}: the job runs and commits"):
        pids = seen(st)
    check(len(pids) == 2 + 1 + 4, f"{sig.name}: 3 agents and 4 ranks seen ({pids})")
    job.proc.send_signal(sig)
    rc = job.wait(timeout=60)
    check(rc == 128 + sig, f"{sig.name}: the runner exits {128 + sig} (got {rc})")
    deadline = time.time() + 5  # reaped by their parents, which are gone or going
    while time.time() < deadline and any(alive(p) for p in pids if p > 0):
        time.sleep(0.05)
    left = [p for p in pids if p > 0 and alive(p)]
    check(not left, f"{sig.name}: no agent or rank outlives the runner (left: {left})")
    check("stopping" in job.log.lower() or "signal" in job.log.lower(), f"{sig.name}: the runner says why it stops")
