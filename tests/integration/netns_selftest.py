"""Self-test of netns_cluster: builds real namespaces, breaks and heals links, kills
processes, and checks that nothing is left behind, also when the creator dies of
SIGTERM, SIGINT or SIGKILL (the last through cleanup_stale).

Not one of CTest's tests (its name does not start with test_): run it as root
with .venv/bin/python -m pytest tests/integration/netns_selftest.py (or run
the file itself); skipped where namespaces cannot be built.
"""
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from ftrun_chaos import netns_cluster as nc

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "integration", "chaos", "ftrun_chaos")


def pings(c, pairs, wait=1):
    """Runs one ping per (src, dst) pair in parallel; src/dst None is the root namespace.
    Returns {pair: reached}."""
    procs = {}
    for s, d in pairs:
        dst = c.root_addr if d is None else c.addr(d)
        procs[(s, d)] = subprocess.Popen(c._ping_argv(s, dst, 1, wait), stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL)
    return {k: p.wait() == 0 for k, p in procs.items()}


def reach_eventually(c, pairs, tries=3):
    """Pairs reachable within a few 1 s tries (a link just brought up may need ARP again)."""
    todo = list(pairs)
    for _ in range(tries):
        res = pings(c, todo)
        todo = [k for k, ok in res.items() if not ok]
        if not todo:
            return True
    print("  unreachable:", todo, flush=True)
    return False


def all_fail(c, pairs):
    res = pings(c, pairs)
    bad = [k for k, ok in res.items() if ok]
    if bad:
        print("  unexpectedly reachable:", bad, flush=True)
    return not bad


def operstate(ns, dev):
    p = subprocess.run([nc.IP, "-n", ns, "-o", "link", "show", "dev", dev], capture_output=True, text=True)
    m = re.search(r"state (\S+)", p.stdout)
    return m.group(1) if m else None


CHILD = r"""
import os, subprocess, sys, time
sys.path.insert(0, %(here)r)
import netns_cluster as nc
c = nc.NetnsCluster(2, prefix=%(prefix)r)
p = subprocess.Popen(c.exec_prefix(0) + ["sleep", "1000"], stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
while p.pid not in c.pids(0):
    time.sleep(0.01)
print("READY", p.pid, flush=True)
time.sleep(1000)
"""


def read_line(f, timeout):
    """One line from pipe f, or '' after `timeout` seconds or at EOF."""
    buf = b""
    deadline = time.time() + timeout
    while b"\n" not in buf:
        left = deadline - time.time()
        if left <= 0 or not select.select([f], [], [], left)[0]:
            break
        chunk = os.read(f.fileno(), 4096)
        if not chunk:
            break
        buf += chunk
    return buf.decode(errors="replace")


def child_dies(check, prefix, sig):
    """Starts a child that builds a cluster, sends it `sig`; returns (returncode, sleep pid)."""
    err = tempfile.TemporaryFile("w+")  # not a pipe: an orphan must not be able to block us
    p = subprocess.Popen([sys.executable, "-c", CHILD % {"here": HERE, "prefix": prefix}],
                         stdout=subprocess.PIPE, stderr=err)
    line = read_line(p.stdout, 20).split()
    if not check(line[:1] == ["READY"], "child with cluster %s got ready" % prefix):
        p.kill()
        p.wait()
        return None, None
    p.send_signal(sig)
    try:
        rc = p.wait(timeout=15)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = p.wait()
    err.seek(0)
    text = err.read()
    if sig != signal.SIGINT or "KeyboardInterrupt" not in text:  # SIGINT's traceback is expected
        sys.stderr.write(text)
    return rc, int(line[1])


def pid_gone(pid):
    for _ in range(200):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.01)
    return False


@pytest.fixture(scope="module", autouse=True)
def namespaces():
    ok, why = nc.available()
    if not ok:
        pytest.skip(why)
    removed = nc.cleanup_stale("ftr")
    if removed:
        print("removed stale clusters:", removed, flush=True)


