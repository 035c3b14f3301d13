"""BLAS threads: matmul-class operations that run at once must not oversubscribe the cores.

NumPy's BLAS (OpenBLAS, MKL, ...) runs a matrix product on threads of its own, one per core by
default. One product at a time should have them all (that is what NumPy gives a plain script);
but the engine's pool runs independent operations at once, and two products on two workers,
each with a thread per core, put twice as many threads as cores to work (OpenBLAS's threads
also spin while they wait): on a busy machine that made a model train three times slower than
on NumPy. The BLAS thread count is process-wide (not per thread), so the rule is kept with a
count of the BLAS-class operations running (:class:`BlasShares`): while two or more run, BLAS
runs on one thread each (each worker is one core's worth); when one is left, BLAS gets its
threads back. A product that started alone keeps the threads it started with until it returns.

threadpoolctl finds the BLAS libraries NumPy loaded and sets their thread counts (under a
microsecond a call); without it, nothing is limited. The user's own BLAS setting
(``OPENBLAS_NUM_THREADS``, ``threadpoolctl.threadpool_limits``) is the count restored.

State (process-wide, guarded by ``_lock``): the number of BLAS-class operations running, and
whether BLAS is limited now.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

__all__ = ("blas_call", "blas_running")

_lock = threading.Lock()
_running = 0  # BLAS-class operations running now (guarded by _lock)
_saved: list[tuple[Any, int]] | None = None  # the libraries' counts while limited (_lock)
_libraries: list[Any] | None = None  # threadpoolctl's BLAS controllers, found on first use


def _blas_libraries() -> list[Any]:
    global _libraries
    if _libraries is None:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:  # pragma: no cover - threadpoolctl is a dependency
            _libraries = []
        else:
            _libraries = list(ThreadpoolController().select(user_api="blas").lib_controllers)
    return _libraries


def _enter() -> None:
    global _running, _saved
    with _lock:
        _running += 1
        if _running == 2 and _saved is None:
            saved = []
            for lib in _blas_libraries():
                count = lib.get_num_threads()
                if count is not None and count > 1:
                    saved.append((lib, count))
                    lib.set_num_threads(1)
            _saved = saved


def _leave() -> None:
    global _running, _saved
    with _lock:
        _running -= 1
        if _running <= 1 and _saved is not None:
            for lib, count in _saved:
                lib.set_num_threads(count)
            _saved = None


def blas_running() -> int:
    """The BLAS-class operations running now (for tests and diagnostics)."""
    return _running


def _call(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    _enter()
    try:
        return fn(*args, **kwargs)
    finally:
        _leave()


def blas_call(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` counted as a BLAS-class operation while it runs (see the module docstring)."""
    return functools.partial(_call, fn)
