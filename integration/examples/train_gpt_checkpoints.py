"""train_gpt.py's checkpoint backends: ftrun (the state goes to the node
agent's memory and comes back after a restart), or the status quo that
`ftrun-bench baseline-torch` measures it against (torch.save to local disk;
--checkpoint torch:DIR below).

train_gpt.py's Benchmark options (`ftrun-bench baseline-torch`, bench/baseline_torch.py):

* `--checkpoint torch:DIR` replaces ftrun with the status quo: every
  `--save-every` steps each rank `torch.save`s exactly what it would give
  ftrun to DIR/rank<r>-step<s>.pt (written to a temporary name, fsync'd,
  renamed, the directory fsync'd; the rank's files older than the previous one
  are removed), and a relaunched rank `torch.load`s the newest step that every
  rank has complete. No agent is needed; run it with torchrun's environment.
* `--timing` adds, per rank, `TIMING <rank> <name> <value>` lines (a save's
  and a step's lines end with the step): startup_s (process creation to the
  script's first line: exec and the interpreter), import_s (process creation
  to after `import torch`), setup_s (process group, model, optimizer),
  restore_s (load and put the state back into model, optimizer and
  generators), restore_load_s (its torch.load / ftrun.load part), step_s,
  first_step_s (the first step after a restore; first_step_compute_s,
  _sync_s, _opt_s split it), save_stall_s (each save: the time the training
  loop waits for it), save_write_s and save_fsync_s (torch),
  save_ftrun_stall_s (ftrun: libftrun's own stall), save_tensors (ftrun: the
  tensors in the save), state_bytes (the tensors
  of one save), restore_minflt, first_step_minflt, save_minflt (page
  faults), and t_start, t_imported, t_setup, t_restored, t_first_step
  (CLOCK_MONOTONIC seconds of those moments; t_start from /proc/self/stat,
  10 ms resolution), process_group_s (the generation's start to its process
  group). A warm generation (--resilient, a process that ran before) prints
  no start-up lines; its t_imported is the moment the generation began. After the first step that follows a restore (the
  optimizer step, before the save) every rank prints
  `FIRSTSTEP <rank> <unix time> <CLOCK_MONOTONIC>`.
* `--fsdp 2|1` shards the model with FSDP2 or FSDP1 instead, and every rank
  saves and restores only its own shards (train_gpt_fsdp.py says how).
* `--layers`, `--d-model`, `--vocab`, `--seq`, `--batch` size the model: the
  bench uses `--layers 4 --d-model 1024`, ~50 M parameters (193 MiB, the same
  on every rank) plus each rank's Adam shard (2 x 193 MiB / ranks).
"""
import os
import time

import ftrun
import torch


def tensor_bytes(obj):
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


class FtrunCheckpoint:
    """The state goes to the node agent's memory (ftrun.save) and comes back
    from it after a restart (ftrun.load). overlap: CUDA copies overlap the next
    forward and backward pass (ftrun.save(overlap=True))."""

    def __init__(self, overlap=False):
        self.overlap = overlap

    def load(self, device):
        return ftrun.load()

    def save(self, step, state):
        stats = ftrun.save(step, state, overlap=self.overlap)
        self.last_stats = stats  # Client.save's statistics (train_gpt.py --fsdp prints bytes_total)
        return {"save_ftrun_stall_s": stats["stall_seconds"], "save_tensors": stats["tensors"]}

    def finish(self):
        ftrun.wait()  # the last step is committed before anyone reports


class TorchCheckpoint:
    """The status quo: every rank torch.saves its state to a local file and a
    relaunched rank torch.loads the newest step every rank has complete."""

    def __init__(self, directory, rank, world):
        self.dir = directory
        self.rank = rank
        self.world = world
        os.makedirs(directory, exist_ok=True)

    def _path(self, rank, step):
        return os.path.join(self.dir, f"rank{rank}-step{step:09d}.pt")

    def _steps(self):
        """rank -> set of steps whose file is complete (renamed into place)."""
        out = {r: set() for r in range(self.world)}
        for name in os.listdir(self.dir):
            if name.startswith("rank") and name.endswith(".pt") and "-step" in name:
                r, _, st = name[4:-3].partition("-step")
                if r.isdigit() and st.isdigit() and int(r) in out:
                    out[int(r)].add(int(st))
        return out

    def load(self, device):
        steps = self._steps()
        common = set.intersection(*steps.values()) if steps else set()
        if not common:
            return None
        step = max(common)
        # Its own files, RNG states in them: not a weights-only load (torch >= 2.6's default).
        return step, torch.load(self._path(self.rank, step), map_location=device, weights_only=False)

    def save(self, step, state):
        path = self._path(self.rank, step)
        tmp = path + ".tmp"
        t0 = time.monotonic()
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            t1 = time.monotonic()
            os.fsync(f.fileno())
        os.rename(tmp, path)
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)  # the rename is durable too
        finally:
            os.close(fd)
        t2 = time.monotonic()
        # Keep this file and the previous one: the newest step every rank has
        # complete is one of the two (the ranks step together).
        for old in sorted(self._steps()[self.rank])[:-2]:
            try:
                os.unlink(self._path(self.rank, old))
            except FileNotFoundError:
                pass
        return {"save_write_s": t1 - t0, "save_fsync_s": t2 - t1}

    def finish(self):
        pass
