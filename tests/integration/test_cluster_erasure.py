"""Erasure-coded redundancy (cluster.redundancy erasure) with real agents,
ranks and UCX on local nodes: whole nodes SIGKILLed at random moments (up to
`parity` of a group at once, during the parity's encoding, or during a
rebuild) are rebuilt on spares from their group, and every run ends with the
digests of the failure-free run; one loss more than the parity goes to the
persist directory with a message that names the code, or stops naming it."""
import os
import random
import subprocess
import time

import pytest

from ftrun_testlib import BUILD, PY, RUNNER, ClusterJob, ScriptClusterJob, digests, golden
from test_train_gpt import SCRIPT, losses, weights

def trainer_args(steps):
    return ["--state-bytes", "16MiB", "--tensors", "4", "--steps", str(steps), "--step-ms", "10",
            "--change-fraction", "0.3"]


ARGS = trainer_args(80)


def config(data, parity, persist=None):
    text = ("job:\n  max_restarts: 10\n  stop_grace: 2s\n"
            "store:\n  memory_budget: 512MiB\n  chunk_size: 1MiB\n  prefault: false\n"
            "cluster:\n  redundancy: {erasure: {data: %d, parity: %d}}\n  heartbeat_interval: 200ms\n"
            "  heartbeat_misses: 10\n  lost_node_timeout: 30s\n" % (data, parity))
    if persist:
        text += "persist:\n  dir: %s\n  every_versions: 5\n" % persist
    return text


@pytest.fixture(scope="module")
def rng():
    seed = int(os.environ.get("FTRUN_TEST_SEED", time.time()))
    print("seed", seed, "(set FTRUN_TEST_SEED to replay)")
    return random.Random(seed)


def committed(st):
    return st["phase"] == "running" and st["committed_version"] is not None


def survives(st):
    groups = (st.get("erasure") or {}).get("groups") or []
    return [g["survives"] for g in groups]


def log_has(job, text):
    with open(job.out.name) as f:
        return text in f.read()


# (name, data, parity, nodes, ranks per node, spares, nodes killed at once, kills in turn, one more during the
# rebuild)
RUNS = [("2+1, one node, twice in turn", 2, 1, 3, 2, 2, 1, 2, False),
        ("4+2, two nodes of the group at once", 4, 2, 6, 1, 2, 2, 1, False),
        ("4+2, a second node during the first's rebuild", 4, 2, 6, 1, 2, 1, 1, True)]


@pytest.mark.parametrize("name, data, parity, nodes, per_node, spares, at_once, kills, during_rebuild", RUNS,
                         ids=[r[0] for r in RUNS])
def test_erasure_node_loss(check, rng, name, data, parity, nodes, per_node, spares, at_once, kills,
                           during_rebuild):
    """Up to `parity` nodes of a group SIGKILLed at random moments: spares rebuild them from the survivors and
    the job ends with the failure-free digests; status shows the groups' margin."""
    want = golden(nodes * per_node, ARGS)
    job = ClusterJob(nodes, per_node, ARGS, config(data, parity), spares=spares)
    restarts, last, done = 0, -1, 0
    for i in range(kills):
        st = job.wait_for(lambda s: committed(s) and s["restarts"] == restarts and s["committed_version"] > last
                          and min(survives(s) or [0]) == parity, timeout=60)
        if st is None:
            break
        time.sleep(rng.uniform(0.0, 0.3))
        victims = rng.sample(range(nodes), at_once)
        for node in victims:
            done += job.kill_node(node)
        print(f"{name}: killed nodes {victims}", flush=True)
        if during_rebuild:
            deadline = time.time() + 30
            while not log_has(job, "rebuilding ranks of version") and time.time() < deadline:
                time.sleep(0.005)
            other = rng.choice([n for n in range(nodes) if n not in victims])
            done += job.kill_node(other)
            print(f"{name}: killed node {other} during the rebuild", flush=True)
        st = job.wait_for(lambda s: committed(s) and s["restarts"] > restarts, timeout=60)
        if st is None:
            break
        restarts, last = st["restarts"], st["committed_version"]
        if i == 0:
            out = subprocess.run([RUNNER, "status", "--config", job.config], capture_output=True, text=True,
                                 timeout=30).stdout
            check(f"redundancy: erasure code, data {data} + parity {parity} per group" in out and
                  "group of nodes" in out, f"ftrun status does not show the groups:\n{out}")
    rc = job.wait(timeout=180)
    check(rc == 0, f"{name}: runner exit {rc} after {done} node kills\n{job.log[-4000:]}")
    check(digests(job.log) == want, f"{name}: digests differ from the failure-free run")
    check(done >= 1, f"{name}: no node was killed")
    check("from the erasure group, every chunk checked" in job.log, f"{name}: no rebuild in the log")


