"""The Array API namespace bound to one engine: every function a push.

``namespace(engine)`` returns the :class:`Namespace` of ``engine`` (one per engine). Its
functions are the Python Array API standard's (revision 2024.12) with NumPy's semantics: each
computes the result's metadata on the caller's thread (``_meta.py``), then pushes one operation
(``_kernel.run``) that reads its input Buffers' Vars and writes a new Buffer's Var (or, in
place, the target's), and returns the result :class:`Array` at once.

Where an operation runs (written once, here): on its arrays' device; on a CPU, operations whose
estimated cost (elements touched) is at most :data:`INLINE_COST` run inline on the event loop
(``FnProperty.ASYNC``: a thread hop costs more than such work), larger ones on the device's
thread pool. Creation functions of small CPU arrays compute on the caller's thread (no push).

The elementwise functions are built from one table (:data:`ELEMENTWISE`); the rest are written
out, grouped as the standard groups them.
"""

from __future__ import annotations

import asyncio
import functools
import math
import operator
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, NamedTuple, TypeVar

import numpy as np

from .. import BlockingEngine, Context, DeviceType, Engine, FnProperty, Operation, cpu, gpu
from . import _meta
from ._array import Array
from ._buffer import Buffer
from ._kernel import MISSING, Const, Kernel
from ._meta import Shape, as_dtype, axis_index, broadcast, layout, reduced
from ._sync import PendingArrayError, on_loop_thread

__all__ = ("ELEMENTWISE", "INLINE_COST", "Namespace")

T = TypeVar("T")

#: The largest operation (elements touched) run inline on the loop rather than on a pool
#: thread. Measured on 2 cores: a thread hop costs 15-30 µs, about what NumPy needs for an
#: elementwise operation on 16-32 Ki float64 elements (benchmarks/arrays.py).
INLINE_COST = 16384

_CPU = DeviceType.CPU
_CPU0 = cpu()
_ASYNC = FnProperty.ASYNC
_NORMAL = FnProperty.NORMAL
_SCALARS = (bool, int, float, complex)
_partial = functools.partial
# Result dtypes of the hot path (_fast): (function, dtype, dtype or scalar type) -> dtype.
_DTYPES: dict[tuple[Any, ...], np.dtype[Any]] = {}

#: The elementwise functions: name -> number of array arguments. Each is NumPy's function of
#: the same name, which follows the standard's type promotion (NEP 50) and broadcasting.
ELEMENTWISE: dict[str, int] = {
    **dict.fromkeys(
        [
            "abs",
            "acos",
            "acosh",
            "asin",
            "asinh",
            "atan",
            "atanh",
            "bitwise_invert",
            "ceil",
            "conj",
            "cos",
            "cosh",
            "exp",
            "expm1",
            "floor",
            "imag",
            "isfinite",
            "isinf",
            "isnan",
            "log",
            "log1p",
            "log2",
            "log10",
            "logical_not",
            "negative",
            "positive",
            "real",
            "reciprocal",
            "round",
            "sign",
            "signbit",
            "sin",
            "sinh",
            "square",
            "sqrt",
            "tan",
            "tanh",
            "trunc",
        ],
        1,
    ),
    **dict.fromkeys(
        [
            "add",
            "atan2",
            "bitwise_and",
            "bitwise_left_shift",
            "bitwise_or",
            "bitwise_right_shift",
            "bitwise_xor",
            "copysign",
            "divide",
            "equal",
            "floor_divide",
            "greater",
            "greater_equal",
            "hypot",
            "less",
            "less_equal",
            "logaddexp",
            "logical_and",
            "logical_or",
            "logical_xor",
            "maximum",
            "minimum",
            "multiply",
            "nextafter",
            "not_equal",
            "pow",
            "remainder",
            "subtract",
        ],
        2,
    ),
}

_DTYPE_NAMES = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float32",
    "float64",
    "complex64",
    "complex128",
]


class UniqueAllResult(NamedTuple):
    """What :meth:`Namespace.unique_all` returns."""

    values: Array
    indices: Array
    inverse_indices: Array
    counts: Array


class UniqueCountsResult(NamedTuple):
    """What :meth:`Namespace.unique_counts` returns."""

    values: Array
    counts: Array


class UniqueInverseResult(NamedTuple):
    """What :meth:`Namespace.unique_inverse` returns."""

    values: Array
    inverse_indices: Array


# -- the functions pushed (module level: partials of them carry no closure) -----------------


def _index_step(key: tuple[Any, ...], value: Any) -> Any:
    return value[key]


def _reshape_step(shape: tuple[int, ...], value: Any) -> Any:
    return value.reshape(shape)


def _transpose_step(axes: tuple[int, ...], value: Any) -> Any:
    return value.transpose(axes)


def _broadcast_step(shape: tuple[int, ...], value: Any) -> Any:
    return np.broadcast_to(value, shape)


def _call(fn: Callable[..., Any], kwargs: dict[str, Any], *values: Any) -> Any:
    return fn(*values, **kwargs)


def _inplace_ufunc(ufunc: Callable[..., Any], target: Any, other: Any) -> None:
    ufunc(target, other, out=target)


def _inplace_matmul(target: Any, other: Any) -> None:
    target[...] = np.matmul(target, other)


def _assign(
    key: tuple[Any, ...], positions: tuple[int, ...], target: Any, value: Any, *idx: Any
) -> None:
    if positions:
        parts = list(key)
        for pos, index in zip(positions, idx, strict=True):
            parts[pos] = index
        key = tuple(parts)
    target[key] = value


def _take_key(key: tuple[Any, ...], positions: tuple[int, ...], value: Any, *idx: Any) -> Any:
    parts = list(key)
    for pos, index in zip(positions, idx, strict=True):
        parts[pos] = index
    return value[tuple(parts)]


def _nothing(rctx: object) -> None:
    """Pushed once by a BlockingEngine's namespace, to learn the engine's loop."""


def _copy(value: Any) -> Any:
    return value.copy()


def _astype(dtype: np.dtype[Any], value: Any) -> Any:
    return value.astype(dtype, copy=True)


def _apply_checked(fn: Callable[..., Any], shape: Shape, dtype: np.dtype[Any], *values: Any) -> Any:
    result = fn(*values)
    if not isinstance(result, np.ndarray):
        raise TypeError(
            f"apply: {getattr(fn, '__qualname__', fn)!r} returned {type(result).__name__}, "
            "not a NumPy array"
        )
    if result.dtype != dtype:
        raise TypeError(f"apply: the function returned dtype {result.dtype}, not {dtype}")
    if result.shape != shape:
        raise ValueError(f"apply: the function returned shape {result.shape}, not {shape}")
    return result


def _sort(descending: bool, stable: bool, axis: int, arg: bool, value: Any) -> Any:
    kind: Any = "stable" if stable else None
    if not descending:
        return (
            np.argsort(value, axis=axis, kind=kind) if arg else np.sort(value, axis=axis, kind=kind)
        )
    if not arg:
        return np.flip(np.sort(value, axis=axis, kind=kind), axis=axis)
    # Stable descending: sort the reversed array stably, then map the indices back.
    n = value.shape[axis]
    idx = np.argsort(np.flip(value, axis=axis), axis=axis, kind=kind)
    return np.flip(n - 1 - idx, axis=axis)


def _nonzero(value: Any) -> Any:
    return tuple(np.nonzero(value))


def _unique(kind: str, value: Any) -> Any:
    result = getattr(np, f"unique_{kind}")(value)
    return tuple(result) if kind != "values" else result


