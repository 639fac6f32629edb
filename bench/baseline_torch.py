"""The process work of `ftrun-bench baseline-torch` (bench/baseline_torch_bench.cc
runs it and reports its figures; it also runs alone and prints the same JSON).

The same job twice, in this run: integration/examples/train_gpt.py on NODES x
PER_NODE ranks (torch.distributed, gloo, ZeroRedundancyOptimizer(Adam)), the
model sized so that every rank's saved tensors - the replicated model plus
its Adam shard - are at least 256 MiB.

* Status quo: this script spawns the ranks itself with torchrun's environment
  (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
  MASTER_PORT); every rank `torch.save`s its state to local disk every step
  (`--checkpoint torch:DIR`: written, fsync'd, renamed). Once every rank has
  saved SAVES times, one rank is SIGKILLed; as soon as its death is seen
  (waitpid, polled every 2 ms) the others get SIGTERM (SIGKILL after 2 s), as
  torchrun and DeepSpeed's launcher do when one rank dies, and all ranks are
  relaunched at once on a fresh MASTER_PORT. They `torch.load` the newest step
  every rank has complete. This is an idealized torchrun: no monitor
  interval (torchrun's default is 5 s), no rendezvous round.
* ftrun: `build/ftrun --num_nodes NODES --num_gpus PER_NODE` (local
  launcher: one agent per node on this machine) runs the same script with
  `--checkpoint ftrun`; the same rank is SIGKILLed once every rank has saved
  SAVES times and a version is committed; the agents restart every rank and
  they `ftrun.load()`.

Every rank prints TIMING lines (see train_gpt.py's docstring). Figures, per
side: the save stall (median over every save but each process's first), the
restore (slowest rank: load and put back into model, optimizer and
generators), and kill -> the last rank's first step after the restore, split
at the slowest rank's moments (every time is CLOCK_MONOTONIC on this machine):
kill -> every new process exists, -> every rank imported torch (Python
start-up and `import torch`), -> process group, model and optimizer built,
-> state restored, -> first step done. ftrun's side adds the agents' own
breakdown (status files).

Output: one JSON object on stdout (or in --out FILE); progress on stderr.
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(HERE)
TIMING_RE = re.compile(r"^TIMING (\d+) (\S+) (\S+)(?: (\d+))?$", re.M)
FIRSTSTEP_RE = re.compile(r"^FIRSTSTEP (\d+) (\S+) (\S+)$", re.M)


def log(msg):
    sys.stderr.write(f"[baseline-torch {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


def free_port_range(n):
    """A base port with base .. base+n-1 free."""
    for _ in range(200):
        base = 20000 + int.from_bytes(os.urandom(2), "little") % 20000
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


def parse(text):
    """TIMING lines -> {rank: {name: [values in order]}}, save lines -> {rank: [(step, stall)]},
    FIRSTSTEP -> {rank: mono}."""
    timing, saves, first = {}, {}, {}
    for r, name, value, step in TIMING_RE.findall(text):
        r = int(r)
        timing.setdefault(r, {}).setdefault(name, []).append(float(value))
        if name == "save_stall_s":
            saves.setdefault(r, []).append((int(step), float(value)))
    for r, _unix, mono in FIRSTSTEP_RE.findall(text):
        first[int(r)] = float(mono)
    return timing, saves, first


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def timeline(t_kill, timing, world):
    """The restarted generation's moments at the slowest rank, and the segments between them."""
    def last(name):
        vals = [timing[r][name][-1] for r in range(world) if name in timing.get(r, {})]
        return max(vals) if len(vals) == world else None

    stamps = {k: last(k) for k in ("t_start", "t_imported", "t_setup", "t_restored", "t_first_step")}
    missing = [k for k, v in stamps.items() if v is None]
    if missing:
        raise RuntimeError(f"not every rank printed {', '.join(missing)}")
    seg = {
        "kill_to_spawned_s": stamps["t_start"] - t_kill,
        "startup_and_import_s": stamps["t_imported"] - stamps["t_start"],
        "setup_s": stamps["t_setup"] - stamps["t_imported"],
        "restore_s": stamps["t_restored"] - stamps["t_setup"],
        "first_step_s": stamps["t_first_step"] - stamps["t_restored"],
        "total_s": stamps["t_first_step"] - t_kill,
    }
    per_rank = {
        "import_s": [timing[r]["import_s"][-1] for r in range(world)],
        "restore_load_s": [timing[r]["restore_load_s"][-1] for r in range(world)],
        "startup_s": [timing[r]["startup_s"][-1] for r in range(world)],
        "setup_s": [timing[r]["setup_s"][-1] for r in range(world)],
        "restore_s": [timing[r]["restore_s"][-1] for r in range(world)],
        "first_step_s": [timing[r]["first_step_s"][-1] for r in range(world)],
    }
    for name in ("first_step_compute_s", "first_step_sync_s", "first_step_opt_s", "restore_minflt",
                 "first_step_minflt"):
        per_rank[name] = [timing[r].get(name, [None])[-1] for r in range(world)]
    return {"segments": seg, "per_rank": per_rank}


