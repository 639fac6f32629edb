"""ftrun.restore in a real rank under ftrun-agent (py_restore_rank.py): the
committed state goes back into the live tensors of a model and its Adam
optimizer, the same objects in the same memory, bit-identical; bad
destinations of Client.load(into=) are refused by name; and a chunk
corrupted in the agent's shared memory (a byte flipped through
/proc/<agent>/fd/<store_fd>) makes the restore raise CORRUPTION."""
import os
import time

from ftrun_testlib import PY, Job, scratch

HERE = os.path.dirname(os.path.abspath(__file__))


def test_restore_in_place(check):
    flags = scratch("ftrun-restore-")
    job = Job(1, [], "job:\n  max_restarts: 0\nstore:\n  memory_budget: 32MiB\n  chunk_size: 64KiB\n",
              command=[PY, os.path.join(HERE, "py_restore_rank.py")], env=dict(os.environ, FTRUN_TEST_FLAGS=flags))
    deadline = time.time() + 120
    while not os.path.exists(os.path.join(flags, "ready-0")) and job.proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    if not os.path.exists(os.path.join(flags, "ready-0")):
        rc = job.wait(timeout=60)
        check(False, f"the rank never got to the corruption check: agent exit {rc}\n{job.log[-4000:]}")
        return
    st = job.state() or {}
    chunks = st.get("store", {}).get("committed_chunks", [])
    check(chunks, f"the status lists committed chunks: {st.get('store')}")
    if chunks:
        path = "/proc/%d/fd/%d" % (st["agent_pid"], st["store"]["store_fd"])
        with open(path, "r+b", buffering=0) as f:  # every sampled chunk: whichever the restore reads first
            for c in chunks:
                f.seek(c["offset"])
                b = f.read(1)
                f.seek(c["offset"])
                f.write(bytes([b[0] ^ 0x40]))
    open(os.path.join(flags, "corrupted"), "w").close()
    rc = job.wait(timeout=120)
    print("\n".join(l for l in job.log.splitlines() if "RESTORE" in l or "corrupt" in l.lower()), flush=True)
    check(rc == 0 and "RESTORE OK 0" in job.log, f"agent exit {rc}\n{job.log[-4000:]}")
