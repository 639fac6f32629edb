"""Unpacking a loaded version: its named buffers and pickled payload -> the
structure that was saved, tensors of the saved dtypes and shapes (CPU views
of the loaded buffers, moved to their device or where map_location says).
The reverse of ftrun.state_pack; ftrun.state, ftrun.deepspeed and
ftrun.persisted load through _Loaded.
"""

import io
import math
import os
import pickle

import numpy as np
import torch

from . import _ftrun, save_behind, state_flat, state_reuse
from . import sharded as _sharded
from .grad_flags import with_grad_flags
from .state_client import _ftrun_error, _warn_once
from .state_pack import _ENC_BF16, _ENC_NATIVE, _FORMAT_VERSION, _staging_forced


def _torch_dtype(name):
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise _ftrun_error("INVALID_ARGUMENT", f"this torch ({torch.__version__}) has no dtype '{name}'")
    return dt


def _from_raw(arr, dtype, shape):
    if arr.size == 0:
        return torch.empty(shape, dtype=dtype)
    flat = torch.from_numpy(arr)
    if dtype == torch.uint8:
        return flat.reshape(shape)
    return flat.view(dtype).reshape(shape)


def _cpu_tensor(meta, arr):
    dtype = _torch_dtype(meta["dtype"])
    enc = meta["enc"]
    if enc == _ENC_NATIVE:
        t = torch.from_numpy(arr)
    elif enc == _ENC_BF16:
        t = torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    else:
        t = _from_raw(arr, dtype, meta["shape"])
    if t.dtype == dtype and tuple(t.shape) != tuple(meta["shape"]) and t.numel() == math.prod(meta["shape"]):
        t = t.reshape(meta["shape"])  # a 0-dim tensor saved from a device is stored with one dimension
    if t.dtype != dtype or tuple(t.shape) != tuple(meta["shape"]):
        raise _ftrun_error("CORRUPTION", f"tensor '{meta['name']}' came back as {t.dtype}{list(t.shape)}, "
                           f"saved as {dtype}{list(meta['shape'])}")
    return t


def _device_available(dev):
    if dev.type == "cpu":
        return True
    if dev.type == "cuda":
        return torch.cuda.is_available() and (dev.index is None or dev.index < torch.cuda.device_count())
    return True  # other accelerators: tried, and CPU if moving fails


def _target(orig, map_location):
    """Where a tensor saved from device `orig` goes (torch.load's map_location:
    None, a device or string, or a dict of saved -> new device strings), as
    a string; None for a callable map_location, which decides itself."""
    if callable(map_location) and not isinstance(map_location, (str, torch.device)):
        return None
    target = orig
    if isinstance(map_location, dict):
        target = map_location.get(orig, orig)
    elif map_location is not None:
        target = map_location
    return str(target)


def _place(t, orig, map_location):
    """Moves a loaded CPU tensor where map_location (torch.load style) says."""
    target = _target(orig, map_location)
    if target is None:
        out = map_location(t, orig)
        return out if isinstance(out, torch.Tensor) else t
    dev = torch.device(target)
    if dev.type == "cpu":
        return t
    if not _device_available(dev):
        _warn_once(("device", target), f"ftrun.load: device '{target}' is not available here; "
                   "its tensors stay on the CPU (pass map_location to choose)")
        return t
    try:
        return t.to(dev)
    except (RuntimeError, AssertionError) as e:
        _warn_once(("device", target), f"ftrun.load: cannot move tensors to '{target}' ({e}); "
                   "they stay on the CPU")
        return t


class _DeviceTargets:
    """For Client.load(cuda=): given a version's user bytes, a new CUDA byte
    buffer for every tensor that goes to a CUDA device, which the store's
    bytes are copied into directly (no host staging); {} when libftrun has
    no CUDA path or FTRUN_CUDA_STAGING=1. Keeps the payload it unpickled
    (.payload) so the load does not unpickle it again."""

    def __init__(self, map_location):
        self.map_location = map_location
        self.payload = None

    def __call__(self, user_bytes):
        if not getattr(_ftrun, "CUDA", False) or _staging_forced():
            return {}
        try:
            self.payload = pickle.loads(user_bytes)
            metas = payload_metas(self.payload) or []
        except Exception:  # not ours: _Loaded reports it
            self.payload = None
            return {}
        out = {}
        for meta in metas:
            target = _target(meta["device"], self.map_location)
            if target is None or not target.startswith("cuda") or not _device_available(torch.device(target)):
                continue
            dtype = getattr(torch, meta["dtype"], None)
            if not isinstance(dtype, torch.dtype):
                continue  # _Loaded reports it
            nbytes = math.prod(meta["shape"]) * torch.empty((), dtype=dtype).element_size()
            out[meta["name"]] = torch.empty(nbytes, dtype=torch.uint8, device=target)
        return out


class _PidUnpickler(pickle.Unpickler):
    """An unpickler whose persistent ids a function resolves."""

    def __init__(self, data, resolve):
        super().__init__(io.BytesIO(data))
        self._resolve = resolve

    def persistent_load(self, pid):
        return self._resolve(pid)


