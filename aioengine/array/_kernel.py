"""What every array operation runs when its turn comes: read the inputs, compute, store.

:func:`run` is the function pushed for each array operation (bound with ``functools.partial``):
it holds a read on every input Buffer's Var and a write on every output's, so the values it
reads and writes are guarded by the engine's rule, not by locks.

Failures (the rules, written once here):

* The function raises: the exception gets a note naming the operation (name, shapes, dtypes,
  device), becomes the sticky ``failure`` of every Buffer the operation writes, and is re-raised
  so that the engine records it (later operations on those Vars are skipped; ``wait_for_all``
  reports it once, unless ``await`` has thrown it).
* An input Buffer failed: the operation does not compute; its outputs fail with a
  :class:`~aioengine.DependencyError` whose ``__cause__`` is the root failure. It returns
  normally: the root failure is already in the engine's record (or was thrown), and one failure
  is reported once, not again per dependent.
* An input was never computed (its write was skipped by the engine, or cancelled): the same,
  with the cause the skip or cancellation carries.

Computed at the call (:func:`run_now`, for a synchronous caller's small operation of settled
arrays, ``_push.py``): :func:`run` on the caller's thread; a raised exception is returned
instead of re-raised, and the caller records it in the engine with an operation of its own on
the results' (and the target's) Vars that raises it (:func:`reraise`), so that it is skipped
over, thrown and reported exactly as the first rule says.

On a GPU (written once, here): an operation's function runs on a GPU worker thread with its
stream current, and must only *enqueue* device work, as CuPy's calls do (they allocate their
result at once and launch the kernel on the current stream). With CuPy, :func:`run` does what it
does on the CPU, and CuPy enqueues. Where the GPU's arrays are NumPy's (the simulated GPU,
:func:`numpy_on_gpu`), NumPy would compute on the worker thread, so :func:`run` launches the
work instead (:func:`launch`): on the worker, everything about *objects* (the inputs' values
and their views, a result allocated with ``np.empty``, a copy-before-write's new allocation),
so that later operations, enqueued before this work runs, see the objects CuPy would give
them; on the device, later, everything about *contents* (the computation, copied into the
allocation). A failure that only the computation finds (a singular matrix) is then found on
the device: it fails the results as above, and an operation of its own carries it into the
engine's record (``Buffer.carry``, as for a fused step), since this operation was released as
a success when its work was enqueued; operations that read those results find the failure in
their own work and fail with a :class:`~aioengine.DependencyError`. A result whose shape depends
on the data (``nonzero``) cannot be allocated before the data is known: the worker waits for
its stream (``stream.synchronize()``), as CuPy does for such a result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .. import DependencyError, OpState, RunContext, cpu

if TYPE_CHECKING:
    from .. import Context, Engine, Operation
    from ._meta import Shape

__all__ = (
    "MISSING",
    "Const",
    "Kernel",
    "Memory",
    "describe",
    "failure_of",
    "inputs_failure",
    "launch",
    "numpy_on_gpu",
    "reraise",
    "run",
    "run2",
    "run_now",
)


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


#: The value of a Buffer whose first write has not run (or never will: it failed or was skipped).
MISSING: Any = _Missing()

_SKIPPED = OpState.SKIPPED
_FAILED = OpState.FAILED
_CANCELLED = OpState.CANCELLED
_ndarray = np.ndarray
_CPU0 = cpu()
_generic = np.generic


class ChunkWriters(Protocol):
    """What a kernel reads of a chunked Buffer's chunk part (``_buffer.Chunks``)."""

    writers: tuple[Operation[Any], ...] | None


class Memory(Protocol):
    """What a kernel reads and writes of a Buffer (``_buffer.Buffer``, which pushes the kernels
    and is the one kind; a Protocol, so that this module, below it, never imports it). The
    fields are the Buffer's, documented there."""

    value: Any
    failure: BaseException | None
    writer: Operation[Any] | None
    wgen: int
    exported: bool
    shape: Shape
    dtype: np.dtype[Any]
    name: str
    engine: Engine

    @property
    def chunked(self) -> ChunkWriters | None:
        """The chunk part of a chunked Buffer (``_buffer.Chunks``), else None."""

    def carry(self, exc: BaseException, ctx: Context, name: str) -> None:
        """Record ``exc``, raised computing this Buffer after its operation was released, in
        the engine once (an operation of its own raises it)."""


