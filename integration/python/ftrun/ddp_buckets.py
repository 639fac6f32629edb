"""ftrun.ddp_buckets: DistributedDataParallel's gradient buckets kept with the
saved state, so that a restored run reduces its gradients exactly as the run
that saved it did, and ends bit-identical to it.

Why: DDP's reducer copies gradients into flat buckets and all-reduces each
bucket. A sum across 3 or more ranks (gloo's ring, NCCL's) adds each element
in an order that depends on where the element sits in its bucket, so the
bucket layout decides the last bits of every reduced gradient. A new DDP
starts with one layout (every parameter in one bucket, in registration order,
unless find_unused_parameters) and, after its first synchronized backward
pass, rebuilds its buckets once, in the order gradients became ready. A run
restored from step k builds a new DDP, so its first step (k + 1) reduced in
the start layout while the run that saved step k reduced in the rebuilt one:
the losses and weights drift from there on, even though every saved byte came
back exactly.

What ftrun does, with nothing for the user to write:
* ftrun.save finds the process's DDP modules (once, and again after a load),
  reads each one's rebuilt layout and saves it in the version's metadata. If
  the rebuild is still pending at a save (the save right after the first
  step), it runs it then: DDP would run it at the start of the next forward
  pass, with the same inputs and the same result, the bucket indices
  broadcast from rank 0 as always.
* ftrun.load (and ftrun.restore) hand the saved layouts to the next DDP built
  over parameters of the same shapes (the reducer is constructed with the
  rebuilt buckets instead of the start ones), and to a DDP already built that
  has not run yet (its reducer is built again, the way DDP's own unpickling
  does, with its Python comm hooks registered again).
A DDP with find_unused_parameters=True and static_graph=False never rebuilds
its buckets and needs nothing. A DDP with a built-in comm hook
(register_builtin_comm_hook) or mixed_precision that exists before the load
cannot be rebuilt here: ftrun warns, and its first restored step reduces in
DDP's start layout. FTRUN_DDP_BUCKETS=0 turns all of this off.
"""

import contextlib
import gc
import os
import warnings
import weakref

import torch.distributed as dist

_found = weakref.WeakSet()              # the DDP modules ftrun.save looks at
_layouts = weakref.WeakKeyDictionary()  # ddp -> its saved layout, once known
_scan = True                            # look for DDP modules at the next save
_pending = []                           # restored layouts not yet given to a DDP


def _enabled():
    return os.environ.get("FTRUN_DDP_BUCKETS", "1") != "0"


def _live_ddps():
    # type(), not isinstance: some objects warn when their __class__ is read.
    from torch.nn.parallel import DistributedDataParallel as cls

    return [obj for obj in gc.get_objects() if issubclass(type(obj), cls)]


def _signature(params):
    return [[list(p.shape), str(p.dtype)] for p in params]


def _parse(indices):
    # DDP's logging data: "5 4 3 2, 1 0" (buckets in reduction order).
    return [[int(i) for i in bucket.split()] for bucket in indices.split(",")]


def _never_rebuilds(ddp):
    return ddp.find_unused_parameters and not ddp.static_graph


def _rebuilt_layout(ddp):
    """The layout ddp rebuilt, as {"params", "buckets"}; None while unknown."""
    data = ddp._get_ddp_logging_data()
    if not data.get("has_rebuilt_buckets"):
        # Pending: the first synchronized backward pass recorded its order and
        # the next forward would rebuild; no forward ran since, so do it now.
        if ddp.reducer._rebuild_buckets():
            ddp._has_rebuilt_buckets = True
        if not getattr(ddp, "_has_rebuilt_buckets", False):
            return None
        ddp.logger.set_runtime_stats_and_log()  # puts the layout in the logging data
        data = ddp._get_ddp_logging_data()
    indices = data.get("rebuilt_per_bucket_param_indices")
    if not indices:
        return None
    params, _ = ddp._build_params_for_reducer()
    return {"params": _signature(params), "buckets": _parse(indices)}


def layouts_to_save():
    """For ftrun.save: the rebuilt bucket layouts of this process's DDP modules."""
    global _scan
    if not _enabled() or not (dist.is_available() and dist.is_initialized()):
        return []  # (no process group, no DDP)
    if _scan:  # ~0.1 s for 200k live Python objects, once per process and load
        _found.update(_live_ddps())
        _scan = False
    _give_up_pending()
    out = []
    for ddp in list(_found):
        if ddp not in _layouts and not _never_rebuilds(ddp):
            try:
                layout = _rebuilt_layout(ddp)
            except RuntimeError:  # a DDP left over from a torn-down process group
                _found.discard(ddp)
                continue
            if layout is not None:
                _layouts[ddp] = layout
        if ddp in _layouts:
            out.append(_layouts[ddp])
    return out


