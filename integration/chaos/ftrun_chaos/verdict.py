"""Did the run survive with nothing lost? Each check reads what the harness
saw from outside (the output of every rank and of the coordinator, the
status files, the persist directory), never what ftrun says of itself alone:

- the job completed (the runner exited 0),
- the final state is bit-identical to the failure-free golden run,
- the plan's faults were injected (at least one; those the schedule could
  not place because the job finished first are listed apart, not failed),
- every restore loaded the version the coordinator announced for that
  epoch, the same on every rank,
- no committed version was lost: no epoch restored a version older than
  the newest one the status file had shown as committed before it,
- every corrupted chunk was detected (a WARN naming it, or a check of every
  complete version on disk at the end with `ftrun export`), or was gone
  (its file removed by retention) before anything read it.

It also ties each fault to the recovery it caused and measures that
recovery from the fault to the first step of every rank after it."""
import os
import re
import statistics
import subprocess
import tempfile

from .persist_files import complete_versions, manifest_chunks
from .plan import NODE_LOSS_KINDS, RESTART_KINDS

PHASES = [("stop_ms", "stop"), ("respawn_ms", "respawn"), ("connect_ms", "connect"),
          ("restore_ms", "restore"), ("first_step_ms", "first step")]


def check(name, ok, detail):
    return {"name": name, "ok": bool(ok), "detail": detail}


def check_restores(tl, nranks):
    """Every rank's restore loads the version the coordinator started its epoch from (the trainer says which
    epoch: $TORCHELASTIC_RESTART_COUNT), so all ranks of an epoch load the same one; and that version was
    committed: the status file (written at least every 200 ms) showed it, or a newer one, by then."""
    bad = []
    for t, rank, v, announced, epoch in tl.restores:
        want = tl.epoch_versions.get(epoch) if epoch is not None else announced
        if want is None:
            bad.append("rank %d restored version %d in epoch %s, which the coordinator never started" % (rank, v, epoch))
        elif v != want:
            bad.append("rank %d restored version %d in epoch %s, started from version %d" % (rank, v, epoch, want))
    for t, v, line in tl.announcements:
        seen = tl.committed_at(t + 0.5)
        if seen is None or v > seen:
            bad.append("an epoch started from version %d, newer than any version shown committed (%s)" % (v, seen))
    detail = "%d epochs from a version, %d rank restores" % (len(tl.announcements), len(tl.restores))
    return check("every restore used the committed version the coordinator started from, the same on every rank",
                 not bad, "; ".join(bad[:5]) or detail)


def check_nothing_lost(tl, replicas, erasure=None):
    """An epoch may start from an older version than one already committed only where ftrun said no live
    node had a complete copy, after more nodes were lost than redundancy covers (counted from the
    coordinator's own "agent A (node N) lost" lines since the newest commit the harness saw before it):
    with replicas, more agents than cluster.replicas; with an erasure code (erasure: {"parity": P,
    "groups": [[node, ...], ...]}), more than P distinct nodes of one group (a node lost again, in the
    spare that took its place, before a commit, is the same node of its group)."""
    lost, excused = [], []
    group_of = {n: i for i, g in enumerate((erasure or {}).get("groups") or []) for n in g}
    for t, v, line in tl.announcements:
        seen = tl.committed_at(t)
        if seen is None or v >= seen:
            continue
        since = tl.committed_since(seen)
        lines = [l for tt, l in tl.log_lines_between(since, t)]
        said = any("have no complete copy" in l for l in lines)
        losses = {m for l in lines for m in re.findall(r"agent (\d+) \(node (\d+)\) lost", l)}
        what = "epoch from version %d after version %d was committed" % (v, seen)
        if erasure:
            per_group = {}
            for _, node in losses:
                per_group.setdefault(group_of.get(int(node), -1), set()).add(int(node))
            most = max((len(n) for n in per_group.values()), default=0)
            counted = "at most %d nodes lost in one group (%s), parity %d" % (
                most, "; ".join("group %d: nodes %s" % (g, sorted(n)) for g, n in sorted(per_group.items())) or
                "none", erasure["parity"])
            beyond, excuse = most > erasure["parity"], counted
        else:
            agents = {a for a, _ in losses}
            counted = "%d agents lost since, replicas %d" % (len(agents), replicas)
            beyond, excuse = len(agents) > replicas, "%d agents lost, replicas %d" % (len(agents), replicas)
        if said and beyond:
            excused.append("%s: %s" % (what, excuse))
        else:
            lost.append("%s (%s)" % (what, counted))
    detail = "; ".join(lost[:3]) or "%d epochs, none from a version older than the newest committed one" % len(
        tl.announcements)
    if excused and not lost:
        detail += "; %d went back to disk after more losses than redundancy covers (%s)" % (len(excused), excused[0])
    return check("no committed version was lost while redundancy covered it", not lost, detail)


