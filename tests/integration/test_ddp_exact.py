"""torch's DistributedDataParallel under ftrun, killed twice, ends bit-identical
to the run without failures: integration/examples/train_ddp.py (nanoGPT's way:
tied weights, dropout, gradient accumulation toggling
require_backward_grad_sync, AdamW, ftrun.save every step) on 2 local nodes x 2
ranks and a spare, with gloo. For each DDP configuration, a failure-free run
gives the golden losses and weights (configurations that differ only in how
they recover - --wrap-first, --resilient - share one, and its seed); then a rank is SIGKILLed mid-run and,
after the restart, a whole node (agent and ranks). Every step's last loss and
every rank's final weights must equal the golden run's, bit for bit. The
same under warm recovery (train_ddp.py --resilient: the survivors keep their
processes and ftrun.restore puts the version back in place; the Lightning
Trainer's and the Hugging Face Trainer's runs are warm too, and save with
overlap), and with
Lightning Fabric and a Lightning Trainer (each with DDPStrategy, and with
FSDPStrategy in lit-gpt's configuration saving sharded state dicts), a
Hugging Face Trainer and an accelerate loop (integration/examples/
train_fabric.py, train_lightning.py, train_hf.py, train_accelerate.py), and
DCP's own calls into ftrun (train_ddp.py --dcp dcp_process: dcp.async_save
with the process checkpointer, dcp.load, warm).

Without ftrun.ddp_buckets (FTRUN_DDP_BUCKETS=0) the DDP built after each
restart reduces its first step in DDP's start bucket layout instead of the
rebuilt one, and the losses drift from there on.

CI runs every configuration but two, which run with FTRUN_SOAK=1, outside
CI's time: wrap_first (a DDP built before ftrun.load, cold; a DDP that exists
before the restore is in CI through Fabric, which builds it first, warm, the
survivors' DDPs, and tests/unit_py/test_ddp_buckets.py) and
lightning_fsdp_sharded (the Trainer's FSDP saved as the strategy's sharded
state dicts; sharded state dicts are in CI through fabric_fsdp and
tests/torch2/test_fsdp.py)."""
import os
import re
import time

import pytest

from ftrun_testlib import SOURCE, ScriptClusterJob, seeded_rng

EXAMPLES = os.path.join(os.path.abspath(SOURCE), "integration", "examples")
NODES, PER_NODE = 2, 2
WORLD = NODES * PER_NODE
STEPS = 16
# (heartbeat_misses: two jobs of four ranks and their standbys share two cores here; a node is lost after 5 s of
# silence, not 2 s: a killed node is found by its agent's death anyway)
CONFIG = ("job:\n  max_restarts: 4\n  stop_grace: 2s\nstore:\n  memory_budget: 64MiB\n  chunk_size: 64KiB\n"
          "cluster:\n  heartbeat_misses: 25\n")
LOSS_RE = re.compile(r"^LOSS (\d+) (\S+)$", re.M)
WEIGHTS_RE = re.compile(r"^WEIGHTS (\d+) ([0-9a-f]{64})$", re.M)
RESUMED_RE = re.compile(r"^RESUMED (\d+) (\d+)$", re.M)
WARM_RE = re.compile(r"generation \d+: \d+ ranks \((\d+) resumed in their processes")

# DDP's configurations (the bucket rebuild differs between them), and Lightning Fabric's DDP.
CONFIGS = {
    "default": ("train_ddp.py", []),                    # one rebuild after the first synced step
    "find_unused": ("train_ddp.py", ["--find-unused"]),  # never rebuilds
    "static_graph": ("train_ddp.py", ["--static-graph", "--accum", "1"]),  # after its second step; no no_sync
    "wrap_first": ("train_ddp.py", ["--wrap-first"]),   # the DDP exists before ftrun.load
    "warm": ("train_ddp.py", ["--resilient"]),          # @ftrun.resilient: survivors restored in place
    "fabric": ("train_fabric.py", []),                  # Lightning Fabric's DDPStrategy: also built before
    "fabric_fsdp": ("train_fabric.py", ["--fsdp"]),      # its FSDPStrategy (lit-gpt's), sharded state dicts
    # A transformers Trainer (DDP through accelerate), under @ftrun.resilient.
    "huggingface": ("train_hf.py", ["--resilient", "--overlap"]),
    # A Lightning Trainer, resumed mid-epoch, and its FSDPStrategy (lit-gpt's), sharded state dicts: both under
    # @ftrun.resilient (the survivors of a rank kill fit again in their processes; the node kill's ranks start
    # in fresh processes, as in a cold restart), saving with overlap.
    "lightning": ("train_lightning.py", ["--resilient", "--overlap"]),
    "lightning_fsdp": ("train_lightning.py", ["--fsdp", "--resilient", "--overlap"]),
    # The same saving the strategy's sharded state dicts (Checkpoint(fsdp="sharded")) instead of FSDP's local
    # shards (the default, above).
    "lightning_fsdp_sharded": ("train_lightning.py", ["--fsdp", "--resilient", "--overlap", "--fsdp-save", "sharded"]),
    "accelerate": ("train_accelerate.py", []),          # an accelerate loop: ftrun.accelerate.save_state/load_state
    # DCP's own calls into ftrun (ftrun.dcp): dcp.async_save with the process checkpointer, dcp.load, warm; each
    # survivor's DCP background process goes with its generation, the next one's writer connects anew.
    "dcp_process": ("train_ddp.py", ["--resilient", "--dcp", "dcp_process"]),
}


