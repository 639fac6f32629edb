"""One chaos run: golden digests, the cluster, the job, the faults on their
schedule, the verdict and the report."""
import copy
import os
import random
import subprocess
import threading
import time

import yaml

from . import faults as faultlib
from .job import RunningJob, now
from .nodes import NetnsNodes
from .ssh_nodes import SshNodes
from .plan import AWAY_KINDS
from .result import run_result
from .schedule import planned_groups, random_groups

READY_TIMEOUT = 120.0  # a job not running again this long after a fault fails the run
SKIP_RETRY_S = 30.0  # a target away in a recovery gets this long to come back


class RunError(RuntimeError):
    pass


def trainer_args(plan, step_ms=None):
    s = plan.synthetic
    return ["--state-bytes", s["state_bytes"], "--tensors", str(s["tensors"]), "--steps", str(s["steps"]),
            "--step-ms", str(s["step_ms"] if step_ms is None else step_ms),
            "--change-fraction", str(s["change_fraction"]), "--verbose"]


def golden_digests(plan, build):
    """The failure-free run's digests: the synthetic trainer without an agent, every rank."""
    trainer = os.path.join(build, "ftrun-synthetic")
    out, procs = {}, []
    nranks = plan.nodes * plan.ranks_per_node
    for r in range(nranks):
        procs.append(subprocess.Popen([trainer, "--no-ftrun", "--rank", str(r)] + trainer_args(plan, 0),
                                      stdout=subprocess.PIPE, text=True))
        if len(procs) >= 2 or r == nranks - 1:
            for p in procs:
                text = p.communicate()[0]
                if p.returncode != 0:
                    raise RunError("the golden run of the synthetic trainer failed (exit %d)" % p.returncode)
                for line in text.splitlines():
                    if line.startswith("DIGEST "):
                        _, rank, d = line.split()
                        out[int(rank)] = d
            procs = []
    return out


