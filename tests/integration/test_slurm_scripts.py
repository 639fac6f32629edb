"""integration/slurm/prolog.sh and epilog.sh, run the way slurmd runs them.

slurmd runs the prolog and epilog as root with SLURM_JOB_ID, SLURM_JOB_UID,
... set, in their own process group, and kills that group once the script
exits. The prolog's standby agent must survive that; ftrun-agents started
"by srun" (here by the local runner, with the job's SLURM_JOB_ID in their
environment) must attach to it, so the agents and ranks run under the
standby, print to the attached process's output, and return their exit code
through it; signals to the attached process reach the agent; a killed step
stops its agent; and the epilog stops everything and removes the job's files.
"""
import os
import random
import signal
import subprocess
import time

from ftrun_testlib import AGENT, SOURCE, ClusterJob, Job, digests, golden

PROLOG = os.path.join(SOURCE, "integration", "slurm", "prolog.sh")
EPILOG = os.path.join(SOURCE, "integration", "slurm", "epilog.sh")


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1].split()[0] != "Z"
    except OSError:
        return False


def parent(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().split(") ")[1].split()[1])


def wait_dead(pids, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    return not any(alive(p) for p in pids)


def test_prolog_attach_epilog(check, scratch):
    """The prolog's standby survives slurmd's kill of its process group; agents started "by srun" attach to
    it (their output, exit code and signals go through the attached process, a killed step stops its agent);
    the epilog stops everything and removes the job's files; without a standby the agent runs in place."""
    tmp = scratch("ftrun-slurm-")
    slurm_job = str(random.randrange(10**6, 10**7))
    env = dict(os.environ, SLURM_JOB_ID=slurm_job, SLURM_JOB_UID=str(os.getuid()), SLURM_JOB_GID=str(os.getgid()),
               SLURM_JOB_NODELIST="localhost", SLURM_JOB_NUM_NODES="1", SLURM_JOB_GPUS="",
               FTRUN_SLURM_CONF="/nonexistent", FTRUN_AGENT=AGENT, FTRUN_STANDBY_DIR=tmp + "/standby",
               FTRUN_EPILOG_WAIT="30")
    pid_file = f"{tmp}/standby/slurm-{slurm_job}.pid"
    sock = f"{tmp}/standby/slurm-{slurm_job}.sock"
    log_file = f"{tmp}/standby/slurm-{slurm_job}.log"

    def like_slurmd(script, context, extra=None):
        """Runs a prolog/epilog as slurmd does; returns (rc, output)."""
        e = dict(env, SLURM_SCRIPT_CONTEXT=context, **(extra or {}))
        p = subprocess.Popen(["bash", script], env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True, text=True)
        try:
            # A daemon that kept the script's stdout would hold this pipe open.
            out, _ = p.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            check(False, f"{os.path.basename(script)}: output pipe still open after 90 s (a daemon kept stdout?)")
        try:
            os.killpg(p.pid, signal.SIGKILL)  # what slurmd does to the script's process group
        except ProcessLookupError:
            pass
        print(f"--- {os.path.basename(script)} rc={p.returncode}\n{out}", flush=True)
        return p.returncode, out

    def standby_log():
        with open(log_file) as f:
            return f.read()

    # --- prolog --------------------------------------------------------------
    rc, out = like_slurmd(PROLOG, "prolog_slurmd", {"FTRUN_AGENT": "/nonexistent/ftrun-agent"})
    check(rc == 1 and "/nonexistent/ftrun-agent" in out, "prolog without an agent binary exits 1 and names the path")
    check(not os.path.exists(sock), "no standby socket after a failed prolog")

    rc, out = like_slurmd(PROLOG, "prolog_slurmd")
    check(rc == 0, f"prolog exits 0 (got {rc})")
    standby = int(open(pid_file).read()) if os.path.exists(pid_file) else 0
    check(standby > 0 and alive(standby), "the standby agent survives slurmd's kill of the prolog's process group")
    check(standby > 0 and os.getsid(standby) == standby, "the standby leads its own session (setsid)")
    check(os.stat(sock).st_mode & 0o077 == 0, "the standby socket is private to the job's user")

    rc, out = like_slurmd(PROLOG, "prolog_slurmd")
    check(rc == 0 and "already" in out, "a second prolog for the same job finds the standby and exits 0")
    check(int(open(pid_file).read()) == standby, "the first standby keeps running")

    # --- a job whose agents attach: 2 nodes x 2 ranks, a rank SIGKILLed ------
    args = ["--steps", "30", "--state-bytes", "8MiB", "--tensors", "3", "--step-ms", "20"]
    want = golden(4, args)
    job = ClusterJob(2, 2, args + ["--crash-at-step", "12", "--crash-rank", "1"], env=env)
    st = job.wait_for(lambda s: len(s.get("agents", [])) == 2 and all(
        (job.agent_state(i) or {}).get("agent_pid") for i in range(2)), timeout=60)
    if check(st is not None, "both agents report their pids"):
        for i in range(2):
            pid = job.agent_state(i)["agent_pid"]
            check(parent(pid) == standby, f"agent {i} (pid {pid}) runs under the standby, not under the runner")
    rc = job.wait()
    check(rc == 0, f"attached job exits 0 (got {rc})")
    check(digests(job.log) == want, "attached job: every rank's digest equals the failure-free run's")
    check("recovered from" in job.log, "the agents' output (a recovery) reaches the attached process's stdout")
    check(standby_log().count("started agent pid") == 2, "the standby started both agents")
    check(alive(standby), "the standby outlives the job")

    # --- the exit code comes back through the attached process ----------------
    j = Job(1, [], config="job:\n  max_restarts: 0\n", command=["/bin/sh", "-c", "exit 7"], env=env)
    check(j.wait(60) == 7, "an attached agent's exit code (the rank's 7) is the attached process's")

    # --- SIGTERM to the attached process reaches the agent --------------------
    long_args = ["--steps", "100000", "--state-bytes", "4MiB", "--step-ms", "20"]
    j = Job(2, long_args, env=env)
    st = j.wait_for(lambda s: all(r.get("pid") for r in s.get("ranks", [])) and len(s.get("ranks", [])) == 2)
    pids = [r["pid"] for r in st["ranks"]] if st else []
    j.proc.send_signal(signal.SIGTERM)
    check(j.wait(60) == 128 + signal.SIGTERM, "SIGTERM to the attached process: the agent stops, exit 143")
    check(wait_dead(pids), "SIGTERM: the ranks are gone")

    # --- slurmd kills a step: the standby stops that step's agent -------------
    j = Job(2, long_args, env=env)
    st = j.wait_for(lambda s: all(r.get("pid") for r in s.get("ranks", [])) and len(s.get("ranks", [])) == 2)
    pids = [r["pid"] for r in st["ranks"]] + [st.get("agent_pid") or 0] if st else []
    j.proc.kill()
    j.wait(30)
    check(wait_dead([p for p in pids if p > 0]), "a SIGKILLed attached process: its agent and ranks are stopped")
    check("went away" in standby_log(), "the standby says why it stopped that agent")

    # --- epilog while a job runs ----------------------------------------------
    job = ClusterJob(1, 2, long_args, env=env)
    st = job.wait_for(lambda s: s.get("agents") and s["agents"][0].get("pid"), timeout=60)
    agent = st["agents"][0]["pid"] if st else 0
    time.sleep(1)
    run_dir = os.path.join(job.dir, "run")
    check(any(n.startswith(f"slurm-{slurm_job}-") for n in os.listdir(run_dir)),
          "the runner names the job after SLURM_JOB_ID in the run dir")
    rc, out = like_slurmd(EPILOG, "epilog_slurmd", {"FTRUN_RUN_DIR": run_dir})
    check(rc == 0 and "stopped" in out, "epilog exits 0 and says it stopped the standby")
    check(not alive(standby), "the epilog stops the standby")
    check(agent > 0 and wait_dead([agent], 10), "the epilog stops the running job's agent")
    rc = job.wait(60)
    check(rc != 0, f"the runner of the stopped job ends with an error (got {rc})")
    check(not os.path.exists(sock) and not os.path.exists(pid_file), "the epilog removes the socket and the pid file")
    check(not any(n.startswith(f"slurm-{slurm_job}-") for n in os.listdir(run_dir)),
          "the epilog removes the job's files from the run dir")

    rc, out = like_slurmd(EPILOG, "epilog_slurmd", {"FTRUN_RUN_DIR": run_dir})
    check(rc == 0 and "no standby" in out, "an epilog with no standby exits 0")

    # --- without a standby, ftrun-agent runs in place -------------------------
    j = Job(1, ["--steps", "3", "--state-bytes", "1MiB"], env=env)
    check(j.wait(60) == 0 and len(digests(j.log)) == 1, "no standby socket: ftrun-agent runs the job itself")
