"""The job under test: the `ftrun` runner (and, after a coordinator kill, the
`ftrun --attach` that takes it over), its output followed line by line and
its status file polled, everything timestamped on CLOCK_MONOTONIC (the clock
of the agents' own status stamps).

What it keeps (Timeline): the highest step seen over time, the committed
version over time, every rank's restores, every coordinator's announced
restore version, the final digests, the runner status's recoveries, and the
whole output in out.log for the verdict's evidence searches."""
import json
import os
import re
import signal
import subprocess
import threading
import time

STEP_RE = re.compile(r"^STEP (\d+) (\d+)$")
RESTORED_RE = re.compile(r"^restored version (\d+) \(rank (\d+)(?:, restart (\d+))?\)$")
DIGEST_RE = re.compile(r"^DIGEST (\d+) ([0-9a-f]{32})$")
# The coordinator starting an epoch: every rank restores this version (recovery/coordinator.cc).
ANNOUNCE_RE = re.compile(r"epoch (\d+): started \d+ nodes from version (\d+)")
# Why the coordinator began an epoch.
REASON_RE = re.compile(r"epoch (\d+): (.+?); (?:restoring|going back)")


def now():
    return time.monotonic()


class Timeline:
    """What the job did, as seen from outside. All times are time.monotonic()."""

    def __init__(self):
        self.lock = threading.Lock()
        self.steps = []          # [(t, step)]: the lowest of the ranks' latest steps, when it changes
        self.latest = {}         # rank -> its latest step (its restored version after a restore)
        self.committed = []      # [(t, version)]
        self.restores = []       # [(t, rank, version, announced version or None, epoch or None)]
        self.epoch_versions = {}  # epoch -> the version the coordinator started it from
        self.announced = None    # the coordinator's last announced restore version
        self.announcements = []  # [(t, version, line)]
        self.reasons = {}        # epoch -> why the coordinator began it
        self.digests = {}
        self.max_step = 0
        self.log_lines = []      # [(t, line)] of lines that are not STEP lines
        self.first_steps = {}    # rank -> [(restore time, time of the first STEP after it, epoch)]

    def feed(self, t, line):
        m = STEP_RE.match(line)
        with self.lock:
            if m:
                rank, step = int(m.group(1)), int(m.group(2))
                self.max_step = max(step, self.max_step)
                self._track(t, rank, step)
                pending = self.first_steps.setdefault(rank, [])
                if pending and pending[-1][1] is None:
                    pending[-1] = (pending[-1][0], t, pending[-1][2])
                return
            self.log_lines.append((t, line))
            m = RESTORED_RE.match(line)
            if m:
                v, rank = int(m.group(1)), int(m.group(2))
                epoch = int(m.group(3)) if m.group(3) is not None else None
                self.restores.append((t, rank, v, self.announced, epoch))
                self._track(t, rank, v)
                self.first_steps.setdefault(rank, []).append((t, None, epoch))
                return
            m = DIGEST_RE.match(line)
            if m:
                self.digests[int(m.group(1))] = m.group(2)
                return
            m = REASON_RE.search(line)
            if m:
                self.reasons.setdefault(int(m.group(1)), m.group(2))
            m = ANNOUNCE_RE.search(line)
            if m:
                self.announced = int(m.group(2))
                self.epoch_versions[int(m.group(1))] = self.announced
                self.announcements.append((t, self.announced, line))

    def _track(self, t, rank, step):
        self.latest[rank] = step
        low = min(self.latest.values())
        if not self.steps or self.steps[-1][1] != low:
            self.steps.append((t, low))

    def note_committed(self, t, v):
        with self.lock:
            if v is not None and (not self.committed or self.committed[-1][1] != v):
                self.committed.append((t, v))

    def committed_at(self, t):
        """The highest committed version observed at or before t (None: none yet)."""
        with self.lock:
            best = None
            for tt, v in self.committed:
                if tt > t:
                    break
                best = v if best is None else max(best, v)
            return best

    def committed_since(self, v):
        """When the status file first showed version v committed."""
        with self.lock:
            return next((tt for tt, vv in self.committed if vv >= v), 0.0)

    def log_lines_between(self, t0, t1):
        with self.lock:
            return [(tt, l) for tt, l in self.log_lines if t0 <= tt <= t1]

    def lines_after(self, t):
        with self.lock:
            return [line for tt, line in self.log_lines if tt >= t]


class RunningJob:
    """Starts the runner and follows it until it exits."""

    def __init__(self, argv, env, run_dir, job_id, config_path, workdir):
        self.env = env
        self.job_id = job_id
        self.config_path = config_path
        self.status_path = os.path.join(run_dir, job_id, "status.json")
        self.timeline = Timeline()
        self.log = open(os.path.join(workdir, "out.log"), "w")
        self.read_fd, self.write_fd = os.pipe()
        self.started = now()
        self.runner = self._spawn(argv)
        self.runners = [self.runner]
        self.exit_code = None
        self.status = None
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._follow, daemon=True),
                         threading.Thread(target=self._poll, daemon=True)]
        for th in self._threads:
            th.start()

    def _spawn(self, argv):
        return subprocess.Popen(argv, stdout=self.write_fd, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=self.env, start_new_session=True)

    # -- following
    def _follow(self):
        buf = b""
        while True:
            try:
                data = os.read(self.read_fd, 65536)
            except OSError:
                return
            if not data:
                return
            t = now()
            buf += data
            *lines, buf = buf.split(b"\n")
            for raw in lines:
                line = raw.decode("utf-8", "replace").rstrip("\r")
                self.log.write("%.3f %s\n" % (t - self.started, line))
                self.timeline.feed(t, line)
            self.log.flush()

    def _poll(self):
        while not self._stop.is_set():
            st = self.read_status()
            if st is not None:
                self.status = st
                self.timeline.note_committed(now(), st.get("committed_version"))
            time.sleep(0.05)

    def read_status(self):
        try:
            with open(self.status_path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    # -- the process
    def alive(self):
        return self.runner.poll() is None

    def kill_coordinator(self, sig):
        """Signals the runner (the coordinator's host). Returns its pid."""
        pid = self.runner.pid
        if pid > 0 and self.runner.poll() is None:
            os.kill(pid, sig)
        self.runner.wait()
        return pid

    def attach(self, runner_path):
        """`ftrun --attach`: a new runner takes the job over."""
        self.runner = self._spawn([runner_path, "--attach", self.job_id, "--config", self.config_path])
        self.runners.append(self.runner)

    def wait(self, deadline):
        """Waits for the runner to exit; at the deadline stops it (SIGTERM, then SIGKILL). Returns its code."""
        while self.runner.poll() is None and now() < deadline:
            time.sleep(0.1)
        if self.runner.poll() is None:
            self.stop()
            self.exit_code = "timeout"
        else:
            self.exit_code = self.runner.returncode
        return self.exit_code

    def stop(self):
        """Stops the runner if it still runs (SIGTERM, then SIGKILL after 30 s)."""
        if self.runner.poll() is None:
            self.runner.send_signal(signal.SIGTERM)
            try:
                self.runner.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.runner.kill()
                self.runner.wait()

    def close(self, grace=5.0):
        """Stops following once the output is drained (agents of a killed runner may still hold the pipe)."""
        if self.write_fd is not None:
            os.close(self.write_fd)
            self.write_fd = None
        end = now() + grace
        self._threads[0].join(timeout=max(0.0, end - now()))
        self._stop.set()
        self._threads[1].join(timeout=1.0)
        st = self.read_status()
        if st is not None:
            self.status = st
            self.timeline.note_committed(now(), st.get("committed_version"))
        self.log.close()
