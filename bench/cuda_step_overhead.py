"""step_overhead (issue 16): train_gpt.py on one GPU (NCCL, one rank) under
the ftrun runner, step time with ftrun.save every step over the same run
saving only after its last step. Prints key=value lines.

  python3 bench/cuda_step_overhead.py --build build [--steps 60] [--out F.json] [train_gpt args...]

ftrun-bench save --cuda runs it after its own figures (--python names the
interpreter, which needs torch with CUDA; --no-step-overhead skips it).
"""
import json
import re
import statistics

from train_gpt_job import parse_arguments, run_train_gpt

TIMING_RE = re.compile(r"^TIMING 0 (step_s|save_stall_s) (\S+) (\d+)$", re.M)
PARTS_RE = re.compile(r"^TIMING 0 (\w+) ([-0-9.e+]+) (\d+)$", re.M)


def run(build, steps, save_every, extra, port, python, overlap=False):
    args = ["--backend", "nccl", "--steps", str(steps), "--save-every", str(save_every), "--timing", "--dropout", "0",
            *extra]
    if overlap:
        args.insert(args.index("--timing"), "--overlap-saves")
    stdout = run_train_gpt("cuda_step_overhead", build, python, port, ["memory_budget: 8GiB", "chunk_size: 4MiB"],
                           args)
    per_step, stall = {}, {}
    for name, value, step in TIMING_RE.findall(stdout):
        per_step.setdefault(int(step), 0.0)
        per_step[int(step)] += float(value)
        if name == "save_stall_s":
            stall[int(step)] = float(value)
    warm = sorted(per_step)[steps // 4:-1]  # past warm-up; the last step always saves
    parts = {}
    for name, value, step in PARTS_RE.findall(stdout):
        if int(step) in warm and name not in ("step_s", "save_stall_s"):
            parts.setdefault(name, []).append(float(value))
    if save_every == 1:  # where a save's time goes (FtrunCheckpoint's parts), medians
        print(f"save parts{' (overlap)' if overlap else ''}: " +
              " ".join(f"{k}={statistics.median(v):.6g}" for k, v in sorted(parts.items())), flush=True)
    return statistics.median(per_step[s] for s in warm), statistics.median(stall.get(s, 0.0) for s in warm)


def main():
    a, extra = parse_arguments(steps=60, port=29611,
                               out_help="also write the figures here as JSON (ftrun-bench save --cuda reads it)")
    extra = extra or ["--layers", "4", "--d-model", "1024", "--batch", "32", "--seq", "256", "--vocab", "512"]
    without, _ = run(a.build, a.steps, 10 ** 6, extra, a.port, a.python)
    with_save, stall = run(a.build, a.steps, 1, extra, a.port + 10, a.python)
    overlapped, stall_overlap = run(a.build, a.steps, 1, extra, a.port + 20, a.python, overlap=True)
    print(f"step_s_without_saves={without:.6f}")
    print(f"step_s_with_saves={with_save:.6f}")
    print(f"step_s_with_overlapped_saves={overlapped:.6f}")
    print(f"step_overhead={with_save / without:.4f}  (the stream waits for the copies at once)")
    print(f"step_overhead_overlap={overlapped / without:.4f}  (target <= 1.03; optimizer steps wait)")
    print(f"save_stall_s={stall:.6f}  (inside ftrun.save, of step_s_with_saves)")
    print(f"save_stall_s_overlap={stall_overlap:.6f}")
    print(f"model_args={' '.join(extra)}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"step_s_without_saves": without, "step_s_with_saves": with_save,
                       "step_s_with_overlapped_saves": overlapped, "step_overhead": with_save / without,
                       "step_overhead_overlap": overlapped / without, "save_stall_s": stall,
                       "save_stall_s_overlap": stall_overlap, "model_args": " ".join(extra)}, f)


if __name__ == "__main__":
    main()
