"""The fault kinds a chaos plan names, what each takes, and Fault, one
planned fault. Read by the plan parser, the schedules, the verdict and the
reports (configs/chaos/README.md describes the kinds)."""

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
# Faults that take a node (or its agent) away: at most `replicas` at once (with an erasure code, at most
# `parity` nodes of each group).
NODE_LOSS_KINDS = {"agent_kill", "node_kill", "link_down", "partition"}
# Faults during which a node may be cut off (lost heartbeats): no other fault that restarts the job
# starts while one of these lasts, and a random group counts them against `replicas` (or `parity`).
AWAY_KINDS = {"link_down", "partition", "packet_loss", "delay"}
# Faults that make the job restart (the scheduler waits for the job to be up
# again before the next one of these, unless the plan says otherwise).
RESTART_KINDS = NODE_LOSS_KINDS | {"rank_kill", "rank_hang", "coordinator_kill", "bitflip_shm"}
TARGETED = {"rank": {"rank_kill", "rank_hang"},
            "node": {"agent_kill", "node_kill", "link_down", "partition", "packet_loss", "delay", "bitflip_shm"}}


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
