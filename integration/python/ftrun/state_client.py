"""What ftrun.state and ftrun.deepspeed share in a rank: the ftrun.Client
connected on first use, the settings configure() sets (the client, pinned
staging of CUDA tensors), warnings given once, and ftrun.Error with its code."""

import os
import threading
import warnings

from . import _ftrun

_lock = threading.Lock()
_client = None
_writer = None          # (pid, ftrun.Client): this process's connection as a writer of its rank
_pin_memory = True
_staging = {}           # tensor name -> pinned host buffer for CUDA tensors
_in_flight = []         # CUDA buffers the last save's copies read (until wait() or the next save)
_warned = set()


def get_client():
    """The module's ftrun.Client, connected on first use ($FTRUN_AGENT_SOCKET,
    $FTRUN_RANK); shared with ftrun.deepspeed."""
    global _client
    with _lock:
        if _client is None:
            _client = _ftrun.Client()
        return _client


def get_writer_client(fresh=False):
    """A connection for a process of the rank's process group that is not the
    rank (DCP's process checkpointer: dcp.async_save's background process): it
    saves for the rank beside the rank's own connection. fresh: a new one (the
    last one's generation ended: a warm recovery kept this process)."""
    global _writer
    with _lock:
        mine = _writer is not None and _writer[0] == os.getpid()
        if fresh and mine:
            _writer[1].close()
        if fresh or not mine:
            _writer = (os.getpid(), _ftrun.Client(writer=True))
        return _writer[1]


def configure(client=None, pin_memory=None):
    """Optional settings. client: an ftrun.Client to use instead of the lazily
    connected one. pin_memory (default True): where CUDA tensors are staged
    on the host (those off the current device, a libftrun without CUDA,
    FTRUN_CUDA_STAGING=1; see ftrun.state), use reused pinned host buffers
    (faster copies, memory kept between saves); False copies them with
    .cpu() every time and frees the buffers."""
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