def _give_up_pending():
    # A step ran since the load: a layout no DDP took will not be taken.
    if _pending:
        warnings.warn(f"ftrun: {len(_pending)} DistributedDataParallel bucket layout(s) of the restored "
                      "version matched no DDP module (other parameter shapes?): the first step after the "
                      "restore reduced gradients in DDP's start layout and may differ in the last bits",
                      stacklevel=3)
        _pending.clear()
    _set_override(False)


def restore(layouts):
    """For ftrun.load: gives the saved layouts to the DDP modules about to run."""
    global _scan
    _scan = True  # the DDP modules of the restored run are new ones
    _pending[:] = [layout for layout in (layouts or []) if _valid(layout)] if _enabled() else []
    if not _pending:
        return
    _set_override(True)
    for obj in _live_ddps():
        if not getattr(obj, "_lazy_init_ran", True):
            params, _ = obj._build_params_for_reducer()
            layout = _take(params)
            if layout is not None:
                _rebuild_reducer(obj, layout)
    if not _pending:
        _set_override(False)


def _valid(layout):
    # Every parameter index exactly once: anything else would reach the reducer's asserts.
    try:
        n = len(layout["params"])
        flat = sorted(int(i) for bucket in layout["buckets"] for i in bucket)
        ok = flat == list(range(n)) and all(len(bucket) for bucket in layout["buckets"])
    except (KeyError, TypeError, ValueError):
        ok = False
    if not ok:
        warnings.warn(f"ftrun: ignoring a malformed DistributedDataParallel bucket layout in the restored "
                      f"version (expected every parameter index once): {str(layout)[:200]}", stacklevel=4)
    return ok


def _take(params):
    sig = _signature(params)
    for i, layout in enumerate(_pending):
        if layout["params"] == sig:
            return _pending.pop(i)
    return None


_original = None


def _assign(tensors, bucket_size, *args, **kwargs):
    # dist._compute_bucket_assignment_by_size while restored layouts wait: a
    # DDP under construction over matching parameters gets its saved buckets.
    # DDP reverses the list it gets, so hand it over reversed.
    layout = None if (args[1:] or kwargs.get("tensor_indices")) else _take(tensors)
    if layout is None:
        return _original(tensors, bucket_size, *args, **kwargs)
    if not _pending:
        _set_override(False)
    buckets = layout["buckets"]
    return list(reversed(buckets)), [max(bucket_size)] * len(buckets)


def _set_override(on):
    global _original
    if on and _original is None:
        _original = dist._compute_bucket_assignment_by_size
        dist._compute_bucket_assignment_by_size = _assign
    elif not on and _original is not None:
        dist._compute_bucket_assignment_by_size = _original
        _original = None


def _rebuild_reducer(ddp, layout):
    """Builds an existing, not yet run DDP's reducer again with `layout`, as
    DDP.__setstate__ does. False (with a warning) when it cannot."""
    hooks = list(getattr(ddp, "_comm_hooks", []))
    builtin = ddp._get_ddp_logging_data().get("comm_hook") and not hooks
    if builtin or ddp.mixed_precision is not None:
        warnings.warn("ftrun: this DistributedDataParallel was built before ftrun.load with "
                      f"{'a built-in comm hook' if builtin else 'mixed_precision'}; its reducer cannot be "
                      "rebuilt with the saved gradient buckets, so the first step after the restore may "
                      "differ in the last bits. Build the DDP after ftrun.load to keep it exact.",
                      stacklevel=4)
        return False
    params, sparse = ddp._build_params_for_reducer()
    names = ddp._build_debug_param_to_name_mapping(params)
    with _only(layout):
        ddp._ddp_init_helper(params, sparse, names, ddp.static_graph)
    if ddp.static_graph:
        ddp.reducer._set_static_graph()
        ddp.logger._set_static_graph()
    for hook, state in hooks:
        dist._register_comm_hook(ddp.reducer, state, hook)
    return True


@contextlib.contextmanager
def _only(layout):
    saved = list(_pending)
    _pending[:] = [layout]
    _set_override(True)
    try:
        yield
    finally:
        _pending[:] = saved
        _set_override(bool(saved))
