"""The faults, each done for real: a signal to a process, the link of a node
taken down, nftables rules, a full or read-only filesystem, a bit flipped
in the store's shared memory or in a chunk file on disk.

inject(ctx, fault, rng) returns (record, undo): record is what the report
shows (target, parameters, and for a corruption where it was made), undo is
called when the fault's duration is over (None for a fault that happens at
once). A fault that cannot be made (its target is gone, no committed chunk
yet) raises Skip with the reason; the scheduler tries again later."""
import glob
import json
import os
import random
import signal
import threading
import time

from .nodes import NodeError, flip_bit
from .persist_files import CHUNK_HEADER, chunk_path, complete_versions, manifest_chunks



class Skip(Exception):
    pass


class Context:
    """What a fault needs: the plan, the running job, the nodes, where things are."""

    def __init__(self, plan, job, nodes, runner_path):
        self.plan, self.job, self.nodes, self.runner_path = plan, job, nodes, runner_path

    def status(self):
        st = self.job.read_status()
        if st is None:
            raise Skip("the runner's status file is not there (yet)")
        return st

    def agent_of_node(self, node):
        st = self.status()
        agent = st["nodes"][node].get("agent")
        if agent is None:
            raise Skip("node %d has no agent right now" % node)
        return agent

    def agent_status(self, agent):
        path = os.path.join(os.path.dirname(self.job.status_path), "agent%d.json" % agent)
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError):
            raise Skip("agent %d's status file %s is not readable" % (agent, path))

    def pick_node(self, target, rng):
        return rng.randrange(self.plan.nodes) if target in (None, "any") else target

    def pick_rank(self, target, rng):
        return rng.randrange(self.plan.nodes * self.plan.ranks_per_node) if target in (None, "any") else target

    def rank_pid(self, rank):
        node = rank // self.plan.ranks_per_node
        agent = self.agent_of_node(node)
        for r in self.agent_status(agent).get("ranks", []):
            if r.get("rank") == rank and r.get("pid"):
                return node, agent, r["pid"]
        raise Skip("rank %d has no process right now" % rank)


def _signal(ctx, agent, pid, sig):
    """Signals a process of agent's machine (a rank, the agent); Skip when it is gone."""
    if pid <= 0:  # 0 or -1 would signal a whole process group
        raise Skip("no pid")
    if not ctx.nodes.send_signal(agent, pid, sig):
        raise Skip("process %d is gone" % pid)


def _sig(name):
    return int(signal.Signals[name])


# ----------------------------------------------------------------- processes

def rank_kill(ctx, f, rng):
    name = f.params["signal"]
    node, agent, pid = ctx.rank_pid(ctx.pick_rank(f.rank, rng))
    _signal(ctx, agent, pid, _sig(name))
    return {"target": "node %d (agent %d) rank pid %d" % (node, agent, pid), "params": {"signal": name},
            "namespaces": [agent]}, None


def rank_hang(ctx, f, rng):
    node, agent, pid = ctx.rank_pid(ctx.pick_rank(f.rank, rng))
    _signal(ctx, agent, pid, signal.SIGSTOP)
    return {"target": "node %d (agent %d) rank pid %d" % (node, agent, pid), "params": {"signal": "SIGSTOP"},
            "namespaces": [agent]}, None


def agent_kill(ctx, f, rng):
    node = ctx.pick_node(f.node, rng)
    agent = ctx.agent_of_node(node)
    pid = ctx.agent_status(agent).get("agent_pid", 0)
    _signal(ctx, agent, pid, _sig(f.params["signal"]))
    return {"target": "node %d: agent %d pid %d" % (node, agent, pid), "params": {"signal": f.params["signal"]},
            "namespaces": [agent]}, None


def node_kill(ctx, f, rng):
    node = ctx.pick_node(f.node, rng)
    agent = ctx.agent_of_node(node)
    st = ctx.agent_status(agent)
    known = [st.get("agent_pid", 0)] + [r["pid"] for r in st.get("ranks", []) if r.get("pid")]
    note = ""
    try:
        pids = ctx.nodes.kill_node(agent, known)
    except NodeError as e:  # SIGKILLed, but a process is slow to go (a thread in the kernel)
        pids, note = [None], str(e)
    if not pids:
        raise Skip("node %d has no process" % node)
    return {"target": "node %d (agent %d): %d processes" % (node, agent, len(pids)), "params": {},
            "namespaces": [agent], "note": note}, None


def coordinator_kill(ctx, f, rng):
    if not ctx.job.alive():
        raise Skip("the runner is not running")
    pid = ctx.job.kill_coordinator(_sig(f.params["signal"]))
    time.sleep(f.params["attach_after"])
    ctx.job.attach(ctx.runner_path)
    return {"target": "runner pid %d, then ftrun --attach %s" % (pid, ctx.job.job_id),
            "params": {"signal": f.params["signal"], "attach_after_s": f.params["attach_after"]}}, None


# ----------------------------------------------------------------- network

def _ns_of(ctx, f, rng):
    node = ctx.pick_node(f.node, rng)
    return node, ctx.agent_of_node(node)


