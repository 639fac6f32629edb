"""ftrun-chaos plans under an erasure code (cluster: {erasure: {data, parity}}):
the plan loads, bad ones are refused naming the file, the line and the field,
the job's config gets cluster.redundancy instead of replicas, the random
schedule never takes more than `parity` nodes of a group at once, and the
verdict counts losses per group; and the scheduler's wait for a new commit
after a job went back to the disk. No cluster is started."""
import os
import random
import subprocess
import sys

import pytest
import yaml

from ftrun_chaos import plan as planlib
from ftrun_chaos import verdict
from ftrun_chaos.job import Timeline
from ftrun_chaos.run import Runner, job_config
from ftrun_chaos.schedule import COPY_LOSS_KINDS, random_groups



JOB = "job:\n  synthetic: {steps: 100}\nfaults:\n  - {kind: node_kill, at_step: 2}\n"
RANDOM = ("job:\n  synthetic: {steps: 100}\n"
          "random: {count: 400, seed: 3, max_at_once: 4, kinds: {rank_kill: 1, node_kill: 1, agent_kill: 1, "
          "link_down: 1, partition: 1, packet_loss: 1, delay: 1, bitflip_shm: 1, coordinator_kill: 0.2}}\n")


def test_erasure_plan_loads(check, write, source_dir):
    """The shipped plan and a 2-group one load: the code, replicas 0 and the coordinator's groups."""
    pl = planlib.load(os.path.join(source_dir, "configs", "chaos", "erasure.yaml"))
    check(pl.erasure == {"data": 2, "parity": 1} and pl.replicas == 0, "erasure.yaml: %s, replicas %d" % (
        pl.erasure, pl.replicas))
    check(pl.loss_groups() == [[0, 1, 2]] and pl.losses_covered() == 1, "erasure.yaml: one group of 3, parity 1")
    kinds = {f.kind for f in pl.faults} | set(pl.random["kinds"])
    want = {"node_kill", "agent_kill", "rank_kill", "bitflip_shm", "partition", "link_down", "packet_loss"}
    check(want <= kinds, "erasure.yaml mixes %s (missing %s)" % (sorted(kinds), sorted(want - kinds)))
    two = planlib.load(write("two.yaml", "cluster:\n  nodes: 6\n  spares: 2\n  erasure: {data: 2, parity: 1}\n" + JOB))
    check(two.loss_groups() == [[0, 1, 2], [3, 4, 5]], "6 nodes 2+1: two groups, got %s" % two.loss_groups())
    check(two.redundancy() == "erasure 2+1", "in words: %s" % two.redundancy())
    # The coordinator's ring without racks: its nodes' keys sorted as strings (recovery/placement.cc).
    check(planlib.ring_groups(12, 3) == [[0, 1, 10], [11, 2, 3], [4, 5, 6], [7, 8, 9]],
          "12 nodes 2+1: %s" % planlib.ring_groups(12, 3))
    rep = planlib.load(write("rep.yaml", "cluster: {nodes: 4, replicas: 2}\n" + JOB))
    check(rep.erasure is None and rep.replicas == 2 and rep.loss_groups() == [[0, 1, 2, 3]] and
          rep.losses_covered() == 2, "a replica plan keeps replicas: %s" % rep.loss_groups())
    check(planlib.load(write("default.yaml", JOB)).replicas == 1, "no cluster section: replicas 1")


