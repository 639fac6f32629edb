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

The parts: report_common (the result's fields and the facts derived from
them), report_markdown (report.md), report_timeline (timeline.png).
"""

import json
import os

from .report_common import (KINDS, _by_kind, _failed_checks, _fault_counts, _fmt, _recovery_stats, _text, _verdict,
                            _write_atomic)
from .report_markdown import render_markdown
from .report_timeline import draw_timeline

__all__ = ["KINDS", "write_reports", "format_summary", "render_markdown", "draw_timeline"]


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
    skipped = result.get("not_injected") or []
    if skipped:
        lines.append(f"not injected (the schedule, not a failure): {len(skipped)}: " +
                     "; ".join(_text(x) for x in skipped[:3]))
    failed = _failed_checks(result)
    if failed:
        lines.append("failed checks:")
        lines += [f"  - {_text(c.get('name'))}: {_text(c.get('detail'))}" for c in failed]
    return "\n".join(lines)