def link_down(ctx, f, rng):
    node, ns = _ns_of(ctx, f, rng)
    ctx.nodes.link_down(ns)
    return {"target": "node %d (namespace %d)" % (node, ns), "params": {}, "namespaces": [ns]}, \
        lambda: ctx.nodes.link_up(ns)


def partition(ctx, f, rng):
    node, ns = _ns_of(ctx, f, rng)
    ctx.nodes.partition(ns)
    return {"target": "node %d (namespace %d)" % (node, ns), "params": {}, "namespaces": [ns]}, \
        lambda: ctx.nodes.heal(ns)


def packet_loss(ctx, f, rng):
    node, ns = _ns_of(ctx, f, rng)
    ctx.nodes.loss(ns, f.params["percent"])
    return {"target": "node %d (namespace %d)" % (node, ns), "params": {"percent": f.params["percent"]}}, \
        lambda: ctx.nodes.loss(ns, 0)


def delay(ctx, f, rng):
    node, ns = _ns_of(ctx, f, rng)
    how = ctx.nodes.delay(ns, f.params["ms"], f.params["jitter_ms"], queue=100 + ns)
    return {"target": "node %d (namespace %d)" % (node, ns),
            "params": {"ms": f.params["ms"], "jitter_ms": f.params["jitter_ms"], "by": how}}, \
        lambda: ctx.nodes.undelay(ns)


# ----------------------------------------------------------------- disk

def _disk_fault(ctx, kind):
    if not ctx.nodes.disk.begin(kind):
        raise Skip("another disk fault is going on (%s)" % ctx.nodes.disk.active)


def disk_full(ctx, f, rng):
    _disk_fault(ctx, "disk_full")
    try:
        taken = ctx.nodes.fill_disk()
    except BaseException:
        ctx.nodes.free_disk()
        ctx.nodes.disk.end()
        raise

    def undo():
        ctx.nodes.free_disk()
        ctx.nodes.disk.end()
    return {"target": ctx.nodes.persist_dir, "params": {"ballast_bytes": taken}}, undo


def disk_error(ctx, f, rng):
    _disk_fault(ctx, "disk_error")
    try:
        ctx.nodes.disk_read_only()
    except BaseException:
        ctx.nodes.disk.end()
        raise

    def undo():
        ctx.nodes.disk_writable()
        ctx.nodes.disk.end()
    return {"target": ctx.nodes.persist_dir, "params": {"error": "EROFS"}}, undo


# ----------------------------------------------------------------- corruption

def _all_rank_pids(ctx):
    """[(agent, pid)] of every rank now."""
    pids = []
    for node in range(ctx.plan.nodes):
        try:
            agent = ctx.agent_of_node(node)
            pids += [(agent, r["pid"]) for r in ctx.agent_status(agent).get("ranks", []) if r.get("pid")]
        except Skip:
            pass
    return pids


def _by_agent(pairs):
    out = {}
    for a, pid in pairs:
        out.setdefault(a, []).append(pid)
    return out