def test_cluster(check):
    """Names, addresses, links down and up, partitions, packet loss, processes, and a teardown that leaves
    nothing behind (also on an exception)."""
    t0 = time.time()
    c = nc.NetnsCluster(3)
    print(c, "setup %.2f s" % (time.time() - t0), flush=True)
    with c:
        # names and addresses
        check(c.netns(1) == c.prefix + "1", "netns name")
        check(c.device(2) == "veth2", "device name")
        check(c.addr(0) == "10.%d.0.2" % c.octet and c.root_addr == "10.%d.0.1" % c.octet, "addresses")
        check(200 <= c.octet <= 250, "subnet octet in 200..250")
        check(c.exec_prefix(1)[-4:] == [nc.IP, "netns", "exec", c.netns(1)][-4:], "exec_prefix")
        check(c.exec_prefix_template.format(node=2).split() == c.exec_prefix(2), "exec_prefix_template")
        p = subprocess.run(c.exec_prefix(2) + [nc.IP, "-4", "-o", "addr", "show", "dev", "veth2"],
                           capture_output=True, text=True)
        check(c.addr(2) + "/24" in p.stdout, "veth2 inside ns 2 has %s: %s" % (c.addr(2), p.stdout.strip()))
        p = subprocess.run(c.exec_prefix(0) + [nc.IP, "-o", "link", "show"], capture_output=True, text=True)
        check(sorted(re.findall(r"^\d+: (\w+)", p.stdout, re.M)) == ["lo", "veth0"],
              "ns 0 holds only lo and veth0: %s" % p.stdout.strip())
        check(operstate(c.netns(0), "lo") in ("UNKNOWN", "UP"), "lo up in ns 0")

        everyone = [(None, i) for i in range(3)] + [(i, None) for i in range(3)] + \
                   [(i, j) for i in range(3) for j in range(3) if i != j]
        to1 = [(None, 1), (0, 1), (2, 1), (1, None), (1, 0)]
        check(reach_eventually(c, everyone, tries=1), "everyone reaches everyone")

        # link down / up
        t = time.time()
        c.link_down(1)
        check(operstate(c.netns(1), "veth1") == "DOWN", "veth1 down")
        check(all_fail(c, to1), "link_down(1): node 1 cut off from root and nodes")
        check(reach_eventually(c, [(0, 2), (None, 2), (2, None)], tries=1), "link_down(1): others unaffected")
        c.link_up(1)
        check(reach_eventually(c, to1), "link_up(1) restores node 1")
        print("link down/up %.2f s" % (time.time() - t), flush=True)

        # silent partition
        t = time.time()
        c.partition(1)
        check(operstate(c.netns(1), "veth1") == "UP", "partition keeps the link up")
        check("partition" in c.nft_rules(1), "partition rule present")
        check(all_fail(c, to1), "partition(1): node 1 cut off")
        check(c.ping(1, dst_addr="127.0.0.1"), "partition(1): node 1's lo still works")
        c.heal(1)
        check(c.nft_rules(1) == "", "heal(1) removes the table")
        check(reach_eventually(c, to1), "heal(1) restores node 1")
        print("partition/heal %.2f s" % (time.time() - t), flush=True)

        # packet loss
        t = time.time()
        c.drop(2, 100)
        check("drop" in c.nft_rules(2), "drop rule present")
        check(all_fail(c, [(None, 2), (0, 2), (2, 1)]), "drop(2, 100): node 2 unreachable")
        c.drop(2, 50)
        check("numgen random mod 100 < 50" in c.nft_rules(2), "drop(2, 50) rule: " + c.nft_rules(2))
        p = subprocess.run(c.exec_prefix(0) + [nc.PING, "-n", "-q", "-c", "200", "-i", "0.002", "-W", "1",
                                               c.addr(2)], capture_output=True, text=True)
        m = re.search(r"(\d+(?:\.\d+)?)% packet loss", p.stdout)
        loss = float(m.group(1)) if m else -1
        # 50% on the way in and 50% on the way out: ~75% of echoes lost
        check(55 <= loss <= 92, "drop(2, 50): %.0f%% of 200 pings lost (expected ~75%%)" % loss)
        c.drop(2, 0)
        check(c.nft_rules(2) == "", "drop(2, 0) removes the table")
        check(reach_eventually(c, [(None, 2), (0, 2), (2, 1)]), "drop(2, 0) restores node 2")
        c.drop(2, 30)
        c.partition(2)
        c.heal(2)
        check("< 30" in c.nft_rules(2), "heal keeps an earlier drop rule")
        c.drop(2, 0)
        print("drop %.2f s (loss at 50%%: %.0f%%)" % (time.time() - t, loss), flush=True)

        # processes
        sleeper = subprocess.Popen(c.exec_prefix(2) + ["sleep", "1000"])
        other = subprocess.Popen(c.exec_prefix(1) + ["sleep", "1000"])
        deadline = time.time() + 5
        while sleeper.pid not in c.pids(2) and time.time() < deadline:
            time.sleep(0.01)
        check(sleeper.pid in c.pids(2), "sleep runs in ns 2")
        killed = c.kill_node_processes(2)
        try:
            rc = sleeper.wait(timeout=5)
        except subprocess.TimeoutExpired:
            rc = None
        check(rc == -signal.SIGKILL, "kill_node_processes(2) SIGKILLed the sleep (rc %s, killed %s)" % (rc, killed))
        check(c.pids(2) == [], "ns 2 empty after kill_node_processes")
        check(other.poll() is None, "the sleep in ns 1 survives")

    # teardown (by __exit__): nothing left, also the sleep in ns 1 is dead
    check(nc.leftovers(c.prefix) == [], "nothing left after teardown: %s" % nc.leftovers(c.prefix))
    try:
        rc = other.wait(timeout=5)
    except subprocess.TimeoutExpired:
        rc = None
    check(rc == -signal.SIGKILL, "teardown killed the sleep in ns 1 (rc %s)" % rc)
    try:
        c.teardown()
        check(True, "")
    except Exception as e:
        check(False, "second teardown raised %s" % e)
    check(signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, "SIGTERM handler restored after teardown")

    # an exception inside the with block still tears down
    try:
        with nc.NetnsCluster(1) as c1:
            raise KeyError("boom")
    except KeyError:
        pass
    check(nc.leftovers(c1.prefix) == [], "teardown on exception: %s" % nc.leftovers(c1.prefix))


