"""python -m ftrun.rendezvous_store: the job's rendezvous store, hosted by
the runner (launcher/runner/rendezvous_keeper.h) rather than by rank 0, so
that no rank's death takes it down.

It is torch's own TCPStore server (the protocol is the one the ranks'
torch speaks, whatever its version), started once per job, listening on
every interface. Ranks reach it as torchrun's workers reach their agent's
store: TORCHELASTIC_USE_AGENT_STORE=True, MASTER_ADDR:MASTER_PORT this
store, and every generation under its own key prefix
(/worker/attempt_<TORCHELASTIC_RESTART_COUNT>), so a new generation's
barrier and group names never meet a dead one's.

Prints "listening <port>" on stdout once it takes connections, then runs
until its parent is gone or it is killed (the runner starts it with
PR_SET_PDEATHSIG, launcher/agent/supervisor.h, and kills it at its end). Exits 2 with a
one-line reason when torch cannot be imported or the port is taken.
"""
import argparse
import os
import sys
import time
from datetime import timedelta


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m ftrun.rendezvous_store")
    p.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    p.add_argument("--host", default="0.0.0.0", help="the address ranks connect to (the server listens on all)")
    a = p.parse_args(argv)
    parent = os.getppid()  # (started by hand: it ends when that shell does)
    try:
        from torch.distributed import TCPStore
    except ImportError as e:
        print(f"ftrun.rendezvous_store: cannot import torch.distributed: {e}", file=sys.stderr)
        return 2
    try:
        store = TCPStore(a.host, a.port, None, True, timedelta(hours=1), wait_for_workers=False)
    except (RuntimeError, ValueError) as e:
        print(f"ftrun.rendezvous_store: cannot listen on port {a.port}: {e}", file=sys.stderr)
        return 2
    print(f"listening {store.port}", flush=True)
    while os.getppid() == parent:
        time.sleep(1.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