def detect_corruptions(faults, tl, persist_dir, job_id, nodes, runner_path):
    """Sets fault['detected'] and ['note'] for every bit flip."""
    exported = None
    for f in faults:
        c = f.get("corrupt")
        if not c:
            continue
        lines = tl.lines_after(f["_t"])
        if c["where"] == "shm":
            # Chunks are shared by content: the agent may name another (rank, tensor) that uses the same
            # bytes, so its hash counts as well as the name.
            name = "rank %d tensor '%s' chunk #%d" % (c["rank"], c["tensor"], c["chunk"])
            where = "store offset %d," % c["store_offset"] if "store_offset" in c else name
            hits = [l for l in lines if "corrupted in" in l and (name in l or where in l or
                                                                   (c.get("hash") and c["hash"] in l))]
            if hits:
                f["detected"], f["note"] = True, "detected: " + hits[0].split("] ", 1)[-1].strip()[:240]
            elif not c.get("read"):
                f["detected"], f["note"] = True, "not read: no restart was made to load it (read: none)"
            elif _restart_version(tl, f["_t"]) not in (None, c["version"]):
                f["detected"], f["note"] = True, "not read: the restart loaded version %d, not the flipped " \
                    "chunk's %d (a commit landed after the choice)" % (_restart_version(tl, f["_t"]), c["version"])
            else:
                f["detected"], f["note"] = False, "the restart loaded its version, and nothing names %s" % name
            continue
        name = os.path.basename(c["file"])
        hits = [l for l in lines if name in l]
        if hits:
            f["detected"], f["note"] = True, "detected: " + hits[0].split("] ", 1)[-1].strip()[:300]
        elif _replaced(c):
            f["detected"], f["note"] = True, "not read before retention removed the file (written again since)"
        else:
            if exported is None:
                exported = export_all(persist_dir, job_id, nodes, runner_path)
            ref = [v for v, names in exported["refs"].items() if name in names]
            if not ref:
                f["detected"], f["note"] = True, "no complete version references the file any more"
            else:
                # Export stops at the first bad chunk: a version it refuses as corrupted on disk counts.
                found = [v for v in ref if "corrupted on disk" in exported["errors"].get(v, "")]
                f["detected"] = len(found) == len(ref)
                f["note"] = ("`ftrun export` refuses %s at the end (corrupted on disk)" % ", ".join(found)) \
                    if f["detected"] else "still referenced by %s and `ftrun export` reads it back" % ", ".join(ref)


def _restart_version(tl, t):
    """The version of the first epoch the coordinator started after time t."""
    return next((v for tt, v, _ in tl.announcements if tt >= t), None)


def _replaced(c):
    """The flipped file is gone, or another file (a later write of the same chunk) has its name."""
    try:
        st = os.stat(c["file"])
    except FileNotFoundError:
        return True
    return st.st_ino != c.get("inode")


def export_all(persist_dir, job_id, nodes, runner_path):
    """`ftrun export` of every complete version on disk (it checks every chunk's hash)."""
    refs, errors = {}, {}
    for d in complete_versions(persist_dir, job_id, nodes):
        v = os.path.basename(d)
        names = set()
        for m in os.listdir(d):
            if m.endswith(".manifest"):
                names.update(manifest_chunks(os.path.join(d, m)))
        refs[v] = names
        out = tempfile.mkdtemp(prefix="ftrun-chaos-export-")
        p = subprocess.run([runner_path, "export", "--persist-dir", persist_dir, "--job", job_id, "--out",
                            os.path.join(out, "x"), "--version", str(int(v[1:]))], capture_output=True, text=True)
        if p.returncode != 0:
            errors[v] = p.stdout + p.stderr
        subprocess.run(["rm", "-rf", out])
    return {"refs": refs, "errors": errors}


