"""A cluster goes back to a version on disk, trains past the version it had
committed before, and loses a rank and a node again: every rank must restore
a version its own node holds (or pulls first), the job must never loop on a
version a node lacks, and it must end with the failure-free run's digests.

4 local nodes x 2 ranks + 1 spare, replicas 1, persist every 5 versions.

1. Nodes 1 and 2 (node 1's only holder) are SIGKILLed at once: ranks 2, 3
   have no live copy, so the coordinator goes back to the newest version
   complete on disk (the chaos soak's path before its endless loop).
2. Once the job has committed past the version it had before the loss,
   ranks die while the coordinator is frozen (SIGSTOP of the runner): the
   replication round in flight completes meanwhile, the rank's agent stops
   its ranks, and the coordinator, thawed, may commit that round's version
   before it reads the failure. The agent must keep the version until the
   coordinator's halt says what is committed (the soak's loop: the agent
   had dropped it as uncommitted, the coordinator counted its copy, and
   every restart failed with NOT_FOUND).
3. A node is SIGKILLed: the spare pulls its shards from the holders.
"""
import os
import random
import signal
import time

from ftrun_testlib import ClusterJob, digests, golden

NODES, PER_NODE = 4, 2
STEPS = int(os.environ.get("FTRUN_TEST_STEPS", "1600"))
ARGS = ["--state-bytes", "4MiB", "--tensors", "2", "--steps", str(STEPS), "--change-fraction", "0.3"]
PACE = ["--step-ms", "15"]  # not part of the state: the golden run goes without it
FREEZES = int(os.environ.get("FTRUN_TEST_FREEZES", "6"))
MAX_RESTARTS = 40


def running(s):
    return s["phase"] == "running" and s["committed_version"] is not None


def node_agent(st, node):
    return st["nodes"][node]["agent"]


def is_child(pid, parent):
    """pid is alive and a child of parent (never a stale pid reused by another process)."""
    if not pid or pid <= 0 or not parent:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1]) == parent
    except (OSError, ValueError, IndexError):
        return False


def stamp():
    t = time.time()
    return time.strftime("%H:%M:%S", time.localtime(t)) + ".%03d" % (t * 1000 % 1000)