def stalls(saves_by_gen, world, key="save_stall_s"):
    """Every save's stall but each process's first (file creation, arena set-up, first touch)."""
    out = []
    for timing in saves_by_gen:
        for r in range(world):
            out.extend(timing.get(r, {}).get(key, [])[1:])
    return out


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


# --------------------------------------------------------------------------
# Status quo: torch.save / torch.load, the driver relaunches


class TorchSide(Side):
    def __init__(self, a, work):
        super().__init__("torch", a, work)
        self.ckpt = os.path.join(self.dir, "ckpt")
        self.procs = []
        self.gen = 0
        self.port = free_port_range(a.kills + 2)

    def launch(self):
        self.procs = []
        for r in range(self.world):
            env = dict(self.env, RANK=str(r), WORLD_SIZE=str(self.world), LOCAL_RANK=str(r % self.a.per_node),
                       LOCAL_WORLD_SIZE=str(self.a.per_node), GROUP_RANK=str(r // self.a.per_node),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(self.port + self.gen),
                       TORCHELASTIC_RESTART_COUNT=str(self.gen))
            out = open(os.path.join(self.dir, f"gen{self.gen}-rank{r}.log"), "w")
            argv = [self.a.python, "-u"] + self.script_args() + ["--checkpoint", "torch:" + self.ckpt,
                                                                 f"--local_rank={r % self.a.per_node}"]
            self.procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env))
            out.close()

    def text(self, gen=None):
        gen = self.gen if gen is None else gen
        return "".join(read(os.path.join(self.dir, f"gen{gen}-rank{r}.log")) for r in range(self.world))

    def alive(self):
        return all(p.poll() is None for p in self.procs)

    def saved(self, n):
        _, saves, _ = parse(self.text())
        return all(len(saves.get(r, [])) >= n for r in range(self.world))

    def stop_all(self, sig=signal.SIGTERM, grace=2.0):
        for p in self.procs:
            if p.poll() is None and p.pid > 0:
                p.send_signal(sig)
        deadline = time.monotonic() + grace
        for p in self.procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def run(self):
        a = self.a
        gens = []
        recoveries = []
        self.launch()
        try:
            for k in range(a.kills):
                wait_until(lambda: self.saved(a.saves), a.timeout, f"torch gen {self.gen}: {a.saves} saves per rank",
                           alive=self.alive)
                victim = self.procs[a.victim]
                t_kill = time.monotonic()
                victim.send_signal(signal.SIGKILL)
                # As torchrun: see the death, stop the others, relaunch everyone.
                while victim.poll() is None:
                    time.sleep(0.002)
                t_seen = time.monotonic()
                self.stop_all()
                t_stopped = time.monotonic()
                gens.append(parse(self.text())[0])
                self.gen += 1
                self.launch()
                t_launched = time.monotonic()
                wait_until(lambda: len(parse(self.text())[2]) == self.world, a.timeout,
                           f"torch gen {self.gen}: every rank's first step", alive=self.alive)
                timing, _, first = parse(self.text())
                tl = timeline(t_kill, timing, self.world)
                tl["driver"] = {"death_seen_s": t_seen - t_kill, "others_stopped_s": t_stopped - t_seen,
                                "relaunched_s": t_launched - t_stopped}
                tl["firststep_max_s"] = max(first.values()) - t_kill
                tl["state_bytes"] = [timing[r]["state_bytes"][-1] for r in range(self.world)] \
                    if all("state_bytes" in timing.get(r, {}) for r in range(self.world)) else None
                recoveries.append(tl)
                log(f"torch recovery {k + 1}: {tl['segments']['total_s']:.2f} s, restore "
                    f"{max(tl['per_rank']['restore_s']):.3f} s (slowest rank)")
            # A few saves in the last generation too (the stall samples).
            wait_until(lambda: self.saved(a.saves), a.timeout, f"torch gen {self.gen}: {a.saves} saves per rank",
                       alive=self.alive)
            gens.append(parse(self.text())[0])
        finally:
            self.stop_all(signal.SIGKILL, grace=5.0)
        sizes = [v for g in gens for r in range(self.world) for v in g.get(r, {}).get("state_bytes", [])]
        return {"recoveries": recoveries, "save_stall_s": stalls(gens, self.world),
                "save_write_s": stalls(gens, self.world, "save_write_s"),
                "save_fsync_s": stalls(gens, self.world, "save_fsync_s"),
                "state_bytes_min": min(sizes) if sizes else None, "state_bytes_max": max(sizes) if sizes else None,
                "log_dir": self.dir}


