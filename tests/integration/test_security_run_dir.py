"""The run directory is this user's own, and nothing is written through a link.

Real runners and agents (issue 13, "The node"):
  * a symlinked or group-writable agent.run_dir is refused by the runner and
    by the agent, with an error naming it; nothing is made through the link;
  * runner.json, status.json (and the old status.json.tmp name) planted as
    links to a victim file: the runner refuses or never follows them, and the
    victim keeps its bytes; likewise an agent's --status-file and the
    --save_pid file /tmp/<pid>.deepspeed;
  * two users on one node, both with the built-in default run dir, each get
    their own and both run (the second user is a throwaway account made with
    useradd, run with setpriv; CI runs as root);
  * the Slurm epilog removes the job's entries and the user's default run dir
    it left empty.
"""
import os
import pwd
import random
import shutil
import subprocess
import time

import pytest

from ftrun_testlib import AGENT, RUNNER, SOURCE

CONFIG = "store:\n  memory_budget: 64MiB\n  prefault: false\n"
EPILOG = os.path.join(SOURCE, "integration", "slurm", "epilog.sh")
USER = "ftrun-rundir-u"

env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}


@pytest.fixture
def base(scratch):
    """The test's directory: configs, links, victims (0755: the second user reads the config here)."""
    d = scratch("ftrun-sec-rundir-")
    os.chmod(d, 0o755)
    return d


def victims(base):
    """Two victim files holding "keep\\n" (what plant() resets them to)."""
    paths = os.path.join(base, "victim"), os.path.join(base, "victim2")
    for v in paths:
        write(v, "keep\n")
    return paths


def write(path, text, mode=0o644):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)


def read(path):
    with open(path) as f:
        return f.read()


def config(base, name, run_dir=None, extra=""):
    path = os.path.join(base, name + ".yaml")
    write(path, (f"agent:\n  run_dir: {run_dir}\n" if run_dir else "") + CONFIG + extra)
    return path


def run(argv, timeout=60, **kw):
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout,
                       env=kw.pop("env", env), **kw)
    print(f"--- {' '.join(argv[:3])} ... rc={p.returncode}\n{p.stdout[-1500:]}", flush=True)
    return p.returncode, p.stdout


def plant(path, target):
    """A link at `path` (whatever was there goes), and the victim's bytes reset."""
    if os.path.lexists(path):
        os.unlink(path)
    os.symlink(target, path)
    write(target, "keep\n")


def runner(cfg, *command):
    return run([RUNNER, "--num_nodes", "1", "--num_gpus", "1", "--config", cfg, "--no_python", "--no_local_rank",
                *command])


def agent(cfg, *extra, command=("/bin/true",), **kw):
    return run([AGENT, "--config", cfg, "--nproc", "1", "--job-id", "sec-%d" % random.randrange(1 << 30),
                "--no_python", "--no_local_rank", *extra, "--", *command], **kw)


def default_run_dir(uid):
    mine = "/run/user/%d" % uid
    try:
        st = os.lstat(mine)
        if os.path.isdir(mine) and not os.path.islink(mine) and st.st_uid == uid and not st.st_mode & 0o022:
            return mine + "/ftrun"
    except OSError:
        pass
    return "/tmp/ftrun-%d" % uid


def test_symlinked_run_dir(check, base):
    """A symlinked run dir is refused by the runner and by the agent, naming it; nothing is made through it."""
    target = os.path.join(base, "target")
    os.mkdir(target, 0o700)
    link = os.path.join(base, "run-link")
    os.symlink(target, link)
    rc, out = runner(config(base, "link", link), "/bin/true")
    check(rc != 0 and link in out and "symbolic link" in out, "the runner refuses a symlinked run dir, naming it")
    check(os.listdir(target) == [], f"nothing is created through the link (found {os.listdir(target)})")
    rc, out = agent(config(base, "link", link))
    check(rc != 0 and link in out and "symbolic link" in out, "the agent refuses a symlinked run dir, naming it")
    check(os.listdir(target) == [], "the agent creates nothing through the link")


