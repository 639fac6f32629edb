"""A Python rank for tests/install: run by an installed `ftrun` (or
ftrun-agent) in an environment with no PYTHONPATH, so `import ftrun` works
only if the agent hands its ranks its own package.

    py_trainer.py [--local_rank=N] STEPS KILL_AT

Prints "FTRUN FROM <path of the ftrun package>", saves a state that is a pure
function of the step every step, SIGKILLs itself once KILL_AT is committed
(first generation only), and after the restart checks the restored bytes and
prints "RESUMED <version>"; "PYTRAINER DONE <rank>" at the end."""
import os
import signal
import sys

import ftrun

args = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]
steps, kill_at = int(args[0]), int(args[1])
first_generation = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"


def say(line):
    os.write(1, (line + "\n").encode())  # one write: the ranks' lines do not interleave


say("FTRUN FROM %s" % os.path.dirname(os.path.abspath(ftrun.__file__)))


def state(step, rank):
    return bytearray(b"%04d:%08d;" % (rank, step) * 20000)  # the same size every step


with ftrun.Client() as client:
    rank = client.rank
    start = 0
    if client.restore_version is not None:
        version, tensors, user = client.load(client.restore_version)
        if bytes(tensors["w"]) != bytes(state(version, client.rank)) or user != b"step %d" % version:
            sys.exit("py_trainer: the restored version %d differs from what was saved" % version)
        say("RESUMED %d" % version)
        start = version + 1
    for step in range(start, steps):
        client.save(step, {"w": state(step, client.rank)}, user_bytes=b"step %d" % step)
        if first_generation and step == kill_at:
            client.wait_committed(step, timeout_ms=30000)
            os.kill(os.getpid(), signal.SIGKILL)
say("PYTRAINER DONE %d" % rank)
