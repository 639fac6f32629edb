"""The Python side of ftrun.save, per tensor (issue 37): train_gpt.py on the
CPU (gloo, one rank) under the ftrun runner, saving every step with
`--timing`; for each save, the time inside ftrun.save minus libftrun's own
stall (`stall_seconds`: the copies into the store), over the number of
tensors saved. Two runs of the same job in one go: with the packed
structure reused between saves (the default) and with it packed again at
every save (FTRUN_SAVE_CACHE=0, as before the cache). Prints key=value lines.

  python3 bench/py_save_overhead.py --build build [--steps 40] [--out F.json] [train_gpt args...]

Default model: train_gpt's GPU bench shape (`--layers 4 --vocab 512`) with
`--d-model 256 --batch 2 --seq 32`, so a CPU step is short; the tensor
count, which is what the Python side scales with, is the GPU bench's.
"""
import json
import re
import statistics
import sys

from train_gpt_job import parse_arguments, run_train_gpt

TIMING_RE = re.compile(r"^TIMING 0 (save_stall_s|save_ftrun_stall_s|save_tensors) (\S+) (\d+)$", re.M)
DEFAULT_MODEL = ["--layers", "4", "--vocab", "512", "--d-model", "256", "--batch", "2", "--seq", "32"]


def run(build, steps, model, port, python, cache):
    """Median per-tensor Python time of the saves past warm-up, and the parts."""
    args = ["--backend", "gloo", "--steps", str(steps), "--save-every", "1", "--timing", "--dropout", "0", *model]
    stdout = run_train_gpt("py_save_overhead", build, python, port, ["memory_budget: 2GiB", "chunk_size: 1MiB"], args,
                           env={"FTRUN_SAVE_CACHE": "1" if cache else "0"})
    parts = {}
    for name, value, step in TIMING_RE.findall(stdout):
        parts.setdefault(int(step), {})[name] = float(value)
    warm = sorted(parts)[steps // 4:-1]  # past warm-up; the last save is followed by the final wait
    if not warm or any(len(parts[s]) != 3 for s in warm):
        sys.exit(f"py_save_overhead: no complete TIMING lines in the run's output:\n{stdout[-3000:]}")
    tensors = int(parts[warm[0]]["save_tensors"])
    python_s = [parts[s]["save_stall_s"] - parts[s]["save_ftrun_stall_s"] for s in warm]
    return {
        "tensors": tensors,
        "python_us_per_tensor": statistics.median(python_s) / tensors * 1e6,
        "save_s": statistics.median(parts[s]["save_stall_s"] for s in warm),
        "libftrun_stall_s": statistics.median(parts[s]["save_ftrun_stall_s"] for s in warm),
    }


def main():
    a, model = parse_arguments(steps=40, port=29641)
    model = model or DEFAULT_MODEL
    uncached = run(a.build, a.steps, model, a.port, a.python, cache=False)
    cached = run(a.build, a.steps, model, a.port + 10, a.python, cache=True)
    out = {"tensors": cached["tensors"], "model_args": " ".join(model)}
    for side, r in (("uncached", uncached), ("cached", cached)):
        for k in ("python_us_per_tensor", "save_s", "libftrun_stall_s"):
            out[f"{k}_{side}"] = r[k]
    out["python_speedup"] = uncached["python_us_per_tensor"] / cached["python_us_per_tensor"]
    for k, v in out.items():
        print(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}")
    print("python_us_per_tensor_cached: target <= 5")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
