"""ftrun-netdelay: packet delay and loss for a network namespace through
NFQUEUE (for kernels without netem), on a real 2-node NetnsCluster.

Checks: bad arguments exit 2 naming the option; a second program on a bound
queue exits 1 naming the bind and the owner; with --delay-ms D in node 1 the RTT
node 0 -> node 1 is at least D (each ping crosses node 1's queue twice, in
and out, so it grows by about 2 D; only lower bounds on time are asserted);
its loopback traffic is not queued (the tool's counters);
jitter keeps the lower bound 2 (D - J); a TCP transfer of a few MiB through
the delayed link arrives intact, also when the tool gets SIGTERM in the
middle of it (every held packet let go, none dropped); --loss-percent 100 cuts node 1 off, 50
loses some pings, 0 none; SIGTERM exits 0 with counters and removes the
rules (SIGINT too); SIGKILL leaves the rules but traffic flows (bypass), the leftover
tables delete with `nft delete table`, and a new instance replaces them. The
rules come from --install-rules (nf_tables netlink, the native queue
expression or the xtables NFQUEUE target); where this kernel's nft has the
native `queue` expression, the documented `nft -f` rule text is tested too.

Run as root with the project's .venv/bin/python; skipped where
namespaces cannot be built or ftrun-netdelay was not built.
"""
import os
import re
import select
import signal
import subprocess
import sys
import time

import pytest

from ftrun_chaos import netns_cluster as nc
from ftrun_testlib import BUILD

TOOL = os.path.join(BUILD, "ftrun-netdelay")
TABLE = "ftrun_delay"
QUEUE = 7
D = 50  # ms

# The rule text documented at the top of integration/chaos/netdelay/main.cc, for
# `nft -f -` in the node namespace where nft has the `queue` expression.
NFT_RULES = """table inet ftrun_delay {}
delete table inet ftrun_delay
table inet ftrun_delay {
  chain in {
    type filter hook prerouting priority -300; policy accept;
    iif "lo" accept
    queue num %(q)d bypass
  }
  chain out {
    type filter hook output priority -300; policy accept;
    oif "lo" accept
    queue num %(q)d bypass
  }
}
"""

procs = []  # every tool we started, killed at the end whatever happens


@pytest.fixture(scope="module", autouse=True)
def tool():
    ok, why = nc.available()
    if not ok:
        pytest.skip(why)
    if not os.access(TOOL, os.X_OK):
        pytest.skip("%s not built (libnetfilter-queue-dev and libmnl-dev missing at configure time)" % TOOL)
    try:
        yield TOOL
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture(autouse=True)
def _stop_tools():
    """A tool a test left running (it stopped early) does not delay the next test's packets."""
    yield
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


@pytest.fixture(scope="module")
def c():
    """Two namespaces (nodes 0 and 1) on a bridge."""
    with nc.NetnsCluster(2) as cluster:
        yield cluster


def start(check, c, node, *args, install=True, expect_ready=True):
    """Starts ftrun-netdelay in node's namespace and waits for its ready line."""
    argv = c.exec_prefix(node) + [TOOL, "--queue", str(QUEUE)] + [str(a) for a in args]
    if install:
        argv.append("--install-rules")
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    procs.append(p)
    if not expect_ready:
        return p
    r, _, _ = select.select([p.stdout], [], [], 10)
    line = p.stdout.readline() if r else ""
    if not check(line.strip() == "ftrun-netdelay: queue %d ready" % QUEUE,
                 "netdelay %s: no ready line, got %r (rc %s)" % (" ".join(map(str, args)), line, p.poll())):
        stop(p, signal.SIGKILL)
        return None
    return p


def stop(p, sig=signal.SIGTERM):
    """Sends sig (the tool's own pid, never a group) and returns (rc, stdout, stderr)."""
    if p is None:
        return None, "", ""
    if p.poll() is None:
        p.send_signal(sig)
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    # read() through the same buffered files as start()'s readline (communicate() would bypass their buffers)
    return p.returncode, p.stdout.read(), p.stderr.read()


