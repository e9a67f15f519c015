"""Recycled memory for large download results.

A new 256 MiB array is memory the kernel has to fault in and zero page by page on its first
write: for a download that is as much work as the copies themselves (docs/python.md, "Bulk
transfers"). ``empty`` hands out arrays of 32 MiB and more from anonymous mappings that are
taken back when the last array viewing one is gone, and kept (up to a cap) for the next
download of a similar size, which then writes memory that is already there: what a C++
client gets from an allocator such as tcmalloc.

The cap is ``$TESSERA_PY_BUFFER_CACHE`` bytes per process (default 256 MiB; 0 turns this off:
every array is numpy's own). The arrays are ordinary writable numpy arrays whose ``.base`` is
the ctypes array that owns the mapping.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import threading
import weakref
from typing import List

import numpy as np

#: Smaller arrays come from numpy's malloc, whose heap keeps and reuses freed blocks under
#: the package's mallopt thresholds (client.py, _keep_transfer_buffers_mapped).
MIN_BYTES = 32 << 20
_PAGE = 2 << 20  # a transparent huge page
_DEFAULT_CACHE_BYTES = 256 << 20


def _cache_bytes() -> int:
    try:
        return int(os.environ.get("TESSERA_PY_BUFFER_CACHE", _DEFAULT_CACHE_BYTES))
    except ValueError:
        return _DEFAULT_CACHE_BYTES


class _Pool:
    def __init__(self, cap: int) -> None:
        self.cap = cap
        # Reentrant: a garbage collection inside a locked section may give a mapping back.
        self._lock = threading.RLock()
        self._free: List[mmap.mmap] = []  # mappings no array views any more

    def take(self, nbytes: int) -> np.ndarray:
        memory = self._reuse(nbytes)
        if memory is None:
            memory = mmap.mmap(-1, -(-nbytes // _PAGE) * _PAGE,
                               flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            if hasattr(mmap, "MADV_HUGEPAGE"):
                try:
                    memory.madvise(mmap.MADV_HUGEPAGE)
                except OSError:
                    pass  # no transparent huge pages: 4 KiB pages
        # The ctypes array keeps the mapping alive (and exported) while any array views it;
        # when it is collected, every view is gone and the mapping may be written again.
        owner = (ctypes.c_ubyte * nbytes).from_buffer(memory)
        finalizer = weakref.finalize(owner, self._give_back, memory)
        finalizer.atexit = False
        return np.frombuffer(owner, np.uint8)

    def _reuse(self, nbytes: int) -> "mmap.mmap | None":
        with self._lock:
            # The smallest free mapping that holds nbytes without wasting more than half.
            fits = [m for m in self._free if nbytes <= len(m) <= 2 * nbytes]
            if not fits:
                return None
            memory = min(fits, key=len)
            self._free.remove(memory)
            return memory

    def _give_back(self, memory: mmap.mmap) -> None:
        # Called as the owner is collected, while it still holds its export of `memory`: a
        # mapping not kept is unmapped by reference counting once the owner is gone.
        if len(memory) > self.cap:
            return
        evicted: List[mmap.mmap] = []
        with self._lock:
            self._free.append(memory)
            while sum(len(m) for m in self._free) > self.cap:  # the oldest go first
                evicted.append(self._free.pop(0))
        for m in evicted:  # their owners are long gone
            m.close()


_pool = _Pool(_cache_bytes())


def empty(nbytes: int) -> np.ndarray:
    """A new writable uint8 array of ``nbytes`` (contents undefined)."""
    if nbytes < MIN_BYTES or _pool.cap <= 0:
        return np.empty(nbytes, np.uint8)
    return _pool.take(nbytes)
