"""A rank that checks ftrun.restore (tests/integration/test_restore_in_place.py).

A model with a buffer (BatchNorm) and Adam take two steps and save (version
1); two more steps change every tensor; ftrun.restore(model=, optim=) must
put version 1 back into the very same tensor objects and memory, bit for
bit, the CPU tensors read straight into (Client.load(into=), one pass;
chunks the memory already holds are left alone);
load(into=) refuses bad destinations with errors that name them. Then the
rank creates READY and waits for CORRUPTED (the test flips a byte of a
committed chunk in the agent's store): the restore must raise CORRUPTION.
Prints RESTORE OK <rank> when all held."""
import hashlib
import os
import sys
import time

import numpy as np
import torch

import ftrun
from ftrun.in_place import _Into
from ftrun.state_client import get_client  # (the rank's one connection)
from rank_say import say

RANK = int(os.environ["RANK"])
FLAGS = os.environ["FTRUN_TEST_FLAGS"]


def fail(what):
    say(f"RESTORE FAILED {RANK}: {what}")
    sys.exit(1)


def expect(cond, what):
    if not cond:
        fail(what)


torch.manual_seed(RANK)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.BatchNorm1d(512), torch.nn.ReLU(),
                            torch.nn.Linear(512, 64))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)


def step():
    loss = model(torch.randn(32, 64)).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def live():
    """name -> every live tensor of the model and the optimizer."""
    out = {f"model.{k}": t for k, t in model.state_dict(keep_vars=True).items()}
    for i, p in enumerate(model.parameters()):
        out.update({f"optim.{i}.{k}": t for k, t in opt.state[p].items() if torch.is_tensor(t)})
    return out


def digest():
    h = hashlib.sha256()
    for t in live().values():
        h.update(t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


step()
step()
ftrun.save(1, {"model": model.state_dict(), "optim": opt.state_dict(), "rng": ftrun.rng_state()}, wait=True)
want = digest()
step()
step()
expect(digest() != want, "the steps after the save changed the state")
before = {k: (id(t), t.data_ptr()) for k, t in live().items()}

# The plan: every CPU tensor of the model and of the optimizer goes in place.
into = _Into({"model": model, "optim": opt})
result = get_client().load(1, into=into)
expect(len(into.dests) == len(before), f"{len(into.dests)} of {len(before)} tensors planned in place")
for name, view in result.tensors.items():
    if name in into.dests:
        expect(view.ctypes.data == into.dests[name].data_ptr(), f"{name} came back as the given memory")
del result

start = ftrun.restore(model=model, optim=opt)
expect(start == 2, f"restore returned {start}, expected 2 (version 1 + 1)")
after = {k: (id(t), t.data_ptr()) for k, t in live().items()}
expect(after == before, "the restored tensors are the same objects in the same memory")
expect(digest() == want, "the restored state is bit-identical to the saved one")
# Live memory that already holds most of the version: a chunk that holds it is left alone, the others copied.
with torch.no_grad():
    model[0].weight[3, 5] += 1.0  # one chunk of one tensor
    model[3].bias.zero_()
start = ftrun.restore(model=model, optim=opt)
expect(start == 2 and digest() == want, "a partly changed state is restored bit-identical")
expect({k: (id(t), t.data_ptr()) for k, t in live().items()} == before, "the same objects in the same memory again")
step()  # and training goes on from it

# load(into=) refuses what it cannot write into, naming it.
client = get_client()
name = next(iter(client.load(1).tensors))
nbytes = client.load(1).tensors[name].nbytes
for bad, err, needle in [
        ({name: np.zeros(nbytes + 1, np.uint8)}, ValueError, f"into['{name}'] is {nbytes + 1} bytes"),
        ({"no-such-tensor": np.zeros(4, np.uint8)}, ValueError, "into names 'no-such-tensor'"),
        ({name: bytes(nbytes)}, ValueError, "read-only"),
        ({name: object()}, TypeError, "does not support the buffer protocol"),
        ({name: np.zeros((nbytes, 2), np.uint8)[:, 0]}, ValueError, "not C-contiguous"),
        ([name], TypeError, "into must be a dict")]:
    try:
        client.load(1, into=bad)
        fail(f"load(into={type(bad).__name__}) was accepted")
    except err as e:
        expect(needle in str(e), f"the error '{e}' names '{needle}'")

with open(os.path.join(FLAGS, f"ready-{RANK}"), "w") as f:
    f.write(digest())
while not os.path.exists(os.path.join(FLAGS, "corrupted")):
    time.sleep(0.01)
try:
    ftrun.restore(model=model, optim=opt)
    fail("a corrupted version was restored")
except ftrun.Error as e:
    expect(e.code == "CORRUPTION", f"a corrupted chunk raises CORRUPTION, got {e.code}: {e}")
say(f"RESTORE OK {RANK}")
