"""ftrun: fault-tolerant training snapshots kept in the node agent's memory.

A rank connects to its node's agent and saves its state every step; after a
restart it loads the version the agent says to restore::

    import ftrun

    with ftrun.Client() as client:          # $FTRUN_AGENT_SOCKET, $FTRUN_RANK
        start = 0
        if client.restore_version is not None:
            version, tensors, user_bytes = client.load(client.restore_version)
            start = version + 1
        for step in range(start, steps):
            ...
            client.save(step, {"w": weights_numpy}, user_bytes=b"...")

Tensors are any objects with the buffer protocol (numpy arrays, bytearray,
memoryview); see help(Client.save) and help(Client.load), including how
bfloat16 is passed in and comes back.

PyTorch users save and load whole training states (nested dicts, lists and
tuples of CPU/CUDA tensors of any dtype, optimizer state, RNG states, any
picklable object) with the functions of ftrun.state, re-exported here::

    resumed = ftrun.load()                  # None at a fresh start, else (step, state)
    ...
    ftrun.save(step, {"model": model.state_dict(), "optim": opt.state_dict(),
                      "rng": ftrun.rng_state(), "data_pos": pos})

ftrun.save, load, wait, rng_state, set_rng_state and restore_into (and the
submodules ftrun.state, ftrun.deepspeed, a DeepSpeed checkpoint engine,
ftrun.sharded, DTensor / ShardedTensor local shards, and ftrun.dcp, a
torch.distributed.checkpoint storage backend) import torch on first use only:
`import ftrun` alone does not need torch.

Errors: a failed call raises Error (a RuntimeError) with .code, the status
code name ('TIMEOUT', 'RESOURCE_EXHAUSTED', ...), and .message; a code of
INVALID_ARGUMENT raises InvalidArgumentError, which is also a ValueError.

Warm recovery: a training function decorated with @ftrun.resilient runs
again in the same process after any rank fails (its process group torn down
and rebuilt, the dead ranks' places taken by warm standbys), and
ftrun.restore(model=..., optim=...) puts the committed version back into the
live model and optimizer in place (ftrun.warm, ftrun.in_place).

Without any agent, ftrun.load_persisted(dir, job, version=None, rank=0) reads
a version from a persist directory (persist.dir) and ftrun.load_exported(outdir,
rank=0) one that `ftrun export` wrote as safetensors; both return (step, state)
as ftrun.load() does (ftrun.persisted; read_persisted, read_exported and
persisted_versions give the raw numpy arrays and user bytes, without torch).

The low-level names re-export the compiled extension ``_ftrun``, found next
to this file or, failing that, on sys.path.
"""

try:
    from . import _ftrun
except ImportError as _packaged_error:
    try:
        import _ftrun
    except ImportError as _path_error:
        raise ImportError(
            "ftrun: cannot import the compiled extension _ftrun: not next to "
            f"{__file__} ({_packaged_error}) nor on sys.path ({_path_error})"
        ) from _path_error

Client = _ftrun.Client
Error = _ftrun.Error
InvalidArgumentError = _ftrun.InvalidArgumentError
LoadResult = _ftrun.LoadResult
LATEST = _ftrun.LATEST

__all__ = ["Client", "Error", "InvalidArgumentError", "LoadResult", "LATEST"]

# The torch layer, imported on first use so that `import ftrun` needs no torch.
_STATE_NAMES = ("save", "load", "wait", "rng_state", "set_rng_state", "restore_into", "get_client", "configure")
_PERSISTED_NAMES = ("load_persisted", "load_exported", "read_persisted", "read_exported", "persisted_versions")
_SUBMODULES = ("state", "deepspeed", "persisted", "sharded", "dcp", "warm", "in_place", "huggingface", "lightning",
               "accelerate")
_RESILIENT_NAMES = ("resilient", "Restart")


def __getattr__(name):
    if name in _STATE_NAMES:
        from . import state

        return getattr(state, name)
    if name in _RESILIENT_NAMES:  # (no torch needed)
        import importlib

        return getattr(importlib.import_module(f"{__name__}.warm"), name)
    if name == "restore":
        import importlib

        return importlib.import_module(f"{__name__}.in_place").restore
    if name in _PERSISTED_NAMES:
        from . import persisted

        return getattr(persisted, name)
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_STATE_NAMES) | set(_PERSISTED_NAMES) | set(_SUBMODULES)
                  | set(_RESILIENT_NAMES) | {"restore"})
