"""A rank under a small store budget (8 MiB): a save that cannot fit fails
with a clear error naming the config field, and the last committed version
stays loadable, byte for byte."""
import numpy as np

import ftrun
from rank_say import say

client = ftrun.Client()
w = np.arange((5 << 20) // 4, dtype=np.float32)  # 5 MiB
client.save(1, {"w": w}, user_bytes=b"v1")
client.wait_committed(1, timeout_ms=30000)
original = w.copy()

w += 1  # every chunk changes: 5 MiB more than the 3 MiB left
try:
    client.save(2, {"w": w})
    raise AssertionError("a save larger than the budget was accepted")
except ftrun.Error as e:
    assert e.code == "RESOURCE_EXHAUSTED", e.code
    assert "store.memory_budget" in e.message and "ftrun.yaml" in e.message, e.message
    say(f"refused as expected: {e.message}")

version, tensors, user = client.load()
assert version == 1 and user == b"v1", (version, user)
assert tensors["w"].tobytes() == original.tobytes()

# Back to the committed bytes: they are referenced, not copied, so it fits.
stats = client.save(3, {"w": original})
assert stats["bytes_copied"] == 0, stats
client.wait_committed(3, timeout_ms=30000)
say("PYRANK OK budget")
