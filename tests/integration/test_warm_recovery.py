"""Warm recovery with a real trainer: integration/examples/train_gpt.py under
@ftrun.resilient (--resilient: torch 1.13, gloo, ZeroRedundancyOptimizer,
dropout, ftrun.save every step, ftrun.restore in place) on 2 local nodes x 2
ranks. A failure-free run gives the golden losses and weights; then ranks
are SIGKILLed at random moments (in a step's collective, its save or its
sleep) again and again, a whole node is SIGKILLed with a spare node waiting,
a rank is SIGSTOPped inside a collective (a hang: its peers are released,
it is replaced), one rank raises, a second rank dies during a warm
recovery, and a node runs out of standbys. Every run must end bit-identical
to the failure-free one (every step's last loss, every rank's weights), the
survivors must keep their processes (PIDs), a dead rank's place must go to
a warm standby (a PID the agent started before the failure), and no process
may be left behind."""
import os
import signal
import time

import pytest

from ftrun_testlib import ScriptClusterJob, scratch
from test_train_gpt import LOSS_RE, SCRIPT, losses, seeds, weights  # noqa: F401 (seeds: a fixture)

NODES, PER_NODE = 2, 2
WORLD = NODES * PER_NODE
STEPS = 90
BASE_CONFIG = ("job:\n  max_restarts: 6\n  stop_grace: 2s\n  hang_timeout: %s\n"
               "store:\n  memory_budget: 64MiB\n  chunk_size: 64KiB\n"
               "restart:\n  abort_timeout: 5s\n  warm_standbys: %s\n")


class WarmJob(ScriptClusterJob):
    def __init__(self, model_seed, extra=(), standbys="auto", hang_timeout="60s", spares=0, step_ms=60):
        self.hold_file = os.path.join(scratch("ftrun-warm-hold-"), "hold")
        args = ["--steps", str(STEPS), "--seed", str(model_seed), "--backend", "gloo", "--resilient",
                "--step-ms", str(step_ms), "--hold-file", self.hold_file, *extra]
        super().__init__(SCRIPT, args, NODES, PER_NODE, BASE_CONFIG % (hang_timeout, standbys),
                         prefix="ftrun-warm-", ports=12, spares=spares)
        self.seen = set()  # every rank and standby pid seen: none may outlive the job

    def hold(self, on):
        """Training waits after its step while on (the trainer's --hold-file): standbys start up meanwhile
        (each imports torch: seconds, more on a loaded machine) and the job cannot run out of steps before
        the next failure is injected. Below the hang timeout: a held rank makes no progress."""
        if on:
            open(self.hold_file, "w").close()
        elif os.path.exists(self.hold_file):
            os.unlink(self.hold_file)

    def agents(self):
        st = self.state() or {}
        return [self.agent_state(a) or {} for a in range(len(st.get("agents", [])))]

    def rank_pids(self):
        """global rank -> pid of its live process."""
        out = {}
        for ast in self.agents():
            for r in ast.get("ranks", []):
                if r.get("pid") and not r.get("finished"):
                    out[r["rank"]] = r["pid"]
            self.seen.update((ast.get("warm_standbys") or {}).get("pids", []))
        self.seen.update(out.values())
        return out

    def standbys_ready(self):
        return [(ast.get("warm_standbys") or {}).get("ready", 0) for ast in self.agents() if ast.get("ranks")]

    def all_warm(self):
        """Every rank's process runs under the decorator (its control link is up) and every node has a
        ready standby: only then must the next failure's recovery be warm."""
        ranks = [r for ast in self.agents() for r in ast.get("ranks", []) if not r.get("finished")]
        return len(ranks) == WORLD and all(r.get("warm") for r in ranks) and min(self.standbys_ready() or [0]) >= 1

    def wait_running(self, restarts, after_version, gone=(), timeout=180):
        """Until the job runs generation `restarts` with all ranks stepping, a version newer than
        after_version committed, and none of the pids `gone` (killed ones: the restart count and a commit
        in flight can move before the agents' status files do) among the ranks; the rank pids then (None
        on a timeout)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            st = self.state() or {}
            pids = self.rank_pids()
            if (st.get("phase") == "running" and (st.get("restarts") or 0) >= restarts and len(pids) == WORLD
                    and (st.get("committed_version") or -1) > after_version and not set(gone) & set(pids.values())):
                return pids
            if self.proc.poll() is not None:
                return None
            time.sleep(0.02)
        return None

    def recoveries(self):
        """Every agent's recoveries (not the job's start)."""
        return [r for ast in self.agents() for r in ast.get("recoveries", []) if r.get("restart", 0) > 0]

    def left_behind(self):
        return sorted(p for p in self.seen if self.runs_script(p))

    def said_about(self, ranks, pids):
        """The run's log lines so far that name one of these ranks or pids: why a process changed."""
        with open(self.out.name, errors="replace") as f:
            lines = f.read().splitlines()
        words = [f"rank {r} " for r in ranks] + [f"rank {r}:" for r in ranks] + [f"pid {p}" for p in pids]
        return "\n".join(line for line in lines if any(w in line for w in words))[-6000:]