# --------------------------------------------------------------------------
# ftrun: the runner and its agents restart the ranks


class FtrunSide(Side):
    def __init__(self, a, work):
        super().__init__("ftrun", a, work)
        self.status = os.path.join(self.dir, "status.json")
        self.out = os.path.join(self.dir, "out.log")
        self.runner = None

    def config(self):
        a = self.a
        # The store holds each local rank's committed snapshot and the one in
        # flight, for its own ranks and the replicas' (2 x ranks x (1 + replicas)).
        need = 2 * a.per_node * (1 + a.replicas) * a.snapshot_mib + 256
        path = os.path.join(self.dir, "ftrun.yaml")
        with open(path, "w") as f:
            f.write(f"job:\n  max_restarts: {a.kills + 1}\n  stop_grace: 2s\n  hang_timeout: 120s\n"
                    f"store:\n  memory_budget: {need}MiB\n  chunk_size: 4MiB\n  prefault: true\n"
                    f"cluster:\n  replicas: {a.replicas}\n"
                    f"agent:\n  run_dir: {self.dir}/run\n")
        return path

    def state(self):
        try:
            with open(self.status) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def agent_state(self, st, i):
        try:
            with open(st["agents"][i]["status_file"]) as f:
                return json.load(f)
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            return None

    def rank_pid(self, rank):
        st = self.state()
        if not st:
            return 0
        for node in st.get("nodes", []):
            if node.get("agent") is None:
                continue
            for r in (self.agent_state(st, node["agent"]) or {}).get("ranks", []):
                if r.get("rank") == rank and not r.get("finished"):
                    return r.get("pid") or 0
        return 0

    def alive(self):
        return self.runner.poll() is None

    def run(self):
        a = self.a
        port = free_port_range(a.kills + 2)
        argv = [os.path.join(a.build, "ftrun"), "--num_nodes", str(a.nodes), "--num_gpus", str(a.per_node),
                "--config", self.config(), "--status_file", self.status, "--master_addr", "127.0.0.1",
                "--master_port", str(port)] + self.script_args() + ["--checkpoint", "ftrun"]
        out = open(self.out, "w")
        self.runner = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.env)
        out.close()
        recoveries = []
        offset = 0  # the log of the current generation starts here
        gens = []
        try:
            for k in range(a.kills):
                def ready():
                    _, saves, _ = parse(read(self.out)[offset:])
                    if not all(len(saves.get(r, [])) >= a.saves for r in range(self.world)):
                        return False
                    st = self.state()
                    if not st or st.get("phase") != "running" or st.get("committed_version") is None:
                        return False
                    # The agents' stores are pre-faulted (as in a job that has run a while).
                    for i in range(len(st.get("agents", []))):
                        ag = self.agent_state(st, i)
                        if not ag or not ag.get("store", {}).get("prefaulted"):
                            return False
                    return True
                wait_until(ready, a.timeout, f"ftrun restart {k}: {a.saves} saves per rank and a commit",
                           alive=self.alive)
                pid = self.rank_pid(a.victim)
                if pid <= 0:
                    raise RuntimeError(f"ftrun: no pid for rank {a.victim}")
                st_before = self.state()
                t_kill = time.monotonic()
                os.kill(pid, signal.SIGKILL)
                text = read(self.out)
                gens.append(parse(text[offset:])[0])
                offset = len(text)
                wait_until(lambda: len(parse(read(self.out)[offset:])[2]) == self.world, a.timeout,
                           f"ftrun restart {k}: every rank's first step", alive=self.alive)
                timing, _, first = parse(read(self.out)[offset:])
                tl = timeline(t_kill, timing, self.world)
                tl["firststep_max_s"] = max(first.values()) - t_kill
                tl["committed_before_kill"] = st_before.get("committed_version")
                # The agents' own breakdown of this recovery (written once their ranks saved again).
                def agents_done():
                    st = self.state()
                    if not st:
                        return None
                    recs = []
                    for i in range(len(st.get("agents", []))):
                        ag = self.agent_state(st, i)
                        if not ag or len(ag.get("recoveries", [])) < k + 1 or \
                                "first_step_mono_ns" not in ag["recoveries"][k]:
                            return None
                        recs.append(ag["recoveries"][k])
                    return st, recs
                try:
                    st, recs = wait_until(agents_done, 30, "the agents' recovery records")
                    t_kill_ns = int(t_kill * 1e9)
                    tl["agents"] = []
                    for rec in recs:
                        rec = dict(rec)
                        if "detected_mono_ns" in rec:
                            rec["detect_ms"] = (rec["detected_mono_ns"] - t_kill_ns) / 1e6
                        rec["agent_first_step_s"] = (rec["first_step_mono_ns"] - t_kill_ns) / 1e9
                        tl["agents"].append(rec)
                    runner_recs = st.get("recoveries", [])
                    tl["runner"] = runner_recs[k + 1] if len(runner_recs) > k + 1 else None  # [0]: the start
                except RuntimeError as e:
                    tl["agents_error"] = str(e)
                recoveries.append(tl)
                log(f"ftrun recovery {k + 1}: {tl['segments']['total_s']:.2f} s, restore "
                    f"{max(tl['per_rank']['restore_s']):.3f} s (slowest rank)")

            def saved():
                _, saves, _ = parse(read(self.out)[offset:])
                return all(len(saves.get(r, [])) >= a.saves for r in range(self.world))
            wait_until(saved, a.timeout, f"ftrun: {a.saves} saves per rank after the last restart", alive=self.alive)
            gens.append(parse(read(self.out)[offset:])[0])
        finally:
            if self.runner.poll() is None:
                self.runner.send_signal(signal.SIGTERM)
                try:
                    self.runner.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self.runner.kill()
                    self.runner.wait()
        sizes = [v for g in gens for r in range(self.world) for v in g.get(r, {}).get("state_bytes", [])]
        return {"recoveries": recoveries, "save_stall_s": stalls(gens, self.world),
                "state_bytes_min": min(sizes) if sizes else None, "state_bytes_max": max(sizes) if sizes else None,
                "log": self.out}