def golden_from_command(plan, build, workdir):
    """A failure-free run of the user's command under ftrun on local nodes: its DIGEST lines."""
    if plan.golden != "run":
        with open(plan.golden) as f:
            return {int(r): d for line in f for _, r, d in [line.split()] if line.startswith("DIGEST ")}
    cfg = os.path.join(workdir, "golden.yaml")
    with open(cfg, "w") as f:
        f.write("agent:\n  run_dir: %s/golden-run\n" % workdir)
    p = subprocess.run([os.path.join(build, "ftrun"), "--num_nodes", str(plan.nodes), "--num_gpus",
                        str(plan.ranks_per_node), "--config", cfg, "--no_python", "--no_local_rank"] + plan.command,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        raise RunError("the failure-free run of the command failed (exit %d):\n%s" % (p.returncode, p.stdout[-2000:]))
    return {int(r): d for line in p.stdout.splitlines() if line.startswith("DIGEST ") for _, r, d in [line.split()]}


def job_config(plan, workdir, run_dir, persist_dir, job_id):
    cfg = {"job": {"id": job_id, "max_restarts": 100000, "hang_timeout": "3s", "stop_grace": "1s"},
           "store": {"memory_budget": "512MiB", "chunk_size": "256KiB", "prefault": False},
           "agent": {"run_dir": run_dir, "log_level": "info"},
           "cluster": {"replicas": plan.replicas, "heartbeat_interval": "200ms", "heartbeat_misses": 10,
                       "lost_node_timeout": "60s"}}
    if plan.erasure:  # the code instead of copies (`replicas` and `redundancy` in one file is an error)
        del cfg["cluster"]["replicas"]
        cfg["cluster"] = dict({"redundancy": {"erasure": dict(plan.erasure)}}, **cfg["cluster"])
    if persist_dir:
        cfg["persist"] = {"dir": persist_dir, "every_versions": plan.persist_every, "every_seconds": "0s",
                          "keep": 2, "drain_timeout": "30s"}
    _merge(cfg, yaml.safe_load(plan.config) or {})
    cfg["job"]["id"] = job_id
    # Agents read it by path: on a remote host it must be where they see it (run_dir is shared).
    path = os.path.join(run_dir if plan.backend == "ssh" else workdir, job_id + ".yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)
    return path


def _merge(dst, src):
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            _merge(dst[k], v)
        else:
            dst[k] = v


class Runner:
    def __init__(self, plan, build, workdir, log):
        self.plan, self.build, self.workdir, self.log = plan, build, workdir, log
        self.rng = faultlib.new_rng(plan.seed)
        self.lock = threading.Lock()  # records, active, not_injected: written by the firing threads
        self.records = []
        self.job = None
        self.active = []  # [(end time, undo, record)]
        self.last_restart_version = -1
        self.last_restart_t = 0.0  # when the last group with a restart fault was injected
        self.not_injected = []
        self.stuck = None  # why the run was cut short: the job did not run again after a fault

    # -- the loop's helpers
    def tick(self):
        t = now()
        with self.lock:
            due = [a for a in self.active if a[0] <= t]
            for item in due:
                self.active.remove(item)
        for item in due:
            end, undo, rec = item
            try:
                undo()
            except Exception as e:
                rec["note"] += " (undo failed: %s)" % e
            rec["ended_s"] = now() - self.job.started

    def wait(self, pred, timeout):
        deadline = now() + timeout
        while now() < deadline:
            self.tick()
            if pred():
                return True
            if not self.job.alive():
                return False
            time.sleep(0.02)
        return False

    def ready(self):
        """The job runs, with a version committed after the last restart fault, no node taken away. A job that
        went back since (an epoch started from an older version: the persist directory's, after more losses
        than redundancy covers) counts its versions again from there."""
        st = self.job.status or {}
        v = st.get("committed_version")
        away = any(r["kind"] in AWAY_KINDS for _, _, r in self.active)
        after = self.last_restart_version
        back = [w for t, w, _ in list(self.job.timeline.announcements) if t >= self.last_restart_t and w < after]
        if back:
            after = back[-1]
        return (st.get("phase") == "running" and v is not None and v > after and not away
                and self.job.alive())

    # -- firing
    def fire(self, group):
        if group.restarts:
            if not self.wait(self.ready, READY_TIMEOUT):
                if self.job.alive():
                    last = self.records[-1] if self.records else None
                    self.stuck = "the job did not run again with a new committed version within %.0f s%s" % (
                        READY_TIMEOUT, " after fault %d (%s)" % (last["id"], last["kind"]) if last else "")
                    self.log(self.stuck)
                return False
        # Together: each fault on its own thread (with its own generator, drawn here so a seed replays),
        # while this thread keeps ending the faults whose time is up.
        t_fired = now()
        threads = [threading.Thread(target=self._fire_one, args=(f, random.Random(self.rng.randrange(1 << 32))))
                   for f in group.faults]
        for th in threads:
            th.start()
        while any(th.is_alive() for th in threads):
            self.tick()
            time.sleep(0.01)
        if group.restarts:
            st = self.job.status or {}
            self.last_restart_version = st.get("committed_version") or self.last_restart_version
            self.last_restart_t = t_fired
        return True

    def _fire_one(self, f, rng):
        reason = "?"
        give_up = now() + SKIP_RETRY_S
        while now() < give_up and self.job.alive():
            t = now()
            try:
                rec, undo = faultlib.inject(self.ctx, f, rng)
            except faultlib.Skip as e:
                if str(e) != reason:  # said once per reason: a fault that comes late says why
                    self.log("fault %s (%s) waits: %s" % (f.kind, f.origin, e))
                reason = str(e)
                time.sleep(0.2)
                continue
            except Exception as e:  # a fault that could not be made: said, and the run goes on
                reason = "%s: %s" % (type(e).__name__, e)
                break
            t = rec.get("_t", t)
            with self.lock:
                rec.update({"id": len(self.records), "kind": f.kind, "at_s": round(t - self.job.started, 3),
                            "at_step": self.job.timeline.max_step, "ended_s": None, "recovery": None,
                            "detected": None, "note": rec.get("note", ""), "_t": t, "origin": f.origin})
                self.records.append(rec)
                if undo is not None:
                    self.active.append((t + (f.duration or 0), undo, rec))
            self.log("fault %d: %s %s at %.1fs step %d" % (rec["id"], f.kind, rec["target"], rec["at_s"],
                                                           rec["at_step"]))
            return rec
        with self.lock:
            self.not_injected.append("%s (%s): %s" % (f.kind, f.origin, reason))
        self.log("fault %s (%s) not injected: %s" % (f.kind, f.origin, reason))
        return None

    def started(self):
        """Waits for the first training step; False (and the run is cut short) when none comes."""
        if self.wait(lambda: self.job.timeline.max_step > 0, READY_TIMEOUT):
            return True
        if self.job.alive():
            self.stuck = "the job did not start training within %.0f s" % READY_TIMEOUT
            self.log(self.stuck)
        return False

    def run_planned(self):
        pending = planned_groups(self.plan)
        while pending and self.job.alive():
            self.tick()
            t = now() - self.job.started
            due = [g for g in pending if (g.at_step is not None and self.job.timeline.max_step >= g.at_step) or
                   (g.at_time is not None and t >= g.at_time)]
            for g in due:
                pending.remove(g)
                if not self.fire(g):
                    break
            time.sleep(0.02)
        for g in pending:
            for f in g.faults:
                self.not_injected.append("%s (%s): the job ended first" % (f.kind, f.origin))

    def run_random(self, deadline=None):
        for g in random_groups(self.plan, self.rng):
            if deadline is not None and now() >= deadline:
                break
            self.wait(lambda: False, g.at_time)
            if not self.job.alive() or not self.fire(g):
                self.not_injected.append("%d random faults: the job ended or did not recover (%s)" % (
                    len(g.faults), (self.job.status or {}).get("phase")))
                break

    def finish_faults(self):
        while self.active:
            self.tick()
            time.sleep(0.02)


def execute(plan, build, workdir, log, duration=None, on_cluster=lambda: None):
    """Runs the plan; returns the result dict the report is made of."""
    workdir = os.path.abspath(workdir)
    os.makedirs(workdir, exist_ok=True)
    nranks = plan.nodes * plan.ranks_per_node
    log("golden run (%d ranks, no faults)..." % nranks)
    golden = golden_digests(plan, build) if plan.synthetic else golden_from_command(plan, build, workdir)
    job_id = "chaos-%d-%d" % (plan.seed, os.getpid())
    nodes = (SshNodes if plan.backend == "ssh" else NetnsNodes)(plan, workdir, build)
    run_dir = plan.run_dir or os.path.join(os.path.abspath(workdir), "run")
    r = Runner(plan, build, workdir, log)
    try:
        on_cluster()
        log("cluster: " + nodes.describe())
        cfg = job_config(plan, workdir, run_dir, nodes.persist_dir, job_id)
        cmd = [os.path.join(build, "ftrun-synthetic")] + trainer_args(plan) if plan.synthetic else plan.command
        argv = [os.path.join(build, "ftrun")] + nodes.node_args() + ["--config", cfg, "--no_python",
                                                                       "--no_local_rank"] + nodes.runner_args() + cmd
        env = nodes.env(os.environ)
        r.job = RunningJob(argv, env, run_dir, job_id, cfg, workdir)
        r.ctx = faultlib.Context(plan, r.job, nodes, os.path.join(build, "ftrun"))
        deadline = r.job.started + plan.timeout
        if r.started():
            if plan.faults:
                r.run_planned()
            if plan.random and not r.stuck:
                r.run_random(None if duration is None else r.job.started + duration)
        r.finish_faults()
        code = r.job.wait(now() if r.stuck else deadline)
        if r.stuck:
            code = "stuck"
        r.job.close()
        log("job ended: exit %s" % code)
        return run_result(plan, r, golden, code, nodes, job_id, nranks, duration, os.path.join(build, "ftrun"),
                          plan.command or ["ftrun-synthetic"] + trainer_args(plan))
    finally:
        if r.job is not None:
            r.job.stop()
        nodes.teardown()


def scaled(plan, faults=None, duration=None):
    """--faults N / --duration D: a copy of the plan with N random faults (or faults until D has passed) and
    enough training steps for them."""
    p = copy.deepcopy(plan)
    if faults is None and duration is None:
        return p
    if not p.random:
        raise RunError("%s has no 'random' section: --faults and --duration need one" % plan.path)
    if faults is not None:
        base = p.random["count"]
        p.random["count"] = faults
        if p.synthetic:
            p.synthetic["steps"] = max(p.synthetic["steps"], p.synthetic["steps"] * faults // max(1, base))
    if duration is not None:
        p.random["count"] = 10 ** 9 if faults is None else p.random["count"]
        if p.synthetic:
            per_s = 1000.0 / max(1, p.synthetic["step_ms"])
            p.synthetic["steps"] = max(p.synthetic["steps"], int(duration * per_s * 1.5))
        p.timeout = max(p.timeout, duration * 3 + 300)
    return p
