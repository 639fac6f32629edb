"""A pull that fails when the persist directory covers it: the job goes back
to the disk and completes (it once stopped: coordinator.cc's kPullFailed
called Stop exactly when CheckCoverage had found a version on disk).

3 nodes x 1 rank + 1 spare, replicas 1, a persist directory. Node 1 is
SIGKILLed and, at the same moment, the agent of node 2 (the only holder of
node 1's copy) is frozen with SIGSTOP: the spare that takes node 1's place
pulls from node 2, which never answers, and after cluster.lost_node_timeout
reports the pull failed while node 2 is still within its heartbeat budget.
No live copy of rank 1 is left, the disk has one: every node must read the
newest complete version from disk. Node 2 is thawed once the pull failed, so
it can read its own rank from disk too; the job ends with the failure-free
digests.
"""
import os
import random
import signal
import time

from ftrun_testlib import ClusterJob, digests, golden

ARGS = ["--state-bytes", "8MiB", "--tensors", "2", "--steps", "220", "--step-ms", "30", "--change-fraction", "0.2"]


def test_failed_pull_goes_back_to_disk(check, scratch):
    """Node 1 killed while the only holder of its copy is frozen: the spare's pull fails, the job goes back to
    the newest complete version on disk, and ends with the failure-free digests."""
    want = golden(3, ARGS)
    rng = random.Random()
    disk = scratch("ftrun-sec-pull-")
    config = ("job:\n  id: sec-pull-%d\n  max_restarts: 5\n  stop_grace: 2s\n"
              "store:\n  memory_budget: 256MiB\n  chunk_size: 1MiB\n  prefault: false\n"
              # The frozen holder stays within its heartbeat budget (12 s) well past the pull timeout (3 s).
              "cluster:\n  replicas: 1\n  heartbeat_interval: 200ms\n  heartbeat_misses: 60\n  lost_node_timeout: 3s\n"
              "persist:\n  dir: %s\n  every_versions: 4\n  every_seconds: 0s\n  keep: 3\n"
              % (rng.randrange(1 << 30), disk))
    env = dict(os.environ, UCX_NET_DEVICES=os.environ.get("UCX_NET_DEVICES", "lo"))
    job = ClusterJob(3, 1, ARGS, config, spares=1, env=env)

    def on_disk(s):
        if s["phase"] != "running" or s["committed_version"] is None:
            return False
        w = [job.last_written(s["nodes"][n]["agent"]) for n in range(3)]
        return all(x is not None and x >= 8 for x in w) and s["committed_version"] >= max(w) + 3

    st = job.wait_for(on_disk, timeout=120)
    frozen = None
    if check(st is not None, "versions reach the disk on every node"):
        holder = st["agents"][st["nodes"][2]["agent"]]["pid"]
        print(f"committed {st['committed_version']}: SIGKILL node 1, SIGSTOP node 2's agent (pid {holder})", flush=True)
        os.kill(holder, signal.SIGSTOP)
        frozen = holder
        job.kill_node(1)
        deadline = time.time() + 30
        while time.time() < deadline and "last error pulling rank" not in open(job.out.name).read():
            time.sleep(0.05)
        print("the spare's pull failed" if time.time() < deadline else "no pull failure seen", flush=True)
        os.kill(frozen, signal.SIGCONT)
    rc = job.wait(240)
    if frozen:
        try:
            os.kill(frozen, signal.SIGCONT)
        except ProcessLookupError:
            pass
    log = job.log
    check("last error pulling rank 1" in log,
          f"the spare's pull of rank 1 fails, and the job goes back to disk for it\n{log[-4000:]}")
    check(rc == 0, f"the job goes back to the disk and completes: exit 0 (got {rc})\n{log[-4000:]}")
    check("from disk" in log and "restored version" in log, "the nodes restore from disk")
    check(digests(log) == want, "digests equal the failure-free run's")
