"""A real trainer under the ftrun runner: integration/examples/train_gpt.py (a
small GPT, torch.distributed with gloo, gradients all-reduced, Adam sharded by
ZeroRedundancyOptimizer, dropout, ftrun.save every step) on 2 local nodes x 2
ranks. A failure-free run gives the golden per-step losses and final weight
digests; then one rank, picked at random, is SIGKILLed mid-run after some
versions are committed. The job must recover (every rank restarts from the
committed version: model, its own optimizer shard, RNG states, step) and end
exactly like the failure-free run: the last loss printed for every step and
every rank's final weights bit for bit."""
import os
import random
import re
import subprocess
import time

import pytest

from ftrun_testlib import PY, SOURCE, ScriptClusterJob

SCRIPT = os.path.join(os.path.abspath(SOURCE), "integration", "examples", "train_gpt.py")
NODES, PER_NODE = 2, 2
WORLD = NODES * PER_NODE
STEPS = 30
MAX_RESTARTS = 3
CONFIG = ("job:\n  max_restarts: %d\n  stop_grace: 2s\n"
          "store:\n  memory_budget: 64MiB\n  chunk_size: 64KiB\n" % MAX_RESTARTS)
LOSS_RE = re.compile(r"^LOSS (\d+) (\S+)$", re.M)
WEIGHTS_RE = re.compile(r"^WEIGHTS (\d+) ([0-9a-f]{64})$", re.M)
RESUMED_RE = re.compile(r"^RESUMED (\d+) (\d+)$", re.M)


class GptJob(ScriptClusterJob):
    """train_gpt.py as every rank of NODES x PER_NODE local nodes."""

    def __init__(self, script_args):
        super().__init__(SCRIPT, script_args, NODES, PER_NODE, CONFIG, prefix="ftrun-gpt-", ports=MAX_RESTARTS + 1)


def losses(log):
    """step -> the LAST loss printed for it."""
    out = {}
    for step, value in LOSS_RE.findall(log):
        out[int(step)] = value
    return out


def weights(log):
    return {int(r): d for r, d in WEIGHTS_RE.findall(log)}


@pytest.fixture(scope="module")
def seeds():
    """(rng, the model's seed): FTRUN_TEST_SEED replays both."""
    torch_check = subprocess.run([PY, "-c", "import torch, torch.distributed.optim"], capture_output=True, text=True)
    if torch_check.returncode != 0:
        # (The project's environment has torch: a missing one is a broken setup, not a skip.)
        pytest.fail(f"{PY} cannot import torch (the ranks need it; scripts/venv.sh installs it):\n"
                    f"{torch_check.stderr[-1500:]}")
    seed = int(os.environ.get("FTRUN_TEST_SEED", time.time()))
    rng = random.Random(seed)
    return seed, rng, rng.randrange(1 << 20)


def args(model_seed):
    # gloo on the CPU even where CUDA exists: 4 ranks share this machine, maybe one GPU.
    return ["--steps", str(STEPS), "--seed", str(model_seed), "--backend", "gloo"]


@pytest.fixture(scope="module")
def failure_free(seeds):
    """1. The failure-free run: the golden losses and weights. Returns (exit code, job)."""
    seed, _, model_seed = seeds
    print(f"model seed {model_seed}, {NODES} nodes x {PER_NODE} ranks, {STEPS} steps", flush=True)
    t0 = time.time()
    job = GptJob(args(model_seed))
    rc = job.wait(timeout=150)
    print(f"failure-free run: exit {rc} in {time.time() - t0:.1f} s", flush=True)
    return rc, job


def golden_expectations(rc, job):
    """(holds, what) for each thing the failure-free run must show to serve as the golden run."""
    want_loss, want_weights = losses(job.log), weights(job.log)
    return [(rc == 0, f"failure-free run: runner exit {rc}\n{job.log[-4000:]}"),
            (sorted(want_loss) == list(range(STEPS)), f"failure-free run: LOSS lines for steps {sorted(want_loss)}"),
            (len(LOSS_RE.findall(job.log)) == STEPS, "failure-free run: every step printed once"),
            (sorted(want_weights) == list(range(WORLD)) and len(set(want_weights.values())) == 1,
             f"failure-free run: one WEIGHTS digest per rank, all equal: {want_weights}"),
            ((job.state() or {}).get("restarts") == 0, "failure-free run: no restart")]


