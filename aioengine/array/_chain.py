"""Chunks and fused chains: how a large elementwise operation uses every core in one pass.

An array above :data:`~aioengine.array._push.INLINE_COST` elements made by an elementwise
operation is **chunked**: its flat (C-order) elements are cut into chunks of ``chunk_elems``
(the namespace's ``chunk_bytes`` over 8; larger in an array that would have more than
:data:`MAX_CHUNKS`), and each chunk has an engine Var of its own
(``Buffer.vars``). One operation becomes one push per chunk, so a chain runs on every worker,
and chunk *i* of the next step starts as soon as chunk *i* of this one is done (a wavefront, no
barrier between steps). The chunks are slices of one allocation (the Buffer's ``value``): any
other operation (``await``, a reduction, ``matmul``, an in-place write) holds the Vars of the
chunks its arrays touch, all of them for a whole array and the ones under a view for a view
(``x[:10] += 1`` orders only against the users of the first chunk: ``_buffer.py`` has the
rule), and reads the value as it is, without a gather. A small unchunked operand broadcast to
the result's shape (a bias row, a column, a 0-d array, a view of one) is read whole by every
kernel (``Program.expands``), where the chunks are whole rows of the result, long ones
(``_push.py`` checks it: ``MIN_ROW``): a step reading one computes on the rows of its block, as
NumPy broadcasts.

**Fusion.** A chunked result is made by a :class:`Program`: elementwise steps, evaluated on
each chunk by a :class:`ChainKernel` of its own (the operation pushed for that chunk). While no
kernel of it has started (they wait for their inputs, or for a worker), a later elementwise
operation whose every array operand is an input the program reads already, or a result it
makes, **joins** it: it becomes one more step of the program, for every chunk at once, instead
of a push per chunk, and its result shares each kernel's Var for that chunk. The rule still
holds per chunk: each kernel holds a read on every input's Var for its chunk and a write on the
Var of its results, and a step may join only if no write on any array it reads was pushed after
the program (``Buffer.wgen``, the writes pushed on a Buffer, is compared with what the program
recorded). Nor if it reads none of the program's results and not every input that had a write
pending when the program began (``Program.risky``): that write may fail, and the engine then
skips the kernels, which would fail a step that reads none of its data.
A kernel evaluates its program in blocks of about :data:`BLOCK_BYTES` (cache-sized), each step a
NumPy call with ``out=`` into the result (a step whose result someone still holds) or into a
scratch block (a step whose result nobody holds any more: its Buffer is known by a weak
reference only): the block of an operand the step reads for the last time, else a free one of
the worker thread's, which keeps a few warm between kernels (:func:`_scratch`). So
``c = a * 1.5 + b; c = c * c - a; ...`` streams ``a`` and ``b`` through memory once and
allocates only ``c``. Where the wheel compiled it, a program of ufuncs on floating-point arrays
of its shape runs instead in one call of NumPy's own loops with the GIL released
(``_numpy_fuse.py``; ``Program.plans``): the same values, no GIL hand-off between steps.

Failures (the kernel itself raises no step's exception, because its Var is shared by results
that computed): a step that raises fails its result and every step that reads it (a
:class:`~aioengine.DependencyError` whose ``__cause__`` is the exception, which has a note
naming the step); the others compute on. An operation of its own then carries the exception
into the engine's record (``Buffer.carrier``), once per Buffer, as a fused tiny step does. A
``KeyboardInterrupt`` or ``SystemExit`` is not a step's failure: it escapes the kernel, whose
operation fails with it (every result of the chunk with it), and is raised where the kernel
ran. Only a kernel run on the caller's own thread at a sync point (``Program.run_here``) can
see one: a signal reaches the main thread, never the engine's workers.

State (each field says who writes it): a :class:`Program`'s ``started``, ``steps``,
``inputs`` and ``known`` are guarded by its ``lock`` (joins run on the pushing thread, kernels on
workers); everything else of a program or a kernel is written before its kernels' pushes. A
worker thread's free scratch blocks (:func:`_scratch`) are its own.
"""

from __future__ import annotations

import functools
import math
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import DependencyError, DeviceType, FnProperty, OpState
from ._array import buffer_of, learnt_shape, steps_of
from ._buffer import Buffer
from ._burst import Burst
from ._cupy_fuse import cupy_module, fused_call
from ._kernel import MISSING, input_failure, numpy_on_gpu
from ._numpy_fuse import BLOCK, Plan, Reduce, available, bits, block_partials, plan, reduces, run
from ._pool import empty as pooled_empty
from ._reducers import REDUCERS, ROW_REDUCERS

if TYPE_CHECKING:
    from .. import Context, Engine, Operation, RunContext, Var

__all__ = (
    "BLOCK_BYTES",
    "CHUNK_BYTES",
    "ChainKernel",
    "Combine",
    "Partials",
    "Program",
    "chunking",
    "join_or_push",
    "quiescent",
    "reduce_chunks",
    "settled",
)

#: The default chunk size in bytes of float64 (``chunk_elems`` = this over 8, whatever the
#: dtype, so that arrays of one shape have the same chunks): chosen by measurement
#: (``benchmarks/arrays.py``'s chain, 2 cores): a chunk must hold far more work than a push
#: (about 5 µs): 1 MiB of float64 is 0.2-1 ms of elementwise work per step.
CHUNK_BYTES = 1 << 20

#: The bytes of one block of a kernel's evaluation (per operand): scratch blocks of this size
#: stay in the core's cache (L2/L3) between the steps of a chain. Chosen by measurement (the
#: chain on 2 workers, NumPy time over ours): 128 KiB 1.6-1.7x, 256 KiB 1.8-2.3x, 512 KiB
#: 1.9-2.4x, 1 MiB 2.1-3.3x at 1e6 elements; 2.2-2.5x at 256 KiB against 3.0-3.1x at 1 MiB on
#: 8e6. Each step of each block is a NumPy call between which a worker needs the GIL back:
#: fewer, larger blocks mean fewer hand-offs between the two workers.
BLOCK_BYTES = 1 << 20

#: The elements of a NumPy scratch block (at least one block of any kernel: blocks are at most
#: :data:`BLOCK_BYTES` of a dtype of 8 bytes or more).
SCRATCH_ELEMS = BLOCK_BYTES // 8

