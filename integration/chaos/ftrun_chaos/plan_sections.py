"""The sections of a chaos plan (cluster, job, persist, faults, random) read
into a Plan, and the checks across sections; plan.load() calls them in order."""
import os
import signal

import yaml

from .fault_kinds import KINDS, TARGETED, Fault
from .plan_reader import _kind, _Reader, parse_duration, parse_signal


def _cluster(p, r):
    c = r.sub("cluster")
    if c is None:
        return
    p.backend = c.string("backend", "netns", ["netns", "ssh"])
    if p.backend == "ssh":
        _ssh_cluster(p, c)
    p.spares = c.int("spares", 1, 0, 8)
    p.nodes = c.int("nodes", len(p.hosts) - p.spares if p.hosts else 4, 2, 64)
    if p.hosts and p.nodes + p.spares != len(p.hosts):
        c.fail(c.line("nodes"), c.field("nodes"), "expected nodes + spares = %d (the hosts listed), got %d + %d" % (
            len(p.hosts), p.nodes, p.spares))
    p.ranks_per_node = c.int("ranks_per_node", 2, 1, 64)
    if c.has("erasure"):
        _erasure(p, c)
    else:
        p.replicas = c.int("replicas", 1, 1, p.nodes - 1)
    c.done()


def _erasure(p, c):
    """cluster.erasure: {data: D, parity: P}, the job's cluster.redundancy instead of replicas (with the
    bounds and the group rule of the ftrun config, configs/schema.md)."""
    if c.has("replicas"):
        c.fail(c.line("erasure"), c.field("erasure"), "give either 'replicas' or 'erasure', not both")
    e = c.sub("erasure")
    for key in ("data", "parity"):
        if not e.has(key):
            e.fail(e.node.line, e.field(key), "missing (expected an integer in %s)" % (
                "1..32, the data nodes of a group" if key == "data" else "1..8, the node losses a group survives"))
    data, parity = e.int("data", None, 1, 32), e.int("parity", None, 1, 8)
    e.done()
    size = data + parity
    if p.nodes % size:
        below = p.nodes - p.nodes % size
        c.fail(c.line("erasure"), c.field("erasure"), "an erasure code of %d data + %d parity needs the nodes in "
               "groups of %d, got %d nodes (use %s, or another code)" % (
                   data, parity, size, p.nodes, "%d or %d" % (below, below + size) if below else str(size)))
    p.erasure = {"data": data, "parity": parity}
    p.replicas = 0


def _ssh_cluster(p, c):
    hosts = c.get("hosts")
    if not isinstance(hosts, list) or len(hosts) < 2 or not all(isinstance(h, str) and h for h in hosts):
        c.fail(c.line("hosts"), c.field("hosts"), "expected a list of at least 2 host names (the job's nodes, then "
               "its spares)")
    p.hosts = hosts
    ssh = c.get("ssh", "ssh -o BatchMode=yes")
    if not isinstance(ssh, str) or not ssh.split():
        c.fail(c.line("ssh"), c.field("ssh"), "expected the command that runs a command on a host, e.g. "
               "'ssh -o BatchMode=yes'")
    p.ssh = ssh.split()
    p.launcher_args = c.string("launcher_args", "")
    p.coordinator_addr = c.string("coordinator_addr", "")
    agent_addr = c.get("agent_addr", [])
    if not isinstance(agent_addr, list) or not all(isinstance(a, str) for a in agent_addr):
        c.fail(c.line("agent_addr"), c.field("agent_addr"), "expected a list of addresses, one per host")
    p.agent_addr = agent_addr
    env = c.get("env", {})
    if not isinstance(env, dict):
        c.fail(c.line("env"), c.field("env"), "expected a mapping of environment variables (UCX_*, NCCL_* ...)")
    p.env = {str(k): str(v) for k, v in env.items()}
    p.run_dir = c.string("run_dir", "")
    if not p.run_dir or not os.path.isdir(p.run_dir):
        c.fail(c.line("run_dir"), c.field("run_dir"), "the ssh backend needs agent.run_dir: an existing directory "
               "on a filesystem every host and this machine see, got %r" % p.run_dir)


