"""Real hosts reachable by ssh: the job's nodes, then its spares, in the
plan's `hosts` order. The runner starts the agents with `--launcher ssh`
(agent a on the a-th host of its hostfile, the spares on the last ones);
faults reach a host with the plan's ssh command: `kill` for signals and a
whole node (its agent and its ranks, the store's memory with them), a
python3 one-liner for a bit in the store's memory (root there).

What this backend needs of the hosts: ftrun's build at this machine's path
and `agent.run_dir` on a filesystem every host and this machine see (the
status files the harness reads), root over ssh without a password, and
python3. The persist directory, when the plan has one, is an existing
directory on a shared filesystem (`persist.dir`); the harness fills it for
`disk_full` and flips bits in it from here. Network faults and `disk_error`
need the netns backend (the harness does not reconfigure real hosts'
networks or mounts)."""
import os
import shlex
import signal
import subprocess
import time

from .nodes import DiskFaults, NodeError, fill_disk, free_disk

FLIP = ("import os,sys; p,o,b=sys.argv[1],int(sys.argv[2]),int(sys.argv[3]); fd=os.open(p,os.O_RDWR); "
        "c=os.pread(fd,1,o); os.pwrite(fd,bytes([c[0]^(1<<b)]),o)")


class SshNodes:
    def __init__(self, plan, workdir, build_dir):
        self.plan = plan
        self.hosts = plan.hosts
        self.persist_dir = plan.persist_dir
        self.disk = DiskFaults()
        self.hostfile = os.path.join(workdir, "hostfile")
        with open(self.hostfile, "w") as f:
            for h in self.hosts:
                f.write("%s slots=%d\n" % (h, plan.ranks_per_node))

    # -- what the runner needs
    def node_args(self):
        return ["-H", self.hostfile, "--launcher", "ssh", "--num_gpus", str(self.plan.ranks_per_node),
                "--spares", str(self.plan.spares)]

    def runner_args(self):
        p = self.plan
        out = []
        if p.launcher_args:
            out += ["--launcher_args", p.launcher_args]
        if p.coordinator_addr:
            out += ["--coordinator_addr", p.coordinator_addr]
        if p.agent_addr:
            out += ["--agent_addr", ",".join(p.agent_addr)]
        return out

    def env(self, base):
        env = dict(base)
        env.update(self.plan.env)
        return env

    def describe(self):
        return "%d hosts over ssh (%s)" % (len(self.hosts), ", ".join(self.hosts))

    # -- processes, through ssh
    def _ssh(self, agent, command, timeout=30):
        if not 0 <= agent < len(self.hosts):
            raise NodeError("agent %d has no host (the plan lists %d)" % (agent, len(self.hosts)))
        return subprocess.run(self.plan.ssh + [self.hosts[agent], command], capture_output=True, text=True,
                              timeout=timeout)

    def send_signal(self, agent, pid, sig):
        """False when the process is gone (kill fails); an ssh failure is an error."""
        p = self._ssh(agent, "kill -s %s %d" % (signal.Signals(sig).name[3:], pid))
        if p.returncode == 255:
            raise NodeError("ssh %s: %s" % (self.hosts[agent], p.stderr.strip()))
        return p.returncode == 0

    def send_signals(self, agent, pids, sig):
        """Signals each of pids, all through one ssh; one gone is skipped, an ssh failure is an error."""
        p = self._ssh(agent, "kill -s %s %s 2>/dev/null; exit 0" % (signal.Signals(sig).name[3:],
                                                                   " ".join(str(p) for p in pids)))
        if p.returncode == 255:
            raise NodeError("ssh %s: %s" % (self.hosts[agent], p.stderr.strip()))

    def stopped(self, agent, pids):
        """Whether every one of pids is stopped (state T) or gone, on agent's host."""
        test = ("for p in %s; do s=$(cut -d')' -f2 /proc/$p/stat 2>/dev/null | cut -d' ' -f2); "
                "case \"$s\" in ''|T|t|Z) ;; *) exit 1;; esac; done" % " ".join(str(p) for p in pids))
        return self._ssh(agent, test).returncode == 0

    def kill_node(self, agent, known_pids):
        """The agent and its ranks, SIGKILLed together; returns them once they are gone."""
        pids = [p for p in known_pids if p and p > 0]
        if not pids:
            return []
        words = " ".join(str(p) for p in pids)
        self._ssh(agent, "kill -s KILL %s" % words)
        gone = "for p in %s; do kill -0 $p 2>/dev/null && exit 1; done; exit 0" % words
        deadline = time.time() + 15
        while time.time() < deadline:
            if self._ssh(agent, gone).returncode == 0:
                return pids
            time.sleep(0.1)
        raise NodeError("processes %s on %s still there 15 s after SIGKILL" % (pids, self.hosts[agent]))

    def flip_bit(self, agent, path, offset, bit):
        p = self._ssh(agent, "python3 -c %s %s %d %d" % (shlex.quote(FLIP), shlex.quote(path), offset, bit))
        if p.returncode != 0:
            raise NodeError("flipping a bit on %s failed: %s" % (self.hosts[agent], p.stderr.strip()[-300:]))

    # -- the persist directory (shared: seen from here)
    def fill_disk(self):
        return fill_disk(self.persist_dir)

    def free_disk(self):
        free_disk(self.persist_dir)

    def teardown(self):
        if self.persist_dir:
            free_disk(self.persist_dir)
