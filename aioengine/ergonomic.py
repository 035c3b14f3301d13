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
* Reductions: ``submit(fn, *args, accumulate=var, merge=operator.add, ordered=False)`` runs
  ``fn`` without holding ``var`` (so many run at once) and then merges its return value into
  ``var``'s value, ``merge(current, result)``, as a *commute* access of ``var`` (in whatever
  order the results come; ``ordered=True``: as a write, in push order). It is two pushes: the
  call, which writes its result to a private Var, and the merge, which reads that Var and runs
  inline on the loop (``FnProperty.ASYNC``: keep ``merge`` cheap).

Two things submit cannot see (both written once here; the docstrings point to this list):

* ``submit``'s own keywords (``reads``, ``writes``, ``out``, ``ctx``, ``prop``, ``priority``,
  ``name``) are consumed by submit, never passed on: ``submit(f, x, name="a")`` names the
  operation and calls ``f(x)``. Bind such arguments with :func:`functools.partial`
  (``submit(functools.partial(f, name="a"), x)``), or decorate ``f`` with ``@engine.op``, whose
  calls pass every keyword through. Which one the caller meant cannot be known, so submit
  does not guess.
* Only a Var that *is* an argument is a dependency. A Var inside a container
  (``submit(f, [a, b])``) would reach ``fn`` as a Var object, with no turn on it: submit
  raises :class:`TypeError` for a list, tuple, set or dict argument that directly contains a
  Var (a shallow check: one pass over each such argument). Pass the Vars as separate
  arguments, or, to hand ``fn`` the Var objects themselves, bind them with
  :func:`functools.partial` (submit does not look inside a partial).

