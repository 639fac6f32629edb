"""What a generation of @ftrun.resilient (ftrun.warm) leaves behind in its
process, and what the next one needs: the process's sockets, the command
line's --local_rank, the ftrun client, the process groups (left, never
destroyed), accelerate's process-wide state and NCCL's abort."""

import os
import socket
import sys

def _fd_links():
    """(fd, what it links to) of this process's open descriptors."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return
    for name in names:
        try:
            yield int(name), os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue


def _sockets():
    """(fd, inode) of this process's sockets."""
    return [(fd, int(link[8:-1])) for fd, link in _fd_links() if link.startswith("socket:[")]


def _socket_inodes():
    return {ino for _, ino in _sockets()}


def _epoll_watched():
    """(fd, inode) of every file this process's epoll instances watch, from
    /proc/self/fdinfo ("tfd: <fd> events: .. ino:<hex inode> .." lines)."""
    out = set()
    for fd, link in _fd_links():
        if link != "anon_inode:[eventpoll]":
            continue
        try:
            with open(f"/proc/self/fdinfo/{fd}") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) >= 2 and fields[0] == "tfd:":
                ino = next((w[4:] for w in fields if w.startswith("ino:")), None)
                if ino is not None:
                    out.add((int(fields[1]), int(ino, 16)))
    return out


def _retire_connections(before, quiet_fd, master_port):
    """The left groups' TCP connections (shut down by the agent; not among
    the socket inodes `before`) are swapped for quiet_fd, a socket that never
    polls ready: the store client's listener of a group that is never
    destroyed would otherwise spin on their hang-ups for the rest of the
    process. dup2 replaces each in place, so the descriptor numbers stay the
    left group's (never closed here).

    A connection an epoll loop watches (gloo's pairs) is left to that loop:
    it handles the hang-up itself, unregistering and closing it, and a
    descriptor swapped under it fails that epoll_ctl(DEL) with ENOENT, which
    gloo's pair turns into std::terminate (a survivor died of it mid-recovery).
    Listening sockets and connections of the rendezvous store's own port stay."""
    watched = _epoll_watched()
    for fd, ino in _sockets():
        if ino in before or (fd, ino) in watched:
            continue
        try:
            s = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            tcp = s.family in (socket.AF_INET, socket.AF_INET6) and s.type == socket.SOCK_STREAM
            if not tcp or s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) or s.getsockname()[1] == master_port:
                continue
        except OSError:
            continue
        finally:
            s.close()
        try:
            if os.fstat(fd).st_ino == ino:  # still that socket
                os.dup2(quiet_fd, fd, inheritable=False)
        except OSError:
            continue


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
    if "ftrun.save_behind" in sys.modules:  # an overlapped save of the abandoned generation: not this one's
        sys.modules["ftrun.save_behind"].abandon()
    if client is not None:
        try:
            client.close()
        except Exception:  # noqa: BLE001 - the agent closed it already
            pass
    if "ftrun.state" in sys.modules:
        sys.modules["ftrun.state"]._last_saved = None


def _reset_accelerate():
    """accelerate (under a Hugging Face Trainer too) keeps the process's distributed setup in singletons
    (PartialState, AcceleratorState, GradientState) made once per process: the next generation's would
    still name the left process group and this rank's old place, and never make the new group."""
    state = sys.modules.get("accelerate.state")
    if state is None:
        return
    state.AcceleratorState._reset_state(reset_partial_state=True)
    state.GradientState._reset_state()


def _drop_gradients(kept):
    """The gradients of the step a generation left, in the modules and tensors it kept (ctx.keep): the next
    generation finds none, as a fresh process would. (A first backward pass would add to them; and
    torch.distributed.checkpoint's get_state_dict, finding gradients, would not make the optimizer state
    that a dcp.load fills: the optimizer would silently start anew.)"""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    for obj in kept:
        if isinstance(obj, torch.nn.Module):
            for p in obj.parameters():
                p.grad = None
        elif isinstance(obj, torch.Tensor) and obj.requires_grad:
            obj.grad = None


def _reset_dcp_process():
    """dcp.async_save's process checkpointer keeps one background process per rank for the process's life
    (torch.distributed.checkpoint._async_process_executor._CHECKPOINT_PROCESS), joined with the other ranks'
    in a process group of its own: after a warm recovery that group still waits for the dead rank's, and the
    next generation's fresh ranks make new ones that wait for the survivors'. It goes with the generation
    (killed: it may be inside a collective with a dead peer); the next async_save starts a new one, in the
    new generation's group, and its ftrun.dcp writer connects anew."""
    executor = sys.modules.get("torch.distributed.checkpoint._async_process_executor")
    process = getattr(executor, "_CHECKPOINT_PROCESS", None)
    if process is None:
        return
    executor._CHECKPOINT_PROCESS = None
    child = getattr(process, "_save_process", None)
    if child is not None and child.is_alive():
        child.kill()
        child.join(timeout=10)


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
