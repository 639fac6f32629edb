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
  or view is copied to a contiguous one first. CUDA tensors are copied into
  reused pinned host buffers (one per tensor name), then saved.
* load() rebuilds the same structure with the same dtypes and shapes; CPU
  tensors are views of the loaded buffers (torch.from_numpy, no extra copy);
  CUDA tensors go back to their device when it exists (else they stay on the
  CPU, with a warning), or where map_location says.
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

Save stall and the store's mapping: a save copies into extents of the agent's
store, which this process maps lazily, so until the process has touched a
page of the store once, writing it takes a page fault (~1 us per 4 KiB on
the development VM: a 416 MiB save took 0.15 s with 106k faults, 0.035 s
once its pages were mapped). After the first save, a background thread therefore maps in
(MADV_POPULATE_WRITE, Linux >= 5.14) every page of the store the agent has
already allocated (mincore), in 16 MiB slices, while training goes on; later
saves find their pages mapped. It never allocates store memory the agent has
not (store.prefault: false stays lazy). FTRUN_POPULATE_STORE=0 turns it off.
"""

import ctypes
import io
import mmap
import os
import pickle
import random
import threading
import warnings

import numpy as np
import torch

from . import _ftrun

__all__ = ["save", "load", "wait", "rng_state", "set_rng_state", "get_client", "configure"]

_FORMAT = "ftrun.state"
_FORMAT_VERSION = 1
_PICKLE_PROTOCOL = 4

# Stored as numpy views in their own ftrun dtype.
_NATIVE_DTYPES = frozenset([
    torch.float16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.uint8, torch.bool,
])
_ENC_NATIVE = "native"  # numpy view, ftrun dtype from the buffer format
_ENC_BF16 = "bf16"      # int16 bits, saved as ftrun 'bfloat16'
_ENC_RAW = "raw"        # flat uint8 bytes; the real dtype is in the metadata

_lock = threading.Lock()
_client = None
_pin_memory = True
_staging = {}           # tensor name -> pinned host buffer for CUDA tensors
_last_saved = None      # step of this process's last save
_warned = set()
_populating = None      # the client whose store mapping is (being) populated


# --------------------------------------------------------------------------
# The client


def get_client():
    """The module's ftrun.Client, connected on first use ($FTRUN_AGENT_SOCKET,
    $FTRUN_RANK); shared with ftrun.deepspeed."""
    global _client
    with _lock:
        if _client is None:
            _client = _ftrun.Client()
        return _client


def configure(client=None, pin_memory=None):
    """Optional settings. client: an ftrun.Client to use instead of the lazily
    connected one. pin_memory (default True): stage CUDA tensors in reused
    pinned host buffers (faster copies, memory kept between saves); False
    copies them with .cpu() every time and frees the buffers."""
    global _client, _pin_memory
    with _lock:
        if client is not None:
            _client = client
        if pin_memory is not None:
            _pin_memory = bool(pin_memory)
            if not _pin_memory:
                _staging.clear()


def _warn_once(key, message):
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _ftrun_error(code, message, cause=None):
    """An ftrun.Error (or InvalidArgumentError) with .code and .message set."""
    cls = _ftrun.InvalidArgumentError if code == "INVALID_ARGUMENT" else _ftrun.Error
    err = cls(f"{code}: {message}")
    err.code = code
    err.message = message
    if cause is not None:
        err.__cause__ = cause
    return err


# --------------------------------------------------------------------------
# Mapping the store into this process ahead of the saves

_MADV_POPULATE_WRITE = 23  # Linux >= 5.14
_POPULATE_SLICE = 16 << 20  # short holds of the mmap lock: the saves map pages too


def _store_ranges():
    """(start, end) of this process's shared mappings of an ftrun store (the
    agent's memfd 'ftrun-<job>-node<N>')."""
    out = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.split(None, 5)
                if len(fields) == 6 and fields[1] == "rw-s" and fields[5].startswith("/memfd:ftrun-"):
                    lo, hi = (int(x, 16) for x in fields[0].split("-"))
                    out.append((lo, hi))
    except OSError:
        pass
    return out


