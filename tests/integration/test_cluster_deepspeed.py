"""Real DeepSpeed (0.19.8, CPU accelerator, gloo) on two nodes under the ftrun
runner: 2 nodes x 2 ranks and a spare, ZeRO-3 bf16, checkpointing every step
through ftrun.deepspeed.install(engine). A whole node is SIGKILLed (agent and
ranks); the spare pulls its shards from the replica, and every rank ends
bit-identical to the 4-rank failure-free run under DeepSpeed's own launcher.
"""
from deepspeed_real_lib import CONFIG, RANK, STEPS, check_golden, check_same, golden_runs  # noqa: F401
from ftrun_testlib import ScriptClusterJob, scratch, seeded_rng


def test_node_killed(check, golden_runs):
    """Two nodes x 2 ranks + a spare, ZeRO-3 bf16: a whole node SIGKILLed; the spare takes its place with the
    shards pulled from the replica, and the run ends bit-identical to the 4-rank golden run."""
    golden = golden_runs(3, "bf16", 4)
    if not check_golden(check, golden, 4):
        return
    rng = seeded_rng()
    job = ScriptClusterJob(RANK, ["3", "bf16", scratch("ftrun-dsr-node-"), str(STEPS), "--step-ms", "200"], 2, 2,
                           CONFIG, prefix="ftrun-dsr-", spares=1)
    after = rng.randrange(2, 7)
    st = job.wait_for(lambda s: s.get("phase") == "running" and (s.get("committed_version") or 0) >= after,
                      timeout=180)
    node = rng.randrange(2)
    killed = st is not None and job.kill_node(node)
    check(killed, f"node {node} SIGKILLed (status {st})")
    if killed:
        print(f"SIGKILLed node {node} with version {st['committed_version']} committed", flush=True)
    rc = job.wait(timeout=300)
    st = job.state() or {}
    check(rc == 0, f"runner exit {rc}\n{job.log[-4000:]}")
    check((st.get("restarts") or 0) >= 1, f"a restart: {st.get('restarts')}")
    check_same(check, golden[1], job.log, f"ZeRO-3 bf16, 2 nodes, node {node} killed")
