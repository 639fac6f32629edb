"""ftrun.persisted: a saved version read back without any agent running,
from a persist directory (persist.dir) or from an `ftrun export` directory.

    step, state = ftrun.load_persisted("/data/ftrun", "my-job")           # newest complete version, rank 0
    step, state = ftrun.load_persisted("/data/ftrun", "my-job", version=120, rank=3)
    step, state = ftrun.load_exported("/data/export", rank=1)             # written by `ftrun export`

Both return what ftrun.load() returns for a state saved with ftrun.save():
(step, state), the same nesting, tensors of the saved dtypes (bfloat16
included), shapes and devices (map_location as for ftrun.load; "cpu" keeps
everything on the host), and the pickled user objects. Loading pickles runs
code from the files: load only what you trust, as with torch.load.

Lower level, without torch (numpy arrays, bfloat16 as uint16 with .dtypes
telling which, and the raw user bytes), as Client.load returns them:

    version, tensors, user_bytes = ftrun.read_persisted(dir, job, version=None, rank=0)
    version, tensors, user_bytes = ftrun.read_exported(outdir, rank=0)
    ftrun.persisted_versions(dir, job)    # [{version, complete, reason, job, world_size}], newest first

The export layout (launcher/runner/export_command.h): OUTDIR/rank<r>.safetensors
per rank, the rank's user bytes in its U8 tensor "__ftrun_user_bytes__", and
OUTDIR/index.json (job, version, world size, per rank the file and its
tensors), written last. read_exported uses the `safetensors` package when it
is importable and torch has every dtype in the file, else the small reader
below (the format is an 8-byte little-endian header length, a JSON header,
then the bytes).

Errors raise ftrun.Error with .code and .message: NOT_FOUND (no such
directory, job, version or rank file), CORRUPTION (a chunk whose hash does not
match, a malformed safetensors file; the message names the file),
FAILED_PRECONDITION (a version not complete), INVALID_ARGUMENT (a rank outside
the world size, a version not saved by ftrun.save).
"""

import json
import os
import struct

import numpy as np

from . import _ftrun

__all__ = ["load_persisted", "load_exported", "read_persisted", "read_exported", "persisted_versions",
           "USER_BYTES_TENSOR"]

USER_BYTES_TENSOR = "__ftrun_user_bytes__"
_MAX_HEADER = 100 << 20

# safetensors dtype -> (ftrun dtype name, numpy dtype of the returned array)
_DTYPES = {
    "U8": ("uint8", np.uint8), "I8": ("int8", np.int8), "I16": ("int16", np.int16),
    "I32": ("int32", np.int32), "I64": ("int64", np.int64), "F16": ("float16", np.float16),
    "BF16": ("bfloat16", np.uint16), "F32": ("float32", np.float32), "F64": ("float64", np.float64),
    "BOOL": ("bool", np.bool_), "U16": ("uint16", np.uint16), "U32": ("uint32", np.uint32),
    "U64": ("uint64", np.uint64),
}


class Exported(tuple):
    """What read_exported returns: like _ftrun.LoadResult, it unpacks as
    (version, tensors, user_bytes); .dtypes (name -> ftrun dtype name) and
    .devices (name -> 'cpu'/'cuda', the device saved from) by name only."""

    def __new__(cls, version, tensors, user_bytes, dtypes, devices):
        self = super().__new__(cls, (version, tensors, user_bytes))
        self.dtypes = dtypes
        self.devices = devices
        return self

    version = property(lambda self: self[0])
    tensors = property(lambda self: self[1])
    user_bytes = property(lambda self: self[2])



def _error(code, message):
    cls = _ftrun.InvalidArgumentError if code == "INVALID_ARGUMENT" else _ftrun.Error
    err = cls(f"{code}: {message}")
    err.code = code
    err.message = message
    return err


def _unflatten(result, map_location):
    """(step, state) from a LoadResult-like (version, tensors, user_bytes), as ftrun.load builds it."""
    from . import state  # imports torch

    loaded = state._Loaded(result, state._FORMAT)
    return loaded.payload["step"], loaded.unpack(loaded.payload["skeleton"], map_location)


# --------------------------------------------------------------------------
# The persist directory


def read_persisted(dir, job, version=None, rank=0, world_size=None):
    """One rank of a version in a persist directory as numpy arrays: a
    LoadResult (version, tensors, user_bytes; .dtypes, .devices). version
    None: the newest complete one. Every chunk's hash is checked."""
    return _ftrun.read_persisted(os.fspath(dir), job, version, rank, world_size)


def persisted_versions(dir, job):
    """The job's version directories in `dir`, newest first: dicts with
    version, complete, reason (why not complete), job and world_size."""
    return _ftrun.list_persisted(os.fspath(dir), job)


def load_persisted(dir, job, version=None, rank=0, map_location=None):
    """(step, state) of one rank, as ftrun.load() returns it, read from a
    persist directory without any agent. version None: the newest complete."""
    return _unflatten(read_persisted(dir, job, version, rank), map_location)


# --------------------------------------------------------------------------
# ftrun export directories (safetensors)


