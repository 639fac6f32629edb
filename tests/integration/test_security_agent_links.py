"""An outsider on the agents' UCX ports cannot steer or poison a job.

A 2-node job (2 ranks each, replicas: 1, small chunks so each version
needs many bulk transfers). As soon as the agents listen, and while the job
runs, a rogue process (tests/transport_rogue, which knows no secret):
  - floods each agent with garbage under tags 1..N, as tag messages (the old
    wire's bulk data: receives matched any sender's tag, and tags count up
    from 1) and as bulk active messages, over and over: before the fix every
    transfer got the flood's bytes, failed its hash, and nothing committed;
  - connects and injects kCommit, kStop, kOffer and kPullRequest messages
    without a session.
The job must commit versions (from the fix on) and end with the digests of
the failure-free run; the agents must have logged what they dropped.

FTRUN_BUILD_DIR picks the build (e.g. one without the fix, to see it fail)."""
import os
import re
import subprocess
import time

from ftrun_testlib import BUILD, ClusterJob, digests, golden, read_json

ROGUE = os.path.join(BUILD, "tests", "transport_rogue")
NODES, PER_NODE = 2, 2
ARGS = ["--state-bytes", "4MiB", "--tensors", "4", "--steps", "400", "--step-ms", "20", "--change-fraction", "0.3"]
CONFIG = ("job:\n  max_restarts: 3\n  stop_grace: 2s\n"
          "store:\n  memory_budget: 256MiB\n  chunk_size: 64KiB\n  prefault: false\n"
          "cluster:\n  replicas: 1\n  heartbeat_interval: 200ms\n  heartbeat_misses: 10\n  lost_node_timeout: 30s\n"
          "  copy_timeout: 2s\n")
# ClusterMsg numbers (plugin/protocol/cluster_messages.h).
K_COMMIT, K_STOP, K_OFFER, K_PULL_REQUEST = 37, 38, 64, 68


def test_rogue_on_agent_ports(check):
    """A rogue floods the agents' UCX ports with garbage and injects messages without a session: the job
    commits, ends with the failure-free digests, and the agents log what they dropped and refused."""
    want = golden(NODES * PER_NODE, ARGS)
    job = ClusterJob(NODES, PER_NODE, ARGS, CONFIG)
    rogues = []
    rc = None
    try:
        # The agents' addresses, as soon as they listen (before the first save).
        addresses = {}
        deadline = time.time() + 60
        while len(addresses) < NODES and time.time() < deadline and job.proc.poll() is None:
            st = job.state()
            for a in (st or {}).get("agents", []):
                ast = read_json(a["status_file"]) or {}
                if ast.get("address"):
                    addresses[a["agent"]] = ast["address"]
            time.sleep(0.01)
        check(len(addresses) == NODES, f"the agents' addresses never showed: {addresses}")
        for agent, address in addresses.items():
            for length in ("1", "65536"):  # eager, and rendezvous-sized (a whole chunk)
                rogues.append(subprocess.Popen([ROGUE, "eager", "--target", address, "--tags", "512", "--length",
                                                length, "--seconds", "120"],
                                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for agent, address in addresses.items():
            for t in (K_COMMIT, K_STOP, K_OFFER, K_PULL_REQUEST):
                rogues.append(subprocess.Popen([ROGUE, "inject", "--target", address, "--type", str(t)],
                                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        st = job.wait_for(lambda s: s["phase"] == "running" and s["committed_version"] is not None, timeout=90)
        check(st is not None, "no version committed while the rogue flooded the agents")
        rc = job.wait(timeout=240)
    finally:
        for r in rogues:
            r.kill()
            r.wait()
        if job.proc.poll() is None:
            job.proc.kill()
            job.wait(timeout=30)

    m = re.search(r"last committed version (\d+)", job.log)
    check(m is not None and int(m.group(1)) > 0, "the job ended without a committed version")
    check(rc == 0, f"the job failed (rc {rc}):\n" + job.log[-3000:])
    check(digests(job.log) == want, "digests differ from the failure-free run")
    check("dropped a tag message" in job.log or "dropped bulk data" in job.log,
          "no agent logged the flood it dropped:\n" + job.log[-2000:])
    check("during the handshake" in job.log or "refused" in job.log,
          "no agent logged the injected messages it refused:\n" + job.log[-2000:])
