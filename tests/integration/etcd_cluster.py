"""A real etcd cluster for the tests (Debian's etcd-server, three members on
loopback), spoken to through its v3 JSON gateway, and a TCP proxy in front
of it that can cut one process off (a network partition between that
process and etcd, everyone else still through)."""
import base64
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request

ETCD = shutil.which("etcd") or "/usr/bin/etcd"


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def post(endpoint, path, body, timeout=2.0):
    req = urllib.request.Request(endpoint + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read().decode().split("\n")[0])


class EtcdCluster:
    """Three etcd members; kill(i) and restart(i) a member; get(key)."""

    def __init__(self, root, members=3):
        self.root = root
        ports = free_ports(2 * members)
        self.client = ports[:members]
        self.peer = ports[members:]
        self.names = [f"m{i}" for i in range(members)]
        self.initial = ",".join(f"{n}=http://127.0.0.1:{p}" for n, p in zip(self.names, self.peer))
        self.procs = [None] * members
        for i in range(members):
            self.start(i)
        self.wait_healthy()

    def endpoints(self):
        return [f"http://127.0.0.1:{p}" for p in self.client]

    def start(self, i):
        log = open(os.path.join(self.root, f"etcd-{self.names[i]}.log"), "a")
        self.procs[i] = subprocess.Popen(
            [ETCD, "--name", self.names[i], "--data-dir", os.path.join(self.root, self.names[i]),
             "--listen-client-urls", self.endpoints()[i], "--advertise-client-urls", self.endpoints()[i],
             "--listen-peer-urls", f"http://127.0.0.1:{self.peer[i]}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer[i]}",
             "--initial-cluster", self.initial, "--initial-cluster-state", "new",
             "--initial-cluster-token", os.path.basename(self.root)],
            stdout=log, stderr=subprocess.STDOUT)

    def status(self, i):
        try:
            return post(self.endpoints()[i], "/v3/maintenance/status", {}, timeout=1.0)
        except (OSError, ValueError):
            return None

    def wait_healthy(self, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            st = [self.status(i) for i in range(len(self.procs)) if self.procs[i] is not None]
            if st and all(s and s.get("leader") not in (None, "0") for s in st):
                return
            time.sleep(0.1)
        raise RuntimeError(f"etcd cluster not healthy within {timeout} s (logs in {self.root})")

    def leader(self):
        """The index of the leading member."""
        for i in range(len(self.procs)):
            st = self.status(i)
            if st and st.get("leader") == st.get("header", {}).get("member_id"):
                return i
        return None

    def kill(self, i):
        self.procs[i].send_signal(signal.SIGKILL)
        self.procs[i].wait()
        self.procs[i] = None

    def get(self, key):
        """(value, create_revision) of a key, or None."""
        for e in self.endpoints():
            try:
                r = post(e, "/v3/kv/range", {"key": base64.b64encode(key.encode()).decode()})
            except (OSError, ValueError):
                continue
            kvs = r.get("kvs") or []
            if not kvs:
                return None
            return base64.b64decode(kvs[0].get("value", "")).decode(), int(kvs[0]["create_revision"])
        raise RuntimeError("no etcd member answered")

    def _post_any(self, path, body):
        """Through the first member that answers (a test may have killed some)."""
        for e in self.endpoints():
            try:
                return post(e, path, body)
            except (OSError, ValueError):
                continue
        raise RuntimeError("no etcd member answered")

    def put(self, key, value):
        return self._post_any("/v3/kv/put", {"key": base64.b64encode(key.encode()).decode(),
                                             "value": base64.b64encode(value.encode()).decode()})

    def delete(self, key):
        return self._post_any("/v3/kv/deleterange", {"key": base64.b64encode(key.encode()).decode()})

    def stop(self):
        for p in self.procs:
            if p is not None:
                p.kill()
                p.wait()


def socket_owner_inodes(pid):
    """The socket inodes a process holds."""
    out = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                out.add(int(link[8:-1]))
    except OSError:
        pass
    return out


def inode_of_connection(local_port, remote_port):
    """The inode of the open loopback TCP socket from local_port to remote_port (a connecting end). Sockets in
    TIME_WAIT (inode 0) that once had the same port are skipped."""
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            local, remote, inode = int(fields[1].split(":")[1], 16), int(fields[2].split(":")[1], 16), int(fields[9])
            if local == local_port and remote == remote_port and inode != 0:
                return inode
    return None


class PartitionProxy:
    """A TCP proxy to one etcd member: every connection passes, except those
    of processes cut off by cut(pid) (their open connections are closed and
    new ones refused) until heal()."""

    def __init__(self, upstream_port):
        self.upstream = upstream_port
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.port = self.lsock.getsockname()[1]
        self.cut_pids = set()
        self.conns = []  # (client socket, upstream socket, client inode)
        self.lock = threading.Lock()
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def endpoint(self):
        return f"http://127.0.0.1:{self.port}"

    def _blocked(self, inode):
        with self.lock:
            pids = set(self.cut_pids)
        return any(inode in socket_owner_inodes(p) for p in pids)

    def _accept(self):
        while not self.stopped:
            try:
                c, addr = self.lsock.accept()
            except OSError:
                return
            inode = inode_of_connection(addr[1], self.port)
            if inode is None or self._blocked(inode):  # (not found: its process is gone already)
                c.close()
                continue
            try:
                u = socket.create_connection(("127.0.0.1", self.upstream), timeout=2)
            except OSError:
                c.close()
                continue
            with self.lock:
                self.conns.append((c, u, inode))
            threading.Thread(target=self._pump, args=(c, u), daemon=True).start()

    def _pump(self, a, b):
        try:
            while True:
                r, _, _ = select.select([a, b], [], [], 0.5)
                for s in r:
                    data = s.recv(65536)
                    if not data:
                        raise OSError("closed")
                    (b if s is a else a).sendall(data)
        except (OSError, ValueError):
            pass
        for s in (a, b):
            try:
                s.close()
            except OSError:
                pass

    def cut(self, pid):
        with self.lock:
            self.cut_pids.add(pid)
            conns = list(self.conns)
        mine = socket_owner_inodes(pid)
        for c, u, inode in conns:
            if inode in mine:
                for s in (c, u):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

    def heal(self):
        with self.lock:
            self.cut_pids.clear()

    def stop(self):
        self.stopped = True
        self.lsock.close()
