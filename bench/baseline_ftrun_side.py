"""The ftrun side of `ftrun-bench baseline-torch`: the runner and its agents
run the same script with --checkpoint ftrun and restart the ranks after the
SIGKILL; the agents' status files give their own breakdown of each recovery
(bench/baseline_torch.py's docstring has the whole procedure)."""
import json
import os
import signal
import subprocess
import time

from baseline_side import Side, exit_watch, free_port_range, log, wait_until
from baseline_timing import parse, read, stalls, timeline


class FtrunSide(Side):
    """warm: the script runs under @ftrun.resilient (--resilient): survivors stay, a warm standby takes
    the victim's place."""

    def __init__(self, a, work, warm=False):
        super().__init__("ftrun_warm" if warm else "ftrun", a, work)
        self.warm = warm
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
                "--master_port", str(port)] + self.script_args() + ["--checkpoint", "ftrun"] + (
                    ["--resilient"] if self.warm else [])
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
                        # Warm: a standby is up where the victim dies (one is started per node).
                        if self.warm and ag.get("ranks") and (ag.get("warm_standbys") or {}).get("ready", 0) < 1:
                            return False
                    return True
                wait_until(ready, a.timeout, f"ftrun restart {k}: {a.saves} saves per rank and a commit",
                           alive=self.alive)
                pid = self.rank_pid(a.victim)
                if pid <= 0:
                    raise RuntimeError(f"ftrun: no pid for rank {a.victim}")
                st_before = self.state()
                exited = exit_watch(pid)
                t_kill = time.monotonic()
                os.kill(pid, signal.SIGKILL)
                text = read(self.out)
                gens.append(parse(text[offset:])[0])
                offset = len(text)
                wait_until(lambda: len(parse(read(self.out)[offset:])[2]) == self.world, a.timeout,
                           f"ftrun restart {k}: every rank's first step", alive=self.alive)
                timing, _, first = parse(read(self.out)[offset:])
                tl = timeline(t_kill, timing, self.world, warm=self.warm)
                if self.warm:  # the survivors' own: their in-place restore, and kill -> ready to step
                    survivors = [r for r in range(self.world) if r != a.victim]
                    tl["survivor_restore_s"] = max(tl["per_rank"]["restore_s"][r] for r in survivors)
                    tl["survivor_ready_s"] = max(tl["per_rank"]["t_restored"][r] for r in survivors) - t_kill
                tl["firststep_max_s"] = max(first.values()) - t_kill
                t_exit = exited()
                tl["victim_exit_s"] = t_exit - t_kill if t_exit is not None else None
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
