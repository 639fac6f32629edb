"""Fixtures shared by ftrun's Python tests (tests/integration, tests/unit_py,
tests/install), and the hooks that make them behave like the scripts they
replaced:

- `check(cond, what)`: a soft assertion. A failed expectation is recorded and
  the test goes on (the test fails at its end, listing every failed
  expectation). Plain `assert` is for what must stop the test.
- `scratch(prefix)`: a temporary directory (persist directories, logs, run
  directories: some hold GiB). Removed when the test passed; kept, and named
  in the failure report and the summary, when it failed. Job and ClusterJob
  (ftrun_testlib) put their directories there too, and a job still running
  when its test ends is stopped. A module-scoped fixture's directories and
  jobs belong to the module: removed when every test of the module passed.
- `build_dir`, `source_dir`: FTRUN_BUILD_DIR and FTRUN_SOURCE_DIR.
- A session whose every test was skipped exits 77, which CTest's
  SKIP_RETURN_CODE shows as skipped.
"""
import pytest

import ftrun_testlib

_kept = []  # scratch directories of failed tests, named again in the summary
_outcomes = {"passed": 0, "failed": 0, "skipped": 0}


class Check:
    """check(cond, what): records `what` when cond is false and returns cond."""

    def __init__(self):
        self.failures = []

    def __call__(self, cond, what):
        if not cond:
            self.failures.append(what)
            # The first line in the captured output (the whole text is in the failure report).
            print("FAILED:", str(what).split("\n", 1)[0], flush=True)
        return cond

    def report(self):
        return "%d check(s) failed:\n" % len(self.failures) + "\n".join("- " + str(w) for w in self.failures)


class _FailedChecks:
    """A failure report of soft checks: the whole list, and its first line for the short summary."""

    def __init__(self, check):
        self.text = check.report()
        first = str(check.failures[0]).split("\n", 1)[0]
        self.reprcrash = type("Crash", (), {"message": "%d check(s) failed: %s" % (len(check.failures), first)})

    def toterminal(self, tw):
        for line in self.text.split("\n"):
            tw.line(line)

    def __str__(self):
        return self.text


@pytest.fixture
def check(request):
    """The soft assertion (see the module docstring)."""
    c = Check()
    request.node._ftrun_check = c
    return c


@pytest.fixture
def scratch():
    """scratch(prefix): a directory for this test, removed when it passed and kept when it failed."""
    return ftrun_testlib.scratch


@pytest.fixture(scope="session")
def build_dir():
    return ftrun_testlib.BUILD


@pytest.fixture(scope="session")
def source_dir():
    return ftrun_testlib.SOURCE


def _release(owner, failed):
    owner.stop_processes()
    ftrun_testlib.remove_stale_deepspeed_shm()
    if failed:
        _kept.extend(owner.dirs)
    else:
        owner.remove()


@pytest.fixture(scope="module", autouse=True)
def _module_scratch(request):
    """The directories and jobs of the module's shared setup (module-scoped fixtures)."""
    owner = ftrun_testlib.push_scratch()
    request.node._ftrun_scratch = owner
    yield owner
    ftrun_testlib.pop_scratch(owner)
    _release(owner, getattr(request.node, "_ftrun_failed", False))


@pytest.fixture(autouse=True)
def _test_scratch(request):
    """The directories and jobs of one test."""
    owner = ftrun_testlib.push_scratch()
    request.node._ftrun_scratch = owner
    yield owner
    ftrun_testlib.pop_scratch(owner)
    call = getattr(request.node, "_ftrun_call", None)
    _release(owner, call is None or call.failed)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    rep = (yield).get_result()
    c = getattr(item, "_ftrun_check", None)
    if rep.when == "call" and c is not None and c.failures:
        if rep.failed:  # an assert stopped the test: the soft failures before it count too
            rep.sections.append(("failed checks", c.report()))
        else:
            rep.outcome = "failed"
            rep.longrepr = _FailedChecks(c)
    if rep.when == "call":
        item._ftrun_call = rep
    if rep.failed:
        module = item.getparent(pytest.Module)
        dirs = []
        for node in (item, module):
            if node is not None:
                dirs += getattr(node, "_ftrun_scratch", ftrun_testlib.Scratch()).dirs
        if module is not None:
            module._ftrun_failed = True
        if dirs:
            rep.sections.append(("scratch kept for a look", "\n".join(dirs)))


def pytest_runtest_logreport(report):
    if report.failed:
        _outcomes["failed"] += 1
    elif report.skipped:
        _outcomes["skipped"] += 1
    elif report.when == "call":
        _outcomes["passed"] += 1


def pytest_terminal_summary(terminalreporter):
    if _kept:
        terminalreporter.write_sep("-", "scratch directories kept for a look (their test failed)")
        for d in _kept:
            terminalreporter.write_line(d)


def pytest_sessionfinish(session, exitstatus):
    # Every test skipped (no root, no network namespaces, no torch, ...): 77, CTest's SKIP_RETURN_CODE.
    if exitstatus == 0 and _outcomes["skipped"] and not _outcomes["passed"] and not _outcomes["failed"]:
        session.exitstatus = 77
