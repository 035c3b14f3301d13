"""How a namespace call becomes a push: the machinery every function of the namespace uses.

Each function computes its result's metadata on the caller's thread (``_meta.py``), then pushes
one operation (``_kernel.run``) that reads its input Buffers' Vars and writes a new Buffer's Var
(or, in place, the target's; of a chunked Buffer, the Vars of the chunks an array touches:
``_buffer.py``), and returns the result :class:`~aioengine.array.Array` at once.
:class:`Pusher` holds the engine the namespace is bound to and does the push; the functions of
the standard are its subclasses' (``_creation.py``, ``_manipulation.py``, ...), gathered by
:class:`~aioengine.array.Namespace`.

Where an operation runs (written once, here): on its arrays' device; on a CPU, an operation
whose estimated cost (elements touched) is at most :data:`INLINE_COST` runs inline on the event
loop (``FnProperty.ASYNC``: a thread hop costs more than such work), a larger one on the
device's thread pool. A data-dependent dimension counts as learnt once its value is ready, and
as large (more than :data:`INLINE_COST`) until then (:func:`size_of`); an in-place write into an
exported Buffer counts the copy it makes first. On a GPU, every operation runs on the device's
stream workers (``_kernel.py`` says how its work is enqueued), and an elementwise one of more
than :data:`INLINE_COST` elements joins a fused chain (``_chain.py``) as on the CPU.

Off the loop (``aioengine.array_api``, any synchronous caller), an operation of default
placement (no ``prop`` or ``run_on`` asked for: elementwise functions, the hot path's
included, reductions, indexing, manipulation, ``linalg`` on small matrices, ...) of at most
:data:`INLINE_COST` elements on the CPU whose array arguments are *settled* (computed and
healthy, no write on them pending, their Var never handed out: ``_chain.settled``) is
computed at once on the caller's thread instead of pushed; so is an
in-place write into a target nothing at all is pending on (:func:`idle`). Pushed, such an
operation could only have run at once, and a push from off the loop costs two thread hand-offs
that such work does not pay for (the ten-step chain on 1,000 elements: 3.4x the async
namespace's time pushed, 1.0x computed here). Only while one thread uses the namespace's
arrays (``Bound._user``): the engine does not order such a computation against other threads'
pushes and reads, so once a second thread pushes, waits for or reads one, every operation is a
push again. Nothing observable changes but the engine's records: no operation is pushed for it
(instruments and traces do not show it); it reads nothing a later write could change first and
writes nothing an earlier operation still reads; and a failure is recorded by an operation on
its results' (and target's) Vars that raises it (:meth:`Pusher._record`), so that dependents,
``await``, sync points and ``wait_for_all()`` see it as a pushed operation's, never the call.

Fusion (MXNet's lesson that tiny operations want aggregating at the array level, not engine
bulks): on the loop thread, a unary or binary elementwise operation that runs inline and reads
the result of the operation pushed just before it (still pending, not started) joins that
operation instead of making its own push, as long as its other operand is one that operation
reads already, or an array whose value is computed with no write pending (read without a turn,
as a chunk kernel does: ``Buffer.readers`` makes a later write wait for the read). Its Buffer
then shares that operation's Var. So ``c = c + b`` repeated 20,000 times costs about 320
pushes, the ten-step chain ``c = a * 1.5 + b; ...; xp.exp(-c * c) + c`` three, and the rule
still holds: every input of a fused step is one its operation holds a turn on or one no write
can reach before the step has read it, no other push came in between (any other push ends the
segment before it is made), and no Var involved was handed out (raw pushes cannot have come in
between either). A step that reads no result of the group (``a * 0.5``) does not join: the
group's first failure is every step's. At most :data:`FUSE_MAX` operations join one; a segment
also ends when its operation starts (at the loop's next turn). A full one is computed at once
if its turn has come (``Operation.run_here``, on the loop's thread where it runs anyway), so a
loop of small operations that never yields holds one group pending, not all it pushed.

State (per namespace): the engine binding of :class:`~aioengine.array._array.Bound` (``_engine``,
``_blocking`` for a BlockingEngine, ``_loop``, the engine's loop once known); ``_segment`` and
``_segment_reads``, the operation later ones may fuse into.

The functions the other modules of the package push with (:func:`push`, :func:`push1`,
:func:`check_same`, :func:`operand`, :func:`elementwise`, :func:`reduction`, :func:`same_shape`,
:func:`create`) are module functions taking the namespace, not methods: the namespace's
methods are the Array API standard's, which users see.
"""

from __future__ import annotations

import functools
import math
import operator
import os
from collections.abc import Callable, Sequence
from threading import get_ident
from typing import Any

import numpy as np

