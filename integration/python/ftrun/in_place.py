"""ftrun.in_place: ftrun.restore puts the committed version back into live objects, in place.

    start = ftrun.restore(model=model, optim=opt, sched=scheduler)   # 0 on a fresh start

Each keyword names a key of the state that ftrun.save saved (a dict) and the
object it goes back into:

* a torch.nn.Module: its parameters and buffers are copied into in place,
  and its parameters' gradients dropped (a survivor's may hold those of the
  step its generation abandoned, which the next backward would add to);
  those on the CPU (contiguous, of the saved dtype and shape) straight from
  the agent's store, each chunk's hash checked as it is copied (one pass
  over the bytes; a chunk the tensor already holds, e.g. a survivor's
  parameters before its optimizer step, is hashed and left alone), the
  others from copy-on-write mappings of the store (a CUDA parameter gets one
  host-to-device copy);
* a torch.optim.Optimizer: its hyperparameters come back, and every state
  tensor it already has (a survivor's, under @ftrun.resilient) is copied into
  in place, the same way; state it does not have yet (a fresh optimizer:
  torch creates it lazily) adopts the loaded tensor itself, with no copy
  when dtype and device match (written pages are copied on write; the next
  save gives it private pages);
* anything else with load_state_dict (an LR scheduler, a GradScaler) gets
  load_state_dict(saved).

The saved "rng" entry (ftrun.rng_state()) restores the random generators
unless rng=False. extra: a dict that receives every other saved entry (a
data-loader position, ...). Returns the step to go on from: the restored
version's step + 1, or 0 when there is nothing to restore. A version found
corrupted raises, and the tensors then hold part of it (restore again).
"""

import pickle

import torch

from . import ddp_buckets
from . import sharded as _sharded
from .state import set_rng_state
from .state_client import get_client
from .state_unpack import _load_version, payload_metas, structure
from .sharded import use_mesh

_FORMAT = "ftrun.state"


def restore(*, version=None, rng=True, extra=None, **targets):
    loaded = _load_version(get_client(), version, _FORMAT, "cpu", into=_Into(targets))
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
    ddp_buckets.restore(loaded.payload.get("ddp"))
    if extra is not None:
        extra.update({k: v for k, v in state.items() if k not in targets})
    return int(step) + 1


def _restore_one(key, target, saved):
    if isinstance(target, torch.nn.Module):
        target.load_state_dict(saved)  # copy_ into every parameter and buffer
        # A survivor's parameters may hold the gradients of the step its generation abandoned: the next
        # backward pass would add to them. A restored module is as a fresh process loads it: no gradients.
        for p in target.parameters():
            p.grad = None
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


# --------------------------------------------------------------------------
# Which live tensors the saved ones are read straight into


class _Ref:
    def __init__(self, idx):
        self.idx = idx


def _ref(pid):
    """What stands for a tensor in the saved structure _Into reads: a _Ref (None for a sharded one)."""
    if isinstance(pid, tuple) and len(pid) == 2 and pid[0] == "ftrun.tensor":
        return _Ref(pid[1])
    if isinstance(pid, tuple) and pid and pid[0] in _sharded.PIDS:
        return None
    raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")


class _Into:
    """For Client.load(into=): given the version's user bytes, the live CPU
    tensors of the targets that saved tensors go straight into, as writable
    byte views (.dests: saved name -> live tensor, given back by the unpack
    in their place, so load_state_dict's copy_ of a tensor onto itself does
    nothing). A tensor qualifies when it is contiguous, of the saved dtype and
    shape, and no other target entry shares its memory. Anything unexpected
    in the version: nothing goes in place (the usual unpack reports it)."""

    def __init__(self, targets):
        self.targets = targets
        self.payload = None
        self.dests = {}

    def __call__(self, user_bytes):
        try:
            self.payload = pickle.loads(user_bytes)
            metas = payload_metas(self.payload)
            state = structure(self.payload["skeleton"], _ref)
        except Exception:  # noqa: BLE001 - not ours, or not unpicklable without its tensors
            return {}
        if not isinstance(state, dict):
            return {}
        pairs = [p for key, target in self.targets.items() for p in _live_pairs(target, state.get(key))]
        shared = {}
        for _, live in pairs:
            shared[live.data_ptr()] = shared.get(live.data_ptr(), 0) + 1
        for ref, live in pairs:
            meta = metas[ref.idx] if 0 <= ref.idx < len(metas) else None
            if meta is not None and shared[live.data_ptr()] == 1 and _fits(live, meta):
                self.dests[meta["name"]] = live
        out = {}
        for name, t in list(self.dests.items()):
            try:
                out[name] = t.detach().view(-1).view(torch.uint8).numpy()
            except (RuntimeError, TypeError, ValueError):  # (a tensor numpy cannot view: the usual copy)
                del self.dests[name]
        return out


def _live_pairs(target, saved):
    """(saved _Ref, live tensor) for every saved tensor of `target` it already has."""
    if not isinstance(saved, dict):
        return
    if isinstance(target, torch.nn.Module):
        live = target.state_dict(keep_vars=True)
        for k, ref in saved.items():
            if isinstance(ref, _Ref) and torch.is_tensor(live.get(k)):
                yield ref, live[k]
    elif isinstance(target, torch.optim.Optimizer):
        groups, state = saved.get("param_groups"), saved.get("state")
        if not isinstance(groups, list) or not isinstance(state, dict) or len(groups) != len(target.param_groups):
            return
        by_id = {}
        for g, s in zip(target.param_groups, groups):
            if not isinstance(s, dict) or len(s.get("params", ())) != len(g["params"]):
                return
            by_id.update(zip(s["params"], g["params"]))
        for pid, entries in state.items():
            have = target.state.get(by_id[pid]) if pid in by_id else None
            if isinstance(have, dict) and isinstance(entries, dict):
                for name, ref in entries.items():
                    if isinstance(ref, _Ref) and torch.is_tensor(have.get(name)):
                        yield ref, have[name]


def _fits(t, meta):
    return (t.layout == torch.strided and t.device.type == "cpu" and t.numel() > 0 and t.is_contiguous()
            and str(t.dtype) == "torch." + str(meta.get("dtype")) and list(t.shape) == list(meta.get("shape", ())))
