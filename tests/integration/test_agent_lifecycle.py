"""The agent's contract with its ranks: the environment each rank gets
(DeepSpeed's and torchrun's variables, a fresh MASTER_PORT per restart),
--world_info from DeepSpeed's launcher, whole process trees stopped, and
SIGTERM to the agent ending the job with 128+15."""
import base64
import json
import os
import signal
import time

from ftrun_testlib import Job


def test_rank_environment(check, scratch):
    """Node 1 of a 2-node DeepSpeed world {a: [0, 1], b: [2, 3, 5]}: each rank's variables, and a fresh
    MASTER_PORT and restart count after a restart."""
    world = base64.urlsafe_b64encode(json.dumps({"a": [0, 1], "b": [2, 3, 5]}).encode()).decode()
    out = scratch("ftrun-env-")
    script = (f'env > "{out}/env.$RANK.$TORCHELASTIC_RESTART_COUNT"; '
              'if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 3 ]; then exit 5; fi')
    job = Job(3, [], "job:\n  max_restarts: 1\n", extra=["--world_info", world, "--node_rank", "1",
                                                        "--master_port", "31000"],
              command=["/bin/sh", "-c", script])
    rc = job.wait(timeout=60)
    check(rc == 0, f"env job exit {rc}\n{job.log[-2000:]}")

    def env_of(rank, gen):
        try:
            with open(os.path.join(out, f"env.{rank}.{gen}")) as f:
                return dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)
        except OSError:
            return {}

    e = env_of(3, 0)
    expect = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "5", "LOCAL_SIZE": "3", "CROSS_RANK": "1",
              "CROSS_SIZE": "2", "MASTER_PORT": "31000", "CUDA_VISIBLE_DEVICES": "2,3,5", "LOCAL_WORLD_SIZE": "3",
              "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "ROLE_RANK": "3", "ROLE_WORLD_SIZE": "5",
              "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "1", "TORCHELASTIC_RUN_ID": job.job_id,
              "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "FTRUN_RANK": "3", "FTRUN_JOB_ID": job.job_id}
    for k, v in expect.items():
        check(e.get(k) == v, f"rank 3 env {k}={e.get(k)!r}, want {v!r}")
    check(env_of(2, 1).get("LOCAL_RANK") == "0" and env_of(4, 1).get("LOCAL_RANK") == "2", "local ranks 0 and 2")
    e1 = env_of(3, 1)
    check(e1.get("TORCHELASTIC_RESTART_COUNT") == "1", "restart count 1 after the restart")
    check(e1.get("MASTER_PORT") == "31001", f"fresh MASTER_PORT after restart: {e1.get('MASTER_PORT')}")


def test_sigterm_stops_process_trees(check, scratch):
    """SIGTERM to the agent stops every rank's whole process tree, even parts that ignore SIGTERM (after
    job.stop_grace), and exits 128+15."""
    pids = scratch("ftrun-tree-")
    tree = f'trap "" TERM; sleep 300 & echo $! > {pids}/child.$RANK; echo $$ > {pids}/rank.$RANK; wait'
    job = Job(2, [], "job:\n  stop_grace: 1s\n", command=["/bin/sh", "-c", tree])
    deadline = time.time() + 30
    while time.time() < deadline and len(os.listdir(pids)) < 4:
        time.sleep(0.05)
    check(len(os.listdir(pids)) == 4, "both ranks started a child")
    time.sleep(0.2)
    job.proc.send_signal(signal.SIGTERM)
    rc = job.wait(timeout=30)
    check(rc == 128 + signal.SIGTERM, f"agent exit {rc} after SIGTERM, want 143")
    for name in os.listdir(pids):
        with open(os.path.join(pids, name)) as f:
            pid = int(f.read())
        check(not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z",
              f"{name} (pid {pid}) survived the agent's stop")
    check("did not stop within job.stop_grace" in job.log, "the SIGKILL after the grace period is logged")


def test_crashed_rank_child_does_not_survive(check, scratch):
    """A rank that dies leaving a child behind (a data-loader worker, say): the child must not outlive its
    generation."""
    orphan = scratch("ftrun-orphan-")
    script = (f'if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 0 ]; then '
              f'sleep 300 & echo $! > {orphan}/child; exit 1; fi; exit 0')
    job = Job(2, [], "job:\n  max_restarts: 1\n", command=["/bin/sh", "-c", script])
    rc = job.wait(timeout=60)
    check(rc == 0, f"orphan job exit {rc}\n{job.log[-2000:]}")
    with open(os.path.join(orphan, "child")) as f:
        child = int(f.read())
    alive = os.path.exists(f"/proc/{child}") and open(f"/proc/{child}/stat").read().split()[2] != "Z"
    check(not alive, f"the crashed rank's child (pid {child}) survived the restart")


def test_ranks_die_with_sigkilled_agent(check):
    """The agent SIGKILLed: its ranks must not run on without it (PDEATHSIG)."""
    job = Job(2, ["--state-bytes", "1MiB", "--steps", "100000", "--step-ms", "10"], "")
    st = job.wait_for(lambda s: all(r["pid"] for r in s["ranks"]) and s["committed_version"] is not None)
    pids = [r["pid"] for r in st["ranks"]] if st else []
    check(len(pids) == 2, "both ranks running")
    job.proc.send_signal(signal.SIGKILL)
    job.wait(timeout=30)
    deadline = time.time() + 10
    while time.time() < deadline and any(os.path.exists(f"/proc/{p}") for p in pids):
        time.sleep(0.05)
    check(not any(os.path.exists(f"/proc/{p}") for p in pids), f"ranks {pids} outlived their SIGKILLed agent")
