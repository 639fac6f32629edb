"""What a save keeps for the next one (ftrun.state_pack): per pack prefix,
the last structure packed - its trace, its tensors' signatures, names and
metadata, the pickled trace - and the buffers of its tensors whose memory
stayed put. A save whose structure is the same is packed from it; anything
different is detected, never assumed:

* the trace (ftrun.state_flat) holds every container's type and keys and
  every leaf's kind; equal traces are equal structures;
* each tensor's signature is its type (Tensor or Parameter), dtype, shape,
  device, layout and requires_grad: what its name, metadata and encoding
  follow from;
* a buffer is reused only for a tensor at the same address with the same
  strides as when the buffer was made, and without a lazy conjugate or
  negative bit. The buffer holds that memory alive, so the same address is
  the same memory. A buffer is kept only for a tensor whose address did not
  change since the save before (the state's own parameters and optimizer
  state): what is copied anew for every save is not kept alive between
  saves.

One process, one entry per prefix (ftrun.save uses ""; ftrun.deepspeed one
per file). Every load drops them all (state_unpack._load_version): a
restored state's tensors are new ones. FTRUN_SAVE_CACHE=0 turns it off.
"""

import os
import pickle

import torch

from . import _ftrun

_entries = {}  # prefix -> Entry
_COMPLEX = tuple(getattr(torch, n) for n in ("complex32", "complex64", "complex128") if hasattr(torch, n))
stats = {"hits": 0, "misses": 0}  # lookups of this process


class Entry:
    """One packed structure. views[k]: (address, strides, buffer, whether it is a
    buffer of the CUDA save path) of tensor k when its buffer is kept, else
    None; ptrs[k]: the address tensor k had at the last save; kept: the
    names of the kept buffers."""

    __slots__ = ("trace", "start", "tree", "names", "metas", "mode", "dtypes", "sigs", "views", "ptrs", "kept",
                 "_metas_pickle", "_sorted")

    def __init__(self, flat, start, tree, names, metas, mode, dtypes):
        self.trace = flat.trace
        self.start = start  # how many tensors the version held before this structure's
        self.tree = tree
        self.names = names
        self.metas = metas
        self.mode = mode  # the packer's CUDA device decision, when the structure has CUDA tensors
        self.dtypes = dtypes
        self.sigs = signatures(flat.tensors)
        self.views = [None] * len(flat.tensors)
        self.ptrs = [t.data_ptr() for t in flat.tensors]
        self.kept = frozenset()  # the names of the kept buffers
        self._metas_pickle = None
        self._sorted = None

    def sorted_names(self):
        if self._sorted is None:
            self._sorted = sorted(self.names)
        return self._sorted

    def metas_pickle(self):
        if self._metas_pickle is None:
            self._metas_pickle = pickle.dumps(self.metas, protocol=4)
        return self._metas_pickle


def signatures(tensors):
    """Each tensor's (type, dtype, shape, device, layout, requires_grad)."""
    return _ftrun.signatures(tensors)


def enabled():
    return os.environ.get("FTRUN_SAVE_CACHE", "1") != "0"


def keep(prefix, entry):
    _entries[prefix] = entry


def lookup(packer, flat, prefix):
    """None when flat's structure or tensors differ from the last one packed
    under prefix (or nothing was kept); else (entry, buffers, fresh): the
    entry to pack flat from, buffers[k] tensor k's kept buffer (None when it
    must be made again), fresh the (k, address) pairs of those."""
    found = _match(packer, flat, prefix)
    stats["misses" if found is None else "hits"] += 1
    return found


def _match(packer, flat, prefix):
    entry = _entries.get(prefix) if packer.reuse else None
    if entry is None or not enabled():
        return None
    if entry.trace != flat.trace or entry.start != len(packer.metas):
        return None
    if packer._used and not packer._used.isdisjoint(entry.names):
        return None  # (a name another structure of this version took)
    if packer._index and any(id(t) in packer._index for t in flat.tensors):
        return None
    if entry.mode is not None and entry.mode != packer.device_mode():
        return None
    try:
        got = _ftrun.reusable(flat.tensors, entry.sigs, entry.views, _COMPLEX)
    except RuntimeError:  # a tensor without strided sizes (nested): not one of ours
        return None
    return None if got is None else (entry, got[0], got[1])


def forget():
    """Drops every entry (and the buffers they keep alive)."""
    _entries.clear()
