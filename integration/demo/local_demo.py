"""ftrun local demo: train a small GPT, break it twice, recover, prove nothing was lost.

Runs integration/examples/train_gpt.py (torch.distributed over gloo, Adam
sharded by ZeroRedundancyOptimizer, ftrun.save every step) on 2 local nodes x
2 ranks plus a spare node under the `ftrun` runner (each node an agent with
its own store; every committed version copied to another node over UCX).
First a failure-free reference run; then the same run in which one rank is
SIGKILLed, and later a whole node (its agent and its ranks: its RAM copies
are gone), which the spare replaces by pulling the lost shards from their
holders. Last, the same run under @ftrun.resilient (train_gpt.py
--resilient), with a rank SIGKILLed: the surviving ranks leave the failed
generation inside their own processes and a warm standby takes the dead
rank's place, and the demo shows that warm recovery next to the cold one of
the second run. The losses of every step and the final weights of every rank
must be bit-identical to the reference run.

Usage: scripts/demo.sh [--steps 40] [--step-ms 150] [--d-model 64]
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("FTRUN_BUILD_DIR", os.path.join(ROOT, "build"))
PY = os.environ.get("FTRUN_PYTHON") or sys.executable  # scripts/demo.sh runs this with .venv/bin/python
SCRIPT = os.path.join(ROOT, "integration", "examples", "train_gpt.py")
LOSS = re.compile(r"^LOSS (\d+) (\S+)$", re.M)
WEIGHTS = re.compile(r"^WEIGHTS (\d+) ([0-9a-f]{64})$", re.M)
NODES, PER_NODE = 2, 2


def say(msg):
    print(f"\033[1m[demo]\033[0m {msg}", flush=True)


def read(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


class Run:
    """One `ftrun` run of train_gpt.py; echo=True shows its output as it goes."""

    def __init__(self, work, name, script_args, echo, spares=1):
        self.status = os.path.join(work, name + ".status.json")
        config = os.path.join(work, name + ".yaml")
        with open(config, "w") as f:
            f.write("job:\n  max_restarts: 5\n  stop_grace: 2s\n"
                    "store:\n  memory_budget: 256MiB\n  chunk_size: 64KiB\n  prefault: false\n"
                    f"cluster:\n  replicas: 1\n  spares: {spares}\nagent:\n  run_dir: {work}/run\n")
        cmd = [os.path.join(BUILD, "ftrun"), "--num_nodes", str(NODES), "--num_gpus", str(PER_NODE),
               "--config", config, "--status_file", self.status, SCRIPT, *script_args]
        env = dict(os.environ, FTRUN_PYTHON=PY)
        env["PYTHONPATH"] = os.path.join(BUILD, "python") + (os.pathsep + env["PYTHONPATH"]
                                                             if env.get("PYTHONPATH") else "")
        if echo:
            say("ftrun " + " ".join(cmd[1:]).replace(ROOT + "/", ""))
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.lines = []
        self.pump = threading.Thread(target=self._pump, args=(echo,), daemon=True)
        self.pump.start()

    def _pump(self, echo):
        for line in self.proc.stdout:
            self.lines.append(line)
            if not echo:
                continue
            m = LOSS.match(line)
            if m:
                print(f"   step {int(m.group(1)):3d}  loss {float.fromhex(m.group(2)):.5f}", flush=True)
            elif any(k in line for k in ("recovered", "lost", "spare", "RESUMED", "restart", "error", "FAIL")):
                print("   " + line.rstrip(), flush=True)

    def wait_until(self, pred, timeout=180):
        end = time.time() + timeout
        while time.time() < end and self.proc.poll() is None:
            st = read(self.status)
            if st and pred(st):
                return st
            time.sleep(0.05)
        return None

    def finish(self):
        rc = self.proc.wait()
        self.pump.join()
        log = "".join(self.lines)
        losses = {int(s): v for s, v in LOSS.findall(log)}  # the last loss printed for each step
        return rc, losses, {int(r): d for r, d in WEIGHTS.findall(log)}, log


def agent_recoveries(st):
    """Every agent's recoveries of `st`'s job (its status files), the job's start left out."""
    out = []
    for a in (st or {}).get("agents", []):
        out += [r for r in (read(a["status_file"]) or {}).get("recoveries", []) if r.get("restart", 0) > 0]
    return out


def slowest(recs, restart):
    """The slowest node's kill -> every rank's first step of one restart (ms), and its kind."""
    mine = [r for r in recs if r.get("restart") == restart and "total_ms" in r]
    worst = max(mine, key=lambda r: r["total_ms"], default=None)
    return (worst["total_ms"], worst.get("kind", "?")) if worst else (None, None)


