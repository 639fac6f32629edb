"""A rank (run by ftrun-agent) that checks Client.load(map=True): tensors
mapped copy-on-write from the store. Prints PYRANK OK mapped <rank>.

1. Mapped tensors hold the saved bytes, also when their chunks lie apart in
   the store (a version that changed one chunk of three), and they are
   mappings of the store's memfd, not copies.
2. Writing to a mapped tensor changes this process's copy only.
3. A mapped tensor kept alive across later saves keeps its bytes, while the
   store (a small budget, every save changing every byte) reuses the memory
   the loaded version had: the save before that must have detached it.
4. A byte flipped in the store's shared memory: load fails with CORRUPTION
   naming the tensor, mapped or not.
"""
import ctypes
import os

import numpy as np

import ftrun
from rank_say import say

rank = int(os.environ["RANK"])
client = ftrun.Client()
MIB = 1 << 20


def memfd_mappings(perms):
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(None, 5)
            if len(fields) == 6 and fields[1] == perms and fields[5].startswith("/memfd:ftrun-"):
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                out.append((lo, hi))
    return out


def expect_error(fn, code, *needles):
    try:
        fn()
    except ftrun.Error as e:
        assert e.code == code, (e.code, e.message)
        for n in needles:
            assert n in e.message, (n, e.message)
        return
    raise AssertionError("no error for " + code)


rng = np.random.default_rng(100 + rank)
marker = np.frombuffer(b"FTRUN-MAP-TEST-%d" % rank + b"\0" * 14, dtype=np.uint8)[:16]
big = rng.integers(0, 255, 3 * MIB, dtype=np.uint8)  # 3 chunks of 1 MiB
big[:16] = marker
state = {"big": big, "small": np.arange(10, dtype=np.int64), "wide": rng.standard_normal(300000).astype(np.float32)}
client.save(1, state)
state["big"][MIB + 5] ^= 0xFF  # version 2 shares chunks 0 and 2 with version 1
client.save(2, state)
client.wait_committed(2, timeout_ms=30000)

# 1. Same bytes; mapped, not copied.
version, tensors, _ = client.load(map=True)
assert version == 2, version
for k, a in state.items():
    assert tensors[k].dtype == a.dtype and tensors[k].shape == a.shape, k
    assert tensors[k].tobytes() == a.tobytes(), k
private = memfd_mappings("rw-p")
for k in ("big", "wide"):
    addr = tensors[k].ctypes.data
    assert not tensors[k].flags.owndata, k
    assert any(lo <= addr < hi for lo, hi in private), f"'{k}' is not a private mapping of the store"
assert tensors["small"].flags.owndata, "a tensor under 64 KiB is copied"

# 2. Copy on write: the store keeps the saved bytes.
tensors["big"][MIB + 7] ^= 0x55
again = client.load(map=False)[1]
assert again["big"].tobytes() == state["big"].tobytes(), "a write to a mapped tensor reached the store"
assert tensors["big"][MIB + 7] == state["big"][MIB + 7] ^ 0x55
del again

# 3. Kept alive across saves that reuse the store's memory.
kept = tensors["wide"]
want = state["wide"].copy()
del tensors
for v in range(3, 9):
    state["wide"] = rng.standard_normal(300000).astype(np.float32)
    state["big"] = rng.integers(0, 255, 3 * MIB, dtype=np.uint8)
    client.save(v, state)
    client.wait_committed(v, timeout_ms=30000)
assert kept.tobytes() == want.tobytes(), "a mapped tensor changed after later saves (not detached)"
del kept

# 4. A flipped byte in shared memory is found by either load.
state["big"][:16] = marker
client.save(9, state)
client.wait_committed(9, timeout_ms=30000)
hits = []
for lo, hi in memfd_mappings("rw-s"):
    seg = bytes((ctypes.c_ubyte * (hi - lo)).from_address(lo))
    at = seg.find(marker.tobytes())
    while at >= 0:
        hits.append(lo + at)
        at = seg.find(marker.tobytes(), at + 1)
assert hits, "the saved bytes are in the store"
for addr in hits:
    ctypes.c_ubyte.from_address(addr + 100).value ^= 1
for mapped in (True, False):
    expect_error(lambda: client.load(9, map=mapped), "CORRUPTION", "tensor 'big'", "corrupted in shared memory")
for addr in hits:
    ctypes.c_ubyte.from_address(addr + 100).value ^= 1
assert client.load(9, map=True)[1]["big"].tobytes() == state["big"].tobytes()

say(f"PYRANK OK mapped {rank}")