SOAK_ONLY = {"wrap_first", "lightning_fsdp_sharded"}


# Flags that change how a run recovers, not what it computes: configurations that differ only in them share
# one failure-free run (and its seed): CI time.
RECOVERY_ONLY = {"--wrap-first", "--resilient", "--overlap"}
SAVE_ONLY = {"--fsdp-save", "--dcp"}  # (with a value: how the state is saved, not what it is)
GOLDEN = {}  # (script, the arguments that change the math) -> (seed, exit code, log)


def golden_key(name):
    script, extra = CONFIGS[name]
    kept, skip = [], False
    for x in extra:
        if not skip and x not in RECOVERY_ONLY and x not in SAVE_ONLY:
            kept.append(x)
        skip = x in SAVE_ONLY
    return script, tuple(kept)


def job(name, args):
    script, extra = CONFIGS[name]
    return ScriptClusterJob(os.path.join(EXAMPLES, script), ["--steps", str(STEPS)] + extra + args, NODES,
                            PER_NODE, CONFIG, prefix="ftrun-ddp-", ports=6, spares=1)


def losses(log):
    return {int(s): v for s, v in LOSS_RE.findall(log)}  # the last one printed for each step


def weights(log):
    return {int(r): d for r, d in WEIGHTS_RE.findall(log)}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_ddp_killed_twice_ends_bit_identical(check, name):
    if name in SOAK_ONLY and os.environ.get("FTRUN_SOAK") != "1":
        pytest.skip("a DDP built before ftrun.load, cold: FTRUN_SOAK=1 runs it (CI time)")
    rng = seeded_rng()
    shared = GOLDEN.get(golden_key(name))  # (a configuration computing the same ran it already)
    args = ["--seed", str(shared[0] if shared else rng.randrange(1 << 20))]
    # The failure-free run beside the one killed (each its own agents and ports): CI time. Its results are
    # read at the end.
    golden = None if shared else job(name, args)
    t0 = time.time()
    run = job(name, args + ["--step-ms", "60"])
    # 0: the version saved right after DDP's first step (static_graph: see the README's DDP section)
    first = rng.randrange(1 if name == "static_graph" else 0, 5)
    victim = rng.randrange(WORLD)
    killed, st = run.kill_after_commits(victim, first, rng, timeout=120)
    check(killed is not None, f"rank {victim} SIGKILLed after version {first} (status {st})")
    print(f"{name}: SIGKILLed rank {victim} with version {killed and killed[1]} committed "
          f"({time.time() - t0:.1f} s)", flush=True)
    st = run.wait_for(lambda s: s.get("phase") == "running" and (s.get("restarts") or 0) >= 1
                      and (s.get("committed_version") or -1) >= first + 4, timeout=120)
    node = rng.randrange(NODES)
    check(st is not None and run.kill_node(node), f"node {node} killed whole after the restart (status {st})")
    print(f"{name}: killed node {node} with version {st and st.get('committed_version')} committed "
          f"({time.time() - t0:.1f} s)", flush=True)
    rc = run.wait(timeout=240)
    if shared is None:
        shared = GOLDEN[golden_key(name)] = (int(args[1]), golden.wait(timeout=240), golden.log)
    _, golden_rc, golden_log = shared
    print(f"{name}: both runs ended ({time.time() - t0:.1f} s)", flush=True)
    want_loss, want_weights = losses(golden_log), weights(golden_log)
    assert golden_rc == 0 and sorted(want_loss) == list(range(STEPS)) and len(set(want_weights.values())) == 1 \
        and sorted(want_weights) == list(range(WORLD)), f"failure-free run: exit {golden_rc}\n{golden_log[-4000:]}"
    st = run.state() or {}
    print(f"{name}: exit {rc} in {time.time() - t0:.1f} s, restarts {st.get('restarts')}, "
          f"resumed {RESUMED_RE.findall(run.log)}", flush=True)
    check(rc == 0, f"run with kills: exit {rc}\n{run.log[-4000:]}")
    check((st.get("restarts") or 0) >= 2, f"two restarts expected, status says {st.get('restarts')}")
    got_loss = losses(run.log)
    # The Trainer logs a step's loss after its callbacks' on_step_end, where ftrun saves it: a kill in between
    # leaves that step's loss unprinted, and the restart goes on after it (its weights are checked below).
    unprinted = {int(v) - 1 for _, v in RESUMED_RE.findall(run.log)} if name == "huggingface" else set()
    bad = [s for s in range(STEPS)
           if got_loss.get(s) != want_loss.get(s) and not (s in unprinted and s not in got_loss)]
    check(not bad, f"{name}: losses differ from the failure-free run at steps {bad}:\n" +
          "\n".join(f"  step {s}: {got_loss.get(s)} != {want_loss.get(s)}" for s in bad[:8]))
    check(weights(run.log) == want_weights, f"{name}: final weights {weights(run.log)} != {want_weights}")
    if "--resilient" in CONFIGS[name][1]:  # the rank kill's recovery kept the survivors' processes (not the node's)
        kept = [int(n) for n in WARM_RE.findall(run.log)]
        check(any(kept), f"warm: survivors resumed in their processes in some generation: {kept}")
