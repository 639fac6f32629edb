"""The machines the job runs on: one Linux network namespace per agent (the
job's nodes, then its spares), behind one bridge; the runner and its
coordinator in the root namespace. Agent a always runs in namespace a (the
runner starts a dead local agent again in the same one), so a fault aimed at
job node n lands in the namespace of the agent that holds node n now.

Network faults act on real packets: the link taken down (both veth ends),
a silent partition and packet loss (nftables rules in the namespace), delay
and jitter (netem where the kernel has it, else ftrun-netdelay holding each
packet through NFQUEUE). The persist directory is a tmpfs of the plan's size,
so a full disk and a read-only one are real errors from the kernel."""
import os
import signal
import subprocess
import threading
import time

from . import netns_cluster as nc



class NodeError(RuntimeError):
    pass


class NetnsNodes:
    def __init__(self, plan, workdir, build_dir):
        self.plan = plan
        self.build_dir = build_dir
        self.count = plan.nodes + plan.spares
        nc.cleanup_stale()  # namespaces left by a harness that was SIGKILLed
        self.cluster = nc.NetnsCluster(self.count)
        self._delays = {}  # namespace -> ("netem", None) or ("nfqueue", Popen)
        self.persist_dir = None
        if plan.persist_size:
            self.persist_dir = os.path.join(workdir, "persist")
            os.makedirs(self.persist_dir, exist_ok=True)
            _run(["mount", "-t", "tmpfs", "-o", "size=%d,mode=0700" % plan.persist_size, "ftrun-chaos",
                  self.persist_dir])
        self.read_only = False
        self.disk = DiskFaults()

    # -- what the runner needs
    def runner_args(self):
        c = self.cluster
        return ["--coordinator_addr", c.root_addr,
                "--agent_addr", ",".join(c.addr(i) for i in range(self.count)),
                "--agent_exec_prefix", c.exec_prefix_template + " env UCX_NET_DEVICES=veth{node}"]

    def env(self, base):
        env = dict(base)
        env["UCX_TLS"] = "tcp,self"  # else UCX finds shared memory across namespaces
        env["UCX_NET_DEVICES"] = self.cluster.bridge
        return env

    def describe(self):
        c = self.cluster
        return "%d network namespaces %s0..%d on bridge %s (%s)" % (self.count, c.prefix, self.count - 1,
                                                                     c.bridge, c.subnet)

    def node_args(self):
        """How the runner is told where the nodes are."""
        p = self.plan
        return ["--num_nodes", str(p.nodes), "--num_gpus", str(p.ranks_per_node), "--spares", str(p.spares)]

    # -- processes
    def send_signal(self, ns, pid, sig):
        """Signals a process of the cluster (any namespace: pids are global here); False when it is gone."""
        try:
            os.kill(pid, sig)
            return True
        except ProcessLookupError:
            return False

    def send_signals(self, ns, pids, sig):
        """Signals each of pids; one gone is skipped."""
        for pid in pids:
            self.send_signal(ns, pid, sig)

    def stopped(self, ns, pids):
        """Whether every one of pids is stopped (state T) or gone."""
        for pid in pids:
            try:
                with open("/proc/%d/stat" % pid) as f:
                    if f.read().rsplit(")", 1)[1].split()[0] not in ("T", "t", "Z"):
                        return False
            except (OSError, IndexError):
                pass
        return True

    def kill_node(self, ns, known_pids):
        """The whole node: every process of its namespace (known_pids, from the status files, are among them)."""
        return self.kill_namespace(ns)

    def flip_bit(self, ns, path, offset, bit):
        flip_bit(path, offset, bit)

    def kill_namespace(self, ns, sig=signal.SIGKILL):
        """Every process of namespace ns now (an agent and its ranks: the whole node); not the agent the
        runner may start there a moment later. Returns the pids, once they are gone."""
        pids = self.cluster.pids(ns)
        for pid in pids:
            if pid > 0:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        if not wait_gone(pids, 15.0):
            raise NodeError("processes %s of namespace %d still there 15 s after %s" % (
                [p for p in pids if os.path.exists("/proc/%d" % p)], ns, signal.Signals(sig).name))
        return pids

    # -- network
    def link_down(self, ns):
        self.cluster.link_down(ns)

    def link_up(self, ns):
        self.cluster.link_up(ns)

    def partition(self, ns):
        self.cluster.partition(ns)

    def heal(self, ns):
        self.cluster.heal(ns)

    def loss(self, ns, percent):
        self.cluster.drop(ns, percent)

    def delay(self, ns, ms, jitter_ms, queue):
        """Holds every packet of namespace ns for ms (+- jitter) in both directions."""
        dev = self.cluster.device(ns)
        argv = self.cluster.exec_prefix(ns) + ["tc", "qdisc", "replace", "dev", dev, "root", "netem", "delay",
                                               "%dms" % ms] + (["%dms" % jitter_ms] if jitter_ms else [])
        if subprocess.run(argv, capture_output=True).returncode == 0:
            self._delays[ns] = ("netem", None)
            return "netem"
        tool = os.path.join(self.build_dir, "ftrun-netdelay")
        if not os.access(tool, os.X_OK):
            raise NodeError("delay: this kernel has no netem qdisc and %s was not built (libnetfilter-queue-dev)" % tool)
        # The tool installs its own NFQUEUE rules (nf_tables netlink; this
        # kernel's nft has no `queue` expression) and removes them at SIGTERM
        # after giving back every packet it holds.
        p = subprocess.Popen(self.cluster.exec_prefix(ns) + [tool, "--queue", str(queue), "--delay-ms", str(int(ms)),
                                                             "--jitter-ms", str(int(jitter_ms)), "--install-rules"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        line = p.stdout.readline()
        if "ready" not in line:
            p.kill()
            p.wait()
            raise NodeError("delay: ftrun-netdelay in node namespace %d did not start: %s" % (ns, line.strip()))
        self._delays[ns] = ("nfqueue", p)
        return "nfqueue"

    def undelay(self, ns):
        how, proc = self._delays.pop(ns, (None, None))
        if how == "netem":
            subprocess.run(self.cluster.exec_prefix(ns) + ["tc", "qdisc", "del", "dev", self.cluster.device(ns), "root"],
                           capture_output=True)
        elif how == "nfqueue":
            proc.terminate()  # not `nft delete table`: that drops the packets it holds
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    # -- the persist directory
    def fill_disk(self):
        return fill_disk(self.persist_dir)

    def free_disk(self):
        free_disk(self.persist_dir)

    def disk_read_only(self):
        """Every write into the persist directory fails with EROFS from now on (a read-only bind mount over
        it, which is what a filesystem that remounts itself read-only on errors looks like to the agents)."""
        _run(["mount", "--bind", self.persist_dir, self.persist_dir])
        _run(["mount", "-o", "remount,bind,ro", self.persist_dir])
        self.read_only = True

    def disk_writable(self):
        if self.read_only:
            _run(["umount", "-l", self.persist_dir])
            self.read_only = False

    # -- the end
    def teardown(self):
        errors = []
        for ns in list(self._delays):
            try:
                self.undelay(ns)
            except Exception as e:  # keep going: the namespaces must still go
                errors.append(str(e))
        try:
            self.cluster.teardown()
        except Exception as e:
            errors.append(str(e))
        while self.persist_dir and os.path.ismount(self.persist_dir):  # the tmpfs, and any bind over it
            p = subprocess.run(["umount", "-l", self.persist_dir], capture_output=True, text=True)
            if p.returncode != 0:
                errors.append("umount %s: %s" % (self.persist_dir, p.stderr.strip()))
                break
        if errors:
            raise NodeError("teardown: " + "; ".join(errors))


def flip_bit(path, offset, bit):
    """Flips one bit of the byte at offset of a file (also /proc/PID/fd/N: a memfd)."""
    fd = os.open(path, os.O_RDWR)
    try:
        old = os.pread(fd, 1, offset)
        if len(old) != 1:
            raise NodeError("%s has no byte at offset %d" % (path, offset))
        os.pwrite(fd, bytes([old[0] ^ (1 << bit)]), offset)
    finally:
        os.close(fd)


def _ballast(persist_dir):
    return os.path.join(persist_dir, ".chaos-ballast")


def fill_disk(persist_dir):
    """Takes every free byte of the filesystem of persist_dir; returns how many. Never the root one."""
    if os.stat(persist_dir).st_dev == os.stat("/").st_dev:
        raise NodeError("disk_full: %s is on the root filesystem; give the persist directory its own "
                        "(a mount), or the whole machine would fill up" % persist_dir)
    st = os.statvfs(persist_dir)
    free = st.f_bavail * st.f_frsize
    fd = os.open(_ballast(persist_dir), os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        taken = 0
        step = max(free, 1 << 20)
        while step >= 4096:  # what stays free after a big allocation is taken in smaller pieces
            try:
                os.posix_fallocate(fd, taken, step)
                taken += step
            except OSError:
                step //= 2
        return taken
    finally:
        os.close(fd)


def free_disk(persist_dir):
    try:
        os.unlink(_ballast(persist_dir))
    except FileNotFoundError:
        pass


class DiskFaults:
    """One disk fault at a time on the persist directory: a full disk, a read-only one and a flipped bit
    interfere (a ballast that cannot be removed from a read-only directory fills it for good)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.active = None  # the kind going on

    def begin(self, kind):
        with self.lock:
            if self.active:
                return False
            self.active = kind
            return True

    def end(self):
        with self.lock:
            self.active = None


def _run(argv, input=None):
    p = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        raise NodeError("%s failed (rc %d): %s" % (" ".join(argv), p.returncode, (p.stderr or p.stdout).strip()))
    return p


def wait_gone(pids, timeout=5.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not any(os.path.exists("/proc/%d" % p) for p in pids):
            return True
        time.sleep(0.01)
    return False
