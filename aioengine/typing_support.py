"""Types shared by the engine and its front ends, defined once (a leaf: no engine import).

:class:`OpDecorator` is what ``op(...)`` returns when it is called with options only, on the
async :class:`~aioengine.Engine` (whose decorated functions return an
:class:`~aioengine.Operation`) and on :class:`~aioengine.BlockingEngine` (a
:class:`concurrent.futures.Future`). Python's types cannot say "the same decorator, over
another result type" (that needs higher-kinded types), so the protocol takes the result type
as its parameter and each ``__call__`` overload is selected by it: write
``OpDecorator[Operation[Any]]`` or ``OpDecorator[concurrent.futures.Future[Any]]``.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, overload

if TYPE_CHECKING:
    from .operation import Operation

__all__ = ("OpDecorator",)

T = TypeVar("T")
# The result type the decorated function's calls return, with Any for its own parameter:
# Operation[Any] or concurrent.futures.Future[Any]. Only the overloads read it.
R = TypeVar("R", covariant=True)


class OpDecorator(Protocol[R]):
    """What ``op(...)`` returns when called with options only: a decorator.

    Decorating a coroutine function or a plain one returns a function whose calls return the
    operation (``OpDecorator[Operation[Any]]``: :meth:`aioengine.Engine.op`) or a future
    (``OpDecorator[concurrent.futures.Future[Any]]``: :meth:`aioengine.BlockingEngine.op`)
    of the function's result.
    """

    @overload
    def __call__(
        self: OpDecorator[Operation[Any]], fn: Callable[..., Coroutine[Any, Any, T]], /
    ) -> Callable[..., Operation[T]]: ...

    @overload
    def __call__(
        self: OpDecorator[Operation[Any]], fn: Callable[..., T], /
    ) -> Callable[..., Operation[T]]: ...

    @overload
    def __call__(
        self: OpDecorator[concurrent.futures.Future[Any]],
        fn: Callable[..., Coroutine[Any, Any, T]],
        /,
    ) -> Callable[..., concurrent.futures.Future[T]]: ...

    @overload
    def __call__(
        self: OpDecorator[concurrent.futures.Future[Any]], fn: Callable[..., T], /
    ) -> Callable[..., concurrent.futures.Future[T]]: ...
