"""Fixtures of the Python unit tests."""
import os
import socket

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


@pytest.fixture(scope="module")
def one_rank_group():
    """A real one-rank gloo process group on a free local port, for the module's tests (torch imported only
    by the modules that use it)."""
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
