"""ftrun.accelerate: Hugging Face accelerate's save_state / load_state with
ftrun as the storage, one line each where the loop calls accelerate's.

    import ftrun.accelerate as fta

    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    step = fta.load_state(accelerator)          # instead of accelerator.load_state(dir); None on a fresh start
    ...
    fta.save_state(accelerator, step)           # instead of accelerator.save_state(dir)

save_state(accelerator, step) saves, on every rank, as ftrun version `step`,
what accelerator.save_state writes to its directory: every prepared
model's, optimizer's and scheduler's state dict, the dataloaders' states
(a stateful dataloader's state_dict, accelerate's seedable sampler), the
GradScaler's, the objects given to accelerator.register_for_checkpointing,
accelerator.step (the gradient accumulation counter) and the random
generators. load_state(accelerator) puts the version a restart restores back
into the same objects, as accelerator.load_state does, and returns its step
(None when nothing was saved yet). Resuming mid-epoch at the same batch needs
what accelerate needs for it: DataLoaderConfiguration(use_stateful_dataloader=
True), or use_seedable_sampler with skip_first_batches.

Every rank saves its own copy (accelerate writes most files on the main
process only and needs a shared filesystem; ftrun keeps each rank's state in
its node's memory and on peers). A DDP that accelerator.prepare built gets
the saved gradient buckets at load (ftrun.ddp_buckets), so a restored run is
bit-identical to one without failures.

Importing this module wraps DataLoader._get_iterator (torch's and
torchdata's) to record each loader's shuffling generator as an epoch's
iterator is made: what a restore mid-epoch needs to draw the same order
(docs/architecture.md, "The data order across a restart").

Distributed types: no distribution, and DDP on CPUs or GPUs (MULTI_CPU,
MULTI_GPU, ...). FSDP and DeepSpeed keep their states in their own formats:
load_state and save_state refuse them and name what to use instead
(ftrun.save with torch.distributed.checkpoint.state_dict's sharded state dicts;
ftrun.deepspeed).
"""
import torch

from . import state as _state
from .state_client import _ftrun_error

__all__ = ["save_state", "load_state"]

_FORMAT = "ftrun.accelerate"


def _check(accelerator, what):
    from accelerate.utils import DistributedType

    kind = accelerator.distributed_type
    if kind == DistributedType.FSDP:
        raise _ftrun_error(
            "FAILED_PRECONDITION", f"ftrun.accelerate.{what}: FSDP models keep sharded state; save them with "
            "ftrun.save(step, get_state_dict(model, optimizer)) (the README's FSDP section)")
    if kind in (DistributedType.DEEPSPEED, DistributedType.MEGATRON_LM, DistributedType.XLA):
        raise _ftrun_error(
            "FAILED_PRECONDITION", f"ftrun.accelerate.{what}: accelerate's {kind.value} engine keeps its own "
            "checkpoint format; for DeepSpeed use ftrun.deepspeed (the README's DeepSpeed section)")


def _generators(loader):
    """The torch.Generators a DataLoader draws from: its own, and its samplers' (nested batch samplers)."""
    found, obj = [], loader
    for _ in range(5):
        g = getattr(obj, "generator", None)
        if isinstance(g, torch.Generator) and all(g is not f for f in found):
            found.append(g)
        obj = getattr(obj, "batch_sampler", None) or getattr(obj, "sampler", None)
        if obj is None:
            break
    return found


def _record_iterator_starts():
    """Wraps DataLoader._get_iterator (torch's and torchdata's StatefulDataLoader's) to record, on the
    loader, its generators' states just before each new iterator draws from them (its base seed, then
    the epoch's order): a restore mid-epoch puts them back there."""
    classes = [torch.utils.data.DataLoader]
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader

        classes.append(StatefulDataLoader)
    except ImportError:
        pass
    for cls in classes:
        original = cls.__dict__.get("_get_iterator")
        if original is None or getattr(original, "_ftrun_records", False):
            continue

        def _get_iterator(self, _original=original):
            self._ftrun_before_iterator = {id(g): g.get_state() for g in _generators(self)}
            return _original(self)

        _get_iterator._ftrun_records = True
        cls._get_iterator = _get_iterator


def _dataloader_states(accelerator):
    """Per prepared dataloader: a stateful loader's state_dict, accelerate's seedable sampler, its epoch
    and its shuffling generator, as the next batch needs them (see _load_dataloader)."""
    from accelerate.data_loader import IterableDatasetShard, SeedableRandomSampler

    states = []
    for loader in accelerator._dataloaders:
        entry = {"iteration": getattr(loader, "iteration", None),
                 "active": accelerator.gradient_state.active_dataloader is loader,
                 "finished": bool(getattr(loader, "end_of_dataloader", False))}
        if isinstance(loader.dataset, IterableDatasetShard):
            sampler = loader.get_sampler()
            if isinstance(sampler, SeedableRandomSampler):
                entry["sampler"] = sampler
        if getattr(loader, "use_stateful_dataloader", False):
            entry["state"] = loader.state_dict()
        generator = getattr(loader, "synchronized_generator", None)
        if generator is not None:
            entry["generator"] = generator.get_state()
            base = getattr(loader, "base_dataloader", loader)
            entry["generator_epoch_start"] = getattr(base, "_ftrun_before_iterator", {}).get(id(generator))
        states.append(entry)
    return states


