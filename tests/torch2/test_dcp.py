"""torch.distributed.checkpoint with ftrun.dcp's storage under the ftrun
runner (2 local nodes x 2 ranks, gloo, CPU processes, an FSDP2 model with
Adam; the ranks are tests/torch2/py_dcp_rank.py): dcp.save / dcp.load through
ftrun round-trip every local shard, the optimizer state and the param groups;
a checkpoint written to disk by plain DCP, loaded, saved into ftrun and loaded
back is equal; dcp.async_save (the thread checkpointer, on its own gloo group)
into ftrun while the next optimizer step runs loads back as the state was at
async_save; so does dcp.async_save with the process checkpointer, whose
background process (a child of the rank) saves as a writer of the rank; each
rank stored about its local shard bytes, not the model.
Then, with no agent running, the version the job wrote to its persist
directory loads through ftrun.dcp.PersistedReader onto 2 ranks (FSDP2) and
onto one process without a process group, and equals the saving job's
gathered state (resharding; tests/torch2/py_dcp_reshard.py).
Skips visibly where the ranks' Python has torch < 2.6."""
import collections
import os
import random
import re
import subprocess

from ftrun_testlib import BUILD, PY, free_port_range
from torch2_lib import ScriptJob, require_torch2

HERE = os.path.dirname(os.path.abspath(__file__))
RANK_SCRIPT = os.path.join(HERE, "py_dcp_rank.py")
RESHARD_SCRIPT = os.path.join(HERE, "py_dcp_reshard.py")
WORLD = 4
CONFIG = ("job:\n  id: %s\n  max_restarts: 0\n  stop_grace: 2s\nstore:\n  memory_budget: 64MiB\n  chunk_size: 64KiB\n"
          "persist:\n  dir: %s\n  every_versions: 1\n  keep: 6\n")
OK_RE = re.compile(r"^DCP OK (\d+) (\d+) (\d+)$", re.M)


def test_dcp_round_trips(check, scratch):
    """DCP through ftrun, and plain DCP on disk -> ftrun -> back, on every rank."""
    version = require_torch2("torch.distributed.checkpoint with FSDP2", 6,
                             "import torch.distributed.checkpoint.state_dict; "
                             "from torch.distributed.fsdp import fully_shard")
    shared = scratch("ftrun-dcp-")
    job_id = "dcp-%d" % random.randrange(1 << 30)
    persist_dir = os.path.join(shared, "persist")
    os.mkdir(persist_dir, 0o700)
    job = ScriptJob(RANK_SCRIPT, [shared], config=CONFIG % (job_id, persist_dir))
    rc = job.wait(timeout=180)
    print(f"torch {version}: exit {rc}", flush=True)
    # The ranks' own lines, and ftrun.dcp's reasons (dcp.load only logs a reader's exception).
    print("\n".join(l for l in job.log.splitlines() if l.startswith(("rank ", "DCP OK")) or "ftrun.dcp" in l),
          flush=True)
    check(rc == 0, f"runner exit {rc}\n{job.log[-6000:]}")
    ok = {int(r): (int(s), int(l)) for r, s, l in OK_RE.findall(job.log)}
    check(sorted(ok) == list(range(WORLD)), f"every rank reports DCP OK: {sorted(ok)}\n{job.log[-3000:]}")
    # The process checkpointer's saves came from DCP's background processes, each taken as a writer of its rank.
    # Two writer connections per rank: the background process's, kept across its two saves (a save's notices
    # get no answer that would break the next), and the probe's that lists and is refused a load.
    writers = collections.Counter(int(r) for r in re.findall(r"pid \d+ writes for rank (\d+)", job.log))
    check(writers == {r: 2 for r in range(WORLD)},
          f"every rank's background process saved as its writer on one connection: {dict(writers)}")
    for r, (stored, local) in ok.items():
        # Rank 0 also holds the items DCP dedups onto one rank (scalars); bytes items are user bytes.
        check(stored <= local + (64 << 10), f"rank {r} stored {stored} bytes, its local shards are {local}")

    # Resharding: the persisted version 1 onto 2 ranks, and onto one process, no agent running.
    full = os.path.join(shared, "full-1.pt")
    check(os.path.exists(full), "rank 0 wrote the gathered state of version 1")
    if rc != 0 or not os.path.exists(full):
        return
    for world in (2, 1):
        port = free_port_range(1)
        env = dict(os.environ, PYTHONPATH=os.path.join(os.path.abspath(BUILD), "python") + os.pathsep +
                   os.environ.get("PYTHONPATH", ""), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   WORLD_SIZE=str(world))
        procs = [subprocess.Popen([PY, RESHARD_SCRIPT, persist_dir, job_id, full], env=dict(env, RANK=str(r)),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for r in range(world)]
        outs = [p.communicate(timeout=180)[0] for p in procs]
        print(f"reshard onto {world}: exits {[p.returncode for p in procs]}\n" + "".join(outs)[-2000:], flush=True)
        check(all(p.returncode == 0 for p in procs) and f"RESHARD OK {world}" in outs[0],
              f"the persisted version 1 loads onto {world} rank(s) equal to the saving job's state:\n"
              + "".join(outs)[-4000:])
