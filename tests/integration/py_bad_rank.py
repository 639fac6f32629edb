"""A rank that misbehaves on the agent socket once, then trains normally.

    py_bad_rank.py MARKER MODE -- TRAINER ARGS...

The rank named by $FTRUN_BAD_RANK (default 1), on its first run (MARKER
does not exist yet), says a proper hello and then MODE:
  flood      streams progress frames, as fast as it can, up to 200 MiB
  oversize   sends a 200 MiB frame header, then up to 256 MiB of payload
and records in MARKER (JSON) whether the agent cut it off ("dropped") and
how many bytes it had sent. Then it (and every other rank) execs TRAINER.
"""
import json
import os
import socket
import struct
import sys
from rank_say import say

MAGIC = 0x46545231
HELLO, HELLO_OK, PROGRESS = 1, 2, 13


def frame(kind, payload, length=None):
    return struct.pack("<IHHI", MAGIC, kind, 0, len(payload) if length is None else length) + payload


def misbehave(mode):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(os.environ["FTRUN_AGENT_SOCKET"])
    job = os.environ["FTRUN_JOB_ID"].encode()
    # 3: ftrun's rank protocol version (kProtocolVersion in plugin/ipc/wire.h).
    hello = struct.pack("<IiiI", 3, int(os.environ["FTRUN_RANK"]), os.getpid(), len(job)) + job
    sock.sendall(frame(HELLO, hello))
    head = sock.recv(12, socket.MSG_WAITALL)
    kind = struct.unpack("<IHHI", head)[1] if len(head) == 12 else -1
    if kind != HELLO_OK:
        return {"dropped": False, "sent": 0, "error": f"hello not accepted (reply type {kind})"}
    if mode == "flood":
        block, limit, first = frame(PROGRESS, b"\0" * 8) * 50000, 200 << 20, b""
    else:
        block, limit = b"\0" * (1 << 20), 256 << 20
        first = frame(PROGRESS, b"", 200 << 20)
    sent, dropped = 0, False
    try:
        if first:
            sock.sendall(first)
            sent += len(first)
        while sent < limit:
            sock.sendall(block)
            sent += len(block)
    except (BrokenPipeError, ConnectionResetError):
        dropped = True
    sock.close()
    return {"dropped": dropped, "sent": sent}


def main():
    sep = sys.argv.index("--")
    marker, mode, trainer = sys.argv[1], sys.argv[2], sys.argv[sep + 1:]
    if os.environ.get("FTRUN_RANK") == os.environ.get("FTRUN_BAD_RANK", "1") and not os.path.exists(marker):
        result = misbehave(mode)
        with open(marker, "w") as f:
            json.dump(result, f)
        say(f"bad rank ({mode}): {result}")
    os.execv(trainer[0], trainer)


main()
