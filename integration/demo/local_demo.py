"""ftrun local demo: train, break, recover, and prove nothing was lost.

Runs the synthetic trainer (deterministic state, a save every step) on 3
local nodes x 2 ranks plus a spare under the `ftrun` runner (each node an
agent with its own store; copies on another node over UCX), SIGKILLs a rank
mid-run, then a whole node, and compares every rank's final state digest with
a run that never failed. Usage: scripts/demo.sh [--nodes 3] [--ranks 2] [--state 64MiB]
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
DIGEST = re.compile(r"^DIGEST (\d+) ([0-9a-f]{32})$", re.M)


def say(msg):
    print(f"\033[1m[demo]\033[0m {msg}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--ranks", type=int, default=2, help="ranks per node")
    ap.add_argument("--state", default="64MiB", help="state per rank")
    ap.add_argument("--steps", type=int, default=120)
    args = ap.parse_args()
    trainer = [os.path.join(BUILD, "ftrun-synthetic"), "--state-bytes", args.state, "--tensors", "8",
               "--steps", str(args.steps), "--step-ms", "40", "--change-fraction", "0.2"]

    world = args.nodes * args.ranks
    say(f"failure-free reference run: {world} ranks x {args.state}, {args.steps} steps")
    golden = {}
    for r in range(world):
        out = subprocess.run(trainer + ["--no-ftrun", "--rank", str(r)], capture_output=True, text=True, check=True)
        golden.update({int(k): v for k, v in DIGEST.findall(out.stdout)})

    work = tempfile.mkdtemp(prefix="ftrun-demo-")
    status = os.path.join(work, "status.json")
    config = os.path.join(work, "ftrun.yaml")
    with open(config, "w") as f:
        f.write(f"job:\n  max_restarts: 5\n  hang_timeout: 5s\n  stop_grace: 1s\n"
                f"store:\n  memory_budget: 1GiB\n  chunk_size: 4MiB\n  prefault: false\n"
                f"cluster:\n  replicas: 1\n  spares: 1\nagent:\n  run_dir: {work}/run\n")
    cmd = [os.path.join(BUILD, "ftrun"), "--num_nodes", str(args.nodes), "--num_gpus", str(args.ranks),
           "--config", config, "--status_file", status, "--no_python", "--no_local_rank"] + trainer
    say(f"training on {args.nodes} local nodes x {args.ranks} ranks + 1 spare: " +
        " ".join(os.path.basename(c) if i == 0 else c for i, c in enumerate(cmd)))
    runner = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = []

    def pump():
        for line in runner.stdout:
            log.append(line)
            if " info " in line and ("ftrun-agent" in line and "recovered" not in line):
                continue  # keep the agents' routine lines out of the way
            sys.stdout.write("   " + line)
            sys.stdout.flush()

    t = threading.Thread(target=pump, daemon=True)
    t.start()

    def read(path):
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def wait_until(pred, timeout=120):
        end = time.time() + timeout
        while time.time() < end and runner.poll() is None:
            st = read(status)
            if st and pred(st):
                return st
            time.sleep(0.05)
        return None

    # 1: SIGKILL one rank. 2: SIGKILL a whole node (its agent and its ranks).
    for restarts, what in enumerate(["rank", "node"]):
        st = wait_until(lambda s: s["restarts"] == restarts and s["phase"] == "running" and
                        (s["committed_version"] or 0) >= 15 * (restarts + 1))
        if not st:
            break
        node = 1
        agent = st["nodes"][node]["agent"]
        ast = read(st["agents"][agent]["status_file"]) or {}
        ranks = [r["pid"] for r in ast.get("ranks", []) if r.get("pid")]
        pids = ranks[:1] if what == "rank" else ranks + [st["agents"][agent]["pid"]]
        say(f"committed version {st['committed_version']}: SIGKILL " +
            (f"rank pid {pids[0]} on node {node}" if what == "rank" else f"the whole of node {node} (agent and ranks)"))
        for pid in pids:
            if pid > 0:
                os.kill(pid, signal.SIGKILL)
    rc = runner.wait()
    t.join()
    st = read(status) or {}
    got = {int(k): v for k, v in DIGEST.findall("".join(log))}
    for r in st.get("recoveries", [])[1:]:
        say(f"recovery, epoch {r['epoch']} ({r['reason']}): ranks restarted {r['detect_to_start_ms']:.0f} ms after "
            f"detection")
    ok = rc == 0 and got == golden and st.get("restarts", 0) >= 2
    for r in sorted(golden):
        say(f"rank {r}: failure-free {golden[r]}  recovered {got.get(r, 'missing')}")
    say(("PASS: every rank ended bit-identical to the failure-free run after %d restarts" % st.get("restarts", 0))
        if ok else f"FAIL: runner exit {rc}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