def summary(side):
    recs = side["recoveries"]

    def med(xs):
        xs = [x for x in xs if x is not None]
        return statistics.median(xs) if xs else None

    def slowest(name):  # per recovery, the slowest rank; the median over recoveries
        return med([max(r["per_rank"][name]) for r in recs])

    out = {
        "save_stall_s": med(side["save_stall_s"]),
        "save_stall_samples": len(side["save_stall_s"]),
        "restore_s": slowest("restore_s"),
        "restore_load_s": slowest("restore_load_s"),
        "recovery_s": med([r["segments"]["total_s"] for r in recs]),
        "import_s": slowest("import_s"),
        "startup_s": slowest("startup_s"),
        "first_step_s": slowest("first_step_s"),
    }
    for seg in ("kill_to_spawned_s", "startup_and_import_s", "setup_s", "restore_s", "first_step_s"):
        out["segment_" + seg] = med([r["segments"][seg] for r in recs])
    out["startup_and_import_share"] = med([r["segments"]["startup_and_import_s"] / r["segments"]["total_s"]
                                           for r in recs])
    if "save_write_s" in side:
        out["save_write_s"] = med(side["save_write_s"])
        out["save_fsync_s"] = med(side["save_fsync_s"])
    agents = [r["agents"] for r in recs if r.get("agents")]
    if agents:  # the agents' breakdown: per recovery the slowest agent, the median over recoveries
        for part in ("detect_ms", "stop_ms", "respawn_ms", "connect_ms", "restore_ms", "first_step_ms"):
            out["agent_" + part] = med([max(a.get(part, 0) for a in ags) for ags in agents])
    return out


