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

FSDPStrategy: every rank saves its own shards, nothing gathered. By default
(Checkpoint(fsdp="local")) they are the shards as the rank holds them: each
FSDP unit's flat parameter shard and each optimizer's own state_dict()
(ftrun.fsdp_local), in place of the Trainer's sharded state dicts, which
cost most of a step in Python at every save; the rest of the checkpoint is
the Trainer's. Such a version goes back into the same model on the same
world size (a restart under ftrun), bit for bit. Checkpoint(fsdp="sharded")
saves the Trainer's sharded state dicts instead (state_dict_type="sharded";
a "full" one would gather the whole model on rank 0 at every save, and is
refused). The strategy loads its checkpoints itself, without a
CheckpointIO, so Checkpoint() gives it the ftrun path: the restored shards go
straight into the live FSDP model and optimizers.
"""
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.io import TorchCheckpointIO

from . import fsdp_local
from . import state as _state
from .sharded import restore_into

RESTORE = "ftrun:restore"
_pending_rng = []  # the restored generators, for Checkpoint to put back before the first batch
FSDP_LOCAL = "ftrun_fsdp_local"  # a checkpoint's key for the FSDP local state (in place of its state dicts)
FSDP_MODES = ("local", "sharded")


def ckpt_path():
    """The ckpt_path for Trainer.fit: None when ftrun has nothing to restore."""
    client = _state.get_client()
    lv = client.list_versions()
    return RESTORE if lv["restore"] is not None or lv["committed"] else None


def _restored_checkpoint():
    """The Trainer checkpoint of the version ftrun restores; its generators wait for the first batch."""
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


class CheckpointIO(TorchCheckpointIO):
    """Loads "ftrun:restore" from ftrun; every other path as TorchCheckpointIO."""

    def load_checkpoint(self, path, map_location=None, weights_only=None):
        if str(path) != RESTORE:
            return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        return _restored_checkpoint()


def _load_fsdp(trainer, checkpoint):
    """The restored sharded model and optimizer states into the live FSDP model and optimizers, in
    place (what FSDPStrategy.load_checkpoint does for its own sharded directory)."""
    from lightning.pytorch.trainer.states import TrainerFn
    from torch.distributed.checkpoint import state_dict as dsd

    model = trainer.strategy.model
    saved_model = checkpoint.get("state_dict") or {}
    optimizers = trainer.strategy.optimizers if trainer.state.fn == TrainerFn.FITTING else []
    if FSDP_LOCAL in checkpoint:
        local = dict(checkpoint[FSDP_LOCAL])
        local["optimizers"] = local["optimizers"] if optimizers else []
        return fsdp_local.restore_local_state(model, optimizers, local, what="ftrun.lightning")
    saved_optims = checkpoint.get("optimizer_states") or []
    if optimizers and len(saved_optims) != len(optimizers):
        raise ValueError(f"ftrun.lightning: the restored version holds {len(saved_optims)} optimizer states, "
                         f"the strategy has {len(optimizers)} optimizers")
    if not optimizers:
        msd = dsd.get_model_state_dict(model)
        dsd.set_model_state_dict(model, restore_into(msd, saved_model))
    for opt, saved in zip(optimizers, saved_optims):
        msd, osd = dsd.get_state_dict(model, opt)
        dsd.set_state_dict(model, opt, model_state_dict=restore_into(msd, saved_model),
                           optim_state_dict=restore_into(osd, saved))


def _is_fsdp(strategy):
    from lightning.pytorch.strategies import FSDPStrategy

    return isinstance(strategy, FSDPStrategy)


def _take_fsdp_loads(strategy, mode):
    """Makes an FSDPStrategy load RESTORE from ftrun (it loads without a CheckpointIO)."""
    if not _is_fsdp(strategy) or getattr(strategy, "_ftrun_loads", False):
        return
    if mode == "sharded" and strategy._state_dict_type != "sharded":
        raise ValueError("ftrun.lightning: FSDPStrategy(state_dict_type='full') gathers the whole model on rank 0 "
                         "at every save; use state_dict_type='sharded' (every rank saves its own shards)")
    original = strategy.load_checkpoint

    def load_checkpoint(checkpoint_path, *args, **kwargs):
        if str(checkpoint_path) != RESTORE:
            return original(checkpoint_path, *args, **kwargs)
        checkpoint = _restored_checkpoint()
        _load_fsdp(strategy.lightning_module.trainer, checkpoint)
        return checkpoint

    strategy.load_checkpoint = load_checkpoint
    strategy._ftrun_loads = True


class Checkpoint(Callback):
    """Saves the Trainer's checkpoint through ftrun every `every` optimizer steps. overlap=True: the copy
    into the agent's memory runs beside training until the next optimizer step (ftrun.save's overlap: only
    when nothing but the optimizer writes the saved tensors; BatchNorm's running statistics do). Lightning
    runs a step's last micro-batch inside optimizer.step, so what it overlaps is the micro-batches before
    that one (gradient accumulation) and the dataloader's next batch."""

    def __init__(self, every=1, overlap=False, fsdp="local"):
        if int(every) < 1:
            raise ValueError(f"ftrun.lightning.Checkpoint: every must be >= 1, not {every!r}")
        if fsdp not in FSDP_MODES:
            raise ValueError(f"ftrun.lightning.Checkpoint: fsdp must be one of {FSDP_MODES}, not {fsdp!r}")
        self.every = int(every)
        self.overlap = bool(overlap)
        self.fsdp = fsdp
        self._saved = None

    def setup(self, trainer, pl_module, stage):
        _pending_rng.clear()  # (an earlier fit's, in the same process, ended before its first batch)
        _take_fsdp_loads(trainer.strategy, self.fsdp)

    def _dump(self, trainer):
        """The Trainer's checkpoint; under FSDPStrategy with fsdp="local", its model and optimizer states are
        the FSDP local state instead: the strategy's sharded state dicts are not made ("state_dict" and
        "optimizer_states" are left empty)."""
        strategy = trainer.strategy
        if self.fsdp != "local" or not _is_fsdp(strategy):
            return trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        strategy.lightning_module_state_dict = dict  # (instance attributes: the strategy's own come back below)
        strategy.optimizer_state = lambda optimizer: {}
        try:
            checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        finally:
            del strategy.lightning_module_state_dict, strategy.optimizer_state
        checkpoint[FSDP_LOCAL] = fsdp_local.local_state(strategy.model, strategy.optimizers)
        return checkpoint

    def on_train_start(self, trainer, pl_module):
        self._saved = trainer.global_step  # 0, or the restored step: saved already

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if _pending_rng:
            _state.set_rng_state(_pending_rng.pop())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if step == self._saved or step % self.every:
            return  # no optimizer step since the last save or the start (gradient accumulation)
        checkpoint = self._dump(trainer)
        _state.save(step, {"checkpoint": checkpoint, "rng": _state.rng_state()}, overlap=self.overlap)
        self._saved = step