def committed(job):
    return (job.state() or {}).get("committed_version") or -1


class Golden:
    """The failure-free run, started at once and read when a test first compares with it: it runs beside the
    first test's run (CI time)."""

    def __init__(self, model_seed):
        self.job, self.result = WarmJob(model_seed), None

    def losses_and_weights(self):
        if self.result is None:
            job = self.job
            rc = job.wait(timeout=300)
            assert rc == 0, f"failure-free run under @ftrun.resilient: exit {rc}\n{job.log[-4000:]}"
            want_loss, want_weights = losses(job.log), weights(job.log)
            assert sorted(want_loss) == list(range(STEPS)) and len(set(want_weights.values())) == 1 and \
                sorted(want_weights) == list(range(WORLD)), f"golden run incomplete:\n{job.log[-3000:]}"
            self.result = want_loss, want_weights
        return self.result


@pytest.fixture(scope="module")
def golden(seeds):
    return Golden(seeds[2])


def check_end(check, job, rc, golden, what, hang=False):
    want_loss, want_weights = golden.losses_and_weights()
    killed = [line for line in job.log.splitlines() if line.endswith(": killed")]
    if killed:  # (why a survivor lost its process, for whoever reads a failure)
        print(f"{what}: the agents killed:\n  " + "\n  ".join(killed), flush=True)
    check(rc == 0, f"{what}: runner exit {rc}\n{job.log[-5000:]}")
    # (A process that does not exit after its last step, e.g. a left process group's destructor waiting
    # on a dead peer, is found only by the hang timeout: the run still ends right, a minute late.)
    check(hang or "hung: no progress" not in job.log, f"{what}: a rank hung\n{job.log[-5000:]}")
    got = losses(job.log)
    bad = [s for s in range(STEPS) if got.get(s) != want_loss.get(s)]
    check(not bad, f"{what}: losses differ from the failure-free run at steps {bad}")
    check(weights(job.log) == want_weights, f"{what}: final weights {weights(job.log)} != {want_weights}")
    time.sleep(0.5)
    check(not job.left_behind(), f"{what}: processes left behind: {job.left_behind()}")
    if not bad and weights(job.log) == want_weights:
        again = sorted({int(s) for s, _ in LOSS_RE.findall(job.log) if
                        len([1 for t, _ in LOSS_RE.findall(job.log) if t == s]) > 1})
        print(f"{what}: bit-identical to the failure-free run (steps run again: {again or 'none'})", flush=True)


def kill_mid_step(job, rank, rng, sig=signal.SIGKILL):
    time.sleep(rng.uniform(0.0, 0.08))
    pid = job.rank_pids().get(rank)
    if pid and job.runs_script(pid):
        os.kill(pid, sig)
    return pid


