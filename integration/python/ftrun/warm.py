"""ftrun.warm: warm recovery (@ftrun.resilient). The training function runs again in the
same process when any rank fails, instead of the process being replaced::

    @ftrun.resilient
    def train(ctx):                     # ctx: a ftrun.resilient.Context
        dist.init_process_group("gloo")                   # env:// as ftrun set it for this generation
        model = ctx.keep("model", lambda: GPT(args))      # the same object in every generation of this process
        opt = torch.optim.Adam(model.parameters())
        start = ftrun.restore(model=model, optim=opt)    # in place; 0 on a fresh start
        for step in range(start, steps):
            ...
            ftrun.save(step, {"model": model.state_dict(), "optim": opt.state_dict(), "rng": ftrun.rng_state()})

    if __name__ == "__main__":
        train()

When a rank of the job fails (dies, hangs, or raises), the agent tells the
survivors to leave their generation: the main thread gets a ftrun.Restart
(a BaseException, so `except Exception` does not swallow it); a survivor
blocked in a gloo collective is released by the agent, which shuts down the
TCP connections the process opened in this generation (gloo on torch 1.13
has no abort, and torch may hold the GIL while it waits), an NCCL one by
aborting its communicators; then the process
group is destroyed and the agent starts the next generation: fresh
MASTER_PORT, RANK and the rest in os.environ, `--local_rank=` on sys.argv,
and `train(ctx)` is called again. The dead ranks' places go to warm
standbys: processes the agent started with the same command line and
FTRUN_WARM_STANDBY=1, which run the script up to the decorated call and wait
there for a rank (having made a throwaway optimizer first: torch imports
torch._dynamo and much else the first time a process makes one). So: read
RANK, LOCAL_RANK, WORLD_SIZE and the command line inside the decorated
function, not at import time. What does not depend on
the rank can be built before: @ftrun.resilient(prepare=lambda: {"model":
GPT(args)}) runs once per process before its first generation (a standby's
while it waits), and ctx.keep("model", ...) gives the prepared object.

An exception raised by the function in one rank fails the generation too
(the agent is told; the process itself is kept, and runs the next
generation). SystemExit and KeyboardInterrupt end the process as usual. A
survivor that does not leave within restart.abort_timeout is killed and
replaced: the cold restart of a job without the decorator.

Without an ftrun agent (no FTRUN_AGENT_SOCKET) the function is simply called
once. The decorator must be called from the main thread; it uses SIGUSR2
while the function runs (leave that signal to it).
"""

import faulthandler
import functools
import gc
import os
import queue
import signal
import socket
import struct
import sys
import threading
import time

from . import _ftrun
from .warm_interrupt import Interrupts
from .warm_leave import (_abort_nccl, _destroy_process_group, _drop_gradients, _reset_accelerate,
                         _reset_dcp_process, _reset_ftrun_client, _retire_connections, _set_local_rank_arg,
                         _socket_inodes)

# The frame and its fields are the agent's own codec (plugin/protocol/warm_fields.h, plugin/ipc/wire.h).
_MAGIC = _ftrun.FRAME_MAGIC
_HEADER = struct.Struct("<IHHI")
_ERROR, _WARM_HELLO, _WARM_ABORT, _WARM_PARKED, _WARM_START, _WARM_FAILED = (
    _ftrun.WARM_KINDS[k] for k in ("error", "hello", "abort", "parked", "start", "failed"))
_MAX_FRAME = 1 << 20
_SIGNAL = signal.SIGUSR2
_RESEND_S = 0.05  # the interrupt is repeated until the main thread is out of the function
_STUCK_S = 1.0  # then the threads' stacks are printed
_RENDEZVOUS_POLL_S = 0.01


class Restart(BaseException):
    """Raised in a survivor's main thread: its generation ends (a rank of
    the job failed). Let it propagate out of the decorated function."""


