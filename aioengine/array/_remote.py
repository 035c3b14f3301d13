"""Arrays whose chunks live on the engine's Dask cluster: :class:`RemoteArray` and the
namespace functions that have a per-chunk form on it.

``xp.asarray(value, device=ae.remote())``, the creation functions with ``device=ae.remote()``
and ``x.to_device(ae.remote())`` make a :class:`RemoteArray`: its chunks are remote values of
the engine (``_remote_store.py`` says how they are cut, fused and written). The namespace routes
every call that names a remote array (or ``device=ae.remote()``) here (:func:`call`, one check
in ``_namespace.py``): a function of :data:`FUNCTIONS` pushes per-chunk tasks; any other raises
``NotImplementedError`` naming the function and how to gather, never a silent gather.

``await x`` and ``x.to_device(ae.cpu())`` gather (the chunks a view touches, in order); the sync
points (``float(x)``, ``np.asarray(x)``) gather as well, off the event loop's thread (on it they
raise :class:`~aioengine.array.PendingArrayError`: await instead). A reduction's result is a
0-d remote array, so ``float(xp.sum(x))`` moves one partial per chunk between workers and one
number to the client.
"""

from __future__ import annotations

import asyncio
import math
import operator
import weakref
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

import numpy as np

from ..context import Context, DeviceType, cpu, remote
from . import _meta
from ._array import (
    COMPARISONS,
    OPERATORS,
    SCALARS,
    UNARY_OPERATORS,
    Array,
    ArrayNamespace,
    block_on,
    buffer_of,
    concrete_shape,
    engine_of,
    value_in_operation,
)
from ._buffer import Buffer
from ._kernel import MISSING, Applied
from ._meta import as_dtype, broadcast
from ._remote_kernel import CONST, IN, STEP, own
from ._remote_store import (
    FUSE_STEPS,
    Expr,
    Store,
    View,
    chunk_rows,
    created,
    flush_soon,
    gather_parts,
    placed,
    rows_of,
    write_into,
)
from ._remote_zarr import read_store, write_store
from ._special import ELEMENTWISE, elementwise_function
from ._sync import PendingArrayError

if TYPE_CHECKING:
    from .. import Operation
    from ._push import Pusher

__all__ = (
    "FUNCTIONS",
    "PLACING",
    "RemoteArray",
    "call",
    "involves_remote",
    "is_remote",
    "to_remote",
)

_REMOTE = DeviceType.REMOTE
_CPU0 = cpu()
#: The namespace functions that place a new array (``device=`` chooses where): those a
#: namespace with ``default_remote`` sends here when they are given no device.
PLACING = frozenset(
    ("asarray", "zeros", "ones", "empty", "full", "arange", "linspace", "from_zarr")
)
#: NumPy operands up to this many elements travel inside the tasks (a broadcast row, a
#: stencil's weights); larger ones are placed on the cluster first.
SMALL = 4096


def is_remote(device: object) -> bool:
    """Whether ``device`` is a :func:`~aioengine.remote` context."""
    return type(device) is Context and device.device_type is _REMOTE


