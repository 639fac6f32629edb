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
setup check). Run the tests with the project's .venv/bin/python.

The parts: netns_host (the ip/nft/ping commands, available()), netns_claims
(a free prefix and subnet, the state files), netns_exit (teardown at exit and
on signals), netns_stale (cleanup_stale, leftovers). This module is also
imported as the top-level `netns_cluster`, with this directory on sys.path
(tests, `python3 netns_cluster.py`): then its parts are top-level modules too.
"""
import json
import os
import signal
import subprocess
import time

if __package__:
    from .netns_claims import ALIAS_TAG, STATE_DIR, _choose_octet, _choose_prefix, _Lock
    from .netns_exit import _install_handlers, _live, _live_lock, _restore_handlers
    from .netns_host import (IP, NFT, PING, NetnsError, _ip, _kill_netns, _link_exists, _netns_exists,
                             _netns_pids, _proc_start, _run, available)
    from .netns_stale import cleanup_stale, leftovers  # noqa: F401  (leftovers: the tests, as nc.leftovers)
else:  # imported as the top-level module netns_cluster: its parts are top-level modules too
    from netns_claims import ALIAS_TAG, STATE_DIR, _choose_octet, _choose_prefix, _Lock
    from netns_exit import _install_handlers, _live, _live_lock, _restore_handlers
    from netns_host import (IP, NFT, PING, NetnsError, _ip, _kill_netns, _link_exists, _netns_exists,
                            _netns_pids, _proc_start, _run, available)
    from netns_stale import cleanup_stale, leftovers  # noqa: F401

__all__ = ["NetnsCluster", "NetnsError", "available", "cleanup_stale", "IP", "NFT", "PING"]

NFT_TABLE = "ftrun_fault"


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
            self.prefix = _choose_prefix(nodes, prefix)
            self.octet = _choose_octet(subnet_octet)
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