def test_failure_free_run(check, seeds, failure_free):
    """The failure-free run prints every step's loss once and one WEIGHTS digest per rank, all equal."""
    print("seed", seeds[0], "(set FTRUN_TEST_SEED to replay)", flush=True)
    rc, job = failure_free
    for holds, what in golden_expectations(rc, job):
        check(holds, what)
    want_loss = losses(job.log)
    if want_loss:
        print(f"loss: step 0 {float.fromhex(want_loss[0]):.4f}, step {STEPS - 1} "
              f"{float.fromhex(want_loss.get(STEPS - 1, '0x0p+0')):.4f}", flush=True)


def test_rank_killed_mid_run(check, seeds, failure_free):
    """2. The same run with one rank, picked at random, SIGKILLed mid-run: every rank restarts from one
    committed version, and the run ends exactly like the failure-free one (every step's last loss, every rank's
    final weights, bit for bit)."""
    seed, rng, model_seed = seeds
    print("seed", seed, "(set FTRUN_TEST_SEED to replay)", flush=True)
    rc, golden_job = failure_free
    bad_golden = [what for holds, what in golden_expectations(rc, golden_job) if not holds]
    assert not bad_golden, "no golden to compare with:\n" + "\n".join(bad_golden)
    want_loss, want_weights = losses(golden_job.log), weights(golden_job.log)
    after = rng.randrange(3, 13)  # committed versions before the kill
    victim = rng.randrange(WORLD)
    t0 = time.time()
    job = GptJob(args(model_seed) + ["--step-ms", "60"])
    killed, st = job.kill_after_commits(victim, after, rng, timeout=90)
    check(killed is not None, f"rank {victim} SIGKILLed mid-run (status {st})")
    if killed:
        print(f"SIGKILLed rank {victim} (pid {killed[0]}, node {victim // PER_NODE}) with version {killed[1]} "
              f"committed (waited for >= {after})", flush=True)
        check(killed[1] < STEPS - 1, f"the kill came before the last step (version {killed[1]} committed)")
    rc = job.wait(timeout=150)
    st = job.state() or {}
    print(f"run with a kill: exit {rc} in {time.time() - t0:.1f} s, restarts {st.get('restarts')}", flush=True)
    check(rc == 0, f"run with a kill: runner exit {rc}\n{job.log[-4000:]}")
    check((st.get("restarts") or 0) >= 1, f"at least one restart expected, status says {st.get('restarts')}")
    resumed = {int(r): int(s) for r, s in RESUMED_RE.findall(job.log)}
    print("resumed (rank: step):", resumed, flush=True)
    if killed:
        check(sorted(resumed) == list(range(WORLD)) and len(set(resumed.values())) == 1
              and min(resumed.values()) > killed[1],
              f"every rank resumed from one version newer than {killed[1]}: {resumed}")
    got_loss = losses(job.log)
    check(sorted(got_loss) == list(range(STEPS)), f"run with a kill: LOSS lines for steps {sorted(got_loss)}")
    bad = [s for s in range(STEPS) if got_loss.get(s) != want_loss.get(s)]
    check(not bad, "losses differ from the failure-free run at steps %s:\n%s" % (
        bad, "\n".join(f"  step {s}: {got_loss.get(s)} != {want_loss.get(s)}" for s in bad[:10])))
    got_weights = weights(job.log)
    check(got_weights == want_weights, f"final weights {got_weights} != failure-free run {want_weights}")
    if not bad and got_weights == want_weights:
        seen = {}
        for step, _ in LOSS_RE.findall(job.log):
            seen[int(step)] = seen.get(int(step), 0) + 1
        again = sorted(s for s, n in seen.items() if n > 1)
        print(f"all {STEPS} losses (steps run again after the restart: {again or 'none'}) and the final weights "
              f"of all {WORLD} ranks are bit-identical to the failure-free run", flush=True)