def _job(p, r):
    j = r.sub("job")
    if j is None:
        return
    if j.has("synthetic") and j.has("command"):
        j.fail(j.line("command"), j.field("command"), "give either 'synthetic' or 'command', not both")
    s = j.sub("synthetic")
    if s is not None:
        syn = dict(p.synthetic)
        st = s.size("state_bytes", syn["state_bytes"])
        if st % 4 or st < 4:
            s.fail(s.line("state_bytes"), s.field("state_bytes"), "expected a multiple of 4 bytes, got %d" % st)
        syn["state_bytes"] = str(st)
        syn["tensors"] = s.int("tensors", syn["tensors"], 1)
        syn["steps"] = s.int("steps", syn["steps"], 1)
        syn["step_ms"] = s.int("step_ms", syn["step_ms"], 0)
        syn["change_fraction"] = s.number("change_fraction", syn["change_fraction"], 0.0, 1.0)
        s.done()
        p.synthetic = syn
    cmd = j.get("command")
    if cmd is not None:
        if isinstance(cmd, str):
            cmd = cmd.split()
        if not isinstance(cmd, list) or not cmd or not all(isinstance(x, (str, int, float)) for x in cmd):
            j.fail(j.line("command"), j.field("command"), "expected a command line (a string or a list of words)")
        p.command = [str(x) for x in cmd]
        p.synthetic = None
        p.golden = j.string("golden", "run")
    p.config = j.string("config", "")
    if p.config:
        try:
            yaml.safe_load(p.config)
        except yaml.YAMLError as e:
            j.fail(j.line("config"), j.field("config"), "not valid YAML: %s" % (getattr(e, "problem", None) or e))
    p.timeout = j.duration("timeout", "15m")
    j.done()


def _persist(p, r):
    s = r.sub("persist")
    if s is None:
        return
    if p.backend == "ssh":
        p.persist_dir = s.string("dir", "")
        if not os.path.isdir(p.persist_dir):
            s.fail(s.line("dir"), s.field("dir"), "the ssh backend needs persist.dir: an existing directory on a "
                   "filesystem every host and this machine see, got %r" % p.persist_dir)
        p.persist_every = s.int("every_versions", 20, 1)
        s.done()
        return
    p.persist_size = s.size("size", "256MiB")
    if p.persist_size < (16 << 20):
        s.fail(s.line("size"), s.field("size"), "expected at least 16MiB, got %d bytes" % p.persist_size)
    p.persist_every = s.int("every_versions", 20, 1)
    s.done()


def _target(fr, kind, p):
    node = rank = None
    t = fr.sub("target")
    if t is None:
        return ("any" if kind in TARGETED["node"] else None), ("any" if kind in TARGETED["rank"] else None)
    if kind in TARGETED["rank"]:
        rank = _any_or_int(t, "rank", p.nodes * p.ranks_per_node)
    elif kind in TARGETED["node"]:
        node = _any_or_int(t, "node", p.nodes)
    t.done()
    return node, rank


def _any_or_int(t, key, n):
    v = t.get(key, "any")
    if v == "any":
        return v
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < n:
        t.fail(t.line(key), t.field(key), "expected 'any' or an integer in 0..%d, got %r" % (n - 1, v))
    return v


def _params(fr, kind):
    defaults, _ = KINDS[kind]
    out = {}
    for key, default in defaults.items():
        if key == "signal":
            v = fr.get(key, default)
            sig = parse_signal(v)
            if sig is None:
                fr.fail(fr.line(key), fr.field(key), "expected a signal name or number (SIGKILL, TERM, 11), got %r" % (v,))
            out[key] = signal.Signals(sig).name
        elif key == "attach_after":
            out[key] = fr.duration(key, default)
        elif key == "read":
            out[key] = fr.string(key, default, ["restart", "none"])
        elif key == "percent":
            out[key] = fr.number(key, default, 0.0, 100.0)
        else:
            out[key] = fr.number(key, default, 0.0)
    return out