def structure(skeleton, resolve):
    """The structure a skeleton describes (format 1: a pickle of it; format 2:
    a dict of tree, atoms and objects, ftrun.state_pack); resolve(pid) gives
    what stands for each tensor's persistent id."""
    if isinstance(skeleton, (bytes, bytearray)):
        return _PidUnpickler(skeleton, resolve).load()
    if not isinstance(skeleton, dict) or not {"tree", "atoms", "objects"} <= skeleton.keys():
        raise state_flat.StructureError(f"a skeleton is pickle bytes or a dict of tree, atoms and objects, not "
                                        f"{type(skeleton).__name__}")
    tree = pickle.loads(skeleton["tree"])
    if not (isinstance(tree, tuple) and len(tree) == 2 and isinstance(tree[0], list) and isinstance(tree[1], list)):
        raise state_flat.StructureError("a skeleton's tree is not (trace, tensor indices)")
    trace, tidx = tree

    def tensor(k):
        if not 0 <= k < len(tidx):
            raise state_flat.StructureError(f"tensor slot {k} of a structure with {len(tidx)} tensors")
        return resolve(("ftrun.tensor", tidx[k]))

    atoms = pickle.loads(skeleton["atoms"])
    objects = _PidUnpickler(skeleton["objects"], resolve).load()
    if not isinstance(atoms, list) or not isinstance(objects, list):
        raise state_flat.StructureError("a skeleton's atoms or objects are not lists")
    return state_flat.build(trace, tensor, atoms, objects)


def payload_metas(payload):
    """A payload's tensor metadata: a list, pickled on its own since format 2."""
    metas = payload["tensors"]
    return pickle.loads(metas) if isinstance(metas, (bytes, bytearray)) else metas


class _Tensors:
    """The tensors of one unpack, made once per index (the same tensor reached twice comes back as one object)."""

    def __init__(self, loaded, map_location):
        self._loaded = loaded
        self._map = map_location
        self._made = {}

    def __call__(self, pid):
        # ftrun.sharded hook: a DTensor / ShardedTensor rebuilt from its local shard(s).
        if isinstance(pid, tuple) and pid and pid[0] in _sharded.PIDS:
            return _sharded.persistent_load(pid, self._loaded, self._map, self._made)
        if not (isinstance(pid, tuple) and len(pid) == 2 and pid[0] == "ftrun.tensor"):
            raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
        idx = pid[1]
        t = self._made.get(idx)
        if t is None:
            t = self._loaded.tensor(idx, self._map)
            self._made[idx] = t
        return t


class _Loaded:
    """One loaded version: its buffers and payload; unpack() builds structures."""

    def __init__(self, result, expect_format, payload=None, inplace=None):
        """payload: result.user_bytes already unpickled (by _DeviceTargets);
        inplace: saved name -> the live tensor it was read into (given back as is)."""
        self.inplace = inplace or {}
        self.version = result.version
        self.arrays = result.tensors
        try:
            self.payload = payload if payload is not None else pickle.loads(result.user_bytes)
        except Exception as e:  # not ours: saved through the low-level Client
            raise _ftrun_error("INVALID_ARGUMENT", f"version {self.version} was not saved by "
                               f"{expect_format} (its user bytes do not unpickle: {e})", e) from e
        if not isinstance(self.payload, dict) or self.payload.get("format") != expect_format:
            got = self.payload.get("format") if isinstance(self.payload, dict) else type(self.payload).__name__
            raise _ftrun_error("INVALID_ARGUMENT", f"version {self.version} holds '{got}', not '{expect_format}' "
                               "state")
        if self.payload.get("format_version", 1) > _FORMAT_VERSION:
            raise _ftrun_error("INVALID_ARGUMENT", f"version {self.version} was saved by a newer ftrun "
                               f"(format {self.payload.get('format_version')})")
        try:
            self.metas = payload_metas(self.payload)
        except Exception as e:  # noqa: BLE001 - whatever a damaged pickle raises
            raise _ftrun_error("CORRUPTION", f"version {self.version}: its tensor list does not unpickle ({e!r})",
                               e) from e

    def tensor(self, idx, map_location):
        meta = self.metas[idx]
        if meta["name"] in self.inplace:
            return self.inplace[meta["name"]]
        arr = self.arrays.get(meta["name"])
        if arr is None:
            raise _ftrun_error("CORRUPTION", f"version {self.version} lacks tensor '{meta['name']}'")
        if isinstance(arr, torch.Tensor):  # restored straight into CUDA memory
            dtype = _torch_dtype(meta["dtype"])
            t = (arr if dtype == torch.uint8 else arr.view(dtype)).reshape(meta["shape"])
        else:
            t = _place(_cpu_tensor(meta, arr), meta["device"], map_location)
        return with_grad_flags(t, meta)

    def unpack(self, skeleton, map_location=None):
        try:
            return structure(skeleton, _Tensors(self, map_location))
        except state_flat.StructureError as e:
            raise _ftrun_error("CORRUPTION", f"version {self.version}: {e}", e) from e


def _load_version(client, version, expect_format, map_location=None, into=None):
    """Loads `version` (None: the one a restart restores, else the last
    committed); None when nothing is committed. Tensors that map_location
    (see _target) puts on a CUDA device are read straight into new CUDA
    memory; into (in_place._Into): those it names, straight into live host
    tensors instead. An overlapped save still copying from live tensors
    finishes first, and what the last save kept for the next one is dropped
    (ftrun.state_reuse: a restored state's tensors are new ones, and the
    old ones' memory must not be held)."""
    save_behind.finish()
    state_reuse.forget()
    if version is None or version == _ftrun.LATEST:
        lv = client.list_versions()
        version = lv["restore"]
        if version is None:
            if not lv["committed"]:
                return None
            version = lv["committed"][-1]
    if into is not None:
        result = client.load(version, map=load_maps(), into=into)
        return _Loaded(result, expect_format, payload=into.payload, inplace=into.dests)
    targets = _DeviceTargets(map_location)
    result = client.load(version, map=load_maps(), cuda=targets)
    return _Loaded(result, expect_format, payload=targets.payload)


def load_maps():
    """Whether loads map tensors copy-on-write (see ftrun.state's docstring)."""
    return os.environ.get("FTRUN_LOAD_MAP", "1") != "0"