Cost: a Var value is one slot on the Var. A submit makes one pass over its arguments (looking
once through each container argument), builds one :class:`LocalCall` and then makes one
ordinary push; the plain ``push_*`` path does not know this module exists.
"""

from __future__ import annotations

import concurrent.futures
import functools
import operator
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any, Protocol, TypeVar, overload

from .context import Context, DeviceType, RunContext, cpu
from .errors import Abort
from .functions import ValueCall, default_name, is_coroutine_function
from .operation import Call, FnProperty, Operation
from .var import NO_VALUE, Var, carry, give, no_value_error

__all__ = ("OpDecorator", "Pusher", "checked", "get", "op", "read", "submit")

T = TypeVar("T")


class Pusher(Protocol):
    """What this layer needs of the engine it pushes to (:class:`~aioengine.Engine` is one).

    A protocol, not the façade's class: the ergonomic layer sits below the façade and uses only
    its public pushes.
    """

    def push_sync(
        self,
        fn: Callable[[RunContext], Any],
        ctx: Context = ...,
        const_vars: Iterable[Var] = ...,
        mutate_vars: Iterable[Var] = ...,
        *,
        commute_vars: Iterable[Var] = ...,
        prop: FnProperty = ...,
        priority: int = ...,
        name: str | None = ...,
    ) -> Operation[Any]: ...

    def new_var(self, name: str | None = ..., *, value: object = ...) -> Var: ...

    def push_async(
        self,
        fn: Callable[..., Any],
        ctx: Context = ...,
        const_vars: Iterable[Var] = ...,
        mutate_vars: Iterable[Var] = ...,
        *,
        prop: FnProperty = ...,
        priority: int = ...,
        name: str | None = ...,
    ) -> Operation[Any]: ...


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


_CPU0 = cpu(0)
_ASYNC = FnProperty.ASYNC
_REMOTE = DeviceType.REMOTE


def _nested_var(arg: object) -> Var | None:
    """The first Var inside a list, tuple, set or dict argument, at any depth (each container
    visited once, so a self-referencing one ends)."""
    containers = (list, tuple, set, frozenset, dict)
    if not isinstance(arg, containers):
        return None
    seen: set[int] = set()
    stack: list[object] = [arg]
    while stack:
        container = stack.pop()
        if id(container) in seen:
            continue
        seen.add(id(container))
        items: Iterable[object]
        if isinstance(container, dict):
            items = (*container.keys(), *container.values())
        else:
            items = container  # type: ignore[assignment]
        for item in items:
            if type(item) is Var:
                return item
            if isinstance(item, containers):
                stack.append(item)
    return None


def _check_nested(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    for i, arg in enumerate(args):
        if (var := _nested_var(arg)) is not None:
            raise _nested_error(f"args[{i}]", arg, var)
    for key, arg in kwargs.items():
        if (var := _nested_var(arg)) is not None:
            raise _nested_error(key, arg, var)


def _nested_error(label: str, arg: object, var: Var) -> TypeError:
    return TypeError(
        f"argument {label} is a {type(arg).__name__} that contains {var!r}; only a Var "
        "passed as an argument itself is read and replaced by its value (a Var in a "
        "container would reach the function as a Var, with no dependency on it). "
        "Pass the Vars as separate arguments, or bind the container with "
        "functools.partial to pass the Var objects on purpose"
    )


def read(engine: Pusher, var: Var) -> Operation[Any]:
    """Push the read behind :meth:`Var.get` and :meth:`BlockingEngine.get`.

    Its result is ``(value,)``, ``var``'s value in a 1-tuple (a value that is a coroutine
    object would otherwise be taken for a forgotten ``async def``), or :data:`NO_VALUE` if it
    carries none: the operation itself never fails, so that :func:`checked` raises the
    ``ValueError`` to the caller of ``get`` only, and ``wait_for_all()`` / ``aclose()`` do
    not report it a second time. (A failure ``var`` carries still skips it with
    ``DependencyError``, as any reader; the failure stays recorded, for ``wait_for_var``.)
    Inline on the loop (``FnProperty.ASYNC``).
    """
    if type(var) is not Var:
        raise TypeError(f"var must be an aioengine.Var, got {var!r}")
    return engine.push_sync(
        functools.partial(_read, var), _CPU0, (var,), (), prop=_ASYNC, name=f"get({var.name})"
    )


def _read(var: Var, rctx: RunContext) -> object:
    value = var._value
    return NO_VALUE if value is NO_VALUE else (value,)


def checked(var: Var, result: Any) -> Any:
    """The value in ``result``, the result of :func:`read`; raise ``ValueError`` if ``var``
    carried none."""
    if result is NO_VALUE:
        raise no_value_error(var)
    return result[0]


async def get(engine: Pusher, var: Var) -> Any:
    """:meth:`Var.get`: :func:`read`, awaited, then :func:`checked`."""
    return checked(var, await read(engine, var))


def _out_vars(out: Var | Sequence[Var] | None) -> tuple[Var, ...]:
    if out is None:
        return ()
    if type(out) is Var:
        return (out,)
    if isinstance(out, (list, tuple)) and out and all(type(v) is Var for v in out):
        if len(set(out)) < len(out):
            raise ValueError(f"out names a Var twice: {out!r}; which value would it keep?")
        return tuple(out)
    raise TypeError(f"out must be a Var, a non-empty list or tuple of Vars, or None; got {out!r}")


def _var_list(engine: Pusher, arg: str, vars_: object) -> list[Var]:
    """``reads`` or ``writes`` as a list, checked here so that errors name the argument."""
    if type(vars_) is Var:
        raise TypeError(f"{arg} must be a list of Vars, not a single Var; use [{vars_.name}]")
    if isinstance(vars_, (str, bytes)) or not isinstance(vars_, Iterable):
        raise TypeError(f"{arg} must be an iterable of aioengine.Var, got {vars_!r}")
    listed = list(vars_)
    for i, var in enumerate(listed):
        _check_var(engine, f"{arg}[{i}]", var)
    return listed


def _check_var(engine: Pusher, label: str, var: object) -> None:
    if type(var) is not Var:
        raise TypeError(f"{label} is {var!r}, not an aioengine.Var")
    if not _owned(engine, var):
        raise ValueError(f"{label} {var!r} belongs to another Engine")


def _owned(engine: Pusher, var: Var) -> bool:
    """Whether ``var`` is ``engine``'s (the test before an error message is built)."""
    return var._owner is engine


