"""What the torch-2 tests share: the check that the ranks' Python
(ftrun_testlib.PY, FTRUN_TEST_PYTHON) has torch 2.x with what a test needs,
else a visible skip naming the torch version found."""
import subprocess

import pytest

from ftrun_testlib import PY

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
    """Skips the test (module) unless PY has torch >= 2.<minor> and `imports` (one line of Python) runs."""
    p = subprocess.run([PY, "-c", _PROBE % (minor, imports)], capture_output=True, text=True)
    version = (p.stdout.strip().splitlines() or ["(no torch)"])[0]
    if p.returncode != 0:
        detail = p.stdout.strip().splitlines()[1:] or p.stderr.strip().splitlines()[-1:]
        pytest.skip(f"{what} needs torch >= 2.{minor}; {PY} has torch {version} {' '.join(detail)[:300]} "
                    "(set FTRUN_TEST_PYTHON to a torch 2.x interpreter)")
    return version


class ScriptJob:
    """A Python script run as the ranks of the ftrun runner on local nodes
    (like test_train_gpt.GptJob, any script): ftrun_testlib.PY runs it, with
    this build's ftrun package first on PYTHONPATH."""

    def __new__(cls, script, script_args, nodes=2, per_node=2, config=""):
        import os
        import subprocess

        from ftrun_testlib import BUILD, ClusterJob, RUNNER, scratch, started
        from test_train_gpt import free_port_range

        job = ClusterJob.__new__(ClusterJob)
        job.dir = scratch("ftrun-t2-")
        job.config = os.path.join(job.dir, "ftrun.yaml")
        job.status = os.path.join(job.dir, "status.json")
        with open(job.config, "w") as f:
            f.write("agent:\n  run_dir: %s/run\n" % job.dir + config)
        port = free_port_range(4)
        job.argv = [RUNNER, "--num_nodes", str(nodes), "--num_gpus", str(per_node), "--config", job.config,
                    "--status_file", job.status, "--master_addr", "127.0.0.1", "--master_port", str(port),
                    script, *script_args]
        env = os.environ.copy()
        env["FTRUN_PYTHON"] = PY
        pypath = os.path.join(os.path.abspath(BUILD), "python")
        env["PYTHONPATH"] = pypath + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        job.out = open(os.path.join(job.dir, "out.log"), "w+")
        job.proc = started(subprocess.Popen(job.argv, stdout=job.out, stderr=subprocess.STDOUT, env=env))
        job.log = ""
        return job
