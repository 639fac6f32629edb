"""Packing a training state for the store: a structure of dicts, lists,
tuples and picklable objects -> a skeleton (everything but the tensors,
which it names by index) and one named buffer per dense tensor
(ftrun.state's docstring says what goes where). _Packer collects the
buffers of one version and saves them; ftrun.state_unpack reads them back.

The skeleton (format 2) is the state flattened (ftrun.state_flat): its
trace and tensor indices, pickled once and kept while the structure stays
the same, and its leaves, pickled at every save. A save whose trace and
tensors (type, dtype, shape, device, layout, requires_grad) equal the last
save's of the same prefix reuses the pickled trace, the tensors' names and
metadata, and the buffers of tensors whose memory did not move: the same
bytes as packing it again, for a few microseconds per tensor
(FTRUN_SAVE_CACHE=0 packs every save from scratch). A structure that is
not a tree, or holds a plain tensor that is not dense, is pickled whole,
tensors by persistent id (format 1).
"""

import io
import os
import pickle

import torch

from . import _ftrun
from . import save_behind, state_bytes, state_client, state_flat, state_pickle, state_reuse
from .state_client import _ftrun_error
from .store_populate import _start_populating

_FORMAT_VERSION = 2  # of the pickled payload: written by save(), the newest a load reads (1: skeletons pickled whole)
_PICKLE_PROTOCOL = state_pickle.PICKLE_PROTOCOL

# Stored as numpy views in their own ftrun dtype.
_NATIVE_DTYPES = frozenset([
    torch.float16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.uint8, torch.bool,
])
_ENC_NATIVE = "native"  # numpy view, ftrun dtype from the buffer format
_ENC_BF16 = "bf16"      # int16 bits, saved as ftrun 'bfloat16'
_ENC_RAW = "raw"        # flat uint8 bytes; the real dtype is in the metadata


_EMPTY_LIST = pickle.dumps([], protocol=_PICKLE_PROTOCOL)  # a skeleton's objects when it has none
_DTYPE_NAMES = {}  # torch.dtype -> its name in the metadata ('float32', ...)


def _dtype_name(dt):
    name = _DTYPE_NAMES.get(dt)
    if name is None:
        name = _DTYPE_NAMES[dt] = str(dt).replace("torch.", "")
    return name