from .. import BlockingEngine, Context, DeviceType, Engine, FnProperty, Operation, cpu
from . import _meta
from ._array import (
    SCALARS,
    Array,
    Bound,
    buffer_of,
    check_writable,
    chunks_of,
    engine_of,
    is_view,
    known_shape,
    learnt_shape,
    namespace_of,
    unpack,
    vars_of,
)
from ._blas import blas_call
from ._buffer import Buffer, Group
from ._burst import Burst
from ._chain import (
    CHUNK_BYTES,
    Program,
    chunking,
    join_or_push,
    quiescent,
    reduce_chunks,
    settled,
)
from ._kernel import MISSING, Const, Kernel, numpy_on_gpu, reraise, run_now
from ._meta import Shape, axis_index, broadcast, normalize_axes, reduced
from ._reducers import REDUCERS, ROW_REDUCERS
from ._special import elementwise_function
from ._sync import in_operation, running_loop

__all__ = (
    "CPU",
    "CPU0",
    "FUSE_MAX",
    "INLINE_COST",
    "MIN_ROW",
    "NORMAL",
    "Pusher",
    "blas",
    "call_with",
    "check_same",
    "chunk_bytes_setting",
    "copy_value",
    "create",
    "elementwise",
    "operand",
    "push",
    "push1",
    "reduction",
    "same_shape",
    "size_of",
)

#: The largest operation (elements touched) run inline on the loop rather than on a pool
#: thread, chosen by measurement (``benchmarks/array_threshold.py``, 2 cores, pool time over
#: inline time): a chain of additions 1.9-2.2x and four independent chains 1.1-1.5x up to
#: 16 Ki float64 elements, both about even from 64 Ki to 256 Ki (where an inline operation
#: would hold the loop for 30-200 µs), the pool ahead from 1 Mi (0.67x on independent chains).
INLINE_COST = 16384

#: The fewest elements in a row of a chunked result for a broadcast operand of more than one
#: element, or a reduction along the first axis, to join its chain (then computed on the rows
#: of each block): NumPy loops over shorter rows one inner loop each, so that on (50,000, 8) a
#: chain with a (50,000, 1) and an (8,) operand ran 10-30% slower in chunks than as operations
#: of their own; on rows of 128, 1.2-1.5x faster.
MIN_ROW = 64

#: The most operations fused into one (the first included: one more than this).
FUSE_MAX = 63

#: The CPU device type, and the default device.
CPU = DeviceType.CPU
CPU0 = cpu()
_ASYNC = FnProperty.ASYNC
NORMAL = FnProperty.NORMAL
_partial = functools.partial
# Result dtypes of the hot path (_fast): function -> dtype -> dtype or scalar type -> dtype
# (nested: three cheap lookups cost less than hashing one tuple of them).
_DTYPES: dict[Any, dict[np.dtype[Any], dict[Any, np.dtype[Any]]]] = {}


def chunk_bytes_setting(chunk_bytes: int | None) -> int:
    """The chunk size of a namespace: ``chunk_bytes`` if given, else the
    ``AIOENGINE_ARRAY_CHUNK_BYTES`` environment variable, else :data:`CHUNK_BYTES`.

    Raises:
        ValueError: if it is not a positive integer.
    """
    source = "chunk_bytes"
    if chunk_bytes is None:
        text = os.environ.get("AIOENGINE_ARRAY_CHUNK_BYTES")
        if text is None or not text.strip():
            return CHUNK_BYTES
        source = "AIOENGINE_ARRAY_CHUNK_BYTES"
        try:
            chunk_bytes = int(text)
        except ValueError:
            raise ValueError(f"{source} must be a positive integer, got {text!r}") from None
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 8:
        raise ValueError(f"{source} must be an integer of at least 8 (bytes), got {chunk_bytes!r}")
    return chunk_bytes


def blas(fn: Callable[..., Any], cost: int, device: Context) -> Callable[..., Any]:
    """``fn``, a BLAS-class function (a matrix product, a factorisation), as an operation
    pushes it: counted while it runs on a CPU pool thread (``_blas.py``: BLAS runs on one
    thread while several such operations run at once); as it is when it runs inline or on a
    GPU."""
    if cost <= INLINE_COST or device.device_type is not CPU:
        return fn
    return blas_call(fn)


def call_with(fn: Callable[..., Any], kwargs: dict[str, Any], *values: Any) -> Any:
    """``fn(*values, **kwargs)``: the function pushed, with ``functools.partial``, for a NumPy
    function that takes keywords."""
    return fn(*values, **kwargs)


def _inplace_ufunc(ufunc: Callable[..., Any], target: Any, other: Any) -> None:
    ufunc(target, other, out=target)


def _inplace_matmul(target: Any, other: Any) -> None:
    target[...] = np.matmul(target, other)


def copy_value(value: Any) -> Any:
    """A copy of an array's value (the function of a copy operation)."""
    return value.copy()


