"""What a pushed function is: its default name and the kind of operation it makes.

Leaf helpers shared by the façade's pushes, the ergonomic layer and the blocking front end:
the one derivation of an operation's default name (:func:`default_name`), the one
classification of a function given to ``push_async`` (:func:`async_kind`), and
:class:`ValueCall`, the function of a remote value operation (built by the ergonomic layer,
run by the remote backend, which do not import each other).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from types import FunctionType, MethodType
from typing import Any

from .kinds import _CALLBACK, _CORO

__all__ = (
    "ValueCall",
    "async_kind",
    "default_name",
    "is_coroutine_function",
    "returned_coroutine",
)

_partial = functools.partial
_CO_COROUTINE = inspect.CO_COROUTINE


def default_name(fn: Callable[..., Any]) -> str:
    """The default operation name: the function's ``__qualname__`` (partials unwrapped)."""
    while type(fn) is functools.partial:
        fn = fn.func
    if type(fn) is FunctionType or type(fn) is MethodType:
        return fn.__qualname__
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return name if isinstance(name, str) else type(fn).__name__


def is_coroutine_function(fn: Callable[..., Any]) -> bool:
    """Whether calling ``fn`` returns a coroutine, decided without calling it.

    Plain functions, methods and partials of them (the hot path) are decided from the code
    flags. Anything else (a NumPy ufunc, a builtin, an instance of a class with ``__call__``)
    is decided once by :func:`_decide` and remembered: per class for instances without a
    ``__dict__`` (nothing on the instance can change the answer: ``submit``'s one record per
    call is decided once), per object for the callables of C types. The rest (partials of
    them, instances with a ``__dict__``) are decided each time: remembering them would keep
    objects made per call alive.
    """
    inner = fn
    while type(inner) is functools.partial:
        inner = inner.func
    if type(inner) is MethodType:
        inner = inner.__func__
    if type(inner) is FunctionType:
        return bool(inner.__code__.co_flags & _CO_COROUTINE)
    cls = type(fn)
    decided = _BY_CLASS.get(cls)
    if decided is not None:
        return decided
    known = _BY_IDENTITY.get(id(fn))  # (by id: no hash of fn's own runs)
    if known is not None and known[0] is fn:
        return known[1]
    # A partial of something else, or an instance with a __dict__: not kept.
    decided = _decide(fn, inner)
    if inner is fn:
        if not cls.__dictoffset__:
            _remember(_BY_CLASS, cls, decided)
        elif not cls.__flags__ & _HEAP_TYPE:
            # A C type's callable (a ufunc, a builtin): long-lived, kept with its answer.
            _remember(_BY_IDENTITY, id(fn), (fn, decided))
    return decided


def _remember(cache: dict[Any, Any], key: object, entry: object) -> None:
    if len(cache) >= _DECIDED_MAX:
        cache.clear()  # bounded: it holds what it keys (functions made per call churn it)
    cache[key] = entry


# is_coroutine_function's answers for callables that are not functions: by class for instances
# without a __dict__ (submit's records), and by id() for the other callables of C types (a
# ufunc, a builtin), each entry keeping its object (so its id is not reused meanwhile) beside
# the answer. Two dicts, so that a class that is itself called never answers for its
# instances. A dict operation each is atomic, so threads share them without a lock (a lost
# entry is decided again).
_BY_CLASS: dict[type, bool] = {}
_BY_IDENTITY: dict[int, tuple[object, bool]] = {}
_DECIDED_MAX = 512
_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement, not by C code


def _decide(fn: Callable[..., Any], inner: Callable[..., Any]) -> bool:
    if inner is fn:
        # An instance whose class's __call__ is a plain function, and which is nothing
        # function-like itself (what inspect.iscoroutinefunction looks for): decided from
        # that function's flags, as below, without inspect's walk.
        call = getattr(type(fn), "__call__", None)  # noqa: B004 (the class's __call__)
        if (
            type(call) is FunctionType
            and getattr(fn, "__code__", None) is None
            and getattr(fn, "_is_coroutine_marker", None) is None
        ):
            return bool(call.__code__.co_flags & _CO_COROUTINE)
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(type(fn), "__call__", None)  # noqa: B004 (an async __call__ method)
    return call is not None and not inspect.isfunction(fn) and inspect.iscoroutinefunction(call)