def test_repeated_rank_kills(check, seeds, golden):
    """Three SIGKILLs of ranks at random moments (rank 0 first, then random ones): every survivor keeps its
    process, every dead rank's place goes to a warm standby, every recovery is warm, every later generation
    meets at the runner's rendezvous store (the same process throughout), and the run ends bit-identical."""
    seed, rng, model_seed = seeds
    print("seed", seed, "(FTRUN_TEST_SEED replays)", flush=True)
    job = WarmJob(model_seed, step_ms=200)  # (a used standby is replaced once the recovery is over: seconds)
    pids = job.wait_running(0, rng.randrange(2, 6))
    check(pids is not None, f"the job never ran:\n{job.log[-3000:]}")
    first_store = (job.state() or {}).get("rendezvous_store") or {}
    for n in range(1, 4):
        if pids is None:
            break
        job.hold(True)
        deadline = time.time() + 45  # the standbys of the previous kill are up (each imports torch: seconds)
        while not job.all_warm() and time.time() < deadline:
            time.sleep(0.05)
        check(job.all_warm(), f"kill {n}: every rank warm and a standby ready on every node within 45 s")
        victim = 0 if n == 1 else rng.randrange(WORLD)  # rank 0 once: the store must not go with it
        job.hold(False)
        killed = kill_mid_step(job, victim, rng)
        check(killed is not None, f"kill {n}: rank {victim} was running")
        standbys_before = set(job.seen)
        after = committed(job)
        print(f"kill {n}: rank {victim} (pid {killed}) with version {after} committed", flush=True)
        new = job.wait_running(n, after, gone=[killed])
        check(new is not None, f"kill {n}: the job did not run again:\n{job.log[-3000:]}")
        if new is None:
            break
        same = {r: (pids[r], new[r]) for r in range(WORLD) if r != victim and pids[r] != new[r]}
        check(not same, f"kill {n}: survivors changed processes (rank: old, new pid): {same}; what the run said "
                        f"about them:\n{job.said_about(same, [p for both in same.values() for p in both])}")
        check(new[victim] != killed and new[victim] in standbys_before,
              f"kill {n}: rank {victim}'s new pid {new[victim]} is not a standby started before the kill")
        pids = new
    deadline = time.time() + 15  # an agent's status file may still name the previous generation's store
    while True:
        store = (job.state() or {}).get("rendezvous_store") or {}
        used = {ast.get("rendezvous_store") for ast in job.agents()}
        if used == {store.get("address")} or time.time() > deadline:
            break
        time.sleep(0.1)
    check(store.get("pid") == first_store.get("pid") and store.get("address") and used == {store["address"]},
          f"every later generation meets at the runner's store, which no kill took down: {first_store} -> "
          f"{store}, agents' {used}")
    check(store.get("address") != first_store.get("address"),
          f"each generation at a store of its own (torch 2.x puts no per-generation prefix on the keys): "
          f"{first_store} -> {store}")
    check(store.get("pid") not in job.seen, f"the rendezvous store's pid {store.get('pid')} is a rank's")
    rc = job.wait(timeout=300)
    time.sleep(0.5)
    check(not store.get("pid") or not os.path.exists(f"/proc/{store['pid']}"),
          f"the rendezvous store (pid {store.get('pid')}) outlived the job")
    kinds = [r.get("kind") for r in job.recoveries()]
    # (A standby not back yet when a kill comes makes a recovery mixed: never cold, the survivors stay.)
    restarts = sorted({r.get("restart") for r in job.recoveries()})
    check(restarts == [1, 2, 3] and kinds[0] == "warm" and "cold" not in kinds, f"recoveries: {restarts} {kinds}")
    check_end(check, job, rc, golden, "three rank kills")


