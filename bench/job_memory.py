"""A job's processes, and the memory they hold: the machine's memory in use
(page cache left out: checkpoints written to disk are not counted) sampled in
a thread of the bench, above what it was when the job started; and once, the
processes' proportional set sizes by kind of process (Pss in
/proc/PID/smaps_rollup: a page shared by n of them counts 1/n to each, so
shared memory - ftrun's store, DCP's shared-memory stager, torch's libraries -
counts once)."""
import os
import threading
import time


def _children():
    """{ppid: [pid, ...]} of every process on the machine now."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
            # pid (comm) state ppid ...: comm may hold spaces and parentheses, the last ')' ends it
            ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # gone
        out.setdefault(ppid, []).append(int(name))
    return out


def _pss_kib(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass  # gone, or a kernel thread
    return 0


def descendants(roots):
    """The processes ROOTS and all their descendants, as pids."""
    children = _children()
    seen, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            todo.extend(children.get(pid, ()))
    return seen


def _kind(pid):
    """What a process of the job is: a rank (RANK in its environment), a warm standby of ftrun's, or else
    its name (ftrun-agent, ftrun, a launcher, a writer process)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
        if b"FTRUN_WARM_STANDBY=1" in env:
            return "standby"
        if any(e.startswith(b"RANK=") for e in env):
            return "rank"
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "gone"


def job_pss_kib(roots):
    """{kind: Pss in KiB} of the processes ROOTS and all their descendants, by _kind."""
    out = {}
    for pid in descendants(roots):
        kib = _pss_kib(pid)
        if kib:
            kind = _kind(pid)
            out[kind] = out.get(kind, 0) + kib
    return out


def used_kib():
    """The machine's memory in use, page cache left out (shared memory kept: it is in Cached too):
    MemTotal - MemFree - Buffers - (Cached - Shmem) - SReclaimable, from /proc/meminfo. Cheap to read, and
    unlike a process's Pss it takes no lock of the processes measured."""
    m = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, val = line.split(":", 1)
            m[key] = int(val.split()[0])
    return (m["MemTotal"] - m["MemFree"] - m.get("Buffers", 0) - (m.get("Cached", 0) - m.get("Shmem", 0))
            - m.get("SReclaimable", 0))


class JobMemory:
    """The memory a job adds to the machine: used_kib() every `interval` seconds until stopped, less its value
    when the job was started (the job runs alone on the machine). `peak_mib(until)`: the largest sample taken
    before the moment `until` (CLOCK_MONOTONIC). Reading every process's Pss that often would slow the job
    measured (it walks their page tables under their memory map's lock): `by_kind()` reads them once."""

    def __init__(self, roots, interval=0.25):
        self.roots, self.interval, self.samples = roots, interval, []
        self.base = used_kib()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.done.wait(self.interval):
            self.samples.append((time.monotonic(), used_kib() - self.base))

    def peak_mib(self, until=float("inf")):
        kib = [k for t, k in list(self.samples) if t < until]
        return max(kib) / 1024 if kib else None

    def by_kind(self):
        """{kind: MiB} of the job's processes now, by their Pss (job_pss_kib)."""
        return {kind: round(kib / 1024, 1) for kind, kib in sorted(job_pss_kib(self.roots()).items())}

    def stop(self):
        self.done.set()
        self.thread.join(timeout=10)
