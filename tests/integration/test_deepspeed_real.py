"""Real DeepSpeed (0.19.8 from requirements.txt, CPU accelerator, gloo) under
ftrun: py_deepspeed_real.py trains a small MLP with ZeRO stage 0, 1, 2 and 3,
in fp32 and bf16, checkpointing every step through
ftrun.deepspeed.install(engine).

1. For every stage and dtype, a failure-free run under DeepSpeed's own
   launcher (`python -m deepspeed.launcher.launch`, no ftrun) gives the golden
   digests (full weights, each rank's optimizer state) and writes a plain
   DeepSpeed checkpoint directory at step SAVE_AT. Under ftrun-agent a rank is
   SIGKILLed mid-run: both ranks resume through engine.load_checkpoint (out of
   the agent's RAM) and every rank ends bit-identical to the golden run, every
   step's loss included.
2. A job resumed from the plain DeepSpeed checkpoint directory of step
   SAVE_AT (engine.load_checkpoint of real files through ftrun's engine), then
   checkpointing into ftrun: it ends bit-identical to the golden run.
3. ftrun-agent started with the argv of deepspeed.launcher.launch
   (--world_info, --node_rank, --master_addr, --master_port): the same
   training, the same digests.

A whole node of two lost: test_cluster_deepspeed.py.

CI runs four of the eight stage and dtype cases of 1 (every stage, each dtype
twice); FTRUN_SOAK=1 runs all eight.
"""
import os
import re
import signal
import subprocess

import pytest

from deepspeed_real_lib import (CONFIG, RANK, SAVE_AT, STEPS, check_golden, check_same, env, golden_runs,  # noqa: F401
                                world_info)
from ftrun_testlib import AGENT, PY, Job, digests, free_port_range, scratch, seeded_rng

CASES = [(0, "fp32"), (0, "bf16"), (1, "fp32"), (1, "bf16"), (2, "fp32"), (2, "bf16"), (3, "fp32"), (3, "bf16")]
# CI runs every stage once and each dtype twice (the goldens of the tests below among them); the other four
# cases run with FTRUN_SOAK=1, outside CI's time.
CI_CASES = {(0, "fp32"), (1, "fp32"), (2, "bf16"), (3, "bf16")}


@pytest.mark.parametrize("stage,dtype", CASES, ids=[f"zero{s}-{d}" for s, d in CASES])
def test_rank_killed(check, golden_runs, stage, dtype):
    """A rank SIGKILLed mid-run under ftrun-agent: both ranks resume from the agent's RAM through
    engine.load_checkpoint and end bit-identical to the failure-free run under DeepSpeed's launcher."""
    if (stage, dtype) not in CI_CASES and os.environ.get("FTRUN_SOAK") != "1":
        pytest.skip(f"ZeRO-{stage} {dtype}: FTRUN_SOAK=1 runs it (CI time; CI runs each stage once)")
    golden = golden_runs(stage, dtype)
    if not check_golden(check, golden, 2):
        return
    rng = seeded_rng()
    victim, after = rng.randrange(2), rng.randrange(2, 8)
    job = Job(2, [], CONFIG, command=[PY, "-u", RANK, str(stage), dtype, scratch("ftrun-dsr-"), str(STEPS),
                                      "--step-ms", "150"], env=env())
    st = job.wait_for(lambda s: (s.get("committed_version") or 0) >= after, timeout=120)
    killed = st is not None and st["state"] == "running" and job.kill_rank(victim, signal.SIGKILL)
    check(killed, f"rank {victim} SIGKILLed mid-run (status {st})")
    if killed:
        print(f"SIGKILLed rank {victim} with version {st['committed_version']} committed", flush=True)
    rc = job.wait(timeout=240)
    check(rc == 0, f"agent exit {rc}\n{job.log[-4000:]}")
    check((job.state() or {}).get("restarts") == 1, "one restart")
    resumed = re.findall(r"^RESUMED (\d+) (\d+)", job.log, re.M)
    check(len(resumed) == 2 and len({s for _, s in resumed}) == 1 and int(resumed[0][1]) >= after,
          f"both ranks resumed from one step >= {after}: {resumed}")
    check_same(check, golden[1], job.log, f"ZeRO-{stage} {dtype}, rank {victim} killed")


def test_resume_from_plain_checkpoint(check, golden_runs):
    """A job started under ftrun from a plain DeepSpeed checkpoint directory (step SAVE_AT, written by
    DeepSpeed's own engine) continues to the end bit-identical to the golden run."""
    golden = golden_runs(2, "bf16")
    if not check_golden(check, golden, 2):
        return
    plain_dir = golden[2]
    check(os.path.exists(os.path.join(plain_dir, "latest")), f"the golden run wrote a checkpoint in {plain_dir}")
    job = Job(2, [], CONFIG, command=[PY, "-u", RANK, "2", "bf16", scratch("ftrun-dsr-"), str(STEPS),
                                      "--resume-from", plain_dir], env=env())
    rc = job.wait(timeout=240)
    check(rc == 0, f"agent exit {rc}\n{job.log[-4000:]}")
    resumed = re.findall(r"^RESUMED (\d+) (\d+) from (\S+)", job.log, re.M)
    check(len(resumed) == 2 and all(int(s) == SAVE_AT for _, s, _ in resumed),
          f"both ranks resumed at step {SAVE_AT} from the plain directory: {resumed}")
    want = digests(golden[1])
    got = digests(job.log)
    check(got == want, f"resumed from a plain checkpoint: digests {got} != golden {want}")
    if got == want:
        print(f"resumed from DeepSpeed's own checkpoint of step {SAVE_AT}: bit-identical to the golden run", flush=True)


def test_deepspeed_launcher_argv(check, golden_runs):
    """ftrun-agent with deepspeed.launcher.launch's argv trains the same run to the same digests."""
    golden = golden_runs(1, "fp32")
    if not check_golden(check, golden, 2):
        return
    d = scratch("ftrun-dsr-argv-")
    config = os.path.join(d, "ftrun.yaml")
    with open(config, "w") as f:
        f.write(f"agent:\n  run_dir: {d}/run\n" + CONFIG)
    argv = [AGENT, "--config", config, f"--world_info={world_info(2)}", "--node_rank=0", "--master_addr=127.0.0.1",
            f"--master_port={free_port_range(1)}", RANK, "1", "fp32", os.path.join(d, "ckpt"), str(STEPS)]
    p = subprocess.run(argv, capture_output=True, text=True, env=env(), timeout=240)
    check(p.returncode == 0, f"ftrun-agent with the launcher's argv: exit {p.returncode}\n{p.stdout[-3000:]}")
    check_same(check, golden[1], p.stdout + p.stderr, "ftrun-agent with deepspeed.launcher.launch's argv")