def _faults(p, r):
    lst = r.raw("faults")
    if lst is None:
        return
    if not isinstance(lst.value, list):
        r.fail(lst.line, "faults", "expected a list of faults, got %s" % _kind(lst.value))
    for i, n in enumerate(lst.value):
        fr = _Reader(p.path, n, "faults[%d]" % i)
        if not fr.has("kind"):
            fr.fail(n.line, fr.field("kind"), "missing (expected one of %s)" % ", ".join(sorted(KINDS)))
        kind = fr.string("kind", None, sorted(KINDS))
        params = _params(fr, kind)
        if fr.has("at_step") == fr.has("at_time"):
            fr.fail(n.line, fr.field("at_step"), "give exactly one of at_step (a training step) and at_time (a duration)")
        at_step = fr.int("at_step", None, 1) if fr.has("at_step") else None
        at_time = fr.duration("at_time", None)
        duration = fr.duration("duration", "2s" if KINDS[kind][1] else None)
        if duration is not None and not KINDS[kind][1]:
            fr.fail(fr.line("duration"), fr.field("duration"), "%s takes no duration (it happens at once)" % kind)
        repeat = fr.int("repeat", 1, 1)
        every = fr.get("every")
        if repeat > 1 and every is None:
            fr.fail(fr.line("repeat"), fr.field("every"), "a repeated fault needs 'every' (steps or a duration)")
        node, rank = _target(fr, kind, p)
        fr.done()
        for k in range(repeat):
            f = Fault(kind, params, at_step, at_time, duration, node, rank, "%s:%d" % (p.path, n.line))
            if k:
                if at_step is not None:
                    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
                        fr.fail(fr.line("every"), fr.field("every"), "with at_step, expected a number of steps >= 1, got %r" % (every,))
                    f.at_step = at_step + k * every
                else:
                    d = parse_duration(every)
                    if d is None or d <= 0:
                        fr.fail(fr.line("every"), fr.field("every"), "with at_time, expected a duration like 5s, got %r" % (every,))
                    f.at_time = at_time + k * d
            p.faults.append(f)


def _random(p, r):
    s = r.sub("random")
    if s is None:
        return
    count = s.int("count", 10, 1)
    p.seed = s.int("seed", 1, 0)
    kinds = s.get("kinds", {k: 1 for k in ("rank_kill", "agent_kill", "node_kill")})
    if isinstance(kinds, list):
        kinds = {k: 1 for k in kinds}
    if not isinstance(kinds, dict) or not kinds:
        s.fail(s.line("kinds"), s.field("kinds"), "expected a mapping of fault kind to weight, or a list of kinds")
    for k, w in kinds.items():
        if k not in KINDS:
            s.fail(s.line("kinds"), s.field("kinds") + "." + str(k), "not a fault kind (expected one of %s)" % ", ".join(sorted(KINDS)))
        if isinstance(w, bool) or not isinstance(w, (int, float)) or w <= 0:
            s.fail(s.line("kinds"), s.field("kinds") + "." + k, "expected a weight > 0, got %r" % (w,))
    gap = s.get("gap", ["0.2s", "1s"])
    if not isinstance(gap, list) or len(gap) != 2 or None in [parse_duration(g) for g in gap] or \
            parse_duration(gap[0]) > parse_duration(gap[1]):
        s.fail(s.line("gap"), s.field("gap"), "expected [min, max] durations, e.g. [0.5s, 2s], got %r" % (gap,))
    p.random = {"count": count, "kinds": kinds, "gap": [parse_duration(g) for g in gap],
                "max_at_once": s.int("max_at_once", 2, 1, 8),
                "duration": [parse_duration(d) for d in s.get("duration", ["0.5s", "3s"])],
                "start": s.duration("start", "2s"),
                "params": s.get("params", {})}
    if None in p.random["duration"] or len(p.random["duration"]) != 2:
        s.fail(s.line("duration"), s.field("duration"), "expected [min, max] durations, e.g. [0.5s, 3s]")
    if not isinstance(p.random["params"], dict) or not all(k in kinds for k in p.random["params"]):
        s.fail(s.line("params"), s.field("params"), "expected a mapping from a kind listed in 'kinds' to its parameters")
    s.done()


def _cross_checks(p, r):
    persist_kinds = {"disk_full", "disk_error", "bitflip_disk"}
    used = {f.kind for f in p.faults} | set((p.random or {}).get("kinds", {}))
    local = used & {"link_down", "partition", "packet_loss", "delay", "disk_error"}
    if p.backend == "ssh" and local:
        r.fail(r.line("cluster"), "cluster.backend", "%s need the netns backend (the harness does not "
               "reconfigure real hosts' networks or mounts)" % ", ".join(sorted(local)))
    if used & persist_kinds and not (p.persist_size or p.persist_dir):
        r.fail(r.line("persist") if r.has("persist") else 1, "persist",
               "faults %s need a persist directory (add 'persist: {size: 256MiB}')" % ", ".join(sorted(used & persist_kinds)))
    if p.synthetic:
        for f in p.faults:
            if f.at_step is not None and f.at_step >= p.synthetic["steps"]:
                r.fail(r.line("faults"), "faults", "%s at step %d: the job has only %d steps (%s)" % (
                    f.kind, f.at_step, p.synthetic["steps"], f.origin))