def involves_remote(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a namespace call names a remote array (an argument, one of a list argument, a
    keyword) or ``device=ae.remote()``: the namespace's one test before its local code."""
    for a in args:
        if type(a) is RemoteArray:
            return True
        if type(a) in (list, tuple) and any(type(b) is RemoteArray for b in a):
            return True
    if kwargs:
        for key, value in kwargs.items():
            if type(value) is RemoteArray or (key == "device" and is_remote(value)):
                return True
    return False


def _chunk_bytes(ns: Pusher) -> int:
    return ns.remote_chunk_bytes


def _unsupported(name: str) -> NotImplementedError:
    return NotImplementedError(
        f"xp.{name} has no per-chunk form for arrays on the cluster (device=remote()); "
        "gather first with x.to_device(ae.cpu()) (the whole array comes to this process), "
        "or run your own per-chunk code with Engine.submit(..., ctx=ae.remote())"
    )


class RemoteArray:
    """An array whose chunks live on the engine's Dask cluster (``device`` is
    ``ae.remote()``): a view (basic indexing) of a :class:`~aioengine.array._remote_store.Store`.

    Made by ``xp.asarray(..., device=ae.remote())``, the creation functions and
    ``x.to_device(ae.remote())``, never directly. ``await x`` gathers the value (a read-only
    NumPy array); see the module docstring for what else runs where.
    """

    __slots__ = ("__weakref__", "_ns", "_store", "_view")

    __array_priority__ = 1000
    __array_ufunc__ = None  # NumPy defers to our reflected operators

    def __init__(self, ns: Pusher, store: Store, view: View | None = None) -> None:
        self._ns = ns
        self._store = store
        self._view = store.whole() if view is None else view

    # -- metadata ---------------------------------------------------------------------------

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape (always known: remote arrays have no data-dependent dimension)."""
        return self._view.shape

    @property
    def dtype(self) -> np.dtype[Any]:
        """The data type."""
        return self._store.dtype

    @property
    def device(self) -> Context:
        """``ae.remote()``: the chunks live on the engine's cluster."""
        return remote()

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return len(self._view.shape)

    @property
    def size(self) -> int:
        """The number of elements."""
        return math.prod(self._view.shape)

    @property
    def chunks(self) -> int:
        """The number of chunks of its Store (along the leading axis): an aioengine extension."""
        return self._store.count

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def __array_namespace__(self, *, api_version: str | None = None) -> ArrayNamespace:
        return self._ns

    # -- the value --------------------------------------------------------------------------

    def __await__(self) -> Generator[Any, None, np.ndarray[Any, Any]]:
        return self._gather().__await__()

    async def _gather(self) -> np.ndarray[Any, Any]:
        store = self._store
        vars_, window = gather_parts(store, self._view)
        try:
            values = await asyncio.gather(*(v.get() for v in vars_))
        except Exception as exc:
            exc.add_note(f"while gathering {store.describe()} (its chunks: {vars_!r})")
            raise
        value = rows_of(values, window)
        value.flags.writeable = False
        return value  # type: ignore[no-any-return]

    def _value_now(self, what: str) -> np.ndarray[Any, Any]:
        return block_on(self._ns, self._gather(), f"{what} of a {self._store.describe()}")

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray[Any, Any]:
        value = self._value_now("__array__()")
        return value.astype(dtype) if dtype is not None else value

    def _scalar(self, what: str) -> Any:
        if self.size != 1:
            raise TypeError(f"only 0-d (or size-1) arrays can be converted by {what}")
        return self._value_now(what).reshape(()).item()

    def __float__(self) -> float:
        return float(self._scalar("float()"))

    def __int__(self) -> int:
        return int(self._scalar("int()"))

    def __complex__(self) -> complex:
        return complex(self._scalar("complex()"))

    def __bool__(self) -> bool:
        if self.size != 1:
            raise ValueError("The truth value of an array with more than one element is ambiguous")
        return bool(self._scalar("bool()"))

    def __index__(self) -> int:
        if self.dtype.kind not in "iu":
            raise TypeError(f"only integer arrays can be used as an index, not {self.dtype}")
        return int(self._scalar("__index__()"))

    def item(self) -> Any:
        """The single element as a Python scalar (a gather)."""
        return self._scalar("item()")

    def tolist(self) -> Any:
        """The value as nested lists (a gather)."""
        return self._value_now("tolist()").tolist()

    def to_device(self, device: Context, /, *, stream: object = None) -> Any:
        """This array on ``device``: itself on ``ae.remote()``; on ``ae.cpu()`` a local
        array whose one operation gathers the chunks (in push order); a GPU from there."""
        if is_remote(device):
            return self
        if type(device) is not Context:
            raise ValueError(f"device must be an aioengine Context, got {device!r}")
        local = _to_local(self._ns, self)
        return local if device == _CPU0 else local.to_device(device)

    def to_zarr(self, store: Any, /) -> Operation[int]:
        """Write this array as a Zarr array at ``store`` (a path or store every worker
        reaches; what is there is replaced): each chunk written by a remote task on a worker,
        after the writes pushed before it. Returns the operation that ends when all are
        written (``await`` it, or ``wait_for_all()``). An aioengine extension; needs
        ``zarr``."""
        x = self
        if self._view.key() != self._store.whole().key():
            x = record(self._ns, np.copy, "copy", (self,))  # a view: its own chunks first
        return write_store(x._store, store)

    def __repr__(self) -> str:
        store = self._store
        state = "pending" if store.chunks is None else f"{store.count} chunk(s)"
        return f"RemoteArray(shape={self.shape}, dtype={self.dtype}, device=remote(), {state})"

    def __str__(self) -> str:
        try:
            return str(self._value_now("str()"))
        except PendingArrayError:
            return repr(self)

    # -- indexing ---------------------------------------------------------------------------

    def __getitem__(self, key: Any) -> RemoteArray:
        return RemoteArray(self._ns, self._store, _sub_view(self, key))

    def __setitem__(self, key: Any, value: Any) -> None:
        assign(self._ns, self._store, _sub_view(self, key), value)

    __hash__ = object.__hash__


def _sub_view(x: RemoteArray, key: Any) -> View:
    """The view ``x[key]``: basic indexing only (ints, slices, ``...``, None)."""
    items = key if isinstance(key, tuple) else (key,)
    for k in items:
        if k is None or k is Ellipsis or isinstance(k, slice):
            continue
        if isinstance(k, bool | np.bool_) or not isinstance(k, int | np.integer):
            raise IndexError(
                f"a remote array takes basic indices only (ints, slices, ..., None), got "
                f"{type(k).__name__}: gather with x.to_device(ae.cpu()) for advanced indexing"
            )
    if not any(k is Ellipsis for k in items):
        items = (*items, Ellipsis)  # a 0-d view, not a NumPy scalar, for x[i]
    lay = x._view.lay[items]
    return View(lay, x._store.lay)


# -- operands, recording ------------------------------------------------------------------


def _operand(ns: Pusher, x: Any) -> Any:
    """``x`` as an operand: a remote array, or ``(CONST, value)`` for a scalar or a small NumPy
    array (a larger one is placed on the cluster)."""
    if type(x) is RemoteArray:
        if x._ns is not ns:
            raise ValueError("remote arrays of two engines in one call")
        return x
    if type(x) in SCALARS:
        return (CONST, x)
    if isinstance(x, np.ndarray | np.generic):
        value = np.asarray(x)
        if value.size <= SMALL:
            return (CONST, value)
        return to_remote(ns, value)
    if isinstance(x, Array):
        raise _other_device(x)
    raise TypeError(f"expected an array or a Python scalar, got {type(x).__name__}")


def _other_device(x: Array) -> ValueError:
    """The error for a local array in a call on remote arrays."""
    return ValueError(
        f"arrays on different devices in one call: {x.device} and remote(); move one "
        "with x.to_device(...)"
    )


def _pending_in(x: Any) -> Expr | None:
    """The unflushed Expr whose step ``x`` (a whole array) is, else None."""
    if type(x) is not RemoteArray:
        return None
    store = x._store
    if store.chunks is None and x._view.key() == store.whole().key():
        expr = store.expr
        if expr is not None and not expr.flushed:
            return expr
    return None


def _step_of(expr: Expr, x: RemoteArray) -> int | None:
    for k, ref in enumerate(expr.results):
        if ref is not None and ref() is x._store:
            return k
    return None


def _refs(expr: Expr, operands: list[Any]) -> list[tuple[int, Any]] | None:
    """The operand references of a step joining ``expr`` (lock held), or None if it may not
    (a view of one of its pending results)."""
    refs: list[tuple[int, Any]] = []
    for x in operands:
        if type(x) is tuple:
            refs.append(x)
            continue
        if x._store.expr is expr:
            k = _step_of(expr, x) if _pending_in(x) is expr else None
            if k is None:
                return None
            refs.append((STEP, k))
            continue
        refs.append(expr.input(x._store, x._view))
    return refs


def record(
    ns: Pusher, fn: Callable[..., Any], name: str, args: tuple[Any, ...], **kw: Any
) -> RemoteArray:
    """``fn(*args)`` elementwise on remote arrays: a step joined to the pending program of an
    operand of the result's shape, else the first step of a new one (flushed at the loop's
    next iteration)."""
    operands = [_operand(ns, a) for a in args]
    shapes = [x.shape if type(x) is RemoteArray else np.shape(x[1]) for x in operands]
    shape: tuple[int, ...] = broadcast(*shapes)  # type: ignore[assignment]
    samples = [
        x.dtype if type(x) is RemoteArray else (x[1].dtype if hasattr(x[1], "dtype") else x[1])
        for x in operands
    ]
    dtype = _meta.sample_dtype(fn, samples, **kw)
    if kw:
        fn = _Call(fn, kw)
    # A NumPy operand that runs along the leading axis would need cutting: place it.
    for i, x in enumerate(operands):
        aligned = type(x) is tuple and np.ndim(x[1]) == len(shape) and shape and shape[0] > 1
        if aligned and np.shape(x[1])[0] == shape[0]:
            operands[i] = to_remote(ns, np.asarray(x[1]))
    return _join_or_start(ns, fn, name, operands, shape, dtype)


def _join_or_start(
    ns: Pusher,
    fn: Callable[..., Any],
    name: str,
    operands: list[Any],
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
) -> RemoteArray:
    """The step ``fn(*operands)`` of ``shape``: joined to a pending program of that shape
    that an operand belongs to, else the first step of a new one."""
    engine = engine_of(ns)
    pending = [e for e in dict.fromkeys(map(_pending_in, operands)) if e is not None]
    for expr in pending:
        if expr.shape != shape:
            continue
        with expr.lock:
            if expr.flushed or len(expr.steps) >= FUSE_STEPS:
                continue
            for other in pending:  # another pending program of this shape runs with it
                if other is not expr and other.shape == shape:
                    expr.absorb(other)
            refs = _refs(expr, operands)
            if refs is None:
                continue
            return _add_step(ns, expr, fn, name, refs, shape, dtype)
    expr = Expr(engine, shape, chunk_rows(shape, _chunk_bytes(ns)), name)
    with expr.lock:
        refs = _refs(expr, operands)
        assert refs is not None
        out = _add_step(ns, expr, fn, name, refs, shape, dtype)
    flush_soon(expr)
    return out


def _add_step(
    ns: Pusher,
    expr: Expr,
    fn: Callable[..., Any],
    name: str,
    refs: list[tuple[int, Any]],
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
) -> RemoteArray:
    store = Store(expr.engine, shape, dtype, expr.rows, name, expr)
    expr.steps.append((fn, tuple(refs), dtype))
    expr.results.append(weakref.ref(store))
    return RemoteArray(ns, store)


class _Call:
    """``fn(*values, **kwargs)``: a NumPy function with keywords, picklable by value."""

    __slots__ = ("fn", "kwargs")

    def __init__(self, fn: Callable[..., Any], kwargs: dict[str, Any]) -> None:
        self.fn = fn
        self.kwargs = kwargs

    def __call__(self, *values: Any) -> Any:
        return self.fn(*values, **self.kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Call, (self.fn, self.kwargs))


def assign(ns: Pusher, store: Store, target: View, value: Any) -> None:
    """``store[target] = value``: one write task per chunk the target touches, with the
    value's pending program (if it has the target's shape) evaluated inside them."""
    if (
        type(value) is RemoteArray
        and value._store is store
        and store.chunks is not None
        and value._view.key() == target.key()
    ):
        return  # x[k] = x[k] (what `x[k] += y` ends with): nothing changes
    x = _operand(ns, value)
    vshape = x.shape if type(x) is RemoteArray else np.shape(x[1])
    try:
        if broadcast(vshape, target.shape) != target.shape:
            raise ValueError
    except ValueError:
        raise ValueError(
            f"could not broadcast input array from shape {vshape} into shape {target.shape}"
        ) from None
    expr = Expr(store.engine, target.shape, store.rows, "write")
    expr.flushed = True  # a program of this write's own, never pushed by itself
    pending = _pending_in(x)
    if type(x) is tuple:
        ref = x
    elif pending is not None and x.shape == target.shape:
        with pending.lock:
            k = _step_of(pending, x) if not pending.flushed else None
            if k is not None:
                expr.inputs = list(pending.inputs)
                expr.steps = list(pending.steps)
        ref = (STEP, k) if k is not None else expr.input(x._store, x._view)
    else:
        ref = expr.input(x._store, x._view)
    write_into(store, target, expr, ref)


def inplace(ns: Pusher, name: str, x: RemoteArray, other: Any) -> RemoteArray:
    """``x <op>= other``: the result must keep ``x``'s dtype and shape."""
    result = record(ns, elementwise_function(name), name, (x, other))
    if result.dtype != x.dtype:
        raise TypeError(
            f"in-place {name}: the result dtype {result.dtype} is not the array's dtype "
            f"{x.dtype} (an in-place operation cannot change the dtype)"
        )
    if result.shape != x.shape:
        raise ValueError(
            f"in-place {name}: the result shape {result.shape} is not the array's shape "
            f"{x.shape} (an in-place operation cannot change the shape)"
        )
    assign(ns, x._store, x._view, result)
    return x


# -- placement and gathering --------------------------------------------------------------


def to_remote(ns: Pusher, value: Any) -> RemoteArray:
    """A NumPy value (or anything ``np.asarray`` takes) placed on the cluster, chunk by chunk."""
    value = np.ascontiguousarray(value)
    if value.dtype.kind not in "biufc":
        raise TypeError(f"asarray: unsupported dtype {value.dtype}")
    rows = chunk_rows(tuple(value.shape), _chunk_bytes(ns))
    return RemoteArray(ns, placed(engine_of(ns), value, rows, "asarray"))


def _split(x: Array, rows: int, n: int) -> tuple[Any, ...]:
    value = np.asarray(value_in_operation(x))
    if value.ndim == 0:
        return (value,)
    return tuple(np.ascontiguousarray(value[i * rows : (i + 1) * rows]) for i in range(n))


def _local_to_remote(ns: Pusher, x: Array) -> RemoteArray:
    """A local array placed on the cluster: one local operation cuts its value (in push
    order), and each chunk is sent once."""
    engine = engine_of(ns)
    if x.device.device_type is not DeviceType.CPU:
        x = x.to_device(_CPU0)
    shape = concrete_shape(ns, x, "to_device(remote())")
    store = Store(engine, shape, x.dtype, chunk_rows(shape, _chunk_bytes(ns)), "to_device")
    n = store.count
    local = [engine.new_var(f"to_device[{i}] sent") for i in range(n)]
    engine.submit(
        _split, x, store.rows, n, reads=buffer_of(x).vars, out=local, ctx=_CPU0, name="to_device"
    )
    chunks = []
    for i in range(n):
        var = engine.new_var(f"to_device[{i}]")
        engine.submit(own, local[i], out=var, ctx=remote(), name="place")
        chunks.append(var)
    store.chunks = tuple(chunks)
    return RemoteArray(ns, store)


def _fill(buf: Buffer, window: Any, *values: Any) -> None:
    buf.value = np.ascontiguousarray(rows_of(values, window))


def _to_local(ns: Pusher, x: RemoteArray) -> Array:
    """A local array of ``x``'s value: one local operation reads its chunks (the engine
    gathers each remote version once)."""
    engine = engine_of(ns)
    vars_, window = gather_parts(x._store, x._view)
    var = engine.new_var("to_device")
    buf = Buffer(engine, var, x.shape, x.dtype, MISSING, name="to_device")
    op = engine.submit(_fill, buf, window, *vars_, writes=[var], ctx=_CPU0, name="to_device")
    buf.writer = op
    return Array(ns, buf, x.shape, x.dtype, _CPU0)


# -- the namespace functions with a per-chunk form ----------------------------------------


def _asarray(
    ns: Pusher, obj: Any, /, *, dtype: Any = None, device: Any = None, copy: Any = None
) -> Any:
    if dtype is not None:
        dtype = as_dtype(dtype)
    if type(obj) is RemoteArray:
        out = obj
        if dtype is not None and dtype != obj.dtype:
            out = _astype(ns, obj, dtype)
        elif copy:
            out = record(ns, np.copy, "copy", (obj,))
        return out if device is None else out.to_device(device)
    if isinstance(obj, Array):
        if dtype is not None and dtype != obj.dtype:
            obj = ns.astype(obj, dtype)
        return _local_to_remote(ns, obj)
    return to_remote(ns, np.asarray(obj, dtype=dtype))


def _astype(ns: Pusher, x: Any, dtype: Any, /, *, copy: bool = True, device: Any = None) -> Any:
    dtype = as_dtype(dtype)
    if dtype == x.dtype and not copy:
        return x
    return record(ns, _Cast(dtype), "astype", (x,))


class _Cast:
    """``value.astype(dtype)``, picklable by value."""

    __slots__ = ("dtype",)

    def __init__(self, dtype: np.dtype[Any]) -> None:
        self.dtype = dtype

    def __call__(self, value: Any) -> Any:
        return np.asarray(value).astype(self.dtype)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Cast, (self.dtype,))


