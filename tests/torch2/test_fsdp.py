"""FSDP (torch 2.x) under the ftrun runner: integration/examples/train_gpt.py
--fsdp 2 (FSDP2 fully_shard), --fsdp 2 --meta-init (FSDP2 on a model built on
the meta device: each rank materializes and initializes only its own shards,
no rank loads or broadcasts the whole model) and --fsdp 1 (FSDP1,
SHARDED_STATE_DICT), a small
GPT on 2 local nodes x 2 ranks with gloo on CPU processes, saving
get_state_dict(model, optimizer) through ftrun.save every step.

- Each rank's save holds only its local shards: the bytes a save stored
  (Client.save's bytes_total) are the rank's local shard bytes, about a
  quarter of the state's global bytes, not the whole model.
- A failure-free run gives the golden per-step losses and every rank's digest
  of its local shards; then one rank, picked at random, is SIGKILLed mid-run:
  every rank restarts, puts its shards back in place (ftrun.restore_into,
  set_state_dict) and the run ends bit-identical (every step's last loss, every
  rank's local shards).

Skips visibly where the ranks' Python (FTRUN_TEST_PYTHON) has torch < 2.6
(FSDP2) or no FSDP1."""
import os
import random
import re
import time

import pytest

from torch2_lib import require_torch2
from test_train_gpt import GptJob, LOSS_RE, RESUMED_RE, STEPS, WORLD, PER_NODE, losses

WEIGHTS_RE = re.compile(r"^WEIGHTS (\d+) ([0-9a-f]{64})$", re.M)
SAVED_RE = re.compile(r"^SAVED (\d+) (\d+) (-?\d+) (\d+) (\d+)$", re.M)
MODES = {"2": ("FSDP2 fully_shard", 6, "from torch.distributed.fsdp import fully_shard"),
         "1": ("FSDP1 SHARDED_STATE_DICT", 4,
               "from torch.distributed.fsdp import FullyShardedDataParallel, StateDictType"),
         # every rank builds on the meta device and materializes its own shards only; a restart fills them from ftrun
         "2-meta": ("FSDP2 fully_shard, meta-device init", 6, "from torch.distributed.fsdp import fully_shard")}


def weights(log):
    return {int(r): d for r, d in WEIGHTS_RE.findall(log)}


@pytest.fixture(scope="module")
def seeds():
    seed = int(os.environ.get("FTRUN_TEST_SEED", time.time()))
    rng = random.Random(seed)
    return seed, rng, rng.randrange(1 << 20)


def args(mode, model_seed):
    return (["--steps", str(STEPS), "--seed", str(model_seed), "--backend", "gloo", "--fsdp", mode[0]]
            + (["--meta-init"] if mode.endswith("-meta") else []))


def check_failure_free(check, rc, job):
    """The failure-free run printed every loss once and one local-shard digest per rank; every save of a rank
    stored its local shard bytes only (about 1/world of the state), never the whole model."""
    check(rc == 0, f"failure-free run: runner exit {rc}\n{job.log[-5000:]}")
    got_loss = losses(job.log)
    check(sorted(got_loss) == list(range(STEPS)) and len(LOSS_RE.findall(job.log)) == STEPS,
          f"one LOSS line per step: {sorted(got_loss)}")
    w = weights(job.log)
    check(sorted(w) == list(range(WORLD)), f"one WEIGHTS (local shards) digest per rank: {w}")
    saved = [tuple(int(x) for x in m) for m in SAVED_RE.findall(job.log)]
    check(len(saved) == STEPS * WORLD, f"a SAVED line per rank and step: {len(saved)}")
    for rank, step, stored, local, whole in saved:
        check(stored >= 0 and abs(stored - local) <= max(64 << 10, local // 20),
              f"rank {rank} step {step}: the save stored {stored} bytes, its local shards are {local} bytes")
        check(stored < whole * 0.6, f"rank {rank} step {step}: the save stored {stored} bytes of a state of "
                                    f"{whole} global bytes: more than its shard")
    if saved:
        r0 = [s for s in saved if s[0] == 0][-1:]
        print("rank 0's last save: stored %d bytes, local shards %d, whole state %d" % r0[0][2:] if r0 else "",
              flush=True)


@pytest.mark.parametrize("mode", ["2", "1", "2-meta"])
def test_failure_free_and_rank_killed_mid_run(check, seeds, mode):
    """The failure-free run stores local shards only (check_failure_free); beside it, the same run with one rank
    SIGKILLed mid-run: every rank resumes from one committed version and the run ends bit-identical to the
    failure-free one (losses, every rank's local shards)."""
    seed, rng, model_seed = seeds
    what, minor, imports = MODES[mode]
    version = require_torch2(what, minor, imports)
    print("seed", seed, "(set FTRUN_TEST_SEED to replay)", flush=True)
    t0 = time.time()
    # The failure-free run beside the one killed (each its own agents and ports): CI time. Its results are read
    # at the end.
    golden_job = GptJob(args(mode, model_seed))
    after = rng.randrange(3, 13)
    victim = rng.randrange(WORLD)
    job = GptJob(args(mode, model_seed) + ["--step-ms", "60"])
    killed, st = job.kill_after_commits(victim, after, rng, timeout=120)
    check(killed is not None, f"rank {victim} SIGKILLed mid-run (status {st})")
    if killed:
        print(f"SIGKILLed rank {victim} (node {victim // PER_NODE}) with version {killed[1]} committed", flush=True)
    rc = job.wait(timeout=240)
    golden_rc = golden_job.wait(timeout=240)
    print(f"torch {version}, {what}: both runs ended in {time.time() - t0:.1f} s", flush=True)
    check_failure_free(check, golden_rc, golden_job)
    want_loss, want_weights = losses(golden_job.log), weights(golden_job.log)
    assert golden_rc == 0 and sorted(want_weights) == list(range(WORLD)), \
        f"no golden run to compare with (exit {golden_rc})\n{golden_job.log[-3000:]}"
    st = job.state() or {}
    print(f"run with a kill: exit {rc}, restarts {st.get('restarts')}", flush=True)
    check(rc == 0, f"run with a kill: runner exit {rc}\n{job.log[-5000:]}")
    check((st.get("restarts") or 0) >= 1, f"at least one restart expected, status says {st.get('restarts')}")
    resumed = {int(r): int(s) for r, s in RESUMED_RE.findall(job.log)}
    if killed:
        check(sorted(resumed) == list(range(WORLD)) and len(set(resumed.values())) == 1
              and min(resumed.values()) > killed[1], f"every rank resumed from one version after {killed[1]}: {resumed}")
    got_loss = losses(job.log)
    bad = [s for s in range(STEPS) if got_loss.get(s) != want_loss.get(s)]
    check(not bad, "losses differ from the failure-free run at steps %s:\n%s" % (
        bad, "\n".join(f"  step {s}: {got_loss.get(s)} != {want_loss.get(s)}" for s in bad[:10])))
    got_weights = weights(job.log)
    check(got_weights == want_weights, f"local shards {got_weights} != failure-free run {want_weights}")
    if not bad and got_weights == want_weights:
        print(f"all {STEPS} losses and the local shards of all {WORLD} ranks bit-identical to the failure-free run",
              flush=True)
