"""When faults happen. The plan's own faults fire at their step (the first
time training reaches it) or at their time after the job's start; faults at
the same step or time fire together. Random faults come in groups of 1 to
`max_at_once`, a random gap apart, with kinds drawn by weight from a seeded
generator, so a seed replays the same sequence of faults.

Two rules keep a run inside what ftrun promises to survive: a group never
takes away more nodes than redundancy covers (distinct nodes), and a group
with a fault that restarts the job waits until the job runs again with a
version committed after the previous such fault (its redundancy back).
Redundancy covers `cluster.replicas` nodes of the whole job, or with an
erasure code `parity` nodes of each of its groups (counted per group: the
plan knows the groups the coordinator forms, Plan.loss_groups; run.py checks
them against the runner's status)."""
from .plan import AWAY_KINDS, KINDS, NODE_LOSS_KINDS, RESTART_KINDS, Fault

# The signals a random rank_kill draws from.
RANDOM_SIGNALS = ["SIGKILL", "SIGTERM", "SIGSEGV", "SIGABRT", "SIGBUS", "SIGINT"]
# What takes away one copy of some shard: a node, or (a bit flipped in a
# chunk that the restart then drops) one chunk of a node's copy.
COPY_LOSS_KINDS = NODE_LOSS_KINDS | AWAY_KINDS | {"bitflip_shm"}


class Group:
    def __init__(self, faults, at_step=None, at_time=None):
        self.faults, self.at_step, self.at_time = faults, at_step, at_time

    @property
    def restarts(self):
        return any(f.kind in RESTART_KINDS for f in self.faults)


def planned_groups(plan):
    """The plan's listed faults, grouped by their step or time, in firing order."""
    by = {}
    for f in plan.faults:
        key = ("step", f.at_step) if f.at_step is not None else ("time", f.at_time)
        by.setdefault(key, []).append(f)
    groups = [Group(fs, at_step=k[1]) if k[0] == "step" else Group(fs, at_time=k[1]) for k, fs in by.items()]
    return groups


def random_groups(plan, rng):
    """Yields groups of random faults until `count` faults were yielded. Each group's at_time is the gap after
    the previous group was injected (relative, in seconds)."""
    r = plan.random
    kinds = sorted(r["kinds"])
    weights = [r["kinds"][k] for k in kinds]
    left = r["count"]
    first = True
    # Copies lost at once are counted per set of nodes that redundancy covers separately: one set with
    # replicas (the same draws as before erasure codes came), an erasure code's groups otherwise.
    loss_groups, covered = plan.loss_groups(), plan.losses_covered()
    group_of = {n: i for i, g in enumerate(loss_groups) for n in g}
    while left > 0:
        n = min(left, rng.randint(1, r["max_at_once"]))
        faults, lost, nodes_used = [], [0] * len(loss_groups), set()
        for _ in range(n):
            for _attempt in range(20):
                kind = rng.choices(kinds, weights)[0]
                if kind == "coordinator_kill" and faults:
                    continue  # alone: the runner is away while it happens
                if any(f.kind == "coordinator_kill" for f in faults):
                    continue
                if kind in COPY_LOSS_KINDS and all(k >= covered for k in lost):
                    continue
                break
            else:
                continue
            full = {x for x in range(plan.nodes) if lost[group_of[x]] >= covered} if kind in COPY_LOSS_KINDS \
                else set()
            f = _random_fault(plan, kind, rng, nodes_used, full)
            if f is None:
                continue
            if kind in COPY_LOSS_KINDS:
                lost[group_of[f.node]] += 1
            faults.append(f)
        if not faults:
            continue
        left -= len(faults)
        gap = r["start"] if first else rng.uniform(*r["gap"])
        first = False
        yield Group(faults, at_time=gap)


def _random_fault(plan, kind, rng, nodes_used, full=()):
    """One fault of `kind`; a node fault takes a node neither in nodes_used (it adds it there) nor in `full`
    (of a group whose losses redundancy covers no more), None when no node is left."""
    params = dict(KINDS[kind][0])
    params.update(plan.random["params"].get(kind, {}))
    if "signal" in params and kind == "rank_kill" and "signal" not in plan.random["params"].get(kind, {}):
        params["signal"] = rng.choice(RANDOM_SIGNALS)
    if kind == "packet_loss":
        params["percent"] = float(params.get("percent", rng.choice([5.0, 20.0, 50.0])))
    node = rank = None
    if kind in {"rank_kill", "rank_hang"}:
        rank = rng.randrange(plan.nodes * plan.ranks_per_node)
    elif kind in {"agent_kill", "node_kill", "link_down", "partition", "packet_loss", "delay", "bitflip_shm"}:
        free = [n for n in range(plan.nodes) if n not in nodes_used and n not in full]
        if not free:
            return None
        node = rng.choice(free)
        nodes_used.add(node)
    duration = rng.uniform(*plan.random["duration"]) if KINDS[kind][1] else None
    return Fault(kind, params, duration=duration, node=node, rank=rank, origin="random")