BAD = [
    ("replicas and erasure", "cluster:\n  nodes: 3\n  replicas: 1\n  erasure: {data: 2, parity: 1}\n",
     ":4:", "cluster.erasure", "give either 'replicas' or 'erasure', not both"),
    ("nodes not a multiple", "cluster:\n  nodes: 4\n  erasure: {data: 2, parity: 1}\n",
     ":3:", "cluster.erasure", "groups of 3, got 4 nodes (use 3 or 6, or another code)"),
    ("fewer nodes than a group", "cluster:\n  nodes: 3\n  erasure: {data: 4, parity: 2}\n",
     ":3:", "cluster.erasure", "groups of 6, got 3 nodes (use 6, or another code)"),
    ("data 0", "cluster:\n  nodes: 3\n  erasure: {data: 0, parity: 1}\n",
     ":3:", "cluster.erasure.data", "expected an integer in 1..32, got 0"),
    ("data 33", "cluster:\n  nodes: 34\n  erasure:\n    data: 33\n    parity: 1\n",
     ":4:", "cluster.erasure.data", "expected an integer in 1..32, got 33"),
    ("parity 9", "cluster:\n  nodes: 10\n  erasure:\n    data: 1\n    parity: 9\n",
     ":5:", "cluster.erasure.parity", "expected an integer in 1..8, got 9"),
    ("parity 0", "cluster:\n  nodes: 2\n  erasure: {data: 2, parity: 0}\n",
     ":3:", "cluster.erasure.parity", "expected an integer in 1..8, got 0"),
    ("parity not a number", "cluster:\n  nodes: 3\n  erasure: {data: 2, parity: one}\n",
     ":3:", "cluster.erasure.parity", "expected an integer in 1..8, got 'one'"),
    ("parity missing", "cluster:\n  nodes: 3\n  erasure: {data: 2}\n",
     ":3:", "cluster.erasure.parity", "missing (expected an integer in 1..8"),
    ("data missing", "cluster:\n  nodes: 3\n  erasure:\n    parity: 1\n",
     ":4:", "cluster.erasure.data", "missing (expected an integer in 1..32"),
    ("unknown key", "cluster:\n  nodes: 3\n  erasure: {data: 2, parity: 1, stripes: 4}\n",
     ":3:", "cluster.erasure.stripes", "unknown key (expected one of data, parity)"),
    ("not a mapping", "cluster:\n  nodes: 3\n  erasure: 2+1\n",
     ":3:", "cluster.erasure", "expected a mapping, got a string"),
]


@pytest.mark.parametrize("name, text, line, field, expected", BAD, ids=[b[0] for b in BAD])
def test_bad_erasure_refused(write, name, text, line, field, expected):
    """Each error names the plan file, the line, the field and what was expected."""
    path = write(name.replace(" ", "_") + ".yaml", text + JOB)
    with pytest.raises(planlib.PlanError) as e:
        planlib.load(path)
    msg = str(e.value)
    assert msg.startswith(path + line) and (field + ": ") in msg and expected in msg, msg


def test_bad_erasure_exits_2(check, write, source_dir):
    """ftrun-chaos refuses such a plan with exit 2 and the message on stderr."""
    path = write("both.yaml", BAD[0][1] + JOB)
    p = subprocess.run([sys.executable, os.path.join(source_dir, "integration", "chaos", "ftrun-chaos"),
                        "--plan", path], capture_output=True, text=True, timeout=60)
    check(p.returncode == 2 and path + ":4: cluster.erasure: give either" in p.stderr,
          "exit %d: %r" % (p.returncode, p.stderr))


def test_job_config_writes_the_code(check, write):
    """With erasure the job's config has cluster.redundancy and no replicas; a replica plan keeps replicas."""
    pl = planlib.load(write("e.yaml", "cluster:\n  nodes: 3\n  erasure: {data: 2, parity: 1}\n" + JOB))
    with open(job_config(pl, write.dir, write.dir + "/run", "", "job-e")) as f:
        cluster = yaml.safe_load(f)["cluster"]
    check(cluster.get("redundancy") == {"erasure": {"data": 2, "parity": 1}} and "replicas" not in cluster,
          "erasure: cluster %s" % cluster)
    check(cluster.get("heartbeat_interval") == "200ms", "the harness's other cluster keys stay: %s" % cluster)
    pl = planlib.load(write("r.yaml", "cluster: {nodes: 3, replicas: 2}\n" + JOB))
    with open(job_config(pl, write.dir, write.dir + "/run", "", "job-r")) as f:
        cluster = yaml.safe_load(f)["cluster"]
    check(cluster.get("replicas") == 2 and "redundancy" not in cluster, "replicas: cluster %s" % cluster)


@pytest.mark.parametrize("nodes, data, parity", [(3, 2, 1), (6, 2, 1), (6, 4, 2), (12, 2, 1)])
def test_random_schedule_keeps_within_parity(check, write, nodes, data, parity):
    """No random group takes more than `parity` nodes of one erasure group; losses in other groups still come
    together (with 2 groups or more), and a seed replays."""
    pl = planlib.load(write("r.yaml", "cluster:\n  nodes: %d\n  spares: 2\n  erasure: {data: %d, parity: %d}\n"
                            % (nodes, data, parity) + RANDOM))
    groups = pl.loss_groups()
    group_of = {n: i for i, g in enumerate(groups) for n in g}
    drawn = list(random_groups(pl, random.Random(5)))
    again = list(random_groups(pl, random.Random(5)))
    check([[(f.kind, f.node, f.rank) for f in g.faults] for g in drawn] ==
          [[(f.kind, f.node, f.rank) for f in g.faults] for g in again], "the same seed, the same faults")
    worst, most_nodes = 0, 0
    for g in drawn:
        per = {}
        for f in g.faults:
            if f.kind in COPY_LOSS_KINDS:
                per.setdefault(group_of[f.node], []).append(f.node)
        worst = max([worst] + [len(v) for v in per.values()])
        most_nodes = max(most_nodes, sum(len(v) for v in per.values()))
        check(all(len(set(v)) == len(v) for v in per.values()), "distinct nodes in a group: %s" % per)
    check(worst == parity, "at most (and up to) parity %d nodes of a group at once, got %d" % (parity, worst))
    if len(groups) > 1:
        check(most_nodes > parity, "losses in several groups at once (%d nodes)" % most_nodes)
    check(sum(len(g.faults) for g in drawn) == pl.random["count"], "exactly count faults")