def _populate_store(client):
    """Maps in the resident pages of the store (see the module docstring);
    stops at the first error (old kernel, the client closed or replaced)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    except (OSError, AttributeError):
        return
    page = mmap.PAGESIZE
    vec = (ctypes.c_ubyte * (_POPULATE_SLICE // page))()
    for lo, hi in _store_ranges():
        for off in range(lo, hi, _POPULATE_SLICE):
            if _client is not client:
                return
            n = min(_POPULATE_SLICE, hi - off)
            if libc.mincore(off, n, vec) != 0:
                return
            resident = bytes(vec)[:(n + page - 1) // page]
            i = 0
            while i < len(resident):
                if not resident[i] & 1:
                    i += 1
                    continue
                j = resident.find(b"\x00", i)  # residency is bit 0; the other bits are 0
                j = len(resident) if j < 0 else j
                if libc.madvise(off + i * page, min(n, j * page) - i * page, _MADV_POPULATE_WRITE) != 0:
                    return
                i = j


def _start_populating(client):
    global _populating
    if _populating is client or os.environ.get("FTRUN_POPULATE_STORE", "1") == "0":
        return
    _populating = client
    threading.Thread(target=_populate_store, args=(client,), name="ftrun-populate", daemon=True).start()


# --------------------------------------------------------------------------
# Packing: structure -> (skeleton pickle, named buffers)


def _escape(key):
    s = key if isinstance(key, str) else str(key)
    if not s:
        return "%"
    return s.replace("%", "%25").replace("/", "%2F")


def _join(prefix, seg):
    return seg if not prefix else prefix + "/" + seg


def _walk(obj, path, names, seen):
    """Records id(tensor) -> path for tensors reachable through dicts, lists
    and tuples (the first path wins when a tensor is reached twice)."""
    if isinstance(obj, torch.Tensor):
        names.setdefault(id(obj), path)
        return
    if isinstance(obj, (dict, list, tuple)):
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, dict):
            for k, v in obj.items():
                _walk(v, _join(path, _escape(k)), names, seen)
        else:
            fields = getattr(obj, "_fields", None) if isinstance(obj, tuple) else None
            for i, v in enumerate(obj):
                seg = _escape(fields[i]) if fields and i < len(fields) else str(i)
                _walk(v, _join(path, seg), names, seen)


def _storable(t):
    """Dense tensors of plain Tensor/Parameter types go to the store; sparse,
    quantized, nested, meta and tensor subclasses are pickled as torch does."""
    if type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter:
        return False
    if t.layout != torch.strided or t.is_quantized or t.device.type == "meta":
        return False
    if getattr(t, "is_nested", False):
        return False
    return True


def _resolve(t):
    """Materializes lazy conjugate/negative bits (torch >= 1.10) so the bytes are plain."""
    if hasattr(t, "is_conj") and t.is_conj():
        t = t.resolve_conj()
    if hasattr(t, "is_neg") and t.is_neg():
        t = t.resolve_neg()
    return t


class _Pickler(pickle.Pickler):
    def __init__(self, file, packer, names, prefix):
        super().__init__(file, protocol=_PICKLE_PROTOCOL)
        self._packer = packer
        self._names = names
        self._prefix = prefix

    def persistent_id(self, obj):
        if isinstance(obj, torch.Tensor) and _storable(obj):
            return ("ftrun.tensor", self._packer.add(obj, self._names, self._prefix))
        return None


class _Packer:
    """Collects the named buffers of one ftrun version, from one or more
    structures (ftrun.deepspeed packs one per DeepSpeed file)."""

    def __init__(self, pin_memory=None):
        self.arrays = {}       # name -> buffer (numpy)
        self.dtypes = {}       # name -> ftrun dtype override
        self.metas = []        # per tensor index: dict
        self._index = {}       # id(tensor) -> index
        self._keep = []        # keeps packed tensors (and their ids) alive
        self._used = set()
        self._cuda_devices = set()
        self._fallback = 0
        self._pin = _pin_memory if pin_memory is None else pin_memory

    def pack(self, obj, prefix=""):
        """Registers obj's tensors and returns its skeleton pickle."""
        names = {}
        _walk(obj, prefix, names, set())
        buf = io.BytesIO()
        _Pickler(buf, self, names, prefix).dump(obj)
        return buf.getvalue()

    def _unique(self, name):
        if name not in self._used:
            return name
        k = 2
        while f"{name}~{k}" in self._used:
            k += 1
        return f"{name}~{k}"

    def add(self, t, names, prefix):
        idx = self._index.get(id(t))
        if idx is not None:
            return idx
        name = names.get(id(t))
        if name is None:  # reached only through a pickled object
            self._fallback += 1
            name = _join(prefix, f"#{self._fallback}")
        name = self._unique(name or "_")
        self._used.add(name)
        idx = len(self.metas)
        self._index[id(t)] = idx
        self._keep.append(t)
        host = self._host(t.detach(), name)
        dt = t.dtype
        if dt in _NATIVE_DTYPES:
            enc, arr = _ENC_NATIVE, host.numpy()
        elif dt == torch.bfloat16:
            enc, arr = _ENC_BF16, host.view(torch.int16).numpy()
            self.dtypes[name] = "bfloat16"
        else:
            enc, arr = _ENC_RAW, _raw_bytes(host)
        self.arrays[name] = arr
        self.metas.append({
            "name": name,
            "dtype": str(dt).replace("torch.", ""),
            "shape": tuple(t.shape),
            "device": str(t.device),
            "requires_grad": bool(t.requires_grad),
            "param": isinstance(t, torch.nn.Parameter),
            "enc": enc,
        })
        return idx

    def _host(self, t, name):
        """A contiguous CPU tensor with t's values (t itself when it already is one)."""
        if t.device.type == "cpu":
            t = _resolve(t)
            return t if t.is_contiguous() else t.contiguous()
        if t.device.type == "cuda" and self._pin:
            buf = _staging.get(name)
            if buf is None or buf.dtype != t.dtype or buf.shape != t.shape:
                try:
                    buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                except RuntimeError:
                    buf = torch.empty(t.shape, dtype=t.dtype)
                _staging[name] = buf
            buf.copy_(_resolve(t), non_blocking=True)
            self._cuda_devices.add(t.device)
            return buf
        return _resolve(t).to("cpu").contiguous()

    def finish(self):
        """Waits for the queued device-to-host copies."""
        for dev in self._cuda_devices:
            torch.cuda.synchronize(dev)
        self._cuda_devices.clear()

    def save(self, client, version, payload):
        """Saves the collected buffers as `version`, payload pickled as user bytes."""
        self.finish()
        payload = dict(payload, tensors=self.metas)
        user = pickle.dumps(payload, protocol=_PICKLE_PROTOCOL)
        # Sorted by name: the store's layout does not depend on dict order.
        arrays = {name: self.arrays[name] for name in sorted(self.arrays)}
        try:
            stats = client.save(version, arrays, user_bytes=user, dtypes=self.dtypes or None)
            _start_populating(client)
            return stats
        except _ftrun.Error as e:
            code = getattr(e, "code", "")
            msg = getattr(e, "message", str(e))
            if code == "FAILED_PRECONDITION" and "versions must increase" not in msg:
                raise _ftrun_error(code, msg + ". ftrun keeps the tensor layout of a rank's first save: "
                                   "save the same structure (tensor names, dtypes, shapes) every time, e.g. "
                                   "start saving after the optimizer's first step (torch optimizers create "
                                   "their state lazily)", e) from e
            raise


