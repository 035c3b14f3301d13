"""One pass of NumPy's own loops per fused chain on the CPU, without the GIL.

A fused chain (``_chain.py``) evaluated with NumPy calls pays a Python call and a GIL hand-off
per step and per block: about 1 µs each, 14 calls per block for the benchmark's chain, and two
workers taking turns at the GIL between them (a caller spinning in Python holds it for up to
``sys.getswitchinterval()`` at each turn). Here the same program runs on a chunk in one call of
the compiled runner (``_numpy_loops.pyx``), the GIL released throughout: each step, each
block of :data:`BLOCK` elements, calls the very inner loop NumPy's ufunc calls for those dtypes
(the ``functions`` and ``data`` of NumPy's public ``PyUFuncObject``), so every result is the one
NumPy computes, bit for bit, transcendental functions included.

Which programs: every step a NumPy ufunc of one or two inputs and one output, over inputs and
results of the program's shape (no broadcast operand), or a reduction of one of them to a
partial per block (:class:`Reduce`: ``sum``, ``prod`` and ``mean`` of float32 or float64 in
their own dtype, by the loop NumPy's ``add.reduce`` or ``multiply.reduce`` calls on a block),
and, for the dtypes of
its operands (a Python scalar is weak, as NumPy 2 has it), a loop NumPy resolves to
(``ufunc.resolve_dtypes``) that takes the array operands as they are (no cast), reads
floating-point or complex operands and makes the step's dtype. Anything else (integer loops
among them: some report errors as Python exceptions, ``0 ** -1`` say) is evaluated with NumPy
calls, as without the runner.

Floating-point errors: the runner reports the flags its loops raised; where the caller's
``np.errstate`` (the pushing context's: the engine runs an operation in it) would warn, raise
or call about one of them, the chunk is evaluated again with NumPy calls, which do exactly
that (the inputs are unchanged, the results overwritten).

Available where the wheel compiled the runner, on CPython with NumPy 2, unless the
``AIOENGINE_ARRAY_NUMPY_LOOPS`` environment variable is ``0`` (read at import), and where the
loops found pass a check against NumPy's own calls (:func:`available`); else :data:`RUN` is
None.

State: ``_LOOPS`` (the loops found by ufunc and dtypes), ``_PLANS`` (the plans by program
structure) and ``_available``, filled by any worker (a race makes the same entry twice, and
one of them is kept); each worker thread's scratch blocks (``_local``) are its own.
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

__all__ = (
    "BLOCK",
    "PLANS_MAX",
    "RUN",
    "Plan",
    "Reduce",
    "Step",
    "available",
    "block_partials",
    "plan",
    "reduces",
    "run",
)


def _compiled() -> Callable[..., int] | None:
    """The compiled runner, where the wheel built it (the pure-Python install has none: NumPy
    calls evaluate the chains, ``_chain.py``), NumPy is 2 or later (weak scalars) and
    ``AIOENGINE_ARRAY_NUMPY_LOOPS`` is not ``0``."""
    setting = os.environ.get("AIOENGINE_ARRAY_NUMPY_LOOPS", "").strip()
    if setting not in ("", "0", "1"):
        raise ValueError(
            "AIOENGINE_ARRAY_NUMPY_LOOPS must be 1 (the default: fused chains run NumPy's "
            f"loops without the GIL where the wheel compiled them) or 0 (NumPy calls), got "
            f"{setting!r}"
        )
    if setting == "0":
        return None
    try:
        from ._numpy_loops import run
    except ImportError:
        return None
    return run if int(np.__version__.split(".")[0]) >= 2 else None


#: The compiled runner (None: not compiled, or not usable here; see :func:`available`).
RUN = _compiled()

#: Elements per block: the blocks of a chain's intermediates stay in the core's L1/L2 cache
#: between its steps. Chosen by measurement (the benchmark's chain, 1e6 float64, two threads):
#: 512 to 8192 elements within 5 % of each other, 2.0-2.2 ms against 2.7 ms for the best
#: blocking of NumPy calls.
BLOCK = 2048

#: The error flags of the runner, by ``np.errstate`` name.
_FLAGS = (("divide", 1), ("over", 2), ("under", 4), ("invalid", 8))

_IN, _OUT, _REG, _CONST, _PART = 0, 1, 2, 3, 4  # where a slot's array comes from
# The runner's mode of each: moves with the block from the chunk's start; a scratch block,
# reused by every block; one element, read as every element; an element per block.
_MODES = (2, 2, 1, 0, 3)


class Reduce(NamedTuple):
    """The function of a step that reduces its one operand, block by block, to a partial per
    block: ``ufunc``'s loop called as NumPy's ``ufunc.reduce`` calls it (the partial is both
    the first operand and the output, of stride 0), the partial starting at ``identity``, as
    NumPy's does (``add``: ``0.0``, so a block of ``-0.0`` sums to ``0.0``, as in NumPy). Each
    partial is then ``ufunc.reduce`` of its block, bit for bit (``add``'s loop sums pairwise);
    :func:`block_partials` computes the same with NumPy calls."""

    ufunc: np.ufunc
    identity: float


def block_partials(fn: Reduce, values: Any) -> Any:
    """``fn.ufunc.reduce`` of each :data:`BLOCK` of ``values`` (1-D and contiguous; the last
    block may be shorter), in one NumPy call (and one for a shorter last block): the partials
    the runner computes for those elements, the same bits (each row of a C-contiguous 2-D
    array reduced along axis 1 is one call of the loop, as a block is)."""
    n = values.shape[0]
    whole = n - n % BLOCK
    parts = fn.ufunc.reduce(values[:whole].reshape(-1, BLOCK), axis=1)
    if whole == n:
        return parts
    return np.append(parts, fn.ufunc.reduce(values[whole:]))


#: The dtypes whose reductions have partials per block (float16 sums in float32 inside NumPy's
#: loop, with roundings of its own; complex is left to NumPy's calls).
_REDUCED = (np.dtype(np.float32), np.dtype(np.float64))


def reduces(operand: np.dtype[Any], result: np.dtype[Any]) -> bool:
    """Whether a :class:`Reduce` step of an operand of dtype ``operand`` into ``result`` has
    partials per :data:`BLOCK` (the runner's, or :func:`block_partials`)."""
    return operand == result and result in _REDUCED


class _UFuncObject(ctypes.Structure):
    """The head of NumPy's public ``PyUFuncObject`` (``numpy/ufuncobject.h``), to the
    ``types`` field: checked against the ufunc's Python attributes before use."""

    _fields_ = (
        ("ob_refcnt", ctypes.c_ssize_t),
        ("ob_type", ctypes.c_void_p),
        ("nin", ctypes.c_int),
        ("nout", ctypes.c_int),
        ("nargs", ctypes.c_int),
        ("identity", ctypes.c_int),
        ("functions", ctypes.POINTER(ctypes.c_void_p)),
        ("data", ctypes.POINTER(ctypes.c_void_p)),
        ("ntypes", ctypes.c_int),
        ("reserved1", ctypes.c_int),
        ("name", ctypes.c_char_p),
        ("types", ctypes.POINTER(ctypes.c_char)),
    )


#: The loops found: (ufunc, operand dtypes as the step sees them) -> (the loop's address, its
#: data, the loop's dtypes), or None where no loop takes them as they are.
_LOOPS: dict[tuple[Any, ...], tuple[int, int, tuple[np.dtype[Any], ...]] | None] = {}


def _loop_table(ufunc: Any) -> dict[tuple[int, ...], tuple[int, int]]:
    """``ufunc``'s inner loops by the type numbers of their operands, read from its C struct;
    empty if the struct does not look as expected (another layout: no loop is used)."""
    if type(ufunc) is not np.ufunc:
        return {}
    head = _UFuncObject.from_address(id(ufunc))
    nargs, ntypes = ufunc.nin + ufunc.nout, ufunc.ntypes
    name = head.name
    if (
        head.nin != ufunc.nin
        or head.nout != ufunc.nout
        or head.nargs != nargs
        or head.ntypes != ntypes
        or name is None
        or name.decode() != ufunc.__name__
    ):
        return {}
    table: dict[tuple[int, ...], tuple[int, int]] = {}
    for i, sig in enumerate(ufunc.types):
        nums = tuple(head.types[i * nargs + j][0] for j in range(nargs))
        chars = sig.replace("->", "")
        if len(chars) != nargs or nums != tuple(np.dtype(c).num for c in chars):
            return {}
        function = head.functions[i]
        if function:
            table.setdefault(nums, (function, head.data[i] or 0))
    return table


def _loop(
    ufunc: np.ufunc, dtypes: tuple[Any, ...], out: np.dtype[Any]
) -> tuple[int, int, tuple[np.dtype[Any], ...]] | None:
    """The loop NumPy runs for ``ufunc`` on operands of ``dtypes`` (a dtype, or ``float``,
    ``int``, ``bool`` or ``complex`` for a Python scalar), if it takes the array operands as
    they are and makes ``out``; None otherwise."""
    key = (ufunc, dtypes, out)
    try:
        return _LOOPS[key]
    except KeyError:
        pass
    found: tuple[int, int, tuple[np.dtype[Any], ...]] | None = None
    try:
        resolved = ufunc.resolve_dtypes((*dtypes, None))
    except Exception:
        resolved = None
    if (
        resolved is not None
        and resolved[-1] == out
        and all(d.kind in "fc" for d in resolved[:-1])
        and out.kind in "fcb"
        and all(isinstance(d, type) or d == r for d, r in zip(dtypes, resolved, strict=False))
    ):
        entry = _loop_table(ufunc).get(tuple(d.num for d in resolved))
        if entry is not None:
            found = (*entry, tuple(resolved))
    _LOOPS[key] = found
    return found


class Plan:
    """A program encoded for the runner, for one set of live results: ``code`` (per step,
    the loop, its data, its operands' slots), the ``slots`` (per slot, where its array comes
    from), each slot's mode for the runner, and the scratch blocks' dtypes."""

    __slots__ = ("code", "modes", "regs", "slots")

    def __init__(
        self, code: list[int], slots: list[tuple[int, Any]], regs: list[np.dtype[Any]]
    ) -> None:
        self.code = np.array(code, dtype=np.int64)
        #: Per slot: (_IN, input index), (_OUT, step index: its live result), (_REG, scratch
        #: index), (_CONST, a 1-element array of the loop's dtype) or (_PART, step index: a
        #: reduction's partials, an element per block, filled with its identity by the
        #: caller: ``flat`` holds them at the step's index).
        self.slots = slots
        self.modes = np.array([_MODES[kind] for kind, _ in slots], dtype=np.int64)
        #: Per scratch index: its dtype, and its place among the scratch blocks of that dtype
        #: (the worker thread's blocks of a dtype are numbered alike in every plan).
        self.regs: list[tuple[np.dtype[Any], int]] = [
            (dtype, regs[:i].count(dtype)) for i, dtype in enumerate(regs)
        ]


#: The most plans kept (a program of another structure beyond it clears the cache).
PLANS_MAX = 256

#: The plans made, by the program's structure (steps, with each scalar by its type and bits:
#: ``1``, ``1.0`` and ``True`` are equal, and so are ``0.0`` and ``-0.0``; input dtypes; live
#: results).
_PLANS: dict[tuple[Any, ...], Plan | None] = {}

Step = tuple[Any, tuple[tuple[str, Any], ...], np.dtype[Any]]


def bits(value: Any) -> tuple[Any, ...]:
    """A Python scalar as a key: its type and its bits (the sign of a zero, and a nan's sign
    and payload, are bits too: ``float.hex`` says ``nan`` of every nan), where ``==`` would
    equate scalars that are different constants to a loop."""
    if type(value) is float:
        return (float, _DOUBLE.pack(value))
    if type(value) is complex:
        return (complex, _DOUBLE.pack(value.real), _DOUBLE.pack(value.imag))
    return (type(value), value)


_DOUBLE = struct.Struct("<d")


def plan(
    steps: tuple[Step, ...] | Callable[[], tuple[Step, ...]],
    inputs: tuple[np.dtype[Any], ...],
    alive: tuple[bool, ...],
    last: Sequence[int],
    structure: tuple[Any, ...] | None = None,
) -> Plan | None:
    """The plan of a program: ``steps`` as (the function, its operands as ``_cupy_fuse``'s
    ``Operand``, the result's dtype), the ``inputs``' dtypes, whether each step's result is
    live (written to its array) and each step's last reader (``last``; -1: none). None if a
    step is not one the runner takes (see the module docstring). Cached by structure: a loop
    pushes the same program again and again. A caller that knows the structure already
    (``structure``: its steps, each scalar by :func:`bits`, in any one encoding of its own)
    may pass ``steps`` as a function that makes them, called only if the plan is not cached:
    a chain's kernel looks its plan up at every iteration of the user's loop."""
    if structure is None:
        assert not callable(steps)
        structure = tuple(
            (fn, tuple((kind, bits(ref) if kind == "const" else ref) for kind, ref in ops), out)
            for fn, ops, out in steps
        )
    key = (structure, inputs, alive)
    try:
        return _PLANS[key]
    except KeyError:
        pass
    made = _encode(steps() if callable(steps) else steps, inputs, alive, last)
    if len(_PLANS) >= PLANS_MAX:
        _PLANS.clear()
    _PLANS[key] = made
    return made


def _encode(
    steps: tuple[Step, ...],
    inputs: tuple[np.dtype[Any], ...],
    alive: tuple[bool, ...],
    last: Sequence[int],
) -> Plan | None:
    """:func:`plan`, uncached."""
    code: list[int] = []
    slots: list[tuple[int, Any]] = [(_IN, i) for i in range(len(inputs))]
    regs: list[np.dtype[Any]] = []
    free: list[int] = []  # scratch indexes not in use
    where: list[int] = []  # each step's result: its slot
    reg_of: dict[int, int] = {}  # a slot of a scratch block: its scratch index
    for k, (fn, operands, out) in enumerate(steps):
        if type(fn) is Reduce:
            step = _reduction(k, fn, operands, out, inputs, steps, where, slots)
            if step is None:
                return None
            code += step
            where.append(-1)  # no result: nothing reads it
            _free_last(operands, k, last, alive, where, reg_of, free)
            continue
        if type(fn) is not np.ufunc or fn.nout != 1 or fn.nin not in (1, 2):
            return None
        dtypes: list[Any] = []
        for kind, ref in operands:
            if kind == "in":
                dtypes.append(inputs[ref])
            elif kind == "reg":
                dtypes.append(steps[ref][2])
            elif kind == "const" and type(ref) in (bool, int, float, complex):
                dtypes.append(type(ref))
            else:
                return None
        found = _loop(fn, tuple(dtypes), out)
        if found is None:
            return None
        function, data, resolved = found
        args: list[int] = []
        for (kind, ref), dtype in zip(operands, resolved, strict=False):
            if kind == "in":
                args.append(ref)
            elif kind == "reg":
                args.append(where[ref])
            else:
                # A scalar the loop's dtype cannot hold as it is (an overflow, an underflow,
                # an invalid value: NumPy's call warns or raises as the caller's errstate
                # says, at every call) is left to NumPy's calls.
                try:
                    with np.errstate(all="raise"):
                        value = np.array([ref], dtype=dtype)
                except (ArithmeticError, ValueError, TypeError):
                    return None
                slots.append((_CONST, value))
                args.append(len(slots) - 1)
        # Scratch blocks read for the last time here go back first: a loop may write in place.
        _free_last(operands, k, last, alive, where, reg_of, free)
        if alive[k]:
            slots.append((_OUT, k))
            slot = len(slots) - 1
        else:
            index = next((i for i in free if regs[i] == out), -1)
            if index >= 0:
                free.remove(index)
            else:
                regs.append(out)
                index = len(regs) - 1
            slots.append((_REG, index))
            slot = len(slots) - 1
            reg_of[slot] = index
            if last[k] < 0:  # never read: its block is free again at once
                free.append(index)
        where.append(slot)
        code += [function, data, len(args) + 1, *args, slot]
    return Plan(code, slots, regs)


def _free_last(
    operands: tuple[tuple[str, Any], ...],
    k: int,
    last: Sequence[int],
    alive: tuple[bool, ...],
    where: list[int],
    reg_of: dict[int, int],
    free: list[int],
) -> None:
    """Put back the scratch blocks that step ``k`` reads for the last time."""
    for kind, ref in operands:
        if kind == "reg" and last[ref] == k and not alive[ref]:
            index = reg_of.get(where[ref])
            if index is not None and index not in free:
                free.append(index)


def _reduction(
    k: int,
    fn: Reduce,
    operands: tuple[tuple[str, Any], ...],
    out: np.dtype[Any],
    inputs: tuple[np.dtype[Any], ...],
    steps: tuple[Step, ...],
    where: list[int],
    slots: list[tuple[int, Any]],
) -> list[int] | None:
    """The code of the reduction step ``k`` (a slot of its partials added to ``slots``), or
    None where the runner does not take it: an operand of another dtype than the result's,
    or a dtype other than float32 and float64."""
    if len(operands) != 1 or not reduces(out, out):
        return None
    if RUN is not None and not _reductions_work():  # (a plan without a runner is not run)
        return None
    ((kind, ref),) = operands
    if kind == "in":
        dtype, slot = inputs[ref], ref
    elif kind == "reg":
        dtype, slot = steps[ref][2], where[ref]
    else:
        return None
    if dtype != out:
        return None
    found = _loop(fn.ufunc, (out, out), out)
    if found is None or found[2] != (out, out, out):
        return None
    slots.append((_PART, k))
    part = len(slots) - 1
    return [found[0], found[1], 3, part, slot, part]


_local = threading.local()


def run(plan: Plan, values: Sequence[Any], flat: Sequence[Any], lo: int, hi: int) -> bool:
    """Run ``plan`` on elements ``lo:hi`` of the program's inputs (``values``, flat) and live
    results (``flat``, by step; a reduction's partials at its step's index: an element per
    :data:`BLOCK` of ``lo:hi``, its identity in each); False if it must be evaluated again
    with NumPy calls (a floating-point error the caller's ``np.errstate`` acts on, or an
    exception a loop set)."""
    assert RUN is not None
    try:
        kept: dict[np.dtype[Any], list[Any]] = _local.blocks
    except AttributeError:
        kept = _local.blocks = {}
    arrays: list[Any] = []
    for kind, ref in plan.slots:
        if kind != _REG and kind != _CONST:
            array = values[ref] if kind == _IN else flat[ref]
            flags = array.flags
            if not (flags.c_contiguous and flags.aligned):
                # NumPy's calls buffer such an array (some loops give other bits when handed
                # strides); the chains' values are contiguous and aligned, by construction.
                return False
            arrays.append(array)
        elif kind == _REG:
            # This thread's own scratch blocks, kept (a fresh block is cold memory).
            dtype, i = plan.regs[ref]
            blocks = kept.setdefault(dtype, [])
            while len(blocks) <= i:
                blocks.append(np.empty(BLOCK, dtype))
            arrays.append(blocks[i])
        else:
            arrays.append(ref)
    raised = RUN(plan.code, arrays, plan.modes, lo, hi - lo, BLOCK)
    if raised < 0:  # a loop set a Python exception: NumPy's call raises it
        return False
    if raised:
        acts: dict[str, object] = dict(np.geterr())
        if any(raised & bit and acts[name] != "ignore" for name, bit in _FLAGS):
            return False
    return True


_available: list[bool] = []
_reductions: list[bool] = []


def _reductions_work() -> bool:
    """Whether the runner's partials are ``ufunc.reduce`` of their blocks here, bit for bit
    (NumPy's reduce calling convention, and its identity): checked once, on float64 and
    float32 sums and products of a few blocks and a short one."""
    if not _reductions:
        _reductions.append(_check_reductions())
    return _reductions[0]


def _check_reductions() -> bool:
    if RUN is None:
        return False
    rng = np.random.default_rng(1)
    for dtype in (np.dtype(np.float64), np.dtype(np.float32)):
        a = (rng.standard_normal(3 * BLOCK + 7) + 2.0).astype(dtype)
        a[:BLOCK] = -0.0  # a block of -0.0 sums to 0.0, as NumPy's does
        for fn in (Reduce(np.add, 0.0), Reduce(np.multiply, 1.0)):
            found = _loop(fn.ufunc, (dtype, dtype), dtype)
            if found is None or found[2] != (dtype, dtype, dtype):
                return False
            slots = [(_IN, 0), (_PART, 0)]
            encoded = Plan([found[0], found[1], 3, 1, 0, 1], slots, [])
            parts = np.full(4, fn.identity, dtype)
            with np.errstate(all="ignore"):
                if RUN(encoded.code, [a, parts], encoded.modes, 0, a.size, BLOCK) < 0:
                    return False
                expected = np.array(
                    [fn.ufunc.reduce(a[i : i + BLOCK]) for i in range(0, a.size, BLOCK)], dtype
                )
            if parts.tobytes() != expected.tobytes():
                return False
    return True


def available() -> bool:
    """Whether the runner is compiled and computes what NumPy's calls do here: checked once,
    on a program of additions, products, a square root and an exponential in float64 and
    float32 (a layout of NumPy's struct this module does not know finds no loop)."""
    if RUN is None:
        return False
    if not _available:
        _available.append(_check())
    return _available[0]


def _check() -> bool:
    rng = np.random.default_rng(0)
    for dtype in (np.dtype(np.float64), np.dtype(np.float32)):
        a = rng.standard_normal(5000).astype(dtype)
        steps = (
            (np.multiply, (("in", 0), ("const", 1.5)), dtype),
            (np.absolute, (("reg", 0),), dtype),
            (np.sqrt, (("reg", 1),), dtype),
            (np.add, (("reg", 2), ("in", 0)), dtype),
            (np.exp, (("reg", 3),), dtype),
        )
        encoded = _encode(steps, (dtype,), (False, False, False, True, True), (1, 2, 3, 4, -1))
        if encoded is None:
            return False
        got = [np.empty_like(a) for _ in steps]
        with np.errstate(all="ignore"):
            run(encoded, (a,), got, 0, a.size)
            c = np.add(np.sqrt(np.absolute(np.multiply(a, 1.5))), a)
            expected = np.exp(c)
        if not (np.array_equal(got[3], c) and np.array_equal(got[4], expected)):
            return False
    return True
