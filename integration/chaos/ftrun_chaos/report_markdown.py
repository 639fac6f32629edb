"""report.md: the verdict, the checks (failed ones first under "Why it
failed"), a summary of the faults and the recoveries, then a table of every
fault and of every recovery with its timing breakdown."""

from .report_common import (_by_kind, _dict, _fault_counts, _failed_checks, _fmt, _list, _phase_means, _phases,
                            _records, _recovery_of, _recovery_stats, _text, _verdict)

REASON_CHARS = 80


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