class Context:
    """What the decorated function is given. generation: the agent's restart
    count (0 on the first start); rank, local_rank, world_size; warm: this
    process ran an earlier generation (its objects kept with keep() are
    still there); standby: it began as a warm standby."""

    def __init__(self, runner, env, warm, standby):
        self._runner = runner
        self.generation = int(env.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.rank = int(env.get("RANK", "0"))
        self.local_rank = int(env.get("LOCAL_RANK", "0"))
        self.world_size = int(env.get("WORLD_SIZE", "1"))
        self.warm = warm
        self.standby = standby

    @property
    def restore_version(self):
        """The version this generation restores (None: a fresh start)."""
        from .state_client import get_client

        return get_client().restore_version

    def keep(self, name, factory):
        """The object kept under `name` by an earlier generation of this
        process, else factory()'s result, kept from now on. Keep what needs
        no process group (a model, its parameters' tensors): ftrun.restore
        then copies the committed state into it in place. A generation with
        nothing to restore (a fresh start) gets factory()'s result anew: no
        state of an abandoned run carries over. An object made by prepare
        (see resilient) and not used yet is given instead of factory()'s."""
        kept = self._runner.kept if self._runner is not None else {}
        fresh = self._runner.fresh if self._runner is not None else set()
        if name in fresh:  # made by prepare and never used: new, whatever this generation restores
            fresh.discard(name)
        elif name not in kept or self.restore_version is None:
            kept[name] = factory()
        if self._runner is not None:
            self._runner.interrupts.install()  # (torch is imported by now)
        return kept[name]

    def __repr__(self):
        return (f"Context(generation={self.generation}, rank={self.rank}, world_size={self.world_size}, "
                f"warm={self.warm}, standby={self.standby})")


def resilient(fn=None, *, prepare=None):
    """Decorates a training function `fn(ctx, *args, **kwargs)` for warm
    recovery (see the module docstring). Returns what fn returns.

    prepare (optional): returns a dict name -> object to keep, e.g.
    {"model": GPT(args)}; called once in each process before its first
    generation, so a warm standby builds it while it waits for a rank, and
    a dead rank's place goes to a process whose model is built already.
    ctx.keep(name, factory) then gives the prepared object. It must not
    depend on the rank (a standby has none yet)."""
    if fn is None:
        return functools.partial(resilient, prepare=prepare)

    @functools.wraps(fn)
    def run(*args, **kwargs):
        if not os.environ.get("FTRUN_AGENT_SOCKET"):
            return fn(Context(None, os.environ, False, False), *args, **kwargs)
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("ftrun.resilient: call the decorated function from the main thread")
        if os.environ.get("FTRUN_WARM_STANDBY") == "1":
            _import_first_use()
        prepared = prepare() if prepare is not None else {}
        if not isinstance(prepared, dict):
            raise TypeError("ftrun.resilient(prepare=...) must return a dict of name -> object to keep, "
                            f"not a {type(prepared).__name__}")
        return _Runner(prepared).run(fn, args, kwargs)

    return run


def _import_first_use():
    """What torch imports the first time a process makes an optimizer (torch._dynamo and what it pulls
    in: about 800 modules, 1 s of one core here), imported by a warm standby before it says it is ready:
    else a standby given a dead rank's place paid it inside the recovery (0.57 s of a 2.8 s one)."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "optim"):
        return
    try:
        torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    except Exception as e:  # noqa: BLE001 - an optimization only: the first real optimizer imports it then
        sys.stderr.write(f"ftrun.resilient: a warm standby could not make an optimizer ahead ({e})\n")


# --------------------------------------------------------------------------
# The control link to the agent


def _encode(fields):
    return _ftrun.encode_warm_fields({k: str(v).replace("\n", " ") for k, v in fields.items()})


def _decode(payload):
    return _ftrun.decode_warm_fields(payload)  # (InvalidArgumentError, a ValueError: a malformed frame)


class _Link:
    """The process's control connection to its agent (launcher/agent/warm_ranks.h)."""

    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.lock = threading.Lock()

    def send(self, kind, fields):
        payload = _encode(fields)
        with self.lock:
            self.sock.sendall(_HEADER.pack(_MAGIC, kind, 0, len(payload)) + payload)

    def _exact(self, n):
        buf = bytearray()
        while len(buf) < n:
            got = self.sock.recv(n - len(buf))
            if not got:
                raise EOFError("the agent closed the control link")
            buf += got
        return bytes(buf)

    def recv(self):
        magic, kind, _, length = _HEADER.unpack(self._exact(_HEADER.size))
        if magic != _MAGIC or length > _MAX_FRAME:
            raise EOFError(f"bad frame from the agent (magic {magic:#x}, {length} bytes)")
        return kind, _decode(self._exact(length))


# --------------------------------------------------------------------------
# One process's generations


class _Runner:
    def __init__(self, prepared):
        self.standby = os.environ.get("FTRUN_WARM_STANDBY") == "1"
        self.link = _Link(os.environ["FTRUN_AGENT_SOCKET"])
        hello = {"role": "standby" if self.standby else "rank", "job": os.environ.get("FTRUN_JOB_ID", "")}
        if not self.standby:
            hello["rank"] = os.environ.get("FTRUN_RANK", os.environ.get("RANK", ""))
        self.link.send(_WARM_HELLO, hello)
        self.kept = dict(prepared)
        self.fresh = set(prepared)  # prepared, not used by a generation yet
        self.starts = queue.Queue()
        self.generation = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.in_user = False
        self.aborting = False
        self.interrupted = False  # the Restart was raised in the main thread
        self.aborted_generation = -1
        self.leaving = threading.Event()  # set once the main thread is out of the function
        self.main_ident = threading.main_thread().ident
        self.sockets_before = set()
        self.used_rendezvous = False  # the last generation made a process group
        self.interrupts = Interrupts(self._check)  # the Restart lands inside forward and backward passes too
        # A socket never written to: polls never ready, and socket calls on it
        # do not fail the way they would on a pipe (torch's threads throw).
        self._quiet = socket.socketpair()
        threading.Thread(target=self._read, name="ftrun-warm-link", daemon=True).start()

    # The main thread ---------------------------------------------------------

    def run(self, fn, args, kwargs):
        previous = signal.signal(_SIGNAL, self._interrupt)
        try:
            warm = False
            self._begin(self._wait_start() if self.standby else None)
            while True:
                ctx = Context(self, os.environ, warm, self.standby)
                if self._await_rendezvous():  # (else told to leave before it began)
                    try:
                        try:
                            self.in_user = True
                            result = fn(ctx, *args, **kwargs)
                        finally:
                            self.in_user = False
                            self.leaving.set()
                        self.link.sock.close()
                        return result
                    except BaseException as e:  # noqa: B902 - Restart is a BaseException on purpose
                        if not self.aborting:
                            if not isinstance(e, Exception):
                                raise
                            self._raised(ctx, e)  # its own failure: the process stays
                        e.__traceback__ = None  # the generation's objects go with the frames
                        del e
                self.leaving.set()
                self._leave()
                warm = True
                self._begin(self._wait_start())
        finally:
            signal.signal(_SIGNAL, previous)
            self.interrupts.remove()

    def _await_rendezvous(self):
        """Waits, interruptibly, until this generation's rendezvous store
        (MASTER_ADDR:MASTER_PORT: the runner's, else rank 0's) takes connections: torch
        1.13 connects to it in a retry loop that holds the GIL and that no
        shut-down connection can break, so a survivor that entered it before
        rank 0 was up could not leave when told, and it retries a refused
        connection only after a second. Only where the last generation (of
        this process, or of a rank of its node: the agent's start says so)
        made a process group: a job may use none. False: told to leave."""
        addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        if not self.used_rendezvous or os.environ.get("RANK") == "0" or not addr or not (port or "").isdigit():
            return self.aborted_generation != self.generation
        while self.aborted_generation != self.generation:
            try:
                socket.create_connection((addr, int(port)), timeout=0.2).close()
                return True
            except OSError:
                time.sleep(_RENDEZVOUS_POLL_S)
        return False

    def _raised(self, ctx, e):
        self.aborting = True
        reason = f"{type(e).__name__}: {e}"[:1500]
        sys.stderr.write(f"ftrun: rank {ctx.rank} raised {reason}; leaving generation {self.generation}\n")
        self.link.send(_WARM_FAILED, {"generation": self.generation, "reason": reason})

    def _interrupt(self, signum, frame):
        self._check()

    def _check(self):
        """Raises the Restart in the main thread once this generation ends."""
        if self.aborting and self.in_user and not self.interrupted:
            self.interrupted = True
            raise Restart(f"ftrun: generation {self.generation} ends (a rank of the job failed)")

    def _wait_start(self):
        start = self.starts.get()
        if start is None:
            raise SystemExit("ftrun.resilient: the agent closed the control link")
        return start

    def _begin(self, start):
        """Enters a generation: the agent's start (None: this process was
        started as the rank, with its environment)."""
        if start is not None:
            for k, v in start.items():
                if k.startswith("env."):
                    os.environ[k[4:]] = v
            self.generation = int(start["generation"])
            # (a standby learns it here: a rank of its node left a generation that had a process group)
            self.used_rendezvous = self.used_rendezvous or start.get("rendezvous") == "1"
            _set_local_rank_arg(start["local_rank"])
        _reset_ftrun_client()
        self.sockets_before = _socket_inodes()
        self.interrupts.install()
        self.aborting = False
        self.interrupted = False
        self.leaving.clear()

    def _leave(self):
        """Out of the function: its process group goes, its objects too
        (those not kept), and the agent hears that this process is parked."""
        self.used_rendezvous = _destroy_process_group()
        _reset_accelerate()
        _reset_dcp_process()
        _drop_gradients(self.kept.values())
        _retire_connections(self.sockets_before, self._quiet[0].fileno(), int(os.environ.get("MASTER_PORT", "0") or 0))
        _reset_ftrun_client()
        self.link.send(_WARM_PARKED, {"generation": self.generation, "rendezvous": int(self.used_rendezvous)})
        gc.collect()  # (while the agent gathers the next generation)

    # The link's reader thread ------------------------------------------------

    def _read(self):
        try:
            while True:
                kind, fields = self.link.recv()
                if kind == _WARM_START:
                    self.starts.put(fields)
                elif kind == _WARM_ABORT:
                    self._abort(int(fields.get("generation", -1)))
                elif kind == _ERROR:
                    sys.stderr.write(f"ftrun.resilient: the agent refused this process: {fields}\n")
        except (EOFError, OSError, ValueError, struct.error):
            pass
        self.starts.put(None)

    def _abort(self, generation):
        self.aborted_generation = generation
        if generation != self.generation or self.aborting or self.leaving.is_set():
            return
        self.aborting = True
        _abort_nccl()  # (gloo's connections: the agent shuts them down, launcher/agent/release_connections.h)
        t0 = time.monotonic()
        dumped = False
        while not self.leaving.is_set():
            if not dumped and time.monotonic() - t0 > _STUCK_S:  # where it is stuck, for whoever reads the log
                dumped = True
                sys.stderr.write(f"ftrun: rank {os.environ.get('RANK')} has not left generation {generation} "
                                 f"after {_STUCK_S} s; its threads:\n")
                faulthandler.dump_traceback(all_threads=True)
            if not self.interrupted:
                try:
                    signal.pthread_kill(self.main_ident, _SIGNAL)
                except (OSError, ValueError):
                    return
            if self.leaving.wait(_RESEND_S):
                return
