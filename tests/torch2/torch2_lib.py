"""What the torch-2 tests share: the check that the ranks' Python
(ftrun_testlib.PY, FTRUN_TEST_PYTHON) has torch 2.x with what a test needs,
else a failure naming the torch version found."""
import subprocess

import pytest

from ftrun_testlib import PY, ScriptClusterJob

_PROBE = r"""
import sys, torch
print(torch.__version__)
major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
ok = (major, minor) >= (2, %d)
if ok:
    try:
        %s
    except Exception as e:
        print("missing:", type(e).__name__, e)
        ok = False
sys.exit(0 if ok else 3)
"""


def require_torch2(what, minor=4, imports="pass"):
    """Fails the test unless PY has torch >= 2.<minor> and `imports` (one line of Python) runs: the project's
    environment (.venv/, torch 2.13) has both, so a missing one is a broken setup, never a skip."""
    p = subprocess.run([PY, "-c", _PROBE % (minor, imports)], capture_output=True, text=True)
    version = (p.stdout.strip().splitlines() or ["(no torch)"])[0]
    if p.returncode != 0:
        detail = p.stdout.strip().splitlines()[1:] or p.stderr.strip().splitlines()[-1:]
        pytest.fail(f"{what} needs torch >= 2.{minor}; {PY} has torch {version} {' '.join(detail)[:300]} "
                    "(scripts/venv.sh makes .venv/ with torch 2.13; or set FTRUN_TEST_PYTHON)")
    return version


def ScriptJob(script, script_args, nodes=2, per_node=2, config=""):
    """A Python script as the ranks of the ftrun runner on local nodes."""
    return ScriptClusterJob(script, script_args, nodes, per_node, config, prefix="ftrun-t2-")
