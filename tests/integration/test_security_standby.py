"""Issue 13, "the node": the Slurm standby (integration/slurm/prolog.sh,
launcher/agent/standby.cc), attacked by the job's own user.

The standby runs as root; each attach names argv, environment and working
directory, and carries the attacher's stdout/stderr (SCM_RIGHTS). Here a
raw client (this file) attaches as a throwaway user (created with useradd
when absent), as the job's user could:

- a working directory only that user can enter (0700, theirs, under a
  root-owned directory): the agent runs there, as that user;
- a directory only root can enter: refused, because the standby drops to
  the user before it enters the directory; and a path that does not exist
  there gets the very same error (nothing tells the user which exist);
- where this host has a writable cgroup v2 hierarchy: the attacher sits in a
  cgroup of its own, and the agent's rank runs in that cgroup (else this is
  said, and the unit test "cgroup v2 paths ..." covers the path checks);
- 40 clients that connect and send half a header: another attach still
  runs at once, and SIGTERM (the epilog's stop) still stops the standby at
  once, instead of after a blocking 5 s read per slow client.
"""
import os
import pwd
import random
import select
import signal
import socket
import struct
import subprocess
import time

import pytest

from ftrun_testlib import AGENT, SOURCE, scratch

USER = "ftrun-sbtest"
MAGIC = 0x46545231
ATTACH, ATTACH_FD, ATTACH_EXIT, ATTACH_REFUSED = 64, 65, 67, 68
SHOW = ["/bin/sh", "-c", "pwd; id -u; cat /proc/self/cgroup"]


class Standby:
    """The throwaway user, its directories, and the standby the prolog started for a Slurm job."""


@pytest.fixture(scope="module")
def sb():
    if os.getuid() != 0:
        pytest.skip("the standby test runs as root (it drops to a throwaway user)")
    try:
        pw = pwd.getpwnam(USER)
    except KeyError:
        made = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", USER])
        if made.returncode != 0:
            pytest.skip(f"cannot create the throwaway user {USER} (useradd exit {made.returncode})")
        pw = pwd.getpwnam(USER)
    s = Standby()
    s.uid, s.gid = pw.pw_uid, pw.pw_gid
    # The agent runs as that user: it must be able to reach the build tree.
    probe = subprocess.run([AGENT, "--help"], user=s.uid, group=s.gid, extra_groups=[], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"{USER} cannot run {AGENT} (a build tree other users cannot enter?): {probe.stderr[-300:]}")

    s.tmp = scratch("ftrun-sb-")
    os.chmod(s.tmp, 0o755)  # root's, others may pass
    s.home = os.path.join(s.tmp, "home")  # the user's own, 0700
    os.mkdir(s.home, 0o700)
    os.chown(s.home, s.uid, s.gid)
    s.secret = os.path.join(s.tmp, "secret")  # root's, 0700
    os.mkdir(s.secret, 0o700)
    os.mkdir(os.path.join(s.secret, "inner"), 0o755)
    s.config = os.path.join(s.home, "ftrun.yaml")
    with open(s.config, "w") as f:
        f.write(f"agent:\n  run_dir: {s.home}/run\nstore:\n  memory_budget: 64MiB\n  prefault: false\n")
    os.chown(s.config, s.uid, s.gid)

    slurm_job = str(random.randrange(10**6, 10**7))
    standby_dir = os.path.join(s.tmp, "standby")
    env = dict(os.environ, SLURM_JOB_ID=slurm_job, SLURM_JOB_UID=str(s.uid), SLURM_JOB_GID=str(s.gid),
               FTRUN_SLURM_CONF="/nonexistent", FTRUN_AGENT=AGENT, FTRUN_STANDBY_DIR=standby_dir)
    s.sock_path = f"{standby_dir}/slurm-{slurm_job}.sock"
    s.log_file = f"{standby_dir}/slurm-{slurm_job}.log"
    p = subprocess.run(["bash", os.path.join(SOURCE, "integration", "slurm", "prolog.sh")], env=env,
                       capture_output=True, text=True, start_new_session=True, timeout=60)
    print(p.stdout, p.stderr, flush=True)
    assert p.returncode == 0 and os.path.exists(s.sock_path), "the prolog starts the standby"
    s.standby = int(open(f"{standby_dir}/slurm-{slurm_job}.pid").read())
    yield s
    if alive(s.standby):  # a test stopped before the last one stopped it
        os.kill(s.standby, signal.SIGKILL)


def frame(kind, payload):
    return struct.pack("<IHHI", MAGIC, kind, 0, len(payload)) + payload


def string(s):
    b = s.encode()
    return struct.pack("<I", len(b)) + b


def attach_payload(argv, environ, cwd):
    out = struct.pack("<I", len(argv)) + b"".join(string(a) for a in argv)
    out += struct.pack("<I", len(environ)) + b"".join(string(e) for e in environ)
    return out + string(cwd)