def ping(c, count=5, interval=0.2, wait=2, src=0, dst=None):
    """(received, rtt min ms or None) of pings node src -> dst (default: node 1's address)."""
    p = subprocess.run(c.exec_prefix(src) + [nc.PING, "-n", "-q", "-c", str(count), "-i", str(interval), "-W",
                                             str(wait), dst or c.addr(1)], capture_output=True, text=True, timeout=120)
    m = re.search(r"(\d+) received", p.stdout)
    rtt = re.search(r"= ([\d.]+)/([\d.]+)/([\d.]+)", p.stdout)
    return (int(m.group(1)) if m else 0), (float(rtt.group(1)) if rtt else None)


def tables(c, node):
    p = subprocess.run(c.exec_prefix(node) + [nc.NFT, "list", "tables"], capture_output=True, text=True)
    return p.stdout


SERVER = r"""
import hashlib, socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
conn, _ = s.accept(); t0 = time.monotonic(); h = hashlib.sha256(); n = 0
print("accepted", flush=True)
while True:
    b = conn.recv(1 << 20)
    if not b: break
    h.update(b); n += len(b)
print(n, h.hexdigest(), time.monotonic() - t0, flush=True)
"""
CLIENT = r"""
import hashlib, random, socket, sys
data = random.Random(int(sys.argv[3])).randbytes(int(sys.argv[4]))
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60)
s.sendall(data); s.shutdown(socket.SHUT_WR); s.recv(1)
print(len(data), hashlib.sha256(data).hexdigest(), flush=True)
"""


