"""Maps the agent's store into this process ahead of the saves.

A save copies into extents of the agent's store, which this process maps
lazily: until the process has touched a page of the store once, writing it
takes a page fault. After the first save (ftrun.state's docstring has the
figures), a background thread maps in (MADV_POPULATE_WRITE, Linux >= 5.14)
every page of the store the agent has already allocated (mincore), in 16 MiB
slices, while training goes on; it never allocates store memory the agent
has not. FTRUN_POPULATE_STORE=0 turns it off.
"""

import ctypes
import mmap
import os
import threading

from . import state_client

_MADV_POPULATE_WRITE = 23  # Linux >= 5.14
_POPULATE_SLICE = 16 << 20  # short holds of the mmap lock: the saves map pages too
_populating = None      # the client whose store mapping is (being) populated


def _store_ranges():
    """(start, end) of this process's shared mappings of an ftrun store (the
    agent's memfd 'ftrun-<job>-node<N>')."""
    out = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.split(None, 5)
                if len(fields) == 6 and fields[1] == "rw-s" and fields[5].startswith("/memfd:ftrun-"):
                    lo, hi = (int(x, 16) for x in fields[0].split("-"))
                    out.append((lo, hi))
    except OSError:
        pass
    return out


def _populate_store(client):
    """Maps in the resident pages of the store (see the module docstring);
    stops at the first error (old kernel, the client closed or replaced)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    except (OSError, AttributeError):
        return
    page = mmap.PAGESIZE
    vec = (ctypes.c_ubyte * (_POPULATE_SLICE // page))()
    for lo, hi in _store_ranges():
        for off in range(lo, hi, _POPULATE_SLICE):
            if state_client._client is not client:
                return
            n = min(_POPULATE_SLICE, hi - off)
            if libc.mincore(off, n, vec) != 0:
                return
            resident = bytes(vec)[:(n + page - 1) // page]
            i = 0
            while i < len(resident):
                if not resident[i] & 1:
                    i += 1
                    continue
                j = resident.find(b"\x00", i)  # residency is bit 0; the other bits are 0
                j = len(resident) if j < 0 else j
                if libc.madvise(off + i * page, min(n, j * page) - i * page, _MADV_POPULATE_WRITE) != 0:
                    return
                i = j


def _start_populating(client):
    global _populating
    if _populating is client or os.environ.get("FTRUN_POPULATE_STORE", "1") == "0":
        return
    _populating = client
    threading.Thread(target=_populate_store, args=(client,), name="ftrun-populate", daemon=True).start()
