"""ftrun.lightning: a Lightning Trainer saved through ftrun at every optimizer
step, on every rank, and resumed from the agent's memory after a restart.

    import ftrun.lightning as ftl

    trainer = L.Trainer(..., plugins=[ftl.CheckpointIO()], callbacks=[ftl.Checkpoint()])
    trainer.fit(model, train_dataloaders=loader, ckpt_path=ftl.ckpt_path())

Checkpoint() saves what Trainer.save_checkpoint would (the Trainer's own
dump_checkpoint: model, optimizers, schedulers, loops with their progress,
callbacks, a stateful dataloader's position) plus the random generators, as
version global_step, on every rank: Lightning's strategies write their
checkpoint on rank 0 only, which ftrun cannot commit. ckpt_path() is None
on a fresh start, else "ftrun:restore"; CheckpointIO() loads that path
from ftrun (and puts the generators back), and hands any other path to
Lightning's own TorchCheckpointIO, so ModelCheckpoint keeps working.

Resuming in the middle of an epoch is exact when the dataloader is stateful
(torchdata's StatefulDataLoader), as Lightning requires for its own
checkpoints (otherwise Lightning starts the epoch's data over), and when its
order depends only on the seed and the epoch: give it its own
DistributedSampler and Trainer(use_distributed_sampler=False). Lightning's
wrapper around a RandomSampler draws a new order from the global generator
each time an iterator is made, so a restored run would see other batches.
The generators are put back right before the first restored batch.
"""
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.io import TorchCheckpointIO

from . import state as _state

RESTORE = "ftrun:restore"
_pending_rng = []  # the restored generators, for Checkpoint to put back before the first batch


def ckpt_path():
    """The ckpt_path for Trainer.fit: None when ftrun has nothing to restore."""
    client = _state.get_client()
    lv = client.list_versions()
    return RESTORE if lv["restore"] is not None or lv["committed"] else None


class CheckpointIO(TorchCheckpointIO):
    """Loads "ftrun:restore" from ftrun; every other path as TorchCheckpointIO."""

    def load_checkpoint(self, path, map_location=None, weights_only=None):
        if str(path) != RESTORE:
            return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        resumed = _state.load(map_location="cpu")
        if resumed is None:
            raise FileNotFoundError(f"ftrun.lightning: {RESTORE}: ftrun has no committed version to restore")
        step, saved = resumed
        if not isinstance(saved, dict) or "checkpoint" not in saved:
            raise ValueError(f"ftrun.lightning: version {step} was not saved by ftrun.lightning.Checkpoint")
        # The generators go back right before the first restored batch: between here and there Lightning makes
        # its dataloader iterator, which may draw from them (a RandomSampler's seed).
        _pending_rng[:] = [saved["rng"]]
        return saved["checkpoint"]


class Checkpoint(Callback):
    """Saves the Trainer's checkpoint through ftrun every `every` optimizer steps."""

    def __init__(self, every=1):
        if int(every) < 1:
            raise ValueError(f"ftrun.lightning.Checkpoint: every must be >= 1, not {every!r}")
        self.every = int(every)
        self._saved = None

    def on_train_start(self, trainer, pl_module):
        self._saved = trainer.global_step  # 0, or the restored step: saved already

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if _pending_rng:
            _state.set_rng_state(_pending_rng.pop())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if step == self._saved or step % self.every:
            return  # no optimizer step since the last save or the start (gradient accumulation)
        checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        _state.save(step, {"checkpoint": checkpoint, "rng": _state.rng_state()})
        self._saved = step
