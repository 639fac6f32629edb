"""The install tests' `run` fixture: install_lib.run with the test's soft assertion."""
import functools

import pytest

import install_lib


@pytest.fixture
def run(check):
    """run(what, argv, timeout=90, expect_rc=0, **popen_kwargs) -> (rc, output); a wrong exit code is a failed
    check, and the output is shown."""
    return functools.partial(install_lib.run, check)