def main():
    p = argparse.ArgumentParser(description="status quo (torch.save/torch.load, relaunch) vs ftrun, same run")
    p.add_argument("--build", default=os.path.join(SOURCE, "build"), help="the build directory (ftrun, python/)")
    p.add_argument("--python", default="/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable)
    p.add_argument("--script", default=os.path.join(SOURCE, "integration", "examples", "train_gpt.py"))
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--per-node", type=int, default=2)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--saves", type=int, default=4, help="saves per rank before each kill (and at the end)")
    p.add_argument("--kills", type=int, default=3, help="kills per side (the medians are reported)")
    p.add_argument("--victim", type=int, default=1, help="the rank SIGKILLed")
    p.add_argument("--replicas", type=int, default=1, help="ftrun's cluster.replicas")
    p.add_argument("--snapshot-mib", type=int, default=320, help="ftrun store sizing: MiB per rank snapshot")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--order", choices=["torch-first", "ftrun-first"], default="torch-first")
    p.add_argument("--keep", action="store_true", help="keep the logs (always kept when the run fails)")
    p.add_argument("--keep-checkpoints", action="store_true", help="with --keep: keep the torch.save files too")
    p.add_argument("--out", help="write the JSON here instead of stdout")
    p.add_argument("--only", choices=["torch", "ftrun"], help="run one side only (no ratios; for diagnosis)")
    a = p.parse_args()
    a.build = os.path.abspath(a.build)
    a.script = os.path.abspath(a.script)
    if not 0 <= a.victim < a.nodes * a.per_node:
        p.error("--victim must be a rank")
    work = tempfile.mkdtemp(prefix="ftrun-bench-baseline-")
    result = {"nodes": a.nodes, "per_node": a.per_node, "model": {k: getattr(a, k) for k in (
        "layers", "d_model", "heads", "vocab", "seq", "batch")}, "kills": a.kills, "victim": a.victim,
        "replicas": a.replicas, "work_dir": work}
    try:
        order = [TorchSide, FtrunSide] if a.order == "torch-first" else [FtrunSide, TorchSide]
        if a.only:
            order = [c for c in order if (c is TorchSide) == (a.only == "torch")]
        for cls in order:
            side = cls(a, work)
            log(f"{side.name}: {a.nodes} nodes x {a.per_node} ranks")
            result[side.name] = side.run()
            result[side.name]["summary"] = summary(result[side.name])
        if not a.only:
            t, f = result["torch"]["summary"], result["ftrun"]["summary"]
            result["save_speedup"] = t["save_stall_s"] / f["save_stall_s"]
            result["restore_speedup"] = t["restore_s"] / f["restore_s"]
            result["recovery_speedup"] = t["recovery_s"] / f["recovery_s"]
        result["ok"] = True
    except Exception as e:  # noqa: BLE001 - reported as JSON, with the logs kept
        result["ok"] = False
        result["error"] = f"{type(e).__name__}: {e}"
        a.keep = True
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
            result["work_dir"] = None
        else:  # the logs stay; the checkpoints (GBs) only when asked for
            if not a.keep_checkpoints:
                shutil.rmtree(os.path.join(work, "torch", "ckpt"), ignore_errors=True)
            log(f"logs kept in {work}")
    if a.out:
        with open(a.out + ".tmp", "w") as f:
            json.dump(result, f, indent=1)
        os.rename(a.out + ".tmp", a.out)
    else:
        json.dump(result, sys.stdout, indent=1)
        sys.stdout.write("\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
