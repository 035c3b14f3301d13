"""Engine-backed arrays: the Python Array API standard, every operation an engine push.

``xp = aioengine.array.namespace(engine)`` gives the Array API namespace (revision 2024.12,
with the ``linalg`` and ``fft`` extensions) bound to ``engine`` (an :class:`~aioengine.Engine`
or a :class:`~aioengine.BlockingEngine`). ``c = a @ b + 1`` returns at once with shape, dtype
and device known; ``await c`` gives the value (a read-only NumPy array). Operations run in
parallel where their buffers allow, in the order the engine's rule requires where they do not.

A small buffer owns one engine Var; a large one made by an elementwise operation is cut into
chunks, each with a Var of its own (``_chain.py``), and views and in-place writes hold the
chunks they touch; ``x.var`` merges them into one. With ``device=ae.remote()`` the chunks live
on a Dask cluster's workers (``_remote.py``).
Sync points (``float(x)``, ``np.asarray(x)``, ...) block off the event-loop thread and raise
:class:`PendingArrayError` on it while the value is pending. See ``docs/howto/arrays.md``;
``aioengine.array_api`` is the same namespace on a process-wide ``BlockingEngine``.

Layering: a front end on the public :class:`~aioengine.Engine` API only (``new_var``,
``push_sync``, ``delete_var``, ``wait_for_var``, ``wait_for_capacity``); import-linter keeps
it so (``pyproject.toml``). Inside, modules import downward only, annotations and imports
inside functions included (``tests/test_core_imports.py`` fails on a cycle); top to bottom:

1. the namespace, assembled from the groups below (``_namespace``);
2. the standard's groups: the namespace's mixins (``_creation``, ``_dtypes``, ``_indexing``,
   ``_manipulation``, ``_searching``, ``_statistics``, ``_products``), ``_info``, the
   extensions (``_linalg``, ``_fft``), NumPy's protocols (``_interop``), remote arrays
   (``_remote``);
3. how a function pushes: metadata, fusion, the engine push (``_push``; scans, ``_scan``);
4. chunked chains, one kernel per chunk (``_chain``);
5. the Array, the engine and loop it waits on, and its internal API (``_array``);
6. the Buffer: memory, its Vars, its outcome (``_buffer``);
7. what an operation runs (``_kernel``; ``_burst``, ``_remote_store``, ``_remote_zarr``);
8. leaves: shapes and dtypes (``_meta``), the elementwise functions (``_special``), threads and
   loops (``_sync``), recycled memory of large results (``_pool``), ``_reducers``, ``_blas``,
   ``_cupy_fuse``, ``_remote_kernel``.

A lower module names a higher one's class by a Protocol of what it uses (``_array``'s
``ArrayNamespace``, ``_kernel``'s ``Memory``) or by the base class that declares it
(``_push.Pusher``). So ``c = a + b`` reads one way: ``Array.__add__`` calls its namespace's
``_fast`` (``ArrayNamespace``: ``_push.Pusher``'s), which makes the result's Buffer or chunk
kernels (``_buffer``, ``_chain``) and pushes them; when one runs, ``_kernel.run2`` computes.
"""

from __future__ import annotations

import weakref

from .. import BlockingEngine, Engine
from ._array import Array, blocking_of
from ._chain import CHUNK_BYTES
from ._namespace import Namespace
from ._push import FUSE_MAX, INLINE_COST
from ._sync import PendingArrayError

__all__ = (
    "CHUNK_BYTES",
    "FUSE_MAX",
    "INLINE_COST",
    "Array",
    "Namespace",
    "PendingArrayError",
    "namespace",
)

# The namespace of each engine (its loop and caches live there), held weakly on both sides: a
# namespace refers to its engine, so a strong value would keep its own key (and the engine,
# its Vars and its loop) alive for ever. The arrays of a namespace and its users keep it; once
# nothing does, the next call makes a new one (no one can tell it from the old one).
_NAMESPACES: weakref.WeakKeyDictionary[object, weakref.ref[Namespace]] = weakref.WeakKeyDictionary()


def namespace(engine: Engine | BlockingEngine, *, chunk_bytes: int | None = None) -> Namespace:
    """The Array API namespace bound to ``engine`` (the same object on every call, while
    anything holds it: the namespace does not keep ``engine`` alive).

    ``chunk_bytes`` sets the chunk size of the namespace's large arrays (``_chain.py``: each
    chunk has a Var of its own, and an elementwise operation runs one kernel per chunk); by
    default the ``AIOENGINE_ARRAY_CHUNK_BYTES`` environment variable, else 1 MiB. It applies
    when the namespace is made: asking again with another value raises ``ValueError``.

    Raises:
        TypeError: if ``engine`` is not an Engine or a BlockingEngine.
        ValueError: if ``chunk_bytes`` is not an integer of at least 8, or differs from the
            existing namespace's.
    """
    if not isinstance(engine, Engine | BlockingEngine):
        raise TypeError(f"namespace() needs an aioengine Engine or BlockingEngine, got {engine!r}")
    key = engine.engine if isinstance(engine, BlockingEngine) else engine
    ref = _NAMESPACES.get(key)
    ns = ref() if ref is not None else None
    if ns is None or (isinstance(engine, BlockingEngine) and blocking_of(ns) is None):
        ns = Namespace(engine, chunk_bytes)
        _NAMESPACES[key] = weakref.ref(ns)
    elif chunk_bytes is not None and ns.chunk_bytes != chunk_bytes:
        raise ValueError(
            f"the namespace of {engine!r} exists with chunk_bytes={ns.chunk_bytes}; "
            "chunk_bytes is set when it is made"
        )
    return ns
