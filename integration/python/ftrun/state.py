"""ftrun.state: save and load whole PyTorch training states through ftrun.

A rank saves its state every step and, after a restart, loads the version the
agent restores::

    import ftrun

    resumed = ftrun.load()                     # None at a fresh start
    start = 0
    if resumed is not None:
        step, state = resumed
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])
        ftrun.set_rng_state(state["rng"])
        loader_pos = state["data_pos"]
        start = step + 1
    for step in range(start, steps):
        ...
        ftrun.save(step, {"model": model.state_dict(), "optim": optimizer.state_dict(),
                          "rng": ftrun.rng_state(), "data_pos": loader_pos})

What is stored where:

* `state` is any nesting of dicts (also OrderedDict, with a state_dict's
  ``_metadata``), lists, tuples (also namedtuples) and arbitrary picklable
  objects. Every dense torch tensor in it (CPU or CUDA, any dtype, also inside
  picklable objects) goes to the agent's store as one named buffer; its name is
  its path in the structure, e.g. ``model/layer.0.weight`` or
  ``optim/state/0/exp_avg`` ("/" and "%" inside keys are escaped as %2F, %25).
* Everything else - the structure, non-tensor leaves, and each tensor's dtype,
  shape, device, requires_grad and whether it was an nn.Parameter - is pickled
  into the version's user bytes.
* CPU contiguous tensors are handed over without a copy (a numpy view of their
  memory; bfloat16 as int16 bits with the binding's dtypes= override; dtypes
  numpy lacks, e.g. complex or float8, as raw bytes). A non-contiguous tensor
  or view is copied to a contiguous one first.
* CUDA tensors (on the current device) never pass through host staging:
  libftrun's CUDA path fingerprints their chunks on the GPU and copies only
  changed chunks, on a side stream, straight into the agent's store (the
  store is registered with CUDA slice by slice as copies reach it). The
  side stream waits for the current stream's work queued before save; the
  current stream's later work waits for the copies through a CUDA event,
  so save returns without synchronizing the device (it waits only for the
  fingerprints), and a kernel queued after save can never change the saved
  bytes. The copies' chunk ids are computed by a background thread; the
  next save or wait() sends them to the agent, and the tensors are kept
  alive until then. Non-contiguous CUDA tensors get a contiguous copy on the
  device first. Tensors on another device than the current one, a libftrun
  built without CUDA, or FTRUN_CUDA_STAGING=1 use reused pinned host
  buffers instead (a device-to-host copy and a device sync per save).
* load() rebuilds the same structure with the same dtypes and shapes; CPU
  tensors are views of the loaded buffers (torch.from_numpy, no extra copy);
  CUDA tensors go back to their device when it exists (else they stay on the
  CPU, with a warning), or where map_location says: each is checked on the
  host, then copied from the store straight into new CUDA memory
  (asynchronous copies, fenced before load returns).
* Tensors of 64 KiB or more are not even copied out of the agent's store:
  load() maps them copy-on-write (Client.load(map=True); chunk hashes are
  still checked), so a restore costs page-table updates instead of a copy
  into fresh memory, and load_state_dict then copies them once, into the
  model. Writing to a loaded tensor copies only the page written; the store
  never changes. Drop the loaded state once it is put back: while its
  tensors live the version stays pinned in the store, and the next save
  first gives them private copies of their remaining pages.
  FTRUN_LOAD_MAP=0 copies instead.

Rules that come from the store (ftrun::Client):

* A rank must save the same tensors - names, dtypes and shapes - at every save
  (the agent keeps the first layout). Keep the structure fixed: e.g. save
  after the first optimizer step, since torch optimizers create their state
  lazily. A changed layout raises ftrun.Error (FAILED_PRECONDITION) with a hint.
* Steps (versions) must increase for a rank; after a restart continue from
  load()'s step + 1.
* Tensors sharing memory (views of one storage) are saved and loaded as
  independent tensors; the same tensor object reached twice comes back as one
  object.
* Use either this module or the DeepSpeed engine (ftrun.deepspeed) or the
  low-level Client in one rank: they share the rank's version sequence.

Saving the same structure again: a save whose state has the structure of
the last one (the same containers, keys and kinds of leaves, and tensors of
the same type, dtype, shape, device, layout and requires_grad) reuses what
the last one packed: the tensors' names and metadata, the pickled structure,
and the buffers of tensors whose memory did not move (the state's own
parameters and optimizer state); only the leaves (numbers, RNG states, a
data-loader position, ...) are pickled again. Anything that differs is
detected (ftrun.state_reuse) and packs the state from scratch; either way
the bytes saved are the same. FTRUN_SAVE_CACHE=0 turns it off.

Save stall and the store's mapping: a save copies into extents of the agent's
store, which this process maps lazily, so until the process has touched a
page of the store once, writing it takes a page fault (~1 us per 4 KiB on
the development VM: a 416 MiB save took 0.15 s with 106k faults, 0.035 s
once its pages were mapped). After the first save, a background thread therefore maps in
(MADV_POPULATE_WRITE, Linux >= 5.14) every page of the store the agent has
already allocated (mincore), in 16 MiB slices, while training goes on; later
saves find their pages mapped. It never allocates store memory the agent has
not (store.prefault: false stays lazy). FTRUN_POPULATE_STORE=0 turns it off.

Sharded state dicts (torch 2.x: DTensor from FSDP2 fully_shard, ShardedTensor
from FSDP1's SHARDED_STATE_DICT): every rank saves only its local shards, with
the placement metadata to rebuild them; restore_into(target, state) copies a
loaded state into live sharded tensors in place (see ftrun.sharded).

The parts: ftrun.state_client (the client and settings), ftrun.state_pack
(structure -> skeleton and named buffers), ftrun.state_flat (the walk of a
structure, and its rebuild), ftrun.state_pickle (the tensor-aware pickler),
ftrun.state_bytes (a tensor's bytes for the binding), ftrun.state_reuse
(what a save keeps for the next), ftrun.state_unpack (back),
ftrun.store_populate (the store's mapping).
"""

