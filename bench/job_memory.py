"""A job's processes, and the memory they hold: every process it started and their descendants,
sampled in a thread of the bench. A sample is the sum of the processes'
proportional set sizes (Pss in /proc/PID/smaps_rollup: a page shared by n
of them counts 1/n to each, so shared memory - ftrun's store, DCP's
shared-memory stager, torch's libraries - counts once). The page cache of
files written (checkpoints on disk) is not a process's and is not counted."""
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
        except OSError:
            continue  # gone
        # pid (comm) state ppid ...: comm may hold spaces and parentheses, the last ')' ends it
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
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


class JobMemory:
    """Samples job_pss_kib(roots()) every `interval` seconds until stopped; `peak_mib(until)`: the largest
    sample's total taken before the moment `until` (CLOCK_MONOTONIC) and its {kind: MiB}."""

    def __init__(self, roots, interval=0.5):
        self.roots, self.interval, self.samples = roots, interval, []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.done.wait(self.interval):
            kib = job_pss_kib(self.roots())
            self.samples.append((time.monotonic(), kib))

    def peak_mib(self, until=float("inf")):
        kinds = [k for t, k in list(self.samples) if t < until]
        if not kinds:
            return None, {}
        peak = max(kinds, key=lambda k: sum(k.values()))
        return sum(peak.values()) / 1024, {kind: round(kib / 1024, 1) for kind, kib in sorted(peak.items())}

    def stop(self):
        self.done.set()
        self.thread.join(timeout=10)
