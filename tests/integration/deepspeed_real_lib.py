"""What test_deepspeed_real.py and test_cluster_deepspeed.py share: the real
DeepSpeed rank (py_deepspeed_real.py), its failure-free runs under DeepSpeed's
own launcher (the golden digests and losses), and the comparisons."""
import base64
import json
import os
import re
import shutil
import subprocess
import tempfile
import time

import pytest

from ftrun_testlib import PY, digests, free_port_range

HERE = os.path.dirname(os.path.abspath(__file__))
RANK = os.path.join(HERE, "py_deepspeed_real.py")
STEPS, SAVE_AT = 14, 6
CONFIG = "job:\n  max_restarts: 2\n  stop_grace: 2s\nstore:\n  memory_budget: 256MiB\n  chunk_size: 64KiB\n"
LOSS_RE = re.compile(r"^LOSS (\d+) (\d+) (\S+)$", re.M)


def losses(log):
    """(step, rank) -> the LAST loss printed for it."""
    return {(int(s), int(r)): v for s, r, v in LOSS_RE.findall(log)}


def world_info(slots):
    return base64.urlsafe_b64encode(json.dumps({"localhost": list(range(slots))}).encode()).decode()


def env():
    # (OMP_NUM_THREADS: ftrun-agent gives each rank 1 as torchrun does, DeepSpeed's launcher nothing; the
    # golden runs under it compute with the same threads as the runs under ftrun)
    e = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    e.pop("FTRUN_AGENT_SOCKET", None)
    return e


def deepspeed_launch(stage, dtype, nranks, save_dir):
    """The failure-free run under DeepSpeed's own per-node launcher, no ftrun: (rc, output). Again on
    another port when the one picked was taken meanwhile (tests run two at a time)."""
    for _ in range(3):
        argv = [PY, "-u", "-m", "deepspeed.launcher.launch", f"--world_info={world_info(nranks)}", "--node_rank=0",
                "--master_addr=127.0.0.1", f"--master_port={free_port_range(1)}", RANK, str(stage), dtype, save_dir,
                str(STEPS), "--plain", "--save-at", str(SAVE_AT)]
        p = subprocess.run(argv, capture_output=True, text=True, env=env(), timeout=300)
        if p.returncode == 0 or "EADDRINUSE" not in p.stdout + p.stderr:
            break
        shutil.rmtree(save_dir, ignore_errors=True)
    return p.returncode, p.stdout + p.stderr


def golden_fixture():
    """The golden_runs fixture (module scope): golden_runs(stage, dtype, nranks=2) -> (rc, output, plain
    checkpoint dir), each run once. The directories live as long as the module (a later test resumes from
    one), then go."""
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


golden_runs = pytest.fixture(scope="module", name="golden_runs")(golden_fixture)


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
