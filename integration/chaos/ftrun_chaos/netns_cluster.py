"""A small cluster of Linux network namespaces on one machine, for multi-node tests.

    with NetnsCluster(3) as c:
        subprocess.Popen(c.exec_prefix(1) + ["env", "UCX_TLS=tcp,self",
                         "UCX_NET_DEVICES=" + c.device(1), AGENT, ...])
        c.partition(1)            # silent: link up, every packet dropped
        c.heal(1)

Layout (root namespace on the left, X = subnet octet, 200..250):

    bridge {prefix}br 10.X.0.1/24 --+-- {prefix}h0 <veth> veth0 10.X.0.2/24  (netns {prefix}0)
                                    +-- {prefix}h1 <veth> veth1 10.X.0.3/24  (netns {prefix}1)
                                    ...

Only the bridge, the host veth ends and the namespaces are created; eth0, the
default route and the root namespace's firewall are never touched. Fault rules
(drop / partition) are nftables tables inside the node namespaces, so they go
away with the namespace.

Teardown always happens: on __exit__, at interpreter exit (atexit) and on
SIGTERM/SIGINT/SIGHUP while a cluster lives (the signal is re-delivered after
cleanup, so the process still dies of it). A SIGKILLed creator leaves its
namespaces behind; cleanup_stale() removes those of dead creators, identified by
the bridge alias "ftrun-netns pid:<pid> start:<starttime> nodes:<n>" and by a
state file under /run/ftrun-netns/.

Stdlib only; needs root, iproute2 (ip), nftables (nft) and ping (for the
setup check). Run the tests with /usr/bin/python3.
"""
import atexit
import fcntl
import fnmatch
import ipaddress
import json
import os
import random
import re
import shutil
import signal
import string
import subprocess
import threading
import time

__all__ = ["NetnsCluster", "NetnsError", "available", "cleanup_stale", "IP", "NFT", "PING"]

STATE_DIR = "/run/ftrun-netns"
ALIAS_TAG = "ftrun-netns"
NFT_TABLE = "ftrun_fault"
OCTET_RANGE = range(200, 251)
IFNAMSIZ = 15  # longest interface name the kernel accepts


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


# ---------------------------------------------------------------- live clusters, exit paths

_live = []  # clusters not yet torn down, oldest first
_live_lock = threading.RLock()
_prev_handlers = {}
_atexit_done = False
_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _teardown_all():
    with _live_lock:
        clusters = list(reversed(_live))
    for c in clusters:
        try:
            c.teardown()
        except Exception as e:  # keep going: the others must still go
            print("netns_cluster: teardown of %s failed: %s" % (c.prefix, e), flush=True)


def _on_signal(signum, frame):
    prev = _prev_handlers.get(signum, signal.SIG_DFL)  # before teardown restores the handlers
    _teardown_all()
    _restore_handlers()
    if callable(prev):
        prev(signum, frame)  # e.g. default_int_handler raises KeyboardInterrupt
    elif prev != signal.SIG_IGN:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)  # die of the signal, as without us


def _install_handlers():
    global _atexit_done
    if not _atexit_done:
        atexit.register(_teardown_all)
        _atexit_done = True
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread; atexit still covers exit
    for s in _SIGNALS:
        if s in _prev_handlers:
            continue
        prev = signal.getsignal(s)
        if prev == signal.SIG_IGN or prev is None:
            continue  # ignored signals stay ignored (e.g. SIGHUP under nohup)
        _prev_handlers[s] = prev
        signal.signal(s, _on_signal)


def _restore_handlers():
    if threading.current_thread() is not threading.main_thread():
        return
    for s, prev in list(_prev_handlers.items()):
        if signal.getsignal(s) is _on_signal:
            signal.signal(s, prev)
        del _prev_handlers[s]


