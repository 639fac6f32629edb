"""Drop-in fidelity with DeepSpeed's launcher (issue 13), with real agents and
real Python ranks:

- the rank's argv is DeepSpeed's: SCRIPT --local_rank=N ARGS (launch.py
  appends --local_rank right after the script, before the user's arguments);
- a rank that fails before its first save with the same exit code in two
  generations in a row (an argparse error) stops the job at once, with the
  rank's last stderr lines in the error, on one node and in a cluster, and
  not after job.max_restarts restarts; one such failure alone still restarts.
"""
import os
import subprocess

from ftrun_testlib import AGENT, PY, RUNNER

ENV = dict(os.environ, FTRUN_PYTHON=PY)


def config(d, extra=""):
    path = os.path.join(d, "ftrun.yaml")
    with open(path, "w") as f:
        f.write("agent:\n  run_dir: %s/run\njob:\n  max_restarts: 5\n%s" % (d, extra))
    return path


def script(d, body):
    path = os.path.join(d, "train.py")
    with open(path, "w") as f:
        f.write(body)
    return path


def run(argv, timeout=180):
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout, env=ENV)
    print(p.stdout[-3000:], flush=True)
    return p


def test_argv_order(check, scratch):
    """The rank's argv is DeepSpeed's: SCRIPT --local_rank=N ARGS."""
    d = scratch("ftrun-dropin-")
    out = os.path.join(d, "argv")
    s = script(d, "import sys\nopen(%r + sys.argv[1].split('=')[-1], 'w').write(repr(sys.argv[1:]))\n" % out)
    p = run([AGENT, "--config", config(d), "--nproc", "2", "--job-id", "dropin-argv", s, "data.bin", "--lr", "3e-4"])
    check(p.returncode == 0, "the argv job exits 0 (got %d)" % p.returncode)
    for r in range(2):
        try:
            got = open(out + str(r)).read()
        except OSError:
            got = None
        check(got == repr(["--local_rank=%d" % r, "data.bin", "--lr", "3e-4"]),
              "rank %d sees DeepSpeed's argv order (got %s)" % (r, got))


ARGPARSE_ERROR = """import argparse, sys
p = argparse.ArgumentParser(prog="train.py")
p.add_argument("--local_rank", type=int)
p.add_argument("--lr", type=float)
p.parse_args()
"""


def test_early_failure_one_node(check, scratch):
    """The same early failure (an argparse error) in two generations in a row stops the job at once, with the
    rank's last stderr line in the error, after one restart, not job.max_restarts."""
    d = scratch("ftrun-dropin-")
    s = script(d, ARGPARSE_ERROR)
    p = run([AGENT, "--config", config(d), "--nproc", "2", "--job-id", "dropin-early", s, "--bogus", "1"])
    check(p.returncode == 2,
          "an argparse error in every generation ends the job with its code 2 (got %d)" % p.returncode)
    check("two generations in a row" in p.stdout, "the agent says the same early failure happened twice")
    check("unrecognized arguments: --bogus 1" in p.stdout.split("not restarting")[-1],
          "the error quotes the rank's last stderr line")
    check("restart 1 of 5" in p.stdout and "restart 2 of 5" not in p.stdout,
          "exactly one restart is spent, not job.max_restarts")


def test_early_failure_once(check, scratch):
    """One early failure alone still restarts, and the job completes."""
    d = scratch("ftrun-dropin-")
    flag = os.path.join(d, "failed-once")
    s = script(d, "import os, sys\nif not os.path.exists(%r):\n    open(%r, 'w').close()\n"
                  "    sys.exit('cannot import the dataset (once)')\n" % (flag, flag))
    p = run([AGENT, "--config", config(d), "--nproc", "1", "--job-id", "dropin-once", s])
    check(p.returncode == 0, "a single early failure is restarted and the job completes (got %d)" % p.returncode)


def test_early_failure_cluster(check, scratch):
    """In a cluster too: the coordinator stops the job after the same early failure in two epochs in a row."""
    d = scratch("ftrun-dropin-")
    s = script(d, ARGPARSE_ERROR)
    p = run([RUNNER, "--num_nodes", "2", "--num_gpus", "1", "--config", config(d), s, "--bogus", "1"])
    check(p.returncode == 2, "in a cluster too the job ends with code 2 (got %d)" % p.returncode)
    check("two epochs in a row" in p.stdout, "the coordinator says the same early failure happened twice")
    check("unrecognized arguments: --bogus 1" in p.stdout.split("not restarting")[-1],
          "the coordinator's error quotes the rank's last stderr line")
