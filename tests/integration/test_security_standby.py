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
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time

from ftrun_testlib import AGENT, SOURCE, check, finish, scratch

if os.getuid() != 0:
    print("SKIPPED: the standby test runs as root (it drops to a throwaway user)")
    sys.exit(77)

USER = "ftrun-sbtest"
try:
    pw = pwd.getpwnam(USER)
except KeyError:
    made = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", USER])
    if made.returncode != 0:
        print(f"SKIPPED: cannot create the throwaway user {USER} (useradd exit {made.returncode})")
        sys.exit(77)
    pw = pwd.getpwnam(USER)
UID, GID = pw.pw_uid, pw.pw_gid
# The agent runs as that user: it must be able to reach the build tree.
probe = subprocess.run([AGENT, "--help"], user=UID, group=GID, extra_groups=[], capture_output=True)
if probe.returncode != 0:
    print(f"SKIPPED: {USER} cannot run {AGENT} (a build tree other users cannot enter?): {probe.stderr[-300:]}")
    sys.exit(77)

MAGIC = 0x46545231
ATTACH, ATTACH_FD, ATTACH_EXIT, ATTACH_REFUSED = 64, 65, 67, 68

tmp = scratch("ftrun-sb-")
os.chmod(tmp, 0o755)  # root's, others may pass
home = os.path.join(tmp, "home")  # the user's own, 0700
os.mkdir(home, 0o700)
os.chown(home, UID, GID)
secret = os.path.join(tmp, "secret")  # root's, 0700
os.mkdir(secret, 0o700)
os.mkdir(os.path.join(secret, "inner"), 0o755)
config = os.path.join(home, "ftrun.yaml")
with open(config, "w") as f:
    f.write(f"agent:\n  run_dir: {home}/run\nstore:\n  memory_budget: 64MiB\n  prefault: false\n")
os.chown(config, UID, GID)

slurm_job = str(random.randrange(10**6, 10**7))
standby_dir = os.path.join(tmp, "standby")
env = dict(os.environ, SLURM_JOB_ID=slurm_job, SLURM_JOB_UID=str(UID), SLURM_JOB_GID=str(GID),
           FTRUN_SLURM_CONF="/nonexistent", FTRUN_AGENT=AGENT, FTRUN_STANDBY_DIR=standby_dir)
sock_path = f"{standby_dir}/slurm-{slurm_job}.sock"
log_file = f"{standby_dir}/slurm-{slurm_job}.log"
p = subprocess.run(["bash", os.path.join(SOURCE, "integration", "slurm", "prolog.sh")], env=env,
                   capture_output=True, text=True, start_new_session=True, timeout=60)
print(p.stdout, p.stderr, flush=True)
if not check(p.returncode == 0 and os.path.exists(sock_path), "the prolog starts the standby"):
    finish()
standby = int(open(f"{standby_dir}/slurm-{slurm_job}.pid").read())


def frame(kind, payload):
    return struct.pack("<IHHI", MAGIC, kind, 0, len(payload)) + payload


def string(s):
    b = s.encode()
    return struct.pack("<I", len(b)) + b


def attach_payload(argv, environ, cwd):
    out = struct.pack("<I", len(argv)) + b"".join(string(a) for a in argv)
    out += struct.pack("<I", len(environ)) + b"".join(string(e) for e in environ)
    return out + string(cwd)


def attach(cwd, command, as_user=True, cgroup=None, timeout=60):
    """Attaches like ftrun-agent under srun would; returns (code, stdout, stderr).
    code: the agent's exit code, "refused: ..." or "timeout"."""
    n = random.randrange(1 << 30)
    argv = ["ftrun-agent", "--config", config, "--nproc", "1", "--job-id", f"sb-{n}", "--status-file",
            f"{home}/status-{n}.json", "--no_python", "--no_local_rank", "--", *command]
    out_path, err_path = os.path.join(tmp, f"out-{n}"), os.path.join(tmp, f"err-{n}")
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
                os.setgid(GID)
                os.setuid(UID)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(sock_path)
            body = attach_payload(argv, ["PATH=/usr/bin:/bin", f"HOME={home}"], cwd)
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


SHOW = ["/bin/sh", "-c", "pwd; id -u; cat /proc/self/cgroup"]

# --- a directory only the user can enter -----------------------------------
code, out, err = attach(home, SHOW)
check(code == 0, f"attach from the user's own 0700 directory: the agent runs (exit {code})")
lines = out.splitlines()
check(home in lines and str(UID) in lines, "the rank runs in that directory, as the job's user")

# --- a directory only root can enter, and one that does not exist ---------
inner, missing = os.path.join(secret, "inner"), os.path.join(secret, "missing")
code_in, out_in, err_in = attach(inner, SHOW)
code_mi, out_mi, err_mi = attach(missing, SHOW)
check(code_in != 0 and inner not in out_in.splitlines(),
      f"a directory the job's user cannot enter is refused (exit {code_in})")
check("cannot enter the working directory" in err_in and "Permission denied" in err_in,
      "the error says the directory cannot be entered: permission denied")
check(code_mi != 0, f"a path that does not exist is refused (exit {code_mi})")


def refusal(text, path):
    return [l.replace(path, "DIR") for l in text.splitlines() if "working directory" in l]


check(refusal(err_in, inner) == refusal(err_mi, missing) and refusal(err_in, inner) != [],
      f"the same error whether the path exists or not: {refusal(err_in, inner)} vs {refusal(err_mi, missing)}")
check("No such file" not in err_mi, "the error does not tell that the path is missing")

# --- the attacher's cgroup -------------------------------------------------
root = None
for cand in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
    try:
        if os.path.exists(os.path.join(cand, "cgroup.procs")) and \
                subprocess.run(["stat", "-f", "-c", "%T", cand], capture_output=True, text=True).stdout.strip() == "cgroup2fs":
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
    code, out, err = attach(home, SHOW, cgroup=cg)
    want = "0::/" + os.path.basename(cg)
    check(code == 0 and want in out.splitlines(),
          f"the rank runs in the attaching process's cgroup ({want}): got {[l for l in out.splitlines() if l.startswith('0::')]}")
    for _ in range(100):
        try:
            os.rmdir(cg)
            break
        except OSError:
            time.sleep(0.1)
else:
    print("NOTE: no writable cgroup v2 hierarchy here: the cgroup join is covered by the unit test only", flush=True)

# --- slow clients delay neither another attach nor the stop ---------------
def slow_clients(n):
    held = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(sock_path)
        s.send(b"FTR")  # a quarter of a header, then nothing
        held.append(s)
    return held


held = slow_clients(40)
code, out, err = attach(home, ["/bin/sh", "-c", "exit 7"], timeout=60)
check(code == 7, f"40 slow clients do not hold up another attach (exit {code}, want 7)")
for s in held:
    s.close()
held = slow_clients(40)
os.kill(standby, signal.SIGTERM)


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1].split()[0] != "Z"
    except OSError:
        return False


deadline = time.time() + 30
while time.time() < deadline and alive(standby):
    time.sleep(0.05)
gone = not alive(standby)
check(gone, "SIGTERM stops the standby at once despite 40 slow clients")
for s in held:
    s.close()
if not gone:
    os.kill(standby, signal.SIGKILL)
print(open(log_file).read(), flush=True)
shutil.rmtree(tmp, ignore_errors=True)
finish()
