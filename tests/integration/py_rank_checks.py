"""A rank (run by ftrun-agent) that checks the Python client end to end:
round trips of several dtypes, generations, version listing, commit waits,
and the errors for bad saves. Prints PYRANK OK <rank> when all held."""
import os
import sys

import numpy as np

import ftrun
from rank_say import say

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
client = ftrun.Client()
assert client.rank == rank
assert client.restore_version is None, "fresh start expected"

rng = np.random.default_rng(rank)
state = {
    "w": rng.standard_normal((64, 1024)).astype(np.float32),
    "step": np.array([7], dtype=np.int64),
    "half": rng.standard_normal(5000).astype(np.float16),
    "bf16": rng.integers(0, 1 << 16, 3000, dtype=np.uint16),
    "mask": rng.integers(0, 2, 333).astype(np.bool_),
}
dtypes = {"bf16": "bfloat16"}

stats = client.save(1, state, user_bytes=b"rng-state-%d" % rank, dtypes=dtypes)
assert stats["bytes_copied"] == sum(a.nbytes for a in state.values()), stats
client.wait_committed(1, timeout_ms=30000)

# Nothing changed and the caller says so: nothing is read or copied.
gens = {k: 1 for k in state}
client.save(2, state, dtypes=dtypes, generations=gens)
stats = client.save(3, state, dtypes=dtypes, generations=gens)
assert stats["bytes_copied"] == 0 and stats["bytes_hashed"] == 0, stats
# Without generations the bytes are hashed but still not copied.
stats = client.save(4, state, dtypes=dtypes)
assert stats["bytes_copied"] == 0 and stats["bytes_hashed"] > 0, stats

state["w"][3, 5] += 1.0
stats = client.save(5, state, dtypes=dtypes)
assert 0 < stats["bytes_copied"] <= client.chunk_size, stats
client.wait_committed(5, timeout_ms=30000)

res = client.load()
version, tensors, user = res
assert version == 5, version
assert user == b"", user
for k, a in state.items():
    assert tensors[k].shape == a.shape, k
    assert tensors[k].tobytes() == a.tobytes(), k
assert res.dtypes["bf16"] == "bfloat16", res.dtypes
assert res.dtypes["w"] == "float32", res.dtypes
del res, tensors

lv = client.list_versions()
assert lv["committed"][-1] == 5 and lv["restore"] == 5, lv


def expect_error(fn, code, *needles):
    try:
        fn()
    except ftrun.Error as e:
        assert e.code == code, (e.code, e.message)
        for n in needles:
            assert n in e.message, (n, e.message)
        return
    raise AssertionError("no error for " + code)


expect_error(lambda: client.save(5, state, dtypes=dtypes), "FAILED_PRECONDITION", "versions must increase")
expect_error(lambda: client.save(4, state, dtypes=dtypes), "FAILED_PRECONDITION", "already saved version 5")
extra = dict(state, new_tensor=np.zeros(4, np.float32))
expect_error(lambda: client.save(6, extra, dtypes=dtypes), "FAILED_PRECONDITION", "new_tensor")
reshaped = dict(state, w=state["w"].reshape(1024, 64))
expect_error(lambda: client.save(6, reshaped, dtypes=dtypes), "FAILED_PRECONDITION", "'w'", "[1024, 64]", "[64, 1024]")
try:
    client.save(6, dict(state, w=state["w"][:, ::2]), dtypes=dtypes)
    raise AssertionError("a non-contiguous array was accepted")
except ValueError as e:
    assert "w" in str(e), e
expect_error(lambda: client.load(6), "FAILED_PRECONDITION", "not committed")


# CUDA memory (__cuda_array_interface__): a malformed description is refused
# before any device work, with the tensor and the field named, and nothing
# committed is lost. No GPU is needed for these.
class Cai:
    def __init__(self, desc=None, error=None):
        self._desc, self._error = desc, error

    @property
    def __cuda_array_interface__(self):
        if self._error:
            raise RuntimeError(self._error)
        return self._desc


good = {"shape": (4,), "typestr": "<f4", "data": (0xDEAD000, False), "version": 2}
for desc, exc, needles in [
    ({k: v for k, v in good.items() if k != "data"}, ValueError, ("'gpu'", "lacks the field 'data'")),
    (dict(good, typestr="<c8"), TypeError, ("'gpu'", "unsupported typestr")),
    (dict(good, typestr=">f4"), TypeError, ("'gpu'", "byte order")),
    (dict(good, strides=(8,)), ValueError, ("'gpu'", "not C-contiguous")),
    (dict(good, shape=(-1,)), ValueError, ("'gpu'", "negative")),
    (dict(good, data=None), ValueError, ("'gpu'", "field 'data' must be a tuple")),
    (dict(good, shape=("4",)), ValueError, ("'gpu'", "field 'shape' must hold ints")),
    (5, TypeError, ("'gpu'", "is not a dict")),
    (None, TypeError, ("'gpu'", "cannot read it", "no device here")),
]:
    obj = Cai(desc) if desc is not None else Cai(error="no device here")
    try:
        client.save(6, dict(state, gpu=obj), dtypes=dtypes)
        raise AssertionError(f"a bad CUDA description was accepted: {desc}")
    except exc as e:
        for n in needles:
            assert n in str(e), (n, str(e))
# A well-formed description of memory that is not CUDA memory (or with no
# usable GPU, or a libftrun without CUDA) is an ftrun.Error naming why.
try:
    client.save(6, dict(state, gpu=Cai(good)), dtypes=dtypes)
    raise AssertionError("a bogus CUDA pointer was accepted")
except ftrun.Error as e:
    assert e.code in ("UNAVAILABLE", "INVALID_ARGUMENT", "UNIMPLEMENTED"), (e.code, e.message)
# load(cuda=...): the targets must name loaded tensors, be a dict, and have the saved size.
for cuda, exc, needle in [
    ({"nope": Cai(good)}, ValueError, "'nope', which is not in the loaded version"),
    ({"step": Cai(dict(good, shape=(3,)))}, ValueError, "cuda['step'] is 12 bytes, the saved tensor 8"),
    (5, TypeError, "cuda must be a dict"),
    (lambda user_bytes: [], TypeError, "cuda must be a dict"),
]:
    try:
        client.load(5, cuda=cuda)
        raise AssertionError(f"load(cuda={cuda!r}) was accepted")
    except exc as e:
        assert needle in str(e), (needle, str(e))
version, tensors, _ = client.load(5)
assert version == 5 and tensors["w"].tobytes() == state["w"].tobytes(), "the committed version survives bad inputs"
del tensors
say(f"PYRANK CUDA INPUTS OK {rank}")

# Blocking calls release the GIL: another thread keeps running while this
# one waits for a version that will never commit.
import threading

ticks = [0]
stop = threading.Event()


def spin():
    while not stop.is_set():
        ticks[0] += 1


t = threading.Thread(target=spin)
t.start()
expect_error(lambda: client.wait_committed(10 ** 9, timeout_ms=500), "TIMEOUT")
during = ticks[0]
stop.set()
t.join()
assert during > 10000, f"the GIL was held during wait_committed ({during} ticks)"
say(f"PYRANK GIL OK {rank}")
say(f"PYRANK OK {rank}")