def _where(ns: Pusher, condition: Any, x1: Any, x2: Any, /) -> Any:
    return record(ns, np.where, "where", (condition, x1, x2))


def _shape(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, int | np.integer):
        shape = (shape,)
    out = tuple(operator.index(d) for d in shape)
    if any(d < 0 for d in out):
        raise ValueError(f"negative dimensions are not allowed: {out}")
    return out


def _creation(kind: str) -> Callable[..., Any]:
    def make(ns: Pusher, shape: Any, *, dtype: Any = None, device: Any = None) -> Any:
        shape = _shape(shape)
        dt = np.dtype(np.float64) if dtype is None else as_dtype(dtype)
        rows = chunk_rows(shape, _chunk_bytes(ns))
        return RemoteArray(ns, created(engine_of(ns), kind, shape, dt, rows, _no_args, kind))

    return make


def _no_args(lo: int, hi: int) -> tuple[Any, ...]:
    return ()


def _full(ns: Pusher, shape: Any, fill_value: Any, *, dtype: Any = None, device: Any = None) -> Any:
    shape = _shape(shape)
    if dtype is None:
        dt = np.asarray(fill_value).dtype
        if type(fill_value) is int:
            dt = np.dtype(np.int64)
    else:
        dt = as_dtype(dtype)
    rows = chunk_rows(shape, _chunk_bytes(ns))

    def args(lo: int, hi: int) -> tuple[Any, ...]:
        return (fill_value,)

    return RemoteArray(ns, created(engine_of(ns), "full", shape, dt, rows, args, "full"))


