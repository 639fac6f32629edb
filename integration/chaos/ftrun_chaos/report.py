"""Reports of one ftrun-chaos run.

``write_reports(result, out_dir)`` writes three files into ``out_dir``:

* ``report.json``  -- the harness's ``result`` dict as is (for machines, and to
  redraw the other two later).
* ``report.md``    -- for people: verdict, the checks (failed ones first under
  "Why it failed"), a summary of the faults and the recoveries, then a table
  of every fault and of every recovery with its timing breakdown.
* ``timeline.png`` -- two panels sharing the time axis (seconds since job
  start): on top the training step and the committed version over time, every
  fault as a vertical marker colored by kind (spans for faults that last) and
  the recovery intervals shaded; below, one stacked bar per recovery split by
  breakdown phase.

``format_summary(result)`` gives the few lines the harness prints at the end.

Every field of ``result`` may be missing or None; the reports say "-" then.
"""

import json
import math
import os
import tempfile
from collections import Counter

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after matplotlib.use)
from matplotlib.collections import PolyCollection  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

KINDS = ["rank_kill", "rank_hang", "agent_kill", "node_kill", "coordinator_kill",
         "link_down", "partition", "packet_loss", "delay", "disk_full",
         "disk_error", "bitflip_shm", "bitflip_disk"]
REASON_CHARS = 80


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


def _cell(value):
    """Text safe inside a Markdown table cell."""
    text = _text(value).replace("\r", " ").replace("\n", " ")
    return text.replace("\\", "\\\\").replace("|", "\\|")


def _truncate(text, limit):
    """text cut to limit characters, ending with an ellipsis when cut."""
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _row(cells):
    """One Markdown table row."""
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def _table(header, rows):
    """A Markdown table as lines."""
    lines = [_row(header), "|" + "---|" * len(header)]
    lines += [_row(r) for r in rows]
    return lines


def _code(text):
    """An inline code span that survives backticks in text."""
    fence = "``" if "`" in text else "`"
    return f"{fence} {text} {fence}" if fence == "``" else f"`{text}`"


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


# ---------------------------------------------------------------- Markdown

def _md_title(result):
    """Title line and the run description."""
    cluster, job = _dict(result.get("cluster")), _dict(result.get("job"))
    plan = result.get("plan")
    lines = [f"# ftrun-chaos: {_verdict(result)} — plan {_code(str(plan)) if plan else '-'}, "
             f"seed {_text(result.get('seed'))}", ""]
    if cluster:
        lines.append("- cluster: " + ", ".join(f"{k} {_text(v)}" for k, v in cluster.items()))
    if job:
        command = job.get("command")
        if isinstance(command, list):
            lines.append("- command: " + _code(" ".join(str(a) for a in command)))
        lines.append(f"- job: exit code {_text(job.get('exit_code'))}, "
                     f"{_text(job.get('steps'))} steps, {_fmt(job.get('duration_s'))} s")
    return lines + ([""] if cluster or job else [])


def _md_why(result):
    """The failed checks, for a run that did not pass."""
    failed = _failed_checks(result)
    if _verdict(result) == "PASS" or not failed:
        return []
    lines = ["## Why it failed", ""]
    lines += [f"- **{_cell(c.get('name'))}**: {_cell(c.get('detail'))}" for c in failed]
    return lines + [""]


def _md_checks(result):
    """The table of checks."""
    rows = []
    for c in _records(result.get("checks")):
        ok = c.get("ok")
        rows.append([c.get("name"), "✓" if ok else ("?" if ok is None else "✗"), c.get("detail")])
    if not rows:
        return ["## Checks", "", "No checks.", ""]
    return ["## Checks", ""] + _table(["check", "ok", "detail"], rows) + [""]


def _md_fault_summary(result):
    """Faults by kind, injected of planned."""
    injected, planned = _fault_counts(result)
    lines = ["## Faults", "", f"{_text(injected)} injected of {_text(planned)} planned.", ""]
    by_kind = _by_kind(result)
    if by_kind:
        lines += _table(["kind", "count"], list(by_kind.items())) + [""]
    return lines


def _md_recovery_summary(result):
    """Recovery count, total-time statistics and the mean breakdown."""
    count, stats = _recovery_stats(result)
    lines = ["## Recoveries", "",
             f"{_text(count)} recoveries; total time median {_fmt(stats['median'], 3)} s, "
             f"p95 {_fmt(stats['p95'], 3)} s, max {_fmt(stats['max'], 3)} s.", ""]
    means = _phase_means(_records(result.get("recoveries")))
    if means:
        lines += ["Mean breakdown:", ""]
        lines += _table(["phase", "mean ms"], [[p, _fmt(m)] for p, m in means.items()]) + [""]
    return lines


def _params_text(params):
    """Fault parameters as 'k=v, k=v'."""
    if isinstance(params, dict):
        return ", ".join(f"{k}={v}" for k, v in params.items()) or "-"
    return _text(params)