def test_go_back_then_more_losses(check, scratch):
    """Two nodes lost at once (back to the disk), ranks killed while the coordinator is frozen, then a
    node lost: every recovery restores a version its node holds, and the job ends with the failure-free
    run's digests."""
    seed = int(os.environ.get("FTRUN_TEST_SEED", time.time()))
    print("seed", seed, "(set FTRUN_TEST_SEED to replay)", flush=True)
    rng = random.Random(seed)
    want = golden(NODES * PER_NODE, ARGS)

    disk = scratch("ftrun-goback-")
    config = ("job:\n  id: goback-%d\n  max_restarts: %d\n  stop_grace: 2s\n"
              "store:\n  memory_budget: 256MiB\n  chunk_size: 1MiB\n  prefault: false\n"
              # Heartbeats ride out a frozen coordinator (below 5 s).
              "cluster:\n  replicas: 1\n  heartbeat_interval: 200ms\n  heartbeat_misses: 25\n  lost_node_timeout: 30s\n"
              "persist:\n  dir: %s\n  every_versions: 5\n  every_seconds: 0s\n  keep: 3\n"
              % (rng.randrange(1 << 30), MAX_RESTARTS, disk))
    # Loopback only: UCX otherwise also opens lanes over every other interface,
    # and the bridges that other tests' network namespaces add and remove take
    # this job's connections down with them (endpoint timeouts in every process).
    env = dict(os.environ, UCX_NET_DEVICES=os.environ.get("UCX_NET_DEVICES", "lo"))
    job = ClusterJob(NODES, PER_NODE, ARGS + PACE, config, spares=1, env=env)

    def after_recovery(restarts, above, timeout=90):
        """The job runs again after the fault (it had `restarts` restarts before) and trains well past version
        `above` (a job that restarts in a loop on a version it cannot restore never does); the fault cost a
        bounded number of restarts."""
        st = job.wait_for(lambda s: running(s) and s["restarts"] > restarts and s["committed_version"] > above + 20,
                          timeout=timeout)
        if st is not None:
            check(st["restarts"] <= restarts + 3, f"one fault cost {st['restarts'] - restarts} restarts")
        return st

    faults = 0
    stopped_early = None

    # --- 1. two nodes at once: back to the disk --------------------------------
    st = job.wait_for(lambda s: running(s) and s["committed_version"] >= 30 and
                      all((job.last_written(node_agent(s, n)) or 0) >= 10 for n in range(NODES)) and
                      s["committed_version"] >= max(job.last_written(node_agent(s, n)) or 0 for n in range(NODES)) + 4,
                      timeout=120)
    if check(st is not None, "versions reach the disk on every node"):
        before = st["committed_version"]
        print(f"committed {before}: SIGKILL nodes 1 and 2 at once (node 1's only holder; replicas: 1)", flush=True)
        job.kill_node(1)
        job.kill_node(2)
        faults += 2
        # Past the version committed before the loss: the new timeline saves
        # (and commits) version numbers the old one had too.
        st = after_recovery(0, before + 10)
        if not check(st is not None, f"the job goes back to the disk and commits past version {before} again"):
            stopped_early = "after the two-node loss"

    # --- 2. ranks die while the coordinator is frozen --------------------------
    for i in range(FREEZES if stopped_early is None else 0):
        time.sleep(0.5)  # the status files catch up with the new generation
        st = job.state()
        if st is None:
            continue
        restarts, committed = st["restarts"], st["committed_version"]
        node = rng.randrange(NODES)
        agent = node_agent(st, node)
        ast = job.agent_state(agent) or {}
        pids = [r["pid"] for r in ast.get("ranks", []) if is_child(r.get("pid", 0), ast.get("agent_pid", 0))]
        if not pids:
            continue
        time.sleep(rng.uniform(0.0, 0.1))
        job.proc.send_signal(signal.SIGSTOP)
        try:
            time.sleep(0.3)  # the round in flight completes; its acknowledgements wait for the coordinator
            victim = rng.choice(pids)
            try:
                os.kill(victim, signal.SIGKILL)
                faults += 1
            except ProcessLookupError:
                victim = None
            # Its agent stops the node's ranks without the coordinator.
            deadline = time.time() + 2.0
            while time.time() < deadline:
                a = job.agent_state(agent) or {}
                if a.get("state") == "idle":
                    break
                time.sleep(0.02)
        finally:
            job.proc.send_signal(signal.SIGCONT)
        print(f"{stamp()} freeze {i + 1}: killed a rank of node {node} (pid {victim}) with the coordinator frozen at "
              f"committed {committed}", flush=True)
        st = after_recovery(restarts, committed)
        if not check(st is not None, f"freeze {i + 1}: the job recovers and commits a newer version"):
            stopped_early = f"at freeze {i + 1}"
            break

    # --- 3. a node dies: the spare pulls its shards ----------------------------
    if stopped_early is None:
        st = job.state()
        restarts, committed = st["restarts"], st["committed_version"]
        node = rng.randrange(NODES)
        print(f"committed {committed}: SIGKILL node {node}", flush=True)
        job.kill_node(node)
        faults += 1
        if not check(after_recovery(restarts, committed) is not None, "the job recovers from the node loss"):
            stopped_early = "after the last node loss"

    rc = job.wait(timeout=300)
    st = job.state() or {}
    print(f"{faults} faults; exit {rc}; restarts {st.get('restarts')}", flush=True)
    check(rc == 0, f"the job ends with exit 0 (got {rc}; {stopped_early or 'every fault done'})\n{job.log[-5000:]}")
    check(digests(job.log) == want, "digests equal the failure-free run's")
    check("the newest complete in the persist directory" in job.log, "the two-node loss goes back to the disk")
    check("has no snapshot at version" not in job.log,
          "no rank is ever told to restore a version its node does not hold\n" +
          "\n".join(line for line in job.log.splitlines() if "has no snapshot" in line)[:3000])
    # The agent's own check before it starts its ranks (the coordinator then has
    # the copy pulled) is the safety net; here no node should ever need it.
    check("told to start from version" not in job.log,
          "no agent is ever told to start from a committed version it dropped\n" +
          "\n".join(line for line in job.log.splitlines() if "told to start from version" in line)[:3000])
