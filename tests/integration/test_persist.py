"""Lazy persistence to disk, with real agents, real ranks and real signals.

1. Whole job killed (agent and ranks SIGKILLed, the shared memory gone with
   them) at random points, many times, some in the middle of a flush; each
   time the job is started again with the same job.id and persist.dir and
   must resume from the newest complete version on disk. The run ends with
   every rank's digest equal to the failure-free run's, and no restore ever
   met a version that looked complete but did not verify.
2. A cluster (2 nodes x 2 ranks under the runner, a shared persist dir)
   killed whole and started again: resumes from disk, same digests.
3. A small tmpfs that fills up during a real run: training goes on from
   RAM, the flusher reports the failure and recovers when space returns.
4. Bad inputs: the same job id with another world size is refused with an
   error naming both sizes, and the versions on disk are left intact.
"""
import os
import random
import re
import signal
import subprocess
import tempfile
import time

from ftrun_testlib import RUNNER, ClusterJob, Job, check, digests, finish, golden, read_json

seed = int(os.environ.get("FTRUN_TEST_SEED", time.time()))
print("seed", seed, "(set FTRUN_TEST_SEED to replay)", flush=True)
rng = random.Random(seed)

ARGS = ["--steps", "60", "--state-bytes", "8MiB", "--tensors", "4", "--step-ms", "25"]
WANT = golden(2, ARGS)


def kill_all(pids):
    for pid in pids:
        if pid and pid > 0:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def restored_from_disk(log):
    return [line for line in log.splitlines() if "from disk" in line and "restored version" in line]


def bad_restores(log):
    return [line for line in log.splitlines() if "cannot be restored" in line or "no complete version" in line]


# --- 1. one node, killed whole again and again --------------------------
disk = tempfile.mkdtemp(prefix="ftrun-persist-")
job_id = "persist-%d" % rng.randrange(1 << 30)
config = ("job:\n  id: %s\nstore:\n  memory_budget: 128MiB\n  chunk_size: 1MiB\n"
          "persist:\n  dir: %s\n  every_versions: 2\n  every_seconds: 0s\n" % (job_id, disk))
kills = 0
resumed = []
for attempt in range(12):
    job = Job(2, ARGS, config=config, job_id=job_id)
    # Kill once a version is committed; anywhere in the flush cycle.
    st = job.wait_for(lambda s: (s.get("committed_version") or -1) >= 0 and s.get("persist"), timeout=60)
    if st is None or job.proc.poll() is not None:
        break  # it finished
    time.sleep(rng.uniform(0.0, 0.4))
    st = job.state() or st
    pids = [job.proc.pid] + [r.get("pid") for r in st.get("ranks", [])]
    kill_all(pids)
    kills += 1
    job.wait(30)
    resumed += restored_from_disk(job.log)
    check(not bad_restores(job.log), f"attempt {attempt}: no restore met an unverifiable version:\n" +
          "\n".join(bad_restores(job.log)))
job = Job(2, ARGS, config=config, job_id=job_id)
rc = job.wait(120)
resumed += restored_from_disk(job.log)
print(f"one node: {kills} whole-job kills; restores from disk: {len(resumed)}", flush=True)
for line in resumed[-3:]:
    print("   " + line[line.find("persist:"):], flush=True)
check(rc == 0, f"the last run exits 0 (got {rc})\n{job.log[-3000:]}")
check(digests(job.log) == WANT, f"one node: digests after {kills} kills equal the failure-free run's")
check(kills >= 3 and len(resumed) >= 2, f"several kills and restores from disk ({kills} kills, {len(resumed)} restores)")
check(not bad_restores(job.log), "the last run met no unverifiable version")
last = os.path.join(disk, job_id, "v%020d" % 60)
check(os.path.exists(os.path.join(last, "node0.COMPLETE")), "at the end the last committed version (60) is on disk")

# --- 4. the same job id with another world size --------------------------
other = Job(3, ARGS, config=config, job_id=job_id)
rc = other.wait(60)
check(rc == 2 and "world size" in other.log and "2" in other.log and "3" in other.log,
      f"another world size is refused with exit 2, naming both sizes (got {rc}):\n{other.log[-1500:]}")
job = Job(2, ["--steps", "60", "--state-bytes", "8MiB", "--tensors", "4"], config=config, job_id=job_id)
check(job.wait(60) == 0 and digests(job.log) == WANT and restored_from_disk(job.log),
      "after the refusal the versions on disk are intact: the right job resumes from them")

# --- 2. a cluster killed whole and started again -------------------------
disk2 = tempfile.mkdtemp(prefix="ftrun-persist-cl-")
cl_args = ["--steps", "80", "--state-bytes", "4MiB", "--tensors", "2", "--step-ms", "30"]
cl_want = golden(4, cl_args)
cl_config = ("job:\n  id: cl-%d\nstore:\n  memory_budget: 128MiB\n  chunk_size: 1MiB\n"
             "persist:\n  dir: %s\n  every_versions: 5\n" % (rng.randrange(1 << 30), disk2))
cl = ClusterJob(2, 2, cl_args, config=cl_config)
# Two complete versions (every 5th): the older one is the fallback when a
# chunk of the newer one turns out corrupt.
st = cl.wait_for(lambda s: all(((cl.agent_state(a) or {}).get("persist", {}).get("last_written_version") or 0) >= 10
                               for a in range(2)), timeout=90)
check(st is not None, "cluster: two versions reach disk")
out = subprocess.run([RUNNER, "status", "--run_dir", os.path.join(cl.dir, "run")], capture_output=True, text=True).stdout
print(out, flush=True)
check("disk +backlog" in out and re.search(r" v\d+ \+\d+", out), "ftrun status shows each node's newest version on disk "
      "and its backlog")
