"""Bad inputs get clear errors naming the problem, and lose nothing
already committed: configs, command lines, a second agent on the same
socket, a stale socket, a stranger claiming a rank, a missing command."""
import os
import socket
import subprocess

import pytest

import ftrun
from ftrun_testlib import AGENT, PY, TRAINER, Job, digests, golden, scratch

ARGS = ["--state-bytes", "2MiB", "--tensors", "2", "--steps", "20", "--step-ms", "5"]
LONG = ["--state-bytes", "2MiB", "--tensors", "2", "--steps", "80", "--step-ms", "10"]


def agent(*argv, config=None):
    d = scratch("ftrun-bad-")
    cmd = [AGENT, "--run-dir", d + "/run"]
    if config is not None:
        path = os.path.join(d, "bad.yaml")
        with open(path, "w") as f:
            f.write(config)
        cmd += ["--config", path]
    p = subprocess.run(cmd + list(argv), capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


@pytest.fixture(scope="module")
def want():
    return golden(2, ARGS)


def test_config_errors(check):
    """Config errors exit 2 and name the file, the line and the field."""
    for text, needles in [
        ("job:\n  max_restarts: 2\n  max_restart: 3\n", ["bad.yaml:3", "job.max_restart", "unknown key"]),
        ("store:\n  memory_budget: 4 gigs\n", ["bad.yaml:2", "store.memory_budget", "4 gigs"]),
        ("job:\n  hang_timeout: 30\n", ["bad.yaml:2", "job.hang_timeout"]),
        ("job:\n  max_restarts: three\n", ["bad.yaml:2", "job.max_restarts", "three"]),
        ("store:\n  chunk_size: 3MiB\n", ["bad.yaml:2", "store.chunk_size"]),
        ("store:\n  memory_budget: 1GiB\n  snapshot_bytes: 512MiB\n",
         ["bad.yaml:2", "store.memory_budget", "cannot hold one snapshot"]),
        ("job: [1, 2\n", ["bad.yaml", "YAML syntax error"]),
    ]:
        rc, out = agent("--nproc", "2", "--no_python", "true", config=text)
        check(rc == 2, f"config {text!r}: exit {rc}")
        for n in needles:
            check(n in out, f"config {text!r}: '{n}' not in: {out.strip()}")


def test_command_line_errors(check):
    """Command-line errors exit 2 and name the option."""
    for argv, needle in [(["--nproc", "abc", "true"], "--nproc"),
                         ([], "no training command"),
                         (["--world_info", "!!!", "true"], "--world_info"),
                         (["--world_info", "eyJhIjogWzAsIDFdfQ==", "--node_rank", "3", "true"], "--node_rank 3"),
                         (["--job-id", "bad/id", "true"], "job id")]:
        rc, out = agent(*argv)
        check(rc == 2, f"argv {argv}: exit {rc}")
        check(needle in out, f"argv {argv}: '{needle}' not in: {out.strip()}")


def test_second_agent_and_stranger(check):
    """A second agent for the same job and node is refused, and a process the agent did not start cannot
    claim a rank; the first agent goes on and finishes with the failure-free state."""
    first = Job(2, LONG, "store:\n  memory_budget: 64MiB\n")
    first.wait_for(lambda s: s["committed_version"] is not None)
    rc = subprocess.run([AGENT, "--config", first.config, "--nproc", "2", "--job-id", first.job_id, "--no_python",
                         TRAINER] + ARGS, capture_output=True, text=True, timeout=60)
    check(rc.returncode == 2, f"second agent: exit {rc.returncode}")
    check("already serves" in rc.stderr and first.job_id in rc.stderr, f"second agent said: {rc.stderr.strip()}")

    # A process the agent did not start cannot claim a rank.
    sock = os.path.join(first.dir, "run", first.job_id + ".node0.sock")
    try:
        ftrun.Client(sock, rank=0)
        check(False, "a stranger connected as rank 0")
    except ftrun.Error as e:
        check(e.code == "FAILED_PRECONDITION" and "not rank 0's process" in e.message,
              f"stranger: {e.code} {e.message}")
    rc = first.wait()
    check(rc == 0, f"first agent exit {rc}")
    check(digests(first.log) == golden(2, LONG), "first agent's ranks end in the failure-free state")


def test_stale_socket(check, want):
    """A stale socket from a dead agent is removed (and said so), not reused."""
    job_dir = scratch("ftrun-stale-")
    os.makedirs(job_dir + "/run", mode=0o700)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(job_dir + "/run/stale-job.node0.sock")
    stale.close()
    p = subprocess.run([AGENT, "--run-dir", job_dir + "/run", "--nproc", "2", "--job-id", "stale-job", "--no_python",
                        "--no_local_rank", TRAINER] + ARGS, capture_output=True, text=True, timeout=120)
    check(p.returncode == 0, f"stale socket run: exit {p.returncode}: {p.stderr[-2000:]}")
    check("removed a stale socket" in p.stderr, "the stale socket is reported")
    check(digests(p.stdout) == want, "stale socket run ends in the failure-free state")


def test_missing_command(check):
    """A rank command that cannot be started: an error naming it."""
    rc, out = agent("--config", "/dev/null", "--nproc", "1", "--no_python", "/nonexistent/train")
    check(rc != 0 and "cannot exec '/nonexistent/train'" in out, f"missing command: exit {rc}: {out[-500:]}")


def test_rank_of_another_job(check):
    """A rank of another job (its FTRUN_JOB_ID differs) is refused by name."""
    py = PY
    job = Job(1, [], "job:\n  max_restarts: 0\n",
              command=["/bin/sh", "-c", f'FTRUN_JOB_ID=other-job exec {py} -c "import ftrun; ftrun.Client()"'])
    rc = job.wait(timeout=60)
    check(rc == 1, f"foreign job rank: agent exit {rc}")
    check("client is in job 'other-job', this agent serves job '" + job.job_id + "'" in job.log,
          f"foreign job not named: {job.log[-1500:]}")