def tie_recoveries(faults, tl, coord_recoveries, agent_recoveries, nranks, t0):
    """Builds the recovery list and sets each restart fault's 'recovery' index. A recovery ends at the first
    step of every rank after an epoch's restore; an epoch replaced by the next before that (a second failure
    during the recovery) is part of the same recovery. Times in seconds since t0."""
    recs, pending, epochs = [], [], tl.announcements
    for i, (ta, v, line) in enumerate(epochs):
        pending += [f for f in faults if f.get("recovery") is None and f not in pending and _caused(f, ta, t0)]
        if not pending and not tl.reasons.get(_epoch_of(line)):
            continue  # the job's first start
        t_next = epochs[i + 1][0] if i + 1 < len(epochs) else float("inf")
        epoch = _epoch_of(line)
        firsts = {}
        for rank, lst in tl.first_steps.items():
            for t_restore, t_step, e in lst:
                mine = e == epoch if e is not None else ta <= t_restore < t_next
                if mine and t_step is not None:
                    firsts.setdefault(rank, t_step)
        done = max(firsts.values()) if len(firsts) == nranks else None
        if done is None and i + 1 < len(epochs):
            continue  # replaced by the next epoch before every rank stepped
        t_fault = min(f["_t"] for f in pending) if pending else ta  # none: a restart no fault explains
        coord = _coord_recovery(coord_recoveries, t_fault, ta)
        detected = coord / 1e9 if coord else ta
        breakdown = {"detect": max(0.0, (detected - t_fault) * 1000)}
        # The agents' own records of this epoch: they stop their ranks around the coordinator's decision.
        agent = _slowest_agent(agent_recoveries, t_fault - 0.5, ta + 0.2)
        if agent:
            for key, name in PHASES:
                breakdown[name] = float(agent.get(key) or 0)
        recs.append({"epoch": epoch, "reason": tl.reasons.get(epoch, "")[:300], "detected_s": detected - t0,
                     "first_step_s": (done - t0) if done else None,
                     "total_ms": (done - t_fault) * 1000 if done else None, "restored_version": v,
                     "breakdown_ms": breakdown, "faults": [f["id"] for f in pending]})
        for f in pending:
            f["recovery"] = len(recs) - 1
        pending = []
    return recs


def _epoch_of(line):
    m = re.search(r"epoch (\d+): started", line)
    return int(m.group(1)) if m else None


def _caused(f, ta, t0):
    """Whether fault f may have caused the epoch begun at ta: a fault that restarts the job, before it, and not
    long before: 30 s for one that happens at once, 3 s after the end of one that lasts (a link back up)."""
    if f["kind"] not in RESTART_KINDS | NODE_LOSS_KINDS or f["_t"] > ta:
        return False
    end = t0 + f["ended_s"] if f.get("ended_s") is not None else f["_t"]
    return ta <= end + (3.0 if f.get("ended_s") is not None else 30.0)


def _coord_recovery(coord_recoveries, t_fault, ta):
    best = None
    for r in coord_recoveries or []:
        d = r.get("detected_mono_ns")
        if d and t_fault - 0.5 <= d / 1e9 <= ta + 0.5:
            best = d if best is None else min(best, d)
    return best


def _slowest_agent(agent_recoveries, lo, hi):
    best = None
    for r in agent_recoveries:
        d, fs = r.get("detected_mono_ns"), r.get("first_step_mono_ns")
        if d and fs and lo <= d / 1e9 < hi and (best is None or fs > best["first_step_mono_ns"]):
            best = r
    return best


def summarize(faults, recs, planned):
    by = {}
    for f in faults:
        by[f["kind"]] = by.get(f["kind"], 0) + 1
    totals = sorted(r["total_ms"] / 1000 for r in recs if r.get("total_ms") is not None)
    rs = None
    if totals:
        rs = {"median": statistics.median(totals), "p95": totals[min(len(totals) - 1, int(0.95 * len(totals)))],
              "max": totals[-1]}
    return {"faults_planned": planned, "faults_injected": len(faults), "by_kind": by, "recoveries": len(recs),
            "recovery_s": rs}
