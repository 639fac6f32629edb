"""python -m ftrun.rendezvous_store: the job's rendezvous stores, hosted by
the runner (launcher/runner/rendezvous_keeper.h) rather than by rank 0, so
that no rank's death takes them down.

They are torch's own TCPStore servers (the protocol is the one the ranks'
torch speaks, whatever its version), listening on the one address the
job's ranks connect to (--host: the runner's; a socket bound here and
handed to TCPStore, whose own server would listen on every interface). Ranks
reach them as torchrun's workers reach their agent's store:
TORCHELASTIC_USE_AGENT_STORE=True, MASTER_ADDR:MASTER_PORT the store. Each
generation meets at a server of its own, as each of torchrun's rendezvous
rounds does: torch 2.x's env:// rendezvous puts no per-attempt prefix on the
keys with an agent store, so a reused server would hand a new generation the
dead one's addresses (gloo then connects to ports nobody listens on) and
barrier counts.

Prints "listening <port>" on stdout once the first server takes connections,
and again for a new server each time it reads "next" on stdin; the three
newest stay up (a generation's stragglers may still be leaving), older ones
are closed. Runs until its parent is gone or it is killed (the
runner starts it with PR_SET_PDEATHSIG, launcher/common/supervisor.h, and kills
it at its end). Exits 2 with a one-line reason when torch cannot be imported
or the port is taken.
"""
import argparse
import os
import select
import socket
import sys
import time
from datetime import timedelta

_KEEP = 3  # servers kept up: the newest generation's and the two before


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m ftrun.rendezvous_store")
    p.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    p.add_argument("--host", default="127.0.0.1", help="the address ranks connect to (the only one listened on)")
    a = p.parse_args(argv)
    parent = os.getppid()  # (started by hand: it ends when that shell does)
    try:
        from torch.distributed import TCPStore
    except ImportError as e:
        print(f"ftrun.rendezvous_store: cannot import torch.distributed: {e}", file=sys.stderr)
        return 2

    def serve(port):
        sock = socket.socket(socket.AF_INET6 if ":" in a.host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((a.host, port))
            sock.listen(1024)
        except OSError as e:
            sock.close()
            raise RuntimeError(f"{a.host}:{port}: {e.strerror}") from e
        # The store owns the descriptor from here (it closes it when it goes).
        return TCPStore(a.host, sock.getsockname()[1], None, True, timedelta(hours=1), wait_for_workers=False,
                        master_listen_fd=sock.detach())

    try:
        servers = [serve(a.port)]
    except (RuntimeError, ValueError) as e:
        print(f"ftrun.rendezvous_store: cannot listen on port {a.port}: {e}", file=sys.stderr)
        return 2
    print(f"listening {servers[-1].port}", flush=True)
    pending, stdin_open = b"", True
    while os.getppid() == parent:
        if not stdin_open:  # (started by hand: no more servers, this one runs on)
            time.sleep(1.0)
            continue
        ready, _, _ = select.select([sys.stdin.fileno()], [], [], 1.0)
        if not ready:
            continue
        chunk = os.read(sys.stdin.fileno(), 4096)
        stdin_open = bool(chunk)
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            if line.strip() != b"next":
                continue
            try:
                servers.append(serve(0))
            except (RuntimeError, ValueError) as e:
                print(f"ftrun.rendezvous_store: cannot start the next store: {e}", file=sys.stderr, flush=True)
                continue
            del servers[:-_KEEP]
            print(f"listening {servers[-1].port}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
