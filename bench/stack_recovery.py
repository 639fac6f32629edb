"""ftrun against each training stack's own checkpoint and restart, in one run:
the figures of the README's stack sections (docs/benchmarks.md, "Per stack").

For each stack - DDP the nanoGPT way (integration/examples/train_ddp.py), a
Lightning Trainer with DDPStrategy and with FSDPStrategy in lit-gpt's
configuration (train_lightning.py [--fsdp]), a Hugging Face Trainer
(train_hf.py) - the same job, 2 nodes x 2 ranks on this machine (gloo, CPU,
OMP_NUM_THREADS=1 on both sides), three times:

* none: the four ranks started with torchrun's environment by this process
  (Relaunch), `--checkpoint none`: the step time, memory and losses without
  checkpoints (run last).
* own: the same with the stack's own checkpoint after every step
  (`--checkpoint own:DIR`, integration/examples/own_checkpoint.py: nanoGPT's
  torch.save by rank 0, Lightning's ModelCheckpoint, the Trainer's
  save_steps=1). Rank VICTIM is SIGKILLed once rank 0 has finished KILL_AT
  steps. As torchrun --max-restarts does, this process sees the death
  (polling every 0.1 s, torchrun's --monitor-interval), stops the others
  and starts all four again (a fresh MASTER_PORT, no rendezvous round: the
  status quo's best case), which resume from the stack's checkpoint.
  torchrun itself is not used because its restart does not come back here:
  with torch 2.13 and gloo, `torchrun --standalone --nproc-per-node 4
  --max-restarts 2` (and two agents at a c10d rendezvous alike) restarts
  the workers, whose gloo connectFullMesh is then refused ("timed out
  connecting: SO_ERROR: Connection refused") on every attempt until torchrun
  gives up; pytorch/pytorch#167288 reports the same with NCCL.
* dcp, dcp_async, dcp_process (DDP; --dcp picks): as own, with PyTorch's
  distributed checkpoint instead, every rank saving its part after every
  step: dcp.save; dcp.async_save with its writer in a thread; in a process
  (own_checkpoint.DcpCheckpoint: a stager kept across saves, background
  staging, the plan cached, as DCP's documentation recommends for fast
  checkpoints). The restarted job dcp.loads the newest complete one.
* torchft (DDP; --peers): the same job under torchft instead
  (integration/examples/train_torchft.py: four replica groups of one rank,
  its Lighthouse, Manager, DDP and Optimizer wrappers, as its DDP example
  sets them up; TorchftRun restarts a dead group alone). It writes no
  checkpoint: its step_overhead_s is its step time over none's. The others
  go on without the victim (others_next_step_s: the kill -> rank 0's next
  step); recovery_s is the kill -> every rank stepping again: the restarted
  group's first step (after it healed from the others, if one had state),
  and rank 0's.
  groups_restarted: how many times each group was (torchft 0.2.0's DDP hook
  can crash the others when a peer dies mid-allreduce:
  meta-pytorch/torchft#304; they then start over, healing from nobody).
* dlrover (DDP; --peers): the same job under DLRover's flash checkpoint
  (integration/examples/train_dlrover.py, DlroverRun: its master, then
  dlrover-run's agent for the four ranks, which restarts them all after a
  failure; a save to the node's shared memory after every step, to disk
  every 10). Its figures are those of own.
* nvrx (DDP; --peers): the same job under NVIDIA's resiliency extension
  (integration/examples/train_nvrx.py, NvrxRun: one ft_launcher per node,
  which restarts every rank after a failure, heartbeats to its rank
  monitors; rank 0 saves nanoGPT's checkpoint after every step through its
  asynchronous checkpointing's background process). Its figures are those of
  own.
* ftrun: `build/ftrun --num_nodes 2 --num_gpus 2` runs the same script
  saving through ftrun (the default) and the same kill. Every script runs
  under @ftrun.resilient (--resilient: the survivors stay in their
  processes, a warm standby takes the victim's place) and saves with overlap
  (--overlap: ftrun.save(overlap=True), Checkpoint(overlap=True)). The
  standbys start beside the first steps; the kill comes KILL_AT steps after
  one is up on every node, as in a job that has run a while.

Figures, per stack and side, from the moments this process reads the ranks'
lines (rank 0's `LOSS <step>` and every rank's `RESUMED`):
* step_s: the median time between two of rank 0's completed steps before the
  kill (the first two steps left out; ftrun: of the steps after the standbys
  were up, whose imports would otherwise count), and save_stall_s: that minus none's
  step_s (the time the training loop waits for the checkpoint, as the user
  feels it: on two cores the copy a background thread makes shows here too);
* recovery_s: SIGKILL -> rank 0 of the restarted job completed its first step
  (a step of DDP's completes on rank 0 only once every rank has sent its
  gradients); Lightning prints LOSS before a step's backward pass, so there the
  step is complete at the next step's first line;
* redone: steps run again after the restart (finished before the kill, not in
  the checkpoint the job resumed from).
* peak_mib: the most memory the side's job added to the machine before the
  kill (bench/job_memory.py: memory in use, page cache left out, above what
  it was at the start; mib_by_kind: the Pss of its ranks, standbys, agents,
  launchers, writer processes, Lighthouse, ..., read once, just before the
  kill), and extra_mib_per_node: that minus none's, over the 2 nodes;
  off_node_copies: what that memory buys (copies of a rank's state
  held off its node);
* exact: rank 0's losses from the first step after the restart on (COMPARE
  more; compared_steps) equal, bit for bit, the failure-free run's (none runs
  last, as far as the others went).
Ratios: stall_ratio = ftrun's save_stall_s / own's, recovery_speedup = own's
recovery_s / ftrun's; stall_ratio_vs_<dcp side> and recovery_speedup_vs_<dcp
side> the same against DCP's, DLRover's and NVRx's; recovery_speedup_vs_<peer>;
save_stall_over_best_peer (ftrun's stall over the lowest of the sides that
checkpoint) and recovery_over_best_peer (ftrun's recovery_s over the
fastest other side's). `ftrun-bench peers` runs it for DDP (--stacks ddp).

    .venv/bin/python bench/stack_recovery.py --build build [--stacks ddp,lightning,...] [--dcp dcp,dcp_async,dcp_process]
        [--peers torchft,dlrover,nvrx] [--out FILE] [--chart PNG]

Output: one JSON object on stdout (or --out); progress on stderr.
"""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from baseline_side import free_port_range, stop_processes, wait_until
from job_memory import JobMemory, descendants
import peers_chart

