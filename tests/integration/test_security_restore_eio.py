"""A transient read error (EIO) during a restore from disk: retried, nothing
deleted, and the job restores that version.

Once any read error but another job's files made a node report the version
unreadable: the coordinator sent every node to the next older version, and
each node removed its marker of the newer one, so one flaky read cost the
newest complete version for good. Now the persist layer classifies errors
(plugin/persist/disk_errors.h): EIO, ESTALE, EINTR, EAGAIN and timeouts are
retried with a bounded backoff, and only a verified corruption or a missing
file moves the job to an older version (whose newer files stay until a newer
version commits).

The EIO comes from the test seam FTRUN_TEST_DISK_READ_FAULTS
(launcher/agent/test_faults.h): this sandbox has no device-mapper (dmsetup
finds no kernel driver), so no kernel mechanism can fail a read; the seam
wraps the agent's restore Env in the fault-injecting Env, and the agent's
real reader, classifier and retry run against it.

2 nodes x 1 rank: run 1 writes versions to disk and is killed whole; run 2
starts with the first 3 chunk reads of every agent failing with EIO.
"""
import os
import random

from ftrun_testlib import ClusterJob, digests, golden

ARGS = ["--state-bytes", "16MiB", "--tensors", "2", "--steps", "60", "--step-ms", "40", "--change-fraction", "0.2"]


def markers(job_dir):
    """(version dir, marker) -> (inode, mtime_ns) of every node marker on disk."""
    out = {}
    for d in sorted(os.listdir(job_dir)):
        if d.startswith("v"):
            for f in os.listdir(os.path.join(job_dir, d)):
                if f.endswith(".COMPLETE"):
                    s = os.stat(os.path.join(job_dir, d, f))
                    out[(d, f)] = (s.st_ino, s.st_mtime_ns)
    return out


def complete(job_dir):
    return sorted(int(d[1:]) for d in os.listdir(job_dir)
                  if all(os.path.exists(os.path.join(job_dir, d, "node%d.COMPLETE" % n)) for n in range(2)))


def test_transient_eio_is_retried(check, scratch):
    """Run 1 writes versions to disk and is killed whole; in run 2 the first 3 chunk reads of every agent fail
    with EIO: retried, nothing deleted, and both nodes restore the newest complete version."""
    want = golden(2, ARGS)
    rng = random.Random()
    disk = scratch("ftrun-sec-eio-")
    job_id = "sec-eio-%d" % rng.randrange(1 << 30)
    config = ("job:\n  id: %s\n  max_restarts: 3\n"
              "store:\n  memory_budget: 256MiB\n  chunk_size: 1MiB\n  prefault: false\n"
              "cluster:\n  replicas: 1\n"
              "persist:\n  dir: %s\n  every_versions: 3\n  every_seconds: 0s\n  keep: 100\n" % (job_id, disk))
    env = dict(os.environ, UCX_NET_DEVICES=os.environ.get("UCX_NET_DEVICES", "lo"))
    job_dir = os.path.join(disk, job_id)

    # Run 1: two versions complete on disk, then the job is killed whole.
    job = ClusterJob(2, 1, ARGS, config, env=env)
    st = job.wait_for(lambda s: all((job.last_written(a) or 0) >= 6 for a in range(2)), timeout=120)
    if check(st is not None, "run 1: versions reach the disk on both nodes"):
        job.kill_whole(st)
    job.wait(60)
    versions = complete(job_dir)
    newest = versions[-1] if versions else None
    before = markers(job_dir)
    print(f"complete on disk: {versions}; the restart must restore {newest}", flush=True)

    # Run 2: each agent's first 3 chunk reads fail with EIO (errno 5).
    job = ClusterJob(2, 1, ARGS, config, env=dict(env, FTRUN_TEST_DISK_READ_FAULTS="5:3:/chunks/"))
    st = job.wait_for(lambda s: s["phase"] == "running" and s["committed_version"] is not None
                      and s["committed_version"] > (newest or 0), timeout=120)
    # Nothing of the newest version was removed or rewritten by the restore.
    after = markers(job_dir) if st is not None else {}
    kept = {k: v for k, v in before.items() if k[0] == "v%020d" % (newest or 0)}
    check(kept and all(after.get(k) == v for k, v in kept.items()),
          f"version {newest}'s markers are untouched by the restore: before {kept}, after "
          f"{ {k: after.get(k) for k in kept} }")
    rc = job.wait(240)
    log = job.log
    restored = [line for line in log.splitlines()
                if "restored version %d " % (newest or -1) in line and "from disk" in line]
    check(len(restored) == 2, f"run 2: both nodes restore version {newest} (the newest complete)\n{log[-4000:]}")
    check("Input/output error; retrying" in log, "run 2: the EIO is retried (and logged)")
    check("the next older one on disk" not in log, "run 2: a transient error never moves the job to an older version")
    check(rc == 0, f"run 2: exit 0 (got {rc})\n{log[-4000:]}")
    check(digests(log) == want, "run 2: digests equal the failure-free run's")