def _md_fault_table(result):
    """One row per fault."""
    faults, recoveries = _records(result.get("faults")), _list(result.get("recoveries"))
    if not faults:
        return ["## All faults", "", "No faults were injected.", ""]
    rows = []
    for f in faults:
        rec = _recovery_of(f, recoveries)
        detected = f.get("detected")
        rows.append([f.get("id"), _fmt(f.get("at_s"), 2), f.get("at_step"), f.get("kind"),
                     f.get("target"), _params_text(f.get("params")),
                     _fmt(rec.get("total_ms")) if rec else "-",
                     "-" if detected is None else ("yes" if detected else "no")])
    header = ["id", "time s", "step", "kind", "target", "params", "recovery ms", "detected"]
    return ["## All faults", ""] + _table(header, rows) + [""]


def _md_recovery_table(result):
    """One row per recovery, with every breakdown phase."""
    recoveries = _records(result.get("recoveries"))
    if not recoveries:
        return ["## All recoveries", "", "No recoveries.", ""]
    phases = _phases(recoveries)
    rows = []
    for r in recoveries:
        breakdown = _dict(r.get("breakdown_ms"))
        rows.append([r.get("epoch"), _truncate(_text(r.get("reason")), REASON_CHARS),
                     r.get("restored_version"), _fmt(r.get("total_ms"))]
                    + [_fmt(breakdown.get(p)) for p in phases])
    header = ["epoch", "reason", "restored version", "total ms"] + [f"{p} ms" for p in phases]
    return ["## All recoveries", ""] + _table(header, rows) + [""]


def render_markdown(result):
    """report.md's text."""
    lines = (_md_title(result) + _md_why(result) + _md_checks(result)
             + _md_fault_summary(result) + _md_recovery_summary(result)
             + _md_fault_table(result) + _md_recovery_table(result)
             + ["## Timeline", "", "![timeline](timeline.png)", ""])
    return "\n".join(lines)


# ---------------------------------------------------------------- timeline.png

def _kind_colors(kinds):
    """A stable color per fault kind."""
    palette = plt.get_cmap("tab20").colors
    colors = {}
    for kind in kinds:
        i = KINDS.index(kind) if kind in KINDS else len(KINDS) + len(colors)
        colors[kind] = palette[i % len(palette)]
    return colors


def _series(points):
    """([x], [y]) of the [t, value] pairs that are both numbers."""
    xs, ys = [], []
    for p in _list(points):
        if isinstance(p, (list, tuple)) and len(p) >= 2:
            x, y = _num(p[0]), _num(p[1])
            if x is not None and y is not None:
                xs.append(x)
                ys.append(y)
    return xs, ys


def _spans(ax, intervals, color, alpha):
    """Full-height translucent spans [(x0, x1)], drawn as one collection."""
    if not intervals:
        return
    boxes = [[(a, 0), (b, 0), (b, 1), (a, 1)] for a, b in intervals]
    ax.add_collection(PolyCollection(boxes, facecolors=[color], edgecolors="none", alpha=alpha,
                                     transform=ax.get_xaxis_transform(), zorder=0))


def _x_end(result):
    """The right end of the time axis."""
    ends = [_num(_dict(result.get("job")).get("duration_s"))]
    ends += [max(_series(result.get(k))[0], default=None) for k in ("steps", "committed")]
    for f in _records(result.get("faults")):
        ends += [_num(f.get("at_s")), _num(f.get("ended_s"))]
    for r in _records(result.get("recoveries")):
        ends += [_num(r.get("first_step_s")), _num(r.get("detected_s"))]
    end = max((e for e in ends if e is not None), default=0.0)
    return end if end > 0 else 1.0


def _marker_style(count):
    """(line width, alpha) of fault markers: thinner and fainter when there are many."""
    if count > 500:
        return 0.3, 0.3
    if count > 100:
        return 0.4, 0.5
    return 1.0, 0.9


def _draw_progress(ax, result):
    """Top panel: steps, committed version, faults and recovery intervals."""
    faults = _records(result.get("faults"))
    recoveries = _records(result.get("recoveries"))
    _spans(ax, [(_num(r.get("detected_s")), _num(r.get("first_step_s"))) for r in recoveries
                if _num(r.get("detected_s")) is not None
                and _num(r.get("first_step_s")) is not None], "0.5", 0.15)

    kinds = list(_by_kind({"faults": faults}))
    colors = _kind_colors(kinds)
    width, alpha = _marker_style(len(faults))
    handles = []
    for kind in kinds:
        mine = [f for f in faults if (f.get("kind") or "?") == kind]
        times = [t for t in (_num(f.get("at_s")) for f in mine) if t is not None]
        spans = [(_num(f.get("at_s")), _num(f.get("ended_s"))) for f in mine]
        _spans(ax, [(a, b) for a, b in spans if a is not None and b is not None and b > a],
               colors[kind], 0.12)
        ax.vlines(times, 0, 1, transform=ax.get_xaxis_transform(), colors=[colors[kind]],
                  linewidth=width, alpha=alpha, zorder=1)
        handles.append(Line2D([], [], color=colors[kind], linewidth=2, label=f"{kind} ({len(mine)})"))

    step_x, step_y = _series(result.get("steps"))
    commit_x, commit_y = _series(result.get("committed"))
    lines = [ax.plot(step_x, step_y, color="black", linewidth=1.4, label="step", zorder=3,
                     marker="." if len(step_x) == 1 else None)[0],
             ax.plot(commit_x, commit_y, color="tab:blue", linewidth=0.7, zorder=4,
                     label="committed version", marker="." if len(commit_x) == 1 else None)[0]]
    if not step_x and not commit_x:
        ax.text(0.5, 0.5, "no step data", transform=ax.transAxes, ha="center", va="center")
    ax.set_ylabel("step / version")
    ax.legend(handles=lines + handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)


