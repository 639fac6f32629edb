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
2. Two nodes x 2 ranks and a spare under the ftrun runner, ZeRO-3 bf16: a
   whole node SIGKILLed (agent and ranks); the spare pulls its shards from
   the replica and the run ends bit-identical to the 4-rank golden run.
3. A job resumed from the plain DeepSpeed checkpoint directory of step
   SAVE_AT (engine.load_checkpoint of real files through ftrun's engine), then
   checkpointing into ftrun: it ends bit-identical to the golden run.
4. ftrun-agent started with the argv of deepspeed.launcher.launch
   (--world_info, --node_rank, --master_addr, --master_port): the same
   training, the same digests.
"""
import base64
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

from ftrun_testlib import AGENT, PY, Job, ScriptClusterJob, digests, free_port_range, scratch, seeded_rng

HERE = os.path.dirname(os.path.abspath(__file__))
RANK = os.path.join(HERE, "py_deepspeed_real.py")
STEPS, SAVE_AT = 14, 6
CONFIG = "job:\n  max_restarts: 2\n  stop_grace: 2s\nstore:\n  memory_budget: 256MiB\n  chunk_size: 64KiB\n"
LOSS_RE = re.compile(r"^LOSS (\d+) (\d+) (\S+)$", re.M)
CASES = [(0, "fp32"), (0, "bf16"), (1, "fp32"), (1, "bf16"), (2, "fp32"), (2, "bf16"), (3, "fp32"), (3, "bf16")]


def losses(log):
    """(step, rank) -> the LAST loss printed for it."""
    return {(int(s), int(r)): v for s, r, v in LOSS_RE.findall(log)}


def world_info(slots):
    return base64.urlsafe_b64encode(json.dumps({"localhost": list(range(slots))}).encode()).decode()


def env():
    e = dict(os.environ, DS_ACCELERATOR="cpu")
    e.pop("FTRUN_AGENT_SOCKET", None)
    return e


def deepspeed_launch(stage, dtype, nranks, save_dir):
    """The failure-free run under DeepSpeed's own per-node launcher, no ftrun: (rc, output)."""
    argv = [PY, "-u", "-m", "deepspeed.launcher.launch", f"--world_info={world_info(nranks)}", "--node_rank=0",
            "--master_addr=127.0.0.1", f"--master_port={free_port_range(1)}", RANK, str(stage), dtype, save_dir,
            str(STEPS), "--plain", "--save-at", str(SAVE_AT)]
    p = subprocess.run(argv, capture_output=True, text=True, env=env(), timeout=300)
    return p.returncode, p.stdout + p.stderr


@pytest.fixture(scope="module")
def golden_runs():
    """(stage, dtype, nranks) -> (rc, output, plain checkpoint dir), each run once. The directories live
    as long as the module (a later test resumes from one), then go."""
    runs = {}
    base = tempfile.mkdtemp(prefix="ftrun-dsr-golden-")

    def get(stage, dtype, nranks=2):
        key = (stage, dtype, nranks)
        if key not in runs:
            d = os.path.join(base, f"zero{stage}-{dtype}-x{nranks}")
            t0 = time.time()
            rc, out = deepspeed_launch(stage, dtype, nranks, d)
            print(f"golden ZeRO-{stage} {dtype} x{nranks} (deepspeed.launcher.launch): exit {rc} in "
                  f"{time.time() - t0:.1f} s", flush=True)
            runs[key] = (rc, out, d)
        return runs[key]

    yield get
    shutil.rmtree(base, ignore_errors=True)


def check_golden(check, golden, nranks):
    rc, out, _ = golden
    want = digests(out)
    ok = rc == 0 and sorted(want) == list(range(nranks)) and len(losses(out)) == STEPS * nranks
    check(ok, f"golden run: exit {rc}, digests {want}, {len(losses(out))} losses\n{out[-4000:]}")
    return ok


def check_same(check, golden_out, job_log, what):
    want, got = digests(golden_out), digests(job_log)
    check(got == want, f"{what}: final digests {got} != golden {want}")
    want_loss, got_loss = losses(golden_out), losses(job_log)
    bad = sorted(k for k in want_loss if got_loss.get(k) != want_loss[k])
    check(not bad, f"{what}: losses differ from the golden run at (step, rank) {bad[:10]}")
    if got == want and not bad:
        print(f"{what}: bit-identical to the golden run (digests {sorted(got.values())})", flush=True)


@pytest.mark.parametrize("stage,dtype", CASES, ids=[f"zero{s}-{d}" for s, d in CASES])
def test_rank_killed(check, golden_runs, stage, dtype):
    """A rank SIGKILLed mid-run under ftrun-agent: both ranks resume from the agent's RAM through
    engine.load_checkpoint and end bit-identical to the failure-free run under DeepSpeed's launcher."""
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


def test_node_killed(check, golden_runs):
    """Two nodes x 2 ranks + a spare, ZeRO-3 bf16: a whole node SIGKILLed; the spare takes its place with the
    shards pulled from the replica, and the run ends bit-identical to the 4-rank golden run."""
    golden = golden_runs(3, "bf16", 4)
    if not check_golden(check, golden, 4):
        return
    rng = seeded_rng()
    job = ScriptClusterJob(RANK, ["3", "bf16", scratch("ftrun-dsr-node-"), str(STEPS), "--step-ms", "200"], 2, 2,
                           CONFIG, prefix="ftrun-dsr-", spares=1)
    after = rng.randrange(2, 7)
    st = job.wait_for(lambda s: s.get("phase") == "running" and (s.get("committed_version") or 0) >= after,
                      timeout=180)
    node = rng.randrange(2)
    killed = st is not None and job.kill_node(node)
    check(killed, f"node {node} SIGKILLed (status {st})")
    if killed:
        print(f"SIGKILLed node {node} with version {st['committed_version']} committed", flush=True)
    rc = job.wait(timeout=300)
    st = job.state() or {}
    check(rc == 0, f"runner exit {rc}\n{job.log[-4000:]}")
    check((st.get("restarts") or 0) >= 1, f"a restart: {st.get('restarts')}")
    check_same(check, golden[1], job.log, f"ZeRO-3 bf16, 2 nodes, node {node} killed")


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