def _like(kind: str) -> Callable[..., Any]:
    def make(ns: Pusher, x: Any, /, *, dtype: Any = None, device: Any = None, **kw: Any) -> Any:
        dt = x.dtype if dtype is None else dtype
        if kind == "full":
            return _full(ns, x.shape, kw["fill_value"], dtype=dt)
        return _creation(kind)(ns, x.shape, dtype=dt)

    return make


def _full_like(
    ns: Pusher, x: Any, /, fill_value: Any, *, dtype: Any = None, device: Any = None
) -> Any:
    return _like("full")(ns, x, dtype=dtype, fill_value=fill_value)


def _arange(
    ns: Pusher,
    start: Any,
    /,
    stop: Any = None,
    step: Any = 1,
    *,
    dtype: Any = None,
    device: Any = None,
) -> Any:
    if stop is None:
        start, stop = 0, start
    n = max(0, math.ceil((stop - start) / step))
    # NumPy's dtype for these bounds (xp.arange(64.0) is float64), without making the range.
    bounds = np.result_type(*(np.asarray(b) for b in (start, stop, step)))
    dt = bounds if dtype is None else as_dtype(dtype)
    rows = chunk_rows((n,), _chunk_bytes(ns))

    def args(lo: int, hi: int) -> tuple[Any, ...]:
        return (start + lo * step, step)

    return RemoteArray(ns, created(engine_of(ns), "arange", (n,), dt, rows, args, "arange"))


