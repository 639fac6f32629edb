"""Copies and pulls only from the agents the membership names for that role.

A 2-node job (2 ranks each, replicas: 1): agent 0 runs node 0 (ranks 0, 1)
and keeps node 1's copies; agent 1 runs node 1 (ranks 2, 3) and keeps node
0's. While it runs, tests/transport_impostor, which holds the job secret
(its connections authenticate) but which no membership names, like a fenced
agent that lives on:
  - offers agent 0 a routine copy of rank 2 (node 1's, whose copies agent
    0 keeps): before the fix agent 0 answered "want" and would have stored
    the impostor's manifest as rank 2's copy;
  - asks agent 1 for a pull of rank 0's committed version: before the fix
    agent 1 answered with an offer of the shard.
Both must be refused, naming why, and logged; the job must end with the
digests of the failure-free run.

FTRUN_BUILD_DIR picks the build (e.g. one without the fix, to see it fail)."""
import os
import subprocess

from ftrun_testlib import BUILD, ClusterJob, digests, golden

IMPOSTOR = os.path.join(BUILD, "tests", "transport_impostor")
NODES, PER_NODE = 2, 2
ARGS = ["--state-bytes", "1MiB", "--tensors", "2", "--steps", "300", "--step-ms", "20"]
CONFIG = "cluster:\n  replicas: 1\n  heartbeat_interval: 200ms\n  heartbeat_misses: 10\n"


def test_impostor_refused(check):
    """An offer and a pull from an agent no membership names are refused, naming why, and logged; the job
    ends with the failure-free digests."""
    want = golden(NODES * PER_NODE, ARGS)
    job = ClusterJob(NODES, PER_NODE, ARGS, CONFIG)
    rc = None
    try:
        st = job.wait_for(lambda s: s["phase"] == "running" and s["committed_version"] is not None, timeout=90)
        check(st is not None, "the job never committed a version")
        secret = os.path.join(st["job_dir"], "secret")
        address = {n["agent"]: n["address"] for n in st["nodes"]}
        answers = {}
        for name, target, rank, version in (("offer", 0, 2, 10 ** 9), ("pull", 1, 0, st["committed_version"])):
            p = subprocess.run([IMPOSTOR, "--secret-file", secret, "--target", address[target], "--target-id",
                                str(target), "--id", "900", "--epoch", str(st["epoch"]), "--rank", str(rank),
                                "--version", str(version), "--ask", name], capture_output=True, text=True, timeout=60)
            print(name, "->", p.returncode, p.stdout.strip(), p.stderr.strip()[-500:], flush=True)
            answers[name] = p.stdout.strip()
        check(answers["offer"].startswith("answer offer-failed") and "not a member" in answers["offer"],
              "a routine copy from an agent no membership names was not refused: %r" % answers["offer"])
        check(answers["pull"].startswith("answer offer-failed") and "not a member" in answers["pull"],
              "a pull by an agent no membership names was not refused: %r" % answers["pull"])
        rc = job.wait(timeout=240)
    finally:
        if job.proc.poll() is None:
            job.proc.kill()
            job.wait(timeout=30)

    check(rc == 0, "the job failed (rc %s):\n%s" % (rc, job.log[-3000:]))
    check(digests(job.log) == want, "digests differ from the failure-free run")
    check("refused a copy of rank 2" in job.log and "refused a pull of rank 0" in job.log,
          "the agents did not log what they refused:\n" + job.log[-2000:])