def log(msg):
    sys.stderr.write(f"[stack-recovery {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(HERE)
EXAMPLES = os.path.join(SOURCE, "integration", "examples")
LOSS_RE = re.compile(r"^LOSS (\d+) (\S+)")
RESUMED_RE = re.compile(r"^RESUMED (\d+) (\S+)")
STEP_RE = re.compile(r"^STEP (\d+) (\d+)")  # train_torchft.py: every group's committed steps
STARTED_RE = re.compile(r"^STARTED (\d+)")  # train_torchft.py: a group's process began

# stack -> (script, its arguments, ftrun's extra arguments, rank 0 prints LOSS after the step (else before it))
STACKS = {
    "ddp": ("train_ddp.py", [], ["--resilient", "--overlap"], True),
    "lightning": ("train_lightning.py", [], ["--resilient", "--overlap"], False),
    "lightning_fsdp": ("train_lightning.py", ["--fsdp"], ["--resilient", "--overlap"], False),
    "huggingface": ("train_hf.py", [], ["--resilient", "--overlap"], True),
}


# DCP's checkpoints, besides the stack's own, for the stacks whose script saves them (own_checkpoint.py:
# dcp.save, dcp.async_save in a thread, in a process).
DCP_SIDES = ("dcp", "dcp_async", "dcp_process")
# The fault-tolerance layers measured instead of a checkpoint and a restart (DDP only).
PEERS = ("torchft", "dlrover", "nvrx")
FTRUN_REPLICAS = 1  # ftrun's cluster.replicas (the default): copies of each rank's state on another node
NO_CHECKPOINT = ("torchft",)  # (its figure is the step time's overhead, not a save's stall)


def own_sides(stack, a):
    """The sides saving without ftrun, each restarted as torchrun does: the stack's own checkpoint, then DCP's."""
    return ["own"] + ([m for m in a.dcp if m] if STACKS[stack][0] == "train_ddp.py" else [])


def peer_sides(stack, a):
    """The fault-tolerance layers measured beside the checkpoints (DDP: torchft, DLRover, NVRx)."""
    return [m for m in a.peers if m] if STACKS[stack][0] == "train_ddp.py" else []


def warm(stack):
    """ftrun's side of the stack runs under @ftrun.resilient (its standbys and survivors recover warm)."""
    return "--resilient" in STACKS[stack][2]


def sizes(a, script):
    if script == "train_hf.py":
        return ["--vocab", str(a.vocab), "--d-model", str(a.d_model), "--layers", str(a.layers), "--seq", str(a.seq)]
    return ["--vocab", str(a.vocab), "--d-model", str(a.d_model), "--layers", str(a.layers), "--seq", str(a.seq),
            "--batch", str(a.batch), "--heads", "8"]


class Lines:
    """Every line of a launcher's output with the moment this process read it (CLOCK_MONOTONIC)."""

    def __init__(self, proc, path):
        self.items = []
        self.lock = threading.Lock()
        self.file = open(path, "w")
        self.thread = threading.Thread(target=self._read, args=(proc.stdout,), daemon=True)
        self.thread.start()

    def _read(self, stream):
        for raw in iter(stream.readline, b""):
            t = time.monotonic()
            line = raw.decode(errors="replace").rstrip("\n")
            with self.lock:
                self.items.append((t, line))
            self.file.write(f"{t:.6f} {line}\n")
        self.file.flush()

    def snapshot(self):
        with self.lock:
            return list(self.items)


class Run:
    """One side's job: its launcher processes (each its own session) and their lines."""

    def __init__(self, argvs, env, logdir, name):
        self.procs, self.lines, self.logdir, self.name = [], [], logdir, name
        self._sample_memory()
        for i, argv in enumerate(argvs):
            self._start(argv, env, str(i))

    def _sample_memory(self):
        """`memory`: what this side's job adds to the machine's memory, and its processes' Pss (job_memory.py)."""
        self.memory = JobMemory(lambda: [p.pid for p in self.procs if p.poll() is None])

    def _start(self, argv, env, label):
        """A process of the job, in a session of its own, its lines read into NAME-LABEL.log."""
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.procs.append(p)
        self.lines.append(Lines(p, os.path.join(self.logdir, f"{self.name}-{label}.log")))
        return p

    def rank_pid(self, rank, script):
        return rank_pid([p.pid for p in self.procs], rank, script)

    def merged(self):
        return sorted((x for ln in self.lines for x in ln.snapshot()), key=lambda x: x[0])

    def alive(self):
        return all(p.poll() is None for p in self.procs)

    def stop(self):
        """SIGTERM to every process group it started, SIGKILL after 20 s; then SIGKILL to what they had started
        and left (launchers start ranks in sessions of their own: a launcher's SIGKILL orphans them)."""
        self.memory.stop()
        started = descendants([p.pid for p in self.procs if p.poll() is None])
        for sig, grace in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            for p in self.procs:
                if p.poll() is None:
                    try:
                        os.killpg(p.pid, sig)
                    except ProcessLookupError:
                        pass
            deadline = time.monotonic() + grace
            for p in self.procs:
                try:
                    p.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        for pid in started:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for ln in self.lines:
            ln.thread.join(timeout=5)
            ln.file.close()


def kill_group(p):
    """What a rank started (DCP's writer process) goes with it, as torchrun kills each worker's process group."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class Restarting(Run):
    """A job whose ranks this process starts and restarts, as a launcher would: `ranks` (by global rank)
    polled every 0.1 s (torchrun's --monitor-interval) by `_check`, which restarts what it must and returns
    False once it may not (the job then failed)."""

    def __init__(self, python, argv, env, logdir, name, restarts):
        self.procs, self.lines, self.ranks = [], [], []
        self.python, self.argv, self.env, self.logdir, self.name = python, argv, env, logdir, name
        self.restarts, self.failed, self.stopping = restarts, False, False
        self._sample_memory()

    def _watch(self):
        self.monitor = threading.Thread(target=self._monitor, daemon=True)
        self.monitor.start()

    def _monitor(self):
        while not self.stopping:
            time.sleep(0.1)
            if not self.stopping and not self._check():
                self.failed = True
                return

    def rank_pid(self, rank, script):
        p = self.ranks[rank]
        return p.pid if p.poll() is None else 0

    def alive(self):
        return not self.failed

    def stop(self):
        self.stopping = True
        self.monitor.join(timeout=60)
        super().stop()
        for p in self.ranks:
            kill_group(p)


class Relaunch(Restarting):
    """torchrun's restart, done by this process: the four ranks with torchrun's environment (2 nodes x 2);
    when one fails, the others get SIGTERM (SIGKILL after 30 s, as torchrun) and all four start again on a
    fresh MASTER_PORT, up to `restarts` times. No rendezvous round: the status quo's best case."""

    def __init__(self, python, argv, env, logdir, name, restarts=3):
        super().__init__(python, argv, env, logdir, name, restarts)
        self.gen = 0
        self._launch()
        self._watch()

    def _launch(self):
        port = free_port_range(1)
        self.ranks = []
        for r in range(4):
            env = dict(self.env, RANK=str(r), WORLD_SIZE="4", LOCAL_RANK=str(r % 2), LOCAL_WORLD_SIZE="2",
                       GROUP_RANK=str(r // 2), GROUP_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       TORCHELASTIC_RESTART_COUNT=str(self.gen))
            self.ranks.append(self._start([self.python, "-u"] + self.argv, env, f"gen{self.gen}-rank{r}"))

    def _check(self):
        if not any(p.poll() not in (None, 0) for p in self.ranks):
            return True
        stop_processes(self.ranks, grace=30)
        for p in self.ranks:
            kill_group(p)
        if self.gen >= self.restarts or self.stopping:
            return False
        self.gen += 1
        self._launch()
        return True


class TorchftRun(Restarting):
    """torchft's deployment of the job (integration/examples/train_torchft.py), as its DDP example runs it:
    its Lighthouse (`torchft_lighthouse --min_replicas 1 --quorum_tick_ms 100 --join_timeout_ms 10000`),
    and four replica groups of one rank (`ranks`), each restarted alone when it dies (up to `restarts`
    times, as the group's own torchrun would), on a fresh store port. `restarted`: how many times each
    was."""

    def __init__(self, python, argv, env, logdir, name, restarts=3):
        super().__init__(python, argv, env, logdir, name, restarts)
        self.ranks, self.restarted = [None] * 4, [0] * 4
        lighthouse = os.path.join(os.path.dirname(python), "torchft_lighthouse")
        if not os.access(lighthouse, os.X_OK):
            raise RuntimeError(f"torchft is not installed beside {python} (no {lighthouse})")
        port = free_port_range(1)
        self.env = dict(env, TORCHFT_LIGHTHOUSE=f"http://127.0.0.1:{port}", NUM_REPLICA_GROUPS="4")
        self._start([lighthouse, "--min_replicas", "1", "--quorum_tick_ms", "100", "--join_timeout_ms", "10000",
                     "--bind", f"127.0.0.1:{port}"], self.env, "lighthouse")
        for g in range(4):
            self._launch(g)
        self._watch()

    def _launch(self, g):
        env = dict(self.env, REPLICA_GROUP_ID=str(g), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port_range(1)))
        self.ranks[g] = self._start([self.python, "-u"] + self.argv, env, f"group{g}-{len(self.procs)}")

    def _check(self):
        for g, p in enumerate(self.ranks):
            if self.stopping or p.poll() in (None, 0):
                continue
            kill_group(p)
            if self.restarted[g] == self.restarts:
                return False
            self.restarted[g] += 1
            self._launch(g)
        return True


class NvrxRun(Run):
    """NVIDIA's resiliency extension's deployment of the job (integration/examples/train_nvrx.py): one
    ft_launcher per node (2 x 2 ranks, a c10d rendezvous, the first launcher its host), as its docstring
    runs it, restarting every rank after a failure (--max-restarts 3), with a rank monitor beside each
    rank (heartbeat timeouts as in NVRx's examples)."""

    def __init__(self, python, argv, env, logdir, name):
        rdzv, rid = free_port_range(1), f"ftrunbench{os.getpid()}"
        launcher = [python, "-m", "nvidia_resiliency_ext.fault_tolerance.launcher", "--nnodes", "2",
                    "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{rdzv}",
                    "--rdzv-id", rid, "--local-addr", "127.0.0.1", "--max-restarts", "3",
                    "--ft-enable-nic-monitor", "false", "--ft-initial-rank-heartbeat-timeout", "120",
                    "--ft-rank-heartbeat-timeout", "60"]
        super().__init__([launcher + ["--rdzv-conf", f"is_host={int(node == 0)}"] + argv for node in range(2)],
                         env, logdir, name)


class DlroverRun(Run):
    """DLRover's deployment of the job (integration/examples/train_dlrover.py), as its docstring runs it: a
    local DLRover master, then `dlrover-run --nnodes 1 --nproc_per_node 4 --max-restarts 3`, whose agent
    restarts every worker after a failure (a new rendezvous, a fresh MASTER_PORT) and keeps the flash
    checkpoint in the node's shared memory. One agent for the four ranks: DLRover's in-memory copy is per
    node, so two agents on one machine would share it. `stop` also removes what it leaves behind (the
    shared-memory segment, its socket directory)."""

    def __init__(self, python, argv, env, logdir, name):
        bindir = os.path.dirname(python)
        run = os.path.join(bindir, "dlrover-run")
        if not os.access(run, os.X_OK):
            raise RuntimeError(f"DLRover is not installed beside {python} (no {run})")
        self.job = f"ftrunbench{os.getpid()}{name.replace('-', '')}"
        port = free_port_range(1)
        env = dict(env, DLROVER_MASTER_ADDR=f"127.0.0.1:{port}", ELASTIC_JOB_NAME=self.job,
                   DLROVER_LOG_LEVEL="WARNING")
        super().__init__([[python, "-m", "dlrover.python.master.main", "--platform", "local", "--node_num", "1",
                           "--job_name", self.job, "--port", str(port)]], env, logdir, name)
        self._start([run, "--nnodes", "1", "--nproc_per_node", "4", "--max-restarts", "3"] + argv, env, "run")

    def stop(self):
        kill_group(self.procs[0])  # the master: it ignores SIGTERM (20 s lost waiting), and holds nothing kept
        super().stop()
        shutil.rmtree(f"/tmp/ckpt_sock/{self.job}", ignore_errors=True)
        for shm in os.listdir("/dev/shm"):
            if shm.startswith(self.job + "_"):
                os.unlink(os.path.join("/dev/shm", shm))


def step_times(lines, after_step_line):
    """[(moment rank 0 completed step s, s)] in the lines' order (a step run again after a restart counts
    again): with after_step_line, the moment of the step's last LOSS line; else (Lightning: printed after the
    forward pass) the next step's first line."""
    out, firsts = [], []  # firsts: (t, step) of each step's first line
    for t, line in lines:
        m = LOSS_RE.match(line)
        if not m:
            continue
        s = int(m.group(1))
        if out and out[-1][1] == s:
            out[-1] = (t, s)
        else:
            out.append((t, s))
            firsts.append((t, s))
    if after_step_line:
        return out
    return [(t_next, s) for (t_next, _), (_, s) in zip(firsts[1:], firsts[:-1])]


def losses(lines):
    """{step: rank 0's loss as printed} (the last line printed for each step)."""
    return {int(m.group(1)): m.group(2) for _, ln in lines for m in [LOSS_RE.match(ln)] if m}


def median_step(done, upto_t):
    """The median time between two consecutive completed steps before upto_t (the first two left out)."""
    ts = [t for t, _ in done if t < upto_t]
    gaps = [b - a for a, b in zip(ts[2:], ts[3:])]
    return (statistics.median(gaps), len(gaps)) if gaps else (None, 0)


def rank_pid(root_pids, rank, script):
    """The live process of `rank` under the launchers: the one whose environment says RANK=rank and whose
    command line runs the script (a warm standby has no RANK)."""
    below = descendants(root_pids)
    want = f"RANK={rank}".encode()
    for pid in sorted(below - set(root_pids)):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if want in env and script.encode() in cmd and b"FTRUN_WARM_STANDBY=1" not in env:
            return pid
    return 0


def standbys_ready(status_file):
    """Every agent that runs ranks has a warm standby up (the runner's status file names the agents')."""
    def load(path):
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None
    st = load(status_file)
    if not st or not st.get("agents"):
        return False
    for agent in st["agents"]:
        ag = load(agent.get("status_file", ""))
        if not ag or (ag.get("ranks") and (ag.get("warm_standbys") or {}).get("ready", 0) < 1):
            return False
    return True


class Bench:
    def __init__(self, a, work):
        self.a = a
        self.work = work
        self.env = os.environ.copy()
        self.env["PYTHONPATH"] = os.path.join(a.build, "python") + (
            os.pathsep + self.env["PYTHONPATH"] if self.env.get("PYTHONPATH") else "")
        self.env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", FTRUN_PYTHON=a.python)

    def torchrun(self, script_argv, name):
        """The four ranks as torchrun starts and restarts them (Relaunch: torchrun's own restart does not come
        back with gloo here; the docstring)."""
        return Relaunch(self.a.python, script_argv, self.env, self.work, name)

    def ftrun(self, script_argv, name):
        a = self.a
        d = os.path.join(self.work, name)
        os.makedirs(d)
        cfg = os.path.join(d, "ftrun.yaml")
        with open(cfg, "w") as f:
            f.write(f"job:\n  max_restarts: 3\n  stop_grace: 2s\n  hang_timeout: 120s\n"
                    f"store:\n  memory_budget: {a.store_mib}MiB\n  chunk_size: 4MiB\n  prefault: {a.store_prefault}\n"
                    f"cluster:\n  replicas: {FTRUN_REPLICAS}\n"
                    f"agent:\n  run_dir: {d}/run\n")
        argv = [os.path.join(a.build, "ftrun"), "--num_nodes", "2", "--num_gpus", "2", "--config", cfg,
                "--status_file", os.path.join(d, "status.json"), "--master_addr", "127.0.0.1",
                "--master_port", str(free_port_range(8))] + script_argv
        return Run([argv], self.env, self.work, name)

    def side(self, stack, side, upto=0):
        """One run of a stack: none (no kill; until rank 0 has printed step UPTO's loss), or a side saving
        (one SIGKILL; then `a.compare` more steps)."""
        a = self.a
        script, extra, ftrun_extra, after = STACKS[stack]
        path = os.path.join(EXAMPLES, script)
        argv = [path, "--steps", "100000", "--seed", str(a.seed)] + sizes(a, script) + extra
        name = f"{stack}-{side}"
        ckdir = os.path.join(self.work, name + "-ckpt")
        if side in PEERS:  # the peer's own script (train_<peer>.py), saving its way (but torchft: never)
            script = f"train_{side}.py"
            argv = [os.path.join(EXAMPLES, script)] + argv[1:] + (
                [] if side in NO_CHECKPOINT else ["--checkpoint", f"{side}:{ckdir}"])
            run = {"torchft": TorchftRun, "nvrx": NvrxRun, "dlrover": DlroverRun}[side](
                self.a.python, argv, self.env, self.work, name)
        elif side == "ftrun":
            run = self.ftrun(argv + ftrun_extra, name)
        else:  # none, own, or one of DCP's
            run = self.torchrun(argv + ["--checkpoint", "none" if side == "none" else f"{side}:{ckdir}"], name)
        out = {"side": side}
        try:
            def completed(n):
                return lambda: len(step_times(run.merged(), after)) >= n
            wait_until(completed(a.kill_at), a.timeout, f"{name}: {a.kill_at} steps", alive=run.alive)
            if side == "none":
                wait_until(lambda: upto in losses(run.merged()), a.timeout, f"{name}: step {upto}",
                           alive=run.alive)
                done = step_times(run.merged(), after)
                out["step_s"], out["step_samples"] = median_step(done, float("inf"))
                out["peak_mib"], out["mib_by_kind"] = run.memory.peak_mib(), run.memory.by_kind()
                out["losses"] = losses(run.merged())
                return out
            t_steady = 0.0  # the step time is measured from here on
            if side == "ftrun" and warm(stack):
                # Warm: a standby is up on every node first, as in a job that has run a while; the step time is
                # measured after that too (the standbys start beside the first steps, and their imports of
                # the stack would be counted as save stall).
                wait_until(lambda: standbys_ready(os.path.join(self.work, name, "status.json")), a.timeout,
                           f"{name}: a warm standby up on every node", alive=run.alive)
                t_steady = time.monotonic()
                wait_until(lambda: len([x for x in step_times(run.merged(), after) if x[0] > t_steady]) >= a.kill_at,
                           a.timeout, f"{name}: {a.kill_at} steps with the standbys up", alive=run.alive)
            out["mib_by_kind"] = run.memory.by_kind()  # (once: it slows the job a moment)
            pid = wait_until(lambda: run.rank_pid(a.victim, script), 30, f"{name}: rank {a.victim}'s pid")
            t_kill = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            before = [x for x in run.merged() if x[0] < t_kill]
            done_before = step_times(before, after)
            out["step_s"], out["step_samples"] = median_step([x for x in done_before if x[0] > t_steady], t_kill)
            out["peak_mib"] = run.memory.peak_mib(t_kill)  # saving, before the kill
            last_before = max(s for _, s in done_before)

            # torchft: the others go on without restarting; every rank steps again once the victim's group,
            # restarted (its new process's STARTED: it heals only when another group has state), has completed
            # a step of its own, and rank 0 has too.
            who = str(a.victim) if side == "torchft" else "0"
            begun = STARTED_RE if side == "torchft" else RESUMED_RE

            def recovered():
                lines = [x for x in run.merged() if x[0] > t_kill]
                resumed = [i for i, (_, ln) in enumerate(lines) if begun.match(ln) and begun.match(ln).group(1) == who]
                if not resumed:
                    return None
                after_resume = lines[resumed[0]:]
                if side == "torchft":  # (and rank 0 stepped since the kill: every rank did)
                    done = [(t, int(m.group(2))) for t, ln in after_resume
                            for m in [STEP_RE.match(ln)] if m and m.group(1) == who]
                    zero = step_times(lines, after)
                    done = [(max(done[0][0], zero[0][0]), done[0][1])] if done and zero else []
                else:
                    done = step_times(after_resume, after)
                return done[0] if done else None
            t_step, first = wait_until(recovered, a.timeout, f"{name}: rank 0's first step after the restart",
                                       alive=run.alive)
            out["recovery_s"] = t_step - t_kill
            if side == "torchft":  # the other groups' pause: the kill -> rank 0's next step; who restarted
                nxt = [t for t, _ in step_times([x for x in run.merged() if x[0] > t_kill], after)]
                out["others_next_step_s"] = nxt[0] - t_kill if nxt else None
                out["groups_restarted"] = list(run.restarted)
            out["redone"] = max(0, last_before - first + 1)
            out["killed_after_step"] = last_before
            # rank 0's losses from the restart on (first .. first + compare), for `exact` (main)
            wait_until(lambda: first + a.compare in losses([x for x in run.merged() if x[0] > t_kill]), a.timeout,
                       f"{name}: {a.compare} steps after the restart", alive=run.alive)
            out["losses"] = losses([x for x in run.merged() if x[0] > t_kill])
            log(f"{name}: step {out['step_s']:.3f} s, kill -> first step {out['recovery_s']:.2f} s, "
                f"{out['redone']} step(s) redone")
            return out
        finally:
            run.stop()


# What each side's memory buys: the copies of a rank's state it keeps off the rank's node.
OFF_NODE_COPIES = {"own": 0, "dcp": 0, "dcp_async": 0, "dcp_process": 0,  # (on the node's disk)
                   "torchft": 0,  # (it heals from the other groups' live weights and keeps no copy)
                   "dlrover": 0,  # (in the node's shared memory, and every 10 steps on its disk)
                   "nvrx": 0,  # (rank 0's torch.save on the node's disk)
                   "ftrun": FTRUN_REPLICAS}  # (cluster.replicas in its config)


def figures(r, none, side):
    """A side's figures against the failure-free run's (`none`): save_stall_s (step_overhead_s for a peer that
    saves nothing), extra_mib_per_node (its peak memory above none's, per node), exact (rank 0's losses from the
    restart on equal none's, bit for bit), and what its memory buys (off_node_copies)."""
    key = "step_overhead_s" if side in NO_CHECKPOINT else "save_stall_s"
    r[key] = r["step_s"] - none["step_s"]
    if r.get("peak_mib") is not None and none.get("peak_mib") is not None:
        r["extra_mib_per_node"] = (r["peak_mib"] - none["peak_mib"]) / 2
    mine = r.pop("losses")
    r["exact"] = all(loss == none["losses"].get(s) for s, loss in mine.items())
    r["compared_steps"] = [min(mine), max(mine)]
    r["off_node_copies"] = OFF_NODE_COPIES[side]


def main():
    p = argparse.ArgumentParser(description="ftrun against each stack's own checkpoint and restart, same run")
    p.add_argument("--build", default=os.path.join(SOURCE, "build"))
    p.add_argument("--python", default=os.environ.get("FTRUN_PYTHON") or sys.executable)
    p.add_argument("--stacks", default=",".join(STACKS), help=f"a comma-separated subset of {','.join(STACKS)}")
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--kill-at", type=int, default=8, help="rank 0's completed steps before the kill")
    p.add_argument("--compare", type=int, default=3,
                   help="steps after the restart's first whose losses are compared with the failure-free run's")
    p.add_argument("--victim", type=int, default=1, help="the rank SIGKILLed (not 0: rank 0 prints the steps)")
    p.add_argument("--store-mib", type=int, default=4096,
                   help="ftrun's store.memory_budget per agent (configs/default.yaml's 4GiB)")
    p.add_argument("--store-prefault", choices=("true", "false"), default="true",
                   help="ftrun's store.prefault (true, the default: the whole budget is touched at start)")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--dcp", default=",".join(DCP_SIDES),
                   help=f"DCP's checkpoints measured beside DDP's own: a comma-separated subset of "
                   f"{','.join(DCP_SIDES)} (empty: none)")
    p.add_argument("--peers", default=",".join(PEERS),
                   help=f"fault-tolerance layers measured beside DDP: a comma-separated subset of {','.join(PEERS)} "
                   "(integration/examples/train_<peer>.py; empty: none)")
    p.add_argument("--keep", action="store_true", help="keep the logs and checkpoints")
    p.add_argument("--out", help="write the JSON here instead of stdout")
    p.add_argument("--chart", metavar="PNG", help="draw the first stack's figures there (bench/peers_chart.py)")
    a = p.parse_args()
    a.build = os.path.abspath(a.build)
    stacks = [s for s in a.stacks.split(",") if s]
    bad = [s for s in stacks if s not in STACKS]
    a.dcp = [m for m in a.dcp.split(",") if m]
    a.peers = [m for m in a.peers.split(",") if m]
    bad += [m for m in a.dcp if m not in DCP_SIDES] + [m for m in a.peers if m not in PEERS]
    if bad or not 1 <= a.victim <= 3 or a.kill_at < 5:
        p.error(f"unknown stacks or DCP modes {bad}" if bad else "--victim must be 1..3, --kill-at >= 5")
    probe = subprocess.run([a.python, "-c", "import torch"], capture_output=True, text=True)
    if probe.returncode != 0:
        p.error(f"--python {a.python} (FTRUN_PYTHON, else this interpreter) cannot import torch: "
                f"{probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else probe.returncode} "
                "(the project's: .venv/bin/python, scripts/venv.sh)")
    work = tempfile.mkdtemp(prefix="ftrun-bench-stacks-", dir="/var/tmp")
    result = {"nodes": 2, "per_node": 2, "victim": a.victim, "kill_at": a.kill_at, "stacks": {},
              "model": {k: getattr(a, k) for k in ("vocab", "d_model", "layers", "seq", "batch")}}
    ok, keep = True, False
    bench = Bench(a, work)
    for stack in stacks:
        r = result["stacks"][stack] = {}
        try:
            saving = own_sides(stack, a) + ["ftrun"]
            for side in saving:
                log(f"{stack}: {side}")
                r[side] = bench.side(stack, side)
            peers = peer_sides(stack, a)
            for side in peers:  # a peer that cannot run here keeps its row, with its error
                log(f"{stack}: {side}")
                try:
                    r[side] = bench.side(stack, side)
                except Exception as e:  # noqa: BLE001 - in its row (the logs kept)
                    r[side] = {"side": side, "error": f"{type(e).__name__}: {e}"}
                    keep = True
                    log(f"{stack}-{side}: FAILED: {r[side]['error']}")
            ran = [side for side in saving + peers if "error" not in r[side]]
            # The failure-free run last, as far as every other side's losses were compared.
            log(f"{stack}: none")
            r["none"] = none = bench.side(stack, "none", upto=max(max(r[side]["losses"]) for side in ran))
            for side in ran:
                figures(r[side], none, side)
            ft = r["ftrun"]
            for side in [x for x in ran if x != "ftrun"]:
                # ftrun over each: stall_ratio, recovery_speedup (against own); _vs_<side> (the others)
                other, suffix = r[side], "" if side == "own" else "_vs_" + side
                if "save_stall_s" in other:  # (0: ftrun's stall below none's step time, i.e. in the noise)
                    r["stall_ratio" + suffix] = (max(0.0, ft["save_stall_s"]) / other["save_stall_s"]
                                                 if other["save_stall_s"] > 0 else None)
                r["recovery_speedup" + suffix] = other["recovery_s"] / ft["recovery_s"]
            # The figures: ftrun over the best of the others (the stall: of those that checkpoint)
            others = [r[side] for side in ran if side != "ftrun"]
            stalls = [o["save_stall_s"] for o in others if "save_stall_s" in o and o["save_stall_s"] > 0]
            # (a stall below none's step time is noise: 0)
            r["save_stall_over_best_peer"] = max(0.0, ft["save_stall_s"]) / min(stalls) if stalls else None
            r["recovery_over_best_peer"] = ft["recovery_s"] / min(o["recovery_s"] for o in others) if others else None
            r["ftrun_mode"] = "warm" if warm(stack) else "cold"
            del none["losses"]
        except Exception as e:  # noqa: BLE001 - reported in the JSON, the logs kept
            r["error"] = f"{type(e).__name__}: {e}"
            ok = False
            log(f"{stack}: FAILED: {r['error']}")
    result["ok"] = ok
    if a.keep or keep or not ok:
        result["work_dir"] = work
        log(f"logs kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    if a.chart and stacks and "error" not in result["stacks"][stacks[0]]:
        peers_chart.draw(result, stacks[0], a.chart)
        log(f"chart: {a.chart}")
    text = json.dumps(result, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