def _raw_bytes(t):
    flat = t.reshape(-1)
    try:
        return flat.view(torch.uint8).numpy()
    except (RuntimeError, TypeError):
        return flat.numpy().view(np.uint8)


# --------------------------------------------------------------------------
# Unpacking: loaded buffers -> structure


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


def _place(t, orig, map_location):
    """Moves a loaded CPU tensor where map_location (torch.load style) says."""
    if callable(map_location) and not isinstance(map_location, (str, torch.device)):
        out = map_location(t, orig)
        return out if isinstance(out, torch.Tensor) else t
    target = orig
    if isinstance(map_location, dict):
        target = map_location.get(orig, orig)
        if isinstance(target, torch.device):
            target = str(target)
    elif map_location is not None:
        target = str(map_location)
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


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, loaded, map_location):
        super().__init__(file)
        self._loaded = loaded
        self._map = map_location
        self._made = {}

    def persistent_load(self, pid):
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

    def __init__(self, result, expect_format):
        self.version = result.version
        self.arrays = result.tensors
        try:
            self.payload = pickle.loads(result.user_bytes)
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
        self.metas = self.payload["tensors"]

    def tensor(self, idx, map_location):
        meta = self.metas[idx]
        arr = self.arrays.get(meta["name"])
        if arr is None:
            raise _ftrun_error("CORRUPTION", f"version {self.version} lacks tensor '{meta['name']}'")
        t = _place(_cpu_tensor(meta, arr), meta["device"], map_location)
        rg = meta["requires_grad"] and (t.is_floating_point() or t.is_complex())
        if meta.get("param"):
            return torch.nn.Parameter(t, requires_grad=rg)
        if rg:
            t.requires_grad_(True)
        return t

    def unpack(self, skeleton, map_location=None):
        return _Unpickler(io.BytesIO(skeleton), self, map_location).load()


