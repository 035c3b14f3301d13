"""How a namespace call becomes a push: the machinery every function of the namespace uses.

Each function computes its result's metadata on the caller's thread (``_meta.py``), then pushes
one operation (``_kernel.run``) that reads its input Buffers' Vars and writes a new Buffer's Var
(or, in place, the target's), and returns the result :class:`~aioengine.array.Array` at once.
:class:`Pusher` holds the engine the namespace is bound to and does the push; the functions of
the standard are its subclasses' (``_creation.py``, ``_manipulation.py``, ...), gathered by
:class:`~aioengine.array.Namespace`.

Where an operation runs (written once, here): on its arrays' device; on a CPU, an operation
whose estimated cost (elements touched) is at most :data:`INLINE_COST` runs inline on the event
loop (``FnProperty.ASYNC``: a thread hop costs more than such work), a larger one on the
device's thread pool.

Fusion (MXNet's lesson that tiny operations want aggregating at the array level, not engine
bulks): on the loop thread, a binary elementwise operation that runs inline and reads the result
of the operation pushed just before it (still pending, not started) joins that operation
instead of making its own push, as long as it reads nothing that operation does not read
already; its Buffer then shares that operation's Var. So ``c = c + b`` repeated 20,000 times
costs about 320 pushes, and the rule still holds: every input of a fused step is one its
operation holds a turn on, no other push came in between (any other push ends the segment
before it is made), and no Var involved was handed out (raw pushes cannot have come in
between either). At most :data:`FUSE_MAX` operations join one; a segment also ends when its
operation starts (at the loop's next turn).

State (per namespace): ``_engine`` (and ``_blocking`` for a BlockingEngine), and ``_loop``, the
engine's loop once known (set once, read from any thread); ``_segment`` and ``_segment_reads``,
the operation later ones may fuse into.
"""

from __future__ import annotations

import asyncio
import functools
import operator
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

import numpy as np

from .. import BlockingEngine, Context, DeviceType, Engine, FnProperty, Operation, cpu
from . import _meta
from ._array import Array
from ._buffer import Buffer, Shared
from ._kernel import MISSING, Const, Kernel
from ._meta import Shape, axis_index, broadcast, layout, reduced
from ._sync import PendingArrayError, on_loop_thread

__all__ = ("FUSE_MAX", "INLINE_COST", "Pusher")

T = TypeVar("T")

#: The largest operation (elements touched) run inline on the loop rather than on a pool
#: thread, chosen by measurement (``benchmarks/array_threshold.py``, 2 cores, pool time over
#: inline time): a chain of additions 1.9-2.2x and four independent chains 1.1-1.5x up to
#: 16 Ki float64 elements, both about even from 64 Ki to 256 Ki (where an inline operation
#: would hold the loop for 30-200 µs), the pool ahead from 1 Mi (0.67x on independent chains).
INLINE_COST = 16384

#: The most operations fused into one (the first included: one more than this).
FUSE_MAX = 63

_CPU = DeviceType.CPU
_CPU0 = cpu()
_ASYNC = FnProperty.ASYNC
_NORMAL = FnProperty.NORMAL
_SCALARS = (bool, int, float, complex)
_partial = functools.partial
# Result dtypes of the hot path (_fast): function -> dtype -> dtype or scalar type -> dtype
# (nested: three cheap lookups cost less than hashing one tuple of them).
_DTYPES: dict[Any, dict[np.dtype[Any], dict[Any, np.dtype[Any]]]] = {}


def _call(fn: Callable[..., Any], kwargs: dict[str, Any], *values: Any) -> Any:
    return fn(*values, **kwargs)


def _inplace_ufunc(ufunc: Callable[..., Any], target: Any, other: Any) -> None:
    ufunc(target, other, out=target)


def _inplace_matmul(target: Any, other: Any) -> None:
    target[...] = np.matmul(target, other)


def _nothing(rctx: object) -> None:
    """Pushed once by a BlockingEngine's namespace, to learn the engine's loop."""


def _copy(value: Any) -> Any:
    return value.copy()


