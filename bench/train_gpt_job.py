"""One train_gpt.py job on this machine under the ftrun runner (one node,
one rank), for the benchmarks that time its saves (cuda_step_overhead.py,
py_save_overhead.py): its own run directory and store, its output back."""
import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "integration", "examples", "train_gpt.py")


def run_train_gpt(who, build, python, port, store, args, env=None, timeout=600):
    """train_gpt.py `args` under build's ftrun with FTRUN_PYTHON=python (and
    env); store: the store section's YAML lines (memory_budget, chunk_size).
    Returns its stdout; exits naming `who` when the job fails."""
    d = tempfile.mkdtemp(prefix="ftrun-train-gpt-")
    cfg = os.path.join(d, "ftrun.yaml")
    with open(cfg, "w") as f:
        f.write(f"agent:\n  run_dir: {d}/run\nstore:\n" + "".join(f"  {line}\n" for line in store))
    argv = [os.path.join(build, "ftrun"), "--num_nodes", "1", "--num_gpus", "1", "--config", cfg,
            "--master_addr", "127.0.0.1", "--master_port", str(port), SCRIPT, *args]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, FTRUN_PYTHON=python, **(env or {})))
    if p.returncode != 0:
        sys.exit(f"{who}: the run failed (exit {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p.stdout


def parse_arguments(steps, port, out_help="also write the figures here as JSON"):
    """(options, train_gpt.py's own arguments) from the command line: the
    options both benchmarks take (--build, --steps, --python, --port, --out)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--port", type=int, default=port)
    ap.add_argument("--out", help=out_help)
    return ap.parse_known_args()
