"""A chaos plan: which cluster, which job, which faults, when. Parsed once and
validated; every error names the file, the line, the field and what was
expected (PlanError). The format is documented in configs/chaos/README.md.

    cluster:  {backend: netns, nodes: 4, ranks_per_node: 2, spares: 1}
    job:      {synthetic: {state_bytes: 4MiB, steps: 2000, step_ms: 20}, config: "cluster: {replicas: 1}\\n"}
    persist:  {size: 256MiB, every_versions: 20}
    faults:
      - {kind: rank_kill, at_step: 50, target: {rank: any}, signal: SIGKILL}
      - {kind: link_down, at_time: 20s, duration: 3s, target: {node: 2}}
    random:   {count: 200, seed: 7, kinds: {rank_kill: 3, node_kill: 1}, gap: [0.5s, 2s]}
"""
import os
import re
import signal

import yaml

# kind -> (parameters it takes with their defaults, whether it needs a duration)
KINDS = {
    "rank_kill": ({"signal": "SIGKILL"}, False),
    "rank_hang": ({}, False),
    "agent_kill": ({"signal": "SIGKILL"}, False),
    "node_kill": ({}, False),
    "coordinator_kill": ({"signal": "SIGKILL", "attach_after": 1.0}, False),
    "link_down": ({}, True),
    "partition": ({}, True),
    "packet_loss": ({"percent": 10.0}, True),
    "delay": ({"ms": 20.0, "jitter_ms": 0.0}, True),
    "disk_full": ({}, True),
    "disk_error": ({}, True),
    "bitflip_shm": ({"read": "restart"}, False),
    "bitflip_disk": ({}, False),
}
# Faults that take a node (or its agent) away: at most `replicas` at once.
NODE_LOSS_KINDS = {"agent_kill", "node_kill", "link_down", "partition"}
# Faults during which a node may be cut off (lost heartbeats): no other fault that restarts the job
# starts while one of these lasts, and a random group counts them against `replicas`.
AWAY_KINDS = {"link_down", "partition", "packet_loss", "delay"}
# Faults that make the job restart (the scheduler waits for the job to be up
# again before the next one of these, unless the plan says otherwise).
RESTART_KINDS = NODE_LOSS_KINDS | {"rank_kill", "rank_hang", "coordinator_kill", "bitflip_shm"}
TARGETED = {"rank": {"rank_kill", "rank_hang"},
            "node": {"agent_kill", "node_kill", "link_down", "partition", "packet_loss", "delay", "bitflip_shm"}}


class PlanError(ValueError):
    pass


class Fault:
    """One planned fault (a repeated entry becomes several)."""

    def __init__(self, kind, params, at_step=None, at_time=None, duration=None, node=None, rank=None, origin=""):
        self.kind, self.params = kind, params
        self.at_step, self.at_time, self.duration = at_step, at_time, duration
        self.node, self.rank = node, rank  # an int, "any" or None
        self.origin = origin  # "plan.yaml:12" or "random #5"

    def __repr__(self):
        when = "step %d" % self.at_step if self.at_step is not None else "%.2fs" % (self.at_time or 0)
        return "<%s at %s %s>" % (self.kind, when, self.origin)


class Plan:
    def __init__(self):
        self.path = ""
        self.name = ""
        self.backend = "netns"
        self.nodes, self.ranks_per_node, self.spares = 4, 2, 1
        self.synthetic = {"state_bytes": "4MiB", "tensors": 4, "steps": 1000, "step_ms": 20,
                          "change_fraction": 0.3}
        self.command = None  # any training command instead of the synthetic trainer
        self.golden = None   # that command's failure-free digests: "run" or a file of DIGEST lines
        self.config = ""     # ftrun YAML appended to what the harness writes
        self.replicas = 1
        self.timeout = 900.0
        self.persist_size = 0  # bytes of the tmpfs for persist.dir; 0 = no persistence
        self.persist_dir = ""  # ssh backend: persist.dir on a shared filesystem
        self.hosts, self.ssh, self.launcher_args = [], [], ""  # ssh backend
        self.coordinator_addr, self.agent_addr, self.env, self.run_dir = "", [], {}, ""
        self.persist_every = 20
        self.faults = []
        self.random = None  # dict(count, seed, kinds, gap, max_at_once, duration, start)
        self.seed = 1


# ------------------------------------------------------------------ values

_DUR = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_SIZE = re.compile(r"^\s*(\d+)\s*(B|K|KiB|M|MiB|G|GiB|T|TiB)?\s*$")
_SIZE_MUL = {None: 1, "B": 1, "K": 1 << 10, "KiB": 1 << 10, "M": 1 << 20, "MiB": 1 << 20,
             "G": 1 << 30, "GiB": 1 << 30, "T": 1 << 40, "TiB": 1 << 40}