def _linspace(
    ns: Pusher,
    start: Any,
    stop: Any,
    /,
    num: int,
    *,
    dtype: Any = None,
    device: Any = None,
    endpoint: bool = True,
) -> Any:
    div = (num - 1) if endpoint else num
    step = (stop - start) / div if div > 0 else 0.0
    dt = np.dtype(np.float64) if dtype is None else as_dtype(dtype)
    rows = chunk_rows((num,), _chunk_bytes(ns))

    def args(lo: int, hi: int) -> tuple[Any, ...]:
        last = stop if endpoint and hi == num and num > 1 else None
        return (start, step, lo, last)

    return RemoteArray(ns, created(engine_of(ns), "linspace", (num,), dt, rows, args, "linspace"))


def _from_zarr(ns: Pusher, store: Any, /, *, device: Any = None) -> Any:
    return RemoteArray(ns, read_store(engine_of(ns), store, _chunk_bytes(ns)))


def _apply(
    ns: Pusher,
    fn: Callable[..., Any],
    /,
    *args: Any,
    shape: Any,
    dtype: Any,
    device: Any = None,
) -> Any:
    """``xp.apply`` on the cluster: ``fn`` runs once per chunk of rows, on a worker. With
    remote array arguments it gets their rows ``lo:hi`` (other arguments as they are) and
    returns the result's rows ``lo:hi``, a step of the chunks' fused program; with none (a
    loader, ``device=ae.remote()``) it is called as ``fn(*args, rows=slice(lo, hi))`` and
    returns those rows, read on the worker (a shard of files there)."""
    if not callable(fn):
        raise TypeError(f"apply: fn must be callable, got {fn!r}")
    shape = _shape(shape)
    dt = as_dtype(dtype)
    name = f"apply({getattr(fn, '__name__', 'apply')})"
    if not shape:
        raise ValueError(
            "apply on the cluster runs fn per chunk of rows: the result needs a leading axis "
            "(shape=(n, ...)); gather with x.to_device(ae.cpu()) for a 0-d result"
        )
    lead = -1  # the first remote array argument: its chunk's rows are the result's
    for i, a in enumerate(args):
        if type(a) is RemoteArray:
            if a._ns is not ns:
                raise ValueError("remote arrays of two engines in one call")
            if a.ndim != len(shape) or a.shape[0] != shape[0]:
                raise ValueError(
                    f"{name} on the cluster runs fn per chunk of rows: every remote array "
                    f"argument must have the result's leading axis and number of dimensions "
                    f"(result {shape}, argument {a.shape}); keep the axis (return shape "
                    "(rows, 1) for a per-row value)"
                )
            lead = i if lead < 0 else lead
        elif isinstance(a, Array):
            raise _other_device(a)
        elif type(a) in (list, tuple) and any(type(b) is RemoteArray for b in a):
            raise TypeError(
                f"{name}: pass each remote array as an argument of its own (fn gets its "
                "chunk's rows in its place); a list or tuple is passed to fn as it is"
            )
    if lead < 0:
        rows = chunk_rows(shape, _chunk_bytes(ns))

        def chunk_args(lo: int, hi: int) -> tuple[Any, ...]:
            return (Applied(fn, (hi - lo, *shape[1:]), dt), args, lo, hi)

        return RemoteArray(ns, created(engine_of(ns), "apply", shape, dt, rows, chunk_args, name))
    operands = [a if type(a) is RemoteArray else (CONST, a) for a in args]
    step = Applied(fn, None, dt, lead, shape[1:])
    return _join_or_start(ns, step, name, operands, shape, dt)