class _Packer:
    """Collects the named buffers of one ftrun version, from one or more
    structures (ftrun.deepspeed packs one per DeepSpeed file)."""

    def __init__(self, pin_memory=None, reuse=True):
        """reuse: pack from, and keep for the next save, what the last save
        of the same prefix packed (ftrun.state_reuse)."""
        self.reuse = reuse
        self.arrays = {}       # name -> buffer (numpy)
        self.dtypes = {}       # name -> ftrun dtype override
        self.metas = []        # per tensor index: dict
        self._index = {}       # id(tensor) -> index
        self._keep = []        # keeps packed tensors (and their ids) alive
        self._used = set()
        self._cuda_devices = set()
        self._device_keep = []  # CUDA buffers the save reads after it returns
        self._fallback = 0
        self._device_index = None  # the current CUDA device when saved from, -1 when staged (_from_device)
        self._pin = state_client._pin_memory if pin_memory is None else pin_memory
        self._metas_entry = None  # the state_reuse entry that self.metas starts with, when reused
        self._kept = []  # per structure packed from state_reuse: the names of the buffers it keeps

    def pack(self, obj, prefix=""):
        """Registers obj's tensors and returns its skeleton: a dict (format 2:
        tree, atoms, objects; see the module docstring) or, for a structure
        that is not a tree or holds a plain tensor that is not dense, the
        pickle of the whole (format 1)."""
        try:
            flat = state_flat.flatten(obj, prefix)
        except state_flat.Unflattenable:
            return self._pack_whole(obj, prefix)
        found = state_reuse.lookup(self, flat, prefix)
        if found is not None:
            entry = found[0]
            self._reuse(flat.tensors, *found)
            tree = entry.tree
        else:
            if not all(map(state_pickle.storable, flat.tensors)):
                return self._pack_whole(obj, prefix)
            tree = self._pack_new(flat, prefix)
        objects = _EMPTY_LIST
        if flat.objects:
            buf = io.BytesIO()
            state_pickle.Pickler(buf, self, flat.object_paths, prefix).dump(flat.objects)
            objects = buf.getvalue()
        return {"tree": tree, "atoms": pickle.dumps(flat.atoms, protocol=_PICKLE_PROTOCOL),
                "objects": objects}

    def _pack_whole(self, obj, prefix):
        """Format 1: obj pickled whole, its tensors by persistent id."""
        names = {}
        state_pickle.walk(obj, prefix, names, set())
        buf = io.BytesIO()
        state_pickle.Pickler(buf, self, names, prefix).dump(obj)
        return buf.getvalue()

    def _pack_new(self, flat, prefix):
        """Registers the flattened tensors one by one; returns the pickled
        trace. state_reuse keeps what the next save of prefix can reuse."""
        start = len(self.metas)
        known = bool(self._index) and any(id(t) in self._index for t in flat.tensors)
        tidx = []
        for t, at in zip(flat.tensors, flat.where):
            idx = self._index.get(id(t))
            if idx is None:
                idx = self._register(t, state_flat.path_of(at))
            tidx.append(idx)
        tree = pickle.dumps((flat.trace, tidx), protocol=_PICKLE_PROTOCOL)
        # (Tensors another structure of this version holds too: packed anew every time.)
        if not known and self.reuse and state_reuse.enabled():
            names = [self.metas[i]["name"] for i in tidx]
            mode = self.device_mode() if any(t.is_cuda for t in flat.tensors) else None
            entry = state_reuse.Entry(flat, start, tree, names, self.metas[start:], mode,
                                      {n: self.dtypes[n] for n in names if n in self.dtypes})
            state_reuse.keep(prefix, entry)
            if start == 0:
                self._metas_entry = entry
        return tree

    def _reuse(self, tensors, entry, buffers, fresh):
        """Registers the tensors of a structure equal to entry's: its names and
        metadata as they are; the buffers state_reuse.lookup found still
        valid, and for the others (fresh: (k, address)) new ones."""
        start = entry.start
        self.metas.extend(entry.metas)
        self.dtypes.update(entry.dtypes)
        self._used.update(entry.names)
        self._keep.extend(tensors)
        if start == 0:
            self._metas_entry = entry
        self._index.update(zip(map(id, tensors), range(start, start + len(tensors))))
        views, ptrs, names = entry.views, entry.ptrs, entry.names
        if entry.mode is not None:  # the CUDA buffers reused: the save's copies read them after it returns
            self._device_keep.extend(v[2] for v, b in zip(views, buffers) if b is not None and v[3])
        for k, ptr in fresh:
            t = tensors[k]
            _, buf, shares = self._encode(t, names[k])
            # Kept for the next save only when the memory stayed where it was
            # (the state's own tensors; not copies made anew for every save).
            # (A CUDA tensor's own memory is a buffer of the save's CUDA path.)
            views[k] = (ptr, t.stride(), buf, t.is_cuda) if shares and ptr == ptrs[k] else None
            ptrs[k] = ptr
            buffers[k] = buf
        if fresh:
            entry.kept = frozenset(name for name, view in zip(names, views) if view is not None)
        self._kept.append(entry.kept)
        self.arrays.update(zip(names, buffers))

    def _sorted_names(self):
        entry = self._metas_entry
        if entry is not None and len(self.arrays) == len(entry.names):
            return entry.sorted_names()
        return sorted(self.arrays)

    def metas_pickle(self):
        """self.metas pickled (the payload's "tensors"): the entry's bytes when
        they are exactly one reused structure's."""
        entry = self._metas_entry
        if entry is not None and len(self.metas) == len(entry.metas):
            return entry.metas_pickle()
        return pickle.dumps(self.metas, protocol=_PICKLE_PROTOCOL)

    def _from_device(self, t):
        """Whether CUDA tensor t goes to the C++ CUDA save path: on the current
        device, with a libftrun built with CUDA (FTRUN_CUDA_STAGING=1 stages
        through pinned host buffers instead, as do tensors of other devices).
        Asked once per pack, not per tensor."""
        device = self.device_mode()
        index = t.device.index
        return device >= 0 and (index is None or index == device)

    def device_mode(self):
        """The CUDA device tensors are saved from directly, -1 when they are staged."""
        if self._device_index is None:
            direct = getattr(_ftrun, "CUDA", False) and not _staging_forced()
            self._device_index = torch.cuda.current_device() if direct else -1
        return self._device_index

    def _unique(self, name):
        if name not in self._used:
            return name
        k = 2
        while f"{name}~{k}" in self._used:
            k += 1
        return f"{name}~{k}"

    def add(self, t, names, prefix):
        """The index of tensor t in this version, registered when new (the
        pickler's and ftrun.sharded's way in); names: id -> path."""
        idx = self._index.get(id(t))
        if idx is not None:
            return idx
        name = names.get(id(t))
        if name is None:  # reached only through a pickled object
            self._fallback += 1
            name = state_flat.join(prefix, f"#{self._fallback}")
        return self._register(t, name)

    def _register(self, t, name):
        name = self._unique(name or "_")
        self._used.add(name)
        idx = len(self.metas)
        self._index[id(t)] = idx
        self._keep.append(t)
        enc, arr, _ = self._encode(t, name)
        self.arrays[name] = arr
        self.metas.append({
            "name": name,
            "dtype": _dtype_name(t.dtype),
            "shape": tuple(t.shape),
            "device": str(t.device),
            "requires_grad": bool(t.requires_grad),
            "param": isinstance(t, torch.nn.Parameter),
            "enc": enc,
        })
        return idx

    def _encode(self, t, name):
        """(encoding, buffer, whether the buffer is t's own memory) of t's values."""
        t = t.detach()
        if t.is_cuda and self._from_device(t):
            return self._device(t, name)
        return self._host_encoded(t, name)

    def _host_encoded(self, t, name):
        """(encoding, host buffer, whether it is t's own memory) of t's values."""
        host = self._host(t, name)
        shares = host is t
        dt = t.dtype
        if dt in _NATIVE_DTYPES:
            enc, arr = _ENC_NATIVE, host.numpy()
        elif dt == torch.bfloat16:
            enc, arr = _ENC_BF16, host.view(torch.int16).numpy()
            self.dtypes[name] = "bfloat16"
        else:
            enc, arr = _ENC_RAW, state_bytes.raw_bytes(host)
        return enc, arr, shares

    def _device(self, t, name):
        """(encoding, CUDA uint8 view of t's bytes, whether it is t's own
        memory): saved from the device by the C++ CUDA path, no host staging.
        Non-contiguous tensors and views get a contiguous copy on the device
        (kept alive until the save's copies are fenced)."""
        own = t
        t = state_bytes.resolve(t)
        if not t.is_contiguous():
            t = t.contiguous()
        shares = t is own
        dt = t.dtype
        data = state_bytes.CudaBytes(t) if dt in _NATIVE_DTYPES or dt == torch.bfloat16 else state_bytes.byte_view(t)
        self._device_keep.append(data)
        if dt in _NATIVE_DTYPES:
            self.dtypes[name] = _dtype_name(dt)
            return _ENC_NATIVE, data, shares
        if dt == torch.bfloat16:
            self.dtypes[name] = "bfloat16"
            return _ENC_BF16, data, shares
        return _ENC_RAW, data, shares

    def _host(self, t, name):
        """A contiguous CPU tensor with t's values (t itself when it already is one)."""
        if t.device.type == "cpu":
            t = state_bytes.resolve(t)
            return t if t.is_contiguous() else t.contiguous()
        if t.device.type == "cuda" and self._pin:
            buf = state_client._staging.get(name)
            if buf is None or buf.dtype != t.dtype or buf.shape != t.shape:
                try:
                    buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                except RuntimeError:
                    buf = torch.empty(t.shape, dtype=t.dtype)
                state_client._staging[name] = buf
            buf.copy_(state_bytes.resolve(t), non_blocking=True)
            self._cuda_devices.add(t.device)
            return buf
        return state_bytes.resolve(t).to("cpu").contiguous()

    def finish(self):
        """Waits for the queued device-to-host copies."""
        for dev in self._cuda_devices:
            torch.cuda.synchronize(dev)
        self._cuda_devices.clear()

    def save(self, client, version, payload, overlap=False):
        """Saves the collected buffers as `version`, payload pickled as user bytes.
        overlap: CUDA copies overlap the current stream's next work, and only
        optimizer steps wait for them (see ftrun.save)."""
        self.finish()
        payload = dict(payload, tensors=self.metas_pickle())
        user = pickle.dumps(payload, protocol=_PICKLE_PROTOCOL)
        # Sorted by name: the store's layout does not depend on dict order.
        arrays = {name: self.arrays[name] for name in self._sorted_names()}
        stream = torch.cuda.current_stream().cuda_stream if self._device_keep else 0
        # The buffers state_reuse keeps are never reshaped: the client need not read them again.
        same_buffers = self._kept[0] if len(self._kept) == 1 else frozenset().union(*self._kept) or None
        if overlap:
            _order_optimizer_steps()

        def store():
            try:
                stats = client.save(version, arrays, user_bytes=user, dtypes=self.dtypes or None,
                                    cuda_stream=stream, order_cuda_stream=not (overlap and self._device_keep),
                                    same_buffers=same_buffers)
            except _ftrun.Error as e:
                raise _explained(e) from e
            _start_populating(client)
            return stats

        if overlap and not self._device_keep:  # host tensors only: the copy runs behind training
            return save_behind.submit(version, store)
        save_behind.finish()  # (a save in flight goes first)
        stats = store()
        state_client._in_flight = self._device_keep  # the copies read these until the next save or wait()
        return stats


