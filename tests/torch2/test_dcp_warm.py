"""dcp.async_save with the process checkpointer, into ftrun, across a warm
recovery (tests/torch2/py_dcp_warm_rank.py: 3 ranks on one node under
@ftrun.resilient, gloo, CPU). A rank SIGKILLs itself mid-run; the survivors
keep their processes, and each rank's DCP background process (kept by DCP for
the life of its rank, in a process group of its own) must not: the survivors'
new saves come from new background processes, whose writers connect to the
agent anew. Every rank of the new generation loads the restored version
through ftrun.dcp equal to the state it saved, the survivors warm, and the
job's saves go on to the last step.
Skips visibly where the ranks' Python has torch < 2.6."""
import collections
import os
import re

from torch2_lib import ScriptJob, require_torch2

HERE = os.path.dirname(os.path.abspath(__file__))
RANK_SCRIPT = os.path.join(HERE, "py_dcp_warm_rank.py")
WORLD, STEPS, KILLER = 3, 10, 1
CONFIG = ("job:\n  max_restarts: 2\n  stop_grace: 2s\nstore:\n  memory_budget: 64MiB\n  chunk_size: 64KiB\n"
          "restart:\n  warm_standbys: 0\n  abort_timeout: 20s\n")
GEN_RE = re.compile(r"^GEN (\d+) (\d+) warm=(\d) restored=(-?\d+) equal=(\d)$", re.M)
WRITER_RE = re.compile(r"pid (\d+) writes for rank (\d+)")


def test_process_checkpointer_across_warm_recovery(check):
    version = require_torch2("dcp.async_save's process checkpointer", 6,
                             "from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType; "
                             "AsyncCheckpointerType.PROCESS")
    job = ScriptJob(RANK_SCRIPT, [], nodes=1, per_node=WORLD, config=CONFIG)
    rc = job.wait(timeout=300)
    print(f"torch {version}: exit {rc}", flush=True)
    print("\n".join(l for l in job.log.splitlines() if l.startswith(("GEN ", "DONE ")) or "writes for rank" in l
                    or "ftrun.dcp" in l), flush=True)
    check(rc == 0, f"runner exit {rc}\n{job.log[-6000:]}")
    gens = {(int(r), int(g)): (int(w), int(v), int(e)) for r, g, w, v, e in GEN_RE.findall(job.log)}
    later = {r: gens.get((r, 1)) for r in range(WORLD)}
    check(all(later.values()), f"every rank ran generation 1: {sorted(gens)}\n{job.log[-3000:]}")
    if not all(later.values()):
        return
    restored = {v for _, v, _ in later.values()}
    check(len(restored) == 1 and min(restored) >= 0, f"every rank restored one version: {later}")
    check(all(e == 1 for _, _, e in later.values()),
          f"every rank's dcp.load of the restored version equals the state it saved: {later}")
    check([r for r in range(WORLD) if later[r][0] == 1] == [r for r in range(WORLD) if r != KILLER],
          f"the survivors ran generation 1 in their processes (warm), the killed rank in a new one: {later}")
    done = set(re.findall(r"^DONE (\d+) 1$", job.log, re.M))
    check(done == {str(r) for r in range(WORLD)}, f"every rank saved to the last step: {sorted(done)}")
    check(f"last committed version {STEPS - 1}" in job.log,
          f"version {STEPS - 1} (the last step's saves, by the new background processes) committed")
    # Each rank's background process connects as its writer, once per process: a survivor's second one is the
    # background process of generation 1.
    writers = collections.defaultdict(list)
    for pid, r in WRITER_RE.findall(job.log):
        if pid not in writers[int(r)]:
            writers[int(r)].append(pid)
    check(all(len(writers[r]) == 2 for r in range(WORLD)),
          f"every rank had one writer per generation (its background process's): {dict(writers)}")