def tcp_transfer(check, c, nbytes, seed=7, during=None):
    """Sends nbytes from node 0 to node 1 over TCP, calling during() 0.3 s after the connection is accepted;
    returns ((sent bytes, sha256), (received bytes, sha256), seconds at the receiver) or None."""
    srv = subprocess.Popen(c.exec_prefix(1) + [sys.executable, "-c", SERVER, c.addr(1)], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    cl = None
    try:
        port = srv.stdout.readline().strip()
        cl = subprocess.Popen(c.exec_prefix(0) + [sys.executable, "-c", CLIENT, c.addr(1), port, str(seed),
                                                  str(nbytes)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
        if srv.stdout.readline().strip() == "accepted" and during:
            time.sleep(0.3)
            during()
        cl_out, cl_err = cl.communicate(timeout=120)
        out = srv.stdout.readline()  # readline, as above: communicate() would bypass the buffered lines
        srv.wait(timeout=60)
        err = srv.stderr.read()
        if not check(cl.returncode == 0 and srv.returncode == 0 and len(out.split()) == 3,
                     "tcp: client rc %d %s / server rc %s %r %s" % (cl.returncode, cl_err[-500:], srv.returncode,
                                                                    out, err[-500:])):
            return None
        n, digest, secs = out.split()
        sent = cl_out.split()
        return (int(sent[0]), sent[1]), (int(n), digest), float(secs)
    finally:
        for p in (srv, cl):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


COUNTERS_RE = re.compile(r"seen (\d+), dropped (\d+), delayed (\d+), max held (\d+), overruns (\d+), "
                         r"verdict errors (\d+)")


def counters(out):
    """The exit line's counters as a dict, or None."""
    m = COUNTERS_RE.search(out)
    keys = ("seen", "dropped", "delayed", "max_held", "overruns", "verdict_errors")
    return dict(zip(keys, map(int, m.groups()))) if m else None


def test_bad_arguments(check):
    """Bad arguments exit 2, naming the option."""
    for args, opt in ((["--delay-ms", "50"], "--queue"), (["--queue", "70000"], "--queue"),
                      (["--queue", "1", "--delay-ms", "-5"], "--delay-ms"),
                      (["--queue", "1", "--jitter-ms", "abc"], "--jitter-ms"),
                      (["--queue", "1", "--loss-percent", "150"], "--loss-percent"),
                      (["--queue", "1", "--seed", "x"], "--seed"), (["--queue", "1", "--delay-ms"], "--delay-ms"),
                      (["--queue", "1", "--frobnicate"], "--frobnicate")):
        p = subprocess.run([TOOL] + args, capture_output=True, text=True)
        check(p.returncode == 2 and opt in p.stderr, "bad args %s: rc %d, stderr %r" % (args, p.returncode, p.stderr))


def test_baseline(check, c):
    """Without the tool, node 0 reaches node 1."""
    n, base = ping(c)
    check(n == 5, "baseline: %d/5 pings" % n)
    print("RTT node 0 -> node 1 without delay: min %s ms" % base, flush=True)


def test_delay(check, c):
    """--delay-ms D in node 1: RTT >= D (about 2 D: in and out of node 1), the loopback
    rules, a second program on the queue refused, a TCP transfer intact, and SIGTERM's counters and cleanup."""
    t = start(check, c, 1, "--delay-ms", D)
    if t:
        print(tables(c, 1).strip(), flush=True)
        n, rtt = ping(c)
        print("RTT with --delay-ms %d in node 1: min %s ms" % (D, rtt), flush=True)
        check(n == 5 and rtt is not None and rtt >= D, "delay: %d/5 pings, RTT min %s ms < %d" % (n, rtt, D))
        rules = subprocess.run(c.exec_prefix(1) + [nc.NFT, "list", "ruleset"], capture_output=True,
                               text=True).stdout
        check(rules.count('iif "lo" accept') == 2 and rules.count('oif "lo" accept') == 2,
              "the loopback rules are not there:\n" + rules)

        # the queue is taken: a second program exits 1, naming the bind and the other program
        p2 = start(check, c, 1, "--delay-ms", "1", install=False, expect_ready=False)
        try:
            rc2, err2 = p2.wait(timeout=10), p2.stderr.read()
        except subprocess.TimeoutExpired:
            rc2, _, err2 = stop(p2, signal.SIGKILL)
        check(rc2 == 1 and "bind" in err2 and "another program" in err2, "second bind: rc %s, %r" % (rc2, err2))

        # TCP through the delayed link: bytes intact
        res = tcp_transfer(check, c, 8 << 20)
        if res:
            sent, got, secs = res
            check(sent == got, "tcp: sent %s, received %s" % (sent, got))
            print("TCP 8 MiB through the delayed link: %.2f s, %.1f MiB/s" % (secs, 8 / secs), flush=True)

        rc, out, err = stop(t)
        k = counters(out)
        print(out.strip(), flush=True)
        check(rc == 0 and k is not None, "SIGTERM: rc %s, stdout %r, stderr %r" % (rc, out, err))
        if k:
            check(k["seen"] > 0 and k["dropped"] == 0 and k["delayed"] == k["seen"] and k["verdict_errors"] == 0,
                  "delay counters: %s, stderr %r" % (k, err))
        check(TABLE not in tables(c, 1), "SIGTERM: rules left behind:\n" + tables(c, 1))
        n, rtt = ping(c)
        check(n == 5, "after SIGTERM: %d/5 pings" % n)


def test_sigterm_mid_transfer(check, c):
    """SIGTERM in the middle of a TCP transfer: every held packet is let go, none dropped."""
    t = start(check, c, 1, "--delay-ms", D)
    if t:
        stopped = {}
        res = tcp_transfer(check, c, 32 << 20, seed=8,
                           during=lambda: stopped.update(zip(("rc", "out", "err"), stop(t))))
        check(res is not None and res[0] == res[1], "tcp across SIGTERM: %s" % (res,))
        k = counters(stopped.get("out", ""))
        print("SIGTERM mid-transfer:", stopped.get("out", "").strip(), flush=True)
        check(stopped.get("rc") == 0 and k is not None and k["max_held"] > 0 and k["dropped"] == 0 and
              k["verdict_errors"] == 0, "SIGTERM mid-transfer: %s" % stopped)


def test_loopback_not_queued(check, c):
    """Loopback traffic is not queued: 20 pings on lo would be >= 40 packets through the queue."""
    t = start(check, c, 1, "--delay-ms", 1)
    if t:
        n, _ = ping(c, count=20, interval=0.01, src=1, dst="127.0.0.1")
        rc, out, _ = stop(t)
        k = counters(out)
        check(n == 20 and rc == 0 and k is not None and k["seen"] < 20, "loopback: %d/20 pings, %r" % (n, out))


def test_jitter(check, c):
    """Jitter: each crossing holds >= D - J."""
    t = start(check, c, 1, "--delay-ms", 20, "--jitter-ms", 10, "--seed", 1)
    if t:
        n, rtt = ping(c, count=10, interval=0.05)
        print("RTT with --delay-ms 20 --jitter-ms 10: min %s ms" % rtt, flush=True)
        check(n == 10 and rtt is not None and rtt >= 20, "jitter: %d/10 pings, RTT min %s < 20" % (n, rtt))
        stop(t)


def test_loss(check, c):
    """--loss-percent 100 cuts node 1 off, 50 loses some pings, 0 none (and SIGINT stops it)."""
    t = start(check, c, 1, "--loss-percent", 100)
    if t:
        n, _ = ping(c, count=3, wait=1)
        check(n == 0, "loss 100: %d/3 pings came back" % n)
        rc, out, _ = stop(t)
        k = counters(out)
        check(rc == 0 and k and k["dropped"] >= 3 and k["seen"] == k["dropped"], "loss 100 counters: %r" % out)
    t = start(check, c, 1, "--loss-percent", 50, "--seed", 3)
    if t:
        n, _ = ping(c, count=40, interval=0.02, wait=1)
        print("--loss-percent 50: %d/40 pings came back" % n, flush=True)
        check(0 < n < 40, "loss 50: %d/40 pings came back" % n)
        stop(t)
    t = start(check, c, 1, "--loss-percent", 0)
    if t:
        n, rtt = ping(c)
        check(n == 5, "loss 0, no delay: %d/5 pings" % n)
        rc, out, _ = stop(t, signal.SIGINT)
        k = counters(out)
        check(rc == 0 and k and k["seen"] >= 10 and k["dropped"] == 0, "loss 0 counters: %r" % out)


def test_sigkill_bypass(check, c):
    """SIGKILL with the rules in place: bypass, traffic flows; the tables are left for the caller,
    a new instance replaces them, and `nft delete table` removes them."""
    t = start(check, c, 1, "--delay-ms", D)
    if t:
        n, rtt = ping(c, count=2)
        check(n == 2 and rtt is not None and rtt >= D, "before SIGKILL: %d/2, RTT min %s" % (n, rtt))
        stop(t, signal.SIGKILL)
        n, rtt = ping(c)
        check(n == 5, "after SIGKILL (bypass): %d/5 pings" % n)
        check(TABLE in tables(c, 1), "after SIGKILL: the tables are gone?\n" + tables(c, 1))
        res = tcp_transfer(check, c, 1 << 20, seed=9)
        check(res is not None and res[0] == res[1], "tcp after SIGKILL: %s" % (res,))
        # a new instance replaces the leftover tables
        t = start(check, c, 1, "--delay-ms", D)
        if t:
            n, rtt = ping(c, count=2)
            check(n == 2 and rtt is not None and rtt >= D, "restarted: %d/2, RTT min %s" % (n, rtt))
            stop(t, signal.SIGKILL)
        for fam in ("ip", "ip6"):  # what a harness does after a SIGKILL
            p = subprocess.run(c.exec_prefix(1) + [nc.NFT, "delete", "table", fam, TABLE], capture_output=True,
                               text=True)
            check(p.returncode == 0, "nft delete table %s %s: %s" % (fam, TABLE, p.stderr))
        check(TABLE not in tables(c, 1), "tables left after nft delete:\n" + tables(c, 1))


def test_nft_rule_text(check, c):
    """The documented nft rule text, where nft has the queue expression."""
    p = subprocess.run(c.exec_prefix(1) + [nc.NFT, "-f", "-"], input=NFT_RULES % {"q": QUEUE},
                       capture_output=True, text=True)
    if p.returncode != 0:
        print("nft rule text not tested: this kernel's nf_tables has no `queue` expression "
              "(CONFIG_NFT_QUEUE): %s" % p.stderr.strip().splitlines()[0], flush=True)
    else:
        t = start(check, c, 1, "--delay-ms", D, install=False)
        if t:
            n, rtt = ping(c)
            check(n == 5 and rtt is not None and rtt >= D, "nft rule text: %d/5 pings, RTT min %s" % (n, rtt))
            stop(t)
        subprocess.run(c.exec_prefix(1) + [nc.NFT, "delete", "table", "inet", TABLE], capture_output=True)