def _draw_recoveries(ax, result, x_end):
    """Bottom panel: one stacked bar per recovery, split by breakdown phase."""
    recoveries = [r for r in _records(result.get("recoveries"))
                  if _num(r.get("detected_s")) is not None]
    ax.set_ylabel("recovery time (s)")
    ax.set_xlabel("seconds since job start")
    if not recoveries:
        ax.text(0.5, 0.5, "no recoveries", transform=ax.transAxes, ha="center", va="center")
        return
    phases = _phases(recoveries)
    xs = [_num(r.get("detected_s")) for r in recoveries]
    widths = []
    for r, x in zip(recoveries, xs):
        end = _num(r.get("first_step_s"))
        widths.append(max(end - x if end is not None else 0.0, x_end * 0.003))
    bottoms = [0.0] * len(recoveries)
    colors = plt.get_cmap("tab10").colors
    for i, phase in enumerate(phases + ["other"]):
        heights = [_phase_height(r, phase, phases) for r in recoveries]
        if phase == "other" and not any(heights):
            break
        ax.bar(xs, heights, width=widths, bottom=bottoms, align="edge", linewidth=0,
               color=colors[i % len(colors)] if phase != "other" else "0.7", label=phase)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, title="phase",
              title_fontsize=8)


def _phase_height(recovery, phase, phases):
    """Seconds of one phase; 'other' is the total not covered by the phases."""
    breakdown = _dict(recovery.get("breakdown_ms"))
    if phase != "other":
        return (_num(breakdown.get(phase)) or 0.0) / 1000.0
    total = _num(recovery.get("total_ms"))
    known = sum(_num(breakdown.get(p)) or 0.0 for p in phases)
    return (total - known) / 1000.0 if total is not None and total - known > 0.5 else 0.0


def _mathtext_safe(text):
    """Text that matplotlib will not read as math."""
    return text.replace("$", r"\$")


def draw_timeline(result, path):
    """Writes timeline.png."""
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(14, 8), dpi=100,
                                      gridspec_kw={"height_ratios": [3, 2]})
    try:
        x_end = _x_end(result)
        _draw_progress(top, result)
        _draw_recoveries(bottom, result, x_end)
        top.set_xlim(0, x_end * 1.01)
        top.set_ylim(bottom=0)
        bottom.set_ylim(bottom=0)
        top.grid(True, alpha=0.3)
        bottom.grid(True, alpha=0.3)
        fig.suptitle(_mathtext_safe(f"ftrun-chaos {_verdict(result)}: plan {_text(result.get('plan'))}, "
                                    f"seed {_text(result.get('seed'))}"))
        fig.subplots_adjust(left=0.06, right=0.83, top=0.93, bottom=0.08, hspace=0.08)
        _write_atomic(path, lambda f: fig.savefig(f, format="png", dpi=100))
    finally:
        plt.close(fig)


# ---------------------------------------------------------------- entry points

def write_reports(result, out_dir):
    """Writes report.json, report.md and timeline.png into out_dir; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {"json": os.path.join(out_dir, "report.json"),
             "markdown": os.path.join(out_dir, "report.md"),
             "png": os.path.join(out_dir, "timeline.png")}
    _write_atomic(paths["json"], lambda f: (json.dump(result, f, indent=1, sort_keys=False),
                                            f.write("\n")))
    _write_atomic(paths["markdown"], lambda f: f.write(render_markdown(result)))
    draw_timeline(result, paths["png"])
    return paths


def format_summary(result):
    """A few lines for the terminal: verdict, faults, recoveries, failed checks."""
    injected, planned = _fault_counts(result)
    by_kind = ", ".join(f"{k} {v}" for k, v in _by_kind(result).items()) or "none"
    count, stats = _recovery_stats(result)
    lines = [f"ftrun-chaos: {_verdict(result)} (plan {_text(result.get('plan'))}, "
             f"seed {_text(result.get('seed'))})",
             f"faults: {_text(injected)} injected of {_text(planned)} planned: {by_kind}",
             f"recoveries: {_text(count)}, median {_fmt(stats['median'], 3)} s, "
             f"max {_fmt(stats['max'], 3)} s"]
    failed = _failed_checks(result)
    if failed:
        lines.append("failed checks:")
        lines += [f"  - {_text(c.get('name'))}: {_text(c.get('detail'))}" for c in failed]
    return "\n".join(lines)
