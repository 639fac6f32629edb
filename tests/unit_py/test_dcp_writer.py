"""ftrun.dcp.StorageWriter carried into another process (DCP's process
checkpointer pickles it into its background process, a child of the rank):
it pickles without its connection and its process group (neither leaves its
process; there the writer is in the background process's own group), and in
the other process it connects as a writer of the rank (ftrun.Client(writer=
True)), once, not as the rank. In the rank's own process it uses the rank's
connection. No agent is needed: the connections are recorded, not made. (A
real background process saving through an agent: tests/torch2/test_dcp.py.)

Run from the build tree: PYTHONPATH=build/python python3 -m pytest tests/unit_py/test_dcp_writer.py
"""
import pickle
import subprocess
import sys
import threading

import ftrun.dcp
from ftrun import state_client

CHILD = """
import pickle, sys
import ftrun.dcp
from ftrun import state_client

class Recorded:
    def __init__(self, **kwargs):
        print("CONNECT", sorted(kwargs.items()))

state_client._ftrun.Client = Recorded
writer = pickle.loads(sys.stdin.buffer.read())
print("GROUP", writer.process_group, "CLIENT", writer._client)
first = writer._get_client()
print("SAME", writer._get_client() is first)
"""


def test_a_writer_carried_into_another_process_connects_there_as_a_writer_of_the_rank(check):
    writer = ftrun.dcp.StorageWriter(3, process_group=threading.Lock())  # (neither pickles)
    writer._client = threading.Lock()
    out = subprocess.run([sys.executable, "-c", CHILD], input=pickle.dumps(writer), capture_output=True)
    text = out.stdout.decode() + out.stderr.decode()
    check(out.returncode == 0, f"the child ran: {text[-2000:]}")
    check("GROUP None CLIENT None" in text, f"the connection and the group stay in their process: {text[-1000:]}")
    check(text.count("CONNECT [('writer', True)]") == 1 and "SAME True" in text,
          f"one connection as a writer of the rank, kept: {text[-1000:]}")


def test_in_the_rank_own_process_the_writer_uses_the_rank_connection(check, monkeypatch):
    rank_client = object()
    monkeypatch.setattr(state_client, "_client", rank_client)
    check(ftrun.dcp.StorageWriter(3)._get_client() is rank_client, "the rank's own connection")
    mine = object()
    check(ftrun.dcp.StorageWriter(3, client=mine)._get_client() is mine, "the client given to the writer")
