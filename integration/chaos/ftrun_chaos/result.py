"""A chaos run's result: each check of what the run saw (verdict.py) and the
dict the report is made of (report.py)."""
import json
import os

from . import verdict as V
from .job import now


def _agent_recoveries(job):
    out = []
    st = job.status or {}
    base = os.path.dirname(job.status_path)
    for a in st.get("agents", []):
        try:
            with open(os.path.join(base, "agent%d.json" % a["agent"])) as f:
                out.extend(json.load(f).get("recoveries", []))
        except (OSError, ValueError):
            pass
    return out


def run_result(plan, r, golden, code, nodes, job_id, nranks, duration, ftrun, command):
    """The result dict the report is made of: the checks (verdict.py) of what run `r` (a run.Runner) saw."""
    job, tl = r.job, r.job.timeline
    t0 = job.started
    faults = r.records
    recs = V.tie_recoveries(faults, tl, (job.status or {}).get("recoveries"), _agent_recoveries(job), nranks, t0)
    if nodes.persist_dir or any(f.get("corrupt") for f in faults):
        V.detect_corruptions(faults, tl, nodes.persist_dir, job_id, plan.nodes, ftrun)
    planned = len(plan.faults) + (plan.random["count"] if plan.random else 0)
    if duration is not None:  # as many as fitted in the time
        planned = len(faults) + len(r.not_injected)
    checks = [
        V.check("the job completed", code == 0, r.stuck or "runner exit %s" % code),
        V.check("the final state equals the failure-free run's", tl.digests == golden and len(golden) == nranks,
                "%d of %d ranks' digests equal" % (sum(1 for k, d in golden.items() if tl.digests.get(k) == d),
                                                   len(golden))),
        # A fault the schedule could not place (the job finished first) is
        # reported next to the checks, not failed: the verdict is about what
        # the job survived. A plan none of whose faults ran proves nothing.
        V.check("the plan's faults were injected", faults or not planned,
                "%d of %d%s" % (len(faults), planned,
                                "; not injected: " + "; ".join(r.not_injected[:5]) if r.not_injected else "")),
        V.check_restores(tl, nranks),
        V.check_nothing_lost(tl, plan.replicas, _erasure_groups(plan, job)),
    ]
    if plan.erasure:
        checks.append(_check_groups(plan, job))
    corrupt = [f for f in faults if f.get("corrupt")]
    if corrupt:
        missed = [f for f in corrupt if not f["detected"]]
        checks.append(V.check("every corrupted chunk was detected", not missed,
                              "; ".join("fault %d: %s" % (f["id"], f["note"]) for f in missed[:5]) or
                              "%d of %d" % (len(corrupt), len(corrupt))))
    for f in faults:
        for k in [k for k in f if k.startswith("_")] + ["namespaces"]:
            f.pop(k, None)
    ok = all(c["ok"] for c in checks)
    steps = [[round(t - t0, 3), s] for t, s in tl.steps]
    return {
        "version": 1, "plan": plan.path, "name": plan.name, "seed": plan.seed, "verdict": "pass" if ok else "fail",
        "checks": checks,
        "cluster": {"backend": plan.backend, "nodes": plan.nodes, "spares": plan.spares,
                    "ranks_per_node": plan.ranks_per_node, "replicas": plan.replicas, "persist_dir": nodes.persist_dir,
                    **({"erasure": "%d+%d in groups %s" % (plan.erasure["data"], plan.erasure["parity"],
                                                           plan.loss_groups())} if plan.erasure else {})},
        "job": {"id": job_id, "command": command,
                "exit_code": code, "steps": plan.synthetic["steps"] if plan.synthetic else None,
                "duration_s": round(now() - t0, 3)},
        "faults": faults, "recoveries": recs, "steps": steps,
        "committed": [[round(t - t0, 3), v] for t, v in tl.committed],
        "summary": V.summarize(faults, recs, planned),
        "not_injected": list(r.not_injected),
    }


def _status_groups(job):
    """The erasure groups (lists of nodes) the runner's status shows, or None."""
    groups = ((job.status or {}).get("erasure") or {}).get("groups")
    return [list(g.get("nodes", [])) for g in groups] if groups else None


def _erasure_groups(plan, job):
    """For check_nothing_lost: with an erasure code, {"parity", "groups"}, the groups as the runner's status
    shows them (the plan's own reckoning when the status has none); None with replicas."""
    if not plan.erasure:
        return None
    return {"parity": plan.erasure["parity"], "groups": _status_groups(job) or plan.loss_groups()}


def _check_groups(plan, job):
    """The random schedule kept each group's losses within the parity by the groups the plan reckons
    (plan.ring_groups): the runner's status must show the same ones."""
    shown, want = _status_groups(job), plan.loss_groups()
    same = shown is not None and sorted(map(sorted, shown)) == sorted(map(sorted, want))
    return V.check("the erasure groups are the ones the schedule kept losses within", same,
                   "groups %s%s" % (want, "" if same else ", the runner's status shows %s" % shown))
