"""A chunk corrupted in an agent's shared memory (a bit flipped through
/proc/<agent>/fd/<store_fd> at an offset the status lists under
store.committed_chunks), then one of that node's ranks SIGKILLed, so every
rank restores the committed version and the node's ranks read the bad chunk.

- 3 nodes x 2 ranks, replicas 1: the agent drops the chunk (and the
  snapshots that use it), pulls the rank's shard from its holder before the
  restart, and the job ends with the failure-free digests; the log names the
  chunk and the repair, the status counts it.
- 1 node, a persist directory that holds the chunk: repaired from disk, and
  the failure-free digests again.
- 1 node, no holder and no persist directory: the job stops with an error
  that names the rank, tensor and chunk, after one restart (no loop).

Only rank 0 changes its state (--change-only-rank 0), so a chunk of any other
rank is in every later version too: whichever version is committed when the
rank dies, the restore reads the flipped chunk.
"""
import os
import random
import shutil
import signal
import time

import pytest

from ftrun_testlib import ClusterJob, Job, digests, golden

ARGS = ["--state-bytes", "8MiB", "--tensors", "4", "--steps", "150", "--step-ms", "20", "--change-fraction", "0.3",
        "--change-only-rank", "0"]
BASE = ("job:\n  max_restarts: 5\n  stop_grace: 2s\n"
        "store:\n  memory_budget: 256MiB\n  chunk_size: 1MiB\n  prefault: false\n")
CLUSTER = BASE + ("cluster:\n  replicas: 1\n  heartbeat_interval: 200ms\n  heartbeat_misses: 10\n"
                  "  lost_node_timeout: 30s\n")

@pytest.fixture(scope="module")
def rng():
    seed = int(os.environ.get("FTRUN_TEST_SEED", time.time()))
    print("seed", seed, "(set FTRUN_TEST_SEED to replay)")
    return random.Random(seed)


def flip_bit(rng, agent_status, chunk):
    """Flips one bit of `chunk` (a committed_chunks entry) in the agent's store."""
    path = "/proc/%d/fd/%d" % (agent_status["agent_pid"], agent_status["store"]["store_fd"])
    at = chunk["offset"] + rng.randrange(chunk["bytes"])
    bit = rng.randrange(8)
    with open(path, "r+b", buffering=0) as f:
        f.seek(at)
        b = f.read(1)[0]
        f.seek(at)
        f.write(bytes([b ^ (1 << bit)]))
    print(f"flipped bit {bit} at offset {at} of {path}: rank {chunk['rank']} tensor '{chunk['tensor']}' "
          f"chunk #{chunk['chunk']} of version {chunk['version']}", flush=True)


