"""ftrun.dcp.StorageWriter carried into another process (DCP's process
checkpointer pickles it into its own subprocess): using it there fails at
once, naming both processes and the checkpointer to use, instead of an
agent refusing a second connection for the rank. No agent is needed: the
check comes before any connection.

Run from the build tree: PYTHONPATH=build/python python3 -m pytest tests/unit_py/test_dcp_writer.py
"""
import pickle
import subprocess
import sys

import ftrun.dcp

CHILD = """
import pickle, sys
import ftrun
writer = pickle.loads(sys.stdin.buffer.read())
try:
    writer._get_client()
except ftrun.Error as e:
    print(e.code, e.message)
    sys.exit(0)
sys.exit("no error")
"""


def test_a_writer_used_in_another_process_says_which_checkpointer_to_use(check):
    writer = ftrun.dcp.StorageWriter(3)
    out = subprocess.run([sys.executable, "-c", CHILD], input=pickle.dumps(writer), capture_output=True)
    text = out.stdout.decode() + out.stderr.decode()
    check(out.returncode == 0, f"the child raised ftrun.Error: {text[-2000:]}")
    check("FAILED_PRECONDITION" in text and "AsyncCheckpointerType.THREAD" in text and "one connection per rank"
          in text, f"the error names the rule and the fix: {text[-1000:]}")