class _Lock:
    """Serialises subnet/prefix choice between parallel test processes."""

    def __enter__(self):
        os.makedirs(STATE_DIR, exist_ok=True)
        self.fd = os.open(os.path.join(STATE_DIR, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def _used_octets():
    """Second octets X for which 10.X.0.0/16 overlaps an address or a non-default route here."""
    used = set()
    nets = []
    for argv in ((IP, "-j", "-4", "addr", "show"), (IP, "-j", "-4", "route", "show", "table", "all")):
        p = _run(list(argv), check=False)
        try:
            data = json.loads(p.stdout) if p.stdout.strip() else []
        except ValueError:
            data = []
        for e in data:
            for a in e.get("addr_info", []):
                if a.get("local"):
                    nets.append("%s/%s" % (a["local"], a.get("prefixlen", 32)))
            dst = e.get("dst")
            if dst and dst != "default":
                nets.append(dst if "/" in dst else dst + "/32")
    for n in nets:
        try:
            net = ipaddress.ip_network(n, strict=False)
        except ValueError:
            continue
        if net.prefixlen < 16:
            continue  # e.g. 10.0.0.0/8 on eth0: our /24 is more specific and wins locally
        for x in OCTET_RANGE:
            if net.overlaps(ipaddress.ip_network("10.%d.0.0/16" % x)):
                used.add(x)
    for st in _read_states():
        if isinstance(st.get("octet"), int):
            used.add(st["octet"])
    return used


def _read_states():
    out = []
    try:
        names = os.listdir(STATE_DIR)
    except FileNotFoundError:
        return out
    for n in names:
        if n.endswith(".json"):
            try:
                with open(os.path.join(STATE_DIR, n)) as f:
                    st = json.load(f)
                st["_file"] = os.path.join(STATE_DIR, n)
                out.append(st)
            except (OSError, ValueError):
                pass
    return out


def _default_prefix():
    alphabet = string.ascii_lowercase + string.digits
    tag = ""
    pid = os.getpid()
    for _ in range(3):  # 3 base-36 digits of the pid, then 2 random characters
        tag += alphabet[pid % 36]
        pid //= 36
    return "ftr" + tag + "".join(random.choice(string.ascii_lowercase) for _ in range(2))


# ---------------------------------------------------------------- the cluster

class NetnsCluster:
    """`nodes` network namespaces behind one bridge in the root namespace."""

    def __init__(self, nodes, prefix=None, subnet_octet=None, mtu=None, check=True):
        ok, why = available()
        if not ok:
            raise NetnsError("network namespaces unavailable: " + why)
        if not 1 <= nodes <= 250:
            raise ValueError("nodes must be in 1..250")
        self.nodes = nodes
        self.mtu = mtu
        self._drop = [0] * nodes
        self._part = [False] * nodes
        self._torn_down = False
        self._state_file = None
        self._owner = os.getpid()
        if prefix is not None:
            cleanup_stale(prefix)  # a crashed earlier run with the same fixed prefix
        with _Lock():
            self.prefix = self._choose_prefix(prefix)
            self.octet = self._choose_octet(subnet_octet)
            self.bridge = self.prefix + "br"
            self._state_file = os.path.join(STATE_DIR, self.prefix + ".json")
            with open(self._state_file, "w") as f:
                json.dump({"prefix": self.prefix, "nodes": nodes, "octet": self.octet,
                           "pid": os.getpid(), "start": _proc_start(os.getpid()),
                           "bridge": self.bridge,
                           "netns": [self.netns(i) for i in range(nodes)],
                           "host_veths": [self.host_veth(i) for i in range(nodes)]}, f)
            with _live_lock:
                _live.append(self)
            _install_handlers()
            try:
                self._create_bridge()  # under the lock: its address claims the subnet
            except BaseException:
                self.teardown()
                raise
        try:
            for i in range(nodes):
                self._create_node(i)
            if check:
                self.check_connectivity()
        except BaseException:
            self.teardown()
            raise

    # -- names and addresses
    def addr(self, i):
        self._idx(i)
        return "10.%d.0.%d" % (self.octet, i + 2)

    @property
    def root_addr(self):
        return "10.%d.0.1" % self.octet

    @property
    def subnet(self):
        return "10.%d.0.0/24" % self.octet

    def netns(self, i):
        self._idx(i)
        return "%s%d" % (self.prefix, i)

    def device(self, i):
        self._idx(i)
        return "veth%d" % i

    def host_veth(self, i):
        """The root-namespace end of node i's veth pair (a bridge port)."""
        self._idx(i)
        return "%sh%d" % (self.prefix, i)

    def exec_prefix(self, i):
        return [IP, "netns", "exec", self.netns(i)]

    @property
    def exec_prefix_template(self):
        return "%s netns exec %s{node}" % (IP, self.prefix)

    def _idx(self, i):
        if not 0 <= i < self.nodes:
            raise IndexError("node %r out of range 0..%d" % (i, self.nodes - 1))

    # -- setup
    def _choose_prefix(self, prefix):
        taken = set(_netns_list()) | {l.get("ifname") for l in _links_json()}
        states = {os.path.basename(s["_file"])[:-5] for s in _read_states()}
        longest = IFNAMSIZ - 1 - len(str(self.nodes - 1))  # "{prefix}h{i}"
        if prefix is None:
            for _ in range(100):
                prefix = _default_prefix()
                if prefix not in states and not self._names_taken(prefix, taken):
                    return prefix
            raise NetnsError("could not find a free cluster prefix")
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", prefix):
            raise ValueError("prefix must be letters, digits and '_', starting with a letter: %r" % prefix)
        if len(prefix) > longest:
            raise ValueError("prefix %r too long: at most %d characters for %d nodes "
                             "(interface names are limited to %d)" % (prefix, longest, self.nodes, IFNAMSIZ))
        if prefix in states or self._names_taken(prefix, taken):
            raise NetnsError("prefix %r is in use (namespace, link or state file %s/%s.json exists); "
                             "cleanup_stale(%r) removes leftovers of dead runs" % (prefix, STATE_DIR, prefix, prefix))
        return prefix

    def _names_taken(self, prefix, taken):
        names = {prefix + "br"} | {"%s%d" % (prefix, i) for i in range(self.nodes)} | \
                {"%sh%d" % (prefix, i) for i in range(self.nodes)}
        return bool(names & taken)

    def _choose_octet(self, octet):
        used = _used_octets()
        if octet is not None:
            if not 0 < octet < 256:
                raise ValueError("subnet_octet must be in 1..255")
            if octet in used:
                raise NetnsError("10.%d.0.0/16 is already in use on this machine" % octet)
            return octet
        free = [x for x in OCTET_RANGE if x not in used]
        if not free:
            raise NetnsError("no free subnet 10.X.0.0/24 with X in 200..250")
        return random.choice(free)

    def _create_bridge(self):
        br = self.bridge
        _ip("link", "add", br, "type", "bridge", "stp_state", "0", "forward_delay", "0")
        _ip("link", "set", "dev", br, "alias", "%s pid:%d start:%s nodes:%d octet:%d" % (
            ALIAS_TAG, os.getpid(), _proc_start(os.getpid()), self.nodes, self.octet))
        # Bridged traffic must not go through the root namespace's iptables (br_netfilter).
        _ip("link", "set", "dev", br, "type", "bridge", "nf_call_iptables", "0", "nf_call_ip6tables", "0",
            "nf_call_arptables", "0", check=False)
        _ip("link", "set", "dev", br, "addrgenmode", "none", check=False)
        _ip("addr", "add", self.root_addr + "/24", "dev", br)
        _ip("link", "set", "dev", br, "up")

    def _create_node(self, i):
        ns, host, dev = self.netns(i), self.host_veth(i), self.device(i)
        _ip("netns", "add", ns)
        _ip("link", "add", host, "type", "veth", "peer", "name", dev, "netns", ns)
        _ip("link", "set", "dev", host, "addrgenmode", "none", check=False)
        if self.mtu:
            _ip("link", "set", "dev", host, "mtu", str(self.mtu))
            _ip("-n", ns, "link", "set", "dev", dev, "mtu", str(self.mtu))
        _ip("link", "set", "dev", host, "master", self.bridge)
        _ip("link", "set", "dev", host, "up")
        _ip("-n", ns, "link", "set", "dev", "lo", "up")
        _ip("-n", ns, "addr", "add", self.addr(i) + "/24", "dev", dev)
        _ip("-n", ns, "link", "set", "dev", dev, "up")

    def _ping_argv(self, src, dst, count=1, wait=1):
        """ping from node src (None: root namespace) to address dst."""
        pre = [] if src is None else self.exec_prefix(src)
        return pre + [PING, "-n", "-q", "-c", str(count), "-W", str(wait), dst]

    def ping(self, src, dst_node=None, dst_addr=None, wait=1):
        """True when one ping from src (node index or None for root) reaches dst."""
        dst = dst_addr or (self.root_addr if dst_node is None else self.addr(dst_node))
        return subprocess.run(self._ping_argv(src, dst, 1, wait), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL).returncode == 0

    def check_connectivity(self, timeout=5.0):
        """Pings root -> every node and node i -> node i+1 (and node 0 -> root for one node); raises if any fails."""
        pairs = [(None, i) for i in range(self.nodes)]
        if self.nodes > 1:
            pairs += [(i, (i + 1) % self.nodes) for i in range(self.nodes)]
        else:
            pairs.append((0, None))
        deadline = time.time() + timeout
        while True:
            procs = [(s, d, subprocess.Popen(self._ping_argv(s, self.root_addr if d is None else self.addr(d)),
                                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
                     for s, d in pairs]
            failed = []
            for s, d, p in procs:
                out = p.communicate()[0]
                if p.returncode != 0:
                    failed.append((s, d, out.strip().splitlines()[-1:] or [""]))
            if not failed:
                return
            if time.time() >= deadline:
                def name(n):
                    return "root %s" % self.root_addr if n is None else "node %d %s" % (n, self.addr(n))
                raise NetnsError(
                    "netns cluster %s: connectivity check failed: %s. The root namespace's firewall "
                    "(INPUT on %s, or br_netfilter with a FORWARD drop policy) may block the bridge." % (
                        self.prefix, "; ".join("%s -> %s (%s)" % (name(s), name(d), m[0]) for s, d, m in failed),
                        self.bridge))
            pairs = [(s, d) for s, d, _ in failed]

    # -- faults
    def link_down(self, i):
        """Takes node i's veth down at both ends: it can reach nobody, not even the root namespace."""
        _ip("-n", self.netns(i), "link", "set", "dev", self.device(i), "down")
        _ip("link", "set", "dev", self.host_veth(i), "down")

    def link_up(self, i, timeout=5.0):
        """Brings both ends back up and waits until the node's end reports carrier."""
        _ip("link", "set", "dev", self.host_veth(i), "up")
        _ip("-n", self.netns(i), "link", "set", "dev", self.device(i), "up")
        deadline = time.time() + timeout
        while time.time() < deadline:
            p = _ip("-n", self.netns(i), "-j", "link", "show", "dev", self.device(i), check=False)
            try:
                if json.loads(p.stdout)[0].get("operstate") == "UP":
                    return
            except (ValueError, IndexError):
                pass
            time.sleep(0.01)
        raise NetnsError("link of node %d did not come up in %.0f s" % (i, timeout))

    def drop(self, i, percent):
        """Drops `percent`% of node i's packets, in and out (nftables in its namespace); 0 removes the rule."""
        if not 0 <= percent <= 100:
            raise ValueError("percent must be in 0..100")
        self._drop[i] = int(round(percent))
        self._apply_nft(i)

    def partition(self, i):
        """Silent partition: the link stays up, every packet of node i is dropped (except on its lo)."""
        self._part[i] = True
        self._apply_nft(i)

    def heal(self, i):
        """Ends partition(i); a drop(i, N) rule set before stays."""
        self._part[i] = False
        self._apply_nft(i)

    def _apply_nft(self, i):
        rules = []
        if self._part[i]:
            rules.append('counter drop comment "partition"')
        elif self._drop[i] >= 100:
            rules.append('counter drop comment "drop 100"')
        elif self._drop[i] > 0:
            rules.append('numgen random mod 100 < %d counter drop comment "drop %d"' % (self._drop[i], self._drop[i]))
        # "table X {}" first makes the delete valid when the table does not exist; the whole file is atomic.
        script = "table inet %s {}\ndelete table inet %s\n" % (NFT_TABLE, NFT_TABLE)
        if rules:
            body = "".join("\t\t%s\n" % r for r in rules)
            script += ("table inet %s {\n"
                       "\tchain in {\n\t\ttype filter hook prerouting priority -300; policy accept;\n"
                       "\t\tiif \"lo\" accept\n%s\t}\n"
                       "\tchain out {\n\t\ttype filter hook output priority -300; policy accept;\n"
                       "\t\toif \"lo\" accept\n%s\t}\n}\n") % (NFT_TABLE, body, body)
        _run(self.exec_prefix(i) + [NFT, "-f", "-"], input=script)

    def nft_rules(self, i):
        """The fault table of node i as `nft list` prints it ('' when none)."""
        p = _run(self.exec_prefix(i) + [NFT, "list", "table", "inet", NFT_TABLE], check=False)
        return p.stdout if p.returncode == 0 else ""

    # -- processes
    def pids(self, i):
        """Pids of the processes running inside node i's namespace."""
        return _netns_pids(self.netns(i))

    def kill_node_processes(self, i, sig=signal.SIGKILL, timeout=5.0):
        """Sends `sig` to every process in node i's namespace; with SIGKILL waits until they are gone.
        Returns the pids signalled."""
        return _kill_netns(self.netns(i), sig, timeout)

    # -- teardown
    def teardown(self):
        """Kills the namespaces' processes and deletes namespaces, veths and bridge. Idempotent."""
        if os.getpid() != self._owner:
            return  # a forked child must not tear down its parent's cluster
        errors = []
        for i in range(self.nodes):
            ns = self.netns(i)
            if _netns_exists(ns):
                try:
                    _kill_netns(ns, signal.SIGKILL, 5.0)
                except Exception as e:
                    errors.append(str(e))
                p = _ip("netns", "del", ns, check=False)
                if p.returncode != 0 and _netns_exists(ns):
                    errors.append(p.stderr.strip())
            host = self.host_veth(i)
            if _link_exists(host):  # normally gone with its peer
                _ip("link", "del", "dev", host, check=False)
        if _link_exists(self.bridge):
            p = _ip("link", "del", "dev", self.bridge, check=False)
            if p.returncode != 0 and _link_exists(self.bridge):
                errors.append(p.stderr.strip())
        if self._state_file and not errors:
            try:
                os.unlink(self._state_file)
            except FileNotFoundError:
                pass
        if not self._torn_down:
            self._torn_down = True
            with _live_lock:
                if self in _live:
                    _live.remove(self)
                if not _live:
                    _restore_handlers()
        if errors:
            raise NetnsError("teardown of %s incomplete: %s" % (self.prefix, "; ".join(errors)))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.teardown()
        return False

    def __repr__(self):
        return "NetnsCluster(%d nodes, prefix=%r, subnet=%s)" % (self.nodes, self.prefix, self.subnet)


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


# ---------------------------------------------------------------- leftovers of crashed runs

_ALIAS_RE = re.compile(ALIAS_TAG + r" pid:(\d+) start:(\d+|None)(?: nodes:(\d+))?")


def _prefix_matches(prefix, prefix_glob):
    if any(c in prefix_glob for c in "*?["):
        return fnmatch.fnmatchcase(prefix, prefix_glob)
    return prefix.startswith(prefix_glob)


def cleanup_stale(prefix_glob="ftr", verbose=False):
    """Removes clusters whose creating process is dead: those with a bridge whose alias names
    the creator, and those with a state file under /run/ftrun-netns. `prefix_glob` is a prefix
    ("ftr") or an fnmatch pattern over cluster prefixes ("ftrab*"). Returns the prefixes removed."""
    ok, _ = available()
    if not ok:
        return []
    stale = {}  # prefix -> dict(nodes=..., netns=[...], host_veths=[...], file=...)
    with _Lock():
        for l in _links_json("type", "bridge"):
            name, alias = l.get("ifname", ""), l.get("ifalias", "")
            m = _ALIAS_RE.match(alias or "")
            if not m or not name.endswith("br"):
                continue
            prefix = name[:-2]
            start = None if m.group(2) == "None" else int(m.group(2))
            if not _prefix_matches(prefix, prefix_glob) or _pid_alive(int(m.group(1)), start):
                continue
            stale.setdefault(prefix, {"netns": set(), "links": set(), "files": set()})["links"].add(name)
            # The node namespaces are {prefix}<digits>; the bridge ports tell the host veths.
            for ns in _netns_list():
                if re.fullmatch(re.escape(prefix) + r"\d+", ns):
                    stale[prefix]["netns"].add(ns)
            for port in _links_json("master", name):
                stale[prefix]["links"].add(port.get("ifname"))
        for st in _read_states():
            prefix = st.get("prefix", "")
            if not _prefix_matches(prefix, prefix_glob) or _pid_alive(int(st.get("pid", 0)), st.get("start")):
                continue
            e = stale.setdefault(prefix, {"netns": set(), "links": set(), "files": set()})
            e["netns"].update(st.get("netns", []))
            e["links"].update(st.get("host_veths", []))
            e["links"].add(st.get("bridge", prefix + "br"))
            e["files"].add(st["_file"])
        for ns in _netns_list():  # an available() probe killed half-way
            m = re.fullmatch(r"ftrprobe(\d+)", ns)
            if m and _prefix_matches(ns, prefix_glob) and not _pid_alive(int(m.group(1))):
                _ip("netns", "del", ns, check=False)
        for prefix, e in stale.items():
            for ns in sorted(e["netns"]):
                if _netns_exists(ns):
                    try:
                        _kill_netns(ns, signal.SIGKILL, 5.0)
                    except NetnsError:
                        pass
                    _ip("netns", "del", ns, check=False)
            for link in sorted(e["links"], key=lambda n: n.endswith("br")):  # ports first, bridge last
                if link and _link_exists(link):
                    _ip("link", "del", "dev", link, check=False)
            for f in e["files"]:
                try:
                    os.unlink(f)
                except FileNotFoundError:
                    pass
            if verbose:
                print("netns_cluster: removed stale cluster %s" % prefix, flush=True)
    return sorted(stale)


def leftovers(prefix):
    """Namespaces and links of cluster `prefix` that still exist (for tests)."""
    ns = [n for n in _netns_list() if re.fullmatch(re.escape(prefix) + r"\d+", n)]
    links = [l.get("ifname") for l in _links_json() if (l.get("ifname") or "").startswith(prefix)]
    state = os.path.join(STATE_DIR, prefix + ".json")
    return ns + links + ([state] if os.path.exists(state) else [])


if __name__ == "__main__":
    import sys
    ok, why = available()
    if not ok:
        print("SKIPPED:", why)
        sys.exit(0)
    if sys.argv[1:2] == ["cleanup"]:
        print("removed:", cleanup_stale(*(sys.argv[2:3] or ["ftr"]), verbose=True))
    else:
        with NetnsCluster(int(sys.argv[1]) if len(sys.argv) > 1 else 2) as c:
            print(c, [c.addr(i) for i in range(c.nodes)], "root", c.root_addr)
