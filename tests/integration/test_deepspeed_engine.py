"""ftrun.deepspeed.FtrunCheckpointEngine driven the way DeepSpeed's engine
drives a checkpoint engine, in real ranks under ftrun-agent, by hand:
py_deepspeed_rank.py repeats the calls of DeepSpeedEngine.save_checkpoint /
load_checkpoint of 0.16 to 0.19, so both call styles (0.16's tag strings,
0.17.1's CheckpointCommitInfo) and the engine's errors are covered whatever
DeepSpeed is installed. Real DeepSpeed (requirements.txt's 0.19.8, ZeRO 0-3):
test_deepspeed_real.py.

1. Both call styles, placeholders, `latest`, loads and errors, checked in
   the ranks (py_deepspeed_rank.py checks).
2. DeepSpeed-style training that checkpoints every step, a rank SIGKILLed
   mid-run: both ranks resume through load_checkpoint and the run ends bit
   identical to the failure-free run; again under @ftrun.resilient (the
   engine made anew in each generation): the survivor keeps its process, a
   warm standby takes the dead rank's place.
"""
import os
import signal
import subprocess

import pytest

from ftrun_testlib import Job, PY, digests

HERE = os.path.dirname(os.path.abspath(__file__))
RANK = os.path.join(HERE, "py_deepspeed_rank.py")
CONFIG = "job:\n  max_restarts: 0\n  stop_grace: 2s\nstore:\n  memory_budget: 64MiB\n  chunk_size: 64KiB\n"


def test_engine_checks(check, scratch):
    """Both ranks pass every check of the engine, and `latest` names the last tag."""
    save_dir = scratch("ftrun-ds-")
    job = Job(2, [], CONFIG, command=[PY, RANK, "checks", save_dir])
    rc = job.wait(timeout=50)
    print("\n".join(line for line in job.log.splitlines() if line.startswith("rank ")))
    check(rc == 0, f"checks: agent exit {rc}\n{job.log[-4000:]}")
    check(job.log.count("DSRANK OK") == 2, f"both ranks report DSRANK OK\n{job.log[-2000:]}")
    with open(os.path.join(save_dir, "latest")) as f:
        check(f.read() == "global_step5", "`latest` names the last tag")


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_resume_after_rank_kill(check, scratch, warm):
    """Rank 0 SIGKILLed mid-run: one restart, both ranks resume through load_checkpoint, and the final
    digests equal the failure-free run's. warm: under @ftrun.resilient, rank 1 keeps its process."""
    steps = 16
    want = {}
    golden_dir = scratch("ftrun-ds-")
    for r in range(2):
        p = subprocess.run([PY, RANK, "train", golden_dir, str(steps), "0", "--no-ftrun"], capture_output=True,
                           text=True, env=dict(os.environ, RANK=str(r), WORLD_SIZE="2"), timeout=30)
        check(p.returncode == 0, f"golden run of rank {r}: exit {p.returncode}\n{p.stderr[-2000:]}")
        want.update(digests(p.stdout))
    train_dir = scratch("ftrun-ds-train-")
    job = Job(2, [], CONFIG.replace("max_restarts: 0", "max_restarts: 2"),
              command=[PY, RANK, "train", train_dir, str(steps), "0.08"] + (["--resilient"] if warm else []))
    st = job.wait_for(lambda s: (s.get("committed_version") or 0) >= 5 and (
        not warm or (s.get("warm_standbys") or {}).get("ready", 0) >= 1), timeout=40)
    survivor = job.rank_pid(1)
    killed = st is not None and st["state"] == "running" and job.kill_rank(0, signal.SIGKILL)
    check(killed, f"rank 0 SIGKILLed mid-run (status {st})")
    if killed:
        print(f"SIGKILLed rank 0 with version {st['committed_version']} committed", flush=True)
    if warm:
        st = job.wait_for(lambda s: s.get("restarts") == 1 and s.get("state") == "running", timeout=30)
        check(st is not None and job.rank_pid(1) == survivor, f"rank 1 kept its process {survivor}: {st}")
    rc = job.wait(timeout=50)
    check(rc == 0, f"train: agent exit {rc}\n{job.log[-4000:]}")
    check((job.state() or {}).get("restarts") == 1, "one restart")
    resumed = [line for line in job.log.splitlines() if line.startswith("RESUMED")]
    print("\n".join(resumed))
    check(len(resumed) == 2, f"both ranks resumed through load_checkpoint: {resumed}")
    got = digests(job.log)
    check(got == want, f"digests after the restart {got} != failure-free run {want}")
    if got == want:
        print(f"resumed DeepSpeed-style training ends bit-identical to the failure-free run: {got}")
