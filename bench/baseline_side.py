"""What both sides of `ftrun-bench baseline-torch` share: the progress log,
free ports, waiting for a condition while the job lives, and Side, one
side's directory, environment and train_gpt.py arguments."""
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time


def log(msg):
    sys.stderr.write(f"[baseline-torch {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


def free_port_range(n):
    """A base port with base .. base+n-1 free, below the kernel's ephemeral ports (an outgoing connection
    never takes one of them before a later generation binds it)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            top = min(40000, int(f.read().split()[0]))
    except (OSError, ValueError, IndexError):
        top = 32768
    for _ in range(200):
        base = 10000 + int.from_bytes(os.urandom(2), "little") % (top - n - 10000)
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range")


class Side:
    def __init__(self, name, a, work):
        self.name = name
        self.a = a
        self.world = a.nodes * a.per_node
        self.dir = os.path.join(work, name)
        os.makedirs(self.dir)
        self.env = os.environ.copy()
        # The ftrun package beside the programs: a build tree's python/, an install tree's lib/ftrun/python.
        beside = [os.path.join(a.build, "python"), os.path.join(a.build, "..", "lib", "ftrun", "python")]
        pypath = next((d for d in beside if os.path.isdir(d)), beside[0])
        self.env["PYTHONPATH"] = pypath + (os.pathsep + self.env["PYTHONPATH"] if self.env.get("PYTHONPATH") else "")
        self.env["FTRUN_PYTHON"] = a.python
        self.env["PYTHONUNBUFFERED"] = "1"
        self.env.pop("OMP_NUM_THREADS", None)

    def script_args(self):
        a = self.a
        return [a.script, "--layers", str(a.layers), "--d-model", str(a.d_model), "--heads", str(a.heads),
                "--vocab", str(a.vocab), "--seq", str(a.seq), "--batch", str(a.batch), "--steps", "1000000",
                "--backend", "gloo", "--timing"]


def stop_processes(procs, sig=signal.SIGTERM, grace=2.0):
    """Sends sig to every live process of procs and waits up to grace seconds in all; SIGKILLs the rest (as
    torchrun and DeepSpeed's launcher stop a job's other ranks)."""
    for p in procs:
        if p.poll() is None and p.pid > 0:
            p.send_signal(sig)
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def exit_watch(pid):
    """Watches `pid` (opened before it is killed): a function that returns the moment it exited (a pidfd
    polled from a thread: the kernel's part of a death, which no detector can beat), or None."""
    fd = os.pidfd_open(pid)
    seen = {}

    def watch():
        try:
            if select.select([fd], [], [], 120)[0]:
                seen["t"] = time.monotonic()
        finally:
            os.close(fd)

    th = threading.Thread(target=watch, daemon=True)
    th.start()

    def exited():
        th.join(timeout=120)
        return seen.get("t")
    return exited


def wait_until(pred, timeout, what, poll=0.02, alive=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        if alive is not None and not alive():
            raise RuntimeError(f"{what}: the job ended")
        time.sleep(poll)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
