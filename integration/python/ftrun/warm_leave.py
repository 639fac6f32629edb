"""What a generation of @ftrun.resilient (ftrun.warm) leaves behind in its
process, and what the next one needs: the process's sockets, the command
line's --local_rank, the ftrun client, the process groups (left, never
destroyed) and NCCL's abort."""

import os
import sys

def _sockets():
    """(fd, inode) of this process's sockets."""
    out = []
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return out
    for name in names:
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if link.startswith("socket:["):
            out.append((int(name), int(link[8:-1])))
    return out


def _socket_inodes():
    return {ino for _, ino in _sockets()}


def _set_local_rank_arg(local_rank):
    for i, a in enumerate(sys.argv):
        for flag in ("--local_rank=", "--local-rank="):
            if a.startswith(flag):
                sys.argv[i] = flag + str(local_rank)


def _reset_ftrun_client():
    """The next ftrun call connects anew, as this generation's rank."""
    if "ftrun.state_client" not in sys.modules:
        return
    from . import state_client

    with state_client._lock:
        client, state_client._client = state_client._client, None
        state_client._in_flight = []
    if client is not None:
        try:
            client.close()
        except Exception:  # noqa: BLE001 - the agent closed it already
            pass
    if "ftrun.state" in sys.modules:
        sys.modules["ftrun.state"]._last_saved = None


def _abort_nccl():
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    try:
        if dist.get_backend() != "nccl":
            return
        c10d = dist.distributed_c10d
        if hasattr(c10d, "_abort_process_group"):  # torch >= 2.6
            c10d._abort_process_group()
            return
        import torch

        dist.group.WORLD._get_backend(torch.device("cuda")).abort()
    except Exception as e:  # noqa: BLE001 - best effort: abort_timeout kills the process otherwise
        sys.stderr.write(f"ftrun.resilient: cannot abort the NCCL process group: {e}\n")


# The process groups of generations left after a failure. gloo's destructor
# joins its worker threads, which may wait on an operation with a peer that
# is gone until the group's timeout, and pybind runs it holding the GIL: it
# would freeze the whole process. So they are never destroyed: their
# connections are shut down, their threads idle once their operations fail.
# Not even when the interpreter exits: clearing this module then would run
# the destructors (a survivor hung after its job's last step, until the hang
# timeout), so each also holds a reference that nothing releases.
_LEFT_GROUPS = []


def _keep_forever(obj):
    import ctypes

    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
    _LEFT_GROUPS.append(obj)


def _destroy_process_group():
    """Leaves the generation's process groups; whether there were any (made,
    or begun: counted by torch)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available():
        return False
    c10d = dist.distributed_c10d
    made = dist.is_initialized() or getattr(c10d, "_group_count", 0) > 0 or \
        getattr(getattr(c10d, "_world", None), "group_count", 0) > 0
    if dist.is_initialized():
        groups = getattr(c10d, "_pg_map", None)
        if groups is None and hasattr(c10d, "_world"):
            groups = c10d._world.pg_map
        for group in list(groups or ()) + [c10d._get_default_group()]:
            _keep_forever(group)
        try:
            dist.destroy_process_group()
        except Exception as e:  # noqa: BLE001 - a broken group still goes
            sys.stderr.write(f"ftrun.resilient: destroying the process group: {e}\n")
    # A generation left inside init_process_group counted its group without
    # making it: the next one would be named "1" (its store keys' prefix)
    # where fresh processes say "0", and the rendezvous would never meet.
    if hasattr(c10d, "_group_count"):
        c10d._group_count = 0
    elif hasattr(c10d, "_world") and hasattr(c10d._world, "group_count"):
        c10d._world.group_count = 0
    return made
