"""The chart of `ftrun-bench peers` (bench/stack_recovery.py --chart): for one
stack of its JSON, one panel per figure - save stall, kill -> every rank's
next step, extra memory per node - each a group of bars, one colour per
system, the value on each bar; the legend says which systems end exact and
which keep a copy off the node.

    .venv/bin/python bench/peers_chart.py RESULT.json OUT.png [--stack ddp]
"""
import argparse
import json
import sys

LABELS = {"none": "no checkpoint", "own": "torch.save (rank 0)", "dcp": "DCP save", "dcp_async": "DCP async (thread)",
          "dcp_process": "DCP async (process)", "torchft": "torchft", "dlrover": "DLRover flash ckpt",
          "nvrx": "NVRx (ft_launcher, async ckpt)", "ftrun": "ftrun"}
# (figure key, the panel's title, unit)
FIGURES = [("stall", "save stall per step (torchft: step overhead)", "s"),
           ("recovery_s", "SIGKILL a rank -> every rank's next step", "s"),
           ("extra_mib_per_node", "extra memory per node (peak, no page cache)", "MiB")]
COLOURS = ["#8c8c8c", "#4c72b0", "#55a868", "#64b5cd", "#8172b2", "#dd8452", "#937860", "#da8bc3", "#c44e52"]


def systems(stack):
    """The rows that ran, in LABELS' order, ftrun last."""
    return [s for s in LABELS if s != "none" and isinstance(stack.get(s), dict) and "error" not in stack[s]]


def value(row, key):
    if key == "stall":  # a peer that writes no checkpoint: its step time over the plain job's
        key = "save_stall_s" if "save_stall_s" in row else "step_overhead_s"
    v = row.get(key)
    return v if isinstance(v, (int, float)) else None


def draw(result, stack_name, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stack = result["stacks"][stack_name]
    names = systems(stack)
    colour = {s: COLOURS[i % len(COLOURS)] for i, s in enumerate(LABELS)}
    fig, axes = plt.subplots(1, len(FIGURES), figsize=(4.2 * len(FIGURES), 4.2))
    for ax, (key, title, unit) in zip(axes, FIGURES):
        for i, s in enumerate(names):
            v = value(stack[s], key)
            if v is None:
                continue
            ax.bar(i, v, color=colour[s])
            ax.annotate(f"{v:.2f}" if unit == "s" else f"{v:.0f}", (i, v),
                        ha="center", va="bottom", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(unit)
        ax.set_xticks([])
        ax.axhline(0, color="black", linewidth=0.5)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour[s]) for s in names]
    legend = [LABELS[s] + (", exact" if stack[s].get("exact") else "") +
              (f", {stack[s]['off_node_copies']} copy off-node" if stack[s].get("off_node_copies") else "")
              for s in names]
    fig.legend(handles, legend, loc="lower center", ncol=min(len(names), 4), fontsize=9, frameon=False)
    model = result.get("model", {})
    fig.suptitle(f"{stack_name}: {result.get('nodes')} nodes x {result.get('per_node')} ranks, gloo; "
                 f"GPT d_model {model.get('d_model')}, {model.get('layers')} layers", fontsize=11)
    fig.tight_layout(rect=(0, 0.12, 1, 0.95))
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("result")
    p.add_argument("out")
    p.add_argument("--stack", default="ddp")
    a = p.parse_args()
    with open(a.result) as f:
        result = json.load(f)
    if a.stack not in result.get("stacks", {}):
        p.error(f"{a.result}: no stack '{a.stack}' in 'stacks' (it has {sorted(result.get('stacks', {}))})")
    draw(result, a.stack, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