def _creation(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return fn(*args, **kwargs)


class Info:
    """What ``xp.__array_namespace_info__()`` returns: the namespace's capabilities, devices
    and dtypes."""

    def __init__(self, ns: Namespace) -> None:
        self._ns = ns

    def capabilities(self) -> dict[str, Any]:
        """Boolean indexing and data-dependent shapes are supported (a dimension is None
        until the value is known); up to 64 dimensions (NumPy's limit)."""
        return {"boolean indexing": True, "data-dependent shapes": True, "max dimensions": 64}

    def default_device(self) -> Context:
        """``cpu(0)``."""
        return _CPU0

    def devices(self) -> list[Context]:
        """``cpu(0)``, and ``gpu(0)`` where the engine's GPU backend has a device."""
        devices = [_CPU0]
        backend = self._ns._engine.gpu_backend
        try:
            if backend is not None:
                backend.check(0)
                devices.append(gpu(0))
            else:
                from .. import gpu_available

                if gpu_available():
                    devices.append(gpu(0))
        except Exception:  # no device: only the CPU is listed
            pass
        return devices

    def default_dtypes(self, *, device: Context | None = None) -> dict[str, np.dtype[Any]]:
        """float64, complex128, int64 and int64 (indexing)."""
        return {
            "real floating": np.dtype(np.float64),
            "complex floating": np.dtype(np.complex128),
            "integral": np.dtype(np.int64),
            "indexing": np.dtype(np.int64),
        }

    def dtypes(
        self, *, device: Context | None = None, kind: str | tuple[str, ...] | None = None
    ) -> dict[str, np.dtype[Any]]:
        """The supported dtypes by name, optionally only those of ``kind`` (as ``isdtype``)."""
        out = {}
        for name in _DTYPE_NAMES:
            dtype = np.dtype(name)
            if kind is None or np.isdtype(dtype, kind):
                out[name] = dtype
        return out


class Namespace:
    """The Array API namespace of one engine (revision 2024.12); see the module docstring.

    Get it with :func:`aioengine.array.namespace`; ``x.__array_namespace__()`` returns it too.
    """

    __array_api_version__ = "2024.12"

    e = math.e
    inf = math.inf
    nan = math.nan
    pi = math.pi
    newaxis = None

    def __init__(self, engine: Engine | BlockingEngine) -> None:
        if isinstance(engine, BlockingEngine):
            self._blocking: BlockingEngine | None = engine
            self._engine: Engine = engine.engine
        elif isinstance(engine, Engine):
            self._blocking = None
            self._engine = engine
        else:
            raise TypeError(f"expected an aioengine Engine or BlockingEngine, got {engine!r}")
        #: The engine's event loop, learnt from the first operation pushed (sync points off
        #: the loop thread wait on it); a BlockingEngine's is known at once.
        self._loop: asyncio.AbstractEventLoop | None = None
        if self._blocking is not None:
            probe = self._blocking.push_sync(_nothing, prop=_ASYNC, name="namespace")
            self._loop = probe.operation.get_loop()  # type: ignore[attr-defined]
        for name in _DTYPE_NAMES:
            setattr(self, name, np.dtype(name))
        from ._fft import FFT
        from ._linalg import Linalg

        self.linalg = Linalg(self)
        self.fft = FFT(self)

    def __repr__(self) -> str:
        return f"<aioengine.array namespace of {self._engine!r}>"

    def __array_namespace_info__(self) -> Info:
        """The namespace's inspection utilities."""
        return Info(self)

    # -- the machinery: buffers, pushes, waits -------------------------------------------

    def _bind(self, op: Operation[Any]) -> None:
        if self._loop is None:
            try:
                self._loop = op.get_loop()
            except RuntimeError:  # the engine is not bound to a loop yet
                pass

    def _learn_loop(self) -> asyncio.AbstractEventLoop | None:
        """The engine's loop, asking the engine (with a no-op push) if no array operation has
        told it yet; None if the engine is not bound to a loop."""
        if self._loop is None:
            try:
                self._bind(self._engine.push_sync(_nothing, prop=_ASYNC, name="namespace"))
            except RuntimeError:  # not bound to a loop yet
                pass
        return self._loop

    def _wait(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the engine's loop and block this (non-loop) thread for its result."""
        loop = self._loop
        if loop is None or loop.is_closed():
            coro.close()
            raise RuntimeError(f"{self._engine!r} has no running event loop to wait on")
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    def _from_value(self, value: Any, device: Context = _CPU0) -> Array:
        """An array whose value is already computed (no operation)."""
        shape = tuple(value.shape)
        buf = Buffer(self._engine, self._engine.new_var("array"), shape, value.dtype, value)
        return Array(self, buf, shape, value.dtype, device)

    def _check_same(self, arrays: Sequence[Array]) -> Context:
        """The device of ``arrays``: ValueError if they belong to another engine or to several
        devices."""
        device = None
        for a in arrays:
            if a._ns is not self:
                raise ValueError(
                    "arrays of two engines in one call: "
                    f"{a._ns._engine!r} and {self._engine!r}; move one with xp.asarray(...) "
                    "after reading it"
                )
            if device is None:
                device = a._device
            elif a._device != device:
                raise ValueError(
                    f"arrays on different devices in one call: {device} and {a._device}; "
                    "move one with x.to_device(...)"
                )
        return device if device is not None else _CPU0

    def _operand_ok(self, x: object) -> bool:
        return isinstance(x, Array | np.ndarray | np.generic) or type(x) in _SCALARS

    def _operand(self, x: Any) -> Array | Const:
        if isinstance(x, Array):
            return x
        if type(x) in _SCALARS:
            return Const(x)
        if isinstance(x, np.ndarray | np.generic):
            return self.asarray(x)
        raise TypeError(
            f"expected an array of this namespace or a Python scalar, got {type(x).__name__}"
        )

    def _push(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        outs: tuple[tuple[Shape, np.dtype[Any]], ...],
        device: Context,
        name: str,
        cost: int,
        *,
        target: Array | None = None,
        prop: FnProperty | None = None,
        run_on: Context | None = None,
    ) -> tuple[Array, ...]:
        """Push ``fn`` over the values of ``args`` as one operation on ``run_on`` (default:
        ``device``, where the outputs live); return its output arrays (none for an in-place
        write into ``target``)."""
        engine = self._engine
        reads = []
        seen = set()
        target_buf = target._buf if target is not None else None
        for a in args:
            buf = a._buf
            if buf is not None and buf is not target_buf and id(buf) not in seen:
                seen.add(id(buf))
                reads.append(buf.var)
        if run_on is None:
            run_on = device
        if prop is None:
            prop = _ASYNC if cost <= INLINE_COST and run_on.device_type is _CPU else _NORMAL
        if target_buf is None and len(outs) == 1:
            ((shape, dtype),) = outs
            buf = Buffer(engine, engine.new_var(name), shape, dtype, MISSING, fn, args, name)
            buf.writer = self._submit(buf.produce, run_on, reads, (buf.var,), prop, name, None)
            return (Array(self, buf, shape, dtype, device),)
        bufs = tuple(
            Buffer(engine, engine.new_var(name), shape, dtype, MISSING, name=name)
            for shape, dtype in outs
        )
        if target_buf is not None:
            target_buf.rewritten = True
            writes: tuple[Any, ...] = (target_buf.var,)
        else:
            writes = tuple(b.var for b in bufs)
        kernel = Kernel(fn, args, bufs, target_buf, name)
        op = self._submit(kernel.run, run_on, reads, writes, prop, name, target_buf)
        for buf in bufs:
            buf.writer = op
        return tuple(Array(self, buf, buf.shape, buf.dtype, device) for buf in bufs)

    def _push1(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        shape: Shape,
        dtype: np.dtype[Any],
        device: Context,
        name: str,
        cost: int | None = None,
        prop: FnProperty | None = None,
        run_on: Context | None = None,
    ) -> Array:
        if cost is None:
            cost = max([_meta.prod(shape), *(_meta.prod(a.shape) for a in args if a._buf)])
        return self._push(
            fn, args, ((shape, dtype),), device, name, cost, prop=prop, run_on=run_on
        )[0]

    def _xp(self, device: Context) -> Any:
        """The array module of ``device``: NumPy on a CPU and on the simulated GPU, CuPy on a
        real one."""
        if device.device_type is _CPU:
            return np
        backend = self._engine.gpu_backend
        if backend is None or getattr(backend, "name", "") == "cupy":
            import cupy

            return cupy
        return np

    def _concrete(self, x: Array, what: str) -> tuple[int, ...]:
        """``x.shape`` with every dimension known: an unknown (data-dependent) one is learnt
        from the value (a sync point: blocking off the loop thread, PendingArrayError on it)."""
        shape = x.shape
        if None in shape:
            if not x.ready and (self._loop is None or on_loop_thread(self._loop)):
                raise PendingArrayError(
                    f"{what} needs the shape of an array whose shape depends on its data "
                    f"{x._shape}; `await` it first (blocking the loop thread could only "
                    "deadlock)"
                )
            value = x._value_now(what)
            shape = x._shape = tuple(value.shape)
        return shape  # type: ignore[return-value]

    def _layout_of(self, x: Array) -> np.ndarray[Any, Any]:
        lay = x._layout
        if lay is None:
            lay = x._layout = layout(self._concrete(x, "a view"), x._dtype)
        return lay

    def _view(self, x: Array, step: Callable[[Any], Any], lay: np.ndarray[Any, Any]) -> Array:
        """An array sharing ``x``'s Buffer, seen through ``step`` (whose layout is ``lay``)."""
        return Array(self, x._buf, tuple(lay.shape), x._dtype, x._device, (*x._steps, step), lay)

    # -- elementwise ------------------------------------------------------------------------

    def _binop(self, fn: Callable[..., Any], name: str, a: Any, b: Any) -> Array:
        """A binary elementwise function (the operators' path): the hot path (``c = c + b``)
        for two arrays of this namespace on one device, or an array and a Python float or
        complex; :meth:`_elementwise` for everything else."""
        if type(a) is Array and a._ns is self:
            if type(b) is Array:
                if b._ns is self and (b._device is a._device or b._device == a._device):
                    return self._fast(fn, name, a, b, b._dtype)
            elif type(b) in _SCALARS and type(b) is not int:
                return self._fast(fn, name, a, Const(b), b)
        return self._elementwise(fn, name, (a, b))

    def _elementwise(
        self, fn: Callable[..., Any], name: str, args: tuple[Any, ...], **kw: Any
    ) -> Array:
        operands = tuple(map(self._operand, args))
        arrays = [a for a in operands if a._buf is not None]
        if not arrays:
            raise TypeError(f"{name}() needs at least one array argument")
        device = self._check_same(arrays)
        shape = broadcast(*(a._shape for a in arrays))
        dtype = _meta.sample_dtype(
            fn,
            [a._dtype if a._buf is not None else a.value for a in operands],
            **kw,
        )
        call = _partial(_call, fn, kw) if kw else fn
        return self._push1(call, operands, shape, dtype, device, name)

    def _fast(self, fn: Callable[..., Any], name: str, a: Array, b: Any, bkey: Any) -> Array:
        """:meth:`_elementwise` of ``a`` and ``b`` (an array, or a Const whose scalar is
        ``bkey``): the same metadata and push, with fewer steps."""
        ashape = a._shape
        bshape = b._shape if type(b) is Array else ()
        shape = ashape if ashape == bshape or not bshape else broadcast(ashape, bshape)
        key = (fn, a._dtype, bkey if isinstance(bkey, np.dtype) else type(bkey))
        dtype = _DTYPES.get(key)
        if dtype is None:
            dtype = _DTYPES[key] = _meta.sample_dtype(fn, [a._dtype, bkey])
        engine = self._engine
        buf = Buffer(engine, engine.new_var(name), shape, dtype, MISSING, fn, (a, b), name)
        out = Array(self, buf, shape, dtype, a._device)
        abuf = a._buf
        bbuf = b._buf
        reads = (abuf.var,) if bbuf is None or bbuf is abuf else (abuf.var, bbuf.var)
        size = 1
        for d in shape:
            size *= d or 1
        device = a._device
        prop = _ASYNC if size <= INLINE_COST and device.device_type is _CPU else _NORMAL
        if self._blocking is None:
            op: Operation[Any] = engine.push_sync(
                buf.produce, device, reads, (buf.var,), prop=prop, name=name
            )
            buf.writer = op
            if self._loop is None:
                self._bind(op)
            if engine.max_pending is not None:
                self._backpressure()
            return out
        buf.writer = self._submit(buf.produce, device, reads, (buf.var,), prop, name, None)
        return out

    def _submit(
        self,
        kernel: Callable[..., Any],
        device: Context,
        reads: Sequence[Any],
        writes: tuple[Any, ...],
        prop: FnProperty,
        name: str,
        target: Buffer | None,
    ) -> Operation[Any]:
        """Push ``kernel`` (from any thread) and return its operation; ``target``'s writer
        is set, the loop learnt, and room waited for off the loop thread."""
        blocking = self._blocking
        if blocking is not None and asyncio._get_running_loop() not in (None, self._loop):
            op: Operation[Any] = blocking.push_sync(
                kernel, device, reads, writes, prop=prop, name=name
            ).operation  # type: ignore[attr-defined]
        else:
            op = self._engine.push_sync(kernel, device, reads, writes, prop=prop, name=name)
        if target is not None:
            target.writer = op
        if self._loop is None:
            self._bind(op)
        if self._engine.max_pending is not None:
            self._backpressure()
        return op

    def _backpressure(self) -> None:
        """Off the loop thread, wait for room under ``max_pending`` before returning (a
        synchronous loop cannot run away); on it, never wait."""
        engine = self._engine
        limit = engine.max_pending
        if limit is None or engine.pending < limit:
            return
        loop = self._loop
        if loop is not None and asyncio._get_running_loop() is None:
            self._wait(engine.wait_for_capacity())

    def _inplace(self, name: str, target: Array, other: Any) -> None:
        """``target <op>= other``: a write on target's Buffer; the result must keep target's
        shape and dtype (TypeError / ValueError at the call otherwise)."""
        operand = self._operand(other)
        arrays = [target] + ([operand] if operand._buf is not None else [])
        device = self._check_same(arrays)
        self._writable(target)
        value = operand._dtype if operand._buf is not None else operand.value
        if name == "matmul":
            shape = _meta.matmul_shape(target._shape, operand.shape)
            dtype = _meta.sample_dtype(
                np.matmul,
                [
                    (target._dtype, (1,) * max(target.ndim, 2)),
                    (value, (1,) * max(len(operand.shape), 2)),
                ],
            )
            fn: Callable[..., Any] = _inplace_matmul
        else:
            ufunc = getattr(np, name)
            shape = broadcast(target._shape, operand.shape)
            dtype = _meta.sample_dtype(ufunc, [target._dtype, value])
            fn = _partial(_inplace_ufunc, ufunc)
        if dtype != target._dtype:
            raise TypeError(
                f"in-place {name}: the result dtype {dtype} is not the array's dtype "
                f"{target._dtype} (an in-place operation cannot change the dtype)"
            )
        if shape != target._shape:
            raise ValueError(
                f"in-place {name}: the result shape {shape} is not the array's shape "
                f"{target._shape} (an in-place operation cannot change the shape)"
            )
        cost = _meta.prod(shape)
        self._push(fn, (target, operand), (), device, f"i{name}", cost, target=target)

    def _writable(self, x: Array) -> None:
        if x._steps and not self._layout_of(x).flags.writeable:
            raise ValueError("assignment destination is read-only (a broadcast view)")

    def clip(self, x: Array, /, min: Any = None, max: Any = None) -> Array:
        """Clamp each element of ``x`` to ``[min, max]`` (arrays or scalars; None: unbounded)."""
        if not isinstance(x, Array):
            raise TypeError("clip() needs an array")
        if min is None and max is None:
            return self._elementwise(
                np.positive if x._dtype.kind != "b" else np.logical_and,
                "clip",
                (x,) if x._dtype.kind != "b" else (x, True),
            )
        args: list[Any] = [x]
        names = []
        for bound, kw in ((min, "min"), (max, "max")):
            if bound is not None:
                args.append(bound)
                names.append(kw)
        dtype_args = tuple(args)
        operands = tuple(map(self._operand, dtype_args))
        arrays = [a for a in operands if a._buf is not None]
        device = self._check_same(arrays)
        shape = broadcast(*(a._shape for a in arrays))
        if shape != x._shape:
            raise ValueError(f"clip: the bounds do not broadcast to x's shape {x._shape}")
        fn = _partial(_clip, tuple(names))
        for a in operands[1:]:
            if (
                a._buf is not None
                and a._dtype != x._dtype
                and np.result_type(a._dtype, x._dtype) != x._dtype
            ):
                raise TypeError(
                    f"clip: a bound of dtype {a._dtype} does not fit x's dtype {x._dtype}"
                )
        return self._push1(fn, operands, shape, x._dtype, device, "clip")

    # -- creation ---------------------------------------------------------------------------

    def asarray(
        self,
        obj: Any,
        /,
        *,
        dtype: Any = None,
        device: Context | None = None,
        copy: bool | None = None,
    ) -> Array:
        """An array from ``obj`` (an array, a NumPy array, a scalar, nested sequences, or an
        object with ``__array__``/``__dlpack__``). ``copy=None`` shares a NumPy array's memory
        where possible (as NumPy does), ``True`` always copies, ``False`` never does
        (ValueError if it must). An array of this namespace with a new dtype or device is a
        copy operation."""
        if dtype is not None:
            dtype = as_dtype(dtype)
        if isinstance(obj, Array):
            self._check_same([obj])
            out = obj
            if dtype is not None and dtype != obj._dtype:
                if copy is False:
                    raise ValueError("asarray: a dtype change needs a copy (copy=False)")
                out = self.astype(obj, dtype)
            elif copy:
                out = self._push1(_copy, (obj,), obj._shape, obj._dtype, obj._device, "copy")
            if device is not None and device != out._device:
                if copy is False:
                    raise ValueError("asarray: a device change needs a copy (copy=False)")
                out = out.to_device(device)
            return out
        if copy is False:
            value = np.asarray(obj, dtype=dtype, copy=False)
        elif copy:
            value = np.array(obj, dtype=dtype, copy=True)
        else:
            value = np.asarray(obj, dtype=dtype)
        if value.dtype.kind not in "biufc":
            raise TypeError(f"asarray: unsupported dtype {value.dtype} (from {type(obj).__name__})")
        if not value.flags.c_contiguous:
            if copy is False:
                raise ValueError("asarray: a non-C-contiguous array cannot be shared (copy=False)")
            value = np.ascontiguousarray(value)
        if type(value) is not np.ndarray:
            value = value.view(np.ndarray)
        array = self._from_value(value)
        if device is not None and device != _CPU0:
            return array.to_device(device)
        return array

    def _create(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        shape: tuple[int, ...],
        dtype: np.dtype[Any],
        device: Context | None,
        name: str,
    ) -> Array:
        device = _CPU0 if device is None else device
        if type(device) is not Context:
            raise ValueError(
                f"device must be an aioengine Context (ae.cpu(i) or ae.gpu(i)), got {device!r}"
            )
        size = math.prod(shape)
        if device.device_type is _CPU and size <= INLINE_COST:
            value = fn(*args, **kwargs)
            if not value.flags.c_contiguous:
                value = value.copy(order="C")
            return self._from_value(value, device)
        xp = self._xp(device)
        if xp is not np:
            fn = getattr(xp, fn.__name__)
        return self._push1(
            _partial(_creation, fn, args, kwargs), (), shape, dtype, device, name, cost=size
        )

    @staticmethod
    def _shape_arg(shape: Any) -> tuple[int, ...]:
        if isinstance(shape, int | np.integer):
            shape = (shape,)
        try:
            out = tuple(operator.index(d) for d in shape)
        except TypeError:
            raise TypeError(f"shape must be an int or a tuple of ints, got {shape!r}") from None
        if any(d < 0 for d in out):
            raise ValueError(f"negative dimensions are not allowed: {out}")
        return out

    def _dtype_or(self, dtype: Any, default: np.dtype[Any]) -> np.dtype[Any]:
        return default if dtype is None else as_dtype(dtype)

    def zeros(self, shape: Any, *, dtype: Any = None, device: Context | None = None) -> Array:
        """An array of zeros."""
        shape = self._shape_arg(shape)
        dtype = self._dtype_or(dtype, np.dtype(np.float64))
        return self._create(np.zeros, (shape,), {"dtype": dtype}, shape, dtype, device, "zeros")

    def ones(self, shape: Any, *, dtype: Any = None, device: Context | None = None) -> Array:
        """An array of ones."""
        shape = self._shape_arg(shape)
        dtype = self._dtype_or(dtype, np.dtype(np.float64))
        return self._create(np.ones, (shape,), {"dtype": dtype}, shape, dtype, device, "ones")

    def empty(self, shape: Any, *, dtype: Any = None, device: Context | None = None) -> Array:
        """An array whose values are unspecified (allocated, not filled)."""
        shape = self._shape_arg(shape)
        dtype = self._dtype_or(dtype, np.dtype(np.float64))
        return self._create(np.empty, (shape,), {"dtype": dtype}, shape, dtype, device, "empty")

    def full(
        self, shape: Any, fill_value: Any, *, dtype: Any = None, device: Context | None = None
    ) -> Array:
        """An array filled with ``fill_value``."""
        shape = self._shape_arg(shape)
        if isinstance(fill_value, Array):
            fill_value = fill_value.item()
        if type(fill_value) not in _SCALARS and not isinstance(fill_value, np.generic):
            raise TypeError(f"fill_value must be a scalar, got {type(fill_value).__name__}")
        if dtype is None:
            dtype = np.asarray(fill_value).dtype
        else:
            dtype = as_dtype(dtype)
            _meta.sample_dtype(np.full, [], shape=(1,), fill_value=fill_value, dtype=dtype)
        return self._create(
            np.full, (shape, fill_value), {"dtype": dtype}, shape, dtype, device, "full"
        )

    def _like(
        self, x: Array, dtype: Any, device: Context | None
    ) -> tuple[tuple[int, ...], np.dtype[Any], Context]:
        if not isinstance(x, Array):
            raise TypeError(f"expected an array, got {type(x).__name__}")
        return (
            self._concrete(x, "*_like"),
            x._dtype if dtype is None else as_dtype(dtype),
            x._device if device is None else device,
        )

    def zeros_like(self, x: Array, /, *, dtype: Any = None, device: Context | None = None) -> Array:
        """Zeros with ``x``'s shape (and dtype and device unless given)."""
        shape, dtype, device = self._like(x, dtype, device)
        return self.zeros(shape, dtype=dtype, device=device)

    def ones_like(self, x: Array, /, *, dtype: Any = None, device: Context | None = None) -> Array:
        """Ones with ``x``'s shape (and dtype and device unless given)."""
        shape, dtype, device = self._like(x, dtype, device)
        return self.ones(shape, dtype=dtype, device=device)

    def empty_like(self, x: Array, /, *, dtype: Any = None, device: Context | None = None) -> Array:
        """An unfilled array with ``x``'s shape (and dtype and device unless given)."""
        shape, dtype, device = self._like(x, dtype, device)
        return self.empty(shape, dtype=dtype, device=device)

    def full_like(
        self, x: Array, /, fill_value: Any, *, dtype: Any = None, device: Context | None = None
    ) -> Array:
        """``fill_value`` with ``x``'s shape (and dtype and device unless given)."""
        shape, dtype, device = self._like(x, dtype, device)
        return self.full(shape, fill_value, dtype=dtype, device=device)

    def arange(
        self,
        start: int | float,
        /,
        stop: int | float | None = None,
        step: int | float = 1,
        *,
        dtype: Any = None,
        device: Context | None = None,
    ) -> Array:
        """Evenly spaced values in ``[start, stop)``."""
        if stop is None:
            start, stop = 0, start
        for v in (start, stop, step):
            if type(v) not in (int, float) and not isinstance(v, np.generic):
                raise TypeError(f"arange: expected int or float arguments, got {v!r}")
        if step == 0:
            raise ValueError("arange: step must not be zero")
        n = max(0, math.ceil((stop - start) / step))
        if dtype is None:
            floating = any(isinstance(v, float | np.floating) for v in (start, stop, step))
            dtype = np.dtype(np.float64 if floating else np.int64)
        else:
            dtype = as_dtype(dtype)
        return self._create(
            np.arange, (start, stop, step), {"dtype": dtype}, (n,), dtype, device, "arange"
        )

    def linspace(
        self,
        start: int | float | complex,
        stop: int | float | complex,
        /,
        num: int,
        *,
        dtype: Any = None,
        device: Context | None = None,
        endpoint: bool = True,
    ) -> Array:
        """``num`` evenly spaced values from ``start`` to ``stop``."""
        num = operator.index(num)
        if num < 0:
            raise ValueError(f"linspace: num must be non-negative, got {num}")
        if dtype is None:
            kind = complex in (type(start), type(stop))
            dtype = np.dtype(np.complex128 if kind else np.float64)
        else:
            dtype = as_dtype(dtype)
        return self._create(
            np.linspace,
            (start, stop, num),
            {"dtype": dtype, "endpoint": endpoint},
            (num,),
            dtype,
            device,
            "linspace",
        )

    def eye(
        self,
        n_rows: int,
        n_cols: int | None = None,
        /,
        *,
        k: int = 0,
        dtype: Any = None,
        device: Context | None = None,
    ) -> Array:
        """A 2-D array with ones on the ``k``-th diagonal."""
        n_cols = n_rows if n_cols is None else n_cols
        shape = self._shape_arg((n_rows, n_cols))
        dtype = self._dtype_or(dtype, np.dtype(np.float64))
        return self._create(np.eye, shape, {"k": k, "dtype": dtype}, shape, dtype, device, "eye")

    def from_dlpack(
        self, x: Any, /, *, device: Context | None = None, copy: bool | None = None
    ) -> Array:
        """An array from any object that implements DLPack (a sync point for an Array of
        another engine)."""
        if isinstance(x, Array) and x._ns is self:
            return self.asarray(x, device=device, copy=copy)
        return self.asarray(np.from_dlpack(x), device=device, copy=copy)

    def tril(self, x: Array, /, *, k: int = 0) -> Array:
        """The lower triangle of the last two axes (zeros above the ``k``-th diagonal)."""
        return self._same_shape(np.tril, "tril", x, min_ndim=2, k=k)

    def triu(self, x: Array, /, *, k: int = 0) -> Array:
        """The upper triangle of the last two axes (zeros below the ``k``-th diagonal)."""
        return self._same_shape(np.triu, "triu", x, min_ndim=2, k=k)

    def meshgrid(self, *arrays: Array, indexing: str = "xy") -> list[Array]:
        """Coordinate matrices from 1-D coordinate arrays."""
        if indexing not in ("xy", "ij"):
            raise ValueError(f"meshgrid: indexing must be 'xy' or 'ij', got {indexing!r}")
        if not arrays:
            return []
        device = self._check_same(arrays)
        dtype = self.result_type(*arrays)
        sizes = []
        for a in arrays:
            if a.ndim != 1:
                raise ValueError("meshgrid: every array must be 1-D")
            sizes.append(self._concrete(a, "meshgrid")[0])
        shape = list(sizes)
        if indexing == "xy" and len(shape) > 1:
            shape[0], shape[1] = shape[1], shape[0]
        outs = tuple((tuple(shape), dtype) for _ in arrays)
        fn = _partial(_meshgrid, indexing, dtype)
        return list(
            self._push(fn, arrays, outs, device, "meshgrid", math.prod(shape) * len(arrays))
        )

    # -- data types -------------------------------------------------------------------------

    def astype(
        self, x: Array, dtype: Any, /, *, copy: bool = True, device: Context | None = None
    ) -> Array:
        """``x`` converted to ``dtype`` (a copy operation unless ``copy=False`` and nothing
        changes)."""
        dtype = as_dtype(dtype)
        out = x
        if dtype != x._dtype or copy:
            self._check_same([x])
            out = self._push1(_partial(_astype, dtype), (x,), x._shape, dtype, x._device, "astype")
        if device is not None and device != out._device:
            out = out.to_device(device)
        return out

    def can_cast(self, from_: Any, to: Any, /) -> bool:
        """Whether ``from_`` (a dtype or an array) can be cast to ``to`` by the promotion rules."""
        if isinstance(from_, Array):
            from_ = from_._dtype
        return bool(np.can_cast(as_dtype(from_), as_dtype(to)))

    def finfo(self, type: Any, /) -> Any:
        """Machine limits of a floating-point dtype (or array)."""
        return np.finfo(type._dtype if isinstance(type, Array) else as_dtype(type))

    def iinfo(self, type: Any, /) -> Any:
        """Machine limits of an integer dtype (or array)."""
        return np.iinfo(type._dtype if isinstance(type, Array) else as_dtype(type))

    def isdtype(self, dtype: Any, kind: Any) -> bool:
        """Whether ``dtype`` is of ``kind`` (``"real floating"``, a dtype, a tuple, ...)."""
        return bool(np.isdtype(as_dtype(dtype), kind))

    def result_type(self, *arrays_and_dtypes: Any) -> np.dtype[Any]:
        """The dtype that type promotion gives for these arrays, dtypes and scalars."""
        if not arrays_and_dtypes:
            raise ValueError("at least one array or dtype is required")
        args = [
            a._dtype if isinstance(a, Array) else a if type(a) in _SCALARS else as_dtype(a)
            for a in arrays_and_dtypes
        ]
        if all(type(a) in _SCALARS for a in args):
            raise ValueError("result_type needs at least one array or dtype")
        return np.result_type(*args)

    # -- indexing ---------------------------------------------------------------------------

    def _key(self, x: Array, key: Any) -> tuple[tuple[Any, ...], list[int], list[Array]]:
        """``key`` as a tuple; the positions and arrays of its array components."""
        if not isinstance(key, tuple):
            key = (key,)
        parts: list[Any] = []
        positions: list[int] = []
        arrays: list[Array] = []
        for i, k in enumerate(key):
            if isinstance(k, Array):
                positions.append(i)
                arrays.append(k)
                parts.append(k)
            elif isinstance(k, np.ndarray):
                arr = self.asarray(k)
                positions.append(i)
                arrays.append(arr)
                parts.append(arr)
            elif k is None or k is Ellipsis or isinstance(k, slice | bool | np.bool_):
                parts.append(k)
            else:
                try:
                    parts.append(operator.index(k))
                except TypeError:
                    raise IndexError(
                        f"only integers, slices, ..., None and integer or boolean arrays are "
                        f"valid indices, got {k!r}"
                    ) from None
        return tuple(parts), positions, arrays

    def _getitem(self, x: Array, key: Any) -> Array:
        parts, positions, arrays = self._key(x, key)
        if not arrays:
            if Ellipsis not in parts:
                parts = (*parts, Ellipsis)  # x[i, j] as a 0-d view, not a copied scalar
            lay = self._layout_of(x)[parts]
            return self._view(x, _partial(_index_step, parts), lay)
        device = self._check_same([x, *arrays])
        if len(arrays) == 1 and arrays[0]._dtype.kind == "b":
            mask = arrays[0]
            if len(parts) != 1:
                raise IndexError("a boolean array index must be the only index")
            mshape, xshape = mask._shape, x._shape
            if len(mshape) > len(xshape) or any(
                m is not None and d is not None and m != d
                for m, d in zip(mshape, xshape, strict=False)
            ):
                raise IndexError(
                    f"boolean index of shape {mshape} does not match the array's shape {xshape}"
                )
            shape: Shape = (None, *xshape[len(mshape) :])
        else:
            for a in arrays:
                if a._dtype.kind not in "iu":
                    raise IndexError(
                        "arrays used as indices must be of integer (or boolean) type, "
                        f"not {a._dtype}"
                    )
            dummy = np.broadcast_to(np.zeros((), np.int8), self._concrete(x, "indexing"))
            probe = list(parts)
            for pos, a in zip(positions, arrays, strict=True):
                probe[pos] = np.broadcast_to(np.zeros((), np.intp), self._concrete(a, "indexing"))
            shape = dummy[tuple(probe)].shape
        fn = _partial(_take_key, parts, tuple(positions))
        cost = max(_meta.prod(shape), 1)
        return self._push1(fn, (x, *arrays), shape, x._dtype, device, "getitem", cost)

    def _setitem(self, x: Array, key: Any, value: Any) -> None:
        parts, positions, arrays = self._key(x, key)
        operand = self._operand(value)
        device = self._check_same([x, *arrays, *([operand] if operand._buf is not None else [])])
        self._writable(x)
        if operand._buf is not None:
            vdtype = operand._dtype
            if np.result_type(x._dtype, vdtype) != x._dtype:
                raise TypeError(
                    f"cannot assign an array of dtype {vdtype} into an array of dtype {x._dtype}"
                )
        else:
            v = operand.value
            kind = x._dtype.kind
            if (
                (type(v) is float and kind in "biu")
                or (type(v) is complex and kind != "c")
                or (type(v) is int and kind == "b")
            ):
                raise TypeError(
                    f"cannot assign a Python {type(v).__name__} into an array of dtype {x._dtype}"
                )
            if type(v) is int and kind in "iu":
                info = np.iinfo(x._dtype)
                if not info.min <= v <= info.max:
                    raise OverflowError(f"Python integer {v} out of bounds for {x._dtype}")
        if not arrays:
            target_shape = self._layout_of(x)[parts].shape
            broadcast(target_shape, operand.shape)  # ValueError if it cannot broadcast
            if len(broadcast(target_shape, operand.shape)) > len(target_shape):
                raise ValueError(
                    f"cannot broadcast a value of shape {operand.shape} to {target_shape}"
                )
        fn = _partial(_assign, parts, tuple(positions))
        cost = max(_meta.prod(x._shape), 1)
        self._push(fn, (x, operand, *arrays), (), device, "setitem", cost, target=x)

    def take(self, x: Array, indices: Array, /, *, axis: int | None = None) -> Array:
        """Elements of ``x`` at integer ``indices`` along ``axis`` (optional for 1-D ``x``)."""
        device = self._check_same([x, indices])
        if indices._dtype.kind not in "iu" or indices.ndim != 1:
            raise IndexError("take: indices must be a 1-D integer array")
        if axis is None:
            if x.ndim != 1:
                raise ValueError("take: axis is required for an array of more than one dimension")
            axis = 0
        ax = axis_index(axis, x.ndim)
        shape = (*x._shape[:ax], *indices._shape, *x._shape[ax + 1 :])
        return self._push1(
            _partial(_call, np.take, {"axis": ax}), (x, indices), shape, x._dtype, device, "take"
        )

    def take_along_axis(self, x: Array, indices: Array, /, *, axis: int = -1) -> Array:
        """Elements of ``x`` at ``indices`` along ``axis``, matched position by position."""
        device = self._check_same([x, indices])
        if indices._dtype.kind not in "iu":
            raise IndexError("take_along_axis: indices must be an integer array")
        if x.ndim != indices.ndim:
            raise ValueError(
                "take_along_axis: x and indices must have the same number of dimensions"
            )
        ax = axis_index(axis, x.ndim)
        xs = tuple(d for i, d in enumerate(x._shape) if i != ax)
        js = tuple(d for i, d in enumerate(indices._shape) if i != ax)
        b = list(broadcast(xs, js))
        b.insert(ax, indices._shape[ax])
        return self._push1(
            _partial(_call, np.take_along_axis, {"axis": ax}),
            (x, indices),
            tuple(b),
            x._dtype,
            device,
            "take_along_axis",
        )

    # -- manipulation -----------------------------------------------------------------------

    def reshape(self, x: Array, /, shape: Any, *, copy: bool | None = None) -> Array:
        """``x`` with a new shape: a view of contiguous data (unless ``copy=True``), a copy
        otherwise (ValueError with ``copy=False``)."""
        shape = tuple(operator.index(d) for d in shape)
        lay = self._layout_of(x)
        try:
            new = lay.reshape(shape, copy=False)
        except ValueError as exc:
            if "copy" not in str(exc):
                raise
            if copy is False:
                raise ValueError(
                    "reshape: the data is not contiguous: a view is not possible (copy=False)"
                ) from None
            new = None
        if copy or new is None:
            target = np.reshape(np.broadcast_to(np.zeros((), np.int8), lay.shape), shape).shape
            return self._push1(
                _partial(_reshape_copy, target), (x,), target, x._dtype, x._device, "reshape"
            )
        return self._view(x, _partial(_reshape_step, new.shape), new)

    def permute_dims(self, x: Array, /, axes: tuple[int, ...]) -> Array:
        """``x`` with its axes permuted (a view)."""
        lay = self._layout_of(x)
        axes = tuple(axes)
        if len(axes) != x.ndim:
            raise ValueError(
                f"permute_dims: axes {axes} do not match an array of {x.ndim} dimensions"
            )
        new = lay.transpose(axes)
        return self._view(
            x, _partial(_transpose_step, tuple(axis_index(a, x.ndim) for a in axes)), new
        )

    def matrix_transpose(self, x: Array, /) -> Array:
        """The transpose of the last two axes (a view)."""
        if x.ndim < 2:
            raise ValueError("matrix_transpose needs an array of at least two dimensions")
        axes = (*range(x.ndim - 2), x.ndim - 1, x.ndim - 2)
        return self.permute_dims(x, axes)

    def expand_dims(self, x: Array, /, *, axis: int = 0) -> Array:
        """``x`` with a new axis of size one at ``axis`` (a view)."""
        ax = axis_index(axis, x.ndim + 1)
        key = (slice(None),) * ax + (None, Ellipsis)
        return self._getitem(x, key)

    def squeeze(self, x: Array, /, axis: int | tuple[int, ...]) -> Array:
        """``x`` without the size-one axes ``axis`` (a view)."""
        lay = self._layout_of(x)
        new = np.squeeze(lay, axis=axis)
        axes = _meta.reduced(tuple(range(x.ndim)), axis, False)
        return self._view(x, _partial(_reshape_step, new.shape), new) if axes is not None else x

    def flip(self, x: Array, /, *, axis: int | tuple[int, ...] | None = None) -> Array:
        """``x`` with the order of elements reversed along ``axis`` (a view)."""
        axes = tuple(range(x.ndim)) if axis is None else _normalize_axes(axis, x.ndim)
        key = tuple(slice(None, None, -1) if i in axes else slice(None) for i in range(x.ndim))
        return self._getitem(x, key)

    def moveaxis(self, x: Array, source: Any, destination: Any, /) -> Array:
        """``x`` with axes moved to new positions (a view)."""
        lay = self._layout_of(x)
        new = np.moveaxis(lay, source, destination)
        src = _normalize_axes(source, x.ndim)
        dst = _normalize_axes(destination, x.ndim)
        order = [n for n in range(x.ndim) if n not in src]
        for d, s in sorted(zip(dst, src, strict=True)):
            order.insert(d, s)
        return self._view(x, _partial(_transpose_step, tuple(order)), new)

    def broadcast_to(self, x: Array, /, shape: Any) -> Array:
        """``x`` broadcast to ``shape`` (a read-only view)."""
        shape = self._shape_arg(shape)
        lay = np.broadcast_to(self._layout_of(x), shape)
        return self._view(x, _partial(_broadcast_step, shape), lay)

    def broadcast_arrays(self, *arrays: Array) -> list[Array]:
        """The arrays broadcast against each other (read-only views)."""
        self._check_same(arrays)
        shape = broadcast(*(tuple(self._concrete(a, "broadcast_arrays")) for a in arrays))
        return [self.broadcast_to(a, shape) for a in arrays]

    def concat(self, arrays: Sequence[Array], /, *, axis: int | None = 0) -> Array:
        """The arrays joined along an existing ``axis`` (flattened first if None)."""
        arrays = tuple(arrays)
        if not arrays:
            raise ValueError("need at least one array to concatenate")
        device = self._check_same(arrays)
        dtype = self.result_type(*arrays)
        shapes = [self._concrete(a, "concat") for a in arrays]
        if axis is None:
            shape: tuple[int, ...] = (sum(math.prod(s) for s in shapes),)
        else:
            ndim = len(shapes[0])
            if ndim == 0:
                raise ValueError("zero-dimensional arrays cannot be concatenated")
            ax = axis_index(axis, ndim)
            for s in shapes:
                if len(s) != ndim or any(
                    d != e for i, (d, e) in enumerate(zip(s, shapes[0], strict=True)) if i != ax
                ):
                    raise ValueError(
                        "all the input array dimensions except for the concatenation axis must "
                        f"match exactly, got shapes {shapes}"
                    )
            shape = (*shapes[0][:ax], sum(s[ax] for s in shapes), *shapes[0][ax + 1 :])
        fn = _partial(_concat, axis, dtype)
        return self._push1(fn, arrays, shape, dtype, device, "concat")

    def stack(self, arrays: Sequence[Array], /, *, axis: int = 0) -> Array:
        """The arrays joined along a new ``axis``."""
        arrays = tuple(arrays)
        if not arrays:
            raise ValueError("need at least one array to stack")
        device = self._check_same(arrays)
        dtype = self.result_type(*arrays)
        shapes = {self._concrete(a, "stack") for a in arrays}
        if len(shapes) != 1:
            raise ValueError(f"all input arrays must have the same shape, got {sorted(shapes)}")
        (s,) = shapes
        ax = axis_index(axis, len(s) + 1)
        shape = (*s[:ax], len(arrays), *s[ax:])
        return self._push1(_partial(_stack, ax, dtype), arrays, shape, dtype, device, "stack")

    def unstack(self, x: Array, /, *, axis: int = 0) -> tuple[Array, ...]:
        """The slices of ``x`` along ``axis`` (views)."""
        if x.ndim == 0:
            raise ValueError("unstack needs an array of at least one dimension")
        ax = axis_index(axis, x.ndim)
        n = self._concrete(x, "unstack")[ax]
        return tuple(self._getitem(x, (slice(None),) * ax + (i,)) for i in range(n))

    def roll(
        self,
        x: Array,
        /,
        shift: int | tuple[int, ...],
        *,
        axis: int | tuple[int, ...] | None = None,
    ) -> Array:
        """``x`` with elements shifted cyclically along ``axis`` (all, flattened, if None)."""
        if axis is not None:
            np.roll(np.zeros((1,) * x.ndim), shift, axis=axis)  # bad axes and shifts raise here
        return self._same_shape(np.roll, "roll", x, shift=shift, axis=axis)

    def repeat(self, x: Array, repeats: int | Array, /, *, axis: int | None = None) -> Array:
        """Each element of ``x`` repeated ``repeats`` times along ``axis`` (flattened if
        None); with an array of repeats the length depends on its data."""
        device = self._check_same([x, *([repeats] if isinstance(repeats, Array) else [])])
        shape = self._concrete(x, "repeat")
        base: Shape = (math.prod(shape),) if axis is None else shape
        ax = 0 if axis is None else axis_index(axis, x.ndim)
        if isinstance(repeats, Array):
            if repeats._dtype.kind not in "iu":
                raise TypeError("repeat: repeats must be an integer array")
            n: int | None = None
            args: tuple[Any, ...] = (x, repeats)
            fn: Callable[..., Any] = _partial(_call, np.repeat, {"axis": axis})
        else:
            r = operator.index(repeats)
            if r < 0:
                raise ValueError("repeat: repeats may not be negative")
            n = base[ax] * r  # type: ignore[operator]
            args = (x,)
            fn = _partial(_call, np.repeat, {"repeats": r, "axis": axis})
        out = (*base[:ax], n, *base[ax + 1 :])
        return self._push1(fn, args, out, x._dtype, device, "repeat", cost=_meta.prod(base) * 2)

    def tile(self, x: Array, repetitions: tuple[int, ...], /) -> Array:
        """``x`` repeated ``repetitions`` times along each axis."""
        reps = tuple(operator.index(r) for r in repetitions)
        shape = np.tile(
            np.broadcast_to(np.zeros((), np.int8), self._concrete(x, "tile")),
            tuple(min(r, 1) for r in reps),
        ).shape
        ndim = max(len(shape), len(reps))
        reps_full = (1,) * (ndim - len(reps)) + reps
        base = (1,) * (ndim - x.ndim) + tuple(x._shape)
        out = tuple(int(b) * r for b, r in zip(base, reps_full, strict=True))  # type: ignore[arg-type]
        return self._push1(
            _partial(_call, np.tile, {"reps": reps}), (x,), out, x._dtype, x._device, "tile"
        )

    # -- searching, sorting, sets ------------------------------------------------------------

    def argmax(self, x: Array, /, *, axis: int | None = None, keepdims: bool = False) -> Array:
        """Indices of the maxima along ``axis`` (of the flattened array if None)."""
        return self._reduce(np.argmax, "argmax", x, axis, keepdims, single_axis=True)

    def argmin(self, x: Array, /, *, axis: int | None = None, keepdims: bool = False) -> Array:
        """Indices of the minima along ``axis`` (of the flattened array if None)."""
        return self._reduce(np.argmin, "argmin", x, axis, keepdims, single_axis=True)

    def count_nonzero(self, x: Array, /, *, axis: Any = None, keepdims: bool = False) -> Array:
        """The number of non-zero elements along ``axis``."""
        return self._reduce(np.count_nonzero, "count_nonzero", x, axis, keepdims)

    def nonzero(self, x: Array, /) -> tuple[Array, ...]:
        """The indices of the non-zero elements, one array per dimension (their length
        depends on the data: None until the value is known)."""
        if x.ndim == 0:
            raise ValueError("nonzero of a 0-d array is not allowed")
        device = self._check_same([x])
        outs = tuple(((None,), np.dtype(np.int64)) for _ in range(x.ndim))
        fn = _nonzero if x.ndim > 1 else np.flatnonzero
        return self._push(fn, (x,), outs, device, "nonzero", _meta.prod(x._shape))

    def searchsorted(
        self, x1: Array, x2: Array, /, *, side: str = "left", sorter: Array | None = None
    ) -> Array:
        """Where the elements of ``x2`` would be inserted into the sorted 1-D ``x1``."""
        arrays = [x1, x2] + ([sorter] if sorter is not None else [])
        x2 = self._operand(x2)  # type: ignore[assignment]
        device = self._check_same([a for a in arrays if isinstance(a, Array)])
        if x1.ndim != 1:
            raise ValueError("searchsorted: x1 must be 1-D")
        if side not in ("left", "right"):
            raise ValueError(f"searchsorted: side must be 'left' or 'right', got {side!r}")
        fn = _partial(_searchsorted, side)
        args = (x1, x2, *([sorter] if sorter is not None else []))
        return self._push1(fn, args, x2.shape, np.dtype(np.int64), device, "searchsorted")

    def where(self, condition: Array, x1: Any, x2: Any, /) -> Array:
        """Elements of ``x1`` where ``condition`` is true, of ``x2`` elsewhere."""
        if not isinstance(condition, Array) or condition._dtype.kind != "b":
            raise TypeError("where: condition must be a boolean array")
        return self._elementwise(np.where, "where", (condition, x1, x2))

    def argsort(
        self, x: Array, /, *, axis: int = -1, descending: bool = False, stable: bool = True
    ) -> Array:
        """The indices that sort ``x`` along ``axis``."""
        ax = axis_index(axis, x.ndim) if x.ndim else axis_index(axis, 1)
        fn = _partial(_sort, descending, stable, ax, True)
        return self._push1(fn, (x,), x._shape, np.dtype(np.int64), self._check_same([x]), "argsort")

    def sort(
        self, x: Array, /, *, axis: int = -1, descending: bool = False, stable: bool = True
    ) -> Array:
        """``x`` sorted along ``axis``."""
        ax = axis_index(axis, x.ndim) if x.ndim else axis_index(axis, 1)
        fn = _partial(_sort, descending, stable, ax, False)
        return self._push1(fn, (x,), x._shape, x._dtype, self._check_same([x]), "sort")

    def _unique(
        self, x: Array, kind: str, outs: tuple[tuple[Shape, np.dtype[Any]], ...]
    ) -> tuple[Array, ...]:
        device = self._check_same([x])
        return self._push(
            _partial(_unique, kind), (x,), outs, device, f"unique_{kind}", _meta.prod(x._shape)
        )

    def unique_values(self, x: Array, /) -> Array:
        """The unique elements of ``x`` (their number depends on the data)."""
        return self._unique(x, "values", (((None,), x._dtype),))[0]

    def unique_counts(self, x: Array, /) -> UniqueCountsResult:
        """The unique elements of ``x`` and how often each occurs."""
        i64 = np.dtype(np.int64)
        return UniqueCountsResult(*self._unique(x, "counts", (((None,), x._dtype), ((None,), i64))))

    def unique_inverse(self, x: Array, /) -> UniqueInverseResult:
        """The unique elements of ``x`` and, for each element of ``x``, its index among them."""
        i64 = np.dtype(np.int64)
        return UniqueInverseResult(
            *self._unique(x, "inverse", (((None,), x._dtype), (x._shape, i64)))
        )

    def unique_all(self, x: Array, /) -> UniqueAllResult:
        """The unique elements, their first indices, the inverse indices and the counts."""
        i64 = np.dtype(np.int64)
        outs = (((None,), x._dtype), ((None,), i64), (x._shape, i64), ((None,), i64))
        return UniqueAllResult(*self._unique(x, "all", outs))

    # -- statistics and reductions ----------------------------------------------------------

    def _reduce(
        self,
        fn: Callable[..., Any],
        name: str,
        x: Array,
        axis: Any,
        keepdims: bool,
        *,
        single_axis: bool = False,
        **kw: Any,
    ) -> Array:
        if not isinstance(x, Array):
            raise TypeError(f"{name}() needs an array, got {type(x).__name__}")
        device = self._check_same([x])
        if single_axis and axis is not None:
            axis = axis_index(axis, x.ndim)
        elif isinstance(axis, list):
            axis = tuple(axis)
        kwargs = dict(kw, axis=axis, keepdims=keepdims)
        shape = reduced(x._shape, axis, keepdims)
        dtype = _meta.sample_dtype(fn, [(x._dtype, (1,) * x.ndim)], **kwargs)
        return self._push1(
            _partial(_call, fn, kwargs), (x,), shape, dtype, device, name, cost=_meta.prod(x._shape)
        )

    def sum(
        self, x: Array, /, *, axis: Any = None, dtype: Any = None, keepdims: bool = False
    ) -> Array:
        """The sum along ``axis`` (all axes if None)."""
        return self._reduce(
            np.sum, "sum", x, axis, keepdims, dtype=None if dtype is None else as_dtype(dtype)
        )

    def prod(
        self, x: Array, /, *, axis: Any = None, dtype: Any = None, keepdims: bool = False
    ) -> Array:
        """The product along ``axis``."""
        return self._reduce(
            np.prod, "prod", x, axis, keepdims, dtype=None if dtype is None else as_dtype(dtype)
        )

    def mean(self, x: Array, /, *, axis: Any = None, keepdims: bool = False) -> Array:
        """The arithmetic mean along ``axis``."""
        return self._reduce(np.mean, "mean", x, axis, keepdims)

    def var(
        self,
        x: Array,
        /,
        *,
        axis: Any = None,
        correction: int | float = 0.0,
        keepdims: bool = False,
    ) -> Array:
        """The variance along ``axis`` (``correction``: degrees of freedom subtracted)."""
        return self._reduce(np.var, "var", x, axis, keepdims, correction=correction)

    def std(
        self,
        x: Array,
        /,
        *,
        axis: Any = None,
        correction: int | float = 0.0,
        keepdims: bool = False,
    ) -> Array:
        """The standard deviation along ``axis``."""
        return self._reduce(np.std, "std", x, axis, keepdims, correction=correction)

    def max(self, x: Array, /, *, axis: Any = None, keepdims: bool = False) -> Array:
        """The maximum along ``axis``."""
        return self._reduce(np.max, "max", x, axis, keepdims)

    def min(self, x: Array, /, *, axis: Any = None, keepdims: bool = False) -> Array:
        """The minimum along ``axis``."""
        return self._reduce(np.min, "min", x, axis, keepdims)

    def all(self, x: Array, /, *, axis: Any = None, keepdims: bool = False) -> Array:
        """Whether every element along ``axis`` is true."""
        return self._reduce(np.all, "all", x, axis, keepdims)

    def any(self, x: Array, /, *, axis: Any = None, keepdims: bool = False) -> Array:
        """Whether any element along ``axis`` is true."""
        return self._reduce(np.any, "any", x, axis, keepdims)

    def _cumulative(
        self,
        fn: Callable[..., Any],
        name: str,
        x: Array,
        axis: int | None,
        dtype: Any,
        include_initial: bool,
    ) -> Array:
        device = self._check_same([x])
        if axis is None:
            if x.ndim > 1:
                raise ValueError(
                    f"{name}: axis is required for an array of more than one dimension"
                )
            axis = 0
        if x.ndim == 0:
            raise ValueError(f"{name} of a 0-d array")
        ax = axis_index(axis, x.ndim)
        kwargs = {
            "axis": ax,
            "dtype": None if dtype is None else as_dtype(dtype),
            "include_initial": include_initial,
        }
        out_dtype = _meta.sample_dtype(fn, [(x._dtype, (1,) * x.ndim)], **kwargs)
        shape = list(x._shape)
        if include_initial and shape[ax] is not None:
            shape[ax] += 1  # type: ignore[operator]
        return self._push1(_partial(_call, fn, kwargs), (x,), tuple(shape), out_dtype, device, name)

    def cumulative_sum(
        self,
        x: Array,
        /,
        *,
        axis: int | None = None,
        dtype: Any = None,
        include_initial: bool = False,
    ) -> Array:
        """The cumulative sum along ``axis``."""
        return self._cumulative(
            np.cumulative_sum, "cumulative_sum", x, axis, dtype, include_initial
        )

    def cumulative_prod(
        self,
        x: Array,
        /,
        *,
        axis: int | None = None,
        dtype: Any = None,
        include_initial: bool = False,
    ) -> Array:
        """The cumulative product along ``axis``."""
        return self._cumulative(
            np.cumulative_prod, "cumulative_prod", x, axis, dtype, include_initial
        )

    def diff(
        self,
        x: Array,
        /,
        *,
        axis: int = -1,
        n: int = 1,
        prepend: Array | None = None,
        append: Array | None = None,
    ) -> Array:
        """The ``n``-th discrete difference along ``axis``."""
        extra = [a for a in (prepend, append) if a is not None]
        device = self._check_same([x, *extra])
        if x.ndim == 0:
            raise ValueError("diff needs an array of at least one dimension")
        ax = axis_index(axis, x.ndim)
        n = operator.index(n)
        if n < 0:
            raise ValueError(f"diff: order n must be non-negative, got {n}")
        dtype = self.result_type(x, *extra) if extra else x._dtype
        length = x._shape[ax]
        for a in extra:
            if a.ndim != x.ndim:
                raise ValueError("diff: prepend and append must have the dimensions of x")
            length = None if length is None or a._shape[ax] is None else length + a._shape[ax]  # type: ignore[operator]
        shape = list(x._shape)
        shape[ax] = None if length is None else max(length - n, 0)
        fn = _partial(_diff, ax, n, prepend is not None, append is not None)
        return self._push1(fn, (x, *extra), tuple(shape), dtype, device, "diff")

    # -- linear algebra (main namespace) ----------------------------------------------------

    def matmul(self, x1: Any, x2: Any, /) -> Array:
        """The matrix product (NumPy's ``matmul`` rules for 1-D and stacked operands)."""
        if isinstance(x1, np.ndarray):
            x1 = self.asarray(x1)
        if isinstance(x2, np.ndarray):
            x2 = self.asarray(x2)
        if not isinstance(x1, Array) or not isinstance(x2, Array):
            raise TypeError("matmul needs two arrays (Python scalars are not allowed)")
        device = self._check_same([x1, x2])
        shape = _meta.matmul_shape(x1._shape, x2._shape)
        dtype = _meta.sample_dtype(
            np.matmul, [(x1._dtype, (1,) * x1.ndim), (x2._dtype, (1,) * x2.ndim)]
        )
        k = x1._shape[-1] or 1
        return self._push1(
            np.matmul, (x1, x2), shape, dtype, device, "matmul", cost=_meta.prod(shape) * k
        )

    def tensordot(
        self, x1: Array, x2: Array, /, *, axes: int | tuple[Sequence[int], Sequence[int]] = 2
    ) -> Array:
        """The sum of products over ``axes`` (the last ``axes`` of x1 and first of x2)."""
        device = self._check_same([x1, x2])
        s1, s2 = self._concrete(x1, "tensordot"), self._concrete(x2, "tensordot")
        if isinstance(axes, int):
            if axes < 0 or axes > min(len(s1), len(s2)):
                raise ValueError(f"tensordot: axes={axes} is out of range for shapes {s1} and {s2}")
            a1, a2 = list(range(len(s1) - axes, len(s1))), list(range(axes))
        else:
            a1 = [axis_index(a, len(s1)) for a in axes[0]]
            a2 = [axis_index(a, len(s2)) for a in axes[1]]
            if len(a1) != len(a2):
                raise ValueError("tensordot: the two sequences of axes differ in length")
        for i, j in zip(a1, a2, strict=True):
            if s1[i] != s2[j]:
                raise ValueError(f"tensordot: shape mismatch on axes {i} and {j}: {s1} and {s2}")
        shape = tuple(d for i, d in enumerate(s1) if i not in a1) + tuple(
            d for j, d in enumerate(s2) if j not in a2
        )
        dtype = np.result_type(x1._dtype, x2._dtype)
        return self._push1(
            _partial(_call, np.tensordot, {"axes": axes}),
            (x1, x2),
            shape,
            dtype,
            device,
            "tensordot",
            cost=math.prod(s1) * max(math.prod(s2), 1),
        )

    def vecdot(self, x1: Array, x2: Array, /, *, axis: int = -1) -> Array:
        """The dot product of vectors along ``axis`` (complex x1 conjugated)."""
        device = self._check_same([x1, x2])
        if x1.ndim == 0 or x2.ndim == 0:
            raise ValueError("vecdot needs arrays of at least one dimension")
        full = broadcast(x1._shape, x2._shape)
        ax = axis_index(axis, len(full))
        n1, n2 = x1._shape[ax - len(full) + x1.ndim], x2._shape[ax - len(full) + x2.ndim]
        if n1 is not None and n2 is not None and n1 != n2:
            raise ValueError(f"vecdot: the sizes along axis {axis} differ: {n1} and {n2}")
        shape = tuple(d for i, d in enumerate(full) if i != ax)
        dtype = np.result_type(x1._dtype, x2._dtype)
        return self._push1(
            _partial(_call, np.vecdot, {"axis": axis}),
            (x1, x2),
            shape,
            dtype,
            device,
            "vecdot",
            cost=_meta.prod(full),
        )

    # -- extensions of aioengine ----------------------------------------------------------

    def apply(self, fn: Callable[..., Any], /, *args: Any, shape: Any, dtype: Any) -> Array:
        """Run ``fn(*values)`` on the CPU pool as one operation reading the array arguments
        (other arguments are passed as they are) and return an array of ``shape`` and
        ``dtype``. ``fn`` must return a NumPy array of exactly that shape and dtype: anything
        else is the result's failure, not a silent cast. An aioengine extension."""
        if not callable(fn):
            raise TypeError(f"apply: fn must be callable, got {fn!r}")
        shape = self._shape_arg(shape)
        dtype = as_dtype(dtype)
        operands = tuple(a if isinstance(a, Array) else Const(a) for a in args)
        arrays = [a for a in operands if isinstance(a, Array)]
        device = self._check_same(arrays)
        if device.device_type is not _CPU:
            raise ValueError(
                f"apply runs on the CPU pool: move GPU arrays with to_device (got {device})"
            )
        name = getattr(fn, "__name__", "apply")
        return self._push1(
            _partial(_apply_checked, fn, shape, dtype),
            operands,
            shape,
            dtype,
            device,
            f"apply({name})",
            prop=_NORMAL,
        )

    def _same_shape(
        self, fn: Callable[..., Any], name: str, x: Array, *, min_ndim: int = 0, **kw: Any
    ) -> Array:
        if not isinstance(x, Array):
            raise TypeError(f"{name}() needs an array, got {type(x).__name__}")
        if x.ndim < min_ndim:
            raise ValueError(f"{name} needs an array of at least {min_ndim} dimensions")
        device = self._check_same([x])
        return self._push1(_partial(_call, fn, kw), (x,), x._shape, x._dtype, device, name)

    def _to_device(self, x: Array, device: Context) -> Array:
        if type(device) is not Context:
            raise ValueError(
                f"device must be an aioengine Context (ae.cpu(i) or ae.gpu(i)), got {device!r}"
            )
        if device == x._device:
            return x
        src_gpu = x._device.device_type is not _CPU
        dst_gpu = device.device_type is not _CPU
        if dst_gpu and not src_gpu:
            xp = self._xp(device)
            fn: Callable[..., Any] = _partial(_upload, xp)
            return self._push1(
                fn, (x,), x._shape, x._dtype, device, "to_device", prop=FnProperty.COPY_TO_GPU
            )
        if src_gpu and not dst_gpu:
            # On the GPU's copy stream; the CPU array's first reader waits for its fence.
            return self._push1(
                _download,
                (x,),
                x._shape,
                x._dtype,
                device,
                "to_device",
                prop=FnProperty.COPY_FROM_GPU,
                run_on=x._device,
            )
        if src_gpu and dst_gpu:
            return self._push1(_copy, (x,), x._shape, x._dtype, device, "to_device")
        return self._push1(_copy, (x,), x._shape, x._dtype, device, "to_device")

    # -- NumPy's protocols ------------------------------------------------------------------

    def _array_ufunc(
        self, ufunc: np.ufunc, method: str, inputs: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        from ._interop import array_ufunc

        return array_ufunc(self, ufunc, method, inputs, kwargs)

    def _array_function(
        self, func: Callable[..., Any], types: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        from ._interop import array_function

        return array_function(self, func, types, args, kwargs)


# -- kernels of the functions above ---------------------------------------------------------


def _clip(names: tuple[str, ...], x: Any, *bounds: Any) -> Any:
    return np.clip(x, **dict(zip(names, bounds, strict=True)))


def _meshgrid(indexing: str, dtype: np.dtype[Any], *values: Any) -> Any:
    grids: Any = np.meshgrid(*values, indexing=indexing)  # type: ignore[call-overload]
    return tuple(np.ascontiguousarray(v, dtype=dtype) for v in grids)


def _reshape_copy(shape: tuple[int, ...], value: Any) -> Any:
    return np.reshape(value, shape).copy()


def _concat(axis: int | None, dtype: np.dtype[Any], *values: Any) -> Any:
    return np.concatenate(values, axis=axis, dtype=dtype)


def _stack(axis: int, dtype: np.dtype[Any], *values: Any) -> Any:
    return np.stack(values, axis=axis, dtype=dtype)


def _searchsorted(side: str, x1: Any, x2: Any, sorter: Any = None) -> Any:
    return np.searchsorted(x1, x2, side=side, sorter=sorter)  # type: ignore[call-overload]


def _diff(axis: int, n: int, has_prepend: bool, has_append: bool, x: Any, *extra: Any) -> Any:
    kwargs: dict[str, Any] = {}
    rest = list(extra)
    if has_prepend:
        kwargs["prepend"] = rest.pop(0)
    if has_append:
        kwargs["append"] = rest.pop(0)
    return np.diff(x, n=n, axis=axis, **kwargs)


def _upload(xp: Any, value: Any) -> Any:
    return xp.array(value, copy=True)


def _download(value: Any) -> Any:
    get = getattr(value, "get", None)
    return (
        get()
        if get is not None and not isinstance(value, np.ndarray)
        else np.array(value, copy=True)
    )


def _normalize_axes(axis: Any, ndim: int) -> tuple[int, ...]:
    if isinstance(axis, int | np.integer):
        axis = (axis,)
    return tuple(axis_index(a, ndim) for a in axis)


def _make_elementwise(name: str, arity: int) -> Callable[..., Array]:
    fn = getattr(np, name)

    if arity == 1:

        def unary(self: Namespace, x: Array, /) -> Array:
            if not isinstance(x, Array):
                raise TypeError(f"{name}() needs an array, got {type(x).__name__}")
            return self._elementwise(fn, name, (x,))

        func: Callable[..., Array] = unary
    else:

        def binary(self: Namespace, x1: Any, x2: Any, /) -> Array:
            return self._binop(fn, name, x1, x2)

        func = binary
    func.__name__ = func.__qualname__ = name
    func.__doc__ = f"Elementwise ``{name}`` (NumPy's ``{name}``), a push."
    return func


for _name, _arity in ELEMENTWISE.items():
    setattr(Namespace, _name, _make_elementwise(_name, _arity))
