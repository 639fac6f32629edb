"""train_gpt.py on the GPU with NCCL under the ftrun runner (one node, one
rank, the state saved from the device by the CUDA path every step): a
failure-free run, then the same run with the rank SIGKILLed mid-run. The job
must resume from a committed version and end bit-identical to the
failure-free run: every step's last loss and the final weights. Skipped
(exit 77) where torch sees no GPU."""
import os
import random
import re
import time

import pytest

from ftrun_testlib import PY, SOURCE, ScriptClusterJob, torch_sees_gpu

pytestmark = pytest.mark.skipif(not torch_sees_gpu(), reason=f"no CUDA device visible to {PY}'s torch")

SCRIPT = os.path.join(os.path.abspath(SOURCE), "integration", "examples", "train_gpt.py")
STEPS = 30
CONFIG = "job:\n  max_restarts: 3\n  stop_grace: 2s\nstore:\n  memory_budget: 1GiB\n  chunk_size: 1MiB\n"
LOSS_RE = re.compile(r"^LOSS (\d+) (\S+)$", re.M)
WEIGHTS_RE = re.compile(r"^WEIGHTS (\d+) ([0-9a-f]{64})$", re.M)
RESUMED_RE = re.compile(r"^RESUMED (\d+) (\d+)$", re.M)


def run(extra, seed):
    args = ["--backend", "nccl", "--steps", str(STEPS), "--seed", str(seed), "--layers", "2", "--d-model", "256",
            *extra]
    return ScriptClusterJob(SCRIPT, args, 1, 1, CONFIG, prefix="ftrun-gpt-cuda-", ports=5)


def losses(log):
    return {int(s): v for s, v in LOSS_RE.findall(log)}  # the last loss printed for each step


def test_rank_killed_mid_run_on_gpu(check):
    seed = int(os.environ.get("FTRUN_TEST_SEED", time.time()))
    rng = random.Random(seed)
    print("seed", seed, "(set FTRUN_TEST_SEED to replay)", flush=True)
    golden = run([], seed % 1000)
    rc = golden.wait(timeout=300)
    assert rc == 0, f"failure-free run: runner exit {rc}\n{golden.log[-4000:]}"
    want_loss, want_weights = losses(golden.log), dict(WEIGHTS_RE.findall(golden.log))
    assert sorted(want_loss) == list(range(STEPS)) and want_weights, golden.log[-3000:]

    after = rng.randrange(3, 12)
    job = run(["--step-ms", "80"], seed % 1000)
    killed, st = job.kill_after_commits(0, after, rng, timeout=200)
    check(killed is not None, f"the rank SIGKILLed mid-run (status {st})")
    rc = job.wait(timeout=300)
    check(rc == 0, f"run with a kill: runner exit {rc}\n{job.log[-4000:]}")
    resumed = RESUMED_RE.findall(job.log)
    check(len(resumed) >= 1 and killed is not None and int(resumed[-1][1]) >= after,
          f"the rank resumed from a committed step >= {after}: {resumed}")
    got_loss = losses(job.log)
    bad = [s for s in range(STEPS) if got_loss.get(s) != want_loss.get(s)]
    check(not bad, f"losses differ from the failure-free run at steps {bad[:10]}")
    check(dict(WEIGHTS_RE.findall(job.log)) == want_weights, "final weights differ from the failure-free run")
