"""ftrun.save / ftrun.load (PyTorch states) in real ranks under ftrun-agent:
round trips of nested structures with every common dtype, views, 0-dim and
empty tensors, optimizer state, RNG states and picklable objects; then a rank
SIGKILLed mid-run, and the resumed training must end bit-identical to a run
without failure."""
import os
import signal
import subprocess

from ftrun_testlib import Job, PY, digests

HERE = os.path.dirname(os.path.abspath(__file__))
RANK_SCRIPT = os.path.join(HERE, "py_torch_rank.py")
CONFIG = "job:\n  max_restarts: 2\n  stop_grace: 2s\nstore:\n  memory_budget: 64MiB\n  chunk_size: 64KiB\n"
NRANKS = 2
STEPS = 20


def test_round_trips(check):
    """Nested structures with every common dtype, views, 0-dim and empty tensors, optimizer state, RNG states
    and picklable objects come back as saved, in every rank."""
    job = Job(NRANKS, [], CONFIG.replace("max_restarts: 2", "max_restarts: 0"), command=[PY, RANK_SCRIPT, "checks"])
    rc = job.wait(timeout=50)
    print("\n".join(l for l in job.log.splitlines() if l.startswith("rank ")))
    check(rc == 0, f"checks: agent exit {rc}\n{job.log[-4000:]}")
    check(job.log.count("PYTORCH OK") == NRANKS, f"every rank reports PYTORCH OK\n{job.log[-3000:]}")


def test_resume_after_rank_kill(check):
    """A rank SIGKILLed mid-run: one restart, every rank resumes from a committed step, and the final weights
    and Adam state are bit-identical to a run without failure."""
    want = {}
    for r in range(NRANKS):
        p = subprocess.run([PY, RANK_SCRIPT, "train", str(STEPS), "0", "--no-ftrun"], capture_output=True, text=True,
                           env=dict(os.environ, RANK=str(r)), timeout=30)
        check(p.returncode == 0, f"golden run of rank {r}: exit {p.returncode}\n{p.stderr[-2000:]}")
        want.update(digests(p.stdout))
    check(len(want) == NRANKS, f"golden digests {want}")

    job = Job(NRANKS, [], CONFIG, command=[PY, RANK_SCRIPT, "train", str(STEPS), "0.08"])
    st = job.wait_for(lambda s: (s.get("committed_version") or 0) >= 6, timeout=40)
    killed = st is not None and st["state"] == "running" and job.kill_rank(1, signal.SIGKILL)
    check(killed, f"rank 1 SIGKILLed mid-run (status {st})")
    if killed:
        print(f"SIGKILLed rank 1 with version {st['committed_version']} committed", flush=True)
    rc = job.wait(timeout=50)
    got = digests(job.log)
    check(rc == 0, f"train: agent exit {rc}\n{job.log[-4000:]}")
    st = job.state() or {}
    check(st.get("restarts") == 1, f"one restart expected, status says {st.get('restarts')}")
    resumed = [l for l in job.log.splitlines() if l.startswith("RESUMED")]
    check(len(resumed) == NRANKS and all(int(l.split()[-1]) > 1 for l in resumed),
          f"every rank resumed from a committed step: {resumed}")
    print("\n".join(resumed))
    check(got == want, f"digests after the restart {got} != failure-free run {want}")
    if got == want:
        print(f"final weights and Adam state bit-identical to the failure-free run: {got}")
