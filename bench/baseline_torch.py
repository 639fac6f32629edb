"""The process work of `ftrun-bench baseline-torch` (bench/baseline_torch_bench.cc
runs it and reports its figures; it also runs alone and prints the same JSON).

The same job twice, in this run: integration/examples/train_gpt.py on NODES x
PER_NODE ranks (torch.distributed, gloo, ZeroRedundancyOptimizer(Adam)), the
model sized so that every rank's saved tensors - the replicated model plus
its Adam shard - are at least 256 MiB.

* Status quo: this script spawns the ranks itself with torchrun's environment
  (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
  MASTER_PORT); every rank `torch.save`s its state to local disk every step
  (`--checkpoint torch:DIR`: written, fsync'd, renamed). Once every rank has
  saved SAVES times, one rank is SIGKILLed; as soon as its death is seen
  (waitpid, polled every 2 ms) the others get SIGTERM (SIGKILL after 2 s), as
  torchrun and DeepSpeed's launcher do when one rank dies, and all ranks are
  relaunched at once on a fresh MASTER_PORT. They `torch.load` the newest step
  every rank has complete. This is an idealized torchrun: no monitor
  interval (torchrun's default is 5 s), no rendezvous round.
* ftrun warm: the same under @ftrun.resilient (train_gpt.py --resilient):
  the survivors leave their generation and run the next one in their own
  processes, restoring in place (ftrun.restore); a warm standby (one per
  node, up before each kill) takes the victim's place. Reported apart:
  warm_recovery_speedup (status quo's kill -> every rank's first step over
  this side's), warm_restore_speedup (the status quo's restore over a
  survivor's in-place one), and the survivors' own time, kill -> ready to
  step (survivor_ready_s).
* ftrun: `build/ftrun --num_nodes NODES --num_gpus PER_NODE` (local
  launcher: one agent per node on this machine) runs the same script with
  `--checkpoint ftrun`; the same rank is SIGKILLed once every rank has saved
  SAVES times and a version is committed; the agents restart every rank and
  they `ftrun.load()`.

Every rank prints TIMING lines (see train_gpt.py's docstring). Figures, per
side: the save stall (median over every save but each process's first), the
restore (slowest rank: load and put back into model, optimizer and
generators), and kill -> the last rank's first step after the restore, split
at the slowest rank's moments (every time is CLOCK_MONOTONIC on this machine):
kill -> every new process exists, -> every rank imported torch (Python
start-up and `import torch`), -> process group, model and optimizer built,
-> state restored, -> first step done. ftrun's side adds the agents' own
breakdown (status files).

Output: one JSON object on stdout (or in --out FILE); progress on stderr.

The parts, beside this file: baseline_side (what both sides share),
baseline_torch_side and baseline_ftrun_side (the two sides), baseline_timing
(the ranks' TIMING lines and the figures).
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

from baseline_ftrun_side import FtrunSide
from baseline_side import log
from baseline_timing import summary
from baseline_torch_side import TorchSide

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(HERE)


def main():
    p = argparse.ArgumentParser(description="status quo (torch.save/torch.load, relaunch) vs ftrun, same run")
    p.add_argument("--build", default=os.path.join(SOURCE, "build"), help="the build directory (ftrun, python/)")
    p.add_argument("--python", default=os.environ.get("FTRUN_PYTHON") or sys.executable)
    p.add_argument("--script", default=os.path.join(SOURCE, "integration", "examples", "train_gpt.py"))
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--per-node", type=int, default=2)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--saves", type=int, default=4, help="saves per rank before each kill (and at the end)")
    p.add_argument("--kills", type=int, default=3, help="kills per side (the medians are reported)")
    p.add_argument("--victim", type=int, default=1, help="the rank SIGKILLed")
    p.add_argument("--replicas", type=int, default=1, help="ftrun's cluster.replicas")
    p.add_argument("--snapshot-mib", type=int, default=320, help="ftrun store sizing: MiB per rank snapshot")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--order", choices=["torch-first", "ftrun-first"], default="torch-first")
    p.add_argument("--keep", action="store_true", help="keep the logs (always kept when the run fails)")
    p.add_argument("--keep-checkpoints", action="store_true", help="with --keep: keep the torch.save files too")
    p.add_argument("--out", help="write the JSON here instead of stdout")
    p.add_argument("--only", choices=["torch", "ftrun", "warm"], help="run one side only (no ratios; for diagnosis)")
    a = p.parse_args()
    a.build = os.path.abspath(a.build)
    a.script = os.path.abspath(a.script)
    if not 0 <= a.victim < a.nodes * a.per_node:
        p.error("--victim must be a rank")
    work = tempfile.mkdtemp(prefix="ftrun-bench-baseline-")
    result = {"nodes": a.nodes, "per_node": a.per_node, "model": {k: getattr(a, k) for k in (
        "layers", "d_model", "heads", "vocab", "seq", "batch")}, "kills": a.kills, "victim": a.victim,
        "replicas": a.replicas, "work_dir": work}
    try:
        def warm_side(a, work):
            return FtrunSide(a, work, warm=True)

        order = [TorchSide, FtrunSide, warm_side] if a.order == "torch-first" else [warm_side, FtrunSide, TorchSide]
        if a.only:
            order = [{"torch": TorchSide, "ftrun": FtrunSide, "warm": warm_side}[a.only]]
        for cls in order:
            side = cls(a, work)
            log(f"{side.name}: {a.nodes} nodes x {a.per_node} ranks")
            result[side.name] = side.run()
            result[side.name]["summary"] = summary(result[side.name])
        if not a.only:
            t, f = result["torch"]["summary"], result["ftrun"]["summary"]
            result["save_speedup"] = t["save_stall_s"] / f["save_stall_s"]
            result["restore_speedup"] = t["restore_s"] / f["restore_s"]
            result["recovery_speedup"] = t["recovery_s"] / f["recovery_s"]
            w = result["ftrun_warm"]["summary"]
            result["warm_recovery_speedup"] = t["recovery_s"] / w["recovery_s"]
            # The same without the first step, which both sides take alike (kill -> every rank ready to step).
            result["warm_ready_speedup"] = t["ready_s"] / w["ready_s"]
            # The status quo's torch.load + load_state_dict over a survivor's in-place ftrun.restore.
            result["warm_restore_speedup"] = t["restore_s"] / w["survivor_restore_s"]
        result["ok"] = True
    except Exception as e:  # noqa: BLE001 - reported as JSON, with the logs kept
        result["ok"] = False
        result["error"] = f"{type(e).__name__}: {e}"
        a.keep = True
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
            result["work_dir"] = None
        else:  # the logs stay; the checkpoints (GBs) only when asked for
            if not a.keep_checkpoints:
                shutil.rmtree(os.path.join(work, "torch", "ckpt"), ignore_errors=True)
            log(f"logs kept in {work}")
    if a.out:
        with open(a.out + ".tmp", "w") as f:
            json.dump(result, f, indent=1)
        os.rename(a.out + ".tmp", a.out)
    else:
        json.dump(result, sys.stdout, indent=1)
        sys.stdout.write("\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
