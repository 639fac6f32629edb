"""The host side of the netns clusters: the ip, nft and ping commands, what
they say about this machine (namespaces, links, whether namespaces can be
built here at all: available()), processes and their start times, and
killing what runs inside a namespace. Stdlib only."""
import json
import os
import shutil
import signal
import subprocess
import time


class NetnsError(RuntimeError):
    pass


def _tool(name):
    """The command to run `name`: the bare name when PATH finds it, else its absolute path."""
    if shutil.which(name):
        return name
    for d in ("/usr/sbin", "/sbin", "/usr/bin", "/bin"):
        p = os.path.join(d, name)
        if os.access(p, os.X_OK):
            return p
    return name


IP = _tool("ip")
NFT = _tool("nft")
PING = _tool("ping")


def _run(argv, check=True, input=None, timeout=30):
    p = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise NetnsError("command failed (rc %d): %s\n%s" % (p.returncode, " ".join(argv),
                                                              (p.stderr or p.stdout).strip()))
    return p


def _ip(*args, check=True):
    return _run([IP, *args], check=check)


def _link_exists(name, netns=None):
    argv = [IP] + (["-n", netns] if netns else []) + ["link", "show", "dev", name]
    return subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0


def _netns_exists(name):
    return os.path.exists(os.path.join("/run/netns", name))


def _netns_list():
    try:
        return sorted(os.listdir("/run/netns"))
    except FileNotFoundError:
        return []


def _links_json(*args):
    p = _ip("-j", "-d", "link", "show", *args, check=False)
    try:
        return json.loads(p.stdout) if p.returncode == 0 and p.stdout.strip() else []
    except ValueError:
        return []


def _proc_start(pid):
    """Start time of pid in clock ticks since boot (guards against pid reuse), or None."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            s = f.read()
        return int(s[s.rindex(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _pid_alive(pid, start=None):
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if start is not None:
        now = _proc_start(pid)
        if now is not None and now != start:
            return False  # the pid was reused by another process
    return True


_available = None


def available():
    """(True, "") when namespaces can be built here, else (False, reason)."""
    global _available
    if _available is not None:
        return _available
    _available = _probe()
    return _available


def _probe():
    if os.name != "posix" or not os.path.isdir("/proc"):
        return False, "not Linux"
    if os.geteuid() != 0:
        return False, "not running as root (network namespaces need CAP_NET_ADMIN)"
    for tool, pkg in ((IP, "iproute2"), (NFT, "nftables"), (PING, "iputils-ping")):
        if not shutil.which(tool) and not os.access(tool, os.X_OK):
            return False, "%s not found (install %s; scripts/install-deps.sh)" % (os.path.basename(tool), pkg)
    name = "ftrprobe%d" % os.getpid()
    try:
        p = _ip("netns", "add", name, check=False)
        if p.returncode != 0:
            return False, "`ip netns add` failed: %s" % (p.stderr.strip() or "rc %d" % p.returncode)
        p = _ip("-n", name, "link", "add", "pv0", "type", "veth", "peer", "name", "pv1", check=False)
        if p.returncode != 0:
            return False, "cannot create a veth pair: %s" % p.stderr.strip()
        p = _run([IP, "netns", "exec", name, NFT, "list", "tables"], check=False)
        if p.returncode != 0:
            return False, "nft does not work inside a namespace: %s" % p.stderr.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return False, "probe failed: %s" % e
    finally:
        subprocess.run([IP, "netns", "del", name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return True, ""


def _netns_pids(ns):
    p = _ip("netns", "pids", ns, check=False)  # same as comparing /proc/PID/ns/net with the netns
    if p.returncode != 0:
        return []
    me = os.getpid()
    return [int(x) for x in p.stdout.split() if x.isdigit() and int(x) != me]


def _kill_netns(ns, sig, timeout):
    signalled = []
    deadline = time.time() + timeout
    while True:
        pids = _netns_pids(ns)
        if not pids:
            return signalled
        for pid in pids:
            try:
                os.kill(pid, sig)
                if pid not in signalled:
                    signalled.append(pid)
            except ProcessLookupError:
                pass
        if sig != signal.SIGKILL:
            return signalled
        if time.time() >= deadline:
            raise NetnsError("processes %s in namespace %s survived SIGKILL" % (pids, ns))
        time.sleep(0.01)