class Const:
    """A non-array argument of an operation, passed to its function as it is."""

    __slots__ = ("_buf", "value")

    def __init__(self, value: Any) -> None:
        self._buf = None
        self.value = value

    @property
    def shape(self) -> tuple[int, ...]:
        return ()

    @property
    def dtype(self) -> str:
        return type(self.value).__name__


class Applied:
    """``fn`` as ``xp.apply`` runs it: its result must be a NumPy array of the declared dtype
    and shape (``shape``; or, per chunk on the cluster, ``trailing`` after the rows of the
    argument at ``lead``); anything else is the result's failure, never a silent cast. An
    ``ndarray`` subclass (``np.matrix``, as SciPy's ``todense()`` returns; a masked array)
    indexes and reduces by rules of its own: a plain array of its values is stored.
    Picklable (by reference to ``fn``), so that a worker runs it."""

    __slots__ = ("dtype", "fn", "lead", "shape", "trailing")

    def __init__(
        self,
        fn: Callable[..., Any],
        shape: tuple[int, ...] | None,
        dtype: np.dtype[Any],
        lead: int = 0,
        trailing: tuple[int, ...] = (),
    ) -> None:
        self.fn = fn
        self.shape = shape
        self.dtype = dtype
        self.lead = lead
        self.trailing = trailing

    def __call__(self, *values: Any, **kwargs: Any) -> Any:
        fn = self.fn
        result = fn(*values, **kwargs)
        if not isinstance(result, np.ndarray):
            raise TypeError(
                f"apply: {getattr(fn, '__qualname__', fn)!r} returned {type(result).__name__}, "
                "not a NumPy array"
            )
        if type(result) is not np.ndarray:
            result = np.array(result, subok=False)
        if result.dtype != self.dtype:
            raise TypeError(f"apply: the function returned dtype {result.dtype}, not {self.dtype}")
        shape = self.shape
        if shape is None:
            shape = (np.shape(values[self.lead])[0], *self.trailing)
        if result.shape != shape:
            raise ValueError(f"apply: the function returned shape {result.shape}, not {shape}")
        return result

    def __reduce__(self) -> tuple[Any, ...]:
        return (Applied, (self.fn, self.shape, self.dtype, self.lead, self.trailing))


class Kernel:
    """The function pushed for an operation with several outputs or an in-place target (one
    that makes a single new Buffer pushes that Buffer's ``produce``)."""

    __slots__ = ("args", "fn", "name", "outs", "partial", "target")

    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        outs: tuple[Memory, ...],
        target: Memory | None,
        name: str,
        partial: bool = False,
    ) -> None:
        self.fn = fn
        self.args = args
        self.outs = outs
        self.target = target
        self.name = name
        #: A write holding some of the target's chunks only: it never copies the value.
        self.partial = partial

    def run(self, rctx: RunContext) -> None:
        """Run the operation (once)."""
        fn, args = self.fn, self.args
        self.args = ()
        run(fn, args, self.outs, self.target, self.name, rctx, self.partial)


def failure_of(buf: Memory) -> BaseException | None:
    """The sticky failure of ``buf``, learning it from its writer if the engine skipped or
    cancelled that write, or, on a chunk, if it failed (called by an operation holding a turn
    on ``buf.var``, or after a wait on it)."""
    failure = buf.failure
    if failure is not None:
        return failure
    chunked = buf.chunked
    writers = None if chunked is None else chunked.writers
    if writers is not None:  # a chunked Buffer: the latest write pushed on each chunk
        for writer in writers:
            state = writer.state
            if state is _SKIPPED or state is _CANCELLED or state is _FAILED:
                return _learn(buf, writer, True)
    last = buf.writer  # the latest write pushed (a chunk's, or one since the chunks merged)
    if last is None or (writers is not None and last in writers):
        return None
    return _learn(buf, last)


def input_failure(buf: Memory, name: str) -> BaseException | None:
    """The failure an operation ``name`` reading ``buf`` (holding its turn) inherits: its
    sticky failure, one learnt from a skipped or cancelled latest write (on any chunk), or an
    error if its value was never computed; None if it may be read."""
    failure = buf.failure
    if failure is None and (buf.value is MISSING or buf.wgen or buf.chunked is not None):
        failure = failure_of(buf)
        if failure is None and buf.value is MISSING:
            failure = RuntimeError(f"an input of {name} has no value")
    return failure


