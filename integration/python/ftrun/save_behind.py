"""Host saves that overlap training: ftrun.save(..., overlap=True) of CPU
tensors. The copy into the agent's store (hash and memcpy, in C++ without
the GIL) runs on one background thread while the rank goes on with its next
forward and backward pass; the next torch optimizer step (which writes the
saved parameters and optimizer state), the next save, ftrun.wait() and
ftrun.load() wait for it first. An error of the background save (a full
store, a changed layout) is raised there.

What blocks training is then the packing (the state dict's structure, a
pickle) plus whatever part of the copy the forward and backward pass did not
cover; `blocked_seconds()` is the time spent waiting for copies, for
benchmarks to count it as stall.

The same rule as for CUDA overlap: nothing but the optimizer may write the
saved tensors between a save and the next optimizer step (BatchNorm's
running statistics are written in the forward pass: save them without
overlap).
"""
import threading
import time
from concurrent.futures import ThreadPoolExecutor

_lock = threading.Lock()
_executor = None
_pending = None      # the Future of the save in flight
_blocked = 0.0       # seconds callers waited in finish()


def submit(version, store):
    """Runs store() (the save of `version`, which holds the arrays it copies
    until it is done) on the background thread, after the previous one
    finished. Returns a stats dict naming the version."""
    global _executor, _pending
    finish()
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ftrun-save-behind")
        _pending = _executor.submit(store)
    return {"version": version, "overlapped": True}


def finish():
    """Waits for the save in flight, if any; returns its stats (None when
    none was in flight) or raises its error."""
    global _pending, _blocked
    with _lock:
        pending, _pending = _pending, None
    if pending is None:
        return None
    t0 = time.monotonic()
    try:
        return pending.result()
    finally:
        _blocked += time.monotonic() - t0


def abandon():
    """Forgets the save in flight of a generation that ends (warm recovery): it finishes or fails against
    that generation's client, and nothing of it reaches the next generation."""
    global _pending
    with _lock:
        pending, _pending = _pending, None
    if pending is not None:
        pending.add_done_callback(lambda f: f.exception())  # (its error is the old generation's)


def blocked_seconds():
    """Seconds this process spent waiting for overlapped host saves to finish."""
    return _blocked