def kill(pids):
    for pid in pids:
        if pid and pid > 0:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--step-ms", type=float, default=150, help="pause after every step, so the failures land mid-run")
    ap.add_argument("--d-model", type=int, default=64)
    args = ap.parse_args()
    script_args = ["--steps", str(args.steps), "--d-model", str(args.d_model), "--backend", "gloo",
                   "--step-ms", str(args.step_ms)]
    work = tempfile.mkdtemp(prefix="ftrun-demo-")

    say(f"1/3 failure-free reference run: train_gpt.py on {NODES} nodes x {PER_NODE} ranks, {args.steps} steps")
    ref = Run(work, "reference", script_args, echo=False)
    rc, want_loss, want_weights, log = ref.finish()
    if rc != 0 or len(want_loss) != args.steps:
        sys.stdout.write(log[-4000:])
        say(f"FAIL: the reference run ended with exit {rc}")
        return 1
    say(f"reference: loss {float.fromhex(want_loss[0]):.5f} at step 0, "
        f"{float.fromhex(want_loss[args.steps - 1]):.5f} at step {args.steps - 1}")

    say(f"2/3 the same run on {NODES} nodes + 1 spare, with a rank and then a whole node SIGKILLed")
    run = Run(work, "faults", script_args, echo=True)
    kill_at = [args.steps // 4, args.steps // 2]
    for restarts, what in enumerate(["rank", "node"]):
        st = run.wait_until(lambda s: s["restarts"] == restarts and s["phase"] == "running" and
                            (s["committed_version"] or 0) >= kill_at[restarts])
        if not st:
            break
        node = 1
        agent = st["nodes"][node]["agent"]
        ranks = [r["pid"] for r in (read(st["agents"][agent]["status_file"]) or {}).get("ranks", []) if r.get("pid")]
        if what == "rank":
            say(f"committed version {st['committed_version']}: SIGKILL rank pid {ranks[:1]} on node {node}")
            kill(ranks[:1])
        else:
            say(f"committed version {st['committed_version']}: SIGKILL node {node} whole "
                f"(agent pid {st['agents'][agent]['pid']} and ranks {ranks}, their RAM copies with them)")
            kill(ranks + [st["agents"][agent]["pid"]])
    rc, got_loss, got_weights, _ = run.finish()
    st = read(run.status) or {}
    for r in st.get("recoveries", [])[1:]:
        say(f"recovery, epoch {r['epoch']} ({r['reason']}): ranks restarted {r['detect_to_start_ms']:.0f} ms "
            "after detection (the agents' lines above break down the rest: 'connect' is the new ranks' Python "
            "start-up and import torch)")
    same_loss = [s for s in range(args.steps) if got_loss.get(s) == want_loss.get(s)]
    say(f"losses equal to the reference, bit for bit: {len(same_loss)} of {args.steps} steps")
    for r in sorted(want_weights):
        say(f"rank {r} final weights: reference {want_weights[r][:16]}...  recovered "
            f"{got_weights.get(r, 'missing')[:16]}...")
    ok = rc == 0 and len(same_loss) == args.steps and got_weights == want_weights and st.get("restarts", 0) >= 2
    say(f"after {st.get('restarts', 0)} restarts, every loss and every rank's weights are bit-identical "
        "to the failure-free run" if ok else f"FAIL: runner exit {rc}, restarts {st.get('restarts', 0)}")
    cold_ms, _ = slowest(agent_recoveries(st), 1)
    ok = ok and warm_run(work, script_args, args, want_loss, want_weights, cold_ms)
    say("PASS: every run bit-identical to the failure-free one" if ok else "FAIL")
    say(f"configs, status files and agent run directories: {work}")
    return 0 if ok else 1


def warm_run(work, script_args, args, want_loss, want_weights, cold_ms):
    """3/3: under @ftrun.resilient, a rank SIGKILLed; its recovery next to the cold one of run 2."""
    say("3/3 the same run under @ftrun.resilient (--resilient), a rank SIGKILLed: the survivors stay in their "
        "processes, a warm standby (started ahead, torch imported) takes the dead rank's place")
    run = Run(work, "warm", script_args + ["--resilient"], echo=True, spares=0)
    st = run.wait_until(lambda s: s["phase"] == "running" and (s["committed_version"] or 0) >= args.steps // 4 and all(
        (read(a["status_file"]) or {}).get("warm_standbys", {}).get("ready", 0) >= 1 for a in s["agents"]))
    if st:
        agent = st["nodes"][1]["agent"]
        ranks = [r["pid"] for r in (read(st["agents"][agent]["status_file"]) or {}).get("ranks", []) if r.get("pid")]
        survivors = {a: [r["pid"] for r in (read(st["agents"][a]["status_file"]) or {}).get("ranks", [])]
                     for a in range(len(st["agents"]))}
        say(f"committed version {st['committed_version']}: SIGKILL rank pid {ranks[:1]} on node 1 "
            f"(rank pids now: {sorted(p for ps in survivors.values() for p in ps)})")
        kill(ranks[:1])
        run.wait_until(lambda s: s["restarts"] >= 1 and s["phase"] == "running")
        time.sleep(1.0)
        after = read(run.status) or {}
        now = sorted(r["pid"] for a in after.get("agents", []) for r in
                     (read(a["status_file"]) or {}).get("ranks", []) if r.get("pid"))
        say(f"rank pids after the warm recovery: {now} (the survivors' unchanged, a standby's for the dead rank)")
        warm_ms, kind = slowest(agent_recoveries(after), 1)
    rc, got_loss, got_weights, _ = run.finish()
    if not st:
        say(f"FAIL: the warm run never got to its kill (exit {rc})")
        return False
    ok = rc == 0 and all(got_loss.get(s) == want_loss.get(s) for s in range(args.steps)) and \
        got_weights == want_weights
    if cold_ms and warm_ms:
        say(f"recovery from a rank's SIGKILL, detection -> every rank's first step (slowest node): cold (new processes) "
            f"{cold_ms:.0f} ms, {kind} (survivors kept, a standby for the dead rank) {warm_ms:.0f} ms")
    say("warm run: every loss and every rank's weights bit-identical to the failure-free run" if ok else
        f"FAIL: warm run exit {rc}, losses or weights differ")
    return ok


if __name__ == "__main__":
    sys.exit(main())
