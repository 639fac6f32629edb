"""ftrun local demo: train, break, recover, and prove nothing was lost.

Runs the synthetic trainer (deterministic state, a save every step) with 4
ranks under ftrun-agent, SIGKILLs a rank mid-run, then freezes another
(SIGSTOP, a hang), and compares every rank's final state digest with a run
that never failed. Usage: scripts/demo.sh [--ranks N] [--state 64MiB]
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
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--state", default="64MiB", help="state per rank")
    ap.add_argument("--steps", type=int, default=80)
    args = ap.parse_args()
    trainer = [os.path.join(BUILD, "ftrun-synthetic"), "--state-bytes", args.state, "--tensors", "8",
               "--steps", str(args.steps), "--step-ms", "40", "--change-fraction", "0.2"]

    say(f"failure-free reference run: {args.ranks} ranks x {args.state}, {args.steps} steps")
    golden = {}
    for r in range(args.ranks):
        out = subprocess.run(trainer + ["--no-ftrun", "--rank", str(r)], capture_output=True, text=True, check=True)
        golden.update({int(k): v for k, v in DIGEST.findall(out.stdout)})

    work = tempfile.mkdtemp(prefix="ftrun-demo-")
    status = os.path.join(work, "status.json")
    config = os.path.join(work, "ftrun.yaml")
    with open(config, "w") as f:
        f.write(f"job:\n  max_restarts: 5\n  hang_timeout: 3s\n  stop_grace: 1s\n"
                f"store:\n  memory_budget: 1GiB\n  chunk_size: 4MiB\nagent:\n  run_dir: {work}/run\n")
    cmd = [os.path.join(BUILD, "ftrun-agent"), "--config", config, "--nproc", str(args.ranks), "--job-id", "demo",
           "--status-file", status, "--no_python", "--no_local_rank", "--"] + trainer
    say("training under ftrun-agent: " + " ".join(os.path.basename(c) if i == 0 else c for i, c in enumerate(cmd)))
    agent = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = []

    def pump():
        for line in agent.stdout:
            log.append(line)
            sys.stdout.write("   " + line)
            sys.stdout.flush()

    t = threading.Thread(target=pump, daemon=True)
    t.start()

    def state():
        try:
            with open(status) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def wait_until(pred, timeout=60):
        end = time.time() + timeout
        while time.time() < end and agent.poll() is None:
            st = state()
            if st and pred(st):
                return st
            time.sleep(0.05)
        return None

    for restarts, (victim, sig, what) in enumerate([(1, signal.SIGKILL, "SIGKILL"), (2, signal.SIGSTOP, "SIGSTOP (hang)")]):
        st = wait_until(lambda s: s["restarts"] == restarts and (s["committed_version"] or 0) >= 15 * (restarts + 1))
        if not st:
            break
        pid = st["ranks"][victim]["pid"]
        say(f"committed version {st['committed_version']}: sending {what} to rank {victim} (pid {pid})")
        os.kill(pid, sig)
    rc = agent.wait()
    t.join()
    st = state() or {}
    got = {int(k): v for k, v in DIGEST.findall("".join(log))}
    for r in st.get("recoveries", []):
        if "total_ms" in r:
            say(f"recovery {r['restart']} ({r['reason']}): {r['total_ms']:.0f} ms from detection to every rank's "
                f"first step, restored version {r['version']} (stop {r['stop_ms']:.0f}, restore {r['restore_ms']:.0f},"
                f" first step {r['first_step_ms']:.0f} ms)")
    ok = rc == 0 and got == golden and st.get("restarts", 0) >= 1
    for r in sorted(golden):
        say(f"rank {r}: failure-free {golden[r]}  recovered {got.get(r, 'missing')}")
    say(("PASS: every rank ended bit-identical to the failure-free run after %d restarts" % st.get("restarts", 0))
        if ok else f"FAIL: agent exit {rc}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