def test_group_writable_run_dir(check, base):
    """A group/other-writable run dir is refused, naming it and its mode; nothing is made in it."""
    shared = os.path.join(base, "run-shared")
    os.mkdir(shared)
    os.chmod(shared, 0o777)
    rc, out = runner(config(base, "shared", shared), "/bin/true")
    check(rc != 0 and shared in out and "0777" in out and "group or others" in out,
          "the runner refuses a group/other-writable run dir, naming it and its mode")
    rc, out = agent(config(base, "shared", shared))
    check(rc != 0 and shared in out and "0777" in out, "the agent refuses a group/other-writable run dir")
    check(os.listdir(shared) == [], "nothing is created in the shared directory")


def test_foreign_run_dir(check, base):
    """Another user's run dir is refused, naming it; nothing is made in it."""
    foreign = os.path.join(base, "run-foreign")
    os.mkdir(foreign, 0o700)
    os.chown(foreign, 65534, 65534)
    rc, out = runner(config(base, "foreign", foreign), "/bin/true")
    check(rc != 0 and foreign in out and "uid 65534" in out, "the runner refuses another user's run dir, naming it")
    check(os.listdir(foreign) == [], "nothing is created in another user's run dir")


def test_planted_runner_files(check, base):
    """runner.json and status.json (and the old status.json.tmp) planted as links to victim files: refused or
    never followed, and the victims keep their bytes."""
    victim, victim2 = victims(base)
    run_dir = os.path.join(base, "run")
    os.mkdir(run_dir, 0o700)
    job_dir = os.path.join(run_dir, "sec-job")
    os.mkdir(job_dir, 0o700)
    os.symlink(victim, os.path.join(job_dir, "runner.json"))
    cfg = config(base, "planted", run_dir, "job:\n  id: sec-job\n")
    rc, out = runner(cfg, "/bin/true")
    check(rc != 0 and os.path.join(job_dir, "runner.json") in out and "symbolic link" in out,
          "a symlinked runner.json is refused, naming it")
    check(read(victim) == "keep\n", "nothing is written through the runner.json link")
    os.unlink(os.path.join(job_dir, "runner.json"))
    plant(os.path.join(job_dir, "status.json"), victim)
    plant(os.path.join(job_dir, "status.json.tmp"), victim2)
    rc, out = runner(cfg, "/bin/true")
    check(rc == 0, f"the job itself runs (got {rc})")
    check(os.path.join(job_dir, "status.json") in out and "symbolic link" in out,
          "the runner says it refuses the symlinked status.json, naming it")
    check(read(victim) == "keep\n" and read(victim2) == "keep\n",
          "nothing is written through status.json or status.json.tmp links")
    check(os.path.islink(os.path.join(job_dir, "status.json")), "the planted status.json link is left, not followed")


def test_planted_agent_files(check, base):
    """An agent's --status-file and the --save_pid file /tmp/<pid>.deepspeed planted as links: refused or never
    followed; --save_pid then makes a new regular file, mode 0600."""
    victim, victim2 = victims(base)
    run_dir = os.path.join(base, "run")
    os.mkdir(run_dir, 0o700)
    status = os.path.join(base, "agent-status.json")
    plant(status, victim)
    plant(status + ".tmp", victim2)
    rc, out = agent(config(base, "plain", run_dir), "--status-file", status)
    check(rc == 0 and status in out and "symbolic link" in out,
          "the agent runs and says it refuses the symlinked --status-file")
    check(read(victim) == "keep\n" and read(victim2) == "keep\n", "nothing is written through --status-file links")
    save_pid = random.randrange(1 << 20, 1 << 30)
    pid_file = "/tmp/%d.deepspeed" % save_pid
    plant(pid_file, victim)
    try:
        rc, out = agent(config(base, "plain", run_dir), "--save_pid", str(save_pid))
        check(rc != 0 and pid_file in out and "symbolic link" in out,
              "a symlinked --save_pid file is refused, naming it")
        check(read(victim) == "keep\n", "nothing is written through the --save_pid link")
        os.unlink(pid_file)
        rc, out = agent(config(base, "plain", run_dir), "--save_pid", str(save_pid))
        st = os.lstat(pid_file) if os.path.lexists(pid_file) else None
        check(rc == 0 and st is not None and (st.st_mode & 0o777) == 0o600 and not os.path.islink(pid_file),
              "--save_pid creates a new regular file, mode 0600")
    finally:
        if os.path.lexists(pid_file):
            os.unlink(pid_file)


