"""ftrun.in_place: ftrun.restore puts the committed version back into live objects, in place.

    start = ftrun.restore(model=model, optim=opt, sched=scheduler)   # 0 on a fresh start

Each keyword names a key of the state that ftrun.save saved (a dict) and the
object it goes back into:

* a torch.nn.Module: its parameters and buffers are copied into in place,
  straight from the agent's store (the loaded tensors are copy-on-write
  mappings of the store: one copy per byte, chunk hashes checked), also
  across devices (a CUDA parameter gets one host-to-device copy);
* a torch.optim.Optimizer: its hyperparameters come back, and every state
  tensor it already has (a survivor's, under @ftrun.resilient) is copied into
  in place; state it does not have yet (a fresh optimizer: torch creates it
  lazily) adopts the loaded tensor itself, with no copy when dtype and
  device match (written pages are copied on write; the next save gives it
  private pages);
* anything else with load_state_dict (an LR scheduler, a GradScaler) gets
  load_state_dict(saved).

The saved "rng" entry (ftrun.rng_state()) restores the random generators
unless rng=False. extra: a dict that receives every other saved entry (a
data-loader position, ...). Returns the step to go on from: the restored
version's step + 1, or 0 when there is nothing to restore.
"""

import torch

from .state import set_rng_state
from .state_client import get_client
from .state_unpack import _load_version
from .sharded import use_mesh

_FORMAT = "ftrun.state"


def restore(*, version=None, rng=True, extra=None, **targets):
    loaded = _load_version(get_client(), version, _FORMAT, "cpu")
    if loaded is None:
        return 0
    with use_mesh(None):
        state = loaded.unpack(loaded.payload["skeleton"], "cpu")
    step = loaded.payload["step"]
    if not isinstance(state, dict):
        raise ValueError(f"ftrun.restore: version {step} holds a {type(state).__name__}, not the dict of named "
                         "entries it restores from (save a dict: {'model': ..., 'optim': ...})")
    missing = [k for k in targets if k not in state]
    if missing:
        raise KeyError(f"ftrun.restore: version {step} has no entr{'y' if len(missing) == 1 else 'ies'} "
                       f"{', '.join(map(repr, missing))} (it has {', '.join(map(repr, sorted(state)))})")
    with torch.no_grad():
        for key, target in targets.items():
            _restore_one(key, target, state[key])
    if rng and "rng" in state:
        set_rng_state(state["rng"])
    if extra is not None:
        extra.update({k: v for k, v in state.items() if k not in targets})
    return int(step) + 1


def _restore_one(key, target, saved):
    if isinstance(target, torch.nn.Module):
        target.load_state_dict(saved)  # copy_ into every parameter and buffer
    elif isinstance(target, torch.optim.Optimizer):
        _restore_optimizer(key, target, saved)
    elif hasattr(target, "load_state_dict"):
        target.load_state_dict(saved)
    else:
        raise TypeError(f"ftrun.restore: {key}= is a {type(target).__name__}: expected a module, an optimizer "
                        "or an object with load_state_dict")


def _restore_optimizer(key, opt, saved):
    groups, saved_groups = opt.param_groups, saved.get("param_groups")
    if saved_groups is None or "state" not in saved:
        raise ValueError(f"ftrun.restore: {key}: the saved entry is not an optimizer's state_dict()")
    if len(groups) != len(saved_groups) or any(len(g["params"]) != len(s["params"])
                                               for g, s in zip(groups, saved_groups)):
        raise ValueError(f"ftrun.restore: {key}: the optimizer has {[len(g['params']) for g in groups]} "
                         f"parameters per group, the saved one {[len(s['params']) for s in saved_groups]}")
    by_id = {}
    for g, s in zip(groups, saved_groups):
        by_id.update(zip(s["params"], g["params"]))
        g.update({k: v for k, v in s.items() if k != "params"})
    restored = {}
    for pid, entries in saved["state"].items():
        p = by_id[pid]
        have = opt.state.get(p) or {}
        now = {}
        for name, value in entries.items():
            if torch.is_tensor(value):
                value = _cast(p, name, value)
                cur = have.get(name)
                if (torch.is_tensor(cur) and cur.shape == value.shape and cur.dtype == value.dtype
                        and cur.device == value.device and cur.data_ptr() != value.data_ptr()):
                    cur.copy_(value)
                    value = cur
            now[name] = value
        restored[p] = now
    opt.state.clear()  # (the same dict: whoever holds it sees the restored state)
    opt.state.update(restored)


def _cast(p, name, value):
    """As torch.optim.Optimizer.load_state_dict casts: floating state to the
    parameter's dtype and device, 'step' left as it is."""
    if name == "step":
        return value
    if value.is_floating_point() and p.is_floating_point():
        return value.to(dtype=p.dtype, device=p.device)
    return value.to(device=p.device)