def async_kind(fn: Callable[..., Any]) -> int:
    """Classify a function given to ``push_async`` (or ``new_operator(is_async=True)``).

    ``async def fn(rctx)`` runs as a task on the loop, and so does a plain function with one
    required positional parameter that returns an awaitable (``lambda rctx: fetch(url)``;
    parameters with defaults, as used to bind loop variables, do not count). A function with
    two required positional parameters is callback-style: ``fn(rctx, on_complete)``.
    """
    # The usual cases, a coroutine function or a partial of one, are decided without a call.
    if type(fn) is _partial and type(fn.func) is FunctionType:
        if fn.func.__code__.co_flags & _CO_COROUTINE:
            return _CORO
    elif type(fn) is FunctionType and fn.__code__.co_flags & _CO_COROUTINE:
        return _CORO
    if is_coroutine_function(fn):
        return _CORO
    if type(fn) is FunctionType:
        code = fn.__code__
        positional = code.co_argcount
        required = positional - len(fn.__defaults__ or ())
        varargs = bool(code.co_flags & inspect.CO_VARARGS)
    else:
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            return _CALLBACK  # no signature to read: MXNet's AsyncFn convention
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        positional = sum(1 for p in params if p.kind in kinds)
        required = sum(1 for p in params if p.kind in kinds and p.default is p.empty)
        varargs = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
    if required >= 2 or (required == 0 and varargs):
        return _CALLBACK
    if required == 1 or positional:
        return _CORO
    raise TypeError(
        f"{default_name(fn)} takes no positional argument; push_async needs async def fn(rctx), "
        "a function of (rctx) returning an awaitable, or a callback-style fn(rctx, on_complete)"
    )


class ValueCall:
    """The function of a *value operation* on a remote context (``Engine.submit(...,
    ctx=remote())``): an ordinary function, its arguments and the Vars among them.

    The ergonomic layer (``ergonomic.py``) pushes one with ``push_sync``; the remote backend
    (``remote/``) recognises it by its type and sends ``fn`` to the cluster with each Var
    argument replaced by the version it must see. It is never called locally. It holds no
    container of its own beyond its arguments: a pending remote operation is a handful of
    objects for the cycle collector (the positions tuple is shared by the calls with Vars
    at the same places).

    Attributes:
        fn: the user's function (plain or ``async def``).
        args, kwargs: its arguments, Vars included.
        positions: the indices of the Var arguments in ``args``; keys: the names of the Var
            keyword arguments (both empty tuples when there are none).
        out: the ``out`` Var, the tuple of them (the result is unpacked into them), or None.
        holds: whether it declared other writes (``writes=``), which it may perform as side
            effects: then it holds its Vars until the remote task has finished.
    """

    __slots__ = ("args", "fn", "holds", "keys", "kwargs", "out", "positions")

    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        positions: tuple[int, ...],
        keys: tuple[str, ...],
        out: Any,
        holds: bool,
    ) -> None:
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.positions = positions
        self.keys = keys
        self.out = out
        self.holds = holds

    @property
    def single(self) -> bool:
        """Whether ``out`` is one Var (not a sequence of them, nor None)."""
        out = self.out
        return out is not None and type(out) is not tuple

    @property
    def outs(self) -> tuple[Any, ...]:
        """The ``out`` Vars, as a tuple (empty: none)."""
        out = self.out
        if out is None:
            return ()
        return out if type(out) is tuple else (out,)

    def arg_vars(self) -> list[tuple[int | str, Any]]:
        """The Var arguments, as ``(index, var)`` then ``(keyword, var)`` pairs."""
        args, kwargs = self.args, self.kwargs
        pairs: list[tuple[int | str, Any]] = [(i, args[i]) for i in self.positions]
        pairs.extend((key, kwargs[key]) for key in self.keys)
        return pairs

    def __call__(self, rctx: object) -> Any:
        raise RuntimeError(f"{self!r} runs on a Dask cluster, never locally")

    def __repr__(self) -> str:
        return f"<ValueCall {default_name(self.fn)}>"


def returned_coroutine(name: str, result: object) -> TypeError:
    """The error of a sync function named ``name`` that returned ``result``, an awaitable: it
    should have been ``async def``. A never-awaited coroutine is closed first (it would warn)."""
    close = getattr(result, "close", None)
    if callable(close):
        close()
    return TypeError(
        f"{name!r} returned a coroutine; declare it 'async def' and push it with push_async()"
    )


def delete_nothing(rctx: object) -> None:
    """The function of a ``delete_var`` without ``delete_fn``: nothing to run, so the scheduler
    finishes such a deletion on the event loop when its turn comes (no thread hop)."""