def test_node_killed_with_spare(check, seeds, golden):
    """A whole node SIGKILLed (its agent, ranks and standbys): the spare node takes its ranks with its own
    standbys, the other node's ranks keep their processes, and the run ends bit-identical."""
    _, rng, model_seed = seeds
    job = WarmJob(model_seed, standbys=PER_NODE, spares=1, step_ms=300)  # (6 standbys start up meanwhile)
    pids = job.wait_running(0, 1)
    check(pids is not None, f"the job never ran:\n{job.log[-3000:]}")
    if pids is not None:
        job.hold(True)
        deadline = time.time() + 45
        while len(job.standbys_ready()) < NODES or min(job.standbys_ready()) < PER_NODE or \
                (job.agents()[-1].get("warm_standbys") or {}).get("ready", 0) < PER_NODE:
            if time.time() > deadline:
                break
            time.sleep(0.05)
        spare_standbys = set(job.seen)
        job.hold(False)
        victim = rng.randrange(NODES)
        after = committed(job)
        check(job.kill_node(victim), f"node {victim} killed")
        print(f"killed node {victim} with version {after} committed", flush=True)
        new = job.wait_running(1, after, gone=[pids[r] for r in range(victim * PER_NODE, (victim + 1) * PER_NODE)])
        check(new is not None, f"the job did not run again:\n{job.log[-3000:]}")
        if new is not None:
            mine = range(victim * PER_NODE, (victim + 1) * PER_NODE)
            moved = {r: (pids[r], new[r]) for r in range(WORLD) if r not in mine and pids[r] != new[r]}
            check(not moved, f"the other node's ranks changed processes: {moved}")
            check(all(new[r] in spare_standbys for r in mine),
                  f"node {victim}'s ranks {[new[r] for r in mine]} are not the spare's standbys")
    rc = job.wait(timeout=300)
    check_end(check, job, rc, golden, "node killed, spare warm")


def test_hang_and_exception(check, seeds, golden):
    """One rank raises in its training function (its process stays and runs the next generation); later a
    rank is SIGSTOPped inside a collective: the hang is found, its peers leave their collective, it does not
    leave within restart.abort_timeout and is killed, and a standby takes its place."""
    _, rng, model_seed = seeds
    raiser = rng.randrange(WORLD)
    job = WarmJob(model_seed, extra=["--raise-at", f"{raiser}:8"], hang_timeout="15s", step_ms=20)
    pids = job.wait_running(0, 2)
    check(pids is not None, f"the job never ran:\n{job.log[-3000:]}")
    new = job.wait_running(1, 7) if pids else None
    check(new is not None and new == pids, f"after rank {raiser} raised, every process stays: {pids} -> {new}")
    if new:
        victim = rng.choice([r for r in range(WORLD) if r != raiser])
        after = committed(job)
        stopped = kill_mid_step(job, victim, rng, signal.SIGSTOP)
        later = job.wait_running(2, after, gone=[stopped], timeout=120)
        check(later is not None, f"the hang was not recovered:\n{job.log[-3000:]}")
        if later:
            moved = {r: (new[r], later[r]) for r in range(WORLD) if r != victim and new[r] != later[r]}
            check(not moved, f"survivors of the hang changed processes: {moved}")
            check(later[victim] != stopped, "the hung rank was replaced")
    rc = job.wait(timeout=300)
    check(f"rank {raiser} raised in its training function" in job.log, "the agent names the raise")
    check("restart.abort_timeout" in job.log, "the hung rank was killed at restart.abort_timeout")
    check_end(check, job, rc, golden, "raise, then a hang", hang=True)


def test_second_failure_and_no_standbys(check, seeds, golden):
    """No standbys (restart.warm_standbys: 0): a rank is killed, and a second rank is killed while the job
    recovers from the first. The dead ranks start cold, the survivors stay, the run ends bit-identical."""
    _, rng, model_seed = seeds
    job = WarmJob(model_seed, standbys=0)
    pids = job.wait_running(0, rng.randrange(2, 6))
    check(pids is not None, f"the job never ran:\n{job.log[-3000:]}")
    if pids:
        first, second = rng.sample(range(WORLD), 2)
        kill_mid_step(job, first, rng)
        time.sleep(rng.uniform(0.05, 0.3))  # the recovery is under way
        kill_mid_step(job, second, rng)
        print(f"killed rank {first}, then rank {second}", flush=True)
        new = job.wait_running(1, -1, gone=[pids[first], pids[second]])
        check(new is not None, f"the job did not run again:\n{job.log[-3000:]}")
        if new:
            stayed = [r for r in range(WORLD) if r not in (first, second) and new[r] == pids[r]]
            check(len(stayed) == WORLD - 2, f"the two survivors kept their processes: {pids} -> {new}")
    rc = job.wait(timeout=300)
    kinds = [r.get("kind") for r in job.recoveries()]
    check("mixed" in kinds or "cold" in kinds, f"with no standbys a dead rank starts cold: {kinds}")
    check_end(check, job, rc, golden, "second failure, no standbys")
