"""A multi-GiB restore from disk on 2 nodes: no node is declared lost.

A cluster restarted whole restores its ranks' newest version from the
persist directory. The reads (GiB, each chunk hashed) once ran on the agent's
event loop, so a node restoring its shard sent no heartbeat for longer than
cluster.heartbeat_misses x cluster.heartbeat_interval and the coordinator
declared it lost (and the node, coming back, restored again, and again).
Now the reads run on the agent's disk worker and heartbeats keep flowing.

2 nodes x 1 rank, 2 GiB of state per rank, replicas 0, a heartbeat budget of
100 ms x 10 (1 s: small, so that the data stays modest, yet above a loaded
CI machine's scheduling stalls): run 1 writes a version to
disk and is killed whole; run 2 restores it and must finish with the
failure-free digests, with no node lost and no restart.
"""
import os
import random

from ftrun_testlib import ClusterJob, digests, golden

ARGS = ["--state-bytes", "2GiB", "--tensors", "4", "--steps", "60", "--step-ms", "200", "--change-fraction", "0.01"]


def test_restore_keeps_heartbeats(check, scratch):
    """Run 1 writes a version to disk and is killed whole; run 2 restores 2 GiB per node from disk: no node is
    declared lost, no restart, and the failure-free digests."""
    want = golden(2, ARGS)
    rng = random.Random()
    disk = scratch("ftrun-sec-hb-")
    config = ("job:\n  id: sec-hb-%d\n  max_restarts: 3\n"
              "store:\n  memory_budget: 3GiB\n  chunk_size: 4MiB\n  prefault: false\n"
              "cluster:\n  replicas: 0\n  heartbeat_interval: 100ms\n  heartbeat_misses: 10\n  lost_node_timeout: 20s\n"
              "persist:\n  dir: %s\n  every_versions: 1\n  every_seconds: 0s\n  keep: 2\n"
              % (rng.randrange(1 << 30), disk))
    env = dict(os.environ, UCX_NET_DEVICES=os.environ.get("UCX_NET_DEVICES", "lo"))

    # Run 1: a version reaches the disk on both nodes, then the job is killed whole.
    job = ClusterJob(2, 1, ARGS, config, env=env)
    st = job.wait_for(lambda s: all((job.last_written(a) or 0) >= 1 for a in range(2)), timeout=180)
    if check(st is not None, "run 1: a version reaches the disk on both nodes"):
        job.kill_whole(st)
    job.wait(60)

    # Run 2: both nodes restore 2 GiB each from disk while the coordinator waits
    # for their heartbeats.
    job = ClusterJob(2, 1, ARGS, config, env=env)
    rc = job.wait(300)
    log = job.log
    restored = [line for line in log.splitlines() if "restored version" in line and "from disk" in line]
    print("\n".join(restored), flush=True)
    lost = [line for line in log.splitlines() if ") lost: " in line or "lost the coordinator" in line]
    check(len(restored) >= 2, f"run 2: both nodes restore their shard from disk\n{log[-4000:]}")
    check(not lost, "run 2: no node is declared lost during the restore\n" + "\n".join(lost[:10]))
    check("restoring version" in log and "from the persist directory" in log,
          "run 2: the coordinator restores from disk")
    check(rc == 0, f"run 2: exit 0 (got {rc})\n{log[-4000:]}")
    check(digests(log) == want, "run 2: digests equal the failure-free run's")