def _reduction(name: str) -> Callable[..., Any]:
    def reduce(
        ns: Pusher, x: Any, /, *, axis: Any = None, keepdims: bool = False, dtype: Any = None
    ) -> Any:
        if type(x) is not RemoteArray:
            raise TypeError(f"{name}() needs an array, got {type(x).__name__}")
        axes = (axis,) if isinstance(axis, int) else axis
        if (
            axes is not None and sorted(a % max(x.ndim, 1) for a in axes) != list(range(x.ndim))
        ) or keepdims:
            raise NotImplementedError(
                f"xp.{name} of a remote array reduces over every axis (axis=None, "
                "keepdims=False) only; gather first with x.to_device(ae.cpu()) for axis= "
                "or keepdims="
            )
        return reduce_all(ns, name, x, None if dtype is None else as_dtype(dtype))

    return reduce


def reduce_all(ns: Pusher, name: str, x: RemoteArray, dtype: np.dtype[Any] | None) -> Any:
    """The reduction ``name`` of every element of ``x``: a partial per chunk (fused into the
    program that makes ``x``, if it is pending), combined in chunk order into a 0-d remote
    array."""
    sample = np.zeros(1, x.dtype)
    fn: Callable[..., Any] = getattr(np, name)
    out_dtype = np.asarray(fn(sample, dtype=dtype) if dtype is not None else fn(sample)).dtype
    if name in ("max", "min") and x.size == 0:
        raise ValueError(f"zero-size array to reduction operation {name} which has no identity")
    partial = "sum" if name == "mean" else name
    engine = engine_of(ns)
    result = Store(engine, (), out_dtype, 1, name)
    expr = _pending_in(x)
    if expr is not None:
        with expr.lock:
            k = _step_of(expr, x) if not expr.flushed else None
            if k is not None:
                result.expr = expr
                expr.sinks.append((partial, name, (STEP, k), out_dtype, x.size, result))
                return RemoteArray(ns, result)
    expr = Expr(engine, x.shape, chunk_rows(x.shape, _chunk_bytes(ns)), name)
    with expr.lock:
        ref = expr.input(x._store, x._view)
        assert ref[0] == IN
        result.expr = expr
        expr.sinks.append((partial, name, ref, out_dtype, x.size, result))
    flush_soon(expr)
    return RemoteArray(ns, result)


