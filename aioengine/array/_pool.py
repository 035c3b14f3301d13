"""Recycled memory for large results: the allocation of a chunked result, handed out again once
nothing references it.

A fused chain over 8e6 float64 elements writes a fresh 64 MB result. Memory that large comes
from the operating system on every allocation (it is above glibc's largest ``mmap`` threshold,
32 MiB) and is zeroed page by page as the chain first touches it: about a sixth of the chain's
time on a 2-core machine, on every step of an iterative program, which drops the previous result
as it makes the next. Smaller results fare little better when kernels on worker threads make
and drop them: the 2-layer MLP of the benchmarks (20 MB results) took 32-43 ms a step with
only results of 32 MiB and more kept here, 29-31 ms with those of :data:`MIN_BYTES` (1 MiB)
and more. So the results of chunk kernels (``_chain.py``) of at least :data:`MIN_BYTES` are
views of *bases* kept here, and a base is handed out again once nothing references it but
this pool: CPython's reference count says so exactly, since every NumPy view of a result
references the base itself (NumPy collapses a view's ``base`` to the array that owns the
memory), and so does anything exporting it (a memoryview, a DLPack capsule) through such a
view. A result the user still holds, or any view of it, keeps its base out of reach.

At most :data:`POOL_BYTES` are kept (``AIOENGINE_ARRAY_POOL_BYTES``, 256 MiB by default; 0 turns
the pool off): a base that would not fit is allocated plainly, and free bases go, oldest
first, to make room. Smaller allocations are left to the allocator, which reuses them warm.

State: ``Pool.bases`` (the kept allocations, oldest first) and ``Pool.kept`` (their bytes),
guarded by ``Pool.lock`` (kernels allocate on worker threads).
"""

from __future__ import annotations

import math
import os
import sys
import threading
from typing import Any

import numpy as np

__all__ = ("MIN_BYTES", "POOL", "POOL_BYTES", "Pool", "empty")

#: Results at least this large come from the pool (measured: see the module docstring).
MIN_BYTES = 1 << 20


def _pool_bytes() -> int:
    raw = os.environ.get("AIOENGINE_ARRAY_POOL_BYTES")
    if raw is None:
        return 256 << 20
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(
            f"AIOENGINE_ARRAY_POOL_BYTES must be a number of bytes (0 turns the pool off), "
            f"got {raw!r}"
        ) from None
    if value < 0:
        raise ValueError(f"AIOENGINE_ARRAY_POOL_BYTES must be >= 0, got {value}")
    return value


#: The most bytes the pool keeps (``AIOENGINE_ARRAY_POOL_BYTES``; 0: off).
POOL_BYTES = _pool_bytes()

#: Reference counts are exact only with the GIL (a free-threaded build defers some).
_EXACT = getattr(sys, "_is_gil_enabled", lambda: True)()


class Pool:
    """The kept bases (see the module docstring)."""

    def __init__(self, limit: int) -> None:
        self.lock = threading.Lock()
        #: The most bytes kept.
        self.limit = limit
        #: The kept allocations (1-D uint8 arrays), oldest first. Guarded by ``lock``.
        self.bases: list[np.ndarray[Any, Any]] = []
        #: Their bytes. Guarded by ``lock``.
        self.kept = 0

    def empty(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
        """An uninitialised C-contiguous array of ``shape`` and ``dtype``: a view of a free
        base of at least its size and at most twice it if there is one (the smallest), else
        of a new base kept if it fits, else a plain allocation."""
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < MIN_BYTES or nbytes > self.limit or not _EXACT:
            return np.empty(shape, dtype)
        with self.lock:
            bases = self.bases
            best = -1
            for i in range(len(bases)):
                size = bases[i].nbytes
                # Free: referenced by the list and the getrefcount argument only (a result or
                # any view of it would reference the base too).
                # At most twice its size: a small result must not pin a large base.
                if (
                    nbytes <= size <= 2 * nbytes
                    and (best < 0 or size < bases[best].nbytes)
                    and sys.getrefcount(bases[i]) == 2
                ):
                    best = i
            if best >= 0:
                base = bases.pop(best)
                bases.append(base)  # the most recently used goes last
            else:
                i = 0
                while self.kept + nbytes > self.limit and i < len(bases):
                    if sys.getrefcount(bases[i]) == 2:
                        self.kept -= bases.pop(i).nbytes
                    else:
                        i += 1
                if self.kept + nbytes > self.limit:
                    return np.empty(shape, dtype)
                base = np.empty(nbytes, np.uint8)
                bases.append(base)
                self.kept += nbytes
            return base[:nbytes].view(dtype).reshape(shape)


#: The process's pool.
POOL = Pool(POOL_BYTES)


def empty(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """:meth:`Pool.empty` of the process's pool."""
    return POOL.empty(shape, dtype)
