"""The ergonomic layer: push ordinary Python functions, with Vars that carry their data.

The MXNet-style calls (``push_sync(fn, ctx, const_vars, mutate_vars)`` with ``fn(rctx)``) stay
the foundation; this module only builds such a push from ordinary arguments:

* :meth:`Engine.submit(fn, *args, reads=, writes=, out=, ctx=) <aioengine.Engine.submit>`
  pushes ``fn(*args, **kwargs)``. ``fn`` needs no ``rctx`` parameter; a coroutine function goes
  to ``push_async``, anything else to ``push_sync``.
* A Var may carry a value (``engine.new_var("w", value=array)``). Every Var passed as an
  argument is *read* (or *written*, if it is also in ``writes``) and replaced by its value
  when the function runs; the function's return value becomes the value of ``out``. Values are
  read and replaced only while the operation holds its turn on the Var, so the rule that
  orders the operations also guards the values: no locks by hand.
* :meth:`Engine.op <aioengine.Engine.op>` is the same as a decorator, and
  :meth:`Var.get` / :meth:`Var.set` read and replace a value from async code.

Cost: a Var value is one slot on the Var. A submit builds one closure and then makes one
ordinary push; the plain ``push_*`` path does not know this module exists.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from .context import Context, RunContext
from .operation import FnProperty, Operation
from .var import NO_VALUE, Var

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ("op", "submit")


def _value_of(var: Var) -> Any:
    value = var._value
    if value is NO_VALUE:
        raise ValueError(
            f"{var!r} carries no value: create it with engine.new_var(name, value=...) or "
            "write it first (submit(..., out=var) or var.set(value))"
        )
    return value


def _out_vars(out: Var | Sequence[Var] | None) -> tuple[Var, ...]:
    if out is None:
        return ()
    if type(out) is Var:
        return (out,)
    if isinstance(out, (list, tuple)) and all(type(v) is Var for v in out):
        return tuple(out)
    raise TypeError(f"out must be a Var, a sequence of Vars or None, got {out!r}")


def _store(outs: tuple[Var, ...], single: bool, result: Any) -> None:
    """Give the ``out`` Vars their new values (the operation holds their write turn)."""
    if single:
        outs[0]._value = result
        return
    values = tuple(result)
    if len(values) != len(outs):
        raise ValueError(
            f"the function returned {len(values)} value(s) for out= of {len(outs)} Var(s)"
        )
    for var, value in zip(outs, values, strict=True):
        var._value = value


def submit(
    engine: Engine,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    reads: Iterable[Var],
    writes: Iterable[Var],
    out: Var | Sequence[Var] | None,
    ctx: Context,
    prop: FnProperty,
    priority: int,
    name: str | None,
) -> Operation[Any]:
    """Push ``fn(*args, **kwargs)``; see :meth:`aioengine.Engine.submit`."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {fn!r}")
    outs = _out_vars(out)
    single = type(out) is Var
    arg_vars = [(i, a) for i, a in enumerate(args) if type(a) is Var]
    kw_vars = [(k, v) for k, v in kwargs.items() if type(v) is Var]
    const = [*reads, *(a for _, a in arg_vars), *(v for _, v in kw_vars)]
    mutate = [*writes, *outs]  # a Var in both lists counts as written (engine rule)
    if name is None:
        name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
        if not isinstance(name, str):
            name = type(fn).__name__

    def bind() -> tuple[list[Any], dict[str, Any]]:
        call_args = list(args)
        for i, var in arg_vars:
            call_args[i] = _value_of(var)
        call_kwargs = dict(kwargs)
        for k, var in kw_vars:
            call_kwargs[k] = _value_of(var)
        return call_args, call_kwargs

    # An object whose __call__ is ``async def`` is a coroutine function too.
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__):

        async def run_async(rctx: RunContext) -> Any:
            call_args, call_kwargs = bind()
            result = await fn(*call_args, **call_kwargs)
            if outs:
                _store(outs, single, result)
            return result

        return engine.push_async(
            run_async, ctx, const, mutate, prop=prop, priority=priority, name=name
        )

    def run_sync(rctx: RunContext) -> Any:
        call_args, call_kwargs = bind()
        result = fn(*call_args, **call_kwargs)
        if outs:
            _store(outs, single, result)
        return result

    return engine.push_sync(run_sync, ctx, const, mutate, prop=prop, priority=priority, name=name)


def op(
    engine: Engine,
    fn: Callable[..., Any] | None,
    const_vars: Iterable[Var],
    mutate_vars: Iterable[Var],
    out: Var | Sequence[Var] | None,
    ctx: Context,
    prop: FnProperty,
    priority: int,
    name: str | None,
) -> Any:
    """The decorator behind :meth:`aioengine.Engine.op`."""
    const = tuple(const_vars)
    mutate = tuple(mutate_vars)

    def decorate(f: Callable[..., Any]) -> Callable[..., Operation[Any]]:
        if not callable(f):
            raise TypeError(f"@engine.op needs a function, got {f!r}")

        @functools.wraps(f)
        def push(*args: Any, **kwargs: Any) -> Operation[Any]:
            return submit(engine, f, args, kwargs, const, mutate, out, ctx, prop, priority, name)

        return push

    if fn is not None:
        return decorate(fn)
    return decorate