def _learn(buf: Memory, writer: Any, chunk: bool = False) -> BaseException | None:
    """The failure ``buf`` inherits from ``writer`` (a chunk's latest write, with ``chunk``),
    kept as its sticky failure; None if it inherits none."""
    state = writer.state
    if state is _SKIPPED:
        cause = writer.exception()
        root = cause.__cause__ if isinstance(cause, DependencyError) else cause
        dep = DependencyError(f"{writer.name} was not computed: an input failed: {root!r}")
        dep.__cause__ = root
        buf.failure = dep
        return dep
    if state is _FAILED and (chunk or buf.value is MISSING):
        # Its operation failed before computing it: a group of fused steps whose first failed;
        # on a chunk, an operation that raised (an interrupt out of a chain's kernel, a write):
        # that chunk holds no value, whatever the other chunks' kernels allocated.
        cause = writer.exception()
        root = _root(cause) if cause is not None else None
        dep = DependencyError(f"{buf.name or writer.name} was not computed: {root!r}")
        dep.__cause__ = root
        buf.failure = dep
        return dep
    if state is _CANCELLED:
        err = RuntimeError(f"{writer.name} was cancelled: this array has no value")
        buf.failure = err
        return err
    return None


def _root(failure: BaseException) -> BaseException:
    if isinstance(failure, DependencyError) and failure.__cause__ is not None:
        return failure.__cause__
    return failure


def describe(name: str, args: Sequence[Any], ctx: object) -> str:
    """``name(shape dtype, ...) on ctx``: how an operation is named in failures."""
    parts = []
    for a in args:
        if a._buf is None:
            parts.append(repr(a.value) if len(repr(a.value)) < 40 else type(a.value).__name__)
        else:
            parts.append(f"{a.shape} {a.dtype}")
    return f"{name}({', '.join(parts)}) on {ctx}"


def _fail(outs: Sequence[Memory], target: Memory | None, failure: BaseException) -> None:
    for buf in outs:
        buf.failure = failure
    if target is not None:
        target.failure = failure


class _Result:
    """What :func:`_store` checks a result against and stores it into, for a result computed
    on the device into an allocation of its own (:func:`launch`): the Buffer's ``value`` is
    that allocation, which the computation must not replace."""

    __slots__ = ("dtype", "shape", "value")

    def __init__(self, shape: Shape, dtype: np.dtype[Any]) -> None:
        self.shape = shape
        self.dtype = dtype
        self.value: Any = MISSING


def _store(buf: Memory | _Result, value: Any) -> None:
    shape, dtype = buf.shape, buf.dtype
    if type(value) is not _ndarray:
        if isinstance(value, _generic | bool | int | float | complex):
            value = np.asarray(value)
    elif value.base is not None or not value.flags.writeable:
        # A view of an input's memory (np.real of a real array, say): the new Buffer must own
        # its memory, or a write through one would change the other; a read-only result
        # (np.imag of a real array) would refuse later writes.
        value = value.copy()
    vshape = value.shape
    if vshape != shape and (
        len(vshape) != len(shape)
        or any(d is not None and d != v for d, v in zip(shape, vshape, strict=True))
    ):
        raise ValueError(
            f"the result has shape {vshape}, not the shape {shape} the operation promised"
        )
    if value.dtype is not dtype and value.dtype != dtype:
        raise TypeError(
            f"the result has dtype {value.dtype}, not the dtype {dtype} the operation promised"
        )
    if value.ndim > 1 and not value.flags.c_contiguous:
        value = value.copy(order="C")  # reshape views of a Buffer assume C order
    buf.value = value


def _owned(result: Any, values: Sequence[Any]) -> Any:
    """``result``, copied if it is one of the input ``values`` itself (``np.real`` of a real
    array, an ``xp.apply`` returning its argument): a new Buffer owns its memory, or a write
    to the input would change what ``await`` returned of the result (views of an input are
    copied by :func:`_store`)."""
    for value in values:
        if result is value:
            return result.copy()
    return result


