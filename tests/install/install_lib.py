"""Helpers for the install tests: the build and source trees, running a
command with its output shown when it fails, and checks that fail the test
at the end."""
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.abspath(os.environ.get("FTRUN_SOURCE_DIR", os.path.join(HERE, "..", "..")))
BUILD = os.path.abspath(os.environ.get("FTRUN_BUILD_DIR", os.path.join(SOURCE, "build")))
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable

failures = []


def check(cond, what):
    """Records a failed expectation (the test goes on, and fails at the end)."""
    if not cond:
        failures.append(what)
        print("FAILED:", what, flush=True)
    return cond


def finish(tmp):
    """Exits 1 if a check failed (keeping `tmp` to look at), else removes `tmp`."""
    if failures:
        print("%d check(s) failed; the files are in %s" % (len(failures), tmp), flush=True)
        sys.exit(1)
    subprocess.run(["rm", "-rf", tmp], check=False)
    print("all checks passed", flush=True)


def scratch(prefix):
    """A fresh directory for this test (not shared with any other run)."""
    return tempfile.mkdtemp(prefix=prefix)


def clean_env(bin_dir, home, **extra):
    """What a user's fresh login shell has: the install's bin/ on PATH and no
    PYTHONPATH, LD_LIBRARY_PATH or FTRUN_* variables."""
    env = {"PATH": bin_dir + ":/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8"}
    if "UCX_NET_DEVICES" in os.environ:
        env["UCX_NET_DEVICES"] = os.environ["UCX_NET_DEVICES"]
    env.update(extra)
    return env


def run(what, argv, timeout=90, expect_rc=0, **kwargs):
    """Runs argv; checks its exit code (expect_rc, None for any) and returns
    (rc, output). The output is printed when the check fails."""
    t0 = time.monotonic()
    try:
        # A session of its own: on a timeout the whole job (runner, agents, ranks) is killed.
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True, **kwargs)
    except OSError as e:
        p, rc, out = None, None, "cannot run %s: %s" % (argv[0], e)
    if p is not None:
        try:
            out, _ = p.communicate(timeout=timeout)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            out, _ = p.communicate()
            rc, out = None, out + "\n(timed out after %ds)" % timeout
    ok = rc == expect_rc if expect_rc is not None else rc is not None
    print("%s: exit %s in %.1fs" % (what, rc, time.monotonic() - t0), flush=True)
    if not check(ok, "%s: expected exit %s, got %s (%s)" % (what, expect_rc, rc, " ".join(argv))):
        print(out[-4000:], flush=True)
    return rc, out
