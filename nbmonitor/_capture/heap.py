"""Keeps glibc from giving the heap back to the system every training step once a monitor attaches.

glibc's malloc returns the top of its heap to the system when more than ``trim_threshold`` bytes
there are free, and serves blocks above ``mmap_threshold`` by ``mmap``. Both start at 128 KiB and
rise on their own: the mmap threshold to the size of the largest ``mmap``-ed block freed so far
(up to 32 MiB on 64-bit), the trim threshold to twice that. A CPU training loop frees its step's
tensors at the end of every step, so whether that memory stays mapped depends on where every
other live allocation of the process happens to sit. The few small tensors a monitor makes per
step are enough to tip it, and trimming every step costs a CPU loop a share of its step time
(the counts and figures: benchmarks/NOTES.md, "The heap").

``settle_heap`` frees one block just under that 32 MiB cap once per process, which raises both
thresholds exactly as freeing any large tensor or array would: blocks below ~31 MiB then come
from the heap, which keeps up to ~62 MiB free at its top instead of trimming. It changes no
setting (``mallopt``), changes nothing where the user has set glibc's thresholds (``MALLOC_*``
variables turn the dynamic ones off), only ever raises them, and does nothing off glibc.
"""

from __future__ import annotations

import ctypes
import os

# Just under glibc's DEFAULT_MMAP_THRESHOLD_MAX (32 MiB on 64-bit): a freed mmap-ed block raises
# the thresholds only up to that size, and its chunk is a page larger than the request.
SETTLE_BYTES = 31 * 2**20

_settled = False


def is_glibc() -> bool:
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (AttributeError, OSError, ValueError):  # no confstr, or no such name on this OS
        return False


def settle_heap() -> bool:
    """Once per process on glibc: free one ~31 MiB block so that malloc's dynamic mmap and trim
    thresholds are at least that high. True if it did so now."""
    global _settled
    if _settled or not is_glibc():
        return False
    _settled = True
    try:
        libc = ctypes.CDLL(None)
        libc.malloc.restype = ctypes.c_void_p
        libc.malloc.argtypes = [ctypes.c_size_t]
        libc.free.restype = None
        libc.free.argtypes = [ctypes.c_void_p]
        block = libc.malloc(SETTLE_BYTES)  # mapped, never touched: no page is faulted in
        if not block:
            return False
        libc.free(block)
    except (OSError, AttributeError):
        return False
    return True


__all__ = ["SETTLE_BYTES", "is_glibc", "settle_heap"]
