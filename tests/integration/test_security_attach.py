"""`ftrun --attach` trusts nothing in the job directory that another user
could have written, and never waits on or kills a recycled pid.

The job directory is made by hand, as a dead runner would have left it
(runner.json, status.json, the secret), so each case changes one thing:
  * runner.json writable by group and others, status.json owned by another
    user (nobody), or status.json a symlink: refused, naming the file;
  * status.json names as the agent a pid that is now another process (a
    `sleep` in its own process group, its start time not the one recorded):
    the new runner does not adopt it, ends (no agent is left), and the sleep
    is still alive afterwards.
Real processes, real files; CI runs as root (chown to nobody for a foreign owner).
"""
import json
import os
import signal
import socket
import subprocess

import pytest

from ftrun_testlib import RUNNER, scratch


class Root:
    """A directory with the config (`cfg`) whose run dir (`run_dir`) holds the hand-made job directories."""

    def __init__(self):
        self.base = scratch("ftrun-sec-attach-")
        self.run_dir = os.path.join(self.base, "run")
        self.cfg = os.path.join(self.base, "ftrun.yaml")
        with open(self.cfg, "w") as f:
            f.write(f"agent:\n  run_dir: {self.run_dir}\nstore:\n  memory_budget: 64MiB\n  prefault: false\n"
                    "job:\n  stop_grace: 1s\ncluster:\n  lost_node_timeout: 2s\n")


@pytest.fixture(scope="module")
def root():
    return Root()


@pytest.fixture(scope="module")
def other():
    """A process that is not the job's agent: what a recycled pid would name."""
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    yield proc
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_time(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def make_job(root, name, agent_pid, agent_start):
    """A job directory as a runner SIGKILLed mid-run leaves it."""
    d = os.path.join(root.run_dir, name)
    os.makedirs(d, mode=0o700)
    os.chmod(root.run_dir, 0o700)

    def put(n, text):
        p = os.path.join(d, n)
        with open(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(text)
        return p

    put("runner.json", json.dumps({"argv": ["--num_nodes", "1", "--num_gpus", "1", "--config", root.cfg,
                                            "--no_python", "--no_local_rank", "/bin/true"]}))
    put("status.json", json.dumps({
        "job_id": name, "coordinator": "127.0.0.1:%d" % free_port(), "runner_pid": 1, "phase": "running",
        "agents": [{"agent": 0, "pid": agent_pid, "start_time": agent_start,
                    "status_file": os.path.join(d, "agent0.json")}],
        "nodes": [{"node": 0, "agent": 0}]}))
    put("secret", "0123456789abcdef" * 4 + "\n")
    return d


def attach(root, name, timeout=90):
    try:
        p = subprocess.run([RUNNER, "--attach", name, "--config", root.cfg], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=timeout, start_new_session=True)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        print(f"--- attach {name}: timed out\n{out[-2500:]}", flush=True)
        return "timeout", out
    print(f"--- attach {name}: rc={p.returncode}\n{p.stdout[-2500:]}", flush=True)
    return p.returncode, p.stdout


def test_untrusted_files_refused(check, root, other):
    """runner.json writable by group and others, status.json owned by another user or a symlink, a job
    directory others can write: each refused, naming the file; the process the status names is untouched."""
    # --- files another user could have written: refused, naming them -------
    d = make_job(root, "writable", other.pid, 1)
    os.chmod(os.path.join(d, "runner.json"), 0o666)
    rc, out = attach(root, "writable")
    check(rc == 2 and os.path.join(d, "runner.json") in out and "group or others" in out,
          "attach refuses a runner.json that group and others can write, naming it")

    d = make_job(root, "foreign", other.pid, 1)
    os.chown(os.path.join(d, "status.json"), 65534, 65534)
    rc, out = attach(root, "foreign")
    check(rc == 2 and os.path.join(d, "status.json") in out and "uid 65534" in out,
          "attach refuses a status.json owned by another user, naming it")

    d = make_job(root, "linked", other.pid, 1)
    elsewhere = os.path.join(root.base, "elsewhere.json")
    os.rename(os.path.join(d, "status.json"), elsewhere)
    os.symlink(elsewhere, os.path.join(d, "status.json"))
    rc, out = attach(root, "linked")
    check(rc == 2 and os.path.join(d, "status.json") in out and "symbolic link" in out,
          "attach refuses a symlinked status.json, naming it")

    d = make_job(root, "shared-dir", other.pid, 1)
    os.chmod(d, 0o777)
    rc, out = attach(root, "shared-dir")
    check(rc == 2 and d in out and "0777" in out, "attach refuses a job directory others can write, naming it")

    check(alive(other.pid), "no refused attach touched the other process")


def test_recycled_pid_not_adopted(check, root, other):
    """status.json names as the agent a pid that is now another process: not adopted, waited on or killed."""
    # --- a recycled pid: never adopted, waited on or killed ------------------
    recorded = start_time(other.pid) + 12345  # the agent that had this pid started at another time
    make_job(root, "recycled", other.pid, recorded)
    rc, out = attach(root, "recycled")
    check(rc not in (0, "timeout"), f"attach ends with an error when no recorded agent is left (got {rc})")
    check("not the process the old status recorded" in out and "adopted agent 0" not in out,
          "attach says the recorded pid is another process now, and does not adopt it")
    check(alive(other.pid), "the process that now has the agent's old pid is neither waited on nor killed")
