"""The Array API namespace on a process-wide :class:`~aioengine.BlockingEngine`.

For synchronous scripts, Array-API-generic libraries and the Array API test suite
(``ARRAY_API_TESTS_MODULE=aioengine.array_api``): ``import aioengine.array_api as xp`` and use
it from any thread. The engine is not the running loop's: it is a ``BlockingEngine`` of this
module's own (its loop on a thread of its own), started on first use of a function that needs
it and closed at interpreter exit. Dtypes, constants and ``__array_api_version__`` are
available without starting it. Sync points (``float(x)``, ``np.asarray(x)``, and ``x.shape``
of a data-dependent dimension, ``str(x)``) block the calling thread until the value is ready,
and an array operation waits for room before it returns when ``AIOENGINE_MAX_PENDING`` bounds
the pending operations, so a synchronous loop cannot run away. That holds in a coroutine too
(a notebook cell, ``asyncio.run()``): the engine's loop is not the caller's, so waiting there
cannot deadlock, and ``await x`` works as well. The namespace's ``__name__`` is this module's,
which is how array-api-compat, scikit-learn and SciPy tell it apart.

The engine's settings come from the environment (``AIOENGINE_CPU_WORKERS``,
``AIOENGINE_SERIAL``, ``AIOENGINE_MAX_PENDING``, ...), as for any engine created without
arguments. With ``AIOENGINE_CLUSTER`` set (a scheduler's address, or ``local``), the engine
runs on that Dask cluster and this module's functions that place a new array (``asarray``,
``zeros``, ``ones``, ``empty``, ``full``, ``arange``, ``linspace``, ``from_zarr``) put its
chunks on the cluster's workers when given no ``device``: a synchronous script scales out
by setting one variable (``docs/howto/arrays-cluster.md``). The namespace itself
(``x.__array_namespace__()``) keeps ``cpu(0)`` as its default device.
"""

from __future__ import annotations

import atexit
import functools
import threading
import warnings
from typing import Any

import numpy as np

from . import BlockingEngine
from .array import Namespace, namespace
from .array._remote import PLACING
from .context import remote
from .settings import cluster_setting

__array_api_version__ = Namespace.__array_api_version__

# The constants and dtypes, without starting the engine (the namespace's own, by name).
e, inf, nan, pi, newaxis = Namespace.e, Namespace.inf, Namespace.nan, Namespace.pi, None

bool = np.dtype("bool")
int8 = np.dtype("int8")
int16 = np.dtype("int16")
int32 = np.dtype("int32")
int64 = np.dtype("int64")
uint8 = np.dtype("uint8")
uint16 = np.dtype("uint16")
uint32 = np.dtype("uint32")
uint64 = np.dtype("uint64")
float32 = np.dtype("float32")
float64 = np.dtype("float64")
complex64 = np.dtype("complex64")
complex128 = np.dtype("complex128")

_lock = threading.Lock()
_engine: BlockingEngine | None = None
_namespace: Namespace | None = None


def _close() -> None:
    """Close this module's engine (at interpreter exit). Failures that no ``await``, sync
    point or wait raised are said once, as a RuntimeWarning (as an engine says of failures
    it loses), not as a traceback of this callback."""
    global _engine, _namespace
    with _lock:
        engine, _engine, _namespace = _engine, None, None
    if engine is None:
        return
    try:
        engine.close()
    except BaseExceptionGroup as group:
        first = group.exceptions[0]
        # No frame of the user's is left to point at: the module itself is the warning's
        # location (one line on stderr, filterable as any warning).
        warnings.warn_explicit(
            f"its engine closed at interpreter exit with {len(group.exceptions)} failure(s) "
            f"that no await, sync point or wait raised; the first: "
            f"{type(first).__name__}: {first}",
            RuntimeWarning,
            __name__,
            0,
        )


def default_namespace() -> Namespace:
    """The namespace of this module's engine, started on first use (thread-safe)."""
    global _engine, _namespace
    ns = _namespace
    if ns is not None:
        return ns
    with _lock:
        if _namespace is None:
            engine = BlockingEngine()
            engine.__enter__()
            _engine = engine
            ns = namespace(engine)
            ns.__name__ = __name__  # what array-api-compat and its users see
            if cluster_setting(None) is not None:
                _place_remotely.update(PLACING)
            _namespace = ns
            atexit.register(_close)
        return _namespace


#: The functions that place a new array on the cluster when given no ``device`` (those of
#: ``PLACING`` once the engine is started with ``AIOENGINE_CLUSTER`` set; else none).
_place_remotely: set[str] = set()


def _on_the_cluster(fn: Any) -> Any:
    """``fn`` (a function that places a new array) with ``device=ae.remote()`` unless the
    caller names a device."""

    @functools.wraps(fn)
    def place(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("device") is None:
            kwargs["device"] = remote()
        return fn(*args, **kwargs)

    return place


def __getattr__(name: str) -> Any:
    if name.startswith("__") and name != "__array_namespace_info__":
        raise AttributeError(name)
    ns = default_namespace()
    try:
        attr = getattr(ns, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    return _on_the_cluster(attr) if name in _place_remotely else attr


def __dir__() -> list[str]:
    return sorted(
        set(globals())
        | {n for n in dir(Namespace) if not n.startswith("_")}
        | {"linalg", "fft", "__array_namespace_info__"}
    )
