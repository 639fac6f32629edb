"""Issue 13, "the node": nothing on the agent's node can break the agent's
store or its socket.

- ftruncate(0) of the store segment, reopened through /proc/<agent>/fd/<n>
  as any process of the job's uid can: refused (EPERM, the segment is
  sealed); the agent does not SIGBUS and the job ends with the failure-free
  digests.
- a rank that floods the agent's socket with frames, or one that sends a
  200 MiB frame: the agent drops that connection (and says so) well before
  it has taken the flood or the frame; the rank then trains normally, and
  the job completes with the failure-free digests.
- 300 connections that never say hello: the agent holds a bounded number
  (its descriptors stay far below 300), and the job completes.
"""
import errno
import json
import os
import socket
import sys
import pytest

from ftrun_testlib import SOURCE, TRAINER, Job, digests, golden

ARGS = ["--steps", "40", "--state-bytes", "4MiB", "--tensors", "3", "--step-ms", "40"]
CONFIG = "store:\n  memory_budget: 128MiB\n  prefault: false\njob:\n  max_restarts: 2\n"


@pytest.fixture(scope="module")
def want():
    return golden(2, ARGS)


def ready(st):
    return st.get("agent_pid") and (st.get("store") or {}).get("store_fd") is not None and \
        len(st.get("ranks", [])) == 2 and all(r.get("pid") for r in st["ranks"])


def test_store_ftruncate_refused(check, want):
    """ftruncate of the store segment through /proc/<agent>/fd/<n>: refused with EPERM (the segment is sealed);
    no SIGBUS, and the job ends with the failure-free digests."""
    job = Job(2, ARGS, config=CONFIG)
    st = job.wait_for(ready)
    if check(st is not None, "the agent reports its pid and store_fd"):
        path = "/proc/%d/fd/%d" % (st["agent_pid"], st["store"]["store_fd"])
        for size in (1 << 40, 4096, 0):
            try:
                with open(path, "r+b", buffering=0) as f:
                    os.ftruncate(f.fileno(), size)
                check(False, f"ftruncate({size}) of the store through {path} succeeded")
            except OSError as e:
                check(e.errno == errno.EPERM, f"ftruncate({size}) of the store is refused with EPERM (got {e})")
    rc = job.wait(120)
    check(rc == 0, f"the job survives an ftruncate of its store (exit {rc})")
    check(digests(job.log) == want, "after the ftruncate attempt: the failure-free digests")
    check("SIGBUS" not in job.log and "signal 7" not in job.log, "no SIGBUS")


@pytest.mark.parametrize("mode", ["flood", "oversize"])
def test_misbehaving_rank_dropped(check, scratch, want, mode):
    """A rank that floods the agent's socket with frames, or sends a 200 MiB frame: the agent drops that
    connection (and says so) well before it has taken it; the rank then trains normally, and the job completes
    with the failure-free digests."""
    marker = os.path.join(scratch("ftrun-bad-"), "result.json")
    cmd = [sys.executable, os.path.join(SOURCE, "tests", "integration", "py_bad_rank.py"), marker, mode, "--",
           TRAINER] + ARGS
    j = Job(2, [], config=CONFIG, command=cmd)
    rc = j.wait(180)
    result = {}
    try:
        with open(marker) as f:
            result = json.load(f)
        os.unlink(marker)
    except OSError:
        pass
    print(mode, "->", result, flush=True)
    check(result.get("dropped") is True, f"{mode}: the agent drops the misbehaving rank's connection ({result})")
    check(result.get("sent", 1 << 40) < (64 << 20),
          f"{mode}: dropped before taking 64 MiB of it (sent {result.get('sent')})")
    check("dropped the connection of rank 1" in j.log, f"{mode}: the agent says it dropped rank 1's connection")
    check(rc == 0, f"{mode}: the job completes (exit {rc})")
    check(digests(j.log) == want, f"{mode}: every rank's digest equals the failure-free run's")


def test_silent_connections_bounded(check, want):
    """300 connections that never say hello: the agent holds a bounded number, and the job completes."""
    job = Job(2, ARGS, config=CONFIG)
    st = job.wait_for(ready)
    held = []
    if check(st is not None, "the agent reports its pid"):
        sock_path = None
        for name in os.listdir(os.path.join(job.dir, "run")):
            if name.endswith(".sock"):
                sock_path = os.path.join(job.dir, "run", name)
        for _ in range(300):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(sock_path)
                s.send(b"FT")  # half a header, never finished
            except OSError:
                pass
            held.append(s)
        fds = len(os.listdir("/proc/%d/fd" % st["agent_pid"]))
        print("agent descriptors while 300 clients hold connections:", fds, flush=True)
        check(fds < 200, f"connections without a hello are bounded (the agent holds {fds} descriptors)")
    rc = job.wait(120)
    for s in held:
        s.close()
    check(rc == 0 and digests(job.log) == want, f"the job completes with 300 silent clients around (exit {rc})")
    check("have not said hello" in job.log, "the agent says why it refused connections")