def run(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    outs: tuple[Memory, ...],
    target: Memory | None,
    name: str,
    rctx: RunContext,
    partial: bool = False,
) -> None:
    """Compute ``fn(*values of args)`` into ``outs`` (new Buffers), or let ``fn`` write into
    ``target`` (an in-place operation, whose view is among ``args``), in place if ``partial``
    (it holds some of the target's chunks only, none of them handed out: ``_buffer.py``); on a
    GPU whose arrays are NumPy's, :func:`launch` it instead (see the module docstring; a GPU
    array is never chunked, so never written partially)."""
    if rctx.stream is not None:
        owner = outs[0] if outs else target
        if owner is not None and numpy_on_gpu(owner.engine):
            launch(fn, args, outs, target, name, rctx)
            return
    if target is not None:
        failure = failure_of(target)
        if failure is not None:
            _fail(outs, None, failure)  # a failed array stays failed
            return
        if target.exported and not partial:
            # Someone holds a read-only view of the current value: write into a copy.
            old = target.value
            target.value = old.copy()
            target.exported = False
            if rctx.stream is not None:
                rctx.keep_alive(old)
    values = _values(args, outs, target, name, rctx.ctx)
    if values is None:
        return
    if rctx.stream is not None:
        rctx.keep_alive(*values)  # read by device work enqueued below
    try:
        result = fn(*values)
        if len(outs) == 1:
            _store(outs[0], _owned(result, values))
        elif outs:
            for out, value in zip(outs, result, strict=True):
                _store(out, _owned(value, values))
    except BaseException as exc:
        exc.add_note(f"in aioengine.array operation {describe(name, args, rctx.ctx)}")
        _fail(outs, target, exc)
        raise


def _values(
    args: tuple[Any, ...],
    outs: tuple[Memory, ...],
    target: Memory | None,
    name: str,
    ctx: Context,
) -> list[Any] | None:
    """The values of ``args`` (their views applied), or None if one failed or was never
    computed: then ``outs`` and ``target`` fail with a :class:`~aioengine.DependencyError`."""
    values = []
    for a in args:
        buf = a._buf
        if buf is None:
            values.append(a.value)
            continue
        failure = input_failure(buf, name)
        value = buf.value
        if failure is not None:
            _fail(outs, target, _dependency(describe(name, args, ctx), failure))
            return None
        for step in a._steps:
            value = step(value)
        values.append(value)
    return values


def inputs_failure(bufs: Sequence[Memory], name: str) -> DependencyError | None:
    """The failure of an operation ``name`` (holding its turns on ``bufs``) that computes
    nothing because one of ``bufs`` failed (:func:`input_failure`), or None: what a chunk's
    own operation (a scan's, a product's) records on its result."""
    for buf in bufs:
        failure = input_failure(buf, name)
        if failure is not None:
            return _dependency(name, failure)
    return None


def _dependency(what: str, failure: BaseException) -> DependencyError:
    """The failure of ``what``, not computed because an input failed with ``failure``."""
    root = _root(failure)
    dep = DependencyError(f"{what} was not computed: an input failed: {root!r}")
    dep.__cause__ = root
    return dep


def numpy_on_gpu(engine: Engine) -> bool:
    """Whether ``engine``'s GPU arrays are NumPy arrays: with a device backend other than CuPy
    (the simulated GPU). Then an operation's work must be launched on its stream (NumPy
    computes where it is called); CuPy's calls enqueue themselves."""
    backend = engine.gpu_backend
    return backend is not None and getattr(backend, "name", "") != "cupy"


def launch(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    outs: tuple[Memory, ...],
    target: Memory | None,
    name: str,
    rctx: RunContext,
) -> None:
    """:func:`run` on a GPU whose arrays are NumPy's: the objects now, on the worker thread;
    the computation launched on the operation's stream (see the module docstring)."""
    if target is not None:
        failure = failure_of(target)
        if failure is not None:
            _fail(outs, None, failure)  # a failed array stays failed
            return
        if target.exported:
            # Someone holds a read-only view of the current value: write into a copy, made
            # on the device before the write (CuPy's ``copy()`` enqueues, too).
            old = target.value
            target.value = np.empty_like(old)
            target.exported = False
            rctx.launch(np.copyto, target.value, old)
    values = _values(args, outs, target, name, rctx.ctx)
    if values is None:
        return
    # The results' allocations, now: later operations enqueue work on them before this runs.
    dests: list[Any] = []
    unknown = False
    for out in outs:
        if None in out.shape:
            unknown = True
            dests.append(None)
        else:
            out.value = np.empty(out.shape, out.dtype)
            dests.append(out.value)
    inputs = [a._buf for a in args if a._buf is not None]
    rctx.launch(_compute, fn, args, values, inputs, outs, dests, target, name, rctx.ctx)
    if unknown:  # its shape is known once it has run: wait for it (CuPy does, too)
        rctx.stream.synchronize()