def _timeline(events):
    """A Timeline fed with (t, 'commit', v) and (t, line) events."""
    tl = Timeline()
    for e in events:
        if e[1] == "commit":
            tl.note_committed(e[0], e[2])
        else:
            tl.feed(e[0], e[1])
    return tl


def _back_to_disk(*lost):
    """Version 50 committed, the given (agent, node) lost, the coordinator going back to version 25."""
    ev = [(1.0, "commit", 50)]
    ev += [(2.0 + i * 0.1, "[coordinator] agent %d (node %d) lost: endpoint error" % a) for i, a in enumerate(lost)]
    ev += [(3.0, "[coordinator] ranks 0,1 have no complete copy of committed version 50 on any live node "
                 "(cluster.redundancy erasure: data 2, parity 1 per group): going back to version 25"),
           (3.1, "[coordinator] epoch 4: started 6 nodes from version 25")]
    return _timeline(ev)


def test_nothing_lost_counts_per_group(check):
    """Going back to the disk is excused only after more than `parity` distinct nodes of one group were lost;
    the same losses spread over groups, or one node lost twice, are not."""
    code = {"parity": 1, "groups": [[0, 1, 2], [3, 4, 5]]}
    c = verdict.check_nothing_lost(_back_to_disk((1, 0), (2, 1)), 0, code)
    check(c["ok"] and "went back to disk" in c["detail"], "2 nodes of group 0: excused: %s" % c)
    c = verdict.check_nothing_lost(_back_to_disk((1, 0), (4, 3)), 0, code)
    check(not c["ok"] and "group 0: nodes [0]; group 1: nodes [3]" in c["detail"],
          "one node in each group: not excused: %s" % c)
    c = verdict.check_nothing_lost(_back_to_disk((1, 0), (6, 0)), 0, code)
    check(not c["ok"], "node 0 lost twice (its spare too) is one node of its group: %s" % c)
    c = verdict.check_nothing_lost(_back_to_disk((1, 0), (2, 1)), 0, {"parity": 2, "groups": [[0, 1, 2, 3, 4, 5]]})
    check(not c["ok"], "2 nodes lost, parity 2: not excused: %s" % c)
    # Replicas as before: distinct agents of the whole job.
    c = verdict.check_nothing_lost(_back_to_disk((1, 0), (4, 3)), 1)
    check(c["ok"] and "2 agents lost, replicas 1" in c["detail"], "replicas 1, two agents lost: excused: %s" % c)
    c = verdict.check_nothing_lost(_back_to_disk((1, 0)), 1)
    check(not c["ok"] and "1 agents lost since, replicas 1" in c["detail"], "replicas 1, one lost: %s" % c)


class _Job:
    """What Runner.ready reads of a running job."""

    def __init__(self, committed):
        self.status = {"phase": "running", "committed_version": committed}
        self.timeline = Timeline()

    def alive(self):
        return True


def test_ready_after_going_back(check, write):
    """The next restart fault waits for a version committed after the last one; a job that went back to an
    older version since (the persist directory's) counts from there, not from the version it lost."""
    pl = planlib.load(write("r.yaml", JOB))
    r = Runner(pl, "/nonexistent", write.dir, lambda m: None)
    r.job = _Job(2517)
    r.last_restart_version, r.last_restart_t = 2517, 10.0
    check(not r.ready(), "no commit since the fault: not ready")
    r.job.status["committed_version"] = 2518
    check(r.ready(), "a commit since the fault: ready")
    r.job.timeline.feed(11.0, "[coordinator] epoch 12: started 3 nodes from version 750")
    r.job.status["committed_version"] = 750
    check(not r.ready(), "gone back to 750, nothing committed since: not ready")
    r.job.status["committed_version"] = 751
    check(r.ready(), "gone back to 750, then 751 committed: ready (not only past 2517)")
    r.last_restart_version, r.last_restart_t = 751, 12.0
    check(not r.ready(), "an older epoch's going back does not count for the next fault")