class Pusher:
    """The engine a namespace is bound to, and how its functions push operations."""

    # Functions of the namespace that the machinery calls (defined by the mixins).
    asarray: Callable[..., Array]
    astype: Callable[..., Array]
    result_type: Callable[..., np.dtype[Any]]

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
        #: Fusion: the Buffer whose pending operation later ones may join, and the Vars it
        #: reads (only the loop thread sets them; any other push clears them first).
        self._segment: Buffer | None = None
        self._segment_reads: tuple[Any, ...] = ()

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
        self._segment = None  # before the push: no later operation fuses across it
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

    def _binop(self, fn: Callable[..., Any], name: str, a: Any, b: Any) -> Array:
        """A binary elementwise function (the operators' path): the hot path (``c = c + b``)
        for two arrays of this namespace on one device, or an array and a Python float or
        complex; :meth:`_elementwise` for everything else."""
        if type(a) is Array and a._ns is self:
            if type(b) is Array:
                if b._ns is self and (b._device is a._device or b._device == a._device):
                    return self._fast(fn, name, a, b, b._shape, b._dtype, b._dtype)
            elif type(b) in _SCALARS and type(b) is not int:
                return self._fast(fn, name, a, Const(b), (), b, type(b))
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

    def _fast(
        self,
        fn: Callable[..., Any],
        name: str,
        a: Array,
        b: Any,
        bshape: Shape,
        bsample: Any,
        bkey: Any,
    ) -> Array:
        """:meth:`_elementwise` of ``a`` and ``b`` (an array of this namespace on ``a``'s
        device, or a Const of a Python float, complex or bool: ``bsample`` is its dtype or its
        value, ``bkey`` its dtype or type): the same metadata and push, with fewer steps."""
        ashape = a._shape
        shape = ashape if ashape == bshape or not bshape else broadcast(ashape, bshape)
        adtype = a._dtype
        try:
            dtype = _DTYPES[fn][adtype][bkey]
        except KeyError:
            dtype = _meta.sample_dtype(fn, [adtype, bsample])
            _DTYPES.setdefault(fn, {}).setdefault(adtype, {})[bkey] = dtype
        engine = self._engine
        abuf = a._buf
        bbuf = b._buf
        size = 1
        for d in shape:
            size *= d or 1
        device = a._device
        inline = size <= INLINE_COST and device.device_type is _CPU
        head = self._segment
        if head is not None and inline and head.fn is not None:
            fused = self._fuse(head, fn, name, a, b, abuf, bbuf, shape, dtype)
            if fused is not None:
                return fused
        self._segment = None  # before the push: no later operation fuses across it
        buf = Buffer(engine, engine.new_var(name), shape, dtype, MISSING, fn, None, name, a, b)
        out = Array(self, buf, shape, dtype, device)
        reads = (abuf.var,) if bbuf is None or bbuf is abuf else (abuf.var, bbuf.var)
        if self._blocking is None:
            op: Operation[Any] = engine.push_sync(
                buf, device, reads, (buf.var,), prop=_ASYNC if inline else _NORMAL, name=name
            )
            buf.writer = op
            if self._loop is None:
                self._bind(op)
            elif inline and asyncio._get_running_loop() is self._loop:
                # On the loop thread, where it will run: later operations may fuse into it.
                self._segment = buf
                self._segment_reads = reads
            if engine.max_pending is not None:
                self._backpressure()
            return out
        prop = _ASYNC if inline else _NORMAL
        buf.writer = self._submit(buf, device, reads, (buf.var,), prop, name, None)
        return out

    def _fuse(
        self,
        head: Buffer,
        fn: Callable[..., Any],
        name: str,
        a: Array,
        b: Any,
        abuf: Buffer,
        bbuf: Buffer | None,
        shape: Shape,
        dtype: np.dtype[Any],
    ) -> Array | None:
        """Fuse ``fn(a, b)`` into the pending operation that makes ``head`` (see the module
        docstring), or return None if it may not be."""
        if asyncio._get_running_loop() is not self._loop or head.handed_out():
            return None
        more = head.more
        if more is not None and len(more) >= FUSE_MAX:
            return None
        var = head.var
        reads = self._segment_reads
        fused = False
        for x in (abuf, bbuf):
            if x is None:
                continue
            if x.var is var:
                fused = True
            elif x.var not in reads or x.handed_out():
                return None
        if not fused:
            return None
        share = head.share
        if share is None:
            share = head.share = Shared()
        buf = Buffer(self._engine, var, shape, dtype, MISSING, fn, None, name, a, b)
        buf.share = share
        buf.writer = head.writer
        if more is None:
            head.more = [buf]
        else:
            more.append(buf)
        return Array(self, buf, shape, dtype, a._device)

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

    def _same_shape(
        self, fn: Callable[..., Any], name: str, x: Array, *, min_ndim: int = 0, **kw: Any
    ) -> Array:
        if not isinstance(x, Array):
            raise TypeError(f"{name}() needs an array, got {type(x).__name__}")
        if x.ndim < min_ndim:
            raise ValueError(f"{name} needs an array of at least {min_ndim} dimensions")
        device = self._check_same([x])
        return self._push1(_partial(_call, fn, kw), (x,), x._shape, x._dtype, device, name)