def test_two_users_and_the_epilog(check, scratch, base):
    """Two users on one node, both with the built-in default run dir, each get their own and both run; the
    Slurm epilog removes the job's entries and the user's default run dir it left empty."""
    if not (os.geteuid() == 0 and shutil.which("useradd") and shutil.which("setpriv")):
        pytest.skip("the two-user case needs root, useradd and setpriv")
    for attempt in range(10):  # other tests may hold /etc/passwd's lock for a moment
        try:
            pwd.getpwnam(USER)
            break
        except KeyError:
            subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", USER])
            time.sleep(0.5)
    u = pwd.getpwnam(USER)
    mine, theirs = default_run_dir(os.geteuid()), default_run_dir(u.pw_uid)
    if os.path.isdir(theirs) and os.lstat(theirs).st_uid != u.pw_uid:
        shutil.rmtree(theirs)  # an earlier run of this test on the old code left it (as root)
    both = config(base, "default")  # no agent.run_dir: the built-in, per-user default
    # The first user (root) holds its run dir while the second starts.
    first = subprocess.Popen([AGENT, "--config", both, "--nproc", "1", "--job-id", "two-users", "--no_python",
                              "--no_local_rank", "--", "/bin/sleep", "3"], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    as_user = ["setpriv", "--reuid", str(u.pw_uid), "--regid", str(u.pw_gid), "--clear-groups", "--"]
    user_env = dict(env, HOME="/", USER=USER, LOGNAME=USER)
    rc, out = run(as_user + [AGENT, "--config", both, "--nproc", "1", "--job-id", "two-users", "--no_python",
                             "--no_local_rank", "--", "/bin/true"], env=user_env, cwd="/")
    out1 = first.communicate(timeout=60)[0]
    print("--- first user's agent\n" + out1[-1500:], flush=True)
    check(first.returncode == 0, f"the first user's agent runs (got {first.returncode})")
    check(rc == 0, f"the second user's agent runs next to it on the same node (got {rc})")
    check(mine != theirs, "the two users' default run dirs differ")
    ok = check(os.path.isdir(theirs) and os.stat(theirs).st_uid == u.pw_uid and
               (os.stat(theirs).st_mode & 0o777) == 0o700, f"the second user's run dir {theirs} is its own, mode 0700")

    # --- the epilog removes what the job left, and the emptied default dir ---
    # (Only in the user's own directory: never made here as root.)
    slurm_job = str(random.randrange(1 << 20, 1 << 30))
    if not ok:
        os.makedirs(theirs, mode=0o700, exist_ok=True)
        os.chown(theirs, u.pw_uid, u.pw_gid)
    os.makedirs(os.path.join(theirs, "slurm-%s-abc" % slurm_job), exist_ok=True)
    open(os.path.join(theirs, "slurm-%s-abc.node0.lock" % slurm_job), "w").close()
    for root, dirs, files in os.walk(theirs):
        for n in dirs + files:
            os.chown(os.path.join(root, n), u.pw_uid, u.pw_gid)
    for n in os.listdir(theirs):  # the agent's own lock from above
        if not n.startswith("slurm-"):
            os.unlink(os.path.join(theirs, n))
    standby_dir = scratch("ftrun-sec-standby-")
    e = dict(env, SLURM_JOB_ID=slurm_job, SLURM_JOB_UID=str(u.pw_uid), SLURM_JOB_GID=str(u.pw_gid),
             FTRUN_STANDBY_DIR=standby_dir, SLURM_SCRIPT_CONTEXT="epilog_slurmd")
    e.pop("FTRUN_RUN_DIR", None)
    rc, out = run(["bash", EPILOG], env=e)
    check(rc == 0, f"the epilog exits 0 (got {rc})")
    check(not os.path.exists(theirs), f"the epilog removes the job's entries and the emptied default run dir {theirs}")
    shutil.rmtree(standby_dir, ignore_errors=True)
