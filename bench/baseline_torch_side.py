"""The status quo side of `ftrun-bench baseline-torch`: this process spawns
the ranks with torchrun's environment, they torch.save every step; after the
SIGKILL it stops the others and relaunches every rank, as torchrun does
(bench/baseline_torch.py's docstring has the whole procedure)."""
import os
import signal
import subprocess
import time

from baseline_side import Side, free_port_range, log, stop_processes, wait_until
from baseline_timing import parse, read, stalls, timeline


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
        stop_processes(self.procs, sig, grace)

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
