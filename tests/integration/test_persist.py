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
5. More nodes lost than the replicas cover: the job goes back to the disk.
6. A chunk file that rots on disk (one flipped bit) while the versions that
   reuse it are in RAM is repaired from RAM by the next write, so that a
   later restart restores the newest version rather than an older one.
"""
import os
import random
import re
import struct
import subprocess
import time

import pytest

from ftrun_testlib import RUNNER, ClusterJob, Job, digests, golden, kill_all

ARGS = ["--steps", "60", "--state-bytes", "8MiB", "--tensors", "4", "--step-ms", "25"]


@pytest.fixture(scope="module")
def rng():
    seed = int(os.environ.get("FTRUN_TEST_SEED", time.time()))
    print("seed", seed, "(set FTRUN_TEST_SEED to replay)", flush=True)
    return random.Random(seed)


def restored_from_disk(log):
    return [line for line in log.splitlines() if "from disk" in line and "restored version" in line]


def referenced_by(manifest, files):
    """The chunk files a manifest file references: it holds each chunk's hash
    as two u64 LE, low half first; the file name is the hex, high half first."""
    with open(manifest, "rb") as f:
        data = f.read()
    return [p for p in files if struct.pack("<QQ", int(os.path.basename(p)[16:], 16),
                                            int(os.path.basename(p)[:16], 16)) in data]


def bad_restores(log):
    return [line for line in log.splitlines() if "cannot be restored" in line or "no complete version" in line]


def log_of(job):
    with open(os.path.join(job.dir, "out.log"), errors="replace") as f:
        return f.read()


def wait_log(job, pattern, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = re.search(pattern, log_of(job))
        if m or job.proc.poll() is not None:
            return m
        time.sleep(0.05)
    return None


def complete_versions(job_dir):
    """The versions with this (only) node's COMPLETE marker, oldest first."""
    return sorted(int(n[1:]) for n in os.listdir(job_dir)
                  if re.fullmatch(r"v\d{20}", n) and os.path.exists(os.path.join(job_dir, n, "node0.COMPLETE")))


def chunk_files(job_dir):
    return [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(job_dir, "chunks"))
            for f in fs if re.fullmatch(r"[0-9a-f]{32}", f)]


def kill_job(job, st):
    kill_all([job.proc.pid] + [r.get("pid") for r in (st or {}).get("ranks", [])])
    job.wait(30)


def test_whole_job_killed_again_and_again(check, scratch, rng):
    """Sections 1 and 4: one node killed whole at random points (some in the middle of a flush) resumes each
    time from the newest complete version on disk and ends with the failure-free digests; then the same job id
    with another world size is refused, naming both sizes, and the versions on disk stay intact."""
    want = golden(2, ARGS)
    # --- 1. one node, killed whole again and again --------------------------
    disk = scratch("ftrun-persist-")
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
    check(digests(job.log) == want, f"one node: digests after {kills} kills equal the failure-free run's")
    check(kills >= 3 and len(resumed) >= 2,
          f"several kills and restores from disk ({kills} kills, {len(resumed)} restores)")
    check(not bad_restores(job.log), "the last run met no unverifiable version")
    last = os.path.join(disk, job_id, "v%020d" % 60)
    check(os.path.exists(os.path.join(last, "node0.COMPLETE")), "at the end the last committed version (60) is on disk")

    # --- 4. the same job id with another world size --------------------------
    other = Job(3, ARGS, config=config, job_id=job_id)
    rc = other.wait(60)
    check(rc == 2 and "world size" in other.log and "2" in other.log and "3" in other.log,
          f"another world size is refused with exit 2, naming both sizes (got {rc}):\n{other.log[-1500:]}")
    job = Job(2, ["--steps", "60", "--state-bytes", "8MiB", "--tensors", "4"], config=config, job_id=job_id)
    check(job.wait(60) == 0 and digests(job.log) == want and restored_from_disk(job.log),
          "after the refusal the versions on disk are intact: the right job resumes from them")


