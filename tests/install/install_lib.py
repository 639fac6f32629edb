"""Helpers for the install tests: the build and source trees, and running a
command with its output shown when it fails."""
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.abspath(os.environ.get("FTRUN_SOURCE_DIR", os.path.join(HERE, "..", "..")))
BUILD = os.path.abspath(os.environ.get("FTRUN_BUILD_DIR", os.path.join(SOURCE, "build")))
PYTHON = os.environ.get("FTRUN_TEST_PYTHON") or sys.executable


def clean_env(bin_dir, home, **extra):
    """What a user's fresh login shell has: the install's bin/ on PATH and no
    PYTHONPATH, LD_LIBRARY_PATH or FTRUN_* variables."""
    env = {"PATH": bin_dir + ":/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8"}
    if "UCX_NET_DEVICES" in os.environ:
        env["UCX_NET_DEVICES"] = os.environ["UCX_NET_DEVICES"]
    env.update(extra)
    return env


def run(check, what, argv, timeout=90, expect_rc=0, **kwargs):
    """Runs argv; checks its exit code (expect_rc, None for any) and returns
    (rc, output). The output is printed when the check fails. `check` is the
    test's soft assertion; None (a fixture's setup) asserts instead."""
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
    what = "%s: expected exit %s, got %s (%s)" % (what, expect_rc, rc, " ".join(argv))
    if not ok:
        print(out[-4000:], flush=True)
    if check is None:
        assert ok, what + "\n" + out[-4000:]
    else:
        check(ok, what)
    return rc, out
