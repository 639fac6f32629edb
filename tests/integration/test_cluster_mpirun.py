"""The runner's openmpi launcher, for real: one `mpirun -n 1 --host HOST`
per agent, on hosts that all name this machine (localhost, 127.0.0.1 and
its host name; the last host is the spare). SIGKILL node 1's agent and its
ranks: the other agents' mpirun must not take them down, the spare takes
over, and the job ends with the digests of the failure-free run.
Skipped where mpirun is not installed or cannot start a process on this
machine's host name."""
import os
import shutil
import signal
import socket
import subprocess

import pytest

from ftrun_testlib import AGENT, ClusterJob, digests, golden

ARGS = ["--state-bytes", "8MiB", "--tensors", "4", "--steps", "150", "--step-ms", "20", "--change-fraction", "0.3"]
CONFIG = ("job:\n  max_restarts: 5\n"
          "store:\n  memory_budget: 256MiB\n  chunk_size: 1MiB\n  prefault: false\n"
          "cluster:\n  replicas: 1\n  heartbeat_interval: 200ms\n  heartbeat_misses: 10\n")


@pytest.fixture(scope="module")
def hostname():
    """This machine's host name, where mpirun can start a process there."""
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun is not installed")
    me = socket.gethostname()
    probe = subprocess.run(["mpirun", "-n", "1", "--host", me, "--allow-run-as-root", "true"], capture_output=True,
                           text=True, timeout=60)
    if probe.returncode != 0:
        pytest.skip(f"mpirun cannot start a process on {me}: {probe.stderr[-500:]}")
    return me


def agent_pid(job_id, agent):
    """The ftrun-agent process of `agent` (not its mpirun)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and argv[0] == AGENT.encode() and b"--agent-id" in argv and b"--job-id" in argv:
            if argv[argv.index(b"--agent-id") + 1] == str(agent).encode() and \
               argv[argv.index(b"--job-id") + 1] == job_id.encode():
                return int(pid)
    return None


def test_node_loss_under_mpirun(check, scratch, hostname):
    """Node 1 killed under the openmpi launcher: the spare takes over, no other node goes with it, and the job
    ends with the failure-free digests."""
    want = golden(4, ARGS)
    hostfile = os.path.join(scratch("ftrun-mpirun-"), "hosts")
    with open(hostfile, "w") as f:
        f.write(f"localhost slots=2\n127.0.0.1 slots=2\n{hostname} slots=2\n")
    job = ClusterJob(3, 2, ARGS, CONFIG, spares=1, extra=["-H", hostfile, "--launcher", "openmpi"])
    st = job.wait_for(lambda s: s["phase"] == "running" and s["committed_version"] is not None, timeout=60)
    check(st is not None, "the job never committed a version")
    killed = False
    if st is not None:
        pid = agent_pid(st["job_id"], 1)
        check(pid is not None and pid > 0, "node 1's agent process not found")
        ranks = [r["pid"] for r in (job.agent_state(1) or {}).get("ranks", []) if r.get("pid")]
        for p in ([pid] if pid else []) + ranks:
            if p > 0:
                os.kill(p, signal.SIGKILL)
                killed = True
        print(f"killed node 1: agent pid {pid}, ranks {ranks}", flush=True)
    rc = job.wait(timeout=180)
    check(rc == 0, f"runner exit {rc}\n{job.log[-3000:]}")
    check("started agent 0 (node 0) on localhost with openmpi" in job.log, "agents were not started with mpirun")
    check(killed and "spare agent 2 takes over node 1" in job.log, f"the spare did not take over\n{job.log[-3000:]}")
    check("agent 0 (node 0) lost" not in job.log, "node 0 was lost with node 1: its mpirun took it down")
    check(digests(job.log) == want, "digests differ from the failure-free run")
