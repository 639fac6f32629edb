"""train_gpt.py's checkpoint backends: ftrun (the state goes to the node
agent's memory and comes back after a restart), or the status quo that
`ftrun-bench baseline-torch` measures it against (torch.save to local disk;
see train_gpt.py's docstring, --checkpoint torch:DIR)."""
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
        return {"save_ftrun_stall_s": stats["stall_seconds"]}

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
        return step, torch.load(self._path(self.rank, step), map_location=device)

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