def _rank_file(outdir, rank):
    """(path, index or None) of a rank's safetensors file; outdir may also be
    the path of a .safetensors file."""
    outdir = os.fspath(outdir)
    if os.path.isfile(outdir):
        return outdir, None
    index_path = os.path.join(outdir, "index.json")
    if not os.path.isdir(outdir):
        raise _error("NOT_FOUND", f"export dir '{outdir}' does not exist")
    if not os.path.exists(index_path):
        raise _error("NOT_FOUND", f"'{index_path}' does not exist: '{outdir}' is not a finished `ftrun export` "
                     "(index.json is written last)")
    try:
        with open(index_path) as f:
            index = json.load(f)
    except ValueError as e:
        raise _error("CORRUPTION", f"'{index_path}' is not valid JSON: {e}") from e
    for entry in index.get("ranks", []):
        if entry.get("rank") == rank:
            return os.path.join(outdir, entry["file"]), index
    have = [e.get("rank") for e in index.get("ranks", [])]
    raise _error("INVALID_ARGUMENT", f"export '{outdir}' has no rank {rank} (ranks exported: {have}, of world size "
                 f"{index.get('world_size')})")


def _parse_header(f, path, size):
    raw = f.read(8)
    if len(raw) != 8:
        raise _error("CORRUPTION", f"'{path}' is too short for a safetensors file ({size} bytes)")
    (n,) = struct.unpack("<Q", raw)
    if n > _MAX_HEADER or 8 + n > size:
        raise _error("CORRUPTION", f"'{path}': header length {n} does not fit the file ({size} bytes)")
    try:
        header = json.loads(f.read(n))
    except ValueError as e:
        raise _error("CORRUPTION", f"'{path}': the safetensors header is not valid JSON: {e}") from e
    if not isinstance(header, dict):
        raise _error("CORRUPTION", f"'{path}': the safetensors header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    return header, meta, 8 + n


def _read_small(path):
    """The built-in reader: {name: numpy array}, metadata, header."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        header, meta, start = _parse_header(f, path, size)
        data = bytearray(size - start)
        if f.readinto(data) != len(data):
            raise _error("CORRUPTION", f"'{path}' ended early")
    arrays = {}
    for name, info in header.items():
        try:
            dtype = _DTYPES[info["dtype"]][1]
            shape = tuple(int(d) for d in info["shape"])
            begin, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError) as e:
            raise _error("CORRUPTION", f"'{path}': tensor '{name}' has a bad entry {info!r} ({e})") from e
        count = int(np.prod(shape, dtype=np.int64))
        if not 0 <= begin <= end <= len(data) or end - begin != count * np.dtype(dtype).itemsize:
            raise _error("CORRUPTION", f"'{path}': tensor '{name}' {info['dtype']}{list(shape)} has data offsets "
                         f"[{begin}, {end}] that do not fit it or the file's {len(data)} data bytes")
        arrays[name] = np.frombuffer(memoryview(data)[begin:end], dtype=dtype).reshape(shape)
    return arrays, meta, header


_TORCH_HAS = ("U8", "I8", "I16", "I32", "I64", "F16", "BF16", "F32", "F64", "BOOL")


def _read_package(path):
    """The `safetensors` package's reader, when it and torch are importable and
    torch has every dtype in the file; None otherwise."""
    try:
        import torch
        from safetensors import safe_open
    except ImportError:
        return None
    with open(path, "rb") as f:
        header, _, _ = _parse_header(f, path, os.path.getsize(path))
    if any(not isinstance(v, dict) or v.get("dtype") not in _TORCH_HAS for v in header.values()):
        return None
    arrays = {}
    with safe_open(path, framework="pt") as f:
        meta = f.metadata() or {}
        for name in f.keys():
            t = f.get_tensor(name)
            if t.dtype == torch.bfloat16:
                arrays[name] = t.view(torch.int16).numpy().view(np.uint16)
            else:
                arrays[name] = t.numpy()
    return arrays, meta, header


def read_exported(outdir, rank=0):
    """One rank of an `ftrun export` as numpy arrays: an Exported
    (version, tensors, user_bytes; .dtypes, .devices), like read_persisted.
    outdir: the export directory (its index.json names the rank's file), or
    one rank<r>.safetensors file."""
    path, index = _rank_file(outdir, rank)
    arrays, meta, header = _read_package(path) or _read_small(path)
    user_name = meta.get("ftrun.user_bytes", USER_BYTES_TENSOR)
    user = arrays.pop(user_name, None)
    if user is None:
        raise _error("INVALID_ARGUMENT", f"'{path}' has no tensor '{user_name}': not written by `ftrun export`")
    header.pop(user_name, None)
    version = meta.get("ftrun.version", index.get("version") if index else None)
    devices = {}
    if index is not None:
        for entry in index["ranks"]:
            if entry.get("rank") == rank:
                devices = {t["name"]: t.get("device", "cpu") for t in entry.get("tensors", [])}
    dtypes = {name: _DTYPES[info["dtype"]][0] for name, info in header.items()}
    return Exported(int(version) if version is not None else None, arrays, bytes(user), dtypes,
                    {name: devices.get(name, "cpu") for name in arrays})


def load_exported(outdir, rank=0, map_location=None):
    """(step, state) of one rank, as ftrun.load() returns it, read from the
    safetensors files `ftrun export` wrote (no agent, no persist dir)."""
    return _unflatten(read_exported(outdir, rank), map_location)
