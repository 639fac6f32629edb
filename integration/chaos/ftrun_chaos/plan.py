"""A chaos plan: which cluster, which job, which faults, when. Parsed once and
validated; every error names the file, the line, the field and what was
expected (PlanError). The format is documented in configs/chaos/README.md.

    cluster:  {backend: netns, nodes: 4, ranks_per_node: 2, spares: 1}   # replicas: 1, or erasure: {data: 2, parity: 1}
    job:      {synthetic: {state_bytes: 4MiB, steps: 2000, step_ms: 20}, config: "cluster: {replicas: 1}\\n"}
    persist:  {size: 256MiB, every_versions: 20}
    faults:
      - {kind: rank_kill, at_step: 50, target: {rank: any}, signal: SIGKILL}
      - {kind: link_down, at_time: 20s, duration: 3s, target: {node: 2}}
    random:   {count: 200, seed: 7, kinds: {rank_kill: 3, node_kill: 1}, gap: [0.5s, 2s]}

The parts: fault_kinds (the kinds and Fault), plan_reader (YAML with line
numbers, the value formats, PlanError), plan_sections (each section's fields).
"""
import yaml

from .fault_kinds import AWAY_KINDS, KINDS, NODE_LOSS_KINDS, RESTART_KINDS, TARGETED, Fault
from .plan_reader import PlanError, _convert, _Reader, parse_duration, parse_signal, parse_size
from .plan_sections import _cluster, _cross_checks, _faults, _job, _persist, _random

__all__ = ["KINDS", "NODE_LOSS_KINDS", "AWAY_KINDS", "RESTART_KINDS", "TARGETED", "Fault", "Plan", "PlanError",
           "load", "parse_duration", "parse_size", "parse_signal"]


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
        self.replicas = 1    # cluster.replicas; 0 with an erasure code (as the runner's status says)
        self.erasure = None  # {"data": D, "parity": P}: cluster.redundancy erasure instead of replicas
        self.timeout = 900.0
        self.persist_size = 0  # bytes of the tmpfs for persist.dir; 0 = no persistence
        self.persist_dir = ""  # ssh backend: persist.dir on a shared filesystem
        self.hosts, self.ssh, self.launcher_args = [], [], ""  # ssh backend
        self.coordinator_addr, self.agent_addr, self.env, self.run_dir = "", [], {}, ""
        self.persist_every = 20
        self.faults = []
        self.random = None  # dict(count, seed, kinds, gap, max_at_once, duration, start)
        self.seed = 1

    def loss_groups(self):
        """The job's nodes in the sets whose losses redundancy covers separately: with replicas, one set of
        every node; with an erasure code, its groups as the coordinator forms them (see ring_groups)."""
        if not self.erasure:
            return [list(range(self.nodes))]
        return ring_groups(self.nodes, self.erasure["data"] + self.erasure["parity"])

    def losses_covered(self):
        """Node losses at once that each of loss_groups() survives: `replicas`, or the code's parity."""
        return self.erasure["parity"] if self.erasure else self.replicas

    def redundancy(self):
        """The redundancy in words, for logs and reports: "replicas 1" or "erasure 2+1"."""
        if self.erasure:
            return "erasure %d+%d" % (self.erasure["data"], self.erasure["parity"])
        return "replicas %d" % self.replicas


def ring_groups(nodes, size):
    """Erasure groups as recovery/placement.cc forms them: runs of `size` nodes of the rack ring. The harness
    names no rack (neither backend writes one), so every node is a rack of its own, and the ring lists the
    nodes in the order of their rack keys, "slot<n>" sorted as strings: 0..9, then 10, 11 .. 19, 2, 20 ...
    (the same as 0, 1, 2 ... up to 10 nodes). run.py compares them with the runner's status."""
    ring = sorted(range(nodes), key=lambda n: "slot%d" % n)
    return [ring[i:i + size] for i in range(0, nodes - size + 1, size)]


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