class LocalCall(Call):
    """The function of a local value operation (``submit`` on a CPU or GPU context).

    The core's :class:`~aioengine.operation.Call` is the call itself (the Vars among the
    arguments replaced by their values, the result given to ``out``), compiled with the
    core. This adds the coroutine function's run and the repr. One slotted object per
    submit, which the push classifies once per class (``functions.is_coroutine_function``):
    no closures, cells or argument lists for the cycle collector to walk while thousands of
    operations are pending. A positions tuple is shared by every call with Vars at the same
    places (:func:`_positions`). The remote counterpart is
    :class:`~aioengine.functions.ValueCall`.
    """

    __slots__ = ()

    async def run_async(self, rctx: RunContext) -> Any:
        """The call of a coroutine function: pushed with ``push_async``, run on the loop."""
        args, kwargs = self.bind()
        result = await self.fn(*args, **kwargs)
        out = self.out
        if out is not None:
            give(out, result)
        return result

    def __repr__(self) -> str:
        return f"<LocalCall {default_name(self.fn)}>"


_CONTAINERS = (list, tuple, set, frozenset, dict)

# Positions tuples by bit mask, shared by the calls with Vars at the same places: no tuple
# to allocate (and for the collector to track) per call. Bounded: masks are few in practice.
# Pushes from any thread share it without a lock: each dict operation is atomic.
_POSITIONS: dict[int, tuple[int, ...]] = {0: ()}


def _positions(mask: int) -> tuple[int, ...]:
    """The indices of the set bits of ``mask``, in order (one shared tuple per mask)."""
    positions = _POSITIONS.get(mask)
    if positions is None:
        positions = tuple(i for i in range(mask.bit_length()) if mask >> i & 1)
        if len(_POSITIONS) < 4096:
            _POSITIONS[mask] = positions
    return positions


