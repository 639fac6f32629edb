"""A runner that dies does not take the job's RAM copies with it.

The `ftrun` runner (it hosts the coordinator) is SIGKILLed mid-run. Its
agents live on: they fence their ranks and wait for a coordinator up to
cluster.lost_node_timeout. `ftrun --attach JOB` takes the job over: it
listens where the old coordinator did, adopts the agents, re-learns the
committed version from their catalogs, restarts every rank from it, and the
job ends with every rank's digest equal to the failure-free run's. Without an
attach, the agents and their ranks are gone after lost_node_timeout.
"""
import json
import os
import subprocess
import time

from ftrun_testlib import RUNNER, ClusterJob, digests, golden

ARGS = ["--steps", "300", "--state-bytes", "8MiB", "--tensors", "2", "--step-ms", "20"]
CONFIG = "store:\n  memory_budget: 128MiB\ncluster:\n  replicas: 1\n  lost_node_timeout: %s\n"


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1].split()[0] != "Z"
    except OSError:
        return False


def pids_of(job, st):
    out = []
    for a in range(len(st["agents"])):
        ast = job.agent_state(a) or {}
        out += [ast.get("agent_pid")] + [r.get("pid") for r in ast.get("ranks", [])]
    return [p for p in out if p and p > 0]


def test_attach_after_runner_sigkill(check):
    """The runner SIGKILLed mid-run: its agents live on, `ftrun --attach` adopts them, re-learns the committed
    version, and the job ends with the failure-free digests."""
    want = golden(4, ARGS)
    job = ClusterJob(2, 2, ARGS, config=CONFIG % "30s")
    st = job.wait_for(lambda s: s.get("phase") == "running" and (s.get("committed_version") or 0) >= 20, timeout=90)
    if check(st is not None, "the job runs and commits"):
        agents = [p for p in pids_of(job, st)][:1] + [(job.agent_state(1) or {}).get("agent_pid")]
        job.proc.kill()
        job.proc.wait()
        time.sleep(1.0)
        check(all(alive(p) for p in agents if p), f"the agents outlive the SIGKILLed runner ({agents})")
        out = open(os.path.join(job.dir, "attach.log"), "w+")
        # From another directory: the attach runs where the job's command line was given (runner.json's cwd).
        with open(os.path.join(job.dir, "run", st["job_id"], "runner.json")) as f:
            saved = json.load(f)
        check(saved.get("cwd") == os.getcwd(), f"runner.json names the job's directory: {saved.get('cwd')!r}")
        attach = subprocess.run([RUNNER, "--attach", st["job_id"], "--config", job.config], stdout=out,
                                stderr=subprocess.STDOUT, timeout=240, cwd="/")
        out.seek(0)
        log = out.read()
        print(log[-2500:], flush=True)
        check(attach.returncode == 0, f"ftrun --attach ends the job with exit 0 (got {attach.returncode})")
        check("adopted agent 0" in log and "adopted agent 1" in log, "the new runner adopts both agents")
        check("learned committed version" in log, "the new coordinator re-learns the committed version from the agents")
        time.sleep(0.5)
        job.out.flush()
        job.out.seek(0)
        ranks_out = job.out.read()  # the agents kept writing to the old runner's output
        check(digests(ranks_out) == want, f"digests after the attach equal the failure-free run's "
              f"({digests(ranks_out)} vs {want})")


def test_no_attach(check):
    """The runner SIGKILLed and no attach: agents and ranks are gone after lost_node_timeout."""
    job = ClusterJob(2, 2, ARGS, config=CONFIG % "3s")
    st = job.wait_for(lambda s: s.get("phase") == "running" and (s.get("committed_version") or 0) >= 5, timeout=90)
    if check(st is not None, "second job runs"):
        pids = pids_of(job, st)
        job.proc.kill()
        job.proc.wait()
        deadline = time.time() + 20
        while time.time() < deadline and any(alive(p) for p in pids):
            time.sleep(0.1)
        check(not any(alive(p) for p in pids), f"no attach: agents and ranks end after lost_node_timeout "
              f"(left: {[p for p in pids if alive(p)]})")


def test_attach_unknown_job(check):
    """An attach to an unknown job exits 2, naming the file it looked for."""
    r = subprocess.run([RUNNER, "--attach", "no-such-job"], capture_output=True, text=True)
    check(r.returncode == 2 and "runner.json" in r.stderr,
          f"attach to an unknown job: exit 2 naming the file ({r.stderr})")