def _load_dataloader(loader, entry):
    """A dataloader as its saved entry says, so that its next batch is the one the saving run took next.

    Saved mid-epoch (yielding, not the epoch's last batch): the same epoch number and the stateful
    loader's position; the generator goes back to where it was when the epoch's iterator was made, and
    that iterator is made again now (drawing its base seed as the saving run did), so its first batch
    draws the epoch's order again and skips what was yielded. The random generators that ftrun.save
    keeps are put back after this (load_state), so a base seed drawn from torch's global generator
    shifts nothing. Saved at the epoch's last batch, or between epochs: the next epoch from its start,
    with the generator as saved (a finished state loaded into a stateful loader would make it start two
    iterators, drawing twice)."""
    if "sampler" in entry:
        loader.set_sampler(entry["sampler"])
    mid_epoch = entry.get("active") and not entry.get("finished")
    base = getattr(loader, "base_dataloader", loader)
    if "state" in entry:
        base.load_state_dict(entry["state"] if mid_epoch else {})
    if entry.get("iteration") is not None:
        loader.iteration = entry["iteration"] + (1 if entry.get("active") and entry.get("finished") else 0)
    generator = getattr(loader, "synchronized_generator", None)
    start = entry.get("generator_epoch_start")
    if generator is not None and entry.get("generator") is not None:
        generator.set_state(start if mid_epoch and start is not None else entry["generator"])
    if mid_epoch and "state" in entry:
        base.state_dict()  # makes the epoch's iterator now, at the saved position; its first __iter__ takes it


def save_state(accelerator, step):
    """What accelerator.save_state holds, as ftrun version `step` of this rank (see the module docstring)."""
    _check(accelerator, "save_state")
    _state.save(step, {
        "format": _FORMAT,
        "models": [m.state_dict() for m in accelerator._models],
        "optimizers": [o.state_dict() for o in accelerator._optimizers],
        "schedulers": [s.state_dict() for s in accelerator._schedulers],
        "dataloaders": _dataloader_states(accelerator),
        "scaler": accelerator.scaler.state_dict() if accelerator.scaler is not None else None,
        "custom": [obj.state_dict() for obj in accelerator._custom_objects],
        "accelerator_step": accelerator.step,
        "rng": _state.rng_state(),
    })


def _expect_same_count(state, key, objects, what):
    saved = state.get(key) or []
    if len(saved) != len(objects):
        raise _ftrun_error(
            "FAILED_PRECONDITION", f"ftrun.accelerate.load_state: the saved version holds {len(saved)} {what}, "
            f"this accelerator has {len(objects)} prepared (prepare the same objects, in the same order, "
            "before load_state)")
    return saved


def load_state(accelerator, version=None):
    """Puts the version a restart restores (or `version`) back into the
    accelerator's prepared objects and generators; returns its step, or None
    when nothing is saved yet. Call it after accelerator.prepare (and
    register_for_checkpointing), before the first step."""
    _check(accelerator, "load_state")
    loaded = _state.load(version)
    if loaded is None:
        return None
    step, state = loaded
    if not isinstance(state, dict) or state.get("format") != _FORMAT:
        raise _ftrun_error("INVALID_ARGUMENT", f"ftrun.accelerate.load_state: version {step} was not "
                           "saved by ftrun.accelerate.save_state")
    for model, sd in zip(accelerator._models, _expect_same_count(state, "models", accelerator._models, "models")):
        model.load_state_dict(sd)
    for opt, sd in zip(accelerator._optimizers,
                       _expect_same_count(state, "optimizers", accelerator._optimizers, "optimizers")):
        opt.load_state_dict(sd)
    for sched, sd in zip(accelerator._schedulers,
                         _expect_same_count(state, "schedulers", accelerator._schedulers, "schedulers")):
        sched.load_state_dict(sd)
    for loader, entry in zip(accelerator._dataloaders,
                             _expect_same_count(state, "dataloaders", accelerator._dataloaders, "dataloaders")):
        _load_dataloader(loader, entry)
    if state.get("scaler") is not None and accelerator.scaler is not None:
        accelerator.scaler.load_state_dict(state["scaler"])
    for obj, sd in zip(accelerator._custom_objects,
                       _expect_same_count(state, "custom", accelerator._custom_objects,
                                          "objects registered for checkpointing")):
        obj.load_state_dict(sd)
    accelerator.step = state["accelerator_step"]
    _state.set_rng_state(state["rng"])
    return step


_record_iterator_starts()  # at import: before any dataloader makes its first iterator