#: The scratch blocks of each dtype a worker thread keeps between kernels (a chain needs two or
#: three: each step writes into a block its operand leaves).
SCRATCH_KEPT = 4

_local = threading.local()


def _scratch() -> dict[np.dtype[Any], list[Any]]:
    """This thread's free scratch blocks, by dtype: kept between kernels because a fresh block
    is fresh memory (page faults, a cold cache) on every kernel, which cost a chain at 1e6
    elements about a third of its time. (A thread that ran a kernel at its sync point,
    ``Program.run_here``, keeps a few too: :data:`SCRATCH_KEPT` of at most a chunk each.)"""
    try:
        free: dict[np.dtype[Any], list[Any]] = _local.free
    except AttributeError:
        free = _local.free = {}
    return free


#: The most steps one kernel's program holds (a longer chain pushes a new kernel per chunk).
FUSE_STEPS = 64

_NORMAL = FnProperty.NORMAL
_ASYNC = FnProperty.ASYNC
# Guards what kernels of several chunks of one Buffer write at once: the allocation of its
# value (by whichever materialises a chunk first) and its first failure (or a partials' one).
_alloc_lock = threading.Lock()


#: The most chunks an array is cut into: a larger array has larger chunks, so that an
#: operation costs at most this many joins or pushes on the calling thread (a push or a join
#: holds the event loop for a few µs; 16 chunks keep two to eight workers busy).
MAX_CHUNKS = 16