def test_cluster_killed_whole(check, scratch, rng):
    """Section 2: a cluster killed whole and started again resumes from disk (going back to the next older
    version when a chunk of the newest is corrupt) and ends with the failure-free digests."""
    disk2 = scratch("ftrun-persist-cl-")
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
    out = subprocess.run([RUNNER, "status", "--run_dir", os.path.join(cl.dir, "run")], capture_output=True,
                         text=True).stdout
    print(out, flush=True)
    check("disk +backlog" in out and re.search(r" v\d+ \+\d+", out),
          "ftrun status shows each node's newest version on disk and its backlog")
    if st:
        cl.kill_whole(st)
    cl.wait(30)
    # A flipped bit in a chunk file of the newest complete version that no older
    # complete version references (a version still being written when the
    # cluster was killed does not count: the restart never reads it).
    chunks = [os.path.join(d, f) for d, _, fs in os.walk(disk2) for f in fs if "/chunks/" in d and ".tmp" not in f]
    complete = sorted(d for d, _, fs in os.walk(disk2) if "node0.COMPLETE" in fs and "node1.COMPLETE" in fs)
    flipped = None
    if check(len(complete) >= 2, f"cluster: two complete versions on disk ({complete})"):
        older = set()
        for v in complete[:-1]:
            for r in range(4):
                older.update(referenced_by(os.path.join(v, "rank%d.manifest" % r), chunks))
        only_newest = [p for r in range(4)
                       for p in referenced_by(os.path.join(complete[-1], "rank%d.manifest" % r), chunks)
                       if p not in older]
        if check(only_newest, "cluster: the newest complete version has chunk files of its own"):
            flipped = only_newest[0]
    if flipped:
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


def test_more_nodes_lost_than_replicas_cover(check, scratch, rng):
    """Section 5: a node and the holder of its copies killed at once: the job goes back to the disk and ends
    with the failure-free digests."""
    disk3 = scratch("ftrun-persist-loss-")
    # Long enough (10 s of training) that every node has a version on disk well
    # before the end, even on a loaded 2-core machine.
    loss_args = ["--steps", "400", "--state-bytes", "4MiB", "--tensors", "2", "--step-ms", "25"]
    loss_want = golden(4, loss_args)
    loss_config = ("job:\n  id: loss-%d\n  max_restarts: 5\nstore:\n  memory_budget: 128MiB\n  chunk_size: 1MiB\n"
                   "cluster:\n  replicas: 1\npersist:\n  dir: %s\n  every_versions: 4\n"
                   % (rng.randrange(1 << 30), disk3))
    lj = ClusterJob(4, 1, loss_args, config=loss_config)

    def on_disk_everywhere(s):
        w = [lj.last_written(a) for a in range(4)]
        return all(x is not None for x in w) and (s.get("committed_version") or 0) >= max(w) + 3

    st = lj.wait_for(on_disk_everywhere, timeout=120)
    if st is None:  # say what each node's flusher had done
        for a in range(4):
            print(f"   agent {a} persist: {(lj.agent_state(a) or {}).get('persist')}", flush=True)
    if check(st is not None, "two-node loss: versions reach disk on every node"):
        first = rng.randrange(4)
        victims = [first, (first + 1) % 4]  # a node and the holder of its copies (the next on the placement ring)
        print(f"committed {st['committed_version']}: SIGKILL nodes {victims} at once (replicas: 1)", flush=True)
        for n in victims:
            lj.kill_node(n)
    rc = lj.wait(240)
    check(rc == 0, f"two-node loss: the job ends well (exit {rc})\n{lj.log[-3000:]}")
    check("the newest complete in the persist directory" in lj.log,
          "two-node loss: the coordinator goes back to the disk")
    back = [line for line in lj.log.splitlines() if "steps lost" in line]
    print("   " + (back[0][back[0].find("ranks"):] if back else "no line"), flush=True)
    check(digests(lj.log) == loss_want, "two-node loss: digests equal the failure-free run's")


def test_tmpfs_that_fills_up(check, scratch, rng):
    """Section 3: a small tmpfs that fills up during a real run: training goes on from RAM, the flusher
    reports the failure and recovers when space returns."""
    mnt = scratch("ftrun-tmpfs-")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", mnt],
                             capture_output=True).returncode == 0
    if not mounted:
        pytest.skip("cannot mount a tmpfs here (not root?)")
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