def test_erasure_losses_beyond_parity_stop_naming_the_code(check):
    """Two nodes of a 2+1 group lost at once and no disk: the job stops with the error that names the code."""
    long_args = [a if a != "80" else "400" for a in ARGS]
    job = ClusterJob(3, 1, long_args, config(2, 1), spares=2)
    st = job.wait_for(committed, timeout=60)
    check(st is not None, "2+1 double loss: the job never committed")
    if st:
        time.sleep(0.2)
        job.kill_node(0)
        job.kill_node(2)
    rc = job.wait(timeout=120)
    check(rc not in (0, "timeout"), f"2+1 double loss: expected a failing exit, got {rc}\n{job.log[-3000:]}")
    check("cluster.redundancy erasure: data 2, parity 1 per group" in job.log,
          f"2+1 double loss: the error does not name the code\n{job.log[-3000:]}")


def test_erasure_losses_beyond_parity_go_to_disk(check, scratch):
    """Two nodes of a 2+1 group lost at once with a persist directory: the job goes back to the newest version on
    disk, saying which code it exceeded, and ends with the failure-free digests."""
    # (More steps than ARGS: under ASan the first write to disk came after the job's 80 steps had ended.)
    args = trainer_args(400)
    want = golden(3, args)
    disk = scratch("ftrun-ec-disk-")
    job = ClusterJob(3, 1, args, config(2, 1, persist=disk), spares=2)
    st = job.wait_for(lambda s: committed(s) and all((job.last_written(a) or 0) >= 5 for a in range(3)), timeout=90)
    check(st is not None and st["committed_version"] < 350,
          f"2+1 with a disk: a version written to disk while the job runs (status {st})")
    if st:
        job.kill_node(0)
        job.kill_node(1)
    rc = job.wait(timeout=180)
    check(rc == 0, f"2+1 double loss with a disk: runner exit {rc}\n{job.log[-4000:]}")
    check(digests(job.log) == want, "2+1 double loss with a disk: digests differ from the failure-free run")
    check("(cluster.redundancy erasure: data 2, parity 1 per group)" in job.log and
          "the newest complete in the persist directory" in job.log,
          f"2+1 double loss with a disk: no message naming the code and the disk\n{job.log[-3000:]}")


def test_train_gpt_node_lost_under_erasure(check, rng):
    """train_gpt.py (torch, gloo) on 3 nodes x 1 rank with a 2+1 code and a spare: a whole node SIGKILLed after a
    few commits is rebuilt from its group, and the run ends exactly like the failure-free one (every step's last
    loss, every rank's final weights, bit for bit)."""
    if not os.path.isdir(os.path.join(BUILD, "python", "ftrun")):
        pytest.skip(f"{BUILD} has no ftrun Python package (the ASan build): train_gpt.py cannot run")
    if subprocess.run([PY, "-c", "import torch, torch.distributed.optim"], capture_output=True).returncode != 0:
        pytest.fail(f"{PY} cannot import torch (the ranks need it; scripts/venv.sh installs it)")
    model_seed = rng.randrange(1 << 20)
    cfg = config(2, 1).replace("memory_budget: 512MiB", "memory_budget: 64MiB").replace("chunk_size: 1MiB",
                                                                                        "chunk_size: 64KiB")
    gpt_args = ["--steps", "30", "--seed", str(model_seed), "--backend", "gloo"]
    golden_job = ScriptClusterJob(SCRIPT, gpt_args, 3, 1, cfg, prefix="ftrun-gpt-ec-", ports=4, spares=1)
    check(golden_job.wait(timeout=150) == 0, f"failure-free run failed\n{golden_job.log[-3000:]}")
    want_loss, want_weights = losses(golden_job.log), weights(golden_job.log)
    job = ScriptClusterJob(SCRIPT, gpt_args + ["--step-ms", "60"], 3, 1, cfg, prefix="ftrun-gpt-ec-", ports=4,
                           spares=1)
    after = rng.randrange(3, 10)
    st = job.wait_for(lambda s: committed(s) and s["committed_version"] >= after, timeout=90)
    victim = rng.randrange(3)
    check(st is not None and job.kill_node(victim), f"node {victim} killed after {after} commits")
    print(f"killed node {victim} after version {after} committed", flush=True)
    rc = job.wait(timeout=150)
    check(rc == 0, f"run with a node lost: runner exit {rc}\n{job.log[-4000:]}")
    check("from the erasure group, every chunk checked" in job.log, "no rebuild in the log")
    check(losses(job.log) == want_loss, "losses differ from the failure-free run")
    check(weights(job.log) == want_weights and len(want_weights) == 3,
          f"final weights {weights(job.log)} != failure-free run {want_weights}")