def test_creator_dies(check):
    """The creator dies of SIGTERM or SIGINT: its handlers tear down, then it dies of the signal; SIGKILLed:
    the leftovers stay, and cleanup_stale removes them (not a live cluster's)."""
    # the creator dies of SIGTERM / SIGINT: its handlers tear down, then it dies of the signal
    t = time.time()
    tag = "%04x" % (os.getpid() % 0x10000)
    for sig, want in ((signal.SIGTERM, (-signal.SIGTERM,)), (signal.SIGINT, (-signal.SIGINT, 1))):
        prefix = "ftrst%s%s" % (tag, "t" if sig == signal.SIGTERM else "i")
        rc, spid = child_dies(check, prefix, sig)
        check(rc in want, "child died of %s (rc %s)" % (sig.name, rc))
        check(nc.leftovers(prefix) == [], "%s: nothing left of %s: %s" % (sig.name, prefix, nc.leftovers(prefix)))
        check(spid is not None and pid_gone(spid), "%s: the child's sleep in its namespace is dead" % sig.name)

    # the creator is SIGKILLed: leftovers stay, cleanup_stale removes them, not a live cluster's
    prefix = "ftrst%sk" % tag
    with nc.NetnsCluster(1, prefix="ftrst%sl" % tag) as live:
        rc, spid = child_dies(check, prefix, signal.SIGKILL)
        check(rc == -signal.SIGKILL, "child SIGKILLed (rc %s)" % rc)
        check(os.path.exists("/run/netns/%s0" % prefix), "SIGKILL leaves the namespace behind")
        removed = nc.cleanup_stale("ftrst" + tag)
        check(prefix in removed, "cleanup_stale removed %s (removed %s)" % (prefix, removed))
        check(live.prefix not in removed and os.path.exists("/run/netns/%s0" % live.prefix),
              "cleanup_stale leaves the live cluster alone")
        check(nc.leftovers(prefix) == [], "nothing left of %s: %s" % (prefix, nc.leftovers(prefix)))
        check(spid is not None and pid_gone(spid), "cleanup_stale killed the orphaned sleep")
    print("signal/stale tests %.2f s" % (time.time() - t), flush=True)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