def parse_duration(v):
    """'500ms', '2s', '1.5m', 3 (seconds) -> seconds; None when malformed."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v) if v >= 0 else None
    m = _DUR.match(str(v))
    if not m:
        return None
    return float(m.group(1)) * {"ms": 0.001, None: 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def parse_size(v):
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v if v >= 0 else None
    m = _SIZE.match(str(v))
    return int(m.group(1)) * _SIZE_MUL[m.group(2)] if m else None


def parse_signal(v):
    """'SIGKILL', 'KILL', 9 -> signal number; None when unknown."""
    if isinstance(v, int) and not isinstance(v, bool):
        return v if 0 < v < signal.NSIG else None
    name = str(v).upper()
    name = name if name.startswith("SIG") else "SIG" + name
    s = getattr(signal.Signals, name, None) if name in signal.Signals.__members__ else None
    return int(s) if s is not None else None


# ------------------------------------------------------------------ YAML with line numbers

class _Node:
    """A YAML value with the line it came from."""

    def __init__(self, value, line):
        self.value, self.line = value, line


def _convert(node):
    line = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out = {}
        for k, v in node.value:
            out[str(k.value)] = (_convert(v), k.start_mark.line + 1)
        return _Node(out, line)
    if isinstance(node, yaml.SequenceNode):
        return _Node([_convert(v) for v in node.value], line)
    return _Node(yaml.safe_load(yaml.serialize(node)), line)


class _Reader:
    """Reads fields of one mapping; errors name file:line and the field path."""

    def __init__(self, path, node, where):
        self.path, self.node, self.where = path, node, where
        if not isinstance(node.value, dict):
            self.fail(node.line, where, "expected a mapping, got %s" % _kind(node.value))
        self.seen = set()

    def fail(self, line, field, msg):
        raise PlanError("%s:%d: %s: %s" % (self.path, line, field, msg))

    def field(self, key):
        return key if not self.where else self.where + "." + key

    def has(self, key):
        return key in self.node.value

    def line(self, key):
        return self.node.value[key][1] if key in self.node.value else self.node.line

    def raw(self, key, default=None):
        self.seen.add(key)
        if key not in self.node.value:
            return default
        return self.node.value[key][0]

    def get(self, key, default=None):
        n = self.raw(key)
        return default if n is None else _plain(n)

    def sub(self, key):
        n = self.raw(key)
        return _Reader(self.path, n, self.field(key)) if n is not None else None

    def int(self, key, default, lo=None, hi=None):
        v = self.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or (lo is not None and v < lo) or (hi is not None and v > hi):
            rng = "" if lo is None else (" >= %d" % lo if hi is None else " in %d..%d" % (lo, hi))
            self.fail(self.line(key), self.field(key), "expected an integer%s, got %r" % (rng, v))
        return v

    def number(self, key, default, lo=0.0, hi=None):
        v = self.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < lo or (hi is not None and v > hi):
            self.fail(self.line(key), self.field(key), "expected a number >= %g%s, got %r" % (
                lo, "" if hi is None else " and <= %g" % hi, v))
        return float(v)

    def duration(self, key, default):
        v = self.get(key, default)
        d = parse_duration(v) if v is not None else None
        if v is not None and d is None:
            self.fail(self.line(key), self.field(key), "expected a duration like 500ms, 2s or 1m, got %r" % (v,))
        return d

    def size(self, key, default):
        v = self.get(key, default)
        s = parse_size(v)
        if s is None:
            self.fail(self.line(key), self.field(key), "expected a size like 4096, 64MiB or 1G, got %r" % (v,))
        return s

    def string(self, key, default, choices=None):
        v = self.get(key, default)
        if not isinstance(v, str) or (choices and v not in choices):
            self.fail(self.line(key), self.field(key), "expected %s, got %r" % (
                "one of " + ", ".join(choices) if choices else "a string", v))
        return v

    def done(self):
        extra = sorted(set(self.node.value) - self.seen)
        if extra:
            k = extra[0]
            self.fail(self.line(k), self.field(k), "unknown key (expected one of %s)" % ", ".join(sorted(self.seen)))


def _plain(n):
    if isinstance(n.value, dict):
        return {k: _plain(v) for k, (v, _) in n.value.items()}
    if isinstance(n.value, list):
        return [_plain(v) for v in n.value]
    return n.value


def _kind(v):
    return {dict: "a mapping", list: "a list", str: "a string", type(None): "nothing"}.get(type(v), type(v).__name__)


# ------------------------------------------------------------------ sections

def load(path):
    """Reads and validates a plan file; raises PlanError naming file, line and field."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise PlanError("%s: cannot read the plan: %s" % (path, e.strerror or e))
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise PlanError("%s:%s: not valid YAML: %s" % (path, mark.line + 1 if mark else "?",
                                                      getattr(e, "problem", None) or e))
    if root is None:
        raise PlanError("%s:1: the plan is empty (expected cluster, job and faults or random)" % path)
    r = _Reader(path, _convert(root), "")
    p = Plan()
    p.path = path
    p.name = r.string("name", path)
    _cluster(p, r)
    _job(p, r)
    _persist(p, r)
    _faults(p, r)
    _random(p, r)
    r.done()
    if not p.faults and not p.random:
        r.fail(1, "faults", "the plan names no fault (expected a 'faults' list or a 'random' section)")
    _cross_checks(p, r)
    return p


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
    p.replicas = c.int("replicas", 1, 1, p.nodes - 1)
    c.done()


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