def _compute(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    values: list[Any],
    inputs: list[Memory],
    outs: tuple[Memory, ...],
    dests: list[Any],
    target: Memory | None,
    name: str,
    ctx: Context,
) -> None:
    """The device work of :func:`launch`: ``fn(*values)`` into the allocations ``dests`` (a
    result of unknown shape: stored as it comes). It never raises (a raising kernel would put
    the device into a sticky error): a failure is its results', carried into the engine."""
    for buf in inputs:
        failure = buf.failure  # found by the device work that made it (ran before this)
        if failure is not None:
            _fail(outs, target, _dependency(describe(name, args, ctx), failure))
            return
    try:
        result = fn(*values)
        results = (result,) if len(outs) == 1 else result if outs else ()
        for out, dest, value in zip(outs, dests, results, strict=True):
            checked = _Result(out.shape, out.dtype)
            _store(checked, value)
            if dest is None:
                out.value = _owned(checked.value, values)
            else:
                np.copyto(dest, checked.value)
    except Exception as exc:
        exc.add_note(f"in aioengine.array operation {describe(name, args, ctx)}")
        _fail(outs, target, exc)
        owner = outs[0] if outs else target
        if owner is not None:
            owner.carry(exc, _CPU0, name)  # (the device's context may refuse pushes by now)


def run2(
    fn: Callable[..., Any], x1: Any, x2: Any, out: Memory, name: str, rctx: RunContext
) -> None:
    """:func:`run` for a binary function of whole, computed, healthy buffers on the CPU (the hot
    path of ``c = a + b``; ``x2`` None for a unary function, ``xp.sqrt(c)``): the same result,
    without the general case's loops; anything else goes to :func:`run`."""
    b1 = x1._buf
    v1 = b1.value
    if x2 is None:
        b2 = v2 = None
    else:
        b2 = x2._buf
        v2 = x2.value if b2 is None else b2.value
    if (
        b1.failure is not None
        or v1 is MISSING
        or b1.wgen
        or x1._steps
        or (b2 is not None and (b2.failure is not None or v2 is MISSING or b2.wgen or x2._steps))
        or rctx.stream is not None
    ):
        run(fn, (x1,) if x2 is None else (x1, x2), (out,), None, name, rctx)
        return
    try:
        # (A unary function may return its argument itself: ``np.real`` of a real array.)
        _store(out, fn(v1, v2) if x2 is not None else _owned(fn(v1), (v1,)))
    except BaseException as exc:
        args = (x1,) if x2 is None else (x1, x2)
        exc.add_note(f"in aioengine.array operation {describe(name, args, rctx.ctx)}")
        out.failure = exc
        raise


class _Here:
    """The run context :func:`run_now` gives :func:`run`: the calling thread, no stream."""

    __slots__ = ("ctx",)
    stream = None

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx


def run_now(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    outs: tuple[Memory, ...],
    target: Memory | None,
    name: str,
    ctx: Context,
) -> BaseException | None:
    """:func:`run` (:func:`run2` for a function of the hot path, ``fn`` of one or two
    arguments and one output) on the calling thread, for an operation that is not pushed
    (``_push.py``): its array arguments are settled (computed, healthy, no write on them
    pending), and so is ``target`` (nothing pending on it at all). Returns the exception it
    raised (then the outputs' and the target's failure), which the caller records in the
    engine as a pushed operation's (:func:`reraise` on their Vars), so that it is seen where a
    pushed operation's would be (``await``, a sync point, a dependent operation,
    ``wait_for_all``), never at the call."""
    here: Any = _Here(ctx)
    try:
        if target is None and len(outs) == 1 and 1 <= len(args) <= 2 and type(args[0]) is not Const:
            run2(fn, args[0], args[1] if len(args) == 2 else None, outs[0], name, here)
        else:
            run(fn, args, outs, target, name, here)
    except Exception as exc:
        return exc
    return None


def reraise(exc: BaseException, rctx: RunContext) -> None:
    """The operation that records ``exc``, raised where no operation was running (a fused step,
    device work, an operation computed at the call), in the engine: it raises it."""
    raise exc
