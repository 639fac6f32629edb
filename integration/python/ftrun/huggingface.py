"""ftrun.huggingface: a transformers Trainer saved through ftrun at every
optimizer step and resumed from the agent's memory after a restart.

    import ftrun.huggingface as fth

    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[fth.Checkpoint()])
    trainer.train(resume_from_checkpoint=fth.resume_from_checkpoint())

Checkpoint() saves, on every rank, what a Trainer checkpoint holds: the
model's and optimizer's state dicts, the scheduler's, the random generators
(in the Trainer's own format) and the TrainerState, as version global_step.
resume_from_checkpoint() returns None on a fresh start; after a restart it
writes the committed version as a Trainer checkpoint directory in memory
(/dev/shm, this rank's own, removed at exit; a SIGKILLed rank's is removed by
the next resume) and returns its path, so the
Trainer resumes exactly as from its own checkpoint: weights, optimizer,
scheduler, the step, the data position (it skips the batches already
trained in the epoch) and every rank's generators.
"""
import atexit
import dataclasses
import json
import os
import random
import shutil
import tempfile

import numpy as np
import torch
from transformers import TrainerCallback

from . import state as _state

_written = []  # the checkpoint directories this process wrote (an earlier generation's: @ftrun.resilient)


def _rng_state():
    # The Trainer's _save_rng_state format (CPU; CUDA when available).
    rng = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.random.get_rng_state_all()
    return rng


class Checkpoint(TrainerCallback):
    """Saves the Trainer's state through ftrun every `every` optimizer steps. overlap=True: the copy into
    the agent's memory runs beside the next step's forward and backward passes, until its optimizer step
    (ftrun.save's overlap: only when nothing but the optimizer writes the saved tensors; BatchNorm's running
    statistics do)."""

    def __init__(self, every=1, overlap=False):
        if int(every) < 1:
            raise ValueError(f"ftrun.huggingface.Checkpoint: every must be >= 1, not {every!r}")
        self.every = int(every)
        self.overlap = bool(overlap)

    def on_step_end(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
        if state.global_step % self.every:
            return
        _state.save(state.global_step, {
            "model": model.state_dict(), "optim": optimizer.state_dict(),
            "sched": lr_scheduler.state_dict() if lr_scheduler is not None else None,
            "rng": _rng_state(), "trainer_state": json.dumps(dataclasses.asdict(state)),
        }, overlap=self.overlap)


def _remove_orphans(base):
    """Removes the checkpoint directories of earlier ranks of this user that died without their atexit
    (SIGKILLed): ftrun-trainer-<step>-pid<pid>-* whose process is gone."""
    for name in os.listdir(base):
        if not name.startswith("ftrun-trainer-") or "-pid" not in name:
            continue
        pid = name.rsplit("-pid", 1)[1].split("-", 1)[0]
        path = os.path.join(base, name)
        try:
            if not pid.isdigit() or os.lstat(path).st_uid != os.getuid():
                continue
            os.kill(int(pid), 0)
            continue  # alive (or another user's: EPERM)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except OSError:
            continue


def resume_from_checkpoint(directory=None):
    """None on a fresh start; else the path of a Trainer checkpoint directory
    holding the version ftrun restores (in `directory`, default /dev/shm)."""
    resumed = _state.load(map_location="cpu")
    if resumed is None:
        return None
    step, saved = resumed
    missing = [k for k in ("model", "optim", "sched", "rng", "trainer_state") if k not in saved]
    if missing:
        raise ValueError(f"ftrun.huggingface: version {step} was not saved by ftrun.huggingface.Checkpoint "
                         f"(it lacks {', '.join(missing)})")
    base = directory or ("/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir())
    _remove_orphans(base)
    while _written:  # read by an earlier generation's Trainer already
        shutil.rmtree(_written.pop(), ignore_errors=True)
    path = tempfile.mkdtemp(prefix=f"ftrun-trainer-{step}-pid{os.getpid()}-", dir=base)
    _written.append(path)
    atexit.register(shutil.rmtree, path, True)  # (a killed rank's stays: the next resume removes it)
    torch.save(saved["model"], os.path.join(path, "pytorch_model.bin"))
    torch.save(saved["optim"], os.path.join(path, "optimizer.pt"))
    if saved["sched"] is not None:
        torch.save(saved["sched"], os.path.join(path, "scheduler.pt"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    name = f"rng_state_{os.environ.get('RANK', '0')}.pth" if world > 1 else "rng_state.pth"
    torch.save(saved["rng"], os.path.join(path, name))
    with open(os.path.join(path, "trainer_state.json"), "w") as f:
        f.write(saved["trainer_state"])
    return path
