"""Issue 13, "the node": the Slurm standby writes as root into
FTRUN_STANDBY_DIR (its socket, pid file and log); it must never write
through a link planted there, nor use a directory someone else could have
written into.

- the log file is a symlink to a victim file: the prolog fails (the standby
  refuses the log, naming it), the victim is unchanged;
- the pid file is a symlink to a victim file: refused (the pid file is
  written through a temporary name and renamed, never over a link), the
  standby's log says why, the victim is unchanged;
- FTRUN_STANDBY_DIR is group- or other-writable: refused, naming it.
"""
import os
import random
import signal
import subprocess
import time

import pytest

from ftrun_testlib import AGENT, SOURCE

VICTIM = "precious bytes\n"


def prolog(standby_dir, slurm_job):
    env = dict(os.environ, SLURM_JOB_ID=slurm_job, SLURM_JOB_UID="0", SLURM_JOB_GID="0",
               FTRUN_SLURM_CONF="/nonexistent", FTRUN_AGENT=AGENT, FTRUN_STANDBY_DIR=standby_dir)
    p = subprocess.run(["bash", os.path.join(SOURCE, "integration", "slurm", "prolog.sh")], env=env,
                       capture_output=True, text=True, start_new_session=True, timeout=60)
    print(p.returncode, p.stdout, p.stderr, flush=True)
    return p


def stop(pid_path):
    try:
        pid = int(open(pid_path).read())
    except (OSError, ValueError):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.time() + 20
    while time.time() < deadline and os.path.exists(f"/proc/{pid}"):
        time.sleep(0.05)


def victim(tmp):
    path = os.path.join(tmp, "victim")
    with open(path, "w") as f:
        f.write(VICTIM)
    return path


@pytest.fixture(autouse=True)
def as_root():
    if os.getuid() != 0:
        pytest.skip("the standby runs as root")


def test_planted_log_link(check, scratch):
    """The log file is a symlink to a victim file: the prolog fails (the standby refuses the log, naming it),
    and the victim is unchanged."""
    tmp = scratch("ftrun-sbf-")
    d = os.path.join(tmp, "a")
    os.mkdir(d, 0o755)
    job = str(random.randrange(10**6, 10**7))
    v = victim(tmp)
    os.symlink(v, f"{d}/slurm-{job}.log")
    p = prolog(d, job)
    stop(f"{d}/slurm-{job}.pid")
    check(p.returncode != 0, "a symlinked log file makes the prolog fail")
    check(f"slurm-{job}.log" in p.stdout + p.stderr, "the error names the log file")
    check(open(v).read() == VICTIM, "nothing is written through the log link")


def test_planted_pid_file_link(check, scratch):
    """The pid file is a symlink to a victim file: refused (written through a temporary name and renamed,
    never over a link), the standby's log says why, and the victim is unchanged."""
    tmp = scratch("ftrun-sbf-")
    d = os.path.join(tmp, "b")
    os.mkdir(d, 0o755)
    job = str(random.randrange(10**6, 10**7))
    v = victim(tmp)
    os.symlink(v, f"{d}/slurm-{job}.pid")
    p = prolog(d, job)
    check(p.returncode != 0, "a symlinked pid file makes the prolog fail")
    log = open(f"{d}/slurm-{job}.log").read()
    print(log, flush=True)
    check("pid file" in log and f"slurm-{job}.pid" in log, "the standby's log names the pid file")
    check(open(v).read() == VICTIM, "nothing is written through the pid-file link")
    check(os.path.islink(f"{d}/slurm-{job}.pid"), "the link is left as it is")


def test_shared_standby_dir(check, scratch):
    """FTRUN_STANDBY_DIR group- or other-writable: refused, naming it; no socket is made there."""
    tmp = scratch("ftrun-sbf-")
    for mode in (0o775, 0o777):
        d = os.path.join(tmp, "c%o" % mode)
        os.mkdir(d)
        os.chmod(d, mode)
        job = str(random.randrange(10**6, 10**7))
        p = prolog(d, job)
        stop(f"{d}/slurm-{job}.pid")
        check(p.returncode != 0, f"a standby directory of mode {mode:o} is refused")
        check(d in p.stdout + p.stderr, f"the error names the mode-{mode:o} directory")
        check(not os.path.exists(f"{d}/slurm-{job}.sock"), f"no socket is made in the mode-{mode:o} directory")
