"""torch.distributed.checkpoint with ftrun.dcp's storage under the ftrun
runner (2 local nodes x 2 ranks, gloo, CPU processes, an FSDP2 model with
Adam; the ranks are tests/torch2/py_dcp_rank.py): dcp.save / dcp.load through
ftrun round-trip every local shard, the optimizer state and the param groups;
a checkpoint written to disk by plain DCP, loaded, saved into ftrun and loaded
back is equal; dcp.async_save (the thread checkpointer, on its own gloo group)
into ftrun while the next optimizer step runs loads back as the state was at
async_save; each rank stored about its local shard bytes, not the model.
Skips visibly where the ranks' Python has torch < 2.6."""
import os
import re

from torch2_lib import ScriptJob, require_torch2

HERE = os.path.dirname(os.path.abspath(__file__))
RANK_SCRIPT = os.path.join(HERE, "py_dcp_rank.py")
WORLD = 4
CONFIG = "job:\n  max_restarts: 0\n  stop_grace: 2s\nstore:\n  memory_budget: 64MiB\n  chunk_size: 64KiB\n"
OK_RE = re.compile(r"^DCP OK (\d+) (\d+) (\d+)$", re.M)


def test_dcp_round_trips(check, scratch):
    """DCP through ftrun, and plain DCP on disk -> ftrun -> back, on every rank."""
    version = require_torch2("torch.distributed.checkpoint with FSDP2", 6,
                             "import torch.distributed.checkpoint.state_dict; "
                             "from torch.distributed.fsdp import fully_shard")
    shared = scratch("ftrun-dcp-")
    job = ScriptJob(RANK_SCRIPT, [shared], config=CONFIG)
    rc = job.wait(timeout=180)
    print(f"torch {version}: exit {rc}", flush=True)
    # The ranks' own lines, and ftrun.dcp's reasons (dcp.load only logs a reader's exception).
    print("\n".join(l for l in job.log.splitlines() if l.startswith(("rank ", "DCP OK")) or "ftrun.dcp" in l),
          flush=True)
    check(rc == 0, f"runner exit {rc}\n{job.log[-6000:]}")
    ok = {int(r): (int(s), int(l)) for r, s, l in OK_RE.findall(job.log)}
    check(sorted(ok) == list(range(WORLD)), f"every rank reports DCP OK: {sorted(ok)}\n{job.log[-3000:]}")
    for r, (stored, local) in ok.items():
        # Rank 0 also holds the items DCP dedups onto one rank (scalars); bytes items are user bytes.
        check(stored <= local + (64 << 10), f"rank {r} stored {stored} bytes, its local shards are {local}")