import random

import numpy as np
import torch

from . import ddp_buckets, save_behind, state_client
from .state_client import _warn_once, configure, get_client
from .state_pack import _FORMAT_VERSION, _Packer
from .state_unpack import _Loaded, _load_version, load_maps  # noqa: F401  (_Loaded: ftrun.deepspeed, persisted)

from .sharded import restore_into, use_mesh

__all__ = ["save", "load", "wait", "rng_state", "set_rng_state", "get_client", "configure", "restore_into"]

_FORMAT = "ftrun.state"
_last_saved = None      # step of this process's last save


# --------------------------------------------------------------------------
# Public API


def save(step, state, *, wait=False, overlap=False):
    """Saves `state` as version `step` of this rank.

    state: any nesting of dicts, lists, tuples and picklable objects holding
    torch tensors (see the module docstring). Returns once the bytes are in
    the agent's memory (the save statistics dict of Client.save, and
    "tensors": how many tensors it saved). wait=True
    also waits until every rank has saved `step` (it is committed, so a
    restart restores it or a newer one). Raises ftrun.Error; e.g.
    FAILED_PRECONDITION when the tensor layout differs from the first save or
    the step does not increase, RESOURCE_EXHAUSTED when the store is full.

    CUDA tensors are copied from the device asynchronously (see the module
    docstring); by default the current stream's later work waits for those
    copies. overlap=True lets them overlap the next forward and backward
    pass: only torch optimizer steps (and the next save, and wait()) wait
    for them. With host tensors only, overlap=True returns once the state
    is packed, and the copy into the store runs on a background thread
    (ftrun.save_behind) until the next optimizer step, save, wait() or
    load() waits for it; it returns {"version", "overlapped": True}, and an
    error of the copy is raised there. Use it only when nothing but the
    optimizer writes the saved tensors between saves (BatchNorm's running
    statistics, for one, are written in the forward pass). Needs torch >= 2.0.
    """
    global _last_saved
    step = int(step)
    packer = _Packer()
    skeleton = packer.pack(state)
    stats = packer.save(get_client(), step, {
        "format": _FORMAT, "format_version": _FORMAT_VERSION, "step": step, "skeleton": skeleton,
        "torch": torch.__version__, "ddp": ddp_buckets.layouts_to_save(),
    }, overlap=overlap)
    stats["tensors"] = len(packer.metas)
    _last_saved = step
    if wait:
        _wait_committed(None)
    return stats


