"""timeline.png: two panels sharing the time axis (seconds since job start):
on top the training step and the committed version over time, every fault
as a vertical marker colored by kind (spans for faults that last) and the
recovery intervals shaded; below, one stacked bar per recovery split by
breakdown phase."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after matplotlib.use)
from matplotlib.collections import PolyCollection  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from .report_common import (KINDS, _by_kind, _dict, _list, _num, _phases, _records, _text, _verdict,  # noqa: E402
                            _write_atomic)


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
