"""Fixtures of the harness's Python unit tests."""
import os

import pytest


@pytest.fixture
def write(scratch):
    """write(name, text): a plan file in the test's directory; returns its path."""
    tmp = scratch("ftrun-chaos-plan-")

    def write(name, text):
        path = os.path.join(tmp, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    write.dir = tmp
    return write