def _explained(e):
    """A refused save's error, with the hint for a changed tensor layout."""
    code = getattr(e, "code", "")
    msg = getattr(e, "message", str(e))
    if code == "FAILED_PRECONDITION" and "versions must increase" not in msg:
        return _ftrun_error(code, msg + ". ftrun keeps the tensor layout of a rank's first save: "
                            "save the same structure (tensor names, dtypes, shapes) every time, e.g. "
                            "start saving after the optimizer's first step (torch optimizers create "
                            "their state lazily)", e)
    return e


_hooked = False


def _order_optimizer_steps():
    """Once per process: every torch optimizer step first waits for an
    overlapped host save (ftrun.save_behind) and makes the current CUDA
    stream wait for the copies of a save still in flight."""
    global _hooked
    if _hooked:
        return
    from torch.optim import optimizer as optimizer_module

    register = getattr(optimizer_module, "register_optimizer_step_pre_hook", None)
    if register is None:
        raise _ftrun_error("INVALID_ARGUMENT", f"ftrun.save(overlap=True) needs torch >= 2.0 (optimizer step "
                           f"hooks); this is torch {torch.__version__}")

    def before_step(optimizer, args, kwargs):
        save_behind.finish()
        if state_client._in_flight:
            state_client.get_client().order_after_save(torch.cuda.current_stream().cuda_stream)

    register(before_step)
    _hooked = True




def _staging_forced():
    return os.environ.get("FTRUN_CUDA_STAGING", "0") == "1"
