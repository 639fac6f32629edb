"""A rank that probes its agent's warm control link with bad frames
(tests/integration/test_warm_protocol.py): each must be refused with an
error naming what was wrong, and the connection closed; then the rank runs
a one-line training function under @ftrun.resilient and finishes."""
import os
import socket
import struct
import sys

import ftrun
from ftrun import warm
from rank_say import say

RANK = int(os.environ["FTRUN_RANK"])
PATH = os.environ["FTRUN_AGENT_SOCKET"]
HEADER = struct.Struct("<IHHI")


def probe(kind, payload):
    """Sends one frame on a new connection: the agent's answer (type, text), or (None, '') when it just closed."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(PATH)
    s.sendall(HEADER.pack(0x46545231, kind, 0, len(payload)) + payload)
    s.settimeout(10)
    data = b""
    try:
        while True:
            got = s.recv(65536)
            if not got:
                break
            data += got
    except OSError:
        pass
    s.close()
    if len(data) < HEADER.size:
        return None, ""
    _, t, _, n = HEADER.unpack(data[:HEADER.size])
    return t, data[HEADER.size:HEADER.size + n].decode("utf-8", "replace")


job = os.environ.get("FTRUN_JOB_ID", "")
cases = [
    ("another rank's hello", 32, f"role=rank\nrank={1 - RANK}\njob={job}\n", "not that rank's process"),
    ("a standby hello from a rank", 32, f"role=standby\njob={job}\n", "not a standby this agent started"),
    ("an unknown role", 32, "role=boss\n", "'role' must be rank or standby"),
    ("a rank out of range", 32, f"role=rank\nrank=99999999999\njob={job}\n", "integer in"),
    ("a line without '='", 32, "role\n", "without '='"),
    ("a repeated field", 32, "role=rank\nrole=rank\n", "given twice"),
    ("another job", 32, f"role=rank\nrank={RANK}\njob=someone-else\n", "this agent runs"),
    ("parked before a hello", 34, "generation=0\n", "before a warm hello"),
]
bad = []
for what, kind, payload, want in cases:
    t, text = probe(kind, payload.encode())
    if t != 3 or want not in text:
        bad.append(f"{what}: answer type {t}, {text!r} (wanted an error with {want!r})")
if bad:
    say(f"WARMPROBE {RANK} FAILED: " + "; ".join(bad))
    sys.exit(1)


@ftrun.resilient
def train(ctx):
    assert ctx.rank == RANK and ctx.generation == 0 and not ctx.warm, ctx
    return 7


if train() != 7:
    sys.exit(1)
say(f"WARMPROBE {RANK} OK ({len(cases)} bad frames refused; {warm.__name__} ran the function)")
