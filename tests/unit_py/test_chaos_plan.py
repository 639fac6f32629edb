"""ftrun-chaos plans: good ones load (every plan in configs/chaos/), bad ones
are refused with exit 2 and a message naming the file, the line, the field
and what was expected; the random schedule replays from its seed and keeps
inside the redundancy. No cluster is started."""
import os
import random
import subprocess
import sys

from ftrun_chaos import plan as planlib
from ftrun_chaos.run import scaled
from ftrun_chaos.schedule import COPY_LOSS_KINDS, planned_groups, random_groups



def shipped_plans(source_dir):
    return sorted(os.path.join(source_dir, "configs", "chaos", f)
                  for f in os.listdir(os.path.join(source_dir, "configs", "chaos")) if f.endswith(".yaml"))


def cli(source_dir):
    return os.path.join(source_dir, "integration", "chaos", "ftrun-chaos")


def test_shipped_plans_load(check, source_dir):
    """Every plan in configs/chaos/ loads, and every fault kind has one."""
    plans = shipped_plans(source_dir)
    check(len(plans) >= 13, "a plan per fault kind plus mixed and soak: %s" % plans)
    kinds_covered = set()
    for p in plans:
        try:
            pl = planlib.load(p)
            kinds_covered |= {f.kind for f in pl.faults} | set((pl.random or {}).get("kinds", {}))
        except planlib.PlanError as e:
            check(False, "%s does not load: %s" % (p, e))
    check(kinds_covered == set(planlib.KINDS),
          "every fault kind has a plan: missing %s" % (set(planlib.KINDS) - kinds_covered))


GOOD_JOB = "job:\n  synthetic: {steps: 100}\n"
BAD = [
    ("unknown kind", GOOD_JOB + "faults:\n  - {kind: rank_kil, at_step: 5}\n", ":4:", "faults[0].kind", "one of"),
    ("no when", GOOD_JOB + "faults:\n  - {kind: rank_kill}\n", ":4:", "at_step", "exactly one of"),
    ("both whens", GOOD_JOB + "faults:\n  - {kind: rank_kill, at_step: 3, at_time: 2s}\n", ":4:", "at_step",
     "exactly one of"),
    ("bad duration", GOOD_JOB + "faults:\n  - {kind: link_down, at_time: 2s, duration: 3 parsecs}\n", ":4:",
     "faults[0].duration", "duration like"),
    ("duration on an instant fault", GOOD_JOB + "faults:\n  - {kind: rank_kill, at_step: 2, duration: 1s}\n",
     ":4:", "faults[0].duration", "takes no duration"),
    ("bad signal", GOOD_JOB + "faults:\n  - {kind: rank_kill, at_step: 2, signal: SIGFOO}\n", ":4:",
     "faults[0].signal", "signal name"),
    ("step past the end", GOOD_JOB + "faults:\n  - {kind: rank_kill, at_step: 100}\n", ":", "faults",
     "only 100 steps"),
    ("rank out of range", GOOD_JOB + "faults:\n  - {kind: rank_kill, at_step: 2, target: {rank: 8}}\n", ":4:",
     "target.rank", "0..7"),
    ("unknown key", GOOD_JOB + "faults:\n  - {kind: rank_kill, at_step: 2, sigal: 9}\n", ":4:", "faults[0].sigal",
     "unknown key"),
    ("disk fault without persist", GOOD_JOB + "faults:\n  - {kind: disk_full, at_step: 2}\n", ":", "persist",
     "need a persist directory"),
    ("no faults", GOOD_JOB, ":1:", "faults", "names no fault"),
    ("not YAML", "faults: [\n", ":", "not valid YAML", ""),
    ("replicas too high",
     "cluster: {nodes: 3, replicas: 3}\n" + GOOD_JOB + "faults:\n  - {kind: node_kill, at_step: 2}\n",
     ":1:", "cluster.replicas", "1..2"),
    ("random weight", GOOD_JOB + "random: {count: 5, kinds: {rank_kill: -1}}\n", ":3:", "random.kinds.rank_kill",
     "weight > 0"),
    ("repeat without every", GOOD_JOB + "faults:\n  - {kind: rank_kill, at_step: 2, repeat: 3}\n", ":4:",
     "faults[0].every", "needs 'every'"),
    ("bad ftrun config", "job:\n  synthetic: {steps: 100}\n  config: \"job: [\"\n" +
     "faults:\n  - {kind: rank_kill, at_step: 2}\n", ":3:", "job.config", "not valid YAML"),
]