def _creation(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return fn(*args, **kwargs)


class Pusher(Bound):
    """The engine a namespace is bound to (:class:`~aioengine.array._array.Bound`), and how
    its functions push operations."""

    # The namespace's functions that the modules below it call, declared here and defined
    # by the mixins and Namespace above: one mixin calls another's; ``linalg`` the main
    # namespace's; an Array those of ``_array.ArrayNamespace``, which a Pusher is (mypy
    # checks it wherever a mixin makes an Array of itself).
    asarray: Callable[..., Array]
    astype: Callable[..., Array]
    result_type: Callable[..., np.dtype[Any]]
    reshape: Callable[..., Array]
    permute_dims: Callable[..., Array]
    matrix_transpose: Callable[..., Array]
    matmul: Callable[..., Array]
    tensordot: Callable[..., Array]
    vecdot: Callable[..., Array]
    _getitem: Callable[..., Array]
    _setitem: Callable[..., None]
    _to_device: Callable[..., Any]
    _array_ufunc: Callable[..., Any]
    _array_function: Callable[..., Any]
    # The chunk size of remote arrays (Namespace's, documented there; ``_remote.py`` reads it).
    remote_chunk_bytes: int

    def __init__(self, engine: Engine | BlockingEngine, chunk_bytes: int = CHUNK_BYTES) -> None:
        super().__init__(engine)
        #: Fusion: the Buffer whose pending operation later ones may join, and the Vars it
        #: reads (only the loop thread sets them; any other push clears them first).
        self._segment: Buffer | None = None
        self._segment_reads: tuple[Any, ...] = ()
        #: Chunks: the elements of one chunk (``_chain.py``), and the program of the latest
        #: chunked result (later operations may join it; any thread may replace it).
        self._chunk_elems = max(1, chunk_bytes // 8)
        #: The chunk size of this namespace's large arrays, in bytes of float64 (an aioengine
        #: extension: ``namespace(engine, chunk_bytes=...)``).
        self.chunk_bytes = self._chunk_elems * 8
        self._recent: Program | None = None
        #: The chunk kernels pushed on the loop's thread since the loop last iterated.
        self._burst = Burst()

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

    def _from_value(self, value: Any, device: Context = CPU0) -> Array:
        """An array whose value is already computed (no operation)."""
        shape = tuple(value.shape)
        buf = Buffer(self._engine, self._engine.new_var("array"), shape, value.dtype, value)
        return Array(self, buf, shape, value.dtype, device)

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
        if not in_operation():
            self._claim()
        blocking = self._blocking
        if blocking is not None and running_loop() not in (None, self._loop):
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
        if loop is not None and running_loop() is None:
            self._wait(engine.wait_for_capacity())

    def _xp(self, device: Context) -> Any:
        """The array module of ``device``: NumPy on a CPU and on the simulated GPU, CuPy on a
        real one."""
        if device.device_type is CPU or numpy_on_gpu(self._engine):
            return np
        import cupy

        return cupy

    def _binop(self, fn: Callable[..., Any], name: str, a: Any, b: Any) -> Array:
        """A binary elementwise function (the operators' path): the hot path (``c = c + b``)
        for two arrays of this namespace on one device, or an array and a Python float or
        complex; :func:`elementwise` for everything else."""
        if type(a) is Array:
            ans, abuf, ashape, adtype, adevice = unpack(a)
            if ans is self:
                if type(b) is Array:
                    bns, bbuf, bshape, bdtype, bdevice = unpack(b)
                    if bns is self and (bdevice is adevice or bdevice == adevice):
                        return self._fast(
                            fn,
                            name,
                            a,
                            abuf,
                            ashape,
                            adtype,
                            adevice,
                            b,
                            bbuf,
                            bshape,
                            bdtype,
                            bdtype,
                        )
                elif type(b) in SCALARS and type(b) is not int:
                    return self._fast(
                        fn, name, a, abuf, ashape, adtype, adevice, Const(b), None, (), b, type(b)
                    )
        return elementwise(self, fn, name, (a, b))

    def _fast(
        self,
        fn: Callable[..., Any],
        name: str,
        a: Array,
        abuf: Buffer,
        ashape: Shape,
        adtype: np.dtype[Any],
        device: Context,
        b: Any,
        bbuf: Buffer | None,
        bshape: Shape,
        bsample: Any,
        bkey: Any,
    ) -> Array:
        """:func:`elementwise` of ``a`` and ``b`` (an array of this namespace on ``a``'s
        device, or a Const of a Python float, complex or bool: ``bsample`` is its dtype or its
        value, ``bkey`` its dtype or type; or None, for a unary function): the same metadata
        and push, with fewer steps. The callers pass what they read of the arrays already:
        ``a``'s Buffer, known shape, dtype and device, ``b``'s Buffer (None for a Const) and
        known shape."""
        shape = ashape if ashape == bshape or not bshape else broadcast(ashape, bshape)
        try:
            dtype = _DTYPES[fn][adtype][bkey]
        except KeyError:
            dtype = _meta.sample_dtype(fn, [adtype] if b is None else [adtype, bsample])
            _DTYPES.setdefault(fn, {}).setdefault(adtype, {})[bkey] = dtype
        engine = self._engine
        if None in shape:  # data-dependent: the learnt shapes, or assumed large
            size = _cost(broadcast(learnt_shape(a), () if bbuf is None else learnt_shape(b)))
        else:
            size = 1
            for d in shape:
                size *= d  # type: ignore[operator]
        inline = size <= INLINE_COST and device.device_type is CPU
        if size > INLINE_COST:
            chained = self._chain(fn, name, (a,) if b is None else (a, b), shape, dtype, device)
            if chained is not None:
                return chained
        if inline:
            head = self._segment
            if head is not None and head.fn is not None:
                fused = self._fuse(head, fn, name, a, b, abuf, bbuf, shape, dtype, device)
                if fused is not None:
                    return fused
            if self._off_loop():
                args = (a,) if b is None else (a, b)
                now = self._computed(fn, args, ((shape, dtype),), device, name, None, None)
                if now is not None:
                    return now[0]
        self._segment = None  # before the push: no later operation fuses across it
        buf = Buffer(engine, engine.new_var(name), shape, dtype, MISSING, fn, None, name, a, b)
        out = Array(self, buf, shape, dtype, device)
        reads: tuple[Any, ...]
        if len(abuf.vars) == 1 and (bbuf is None or len(bbuf.vars) == 1):
            reads = (abuf.var,) if bbuf is None or bbuf is abuf else (abuf.var, bbuf.var)
        else:  # a chunked operand (a broadcast or a view): the chunks it touches
            reads = tuple(dict.fromkeys((*vars_of(a), *(() if bbuf is None else vars_of(b)))))
        if self._blocking is None:
            self._claim()
            op: Operation[Any] = engine.push_sync(
                buf, device, reads, (buf.var,), prop=_ASYNC if inline else NORMAL, name=name
            )
            buf.writer = op
            if self._loop is None:
                self._bind(op)
            elif inline and running_loop() is self._loop:
                # On the loop thread, where it will run: later operations may fuse into it.
                self._segment = buf
                self._segment_reads = reads
            if engine.max_pending is not None:
                self._backpressure()
            return out
        prop = _ASYNC if inline else NORMAL
        buf.writer = self._submit(buf, device, reads, (buf.var,), prop, name, None)
        return out

    def _off_loop(self) -> bool:
        """Whether the caller is a synchronous one that may compute small operations at the
        call: off the engine's loop (once known), not inside an operation, and the only
        thread that uses the namespace's arrays (``Bound._user``; the computation itself
        runs under ``_users`` and checks again)."""
        loop = self._loop
        if loop is None or running_loop() is loop or in_operation():
            return False
        self._claim()
        return self._user == get_ident()

    def _computed(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        outs: tuple[tuple[Shape, np.dtype[Any]], ...],
        device: Context,
        name: str,
        target: Array | None,
        region: tuple[int, int] | None,
    ) -> tuple[Array, ...] | None:
        """An operation of :func:`push` (or of :meth:`_fast`, the hot path) computed here and
        now (the module docstring), or None if it may not be: an argument not settled, a
        target something is pending on, another thread now using the namespace, or a closed
        engine (the push refuses)."""
        engine = self._engine
        for x in args:  # (loops, not generators: the synchronous hot path)
            xbuf = buffer_of(x)
            if xbuf is not None and not settled(xbuf, name):
                return None
        if target is not None and (engine.closed or not idle(buffer_of(target))):
            return None  # (a closed engine refuses new_var for the others)
        made = []  # (a loop: a comprehension is a call of its own in Python 3.11)
        for shape, dtype in outs:
            made.append(Buffer(engine, engine.new_var(name), shape, dtype, MISSING, name=name))
        bufs = tuple(made)
        tbuf = None
        with self._users:  # no other thread's first use meanwhile (``Bound._user``)
            if self._user != get_ident():
                return None
            if target is not None:  # the write's record (idle: no reader to wait for)
                tbuf = buffer_of(target)
                tbuf.write(chunks_of(target) if region is None else tbuf.chunks(*region))
            failure = run_now(fn, args, bufs, tbuf, name, device)
        if failure is not None:
            self._record(failure, bufs if tbuf is None else (tbuf, *bufs), device, name)
        results = []
        for buf in bufs:
            results.append(Array(self, buf, buf.shape, buf.dtype, device))
        return tuple(results)

    def _record(
        self, failure: BaseException, bufs: tuple[Buffer, ...], device: Context, name: str
    ) -> None:
        """Record ``failure``, raised computing ``bufs`` at the call, in the engine as their
        operation's: one pushed on their Vars raises it (so dependents are skipped, and
        reading one of them, or ``wait_for_all()``, raises it once, as for any push)."""
        op = self._submit(
            _partial(reraise, failure), device, (), tuple(b.var for b in bufs), _ASYNC, name, None
        )
        for buf in bufs:
            buf.writer = op

    def _burst_here(self) -> Burst | None:
        """The :class:`~._burst.Burst` of chunk kernels pushed here: the namespace's if the
        caller runs on the engine's loop (an Engine's loop is the caller's until it is
        learnt), else the calling thread's; None inside an operation."""
        loop = running_loop()
        if loop is not None and (
            loop is self._loop or (self._loop is None and self._blocking is None)
        ):
            return self._burst
        if in_operation():
            return None
        burst: Burst | None = getattr(self._threads, "burst", None)
        if burst is None:
            burst = self._threads.burst = Burst(on_loop=False)
        return burst

    def _chain(
        self,
        fn: Callable[..., Any],
        name: str,
        operands: tuple[Any, ...],
        shape: Shape,
        dtype: np.dtype[Any],
        device: Context,
    ) -> Array | None:
        """``fn(*operands)`` as a chunked, fused operation (``_chain.py``), or None if it
        cannot be one: every array operand must be a whole array of the result's shape, or
        (on the CPU) a smaller unchunked one broadcast to it (a view included: a bias row, a
        column, a scalar array) where the chunks are whole rows of the result; and its Var
        never handed out. An array on a GPU is one chunk: the GPU is one device, and the
        whole chain is one kernel on its stream."""
        if None in shape or 0 in shape:
            return None
        broadcast = short = False  # (short: a broadcast operand that is not one element)
        for x in operands:
            if type(x) is Array:
                _, xbuf, xshape, _, xdevice = unpack(x)
                if (
                    xbuf.exposed
                    or xbuf.group is not None
                    or (xdevice is not device and xdevice != device)
                ):
                    return None
                if xshape != shape or is_view(x):
                    if (
                        device.device_type is not CPU
                        or len(xbuf.vars) > 1
                        or None in xshape
                        or _meta.prod(xshape) >= _meta.prod(shape)
                    ):
                        return None
                    broadcast = True
                    short = short or _meta.prod(xshape) > 1
            elif type(x) is not Const:
                return None
        if broadcast and not self._whole_rows(shape, MIN_ROW if short else 1):
            return None
        self._segment = None  # no tiny operation fuses across a push
        buf = join_or_push(
            self._submit,
            self._engine,
            self._chunk_elems if device.device_type is CPU else math.prod(shape),  # type: ignore[arg-type]
            self._recent,
            self._burst_here(),
            fn,
            name,
            operands,
            shape,  # type: ignore[arg-type]
            dtype,
            device,
        )
        self._recent = None if buf.chunked is None else buf.chunked.program
        return Array(self, buf, shape, dtype, device)

    def _whole_rows(self, shape: Shape, least: int) -> bool:
        """Whether every chunk of an array of ``shape`` is whole rows (``chunking()`` cuts arrays
        of one size alike) of at least ``least`` elements: what steps computing on rows need
        (a broadcast operand, a reduction along the first axis)."""
        row = _meta.prod(shape[1:])
        _, elems = chunking(_meta.prod(shape), self._chunk_elems)
        return row >= least and elems % row == 0

    def _chain_reduce(
        self,
        fn: Callable[..., Any],
        name: str,
        x: Array,
        shape: Shape,
        dtype: np.dtype[Any],
        device: Context,
        options: dict[str, Any],
        rows: bool = False,
    ) -> Array | None:
        """The reduction ``fn`` of all of ``x``, or with ``rows`` along its first axis
        (``options``: its keywords other than ``dtype``) as per-chunk partials fused into the
        chunks' kernels and one operation combining them in order (``_chain.py``), or None if
        ``x`` cannot be read by kernels (a view, or its Var handed out; along the first axis,
        chunks that are not whole rows)."""
        _, xbuf, xshape, _, xdevice = unpack(x)
        if is_view(x) or xbuf.exposed or xbuf.group is not None or xdevice != device:
            return None
        if rows and not self._whole_rows(xshape, MIN_ROW):
            return None
        self._segment = None
        buf = reduce_chunks(
            self._submit,
            self._engine,
            self._chunk_elems,
            self._recent,
            self._burst_here(),
            fn,
            name,
            x,
            shape,  # type: ignore[arg-type]
            dtype,
            device,
            options,
            rows,
        )
        return Array(self, buf, shape, dtype, device)

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
        device: Context,
    ) -> Array | None:
        """Fuse ``fn(a, b)`` into the pending operation that makes ``head`` (see the module
        docstring), or return None if it may not be."""
        if running_loop() is not self._loop or head.handed_out():
            return None
        group = head.group
        if group is not None and len(group.steps or ()) >= FUSE_MAX:
            # Full: computed now if its turn has come (here, on the loop's thread, where the
            # loop would run it at its next turn), so that a loop of small operations that
            # never yields keeps a group pending, not every operation it pushed.
            writer = head.writer
            if writer is not None:
                writer.run_here()
            return None
        var = head.var
        reads = self._segment_reads
        fused = False
        unheld: Buffer | None = None
        for x in (abuf, bbuf):
            if x is None:
                continue
            if len(x.vars) > 1:
                return None  # a chunked Buffer: read by an operation of its own
            if x.var is var:
                fused = True
            elif x.var not in reads or x.handed_out():
                if not quiescent(x):
                    return None
                unheld = x  # computed, no write pending: read without a turn
        if not fused:
            return None
        if unheld is not None:
            # A write pushed on it later waits for this operation (``Buffer.readers``).
            writer = head.writer
            assert writer is not None  # (set at the head's push)
            unheld.read_unheld(0, var, writer)
        buf = Buffer(self._engine, var, shape, dtype, MISSING, fn, None, name, a, b)
        buf.writer = head.writer
        if group is None:
            group = head.group = Group(buf)
        else:
            group.steps.append(buf)  # type: ignore[union-attr]  # (the head has not run)
        buf.group = group
        return Array(self, buf, shape, dtype, device)

    def _inplace(self, name: str, target: Array, other: Any) -> None:
        """``target <op>= other``: a write on target's Buffer; the result must keep target's
        shape and dtype (TypeError / ValueError at the call otherwise)."""
        x = operand(self, other)
        arrays = [target] + ([x] if isinstance(x, Array) else [])
        device = check_same(self, arrays)
        check_writable(self, target)
        value = x.dtype if isinstance(x, Array) else x.value
        tshape, tdtype = known_shape(target), target.dtype
        if name == "matmul":
            shape = _meta.matmul_shape(tshape, x.shape)
            dtype = _meta.sample_dtype(
                np.matmul,
                [
                    (tdtype, (1,) * max(target.ndim, 2)),
                    (value, (1,) * max(len(x.shape), 2)),
                ],
            )
            fn: Callable[..., Any] = blas(
                _inplace_matmul, _meta.prod(shape) * (tshape[-1] or 1), device
            )
        else:
            ufunc = elementwise_function(name)
            shape = broadcast(tshape, x.shape)
            dtype = _meta.sample_dtype(ufunc, [tdtype, value])
            fn = _partial(_inplace_ufunc, ufunc)
        if dtype != tdtype:
            raise TypeError(
                f"in-place {name}: the result dtype {dtype} is not the array's dtype "
                f"{tdtype} (an in-place operation cannot change the dtype)"
            )
        if shape != tshape:
            raise ValueError(
                f"in-place {name}: the result shape {shape} is not the array's shape "
                f"{tshape} (an in-place operation cannot change the shape)"
            )
        cost = size_of(target)
        push(self, fn, (target, x), (), device, f"i{name}", cost, target=target)


# -- what the namespace's functions push with (the package's internal API) ----------------------


def check_same(ns: Pusher, arrays: Sequence[Array]) -> Context:
    """The device of ``arrays``: ValueError if they belong to another namespace than ``ns``
    (another engine's) or to several devices."""
    device = None
    for a in arrays:
        if namespace_of(a) is not ns:
            raise ValueError(
                "arrays of two engines in one call: "
                f"{engine_of(namespace_of(a))!r} and {engine_of(ns)!r}; move one with "
                "xp.asarray(...) after reading it"
            )
        if device is None:
            device = a.device
        elif a.device != device:
            raise ValueError(
                f"arrays on different devices in one call: {device} and {a.device}; "
                "move one with x.to_device(...)"
            )
    return device if device is not None else CPU0


def operand(ns: Pusher, x: Any) -> Array | Const:
    """``x`` as an operand of an operation of ``ns``: an array as it is, a Python scalar as a
    Const, a NumPy array or scalar as an array of ``ns``; TypeError for anything else."""
    if isinstance(x, Array):
        return x
    if type(x) in SCALARS:
        return Const(x)
    if isinstance(x, np.ndarray | np.generic):
        return ns.asarray(x)
    raise TypeError(
        f"expected an array of this namespace or a Python scalar, got {type(x).__name__}"
    )


def push(
    ns: Pusher,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    outs: tuple[tuple[Shape, np.dtype[Any]], ...],
    device: Context,
    name: str,
    cost: int,
    *,
    target: Array | None = None,
    region: tuple[int, int] | None = None,
    prop: FnProperty | None = None,
    run_on: Context | None = None,
) -> tuple[Array, ...]:
    """Push ``fn`` over the values of ``args`` (arrays and Consts) as one operation of ``ns``
    on ``run_on`` (default: ``device``, where the outputs live); return its output arrays
    (none for an in-place write into ``target``). It reads the chunks its array arguments
    touch, and writes those of ``region`` (the flat span written in ``target``'s Buffer; by
    default all of ``target``'s): ``_buffer.py`` has the rule."""
    engine = engine_of(ns)
    if (
        prop is None
        and run_on is None
        and cost <= INLINE_COST
        and device.device_type is CPU
        and ns._off_loop()
    ):
        done = ns._computed(fn, args, outs, device, name, target, region)
        if done is not None:
            return done
    reads: list[Any] = []
    for a in args:
        # (``target`` itself is written: in ``region`` only, whose chunks the write holds.)
        if a is not target and buffer_of(a) is not None:
            for var in vars_of(a):  # the chunks of a chunked Buffer it touches
                if var not in reads:
                    reads.append(var)
    if run_on is None:
        run_on = device
    if target is None and len(outs) == 1:
        ((shape, dtype),) = outs
        if prop is None:
            prop = _ASYNC if cost <= INLINE_COST and run_on.device_type is CPU else NORMAL
        buf = Buffer(engine, engine.new_var(name), shape, dtype, MISSING, fn, args, name)
        buf.writer = ns._submit(buf.produce, run_on, reads, (buf.var,), prop, name, None)
        return (Array(ns, buf, shape, dtype, device),)
    bufs = tuple(
        Buffer(engine, engine.new_var(name), shape, dtype, MISSING, name=name)
        for shape, dtype in outs
    )
    if target is None:
        if prop is None:
            prop = _ASYNC if cost <= INLINE_COST and run_on.device_type is CPU else NORMAL
        kernel = Kernel(fn, args, bufs, None, name)
        op = ns._submit(kernel.run, run_on, reads, tuple(b.var for b in bufs), prop, name, None)
    else:  # an in-place write: on the chunks of ``region`` (or ``target``) only
        tbuf = buffer_of(target)
        handed_out = tbuf.exported or tbuf.lent is not None
        chunks, writes, waits = tbuf.write(
            chunks_of(target) if region is None else tbuf.chunks(*region)
        )
        partial = len(writes) < len(tbuf.vars)
        if handed_out and not partial:
            # The write may copy the whole Buffer first (what await handed out must not
            # change): a small write through a view of a large one is a large operation.
            cost = max(cost, getattr(tbuf.value, "size", 0), _meta.prod(tbuf.shape))
        if prop is None:
            prop = _ASYNC if cost <= INLINE_COST and run_on.device_type is CPU else NORMAL
        reads = [v for v in reads if v not in writes]
        reads.extend(v for v in waits if v not in reads)  # kernels reading without a turn
        kernel = Kernel(fn, args, bufs, tbuf, name, partial)
        op = ns._submit(
            kernel.run, run_on, reads, writes + tuple(b.var for b in bufs), prop, name, tbuf
        )
        tbuf.wrote(op, chunks)
    for buf in bufs:
        buf.writer = op
    return tuple(Array(ns, buf, buf.shape, buf.dtype, device) for buf in bufs)


def push1(
    ns: Pusher,
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
    """:func:`push` of an operation with one output, of ``shape`` and ``dtype``; its cost, by
    default, the elements of the largest of it and its array arguments."""
    if cost is None:
        cost = max([_meta.prod(shape), *(size_of(a) for a in args if buffer_of(a) is not None)])
    return push(ns, fn, args, ((shape, dtype),), device, name, cost, prop=prop, run_on=run_on)[0]


def idle(buf: Buffer | None) -> bool:
    """Whether an in-place write into ``buf`` may be computed at the call: an unchunked,
    settled Buffer (``_chain.settled``) on whose Var nothing is pending at all (no read,
    pushed or without a turn, and no write)."""
    if buf is None or len(buf.vars) > 1 or not settled(buf, ""):
        return False
    if buf.readers and not all(op.done() for _, _, op in buf.readers):
        return False
    stats = buf.var.statistics()
    return not (stats.pending_reads or stats.pending_write or stats.waiting)


def _cost(shape: Shape) -> int:
    """The elements of ``shape`` for an operation's cost: an unknown (data-dependent)
    dimension counts as more than :data:`INLINE_COST`, so that work of a size not known yet
    goes to the pool rather than risk holding the loop."""
    n = 1
    for d in shape:
        n *= INLINE_COST + 1 if d is None else d
    return n


def size_of(x: Array) -> int:
    """The elements of ``x`` for an operation's cost: its shape as learnt (``x.shape`` learns
    a data-dependent dimension once the value is ready), an unknown dimension counting as
    more than :data:`INLINE_COST`."""
    return _cost(learnt_shape(x))


def elementwise(
    ns: Pusher, fn: Callable[..., Any], name: str, args: tuple[Any, ...], **kw: Any
) -> Array:
    """The elementwise function ``fn`` of ``args`` (arrays, NumPy arrays, Python scalars):
    its shape by broadcasting, its dtype by sampling."""
    if not kw and len(args) == 1 and type(args[0]) is Array:
        # The hot path of a unary function (``xp.sqrt(c)``), which fuses as a binary one.
        a = args[0]
        ans, abuf, ashape, adtype, adevice = unpack(a)
        if ans is ns:
            return ns._fast(fn, name, a, abuf, ashape, adtype, adevice, None, None, (), None, None)
    operands = tuple(operand(ns, a) for a in args)
    arrays = [a for a in operands if isinstance(a, Array)]
    if not arrays:
        raise TypeError(f"{name}() needs at least one array argument")
    device = check_same(ns, arrays)
    shape = broadcast(*(known_shape(a) for a in arrays))
    dtype = _meta.sample_dtype(
        fn,
        [a.dtype if isinstance(a, Array) else a.value for a in operands],
        **kw,
    )
    call = _partial(call_with, fn, kw) if kw else fn
    if _meta.prod(shape) > INLINE_COST:
        chained = ns._chain(call, name, operands, shape, dtype, device)
        if chained is not None:
            return chained
    return push1(ns, call, operands, shape, dtype, device, name)


def reduction(
    ns: Pusher,
    fn: Callable[..., Any],
    name: str,
    x: Array,
    axis: Any,
    keepdims: bool,
    *,
    single_axis: bool = False,
    **kw: Any,
) -> Array:
    """The reduction ``fn`` of ``x`` along ``axis`` (a single one if ``single_axis``)."""
    if not isinstance(x, Array):
        raise TypeError(f"{name}() needs an array, got {type(x).__name__}")
    device = check_same(ns, [x])
    if single_axis and axis is not None:
        axis = axis_index(axis, x.ndim)
    elif isinstance(axis, list):
        axis = tuple(axis)
    kwargs = dict(kw, axis=axis, keepdims=keepdims)
    xshape = known_shape(x)
    shape = reduced(xshape, axis, keepdims)
    dtype = _meta.sample_dtype(fn, [(x.dtype, (1,) * x.ndim)], **kwargs)
    axes = None if axis is None else set(normalize_axes(axis, x.ndim))
    # Along the first axis only (of a float32/64, integer or boolean array of 2 or more
    # dimensions): per chunk of whole rows, then the partial rows combined.
    rows = axes == {0} and x.ndim >= 2 and x.dtype not in (np.float16, np.longdouble)
    reducer = (ROW_REDUCERS if rows else REDUCERS).get(fn)
    if (
        reducer is not None
        and device.device_type is CPU
        and None not in xshape
        and _meta.prod(xshape) > INLINE_COST
        and x.dtype.kind in reducer.kinds
        and (rows or axes is None or len(axes) == x.ndim)
        and set(kw) <= {"dtype", "correction"}
    ):
        options = {k: v for k, v in kw.items() if k != "dtype"}
        chained = ns._chain_reduce(fn, name, x, shape, dtype, device, options, rows)
        if chained is not None:
            return chained
    return push1(
        ns,
        _partial(call_with, fn, kwargs),
        (x,),
        shape,
        dtype,
        device,
        name,
        cost=size_of(x),
    )


def same_shape(
    ns: Pusher, fn: Callable[..., Any], name: str, x: Array, *, min_ndim: int = 0, **kw: Any
) -> Array:
    """``fn(x, **kw)``, whose result has ``x``'s shape and dtype."""
    if not isinstance(x, Array):
        raise TypeError(f"{name}() needs an array, got {type(x).__name__}")
    if x.ndim < min_ndim:
        raise ValueError(f"{name} needs an array of at least {min_ndim} dimensions")
    device = check_same(ns, [x])
    return push1(ns, _partial(call_with, fn, kw), (x,), known_shape(x), x.dtype, device, name)


def create(
    ns: Pusher,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
    device: Context | None,
    name: str,
) -> Array:
    """A new array of ``ns``, ``fn(*args, **kwargs)`` (a NumPy creation function): computed
    here if it is a small CPU one (at most ``INLINE_COST`` elements), else by an operation
    of its own (CuPy's function of the same name on a real GPU)."""
    device = CPU0 if device is None else device
    if type(device) is not Context:
        raise ValueError(
            f"device must be an aioengine Context (ae.cpu(i) or ae.gpu(i)), got {device!r}"
        )
    size = math.prod(shape)
    if device.device_type is CPU and size <= INLINE_COST:
        value = fn(*args, **kwargs)
        if not value.flags.c_contiguous:
            value = value.copy(order="C")
        return ns._from_value(value, device)
    xp = ns._xp(device)
    if xp is not np:
        fn = getattr(xp, fn.__name__)
    return push1(
        ns, _partial(_creation, fn, args, kwargs), (), shape, dtype, device, name, cost=size
    )
