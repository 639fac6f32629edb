"""Helpers for ftrun's integration tests: real agents, real rank processes.

Every test runs ftrun-agent from the build tree with the synthetic trainer
(or a Python rank), kills things with real signals, and compares the final
state digests with a failure-free run of the same trainer.
"""
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

BUILD = os.environ.get("FTRUN_BUILD_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "build"))
SOURCE = os.environ.get("FTRUN_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
AGENT = os.path.join(BUILD, "ftrun-agent")
# The Python that runs Python ranks and trainers: FTRUN_TEST_PYTHON (CTest sets
# it: the project's .venv/ with torch 2.13, or a GPU machine's venv), else the
# one running the test.
PY = os.environ.get("FTRUN_TEST_PYTHON") or sys.executable
TRAINER = os.path.join(BUILD, "ftrun-synthetic")
DIGEST_RE = re.compile(r"^DIGEST (\d+) ([0-9a-f]{32})$", re.M)


class Scratch:
    """The temporary directories and started jobs of one test, or of a test
    module's shared setup (tests/conftest.py makes one per test and per
    module): the directories go when the test passed, and stay, for a look,
    when it failed; jobs still running at the end are stopped."""

    def __init__(self):
        self.dirs = []
        self.procs = []

    def stop_processes(self):
        """SIGTERM to every job still running (an agent or a runner stops its ranks), SIGKILL after 30 s."""
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def remove(self):
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)


_owners = [Scratch()]  # the innermost last; the first one (outside pytest) is never cleaned up


def push_scratch():
    _owners.append(Scratch())
    return _owners[-1]


def pop_scratch(owner):
    _owners.remove(owner)


def remove_stale_deepspeed_shm():
    """DeepSpeed's CPU allreduce (its shm comm op) leaves a 66 MiB buffer per rank in /dev/shm at every run
    (/dev/shm/deepspeed_allreduce_buffer_*), and never removes it, even when the run ends well: a suite of
    DeepSpeed runs filled 11 GiB of this machine's RAM, and the tests after it stalled long enough to miss
    heartbeats. The buffers no live process maps or holds open, untouched for a minute, are removed.
    A rank creating its buffer holds it open (shm_open, then a 66 MiB write) before it maps it, and its peers
    spin until the file exists: removing it in that window (another test's ranks starting beside this one)
    left a DeepSpeed job spinning in shm_initialize until the test's timeout."""
    import glob
    stale = {p for p in glob.glob("/dev/shm/deepspeed_allreduce_buffer_*") if _untouched_for(p, 60)}
    if not stale:
        return
    for maps in glob.glob("/proc/[0-9]*/maps"):
        try:
            with open(maps) as f:
                for line in f:
                    if "/dev/shm/deepspeed_allreduce_buffer_" in line:
                        stale.discard(line.split(None, 5)[-1].strip().replace(" (deleted)", ""))
        except OSError:
            continue
    for fd in glob.glob("/proc/[0-9]*/fd/*"):
        try:
            stale.discard(os.readlink(fd))
        except OSError:
            continue
    for path in stale:
        try:
            os.unlink(path)
        except OSError:
            pass


def _untouched_for(path, seconds):
    try:
        return time.time() - os.stat(path).st_mtime > seconds
    except OSError:
        return False


def scratch(prefix):
    """A temporary directory for the current test (persist directories, logs,
    run directories: some hold GiB): removed when the test passed, kept and
    named in its failure report when it failed (the `scratch` fixture)."""
    d = tempfile.mkdtemp(prefix=prefix)
    _owners[-1].dirs.append(d)
    return d


def started(proc):
    """Registers a job's process with the current test, which stops it if it still runs at the end."""
    _owners[-1].procs.append(proc)
    return proc


def digests(text):
    return {int(r): d for r, d in DIGEST_RE.findall(text)}


def golden(nranks, trainer_args):
    """Digests of a failure-free run without any agent. The emulated compute
    (--step-ms) changes no byte, so the golden run goes without it."""
    args = list(trainer_args)
    if "--step-ms" in args:
        args[args.index("--step-ms") + 1] = "0"
    out = {}
    for r in range(nranks):
        p = subprocess.run([TRAINER, "--no-ftrun", "--rank", str(r)] + args,
                           capture_output=True, text=True, check=True)
        out.update(digests(p.stdout))
    return out


def kill_all(pids):
    """SIGKILL to every pid given (0 and negatives, which would mean a process
    group, are skipped); gone ones are fine."""
    for pid in pids:
        if pid and pid > 0:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def read_json(path):
    """A JSON file's content; None while it does not exist or is being written."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


class _Watched:
    """A started process (self.proc) that keeps a JSON status file (self.status)."""

    # What wait_for returns when the process exits first: its last state
    # (Job) or None (ClusterJob).
    state_on_exit = True

    def state(self):
        return read_json(self.status)

    def wait_for(self, pred, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            st = self.state()
            if st is not None and pred(st):
                return st
            if self.proc.poll() is not None:
                return self.state() if self.state_on_exit else None
            time.sleep(0.02)
        return None


class Job(_Watched):
    """One ftrun-agent with its ranks, in a private run dir."""

    def __init__(self, nranks, trainer_args, config="", job_id=None, extra=(), command=None, env=None):
        self.dir = scratch("ftrun-it-")
        self.config = os.path.join(self.dir, "ftrun.yaml")
        self.status = os.path.join(self.dir, "status.json")
        self.job_id = job_id or "it-%d" % random.randrange(1 << 30)
        with open(self.config, "w") as f:
            f.write("agent:\n  run_dir: %s/run\n" % self.dir + config)
        cmd = command or ([TRAINER] + trainer_args)
        # A port range of its own (generation g gets MASTER_PORT base+g): tests running side by side on the
        # agent's default port met at each other's rendezvous and hung.
        port = [] if any(str(e).startswith("--master_port") for e in extra) else \
            ["--master_port", str(free_port_range(8))]
        self.argv = [AGENT, "--config", self.config, "--nproc", str(nranks), "--job-id", self.job_id,
                     "--status-file", self.status, "--no_python", "--no_local_rank", *port, *extra, "--", *cmd]
        self.out = open(os.path.join(self.dir, "out.log"), "w+")
        self.proc = started(subprocess.Popen(self.argv, stdout=self.out, stderr=subprocess.STDOUT,
                                             env=env or os.environ.copy()))

    def rank_pid(self, rank):
        st = self.state()
        return st["ranks"][rank]["pid"] if st else 0

    def wait(self, timeout=300):
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
            print("agent timed out", flush=True)
        self.out.flush()
        self.out.seek(0)
        self.log = self.out.read()
        return rc

    def kill_rank(self, rank, sig=signal.SIGKILL):
        pid = self.rank_pid(rank)
        if pid:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                return False
            return True
        return False


RUNNER = os.path.join(BUILD, "ftrun")


class ClusterJob(_Watched):
    """An `ftrun` runner with N local nodes (agents) and their ranks."""

    state_on_exit = False

    def __init__(self, nodes, ranks_per_node, trainer_args, config="", spares=0, extra=(), env=None):
        self.dir = scratch("ftrun-cl-")
        self.config = os.path.join(self.dir, "ftrun.yaml")
        self.status = os.path.join(self.dir, "status.json")
        with open(self.config, "w") as f:
            f.write("agent:\n  run_dir: %s/run\n" % self.dir + config)
        self.argv = [RUNNER, "--num_nodes", str(nodes), "--num_gpus", str(ranks_per_node), "--spares", str(spares),
                     "--config", self.config, "--status_file", self.status, "--no_python", "--no_local_rank",
                     *extra, TRAINER, *trainer_args]
        self.out = open(os.path.join(self.dir, "out.log"), "w+")
        self.proc = started(subprocess.Popen(self.argv, stdout=self.out, stderr=subprocess.STDOUT,
                                             env=env or os.environ.copy()))
        self.log = ""

    def agent_state(self, agent):
        st = self.state()
        try:
            return read_json(st["agents"][agent]["status_file"]) if st else None
        except IndexError:
            return None

    def last_written(self, agent):
        """The newest version the agent's flusher wrote to the persist directory (None: none yet)."""
        return ((self.agent_state(agent) or {}).get("persist") or {}).get("last_written_version")

    def kill_node(self, node, sig=signal.SIGKILL):
        """Kills a node whole: its agent and its ranks (the store goes with them)."""
        st = self.state()
        agent = st["nodes"][node]["agent"]
        if agent is None:
            return False
        ast = self.agent_state(agent) or {}
        pids = [r["pid"] for r in ast.get("ranks", []) if r.get("pid")]
        pids.append(st["agents"][agent]["pid"])
        killed = False
        for pid in pids:
            if not pid or pid <= 0:  # 0 would be our own process group
                continue
            try:
                os.kill(pid, sig)
                killed = True
            except ProcessLookupError:
                pass
        return killed

    def kill_whole(self, st):
        """SIGKILL to the runner and, as its status `st` names them, every agent and rank: the job dies whole, as
        on a machine that went down, with no drain to disk."""
        pids = [self.proc.pid]
        for a in range(len(st["agents"])):
            ast = self.agent_state(a) or {}
            pids += [ast.get("agent_pid")] + [r.get("pid") for r in ast.get("ranks", [])]
        kill_all(pids)

    def wait(self, timeout=300):
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                rc = self.proc.wait()
            print("runner timed out", flush=True)
            rc = "timeout"
        self.out.flush()
        self.out.seek(0)
        self.log = self.out.read()
        return rc


def ephemeral_low():
    """The lowest port the kernel gives outgoing connections: a port below it is taken only by a bind."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port_range(n):
    """A base port with base .. base+n-1 free (ftrun gives generation g MASTER_PORT base+g), below the
    ephemeral ports: free now, a port there could still be taken by any test's outgoing connection before a
    later generation binds it (a restart then fails with EADDRINUSE)."""
    pick = random.SystemRandom()
    top = min(40000, ephemeral_low())
    for _ in range(200):
        base = pick.randrange(10000, top - n)
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


class ScriptClusterJob(ClusterJob):
    """ClusterJob running a Python script as every rank (ftrun runs
    `$FTRUN_PYTHON -u SCRIPT ... --local_rank=N`, FTRUN_PYTHON being PY), with
    this build's ftrun package first on PYTHONPATH and MASTER_PORT base ..
    base+ports-1 free (one per generation)."""

    def __init__(self, script, script_args, nodes, per_node, config="", prefix="ftrun-py-", ports=4, spares=0):
        self.dir = scratch(prefix)
        self.config = os.path.join(self.dir, "ftrun.yaml")
        self.status = os.path.join(self.dir, "status.json")
        with open(self.config, "w") as f:
            f.write("agent:\n  run_dir: %s/run\n" % self.dir + config)
        self.script = script
        self.master_port = free_port_range(ports)
        self.argv = [RUNNER, "--num_nodes", str(nodes), "--num_gpus", str(per_node), "--spares", str(spares),
                     "--config", self.config, "--status_file", self.status, "--master_addr", "127.0.0.1",
                     "--master_port", str(self.master_port), script, *script_args]
        env = os.environ.copy()
        env["FTRUN_PYTHON"] = PY
        pypath = os.path.join(os.path.abspath(BUILD), "python")
        env["PYTHONPATH"] = pypath + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.out = open(os.path.join(self.dir, "out.log"), "w+")
        self.proc = started(subprocess.Popen(self.argv, stdout=self.out, stderr=subprocess.STDOUT, env=env))
        self.log = ""

    def rank_pid(self, rank):
        """The pid of a global rank, from its node's agent status file."""
        st = self.state()
        if not st:
            return 0
        for node in st["nodes"]:
            if node.get("agent") is None:
                continue
            for r in (self.agent_state(node["agent"]) or {}).get("ranks", []):
                if r.get("rank") == rank and not r.get("finished"):
                    return r.get("pid") or 0
        return 0

    def runs_script(self, pid):
        """The pid is a live rank of this job's script (not a recycled pid)."""
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return os.path.basename(self.script).encode() in f.read()
        except OSError:
            return False

    def kill_after_commits(self, rank, after, rng, timeout):
        """Once the job runs with version `after` or newer committed, SIGKILLs
        a global rank mid-step: (its pid, the committed version then), or
        None when the job never got there or the rank was gone; and the
        status seen."""
        st = self.wait_for(lambda s: s.get("phase") == "running" and s.get("committed_version") is not None
                           and s["committed_version"] >= after, timeout=timeout)
        pid = self.kill_rank_mid_step(rank, rng) if st is not None else None
        return ((pid, st["committed_version"]) if pid else None), st

    def kill_rank_mid_step(self, rank, rng):
        """SIGKILLs a global rank at a random moment of its step (in a
        collective, a save or a sleep); its pid, or None when it is gone."""
        time.sleep(rng.uniform(0.0, 0.08))
        pid = self.rank_pid(rank)
        if pid <= 0 or not self.runs_script(pid):
            return None
        try:
            os.kill(pid, signal.SIGKILL)
            return pid
        except ProcessLookupError:
            return None


def torch_sees_gpu():
    """Whether PY's torch sees a CUDA device (the GPU tests skip otherwise)."""
    probe = subprocess.run([PY, "-c", "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"],
                           capture_output=True, timeout=120)
    return probe.returncode == 0


def seeded_rng():
    """A random.Random seeded from FTRUN_TEST_SEED (else the time); the seed is printed, to replay a failure."""
    seed = int(os.environ.get("FTRUN_TEST_SEED", time.time()))
    print("seed", seed, "(set FTRUN_TEST_SEED to replay)")
    return random.Random(seed)


def require_netns():
    """Skips the calling test where network namespaces cannot be made here (the reason given)."""
    import pytest
    from ftrun_chaos import netns_cluster
    ok, why = netns_cluster.available()
    if not ok:
        pytest.skip(why)