def attach(sb, cwd, command, as_user=True, cgroup=None, timeout=60):
    """Attaches like ftrun-agent under srun would; returns (code, stdout, stderr).
    code: the agent's exit code, "refused: ..." or "timeout"."""
    n = random.randrange(1 << 30)
    argv = ["ftrun-agent", "--config", sb.config, "--nproc", "1", "--job-id", f"sb-{n}", "--status-file",
            f"{sb.home}/status-{n}.json", "--no_python", "--no_local_rank", "--", *command]
    out_path, err_path = os.path.join(sb.tmp, f"out-{n}"), os.path.join(sb.tmp, f"err-{n}")
    out, err = open(out_path, "w+"), open(err_path, "w+")
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:  # the attaching process
        code = "error"
        try:
            os.close(rd)
            if cgroup:
                with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                    f.write(str(os.getpid()))
            if as_user:
                os.setgroups([])
                os.setgid(sb.gid)
                os.setuid(sb.uid)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(sb.sock_path)
            body = attach_payload(argv, ["PATH=/usr/bin:/bin", f"HOME={sb.home}"], cwd)
            socket.send_fds(s, [frame(ATTACH, body)], [out.fileno()])
            socket.send_fds(s, [frame(ATTACH_FD, b"")], [err.fileno()])
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    code = "closed"
                    break
                data += chunk
                if len(data) >= 12:
                    _, kind, _, length = struct.unpack("<IHHI", data[:12])
                    if len(data) >= 12 + length:
                        body = data[12:12 + length]
                        code = str(struct.unpack("<i", body)[0]) if kind == ATTACH_EXIT else \
                            "refused: " + body.decode(errors="replace")
                        break
        except Exception as e:  # noqa: BLE001 - reported to the parent
            code = f"error: {e}"
        os.write(wr, code.encode())
        os._exit(0)
    os.close(wr)
    ready, _, _ = select.select([rd], [], [], timeout)
    code = os.read(rd, 65536).decode() if ready else "timeout"
    os.close(rd)
    if not ready:
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    out.seek(0)
    err.seek(0)
    o, e = out.read(), err.read()
    out.close()
    err.close()
    print(f"--- attach from {cwd} ({'user' if as_user else 'root'}): {code}\nstdout:\n{o}stderr:\n{e}", flush=True)
    return (int(code) if code.lstrip("-").isdigit() else code), o, e


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1].split()[0] != "Z"
    except OSError:
        return False


def refusal(text, path):
    return [l.replace(path, "DIR") for l in text.splitlines() if "working directory" in l]


def slow_clients(sb, n):
    held = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(sb.sock_path)
        s.send(b"FTR")  # a quarter of a header, then nothing
        held.append(s)
    return held


def test_users_own_directory(check, sb):
    """A working directory only the job's user can enter (0700, theirs, under a root-owned directory): the
    agent runs there, as that user."""
    code, out, err = attach(sb, sb.home, SHOW)
    check(code == 0, f"attach from the user's own 0700 directory: the agent runs (exit {code})")
    lines = out.splitlines()
    check(sb.home in lines and str(sb.uid) in lines, "the rank runs in that directory, as the job's user")


def test_root_only_directory_refused(check, sb):
    """A directory only root can enter is refused (the standby drops to the user before it enters it), and a
    path that does not exist there gets the very same error."""
    inner, missing = os.path.join(sb.secret, "inner"), os.path.join(sb.secret, "missing")
    code_in, out_in, err_in = attach(sb, inner, SHOW)
    code_mi, out_mi, err_mi = attach(sb, missing, SHOW)
    check(code_in != 0 and inner not in out_in.splitlines(),
          f"a directory the job's user cannot enter is refused (exit {code_in})")
    check("cannot enter the working directory" in err_in and "Permission denied" in err_in,
          "the error says the directory cannot be entered: permission denied")
    check(code_mi != 0, f"a path that does not exist is refused (exit {code_mi})")

    check(refusal(err_in, inner) == refusal(err_mi, missing) and refusal(err_in, inner) != [],
          f"the same error whether the path exists or not: {refusal(err_in, inner)} vs {refusal(err_mi, missing)}")
    check("No such file" not in err_mi, "the error does not tell that the path is missing")


def test_attachers_cgroup(check, sb):
    """Where this host has a writable cgroup v2 hierarchy: the agent's rank runs in the attacher's cgroup."""
    root = None
    for cand in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        try:
            fs = subprocess.run(["stat", "-f", "-c", "%T", cand], capture_output=True, text=True).stdout.strip()
            if os.path.exists(os.path.join(cand, "cgroup.procs")) and fs == "cgroup2fs":
                root = cand
                break
        except OSError:
            pass
    cg = None
    if root:
        cg = os.path.join(root, f"ftrun-sbtest-{os.getpid()}")
        try:
            os.mkdir(cg)
        except OSError as e:
            print(f"cgroup v2 at {root} is not writable here ({e})", flush=True)
            cg = None
    if cg:
        code, out, err = attach(sb, sb.home, SHOW, cgroup=cg)
        want = "0::/" + os.path.basename(cg)
        check(code == 0 and want in out.splitlines(),
              f"the rank runs in the attaching process's cgroup ({want}): got "
              f"{[line for line in out.splitlines() if line.startswith('0::')]}")
        for _ in range(100):
            try:
                os.rmdir(cg)
                break
            except OSError:
                time.sleep(0.1)
    else:
        pytest.skip("no writable cgroup v2 hierarchy here: the cgroup join is covered by the unit test only")


def test_slow_clients(check, sb):
    """40 clients that connect and send half a header: another attach still runs at once, and SIGTERM (the
    epilog's stop) still stops the standby at once. (Last: it stops the standby.)"""
    held = slow_clients(sb, 40)
    code, out, err = attach(sb, sb.home, ["/bin/sh", "-c", "exit 7"], timeout=60)
    check(code == 7, f"40 slow clients do not hold up another attach (exit {code}, want 7)")
    for s in held:
        s.close()
    held = slow_clients(sb, 40)
    os.kill(sb.standby, signal.SIGTERM)

    deadline = time.time() + 30
    while time.time() < deadline and alive(sb.standby):
        time.sleep(0.05)
    gone = not alive(sb.standby)
    check(gone, "SIGTERM stops the standby at once despite 40 slow clients")
    for s in held:
        s.close()
    if not gone:
        os.kill(sb.standby, signal.SIGKILL)
    print(open(sb.log_file).read(), flush=True)
