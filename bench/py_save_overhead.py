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
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "integration", "examples", "train_gpt.py")
TIMING_RE = re.compile(r"^TIMING 0 (save_stall_s|save_ftrun_stall_s|save_tensors) (\S+) (\d+)$", re.M)
DEFAULT_MODEL = ["--layers", "4", "--vocab", "512", "--d-model", "256", "--batch", "2", "--seq", "32"]


def run(build, steps, model, port, python, cache):
    """Median per-tensor Python time of the saves past warm-up, and the parts."""
    d = tempfile.mkdtemp(prefix="ftrun-pysave-")
    cfg = os.path.join(d, "ftrun.yaml")
    with open(cfg, "w") as f:
        f.write(f"agent:\n  run_dir: {d}/run\nstore:\n  memory_budget: 2GiB\n  chunk_size: 1MiB\n")
    argv = [os.path.join(build, "ftrun"), "--num_nodes", "1", "--num_gpus", "1", "--config", cfg,
            "--master_addr", "127.0.0.1", "--master_port", str(port), SCRIPT, "--backend", "gloo",
            "--steps", str(steps), "--save-every", "1", "--timing", "--dropout", "0", *model]
    env = dict(os.environ, FTRUN_PYTHON=python, FTRUN_SAVE_CACHE="1" if cache else "0")
    p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    if p.returncode != 0:
        sys.exit(f"py_save_overhead: the run failed (exit {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    parts = {}
    for name, value, step in TIMING_RE.findall(p.stdout):
        parts.setdefault(int(step), {})[name] = float(value)
    warm = sorted(parts)[steps // 4:-1]  # past warm-up; the last save is followed by the final wait
    if not warm or any(len(parts[s]) != 3 for s in warm):
        sys.exit(f"py_save_overhead: no complete TIMING lines in the run's output:\n{p.stdout[-3000:]}")
    tensors = int(parts[warm[0]]["save_tensors"])
    python_s = [parts[s]["save_stall_s"] - parts[s]["save_ftrun_stall_s"] for s in warm]
    return {
        "tensors": tensors,
        "python_us_per_tensor": statistics.median(python_s) / tensors * 1e6,
        "save_s": statistics.median(parts[s]["save_stall_s"] for s in warm),
        "libftrun_stall_s": statistics.median(parts[s]["save_ftrun_stall_s"] for s in warm),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--port", type=int, default=29641)
    ap.add_argument("--out", help="also write the figures here as JSON")
    a, model = ap.parse_known_args()
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