def _elementwise(name: str) -> Callable[..., Any]:
    fn = elementwise_function(name)

    def apply(ns: Pusher, *args: Any) -> Any:
        if not any(type(a) is RemoteArray for a in args):
            raise TypeError(f"{name}() needs at least one array argument")
        return record(ns, fn, name, args)

    return apply


def _build() -> dict[str, Callable[..., Any]]:
    table: dict[str, Callable[..., Any]] = {n: _elementwise(n) for n in ELEMENTWISE}
    table.update(
        asarray=_asarray,
        astype=_astype,
        where=_where,
        zeros=_creation("zeros"),
        ones=_creation("ones"),
        empty=_creation("empty"),
        full=_full,
        zeros_like=_like("zeros"),
        ones_like=_like("ones"),
        empty_like=_like("empty"),
        full_like=_full_like,
        arange=_arange,
        linspace=_linspace,
        from_zarr=_from_zarr,
        apply=_apply,
        sum=_reduction("sum"),
        prod=_reduction("prod"),
        mean=_reduction("mean"),
        max=_reduction("max"),
        min=_reduction("min"),
    )
    return table


#: The namespace functions with a per-chunk form on remote arrays (filled on first use).
FUNCTIONS: dict[str, Callable[..., Any]] = {}


def call(ns: Pusher, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The namespace function ``name`` on remote arrays (or ``device=ae.remote()``): its
    per-chunk form, or ``NotImplementedError`` naming it and how to gather."""
    if not FUNCTIONS:
        FUNCTIONS.update(_build())
    fn = FUNCTIONS.get(name)
    if fn is None:
        raise _unsupported(name)
    device = kwargs.get("device")
    if device is not None and not is_remote(device) and name != "asarray":
        raise ValueError(
            f"{name}: device={device} for a remote array; move it with x.to_device(...)"
        )
    return fn(ns, *args, **kwargs)


# -- operators ------------------------------------------------------------------------------


def _binary(name: str, reflected: bool = False) -> Callable[[RemoteArray, Any], Any]:
    fn = elementwise_function(name)

    def method(self: RemoteArray, other: Any) -> Any:
        if not (
            type(other) is RemoteArray
            or type(other) in SCALARS
            or isinstance(other, np.ndarray | np.generic | Array)
        ):
            return NotImplemented
        args = (other, self) if reflected else (self, other)
        return record(self._ns, fn, name, args)

    method.__name__ = f"__r{name}__" if reflected else f"__{name}__"
    return method


def _inplace(name: str) -> Callable[[RemoteArray, Any], Any]:
    def method(self: RemoteArray, other: Any) -> Any:
        return inplace(self._ns, name, self, other)

    return method


def _unary(name: str) -> Callable[[RemoteArray], Any]:
    fn = elementwise_function(name)

    def method(self: RemoteArray) -> Any:
        return record(self._ns, fn, name, (self,))

    return method


for _dunder, _fname in OPERATORS.items():
    if _dunder == "matmul":
        continue  # no per-chunk form: ``x @ y`` raises as ``xp.matmul`` does
    setattr(RemoteArray, f"__{_dunder}__", _binary(_fname))
    setattr(RemoteArray, f"__r{_dunder}__", _binary(_fname, reflected=True))
    setattr(RemoteArray, f"__i{_dunder}__", _inplace(_fname))
for _dunder, _fname in COMPARISONS.items():
    setattr(RemoteArray, f"__{_dunder}__", _binary(_fname))
for _dunder, _fname in UNARY_OPERATORS.items():
    setattr(RemoteArray, f"__{_dunder}__", _unary(_fname))