def submit(
    engine: Pusher,
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
    accumulate: Var | None = None,
    merge: Callable[[Any, Any], Any] = operator.add,
    ordered: bool = False,
) -> Operation[Any]:
    """Push ``fn(*args, **kwargs)``; see :meth:`aioengine.Engine.submit`.

    One pass over the arguments finds the Var ones, checks their engine and looks into each
    container argument for a Var (an error); the messages are built only on failure.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {fn!r}")
    if accumulate is not None:
        return _reduce(
            engine, fn, args, kwargs, reads, writes, out, ctx, prop, priority, name,
            accumulate, merge, ordered,
        )  # fmt: skip
    single = type(out) is Var
    if single:
        outs: tuple[Var, ...] = (out,)  # type: ignore[assignment]
        if out._owner is not engine:  # type: ignore[union-attr]  # (_owned, inlined)
            _check_var(engine, "out", out)
    else:
        outs = _out_vars(out)
        for i, var in enumerate(outs):
            _check_var(engine, f"out[{i}]", var)
    const: list[Var] = []
    mask = 0  # bit i: args[i] is a Var
    for i, arg in enumerate(args):
        if type(arg) is Var:
            if arg._owner is not engine:  # (_owned, inlined: every submit's path)
                _check_var(engine, f"args[{i}]", arg)
            if arg is not out:  # an input that is also the out Var is written, not read
                const.append(arg)
            mask |= 1 << i
        elif isinstance(arg, _CONTAINERS) and (inner := _nested_var(arg)) is not None:
            raise _nested_error(f"args[{i}]", arg, inner)
    keys: tuple[str, ...] = ()
    if kwargs:
        for key, arg in kwargs.items():
            if type(arg) is Var:
                if not _owned(engine, arg):
                    _check_var(engine, f"argument {key}", arg)
                if arg is not out:
                    const.append(arg)
                keys += (key,)
            elif isinstance(arg, _CONTAINERS) and (inner := _nested_var(arg)) is not None:
                raise _nested_error(key, arg, inner)
    if type(reads) is not tuple or reads:
        const[:0] = _var_list(engine, "reads", reads)  # the reads first, as listed
    writes_ = () if type(writes) is tuple and not writes else _var_list(engine, "writes", writes)
    mutate = [*writes_, *outs] if writes_ else outs  # in both: written (engine rule)
    if name is None:
        name = default_name(fn)
    positions = _POSITIONS.get(mask) or _positions(mask)
    given: Any = out if single else outs or None  # as the record keeps it
    if type(ctx) is Context and ctx.device_type is _REMOTE:
        # A value operation on the cluster (remote/): its Vars' versions, not their values.
        call = ValueCall(fn, args, kwargs, positions, keys, given, bool(writes_))
        return engine.push_sync(call, ctx, const, mutate, prop=prop, priority=priority, name=name)
    local = LocalCall(fn, args, kwargs, positions, keys, given)
    if is_coroutine_function(fn):
        return engine.push_async(
            local.run_async, ctx, const, mutate, prop=prop, priority=priority, name=name
        )
    return engine.push_sync(local, ctx, const, mutate, prop=prop, priority=priority, name=name)


def _reduce(
    engine: Pusher,
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
    accumulate: Var,
    merge: Callable[[Any, Any], Any],
    ordered: bool,
) -> Operation[Any]:
    """``submit(..., accumulate=var)``: the call, then its merge into ``var`` (see the
    module docstring); returns the merge, whose result is ``fn``'s return value."""
    _check_var(engine, "accumulate", accumulate)
    if not callable(merge):
        raise TypeError(f"merge must be callable, got {merge!r}")
    if type(ordered) is not bool:
        raise TypeError(f"ordered must be a bool, got {ordered!r}")
    if out is not None:
        raise TypeError("submit() takes accumulate= or out=, not both")
    if accumulate in args or accumulate in kwargs.values():
        raise ValueError(
            f"{accumulate!r} is both an argument and accumulate=: fn runs without holding "
            "the Var it accumulates into"
        )
    if name is None:
        name = default_name(fn)
    result = engine.new_var(f"{name}.result")
    call = submit(engine, fn, args, kwargs, reads, writes, result, ctx, prop, priority, name)

    def merge_into(rctx: RunContext) -> Any:
        value = result._value
        if value is NO_VALUE:
            # The call raised Abort or was cancelled (any other failure would have skipped
            # this merge): the merge ends the same way, leaving var's value as it was.
            exc = call._exception
            if isinstance(exc, Abort):
                raise exc
            raise call._cancelled_error()
        carry(result, NO_VALUE)  # nothing more reads it
        current = accumulate._value
        carry(accumulate, value if current is NO_VALUE else merge(current, value))
        return value

    if ordered:
        return engine.push_sync(
            merge_into, _CPU0, (result,), (accumulate,), prop=_ASYNC, name=f"{name}.merge"
        )
    return engine.push_sync(
        merge_into,
        _CPU0,
        (result,),
        (),
        commute_vars=(accumulate,),
        prop=_ASYNC,
        name=f"{name}.merge",
    )


def op(
    engine: Pusher,
    fn: Callable[..., Any] | None,
    const_vars: Iterable[Var],
    mutate_vars: Iterable[Var],
    out: Var | Sequence[Var] | None,
    ctx: Context,
    prop: FnProperty,
    priority: int,
    name: str | None,
    accumulate: Var | None = None,
    merge: Callable[[Any, Any], Any] = operator.add,
    ordered: bool = False,
) -> Any:
    """The decorator behind :meth:`aioengine.Engine.op`."""
    const = tuple(const_vars)
    mutate = tuple(mutate_vars)

    def decorate(f: Callable[..., Any]) -> Callable[..., Operation[Any]]:
        if not callable(f):
            raise TypeError(f"@engine.op needs a function, got {f!r}")

        @functools.wraps(f)
        def push(*args: Any, **kwargs: Any) -> Operation[Any]:
            return submit(
                engine, f, args, kwargs, const, mutate, out, ctx, prop, priority, name,
                accumulate, merge, ordered,
            )  # fmt: skip

        return push

    if fn is not None:
        return decorate(fn)
    return decorate