def test_chunk_file_rots_on_disk(check, scratch, rng):
    """Section 6: a chunk file that rots on disk (one flipped bit) while the versions that reuse it are in RAM
    is repaired from RAM by the next write, so that a later restart restores the newest version."""
    # A chunk file is reused by every later version with the same bytes, and the
    # writer does not rewrite files that exist, so one flipped bit would make all
    # of them unrestorable. The flusher reads back once (per agent) the chunk
    # files a version reuses and rewrites a bad one from RAM. Rank 1's state
    # never changes here (--change-only-rank 0): its chunk files are reused by
    # every version. A chunk the agent wrote itself counts as checked, so the bit
    # is flipped under the agent that restored from those files, before its first
    # write.
    disk6 = scratch("ftrun-persist-rot-")
    job6 = "rot-%d" % rng.randrange(1 << 30)
    jdir6 = os.path.join(disk6, job6)
    rot_args = ["--steps", "60", "--state-bytes", "8MiB", "--tensors", "4", "--change-fraction", "0.25",
                "--change-only-rank", "0"]
    rot_want = golden(2, rot_args)
    rot_config = ("job:\n  id: %s\nstore:\n  memory_budget: 128MiB\n  chunk_size: 1MiB\n"
                  "persist:\n  dir: %s\n  every_versions: 2\n  every_seconds: 0s\n" % (job6, disk6))
    # A: a few versions on disk, then killed whole.
    job = Job(2, rot_args + ["--step-ms", "100"], config=rot_config, job_id=job6)
    st = job.wait_for(lambda s: ((s.get("persist") or {}).get("last_written_version") or 0) >= 6, timeout=60)
    check(st is not None and job.proc.poll() is None, "rot: versions reach disk")
    kill_job(job, st)
    # B: restores the newest version from those files, then (slow steps: seconds
    # before its first write) one bit of a rank-1 chunk file rots.
    v0 = complete_versions(jdir6)[-1]
    job = Job(2, rot_args + ["--step-ms", "1500"], config=rot_config, job_id=job6)
    m = wait_log(job, r"restored version (\d+) of ranks", 60)
    check(m is not None and int(m.group(1)) == v0, f"rot: the restart restores version {v0} from disk")
    rank1 = referenced_by(os.path.join(jdir6, "v%020d" % v0, "rank1.manifest"), chunk_files(jdir6))
    rotten = rank1[0] if rank1 else None
    st = job.state() or {}
    if check(rotten and (st.get("persist") or {}).get("last_written_version") is None,
             f"rot: a chunk file of version {v0} to flip, before the first write ({len(rank1)} files, "
             f"{st.get('persist')})"):
        with open(rotten, "r+b") as f:
            f.seek(4096 + 100)
            good = f.read(1)
            f.seek(4096 + 100)
            f.write(bytes([good[0] ^ 0x04]))
        print(f"flipped a bit of {rotten} (version {v0}, rank 1)", flush=True)
        m = wait_log(job, r".*chunk file '[^']*%s'.*repaired from RAM.*" % os.path.basename(rotten), 60)
        check(m is not None and "rank 1 " in m.group(0) and os.path.basename(rotten) in m.group(0),
              "rot: the next write finds the bad file and repairs it from RAM, naming the file, chunk and rank:\n" +
              (m.group(0) if m else log_of(job)[-3000:]))
        st = job.wait_for(lambda s: (s.get("persist") or {}).get("chunks_repaired", 0) >= 1, timeout=30)
        check(st is not None and st["persist"].get("chunks_scrubbed", 0) >= 1 and
              st["persist"].get("chunks_scrub_failed", 0) >= 1,
              f"rot: the status counts the scrub and the repair ({(st or {}).get('persist')})")
        with open(rotten, "rb") as f:
            f.seek(4096 + 100)
            check(f.read(1) == good, "rot: the chunk file holds its right bytes again")
    kill_job(job, job.state())
    # C: restores the newest complete version (which reuses the repaired file),
    # not an older one, and ends as the failure-free run.
    newest = complete_versions(jdir6)[-1]
    check(newest > v0 and rotten in referenced_by(os.path.join(jdir6, "v%020d" % newest, "rank1.manifest"),
                                                  chunk_files(jdir6)),
          f"rot: a later version ({newest}) is complete on disk and reuses the repaired file")
    job = Job(2, rot_args + ["--step-ms", "25"], config=rot_config, job_id=job6)
    rc = job.wait(120)
    check(rc == 0, f"rot: the restarted job exits 0 (got {rc})\n{job.log[-3000:]}")
    check(any(("restored version %d " % newest) in line for line in restored_from_disk(job.log)),
          f"rot: the restart restores the newest complete version {newest}:\n" + "\n".join(restored_from_disk(job.log)))
    check(not bad_restores(job.log), "rot: no version on disk failed to restore:\n" + "\n".join(bad_restores(job.log)))
    check(digests(job.log) == rot_want, "rot: digests equal the failure-free run's")
