"""What runs on the workers: the functions every remote operation's Dask task calls.

Dask pickles them by reference (``aioengine.remote.worker.apply``), so a worker needs the same
aioengine installed. They run the user's function and carry its outcome back in a form Dask
handles: a ``KeyboardInterrupt`` or ``SystemExit`` travels as :class:`Escaped`, which Dask
does not re-raise on the worker's loop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from ..context import RunContext

__all__ = ("Escaped", "apply", "apply_async", "awaiting", "calling", "unpack")


class Escaped(Exception):
    """A ``KeyboardInterrupt`` or ``SystemExit`` raised by a remote function, carried back as
    an ordinary exception: Dask re-raises those on the worker's event loop (on an in-process
    cluster, the caller's), which would stop it. It carries the type's name and arguments,
    not the exception (nor, raised outside the ``except``, its context), which Dask would
    raise again; :meth:`RemoteBackend._error` rebuilds the original, so the operation fails
    with it, as a local one does."""

    def __init__(self, kind: str, args: tuple[Any, ...]) -> None:
        super().__init__(kind, args)
        self.kind, self.original_args = kind, args

    @classmethod
    def of(cls, exc: BaseException) -> Escaped:
        kind = "KeyboardInterrupt" if isinstance(exc, KeyboardInterrupt) else "SystemExit"
        return cls(kind, exc.args)

    def original(self) -> BaseException:
        kind = KeyboardInterrupt if self.kind == "KeyboardInterrupt" else SystemExit
        return kind(*self.original_args)


def calling(fn: Callable[[RunContext], Any], rctx: RunContext) -> Any:
    """A side-effect operation's task on the worker (``push_sync``): ``fn(rctx)``."""
    try:
        return fn(rctx)
    except (KeyboardInterrupt, SystemExit) as exc:
        escaped = Escaped.of(exc)
    raise escaped


async def awaiting(fn: Callable[[RunContext], Awaitable[Any]], rctx: RunContext) -> Any:
    """A side-effect operation's task on the worker (``push_async``), on the worker's event
    loop: ``await fn(rctx)``, also for a function that is not ``async def`` itself but
    returns an awaitable (``lambda rctx: coro()``), which Dask would not await."""
    try:
        return await fn(rctx)
    except (KeyboardInterrupt, SystemExit) as exc:
        escaped = Escaped.of(exc)
    raise escaped


def apply(fn: Callable[..., Any], n: int | None, kwargs: dict[str, Any], *args: Any) -> Any:
    """A value operation's task on the worker: ``fn(*args, **kwargs)``, checked for ``n``
    results when ``out`` is a sequence of ``n`` Vars. The positional arguments are the task's
    own (Dask gives each its value, with no list around them to walk)."""
    try:
        return unpack(fn(*args, **kwargs), n)
    except (KeyboardInterrupt, SystemExit) as exc:
        escaped = Escaped.of(exc)
    raise escaped


async def apply_async(
    fn: Callable[..., Coroutine[Any, Any, Any]],
    n: int | None,
    kwargs: dict[str, Any],
    *args: Any,
) -> Any:
    """:func:`apply` for a coroutine function: it runs on the worker's event loop."""
    try:
        return unpack(await fn(*args, **kwargs), n)
    except (KeyboardInterrupt, SystemExit) as exc:
        escaped = Escaped.of(exc)
    raise escaped


def unpack(result: Any, n: int | None) -> Any:
    if n is None:
        return result
    values = tuple(result)
    if len(values) != n:
        raise ValueError(f"the function returned {len(values)} value(s) for out= of {n} Var(s)")
    return values