if st:
    pids = [cl.proc.pid]
    for a in range(len(st["agents"])):
        ast = cl.agent_state(a) or {}
        pids += [ast.get("agent_pid")] + [r.get("pid") for r in ast.get("ranks", [])]
    kill_all(pids)
cl.wait(30)
# A flipped bit in the newest chunk file on disk (written by the newest
# version only: older versions share the older chunk files).
chunks = [os.path.join(d, f) for d, _, fs in os.walk(disk2) for f in fs if "/chunks/" in d and ".tmp" not in f]
flipped = None
if check(len(chunks) > 0, "cluster: chunk files on disk"):
    flipped = max(chunks, key=os.path.getmtime)
    with open(flipped, "r+b") as f:
        f.seek(4096 + 100)
        b = f.read(1)
        f.seek(4096 + 100)
        f.write(bytes([b[0] ^ 0x10]))
cl = ClusterJob(2, 2, cl_args, config=cl_config)
rc = cl.wait(180)
check(rc == 0, f"cluster restarted: exit 0 (got {rc})\n{cl.log[-3000:]}")
check("the next older one on disk" in cl.log and os.path.basename(flipped or "?") in cl.log,
      "a corrupt chunk on disk: the node names the file and the job goes back to the next older version")
check(len(restored_from_disk(cl.log)) >= 2, "cluster restarted: both nodes restored their ranks from disk")
check("from the persist directory" in cl.log, "the coordinator restores the version on disk (no RAM copy left)")
check(digests(cl.log) == cl_want, "cluster restarted: digests equal the failure-free run's")

# --- 5. more nodes lost than the replicas cover: back to the disk --------
disk3 = tempfile.mkdtemp(prefix="ftrun-persist-loss-")
loss_args = ["--steps", "150", "--state-bytes", "4MiB", "--tensors", "2", "--step-ms", "25"]
loss_want = golden(4, loss_args)
loss_config = ("job:\n  id: loss-%d\n  max_restarts: 5\nstore:\n  memory_budget: 128MiB\n  chunk_size: 1MiB\n"
               "cluster:\n  replicas: 1\npersist:\n  dir: %s\n  every_versions: 4\n" % (rng.randrange(1 << 30), disk3))
lj = ClusterJob(4, 1, loss_args, config=loss_config)


def on_disk_everywhere(s):
    w = [(lj.agent_state(a) or {}).get("persist", {}).get("last_written_version") for a in range(4)]
    return all(x is not None for x in w) and (s.get("committed_version") or 0) >= max(w) + 3


st = lj.wait_for(on_disk_everywhere, timeout=120)
if check(st is not None, "two-node loss: versions reach disk on every node"):
    first = rng.randrange(4)
    victims = [first, (first + 1) % 4]  # a node and the holder of its copies (the next on the placement ring)
    print(f"committed {st['committed_version']}: SIGKILL nodes {victims} at once (replicas: 1)", flush=True)
    for n in victims:
        lj.kill_node(n)
rc = lj.wait(240)
check(rc == 0, f"two-node loss: the job ends well (exit {rc})\n{lj.log[-3000:]}")
check("the newest complete in the persist directory" in lj.log, "two-node loss: the coordinator goes back to the disk")
back = [line for line in lj.log.splitlines() if "steps lost" in line]
print("   " + (back[0][back[0].find("ranks"):] if back else "no line"), flush=True)
check(digests(lj.log) == loss_want, "two-node loss: digests equal the failure-free run's")

# --- 3. a tmpfs that fills up --------------------------------------------
mnt = tempfile.mkdtemp(prefix="ftrun-tmpfs-")
mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", mnt], capture_output=True).returncode == 0
if not mounted:
    print("SKIPPED part 3: cannot mount a tmpfs here (not root?)", flush=True)
else:
    try:
        filler = os.path.join(mnt, "filler")
        with open(filler, "wb") as f:
            f.write(b"\0" * (16 << 20))  # 8 MiB left: one version of 2 x 4 MiB does not fit with its headers
        fill_args = ["--steps", "400", "--state-bytes", "4MiB", "--tensors", "2", "--step-ms", "20"]
        fill_want = golden(2, fill_args)
        fill_config = ("job:\n  id: fill-%d\nstore:\n  memory_budget: 64MiB\n  chunk_size: 1MiB\n"
                       "persist:\n  dir: %s\n  every_versions: 1\n  keep: 1\n" % (rng.randrange(1 << 30), mnt))
        job = Job(2, fill_args, config=fill_config)
        st = job.wait_for(lambda s: (s.get("persist") or {}).get("failures_in_a_row", 0) > 0, timeout=60)
        check(st is not None and "space" in (st.get("persist") or {}).get("last_error", "").lower(),
              f"full disk: the status shows the flusher failing with ENOSPC ({(st or {}).get('persist')})")
        v = (st or {}).get("committed_version") or 0
        st = job.wait_for(lambda s: (s.get("committed_version") or 0) >= v + 20, timeout=60)
        check(st is not None, "full disk: training goes on (20 more versions committed)")
        os.unlink(filler)
        st = job.wait_for(lambda s: (s.get("persist") or {}).get("failures_in_a_row", 1) == 0 and
                          (s.get("persist") or {}).get("last_written_version") is not None, timeout=90)
        check(st is not None, "space back: the flusher writes again")
        rc = job.wait(120)
        check(rc == 0 and digests(job.log) == fill_want, f"full disk: the run ends as the failure-free one (exit {rc})")
        check("works again" in job.log, "the log says the disk works again")
    finally:
        subprocess.run(["umount", "-l", mnt])

finish()