def kill(pid):
    if not pid or pid <= 0:  # 0 would be our own process group
        return False
    try:
        os.kill(pid, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False


def samples(agent_status, ranks):
    chunks = (agent_status or {}).get("store", {}).get("committed_chunks", [])
    return [c for c in chunks if c["rank"] in ranks]


def chunk_name(c):
    return f"rank {c['rank']} tensor '{c['tensor']}' chunk #{c['chunk']} of version "


def test_repaired_from_holder(check, rng):
    """3 nodes x 2 ranks, replicas 1: the agent drops the corrupted chunk, pulls the rank's shard from its
    holder before the restart, names the chunk and the repair, counts it, and the job ends with the
    failure-free digests."""
    nodes, per_node = 3, 2
    want = golden(nodes * per_node, ARGS)
    job = ClusterJob(nodes, per_node, ARGS, CLUSTER)
    node = rng.choice([1, 2])  # not node 0: its rank 0 changes
    ranks = [node * per_node + i for i in range(per_node)]
    st = job.wait_for(lambda s: s["phase"] == "running" and s["committed_version"] is not None, timeout=60)
    check(st is not None, "cluster: the job never committed a version")
    chunk = None
    if st:
        agent = st["nodes"][node]["agent"]
        deadline = time.time() + 30
        ast = None
        while time.time() < deadline and not chunk:
            ast = job.agent_state(agent)
            found = samples(ast, ranks)
            if found:
                check(len([c for c in found if c["rank"] == ranks[0]]) <= 4, "cluster: more than 4 samples per rank")
                check(isinstance(ast["store"].get("store_fd"), int), "cluster: no store_fd in the agent's status")
                chunk = rng.choice(found)
            time.sleep(0.02)
        check(chunk is not None, f"cluster: agent {agent} lists no committed chunk of ranks {ranks}")
        if chunk:
            flip_bit(rng, ast, chunk)
            victim = rng.choice(ast["ranks"])
            check(kill(victim["pid"]), f"cluster: could not SIGKILL rank {victim['rank']}")
            print(f"cluster: SIGKILLed rank {victim['rank']} of node {node}", flush=True)
    rc = job.wait(timeout=240)
    check(rc == 0, f"cluster: runner exit {rc}\n{job.log[-5000:]}")
    check(digests(job.log) == want, "cluster: digests differ from the failure-free run")
    if chunk:
        check(chunk_name(chunk) in job.log and "corrupted in shared memory; repaired from agent " in job.log,
              f"cluster: no WARN naming the chunk and its repair\n{job.log[-5000:]}")
        ast = job.agent_state(st["nodes"][node]["agent"]) if st else None
        repaired = (ast or {}).get("store", {}).get("chunks_corrupt_repaired", 0)
        check(repaired >= 1, f"cluster: chunks_corrupt_repaired is {repaired} in the agent's status")


@pytest.mark.parametrize("persist", [False, True], ids=["no holder, no persist", "persist"])
def test_single_node(check, scratch, rng, persist):
    """1 node with a persist directory that holds the chunk: repaired from disk, and the failure-free digests.
    1 node, no holder and no persist directory: the job stops with an error that names the rank, tensor and
    chunk, after one restart (no loop)."""
    name = "one node, persist" if persist else "one node, no holder, no persist"
    nranks = 2
    config = BASE
    persist_dir = scratch("ftrun-shm-persist-") if persist else None
    if persist:
        config += "persist:\n  dir: %s\n  every_versions: 1\n" % persist_dir
    job = Job(nranks, ARGS, config, job_id="shm-corr-%d-%d" % (os.getpid(), int(persist)))
    pred = (lambda s: s["committed_version"] is not None and samples(s, [1])
            and (not persist or (s.get("persist") or {}).get("last_written_version") is not None))
    st = job.wait_for(pred, timeout=60)
    check(st is not None and st["state"] == "running", f"{name}: no committed version listed while running")
    chunk = None
    if st and st["state"] == "running":
        chunk = rng.choice(samples(st, [1]))
        flip_bit(rng, st, chunk)
        check(kill(job.rank_pid(0)), f"{name}: could not SIGKILL rank 0")
    rc = job.wait(timeout=240)
    end = job.state() or {}
    if persist_dir:
        shutil.rmtree(persist_dir, ignore_errors=True)
    if not chunk:
        return
    if persist:
        check(rc == 0, f"{name}: agent exit {rc}\n{job.log[-4000:]}")
        check(digests(job.log) == golden(nranks, ARGS), f"{name}: digests differ from the failure-free run")
        check(chunk_name(chunk) in job.log and "corrupted in shared memory; repaired from the persist directory"
              in job.log, f"{name}: no WARN naming the chunk and its repair\n{job.log[-4000:]}")
        check(end.get("store", {}).get("chunks_corrupt_repaired", 0) >= 1, f"{name}: repair not counted")
        return
    # Nothing to repair from: a clear error, not a loop and never wrong bytes.
    check(rc == 1, f"{name}: expected exit 1, got {rc}\n{job.log[-4000:]}")
    check("cannot restart: " + chunk_name(chunk) in job.log and "corrupted in shared memory" in job.log
          and "no good copy" in job.log, f"{name}: no clear error naming the chunk\n{job.log[-4000:]}")
    check(end.get("restarts", 99) <= 1, f"{name}: {end.get('restarts')} restarts: it looped")
    check(end.get("store", {}).get("chunks_corrupt_found", 0) >= 1, f"{name}: the corruption is not counted")
    check(not digests(job.log), f"{name}: a rank finished after restoring a corrupted chunk")
