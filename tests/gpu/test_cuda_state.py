"""ftrun.save / ftrun.load with PyTorch CUDA tensors, on a real GPU and a real
agent, through the C++ CUDA save path (no host staging): every dtype and
view byte-identical; a save with 10% of the chunks changed copies only
those; a kernel queued right after save returns never changes the saved
bytes; a rank SIGKILLed mid-run resumes on its device and ends
bit-identical to a failure-free run. Skipped (exit 77) without a GPU."""
import os
import signal
import subprocess

import pytest

from ftrun_testlib import Job, PY, digests, torch_sees_gpu

HERE = os.path.dirname(os.path.abspath(__file__))
RANK_SCRIPT = os.path.join(HERE, "py_cuda_rank.py")
CONFIG = "job:\n  max_restarts: 2\n  stop_grace: 2s\nstore:\n  memory_budget: 1536MiB\n  chunk_size: 1MiB\n"
STEPS = 40


pytestmark = pytest.mark.skipif(not torch_sees_gpu(), reason=f"no CUDA device visible to {PY}'s torch")


def test_cuda_checks(check):
    """Round trips of every dtype, views and mixed states; only changed chunks copied; writes after save."""
    job = Job(1, [], CONFIG.replace("max_restarts: 2", "max_restarts: 0"), command=[PY, RANK_SCRIPT, "checks"])
    rc = job.wait(timeout=240)
    print("\n".join(l for l in job.log.splitlines() if l.startswith("rank ")))
    check(rc == 0, f"checks: agent exit {rc}\n{job.log[-4000:]}")
    check("CUDA CHECKS OK" in job.log, f"the rank reports CUDA CHECKS OK\n{job.log[-3000:]}")


def test_resume_on_device_after_rank_kill(check):
    """SIGKILL the rank mid-run: it resumes from a committed version on cuda:0 and ends bit-identical."""
    p = subprocess.run([PY, RANK_SCRIPT, "train", str(STEPS), "0", "--no-ftrun"], capture_output=True, text=True,
                       timeout=240)
    check(p.returncode == 0, f"golden run: exit {p.returncode}\n{p.stderr[-2000:]}")
    want = digests(p.stdout)
    job = Job(1, [], CONFIG, command=[PY, RANK_SCRIPT, "train", str(STEPS), "0.1"])
    st = job.wait_for(lambda s: (s.get("committed_version") or 0) >= 8, timeout=200)
    killed = st is not None and st["state"] == "running" and job.kill_rank(0, signal.SIGKILL)
    check(killed, f"rank 0 SIGKILLed mid-run (status {st})")
    rc = job.wait(timeout=240)
    got = digests(job.log)
    check(rc == 0, f"train: agent exit {rc}\n{job.log[-4000:]}")
    resumed = [l for l in job.log.splitlines() if l.startswith("RESUMED")]
    check(len(resumed) == 1 and int(resumed[0].split()[-1]) >= 8, f"the rank resumed from a committed step: {resumed}")
    check(got == want and want, f"digest after the restart {got} != failure-free run {want}")