def test_bad_plans_refused(check, write, source_dir):
    """Bad plans exit 2 with a message naming the file, the line, the field and what was expected."""
    chaos_cli = cli(source_dir)
    plans = shipped_plans(source_dir)
    for name, text, line, field, expected in BAD:
        path = write(name.replace(" ", "_") + ".yaml", text)
        p = subprocess.run([sys.executable, chaos_cli, "--plan", path], capture_output=True, text=True, timeout=60)
        msg = p.stderr.strip()
        check(p.returncode == 2, "%s: exit %d (want 2): %s" % (name, p.returncode, msg))
        check(path + line in msg and field in msg and expected in msg,
              "%s: the message names %s%s, '%s' and '%s': %r" % (name, path, line, field, expected, msg))
    p = subprocess.run([sys.executable, chaos_cli, "--plan", os.path.join(write.dir, "missing.yaml")],
                       capture_output=True, text=True)
    check(p.returncode == 2 and "missing.yaml: cannot read the plan" in p.stderr, "a missing plan: %r" % p.stderr)
    p = subprocess.run([sys.executable, chaos_cli, "--plan", plans[0], "--duration", "soon"], capture_output=True,
                       text=True)
    check(p.returncode == 2 and "--duration" in p.stderr, "a bad --duration: %r" % p.stderr)


def test_schedules(check, write, source_dir):
    """Repeats expand, faults at the same step fire together, the random schedule replays from its seed and
    keeps inside the redundancy, and --faults scales the job's steps."""
    pl = planlib.load(write("rep.yaml", "job:\n  synthetic: {steps: 1000}\nfaults:\n"
                                   "  - {kind: rank_kill, at_step: 10, repeat: 3, every: 100}\n"
                                   "  - {kind: node_kill, at_step: 210}\n  - {kind: agent_kill, at_step: 210}\n"))
    check([f.at_step for f in pl.faults] == [10, 110, 210, 210, 210], "repeat/every: %s" % pl.faults)
    check(sorted(len(g.faults) for g in planned_groups(pl)) == [1, 1, 3], "faults at the same step fire together")
    soak = planlib.load(os.path.join(source_dir, "configs", "chaos", "soak.yaml"))

    def draw(seed):
        return [[(f.kind, f.node, f.rank, f.params.get("signal")) for f in g.faults]
                for g in random_groups(soak, random.Random(seed))]

    a, b, c = draw(7), draw(7), draw(8)
    check(a == b and a != c, "the same seed gives the same faults, another seed others")
    check(sum(len(g) for g in a) == soak.random["count"], "random: exactly count faults")
    lost = [sum(1 for k, *_ in g if k in COPY_LOSS_KINDS) for g in a]
    check(max(lost) <= soak.replicas, "random: never more copies lost at once than replicas cover (%s)" % max(lost))
    check(all(len(g) == 1 for g in a if any(k == "coordinator_kill" for k, *_ in g)), "a coordinator kill comes alone")
    big = planlib.load(os.path.join(source_dir, "configs", "chaos", "soak.yaml"))
    long = scaled(big, faults=1000)
    check(long.random["count"] == 1000 and long.synthetic["steps"] >= 5 * big.synthetic["steps"],
          "--faults 1000 scales the job's steps with the faults")
