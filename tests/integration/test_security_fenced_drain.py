"""A fenced agent that is still alive never writes to the persist directory
when it exits, and no version on disk mixes timelines (issue 13, "Disk: one
timeline, always").

3 local nodes x 1 rank + 2 spares, replicas 1, persist every 10 versions.

Node 1's agent and rank are frozen (SIGSTOP) and node 2 (node 1's only
holder) is SIGKILLed: the coordinator declares both lost, finds no copy of
rank 1 and goes back to the newest version complete on disk; spares take
nodes 1 and 2 and drop their files above it. Then the old node 1 agent is
thawed: it finds its coordinator gone, is fenced ("node 1 was given to
agent ..."), and exits. Before the fix it wrote its last committed version
(of the timeline the job left) on the way out, next to the new timeline's
files. Afterwards every marker on disk is read: each carries an epoch, and
every version's markers agree on it.
"""
import os
import signal
import struct
import time

from ftrun_testlib import ClusterJob, digests, golden

NODES, PER_NODE = 3, 1
STEPS = int(os.environ.get("FTRUN_TEST_STEPS", "500"))
ARGS = ["--state-bytes", "2MiB", "--tensors", "2", "--steps", str(STEPS), "--change-fraction", "0.3"]
PACE = ["--step-ms", "40"]  # not part of the state


def running(s):
    return s["phase"] == "running" and s["committed_version"] is not None


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def read_marker(path):
    """(format, version, node, epoch or None) of a node<n>.COMPLETE file."""
    with open(path, "rb") as f:
        b = f.read()
    if len(b) < 12 + 16 or b[:8] != b"FTRCMPLT":
        return None
    fmt = struct.unpack_from("<I", b, 8)[0]
    off = 12
    n = struct.unpack_from("<I", b, off)[0]
    off += 4 + n + 4  # job id, world size
    version, node = struct.unpack_from("<Qi", b, off)
    off += 12
    epoch = struct.unpack_from("<Q", b, off)[0] if fmt >= 2 else None
    return fmt, version, node, epoch


def test_fenced_agent_writes_nothing(check, scratch):
    """The frozen node 1 agent, thawed after the job went back to the disk without it, is fenced, exits, and
    writes nothing to the persist directory; every marker on disk carries its epoch, one per version."""
    want = golden(NODES * PER_NODE, ARGS)
    disk = scratch("ftrun-fenced-")
    job_id = "fenced-%d" % (os.getpid() % 100000)
    config = ("job:\n  id: %s\n  max_restarts: 20\n  stop_grace: 2s\n"
              "store:\n  memory_budget: 128MiB\n  chunk_size: 1MiB\n  prefault: false\n"
              "cluster:\n  replicas: 1\n  heartbeat_interval: 200ms\n  heartbeat_misses: 10\n  lost_node_timeout: 30s\n"
              "persist:\n  dir: %s\n  every_versions: 10\n  every_seconds: 0s\n  keep: 3\n  drain_timeout: 20s\n"
              % (job_id, disk))
    env = dict(os.environ, UCX_NET_DEVICES=os.environ.get("UCX_NET_DEVICES", "lo"))
    job = ClusterJob(NODES, PER_NODE, ARGS + PACE, config, spares=2, env=env)

    st = job.wait_for(lambda s: running(s) and s["committed_version"] >= 30 and
                      all((job.last_written(s["nodes"][n]["agent"]) or 0) >= 10 for n in range(NODES)) and
                      s["committed_version"] >= max(job.last_written(s["nodes"][n]["agent"]) or 0
                                                    for n in range(NODES)) + 8,
                      timeout=120)
    old_agent = old_pid = None
    if check(st is not None, "versions reach the disk on every node"):
        old_agent = st["nodes"][1]["agent"]
        old_pid = st["agents"][old_agent]["pid"]
        ranks = [r["pid"] for r in (job.agent_state(old_agent) or {}).get("ranks", []) if r.get("pid")]
        before = st["committed_version"]
        print(f"committed {before}: freezing node 1 (agent {old_agent}, pid {old_pid}) and SIGKILLing node 2",
              flush=True)
        for pid in [old_pid] + ranks:
            os.kill(pid, signal.SIGSTOP)
        job.kill_node(2)
        # The job goes back to the disk with spares in nodes 1 and 2, and runs.
        st = job.wait_for(lambda s: running(s) and s["restarts"] > 0 and s["nodes"][1]["agent"] != old_agent,
                          timeout=90)
        check(st is not None, "the coordinator replaces node 1 and the job runs again")
        print(f"running again at committed {st and st['committed_version']}; thawing the old node 1 agent", flush=True)
        for pid in [old_pid] + ranks:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        deadline = time.time() + 60
        while alive(old_pid) and time.time() < deadline:
            time.sleep(0.1)
        check(not alive(old_pid), "the fenced agent exits")

    rc = job.wait(timeout=300)
    print(f"exit {rc}", flush=True)
    check(rc == 0, f"the job ends with exit 0 (got {rc})\n{job.log[-4000:]}")
    check(digests(job.log) == want, "digests equal the failure-free run's")
    check("the newest complete in the persist directory" in job.log, "the job went back to the disk")
    if old_agent is not None:
        tag = f"ftrun-agent [node {old_agent} rank -]"
        mine = [line for line in job.log.splitlines() if tag in line]
        check(any("fenced out of the job" in line or "lost the coordinator" in line for line in mine),
              "the old agent learns it is out of the job\n" + "\n".join(mine[-20:]))
        drained = [line for line in mine if "before exiting" in line and "not writing" not in line]
        wrote = [line for line in mine if "on disk in" in line]
        check(not drained, "the fenced agent does not drain its old committed version\n" + "\n".join(drained))
        fenced_at = next((i for i, line in enumerate(mine) if "lost the coordinator" in line), len(mine))
        late = [line for line in mine[fenced_at:] if "on disk in" in line]
        check(not late, "the fenced agent writes nothing to disk once out of the job\n" + "\n".join(late + wrote[-3:]))

    # Every marker on disk: each carries an epoch; a version's markers agree.
    job_dir = os.path.join(disk, job_id)
    versions = sorted(d for d in os.listdir(job_dir) if d.startswith("v")) if os.path.isdir(job_dir) else []
    check(versions, f"versions on disk under {job_dir}")
    for vd in versions:
        markers = {}
        for name in sorted(os.listdir(os.path.join(job_dir, vd))):
            if name.endswith(".COMPLETE"):
                markers[name] = read_marker(os.path.join(job_dir, vd, name))
        for name, m in markers.items():
            check(m is not None and m[0] >= 2 and m[3] is not None,
                  f"{vd}/{name} carries the epoch of its version (format {m and m[0]})")
        epochs = {m[3] for m in markers.values() if m}
        check(len(epochs) <= 1, f"{vd}: markers of one version from two timelines: {markers}")
        print(f"{vd}: {', '.join(f'{n} epoch {m[3]}' for n, m in markers.items() if m)}", flush=True)
