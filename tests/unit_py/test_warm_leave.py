"""Checks ftrun.warm_leave's retirement of a left generation's connections
on real loopback sockets and a real epoll set, as gloo's loop holds them, and
its reset of accelerate's process-wide state (the real accelerate), and the
gradients it drops from what a generation kept (real torch modules).

Run from the build tree: PYTHONPATH=build/python python3 -m pytest tests/unit_py/test_warm_leave.py
"""
import os
import select
import socket

import pytest

from ftrun import warm_leave


def ino(fd):
    return os.fstat(fd).st_ino


@pytest.fixture
def left_group():
    """A listener and three connections to it, taken as one generation's; its
    connections shut down (as the agent does when the generation is left).
    The listener's accepted ends count as older than the generation."""
    server = socket.create_server(("127.0.0.1", 0))
    clients = [socket.create_connection(server.getsockname()) for _ in range(3)]
    accepted = [server.accept()[0] for _ in clients]
    quiet = socket.socketpair()
    before = warm_leave._socket_inodes() - {ino(c.fileno()) for c in clients}
    for c in clients:
        c.shutdown(socket.SHUT_RDWR)
    yield server, clients, accepted, quiet, before
    for s in [server, *clients, *accepted, *quiet]:
        s.close()


def test_swaps_unwatched_connections_only(left_group):
    """A connection no epoll set watches gets the quiet socket in place (same
    descriptor number); one an epoll set watches stays, and its loop can
    still unregister it; older sockets stay."""
    server, clients, accepted, quiet, before = left_group
    watched, free, also_free = clients
    loop = select.epoll()
    loop.register(watched.fileno(), select.EPOLLIN)
    want_watched = ino(watched.fileno())
    olds = {s.fileno(): ino(s.fileno()) for s in [server, *accepted]}

    assert (watched.fileno(), want_watched) in warm_leave._epoll_watched()
    warm_leave._retire_connections(before, quiet[0].fileno(), master_port=0)

    assert ino(free.fileno()) == ino(quiet[0].fileno())
    assert ino(also_free.fileno()) == ino(quiet[0].fileno())
    assert ino(watched.fileno()) == want_watched
    assert {fd: ino(fd) for fd in olds} == olds
    loop.unregister(watched.fileno())  # what gloo's pair does on the hang-up: must not fail
    loop.close()


def test_a_watched_descriptor_swapped_fails_its_loop(left_group):
    """Why watched connections are left alone: the epoll set's entry goes
    with the replaced file, and the loop's epoll_ctl(DEL) on the descriptor
    then fails with ENOENT (gloo enforces it: std::terminate)."""
    _, clients, _, quiet, _ = left_group
    loop = select.epoll()
    loop.register(clients[0].fileno(), select.EPOLLIN)
    os.dup2(quiet[0].fileno(), clients[0].fileno(), inheritable=False)
    with pytest.raises(FileNotFoundError):
        loop.unregister(clients[0].fileno())
    loop.close()


def test_keeps_the_rendezvous_store_port(left_group):
    """A connection whose own port is the rendezvous store's (rank 0 serves
    it) stays even when it is new."""
    server, _, accepted, quiet, before = left_group
    port = server.getsockname()[1]
    mine = accepted[0]
    want = ino(mine.fileno())
    warm_leave._retire_connections(before - {want}, quiet[0].fileno(), master_port=port)
    assert ino(mine.fileno()) == want


def test_accelerate_state_is_made_anew_after_a_generation(monkeypatch):
    """A generation's accelerate state (a Trainer makes it through TrainingArguments) is made once per
    process and kept: after _reset_accelerate nothing of it is left, so the next generation's
    PartialState is made again from its environment (and makes its process group), as in a fresh process."""
    from accelerate import state  # (in requirements.txt: a missing accelerate fails the test, never skips it)

    monkeypatch.setenv("WORLD_SIZE", "1")
    state.PartialState(cpu=True)
    state.GradientState()
    assert state.PartialState._shared_state and state.GradientState._shared_state
    warm_leave._reset_accelerate()
    assert not state.PartialState._shared_state and not state.AcceleratorState._shared_state \
        and not state.GradientState._shared_state
    assert state.PartialState(cpu=True).initialized  # made again
    warm_leave._reset_accelerate()


def test_drop_gradients_of_kept_modules_and_tensors():
    """A left generation's gradients go from what it kept (modules, tensors); nothing else changes."""
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    loose = torch.ones(5, requires_grad=True)
    other = torch.nn.Linear(2, 2)  # not kept: keeps its gradient
    (model(torch.ones(1, 4)).sum() + loose.sum() + other(torch.ones(1, 2)).sum()).backward()
    weights = [p.detach().clone() for p in model.parameters()]
    assert all(p.grad is not None for p in model.parameters()) and loose.grad is not None
    warm_leave._drop_gradients([model, loose, "not torch", 3])
    assert all(p.grad is None for p in model.parameters()) and loose.grad is None
    assert other.weight.grad is not None
    assert all(torch.equal(w, p) for w, p in zip(weights, model.parameters()))