def _each_agent(by_agent, fn):
    """fn(agent, pids) for every agent at once (over ssh, one connection each, side by side); the results.
    The first agent's error, if any, is raised here."""
    results, errors = {}, []

    def one(a, pids):
        try:
            results[a] = fn(a, pids)
        except Exception as e:
            errors.append(e)
    threads = [threading.Thread(target=one, args=item) for item in by_agent.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return [results[a] for a in by_agent]


def _pause(ctx, timeout=10.0):
    """SIGSTOPs every rank, and any rank that starts meanwhile (the status files lag a restart), until the
    set of ranks holds still and all are stopped; then waits for their last saves' commits. Returns the
    [(agent, pid)] stopped."""
    paused, deadline = [], time.time() + timeout
    while True:
        now_ranks = _all_rank_pids(ctx)
        new = [x for x in now_ranks if x not in paused]
        _each_agent(_by_agent(new), lambda a, pids: ctx.nodes.send_signals(a, pids, signal.SIGSTOP))
        paused += new
        time.sleep(0.3)  # a status file written since shows any rank started meanwhile
        if len(now_ranks) == ctx.plan.nodes * ctx.plan.ranks_per_node and set(_all_rank_pids(ctx)) == set(now_ranks) \
                and all(_each_agent(_by_agent(now_ranks), ctx.nodes.stopped)):
            break
        if time.time() > deadline:
            _resume(ctx, paused)
            raise Skip("the ranks did not all hold still within %.0f s" % timeout)
    time.sleep(0.6)  # the last saves' copies and commit, then the status files (written every 200 ms)
    return paused


def _resume(ctx, paused):
    _each_agent(_by_agent(paused), lambda a, pids: ctx.nodes.send_signals(a, pids, signal.SIGCONT))


def _stable_sample(ctx, agent, timeout=5.0, still=0.5):
    """The agent's sample of committed chunks, once the job's committed version has not moved for `still`
    seconds (ranks paused: the commits of their last saves have landed) and the sample is of it."""
    deadline = time.time() + timeout
    last, since = None, time.time()
    while time.time() < deadline:
        committed = ctx.status().get("committed_version")
        if committed != last:
            last, since = committed, time.time()
        st = ctx.agent_status(agent)
        chunks = st.get("store", {}).get("committed_chunks") or []
        if committed is not None and time.time() - since >= still and chunks and \
                all(c["version"] == committed for c in chunks):
            return st, chunks
        time.sleep(0.05)
    raise Skip("agent %d's committed chunks did not settle on the job's committed version" % agent)


def bitflip_shm(ctx, f, rng):
    """Flips a bit of a chunk of the committed version in an agent's store. With read: restart every rank is
    paused first (SIGSTOP), so that no newer version is committed between the choice of the chunk and the
    restart; then one of the node's ranks is SIGKILLed and the others go on, and the restore reads the chunk."""
    node = ctx.pick_node(f.node, rng)
    agent = ctx.agent_of_node(node)
    restart = f.params["read"] == "restart"
    paused = _pause(ctx) if restart else []
    try:
        if restart:
            st, chunks = _stable_sample(ctx, agent)
        else:
            st = ctx.agent_status(agent)
            chunks = st.get("store", {}).get("committed_chunks")
        fd = st.get("store", {}).get("store_fd")
        if fd is None or not chunks:
            raise Skip("agent %d reports no committed chunk yet" % agent)
        c = rng.choice(chunks)
        offset, bit = c["offset"] + rng.randrange(max(1, c["bytes"])), rng.randrange(8)
        ctx.nodes.flip_bit(agent, "/proc/%d/fd/%d" % (st["agent_pid"], fd), offset, bit)
        rec = {"target": "node %d (agent %d): rank %d tensor '%s' chunk %d of version %d" % (
                   node, agent, c["rank"], c["tensor"], c["chunk"], c["version"]),
               "params": {"offset": offset, "bit": bit, "read": f.params["read"]},
               "corrupt": {"where": "shm", "rank": c["rank"], "tensor": c["tensor"], "chunk": c["chunk"],
                           "version": c["version"], "hash": c.get("hash"), "store_offset": c["offset"],
                           "read": restart},
               "namespaces": [agent]}
        if restart:
            victim = next((r for r in st.get("ranks", []) if r.get("pid")), None)
            if victim:
                rec["_t"] = time.monotonic()  # the recovery is timed from the kill, not from the pause
                ctx.nodes.send_signal(agent, victim["pid"], signal.SIGKILL)
                rec["params"]["then"] = "SIGKILL rank %d" % victim["rank"]
        return rec, None
    finally:
        _resume(ctx, paused)


def bitflip_disk(ctx, f, rng):
    _disk_fault(ctx, "bitflip_disk")
    try:
        return _bitflip_disk(ctx, f, rng)
    except FileNotFoundError as e:  # retention removed the version or the file meanwhile
        raise Skip("%s is gone" % e.filename)
    finally:
        ctx.nodes.disk.end()


def _bitflip_disk(ctx, f, rng):
    plan = ctx.plan
    versions = complete_versions(ctx.nodes.persist_dir, ctx.job.job_id, plan.nodes)
    if not versions:
        raise Skip("no complete version on disk yet")
    newest = versions[-1]
    manifests = sorted(glob.glob(os.path.join(newest, "rank*.manifest")))
    names = manifest_chunks(rng.choice(manifests)) if manifests else []
    if not names:
        raise Skip("no chunk file referenced by %s" % newest)
    # Rather a file only the newest complete version has: one that every version shares would make
    # all of them unrestorable (dedup on disk keeps one copy), which no redundancy covers.
    older = set()
    for d in versions[:-1]:
        for m in glob.glob(os.path.join(d, "rank*.manifest")):
            older.update(manifest_chunks(m))
    own = [n for n in names if n not in older]
    name = rng.choice(own or names)
    path = chunk_path(ctx.nodes.persist_dir, ctx.job.job_id, name)
    size = os.path.getsize(path)
    if size <= CHUNK_HEADER:
        raise Skip("%s has no data bytes" % path)
    offset, bit = CHUNK_HEADER + rng.randrange(size - CHUNK_HEADER), rng.randrange(8)
    flip_bit(path, offset, bit)  # the persist directory is seen from here (a shared filesystem)
    return {"target": path, "params": {"offset": offset, "bit": bit},
            "corrupt": {"where": "disk", "file": path, "inode": os.stat(path).st_ino,
                        "version_dir": os.path.basename(newest)}}, None


INJECT = {
    "rank_kill": rank_kill, "rank_hang": rank_hang, "agent_kill": agent_kill, "node_kill": node_kill,
    "coordinator_kill": coordinator_kill, "link_down": link_down, "partition": partition,
    "packet_loss": packet_loss, "delay": delay, "disk_full": disk_full, "disk_error": disk_error,
    "bitflip_shm": bitflip_shm, "bitflip_disk": bitflip_disk,
}


def inject(ctx, fault, rng):
    return INJECT[fault.kind](ctx, fault, rng)


def new_rng(seed):
    return random.Random(seed)
