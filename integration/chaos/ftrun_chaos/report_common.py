"""What the parts of a chaos report share: the fields of a result, any of
which may be missing or None (_list, _dict, _num, ...), the facts derived
from them (verdict, fault counts, recovery statistics and phases), and
writing a report file whole or not at all."""

import math
import os
import tempfile
from collections import Counter

from .fault_kinds import KINDS as _PLAN_KINDS

KINDS = list(_PLAN_KINDS)  # the order of the tables and the colors: the plan's


# ---------------------------------------------------------------- helpers

def _list(value):
    """A list field, [] when missing or None."""
    return value if isinstance(value, list) else []


def _records(value):
    """The dict items of a list field (faults, recoveries, checks)."""
    return [v for v in _list(value) if isinstance(v, dict)]


def _dict(value):
    """A dict field, {} when missing or None."""
    return value if isinstance(value, dict) else {}


def _num(value):
    """value as a float, or None when it is not a finite number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _fmt(value, digits=1):
    """A number with fixed digits, '-' when unknown."""
    v = _num(value)
    return "-" if v is None else f"{v:.{digits}f}"


def _text(value):
    """Any value as text, '-' for None."""
    return "-" if value is None else str(value)


def _percentile(values, q):
    """Linear-interpolated percentile (q in 0..100) of a non-empty list."""
    data = sorted(values)
    pos = (len(data) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def _write_atomic(path, write):
    """Calls write(file object) on a temporary file, then renames it to path."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        mode = "wb" if path.endswith(".png") else "w"
        with os.fdopen(fd, mode, **({} if mode == "wb" else {"encoding": "utf-8"})) as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# ---------------------------------------------------------------- derived facts

def _verdict(result):
    """'PASS', 'FAIL' or 'UNKNOWN'."""
    v = result.get("verdict")
    return str(v).upper() if v else "UNKNOWN"


def _failed_checks(result):
    """The checks whose ok is not true."""
    return [c for c in _records(result.get("checks")) if not c.get("ok")]


def _by_kind(result):
    """{kind: count of injected faults}, ordered like KINDS then by name."""
    counts = _dict(_dict(result.get("summary")).get("by_kind"))
    if not counts:
        counts = Counter(f.get("kind") or "?" for f in _records(result.get("faults")))
    order = {k: i for i, k in enumerate(KINDS)}
    return dict(sorted(counts.items(), key=lambda kv: (order.get(kv[0], len(KINDS)), str(kv[0]))))


def _fault_counts(result):
    """(injected, planned); planned may be None."""
    summary = _dict(result.get("summary"))
    injected = summary.get("faults_injected")
    if injected is None:
        injected = len(_records(result.get("faults")))
    return injected, summary.get("faults_planned")


def _recovery_stats(result):
    """(count, {"median", "p95", "max"} in seconds, values None when unknown)."""
    summary = _dict(result.get("summary"))
    recoveries = _records(result.get("recoveries"))
    totals = [t / 1000.0 for t in (_num(r.get("total_ms")) for r in recoveries) if t is not None]
    computed = {"median": None, "p95": None, "max": None}
    if totals:
        computed = {"median": _percentile(totals, 50), "p95": _percentile(totals, 95),
                    "max": max(totals)}
    given = _dict(summary.get("recovery_s"))
    stats = {k: (_num(given.get(k)) if _num(given.get(k)) is not None else computed[k])
             for k in computed}
    count = summary.get("recoveries")
    return (len(recoveries) if count is None else count), stats


def _phases(recoveries):
    """Breakdown phase names in the order the dicts give them."""
    phases = []
    for r in recoveries:
        for name in _dict(r.get("breakdown_ms")):
            if name not in phases:
                phases.append(name)
    return phases


def _phase_means(recoveries):
    """{phase: mean ms over the recoveries that report it}."""
    means = {}
    for phase in _phases(recoveries):
        values = [v for v in (_num(_dict(r.get("breakdown_ms")).get(phase)) for r in recoveries)
                  if v is not None]
        means[phase] = sum(values) / len(values) if values else None
    return means


def _recovery_of(fault, recoveries):
    """The recovery a fault led to, or None."""
    index = fault.get("recovery")
    if isinstance(index, int) and not isinstance(index, bool) and 0 <= index < len(recoveries):
        return recoveries[index] if isinstance(recoveries[index], dict) else None
    return None