def load(version=None, map_location=None, *, device_mesh=None):
    """Loads a state saved by save(): returns (step, state), or None when
    there is nothing to load (a fresh start: no version committed).

    version: None loads the version the agent restores after a restart (the
    last committed one); an int loads that committed version.
    map_location (like torch.load's): None puts tensors back on the device
    they were saved from (CUDA when available, else CPU with a warning); a
    device or string puts all of them there; a dict maps saved device strings
    ('cuda:0') to new ones; a callable f(cpu_tensor, saved_device_str) returns
    the tensor to use.
    device_mesh: the DeviceMesh that loaded DTensors (torch 2.x sharded state
    dicts, saved as their local shards: ftrun.sharded) are rebuilt on; None:
    one of the saved layout over the default process group. To put a loaded
    sharded state back into a live model and optimizer in place, use
    ftrun.restore_into(target, state).
    """
    loaded = _load_version(get_client(), version, _FORMAT, map_location)
    if loaded is None:
        return None
    with use_mesh(device_mesh):
        state = loaded.unpack(loaded.payload["skeleton"], map_location)
    ddp_buckets.restore(loaded.payload.get("ddp"))
    return loaded.payload["step"], state


def wait(timeout=None):
    """Blocks until this process's last save is committed (every rank saved
    it). timeout in seconds (None: 60 s); ftrun.Error TIMEOUT when it passes.
    Returns at once when nothing was saved."""
    _wait_committed(timeout)


def _wait_committed(timeout):
    save_behind.finish()
    client = get_client()
    client.wait()
    state_client._in_flight = []  # the copies landed
    if _last_saved is not None:
        ms = 60000 if timeout is None else max(0, int(timeout * 1000))
        client.wait_committed(_last_saved, timeout_ms=ms)


def rng_state():
    """The random generators' states as a dict: python (random), numpy (the
    legacy global np.random), torch (CPU) and cuda (every device; only when
    CUDA is available). Save it with ftrun.save; restore with set_rng_state."""
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state):
    """Restores generators from a dict made by rng_state(); missing entries are
    left alone. CUDA states are restored only when CUDA is available (a
    different device count restores the devices both have)."""
    if "python" in state:
        random.setstate(_as_python_state(state["python"]))
    if "numpy" in state:
        np.random.set_state(state["numpy"])
    if "torch" in state:
        torch.set_rng_state(state["torch"].detach().cpu().to(torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        states = [s.detach().cpu().to(torch.uint8) for s in state["cuda"]]
        n = min(len(states), torch.cuda.device_count())
        if n != len(states):
            _warn_once("cuda-rng", f"ftrun.set_rng_state: {len(states)} CUDA generator states saved, "
                       f"{torch.cuda.device_count()} devices here; restoring {n}")
        for i in range(n):
            torch.cuda.set_rng_state(states[i], i)


def _as_python_state(s):
    # random.setstate wants tuples; a state that went through JSON-like code may hold lists.
    if isinstance(s, list):
        s = tuple(s)
    if len(s) >= 2 and isinstance(s[1], list):
        s = (s[0], tuple(s[1])) + tuple(s[2:])
    return s