def _load_version(client, version, expect_format):
    """Loads `version` (None: the one a restart restores, else the last
    committed); None when nothing is committed."""
    if version is None or version == _ftrun.LATEST:
        lv = client.list_versions()
        version = lv["restore"]
        if version is None:
            if not lv["committed"]:
                return None
            version = lv["committed"][-1]
    return _Loaded(client.load(version, map=load_maps()), expect_format)


def load_maps():
    """Whether loads map tensors copy-on-write (see the module docstring)."""
    return os.environ.get("FTRUN_LOAD_MAP", "1") != "0"


# --------------------------------------------------------------------------
# Public API


def save(step, state, *, wait=False):
    """Saves `state` as version `step` of this rank.

    state: any nesting of dicts, lists, tuples and picklable objects holding
    torch tensors (see the module docstring). Returns once the bytes are in
    the agent's memory (the save statistics dict of Client.save). wait=True
    also waits until every rank has saved `step` (it is committed, so a
    restart restores it or a newer one). Raises ftrun.Error; e.g.
    FAILED_PRECONDITION when the tensor layout differs from the first save or
    the step does not increase, RESOURCE_EXHAUSTED when the store is full.
    """
    global _last_saved
    step = int(step)
    packer = _Packer()
    skeleton = packer.pack(state)
    stats = packer.save(get_client(), step, {
        "format": _FORMAT, "format_version": _FORMAT_VERSION, "step": step, "skeleton": skeleton,
        "torch": torch.__version__,
    })
    _last_saved = step
    if wait:
        _wait_committed(None)
    return stats


def load(version=None, map_location=None):
    """Loads a state saved by save(): returns (step, state), or None when
    there is nothing to load (a fresh start: no version committed).

    version: None loads the version the agent restores after a restart (the
    last committed one); an int loads that committed version.
    map_location (like torch.load's): None puts tensors back on the device
    they were saved from (CUDA when available, else CPU with a warning); a
    device or string puts all of them there; a dict maps saved device strings
    ('cuda:0') to new ones; a callable f(cpu_tensor, saved_device_str) returns
    the tensor to use.
    """
    loaded = _load_version(get_client(), version, _FORMAT)
    if loaded is None:
        return None
    state = loaded.unpack(loaded.payload["skeleton"], map_location)
    return loaded.payload["step"], state


def wait(timeout=None):
    """Blocks until this process's last save is committed (every rank saved
    it). timeout in seconds (None: 60 s); ftrun.Error TIMEOUT when it passes.
    Returns at once when nothing was saved."""
    _wait_committed(timeout)


def _wait_committed(timeout):
    client = get_client()
    client.wait()
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