def chunking(size: int, chunk_elems: int) -> tuple[int, int]:
    """The number of chunks of an array of ``size`` elements, and the elements of each (the
    last one may be shorter): ``chunk_elems``, or more to stay within :data:`MAX_CHUNKS`.
    Arrays of one size are cut alike."""
    elems = max(chunk_elems, -(-size // MAX_CHUNKS))
    return max(1, -(-size // elems)), elems


_CPU = DeviceType.CPU
_DONE = OpState.DONE

# An operand reference in a step: (kind, index or value).
_IN = 0  # an input Buffer of the kernel, by index into ``inputs``
_REG = 1  # the result of an earlier step, by its index
_CONST = 2  # a Python scalar, as it is
_EXP = 3  # a small input broadcast to the result's shape, by index into ``expands`` (CPU only)
_KINDS = ("in", "reg", "const")  # each kind's name in a program for CuPy (``_cupy_fuse.py``)


class Partials:
    """The per-chunk partial results of a fused reduction (``sum``, ``var``, ``argmax``, ...;
    what each block computes and how they combine: ``_reducers.py``): each chunk's kernel
    writes its own entry, the block results in order; the reduction's own operation
    (:class:`Combine`) reads them all once every kernel has run."""

    __slots__ = ("failure", "parts")

    def __init__(self, n: int) -> None:
        #: Per chunk, the results of its blocks in order (None until its kernel ran): a list,
        #: or an array where the compiled runner computed them.
        self.parts: list[list[Any] | np.ndarray[Any, Any] | None] = [None] * n
        #: Why a kernel could not compute its partial (the first one wins).
        self.failure: BaseException | None = None


def _no_buffer() -> None:
    return None


class _Step:
    """One elementwise operation, or a reduction of one chunk, in a kernel's program."""

    __slots__ = (
        "dtype",
        "expands",
        "fn",
        "name",
        "operands",
        "out",
        "reduce",
        "rows",
        "sink",
        "ufunc",
    )

    def __init__(
        self,
        fn: Callable[..., Any],
        name: str,
        operands: tuple[tuple[int, Any], ...],
        out: Callable[[], Buffer | None],
        dtype: np.dtype[Any],
        sink: Partials | None = None,
        rows: bool = False,
        reduce: Reduce | None = None,
    ) -> None:
        self.fn = fn
        #: The result's dtype (a reduction's: its own where the runner may compute it,
        #: ``reduce``; else float64, for no block of its own).
        self.dtype = dtype
        #: Whether ``fn`` is a ufunc, or takes ``out=`` as one does (a function with a
        #: ``takes_out`` attribute), then called with ``out=``.
        self.ufunc = sink is None and (type(fn) is np.ufunc or hasattr(fn, "takes_out"))
        self.name = name
        self.operands = operands
        #: Whether an operand is broadcast (then the step computes on rows of the result).
        self.expands = False
        for kind, _ in operands:
            if kind == _EXP:
                self.expands = True
        #: Whether it needs blocks of whole rows (a broadcast operand, a reduction along the
        #: first axis).
        self.rows = rows or self.expands
        #: The result's Buffer, weakly: dead means nobody can read it (not materialised).
        self.out = out
        #: A reduction's partials (then ``fn`` reduces a block to a scalar; no Buffer).
        self.sink = sink
        #: A reduction's partial as the compiled runner may compute it (``_numpy_fuse``).
        self.reduce = reduce


def _same_powers() -> dict[float, np.ufunc]:
    """Of ``x ** 2``, ``x ** 0.5`` and ``x ** -1``, those this NumPy's ``power`` computes as
    ``square``, ``sqrt`` and ``reciprocal`` do, bit for bit (signed zeros, infinities, nan and
    rounding: NumPy 2.4's loops do; older ones give ``(-0.0) ** 0.5`` as +0.0, which ``sqrt``
    does not), checked once on float32 and float64 probes."""
    rng = np.random.default_rng(0)
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-300, 1e300, 1.0, -1.0, 0.5]
    probe = np.concatenate(
        [specials, rng.standard_normal(256) * 10.0 ** rng.integers(-30, 30, 256)]
    )
    same: dict[float, np.ufunc] = {}
    with np.errstate(all="ignore"):
        for c, fn in ((2, np.square), (0.5, np.sqrt), (-1, np.reciprocal)):
            if all(
                np.array_equal(np.power(x, c), fn(x), equal_nan=True)
                and np.array_equal(np.signbit(np.power(x, c)), np.signbit(fn(x)))
                for x in (probe.astype(np.float64), probe.astype(np.float32))
            ):
                same[c] = fn
    return same


#: ``x ** c`` of a float32 or float64 ``x`` and these constants ``c``: the same results from a
#: cheaper function (about half the time of ``pow`` on a block), where :func:`_same_powers`
#: found them equal. (Not float16: ``sqrt`` rounds twice there.)
_POWERS: dict[float, np.ufunc] = _same_powers()
_EXACT_POWERS = (np.dtype(np.float32), np.dtype(np.float64))


def _power(
    refs: tuple[tuple[int, Any], ...], xdtype: np.dtype[Any], dtype: np.dtype[Any]
) -> tuple[Callable[..., Any], tuple[tuple[int, Any], ...]]:
    """The step ``power(x, c)`` (``refs``; ``x`` of ``xdtype``, the result of ``dtype``) as
    :data:`_POWERS` has it where it applies: about half the time of ``pow`` on a block."""
    c = refs[1][1]
    if xdtype == dtype and dtype in _EXACT_POWERS and type(c) in (int, float) and c in _POWERS:
        return _POWERS[c], refs[:1]
    return np.power, refs


class Program:
    """The steps of one fused chain, shared by its kernels, one per chunk (see the module
    docstring): a later elementwise operation joins it once for every chunk. Guarded by
    ``lock``: joins run on the pushing thread, the kernels on workers."""

    __slots__ = (
        "__weakref__",
        "device",
        "expands",
        "inputs",
        "kernels",
        "known",
        "lock",
        "n",
        "plans",
        "risky",
        "shape",
        "size",
        "started",
        "steps",
        "vars",
        "writers",
    )

    def __init__(self, device: Context, shape: tuple[int, ...], n: int) -> None:
        #: Where its kernels run: a step of another device never joins.
        self.device = device
        #: The shape and elements of the arrays it computes (a step of another size never
        #: joins: the chunks are cut alike only in arrays of one size), and their number of
        #: chunks.
        self.shape = shape
        self.size = math.prod(shape)
        self.n = n
        #: The kernels, by chunk (appended as they are pushed, before any step joins), their
        #: Vars and their operations (every result's ``vars`` and chunk writers).
        self.kernels: list[ChainKernel] = []
        self.vars: tuple[Var, ...] = ()
        self.writers: tuple[Operation[Any], ...] = ()
        #: Input Buffers, read (each kernel holds a read on each one's Var for its chunk).
        self.inputs: list[Buffer] = []
        #: The inputs the kernels hold a turn on (the first step's arrays; those joined later
        #: are read without one) that were not :func:`settled` then, a bit per index: a
        #: write pending on one may fail, and skip the kernels. So every step must depend on
        #: each of them (:meth:`_operands`), or it would fail with them.
        self.risky = 0
        #: The broadcast operands: (the index of its Buffer in ``inputs``, the view's steps).
        #: Each is small and unchunked, and each kernel reads it whole.
        self.expands: list[tuple[int, tuple[Any, ...]]] = []
        #: Each input and result by ``id()``: (kind, index, the input or a weak reference to
        #: the result, its ``wgen`` when the program started reading or made it). A step may
        #: join only while those ``wgen`` are unchanged.
        self.known: dict[int, tuple[int, int, Any, int]] = {}
        #: The steps, in push order.
        self.steps: list[_Step] = []
        self.lock = threading.Lock()
        #: The steps encoded for NumPy's loops (``_numpy_fuse.py``) by which results are live
        #: (None: the runner does not take them), filled by the first kernel of each (a race
        #: encodes one twice).
        self.plans: dict[tuple[bool, ...], Plan | None] = {}
        #: The kernels started: nothing joins once one has; the last to start lets go of
        #: ``inputs``, ``known``, ``steps`` and ``kernels`` (each kernel holds its own
        #: references).
        self.started = 0

    # -- recording (the pushing thread) --------------------------------------------------------

    def _entry(self, buf: Buffer) -> tuple[int, int, Any, int] | None:
        """``buf``'s entry in ``known``, if it is this very Buffer (a dead result's id may be
        reused)."""
        entry = self.known.get(id(buf))
        if entry is not None and (entry[2]() if entry[0] == _REG else entry[2]) is buf:
            return entry
        return None

    def _operands(
        self, operands: Sequence[Any], bufs: Sequence[Buffer | None], new: bool
    ) -> tuple[tuple[int, Any], ...] | None:
        """The step's operand references, or None if it cannot join (an array the program
        neither reads nor makes, or one written since; a step that depends on neither a result
        nor every ``risky`` input), and then nothing changed. ``new``: the program's first
        step (every array is an input, read with a turn)."""
        entries: list[tuple[int, int, Any, int] | None] = []
        depends = new  # on every risky input
        covered = 0  # (a bit per input read directly)
        for x, buf in zip(operands, bufs, strict=True):
            if buf is None:
                entries.append(None)
                continue
            entry = self._entry(buf)
            entries.append(entry)
            if entry is None:
                # An array the kernels hold no turn on: they may read it still if its value is
                # computed and no write is pending (then they read what the step would), and a
                # write pushed later waits for them (``Buffer.readers``).
                if not new and not quiescent(buf):
                    return None
                continue
            kind, index, _, gen = entry
            if kind == _REG:
                depends = True  # (each result depends on them all, as the first step)
            else:
                covered |= 1 << index
            if gen != buf.wgen or (kind == _IN and not new and buf.exposed):
                return None  # written since the program read it, or raw pushes may
            if kind == _REG and (steps_of(x) or learnt_shape(x) != self.shape):
                return None  # a view of a result: its own operation reads it
        if not depends and self.risky & ~covered:
            # It reads none of the program's results, nor every risky input: if one failed,
            # the engine would skip the kernels and fail it too, though it reads none of that
            # input's data (an operation pushed after a chain whose input then fails).
            return None
        refs: list[tuple[int, Any]] = []
        for x, buf, entry in zip(operands, bufs, entries, strict=True):
            if buf is None:
                refs.append((_CONST, x.value))
                continue
            # A broadcast operand (``_push.py`` checked that it may be one): a view, or smaller.
            steps = steps_of(x)
            bcast = bool(steps) or learnt_shape(x) != self.shape
            if entry is None:  # (unless an operand named twice: the first made it an input)
                entry = self._entry(buf)
            if entry is None:
                if not new:
                    for kernel in self.kernels:  # (pushed before any later step joins)
                        assert kernel.op is not None
                        buf.read_unheld(kernel.chunk, kernel.var, kernel.op)
                kind, index = _IN, len(self.inputs)
                self.inputs.append(buf)
                self.known[id(buf)] = (_IN, index, buf, buf.wgen)
            else:
                kind, index = entry[0], entry[1]
            refs.append(self._expand(index, steps) if bcast else (kind, index))
        if new:
            for i, buf in enumerate(self.inputs):
                if not settled(buf, ""):
                    self.risky |= 1 << i
        return tuple(refs)

    def _open(self) -> bool:
        """Whether steps may join: no kernel has started, or been skipped or cancelled by the
        engine (which never starts it: a step joined then would share its Var, and fail)."""
        if self.started:
            return False
        for kernel in self.kernels:
            op = kernel.op
            if op is not None and op.done():
                return False
        return True

    def _expand(self, index: int, steps: tuple[Any, ...]) -> tuple[int, int]:
        """The reference to input ``index`` seen through ``steps``, broadcast."""
        expands = self.expands
        for i, (j, s) in enumerate(expands):
            if j == index and s == steps:
                return (_EXP, i)
        expands.append((index, steps))
        return (_EXP, len(expands) - 1)

    def add(
        self,
        fn: Callable[..., Any],
        name: str,
        operands: Sequence[Any],
        bufs: Sequence[Buffer | None],
        out: Buffer,
        dtype: np.dtype[Any],
        new: bool = False,
    ) -> bool:
        """Add the step ``fn(*operands)`` making ``out``; False (nothing changed) if it may
        not join (a kernel started, or the rule forbids it)."""
        with self.lock:
            if len(self.steps) >= FUSE_STEPS or out.shape != self.shape or not self._open():
                return False
            refs = self._operands(operands, bufs, new)
            if refs is None:
                return False
            if fn is np.power and refs[1][0] == _CONST and bufs[0] is not None:
                fn, refs = _power(refs, bufs[0].dtype, dtype)
            ref = weakref.ref(out)
            self.known[id(out)] = (_REG, len(self.steps), ref, out.wgen)
            self.steps.append(_Step(fn, name, refs, ref, dtype))
            return True

    def add_reduction(
        self,
        fn: Callable[..., Any],
        name: str,
        x: Any,
        buf: Buffer,
        sink: Partials,
        new: bool = False,
        rows: bool = False,
        reduce: tuple[Reduce, np.dtype[Any]] | None = None,
    ) -> bool:
        """Add the reduction of ``x``'s chunks by ``fn`` into ``sink`` (``rows``: along the
        first axis, block by block of whole rows; ``reduce``: the runner's form of ``fn`` and
        the result's dtype, where it has one); False if it may not join (as :meth:`add`)."""
        with self.lock:
            if len(self.steps) >= FUSE_STEPS or x.shape != self.shape or not self._open():
                return False
            refs = self._operands((x,), (buf,), new)
            if refs is None:
                return False
            loop, dtype = (None, np.dtype(np.float64)) if reduce is None else reduce
            self.steps.append(_Step(fn, name, refs, _no_buffer, dtype, sink, rows, loop))
            return True

    def run_here(self, writer: Operation[Any] | None) -> bool:
        """At a sync point on a result whose latest write is ``writer`` (``await`` on the
        loop's thread, or a thread of the user's about to block; None: on a reduction's
        result, whose combine reads the kernel's Var, ``Buffer.reduction``): if that
        is this program's one kernel (a program of one chunk, on the CPU: an array of at
        most ``chunk_elems`` elements), still queued for a worker, run it on the calling
        thread now
        (:meth:`~aioengine.Operation.run_here`); return whether it ran and computed (its
        operation DONE: the caller may read the results without the engine). Its burst ends
        here for it: the caller has stopped recording. At 20,000 elements that saves two
        hand-offs of 0.05-0.15 ms each, against 0.1 ms of compute. A program of several
        chunks is left to the workers (woken by the loop's next iteration, or by the push
        off the loop): one chunk here would hold them back until it is done."""
        if self.n != 1 or self.started or self.device.device_type is not _CPU:
            return False
        # ``started`` and ``kernels`` are read without ``lock``: a hint only. Whether the
        # kernel is still queued is decided under its pool's lock (ThreadExecutor.unqueue).
        kernels = self.kernels
        if not kernels:
            return False
        kernel = kernels[0]
        if writer is None:
            writer = kernel.op
        if writer is None or kernel.op is not writer:
            return False
        burst, kernel.burst = kernel.burst, None
        if not writer.run_here():
            # A worker took it: it waits for the burst, or has read None and starts at once
            # (either is right: the caller is at a sync point).
            kernel.burst = burst
            return False
        return writer.state is _DONE

    def start(
        self,
    ) -> tuple[list[_Step], list[Buffer], list[tuple[int, tuple[Any, ...]]]]:
        """A kernel starts: nothing joins any more. The steps, the inputs and the broadcast
        operands."""
        with self.lock:
            self.started += 1
            taken = self.steps, self.inputs, self.expands
            if self.started == self.n:  # the last kernel: the program lets go
                self.steps, self.inputs, self.known, self.kernels = [], [], {}, []
                self.expands = []
            return taken


class _Rows:
    """How a kernel's blocks meet the broadcast operands of its program: as rows of the
    result's shape (``row`` elements each; a block is whole rows)."""

    __slots__ = ("by_row", "row", "tail", "values")

    def __init__(self, shape: tuple[int, ...], values: list[Any]) -> None:
        self.tail = shape[1:]
        self.row = math.prod(self.tail)
        #: The broadcast operands' values, and whether each one's rows follow the result's
        #: (then sliced by block; else the same for every row, read whole).
        self.values = values
        self.by_row = [v.ndim == len(shape) and v.shape[0] == shape[0] > 1 for v in values]

    def seen(self, i: int, start: int, stop: int) -> Any:
        """Broadcast operand ``i`` for the block ``start:stop`` of the flat result."""
        value = self.values[i]
        if self.by_row[i]:
            return value[start // self.row : stop // self.row]
        return value

    def shaped(self, step: _Step, args: list[Any], dest: Any, m: int) -> Any:
        """``dest`` and, in place in ``args``, the step's flat blocks as rows."""
        shape = (m // self.row, *self.tail)
        for j, (kind, _) in enumerate(step.operands):
            if kind in (_IN, _REG):
                args[j] = args[j].reshape(shape)
        return dest.reshape(shape)


class ChainKernel:
    """The operation that computes one chunk of a :class:`Program`'s results (see the module
    docstring): the function pushed for it."""

    __slots__ = ("burst", "chunk", "engine", "gen", "hi", "lo", "op", "program", "var")

    def __init__(
        self, engine: Engine, program: Program, chunk: int, lo: int, hi: int, var: Var
    ) -> None:
        self.engine = engine
        self.program = program
        self.chunk = chunk
        self.lo = lo
        self.hi = hi
        #: The Var this kernel writes: every result's Var for this chunk.
        self.var = var
        self.op: Operation[Any] | None = None
        #: The :class:`Burst` it was pushed in (its pushing thread's, None inside an
        #: operation), and its ``gen`` (written before the push; ``burst`` cleared as it runs).
        self.burst: Burst | None = None
        self.gen = 0

    # -- running (a worker thread) -------------------------------------------------------------

    def __call__(self, rctx: RunContext) -> None:
        burst = self.burst
        if burst is not None:  # let the chain's later steps join first (``_burst.py``)
            self.burst = None
            burst.wait(self.gen)
        steps, inputs, expands = self.program.start()
        if rctx.stream is None:
            prepared = self._prepare(steps, inputs, expands, np)
            if prepared is not None:
                self._evaluate(steps, *prepared, rctx, np)
        else:
            self._enqueue(steps, inputs, rctx)

    def _enqueue(self, steps: list[_Step], inputs: list[Buffer], rctx: RunContext) -> None:
        """On a GPU (the operation's stream current): enqueue the program as one kernel.

        The objects now (the inputs' values, the live results allocated), the contents on
        the device, as ``_kernel.py`` says. With CuPy, one ``cupy.fuse`` kernel when every
        step is a ufunc CuPy has (``_cupy_fuse.py``), else one CuPy call per step, each
        enqueued. Where the GPU's arrays are NumPy's (the simulated GPU), the evaluation of
        the CPU, launched on the stream."""
        numpy = numpy_on_gpu(self.engine)
        xp = np if numpy else cupy_module()
        prepared = self._prepare(steps, inputs, [], xp)  # (broadcast operands: CPU only)
        if prepared is None:
            return
        outs, values, flat, _ = prepared
        if numpy:
            rctx.launch(self._launched, steps, inputs, outs, values, flat, rctx)
            return
        program = [
            (s.fn, tuple((_KINDS[kind], ref) for kind, ref in s.operands)) if s.ufunc else None
            for s in steps
        ]
        if not fused_call(program, values, flat):
            self._evaluate(steps, outs, values, flat, [], rctx, xp)

    def _launched(
        self,
        steps: list[_Step],
        inputs: list[Buffer],
        outs: list[Buffer | None],
        values: list[Any],
        flat: list[Any],
        rctx: RunContext,
    ) -> None:
        """The device work of the program on the simulated GPU: an input's failure found by
        the work that made it (which ran before this) fails the results; else evaluate."""
        if not self._inputs_failed(steps, outs, inputs):
            self._evaluate(steps, outs, values, flat, [], rctx, np)

    def _inputs_failed(
        self, steps: list[_Step], outs: list[Buffer | None], inputs: list[Buffer]
    ) -> bool:
        """Whether an input failed (or was never computed): then every result fails."""
        for buf in inputs:
            failure = input_failure(buf, "a fused chain")
            if failure is not None:
                root = failure.__cause__ if isinstance(failure, DependencyError) else failure
                for step in steps:
                    if step.sink is not None and step.sink.failure is None:
                        dep = DependencyError(
                            f"{step.name} was not computed: an input failed: {root!r}"
                        )
                        dep.__cause__ = root
                        step.sink.failure = dep
                for out, step in zip(outs, steps, strict=True):
                    if out is not None and out.failure is None:
                        dep = DependencyError(
                            f"{step.name} was not computed: an input failed: {root!r}"
                        )
                        dep.__cause__ = root
                        out.failure = dep
                return True
        return False

    def _prepare(
        self,
        steps: list[_Step],
        inputs: list[Buffer],
        expands: list[tuple[int, tuple[Any, ...]]],
        xp: Any,
    ) -> tuple[list[Buffer | None], list[Any], list[Any], list[Any]] | None:
        """The results (None: nobody holds it), the inputs' values (flat), the live
        results' values (flat, allocated by the first kernel to materialise a chunk of one:
        from the pool of ``_pool.py`` where values are NumPy's, else with ``xp``) and the
        broadcast operands' values (as they are seen); None if an input failed (the results
        failed with it)."""
        outs = [step.out() for step in steps]
        if self._inputs_failed(steps, outs, inputs):
            return None
        values: list[Any] = []
        for buf in inputs:
            value = buf.value
            values.append(value.reshape(-1) if value.ndim != 1 else value)
        seen: list[Any] = []
        for index, view in expands:
            value = inputs[index].value
            for step in view:
                value = step(value)
            seen.append(value)
        flat: list[Any] = []
        for out, step in zip(outs, steps, strict=True):
            if out is None:
                flat.append(None)
                continue
            value = out.value
            if value is MISSING:
                with _alloc_lock:
                    value = out.value
                    if value is MISSING:
                        if xp is np:  # a large result reuses a dropped one's memory
                            value = out.value = pooled_empty(out.shape, step.dtype)  # type: ignore[arg-type]
                        else:
                            value = out.value = xp.empty(out.shape, step.dtype)
            flat.append(value.reshape(-1))
        return outs, values, flat, seen

    def _evaluate(
        self,
        steps: list[_Step],
        outs: list[Buffer | None],
        values: list[Any],
        flat: list[Any],
        seen: list[Any],
        rctx: RunContext,
        xp: Any,
    ) -> None:
        """Evaluate the program on this chunk: in cache-sized blocks with NumPy, each step a
        call with ``out=`` into its result's slice (``flat``) or into a scratch block; with
        CuPy, the whole chunk at once (each call enqueued on the current stream). A step with
        a broadcast operand (``seen``) computes on whole rows of the result: every block is
        whole rows then (the chunks are, ``_push.py`` checked)."""
        lo, hi = self.lo, self.hi
        last = _last_uses(steps)
        itemsize = max(8, *(step.dtype.itemsize for step in steps))
        block = min(max(1024, BLOCK_BYTES // itemsize), hi - lo) if xp is np else hi - lo
        rows: _Rows | None = None
        if any(step.rows for step in steps):
            rows = _Rows(self.program.shape, seen)
            block = max(rows.row, block // rows.row * rows.row)
            if xp is np and any(step.reduce is not None for step in steps):
                # Blocks of whole rows and whole BLOCKs, or the whole chunk, where not too
                # large: a sum's partials per BLOCK, as the runner's (else one per block,
                # other bits: a chunk of more than 4 MiB of float64 only).
                limit = 4 * max(block, BLOCK)
                whole = math.lcm(rows.row, BLOCK)
                if whole <= limit:
                    block = min(max(whole, block // whole * whole), hi - lo)
                elif hi - lo <= limit:
                    block = hi - lo
        elif xp is np and self._run_loops(steps, outs, values, flat, last):
            return
        per_block = xp is np and (block % BLOCK == 0 or block >= hi - lo)
        failed: dict[int, BaseException] = {}
        # Scratch blocks not in use, by dtype: a result goes back after its last reader, so
        # each block of the chunk reuses the same few, and NumPy's are this thread's, kept
        # warm between kernels.
        free: dict[np.dtype[Any], list[Any]] = _scratch() if xp is np else {}
        try:
            self._blocks(
                steps, outs, values, flat, rows, rctx, xp, block, per_block, last, failed, free
            )
        finally:
            if xp is np:  # a few blocks of each dtype, none larger than a block of 8 bytes
                for kept in free.values():
                    kept[:] = [b for b in kept[-SCRATCH_KEPT:] if b.shape[0] <= SCRATCH_ELEMS]

    def _run_loops(
        self,
        steps: list[_Step],
        outs: list[Buffer | None],
        values: list[Any],
        flat: list[Any],
        last: list[int],
    ) -> bool:
        """Whether the program ran on this chunk in one call of NumPy's own loops, the GIL
        released (``_numpy_fuse.py``); False where the runner does not take it (then NumPy
        calls evaluate it)."""
        if not available() or any(s.sink is not None and s.reduce is None for s in steps):
            return False
        alive = tuple(out is not None for out in outs)
        plans = self.program.plans
        try:
            encoded = plans[alive]
        except KeyError:

            def program() -> tuple[Any, ...]:
                return tuple(
                    (
                        s.fn if s.reduce is None else s.reduce,
                        tuple((_KINDS[kind], ref) for kind, ref in s.operands),
                        s.dtype,
                    )
                    for s in steps
                )

            dtypes = tuple(v.dtype for v in values)
            try:
                encoded = plan(program, dtypes, alive, last, _structure(steps))
            except Exception:  # (the kernel never raises: NumPy's calls evaluate it)
                encoded = None
            plans[alive] = encoded
        if encoded is None:
            return False
        sinks = [(k, s) for k, s in enumerate(steps) if s.sink is not None]
        if not sinks:
            return run(encoded, values, flat, self.lo, self.hi)
        # Each reduction's partials: one per block of the runner, each starting at the
        # identity; the chunk's entry once the whole program ran (else NumPy's calls redo it).
        blocks = -(-(self.hi - self.lo) // BLOCK)
        flat = list(flat)
        for k, s in sinks:
            assert s.reduce is not None
            flat[k] = np.full(blocks, s.reduce.identity, s.dtype)
        if not run(encoded, values, flat, self.lo, self.hi):
            return False
        for k, s in sinks:
            assert s.sink is not None
            s.sink.parts[self.chunk] = flat[k]
        return True

    def _blocks(
        self,
        steps: list[_Step],
        outs: list[Buffer | None],
        values: list[Any],
        flat: list[Any],
        rows: _Rows | None,
        rctx: RunContext,
        xp: Any,
        block: int,
        per_block: bool,
        last: list[int],
        failed: dict[int, BaseException],
        free: dict[np.dtype[Any], list[Any]],
    ) -> None:
        """The block loop of :meth:`_evaluate` (``per_block``: every block starts a BLOCK
        from the chunk's start, so a ``Reduce`` step's partials are per BLOCK)."""
        lo, hi = self.lo, self.hi
        for start in range(lo, hi, block):
            stop = min(start + block, hi)
            m = stop - start
            regs: list[Any] = [None] * len(steps)
            for k, step in enumerate(steps):
                if k in failed:
                    continue
                args = []
                for kind, ref in step.operands:
                    if kind == _IN:
                        args.append(values[ref][start:stop])
                    elif kind == _REG:
                        args.append(regs[ref])
                    elif kind == _CONST:
                        args.append(ref)
                    else:
                        assert rows is not None
                        args.append(rows.seen(ref, start, stop))
                sink = step.sink
                if sink is not None:
                    try:
                        if step.reduce is not None and per_block:
                            # The runner's partials, per BLOCK: the same bits either way.
                            partial = block_partials(step.reduce, args[0].reshape(-1))
                        else:
                            partial = step.fn(*args)
                    except Exception as exc:
                        self._fail(steps, outs, k, exc, failed, rctx)
                        continue
                    got = sink.parts[self.chunk]
                    if type(got) is list:
                        got.append(partial)
                    else:  # its first block (the runner did not compute this chunk)
                        sink.parts[self.chunk] = [partial]
                    self._release(step, k, last, flat, regs, free)
                    continue
                dest = flat[k]
                dtype = step.dtype
                if dest is not None:
                    dest = dest[start:stop]
                else:
                    dest = self._scratch_dest(step, k, last, flat, regs, dtype)
                    if dest is None:
                        pool = free.get(dtype)
                        got = pool.pop() if pool else None
                        if got is None or got.shape[0] < m:
                            got = xp.empty(max(block, SCRATCH_ELEMS) if xp is np else block, dtype)
                        dest = got[:m]
                try:
                    into = dest
                    if step.expands:  # on whole rows, the broadcast operands as NumPy does
                        assert rows is not None
                        into = rows.shaped(step, args, dest, m)
                    if step.ufunc:
                        step.fn(*args, out=into)
                    else:
                        into[...] = step.fn(*args)
                except Exception as exc:
                    self._fail(steps, outs, k, exc, failed, rctx)
                    continue
                regs[k] = dest
                self._release(step, k, last, flat, regs, free)
                if last[k] < 0 and flat[k] is None:  # never read, nobody holds it
                    base = dest.base if dest.base is not None else dest
                    free.setdefault(dtype, []).append(base)

    @staticmethod
    def _scratch_dest(
        step: _Step, k: int, last: list[int], flat: list[Any], regs: list[Any], dtype: Any
    ) -> Any:
        """The scratch block of an operand that step ``k`` reads for the last time, to write
        its result into (a ufunc computes in place exactly), taken out of ``regs``; None if
        there is none of ``dtype``. The chain then touches two or three blocks, not one per
        step."""
        if not step.ufunc:
            return None
        for kind, ref in step.operands:
            if kind == _REG and last[ref] == k and flat[ref] is None:
                reg = regs[ref]
                if reg is not None and reg.dtype == dtype:
                    regs[ref] = None
                    return reg
        return None

    @staticmethod
    def _release(
        step: _Step,
        k: int,
        last: list[int],
        flat: list[Any],
        regs: list[Any],
        free: dict[np.dtype[Any], list[Any]],
    ) -> None:
        """Scratch blocks of results read for the last time by step ``k`` go back to the
        pool."""
        for kind, ref in step.operands:
            if kind == _REG and last[ref] == k and flat[ref] is None:
                reg = regs[ref]
                if reg is not None:
                    base = reg.base if reg.base is not None else reg
                    free.setdefault(reg.dtype, []).append(base)
                regs[ref] = None

    def _fail(
        self,
        steps: list[_Step],
        outs: list[Buffer | None],
        k: int,
        exc: BaseException,
        failed: dict[int, BaseException],
        rctx: RunContext,
    ) -> None:
        """Step ``k`` raised ``exc``: fail its result and every step reading it, and report
        ``exc`` to the engine once per Buffer (an operation of its own carries it). If nobody
        holds step ``k``'s result (it is never materialised), the first step reading it
        reports ``exc`` instead (a reduction's operation raises it, a result carries it), so
        that a failure nobody awaits is still reported by ``wait_for_all``."""
        step = steps[k]
        exc.add_note(f"in aioengine.array operation {step.name} on {rctx.ctx} (a fused chain)")
        failed[k] = exc
        for j in range(k + 1, len(steps)):
            if any(kind == _REG and ref in failed for kind, ref in steps[j].operands):
                failed[j] = exc
        reported = outs[k] is not None
        for j, err in failed.items():
            root = err
            if j != k:  # a step reading the failed one: not computed
                dep = DependencyError(f"{steps[j].name} was not computed: an input failed: {err!r}")
                dep.__cause__ = err
                err = dep
            report = not reported and root is exc
            sink, out = steps[j].sink, outs[j]
            with _alloc_lock:  # the first failure recorded wins (chunks run at once)
                if sink is not None:  # its reduction's own operation reports its own failure
                    if sink.failure is None:
                        sink.failure = exc if report else err
                        reported = reported or report
                    continue
                if out is None or out.failure is not None:
                    continue
                out.failure = err
            if j == k or report:
                out.carry(root, rctx.ctx, steps[k].name)
                reported = True


def quiescent(buf: Buffer) -> bool:
    """Whether ``buf``'s value is computed and no write on it is pending: every write on it
    was pushed by the arrays (its Var never handed out) and has finished."""
    if buf.exposed or buf.group is not None or buf.value is MISSING:
        return False
    writer = buf.writer
    if writer is not None and not writer.done():
        return False
    chunked = buf.chunked
    if chunked is None or chunked.writers is None:
        return True
    return all(w.done() for w in chunked.writers)


def settled(buf: Buffer, name: str) -> bool:
    """Whether ``buf`` may be read now, without a turn, by an operation ``name`` computed at
    once: :func:`quiescent`, and healthy (no failure, none learnt from a skipped write)."""
    return quiescent(buf) and input_failure(buf, name) is None


def _structure(steps: Sequence[_Step]) -> tuple[Any, ...]:
    """The structure of ``steps`` as :func:`~._numpy_fuse.plan` caches it (each step's
    function, operands with a scalar by its bits, and dtype), in one pass: a new program (every
    iteration of the user's loop makes one) looks its plan up with it."""
    key = []
    for s in steps:
        operands = s.operands
        for kind, _ in operands:
            if kind == _CONST:
                operands = tuple((k, bits(r) if k == _CONST else r) for k, r in operands)
                break
        key.append((s.fn if s.reduce is None else s.reduce, operands, s.dtype))
    return tuple(key)


def _last_uses(steps: Sequence[_Step]) -> list[int]:
    """For each step, the index of the last step reading its result (-1: none)."""
    last = [-1] * len(steps)
    for j, step in enumerate(steps):
        for kind, ref in step.operands:
            if kind == _REG:
                last[ref] = j
    return last


def _program_for(
    candidates: list[Program | None],
    add: Callable[[Program, bool], bool],
    engine: Engine,
    submit: Callable[..., Operation[Any]],
    device: Context,
    name: str,
    shape: tuple[int, ...],
    n: int,
    chunk_elems: int,
    burst: Burst | None,
) -> Program:
    """The program that computes a step (``add`` adds it) on every chunk: the first of
    ``candidates`` it joins, else a new one whose kernels (one per chunk) are pushed with
    ``submit``, each reading its inputs' Vars for its chunk (in ``burst``, the pushing
    thread's)."""
    for candidate in candidates:
        if (
            candidate is not None
            and (candidate.device is device or candidate.device == device)
            and add(candidate, False)
        ):
            return candidate
    program = Program(device, shape, n)
    size = program.size
    add(program, True)
    # (Locals: once the last kernel is pushed, all may have started, and the program let go.)
    inputs = program.inputs
    vars_: list[Var] = []
    writers: list[Operation[Any]] = []
    for i in range(n):
        lo = i * chunk_elems
        kernel = ChainKernel(
            engine, program, i, lo, min(lo + chunk_elems, size), engine.new_var(name)
        )
        reads: list[Any] = []
        for buf in inputs:
            bvars = buf.vars
            bvar = bvars[i] if len(bvars) > 1 else bvars[0]
            if bvar not in reads:  # results of one program share its kernel's Var
                reads.append(bvar)
        if burst is not None:
            kernel.burst = burst
            kernel.gen = burst.gen
        program.kernels.append(kernel)
        kernel.op = submit(kernel, device, reads, (kernel.var,), _NORMAL, name, None)
        vars_.append(kernel.var)
        writers.append(kernel.op)
    program.vars = tuple(vars_)
    program.writers = tuple(writers)
    return program


def join_or_push(
    submit: Callable[..., Operation[Any]],
    engine: Engine,
    chunk_elems: int,
    recent: Program | None,
    burst: Burst | None,
    fn: Callable[..., Any],
    name: str,
    operands: Sequence[Any],
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
    device: Context,
) -> Buffer:
    """The Buffer of ``fn(*operands)`` (arrays of ``shape`` and Consts), chunked: a step
    joined, for every chunk at once, to a program that makes or reads its operands (the
    operands' own, then ``recent``: the program of the namespace's latest chunked result),
    else a new program whose kernels are pushed with ``submit`` (the namespace's push; in
    ``burst``, the pushing thread's)."""
    if burst is not None:
        burst.enter(engine, device)
    try:
        size = math.prod(shape)
        n, chunk_elems = chunking(size, chunk_elems)
        bufs = [buffer_of(x) for x in operands]
        out = Buffer(engine, None, shape, dtype, MISSING, name=name)  # type: ignore[arg-type]

        def add(program: Program, new: bool) -> bool:
            return program.add(fn, name, operands, bufs, out, dtype, new)

        candidates = [
            buf.chunked.program for buf in bufs if buf is not None and buf.chunked is not None
        ]
        candidates.append(recent)
        program = _program_for(
            candidates, add, engine, submit, device, name, shape, n, chunk_elems, burst
        )
        out.cut(chunk_elems, program.vars, program.writers, program)
        return out
    finally:
        if burst is not None:
            burst.touch()  # (a failed push too: the caller is not pushing any more)


class Combine:
    """The operation of a fused reduction: once every chunk's kernel has run (it reads their
    Vars), combine the partials in chunk order, so the result does not depend on which chunk
    finished first."""

    __slots__ = ("combine", "count", "dtype", "name", "out", "per_block", "sink")

    def __init__(
        self,
        combine: Callable[..., Any],
        sink: Partials,
        out: Buffer,
        dtype: np.dtype[Any],
        count: int,
        name: str,
        per_block: bool = False,
    ) -> None:
        self.combine = combine
        self.sink = sink
        self.out = out
        self.dtype = dtype
        self.count = count
        self.name = name
        #: Whether the partials are arrays of a partial per BLOCK (a ``Reduce`` step's): one
        #: array of them all is combined.
        self.per_block = per_block

    def __call__(self, rctx: RunContext) -> None:
        out, sink = self.out, self.sink
        failure = sink.failure
        if failure is None and any(p is None for p in sink.parts):
            failure = RuntimeError(f"{self.name}: a chunk was not computed")
        if isinstance(failure, DependencyError):
            out.failure = failure  # the root failure is reported already
            return
        if failure is not None:
            out.failure = failure
            raise failure
        partials: Any = [
            v
            for part in sink.parts
            for v in (part if type(part) is list else (part,))  # (the runner's: an array)
        ]
        if self.per_block:  # (a scalar: the partial of a block not cut in BLOCKs)
            partials = np.concatenate([np.reshape(v, -1) for v in partials])
        try:
            value = self.combine(partials, self.count, self.dtype)
        except Exception as exc:  # (an overflow the pushing context's errstate raises)
            out.failure = exc
            raise
        out.value = np.asarray(value, dtype=self.dtype).reshape(out.shape)


def reduce_chunks(
    submit: Callable[..., Operation[Any]],
    engine: Engine,
    chunk_elems: int,
    recent: Program | None,
    burst: Burst | None,
    fn: Callable[..., Any],
    name: str,
    x: Any,
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
    device: Context,
    options: dict[str, Any],
    rows: bool = False,
) -> Buffer:
    """The Buffer of the reduction ``fn`` (a key of :data:`~._reducers.REDUCERS`) of every
    element of ``x`` (a whole array, not a view), or with ``rows`` along its first axis (a key
    of :data:`~._reducers.ROW_REDUCERS`; every chunk whole rows), with result ``shape`` and
    ``dtype`` and ``options`` (its keywords other than ``dtype``): a step joined to the
    program that makes or reads ``x`` (else a new one), then one operation that combines the
    chunks' partials in chunk order."""
    if burst is not None:
        burst.enter(engine, device)
    try:
        size = math.prod(x.shape)
        n, chunk_elems = chunking(size, chunk_elems)
        block, combine, _, loop = (ROW_REDUCERS if rows else REDUCERS)[fn]
        reduce = None
        if loop is not None and not rows and reduces(x.dtype, dtype):
            reduce = (Reduce(*loop), dtype)  # partials per BLOCK (the runner's, or NumPy's)
        if options:
            combine = functools.partial(combine, **options)
        step_fn = functools.partial(block, dtype, *([tuple(x.shape[1:])] if rows else []))
        buf = buffer_of(x)
        assert buf is not None
        sink = Partials(n)

        def add(program: Program, new: bool) -> bool:
            return program.add_reduction(step_fn, name, x, buf, sink, new, rows, reduce)

        candidates = [None if buf.chunked is None else buf.chunked.program, recent]
        program = _program_for(
            candidates, add, engine, submit, device, name, tuple(x.shape), n, chunk_elems, burst
        )
        reads = program.vars
        out = Buffer(engine, engine.new_var(name), shape, dtype, MISSING, name=name)
        # A sync point on it may run the program's kernel there: weakly, as a pending kernel
        # keeps its program (and the program its inputs) alive, and nothing else should.
        out.reduction = weakref.ref(program)
        count = x.shape[0] if rows else size
        out.writer = submit(
            Combine(combine, sink, out, dtype, count, name, reduce is not None),
            device,
            reads,
            (out.var,),
            _ASYNC,
            name,
            None,
        )
        return out
    finally:
        if burst is not None:
            burst.touch()  # (a failed push too: the caller is not pushing any more)
