"""Fused chains through NumPy's own loops (``aioengine/array/_numpy_fuse.py``): where the wheel
compiled the runner, a chunk of a fused chain is one call that runs NumPy's inner loops with
the GIL released.

What a user relies on: the values are the ones NumPy's calls give, bit for bit (exponentials,
square roots, complex numbers and comparisons included); a floating-point error that the
pushing context's ``np.errstate`` raises or warns about does so as without the runner; and
anything the runner does not take is computed as before. The plans (which loop, which
scratch block) are checked on both builds; the runner itself where it is compiled
(``nox -s tests_compiled``, which must have it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import aioengine as ae
import aioengine.array as aa
from aioengine.array import _chain, _numpy_fuse

from .conftest import COMPILED
from .helpers import chain

N = 5 * 8192 + 17  # 5 chunks of 8,192 elements and a short one
CHUNK = 8192 * 8
F8 = np.dtype(np.float64)

needs_runner = pytest.mark.skipif(
    not _numpy_fuse.available(), reason="the runner is compiled in the wheel only"
)


def test_the_compiled_build_has_the_runner() -> None:
    if not COMPILED and not os.environ.get("AIOENGINE_EXPECT_COMPILED"):
        pytest.skip("the pure-Python build has no runner: NumPy calls evaluate the chains")
    if int(np.__version__.split(".")[0]) < 2:
        pytest.skip("the runner needs NumPy 2's weak scalars")
    assert _numpy_fuse.RUN is not None
    assert _numpy_fuse.available()
    assert _numpy_fuse._reductions_work()  # partials per block are ufunc.reduce's here


# -- plans (both builds) ---------------------------------------------------------------------

#: The benchmark's chain, as its kernels see it: c = a * 1.5 + b; c = c * c - a;
#: c = sqrt(abs(c)) + 2.0; c = c * b - a * 0.5; c = exp(-c * c) + c.
BENCH_CHAIN: tuple[_numpy_fuse.Step, ...] = (
    (np.multiply, (("in", 0), ("const", 1.5)), F8),
    (np.add, (("reg", 0), ("in", 1)), F8),
    (np.multiply, (("reg", 1), ("reg", 1)), F8),
    (np.subtract, (("reg", 2), ("in", 0)), F8),
    (np.absolute, (("reg", 3),), F8),
    (np.sqrt, (("reg", 4),), F8),
    (np.add, (("reg", 5), ("const", 2.0)), F8),
    (np.multiply, (("reg", 6), ("in", 1)), F8),
    (np.multiply, (("in", 0), ("const", 0.5)), F8),
    (np.subtract, (("reg", 7), ("reg", 8)), F8),
    (np.multiply, (("reg", 9), ("reg", 9)), F8),
    (np.negative, (("reg", 10),), F8),
    (np.exp, (("reg", 11),), F8),
    (np.add, (("reg", 12), ("reg", 9)), F8),
)


def last_uses(steps: tuple[_numpy_fuse.Step, ...]) -> list[int]:
    last = [-1] * len(steps)
    for j, (_, operands, _) in enumerate(steps):
        for kind, ref in operands:
            if kind == "reg":
                last[ref] = j
    return last


def test_a_chain_nobody_holds_runs_in_two_scratch_blocks() -> None:
    alive = (False,) * 13 + (True,)
    plan = _numpy_fuse.plan(BENCH_CHAIN, (F8, F8), alive, last_uses(BENCH_CHAIN))
    assert plan is not None
    assert plan.regs == [(F8, 0), (F8, 1)]
    assert [slot for slot in plan.slots if slot[0] == 1] == [(1, 13)]  # only the result
    # Cached by structure: the same program again is the same plan.
    assert _numpy_fuse.plan(BENCH_CHAIN, (F8, F8), alive, last_uses(BENCH_CHAIN)) is plan


def test_a_result_someone_holds_is_written_where_it_lives() -> None:
    alive = (False, True) + (False,) * 11 + (True,)
    plan = _numpy_fuse.plan(BENCH_CHAIN, (F8, F8), alive, last_uses(BENCH_CHAIN))
    assert plan is not None
    assert [slot for slot in plan.slots if slot[0] == 1] == [(1, 1), (1, 13)]


def test_scalars_of_other_types_are_other_plans() -> None:
    one = ((np.add, (("in", 0), ("const", 1)), F8),)
    one_float = ((np.add, (("in", 0), ("const", 1.0)), F8),)
    a = _numpy_fuse.plan(one, (F8,), (True,), [-1])
    b = _numpy_fuse.plan(one_float, (F8,), (True,), [-1])
    assert a is not None
    assert b is not None
    assert a is not b


def test_a_known_structure_makes_the_steps_only_once() -> None:
    """A chain's kernel looks its plan up by the structure it knows (a scalar by its bits):
    the steps are made on the first lookup only, and ``x * 0.0`` and ``x * -0.0`` are two
    plans there too."""
    made: list[float] = []

    def times(c: float) -> object:
        def steps() -> tuple[Any, ...]:
            made.append(c)
            return ((np.multiply, (("in", 0), ("const", c)), F8),)

        structure = ((np.multiply, ((0, 0), (2, _numpy_fuse.bits(c))), F8),)
        return _numpy_fuse.plan(steps, (F8,), (True,), [-1], structure)

    plus, minus = times(0.0), times(-0.0)
    assert plus is not None
    assert minus is not None
    assert plus is not minus
    assert times(0.0) is plus
    assert times(-0.0) is minus
    assert [np.copysign(1.0, c) for c in made] == [1.0, -1.0]  # each made once


@pytest.mark.parametrize(
    ("steps", "inputs"),
    [
        # integer loops (some report errors as Python exceptions): NumPy calls
        (((np.add, (("in", 0), ("const", 1)), np.dtype(np.int64)),), (np.dtype(np.int64),)),
        # an operand NumPy would cast first (float32 + float64)
        (((np.add, (("in", 0), ("in", 1)), F8),), (np.dtype(np.float32), F8)),
        # a function that is not a ufunc
        (((np.round, (("in", 0),), F8),), (F8,)),
        # a ufunc of two outputs
        (((np.modf, (("in", 0),), F8),), (F8,)),
        # a broadcast operand (``_chain``'s kind 3 has no name here)
        (((np.add, (("in", 0), ("exp", 0)), F8),), (F8,)),
        # a scalar the loop's dtype cannot hold
        (((np.add, (("in", 0), ("const", "x")), F8),), (F8,)),
    ],
)
def test_programs_the_runner_does_not_take(
    steps: tuple[_numpy_fuse.Step, ...], inputs: tuple[np.dtype[Any], ...]
) -> None:
    assert _numpy_fuse.plan(steps, inputs, (True,), [-1]) is None


SUM = _numpy_fuse.Reduce(np.add, 0.0)
F4 = np.dtype(np.float32)


@pytest.mark.parametrize("dtype", [F8, F4])
def test_a_reduction_is_a_partial_per_block(dtype: np.dtype[Any]) -> None:
    """``sum(a * 1.5)``: the product in a scratch block, its sum into the block's own
    element of the partials (mode 3), by the loop ``np.add.reduce`` calls."""
    steps = (
        (np.multiply, (("in", 0), ("const", 1.5)), dtype),
        (SUM, (("reg", 0),), dtype),
    )
    plan = _numpy_fuse.plan(steps, (dtype,), (False, False), [1, -1])
    assert plan is not None
    assert plan.slots[-1] == (4, 1)  # the reduction's partials, at its step's index
    assert plan.modes.tolist()[-1] == 3
    assert plan.regs == [(dtype, 0)]


@needs_runner
@pytest.mark.parametrize("dtype", [F8, F4])
def test_a_blocks_partial_is_np_add_reduce_of_it(dtype: np.dtype[Any]) -> None:
    """Each partial the runner computes is ``np.add.reduce`` of its block, bit for bit (a
    block of ``-0.0`` sums to ``0.0``, as NumPy's does), and so is
    ``_numpy_fuse.block_partials``'s, the NumPy calls' (a shorter last block included)."""
    rng = np.random.default_rng(11)
    block = _numpy_fuse.BLOCK
    a = (rng.standard_normal(3 * block + 5) * 10.0 ** rng.integers(-6, 6, 3 * block + 5)).astype(
        dtype
    )
    a[block : 2 * block] = -0.0
    plan = _numpy_fuse.plan(((SUM, (("in", 0),), dtype),), (dtype,), (False,), [-1])
    assert plan is not None
    parts = np.full(4, SUM.identity, dtype)
    assert _numpy_fuse.run(plan, (a,), [parts], 0, a.size)
    expected = np.array([np.add.reduce(a[i : i + block]) for i in range(0, a.size, block)])
    assert parts.tobytes() == expected.astype(dtype).tobytes()
    assert _numpy_fuse.block_partials(SUM, a).tobytes() == parts.tobytes()


@pytest.mark.parametrize(
    ("operand", "result"),
    [
        (np.dtype(np.float16), np.dtype(np.float16)),  # NumPy's loop sums in float32
        (np.dtype(np.complex128), np.dtype(np.complex128)),
        (np.dtype(np.int64), np.dtype(np.int64)),
        (F4, F8),  # a sum of float32 in float64: NumPy casts first
    ],
)
def test_reductions_the_runner_does_not_take(operand: np.dtype[Any], result: np.dtype[Any]) -> None:
    steps = ((SUM, (("in", 0),), result),)
    assert _numpy_fuse.plan(steps, (operand,), (False,), [-1]) is None


def test_the_loops_found_are_the_ufuncs_own() -> None:
    table = _numpy_fuse._loop_table(np.add)
    d = F8.num
    assert (d, d, d) in table
    assert len(table) <= np.add.ntypes
    assert _numpy_fuse._loop_table(np.round) == {}  # not a ufunc


# -- the runner (compiled build) -------------------------------------------------------------


def counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the runner's calls (each result appended)."""
    calls: list[int] = []
    run = _numpy_fuse.RUN
    assert run is not None

    def counted(*args: Any) -> int:
        result = run(*args)
        calls.append(result)
        return result

    monkeypatch.setattr(_numpy_fuse, "RUN", counted)
    return calls


def numpy_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the chunks evaluated with NumPy calls."""
    calls: list[int] = []
    blocks = _chain.ChainKernel._blocks

    def counted(self: _chain.ChainKernel, *args: Any) -> None:
        calls.append(self.chunk)
        blocks(self, *args)

    monkeypatch.setattr(_chain.ChainKernel, "_blocks", counted)
    return calls


def comparison(xp: Any, a: Any, b: Any) -> Any:
    return (xp.sin(a) * 2.0 - b) > xp.tanh(xp.log1p(xp.abs(b)))


def complex_chain(xp: Any, a: Any, b: Any) -> Any:
    c = a * (1.5 - 0.5j) + b
    c = c * c - xp.sqrt(a)
    return xp.exp(-c * 0.25) / (c + 2.0)


PROGRAMS: dict[str, tuple[Callable[[Any, Any, Any], Any], str]] = {
    "chain float64": (chain, "float64"),
    "chain float32": (chain, "float32"),
    "comparison": (comparison, "float64"),
    "comparison float32": (comparison, "float32"),
    "complex": (complex_chain, "complex128"),
    "complex64": (complex_chain, "complex64"),
}


@needs_runner
@pytest.mark.parametrize("name", sorted(PROGRAMS))
async def test_values_are_numpys_bit_for_bit(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    program, dtype = PROGRAMS[name]
    calls = counting(monkeypatch)
    rng = np.random.default_rng(5)
    A = (rng.standard_normal(N) * 3).astype(dtype)
    B = (rng.standard_normal(N) * 3).astype(dtype)
    if dtype == "complex128":
        A = A + 1j * rng.standard_normal(N)
    async with ae.Engine() as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        a, b = xp.asarray(A), xp.asarray(B)
        with np.errstate(all="ignore"):
            got = np.asarray(await program(xp, a, b))
            expected = program(np, A, B)
    assert got.dtype == expected.dtype
    assert np.array_equal(got, expected, equal_nan=True)
    assert len(calls) == 6  # every chunk, through the runner


REDUCTIONS: dict[str, Callable[[Any, Any, Any], Any]] = {
    "sum(a * b)": lambda xp, a, b: xp.sum(a * b),
    "mean((a - b) ** 2)": lambda xp, a, b: xp.mean((a - b) ** 2),
    "prod(1 + a / 1000)": lambda xp, a, b: xp.prod(1 + a / 1000),
}


@needs_runner
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", sorted(REDUCTIONS))
async def test_a_fused_reduction_runs_in_the_runner(
    monkeypatch: pytest.MonkeyPatch, name: str, dtype: str
) -> None:
    """A chain ending in ``sum``, ``mean`` or ``prod`` of floats is one runner call per
    chunk (the partials computed without the GIL): NumPy's value within its own tolerance,
    its dtype, and the same bits every time."""
    program = REDUCTIONS[name]
    calls, fallbacks = counting(monkeypatch), numpy_calls(monkeypatch)
    rng = np.random.default_rng(8)
    A, B = rng.standard_normal(N).astype(dtype), rng.standard_normal(N).astype(dtype)
    async with ae.Engine() as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        a, b = xp.asarray(A), xp.asarray(B)
        got = np.asarray(await program(xp, a, b))
        assert len(calls) == 6
        assert fallbacks == []
        again = np.asarray(await program(xp, a, b))
    expected = program(np, A, B)
    assert got.dtype == expected.dtype
    assert got.tobytes() == again.tobytes()
    # (A float32 product of 40,977 factors: NumPy's, one after the other, is itself about
    # 1e-5 from the exact one.)
    np.testing.assert_allclose(got, expected, rtol=1e-12 if dtype == "float64" else 1e-4)


async def test_a_sums_bits_do_not_depend_on_what_joins_its_chunks() -> None:
    """A step the runner does not take (``max``) joining a sum's program makes NumPy's calls
    evaluate the chunk; the sum's partials are the runner's all the same (per BLOCK, by
    ``np.add.reduce``): the same bits with it and without, whichever joins (scheduling)."""
    rng = np.random.default_rng(10)
    for dtype in ("float32", "float64"):
        A = (rng.standard_normal(N) * 10.0 ** rng.integers(-3, 3, N)).astype(dtype)
        B = rng.standard_normal(N).astype(dtype)
        async with ae.Engine() as engine:
            xp = aa.namespace(engine, chunk_bytes=CHUNK)
            a, b = xp.asarray(A), xp.asarray(B)
            await a
            await b
            alone = await xp.sum(a * b)
            c = a * b
            joined = xp.sum(c)
            biggest = xp.max(c)  # (the same burst: it joins the sum's program)
            got = await joined
            assert float(await biggest) == float(np.max(A * B))
        assert got.tobytes() == alone.tobytes()
        np.testing.assert_allclose(got, np.sum(A * B), rtol=1e-5 if dtype == "float32" else 1e-12)


@pytest.mark.parametrize("n", [2 * 8192, N])
async def test_a_sum_that_overflows_under_errstate_raise_raises_floatingpointerror(n: int) -> None:
    """Each block's partial is finite and their sum overflows: the combine raises NumPy's
    ``FloatingPointError``, at ``await``, as the array's own failure (again on a second)."""
    X = np.zeros(n)
    X[10] = X[n - 10] = 1e308
    async with ae.Engine() as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        x = xp.asarray(X)
        with np.errstate(over="raise"):
            total = xp.sum(x * 1.0)
        for _ in range(2):
            with pytest.raises(FloatingPointError, match="overflow"):
                await total


@needs_runner
async def test_a_reduced_intermediate_someone_holds_is_materialised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = counting(monkeypatch)
    rng = np.random.default_rng(9)
    A, B = rng.standard_normal(N), rng.standard_normal(N)
    async with ae.Engine() as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        a, b = xp.asarray(A), xp.asarray(B)
        c = a * b + 1.0
        total = xp.sum(c)
        assert np.array_equal(np.asarray(await c), A * B + 1.0)
        np.testing.assert_allclose(float(await total), np.sum(A * B + 1.0), rtol=1e-12)
    assert len(calls) == 6


@needs_runner
async def test_a_reduction_that_overflows_warns_as_numpys_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The runner reports the overflow; under the default errstate the chunk is summed
    again with NumPy's calls, which warn, and the value is NumPy's."""
    counting(monkeypatch)
    async with ae.Engine() as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        x = xp.asarray(np.full(N, 1e308))
        with np.errstate(over="warn"):
            total = xp.sum(x * 1.0)
        with pytest.warns(RuntimeWarning, match="overflow"):
            got = await total
    assert got == np.inf


def mixed(xp: Any, a: Any, b: Any) -> Any:
    c = xp.sin(a) * xp.tanh(b) + xp.log1p(xp.abs(a))
    return xp.where(c > 0.25, c, -c) * 3  # where is no ufunc; c * 3 casts the int scalar


@needs_runner
async def test_a_program_the_runner_does_not_take_computes_with_numpy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls, fallbacks = counting(monkeypatch), numpy_calls(monkeypatch)
    rng = np.random.default_rng(6)
    A, B = rng.standard_normal(N), rng.standard_normal(N)
    async with ae.Engine() as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        a, b = xp.asarray(A), xp.asarray(B)
        got = np.asarray(await mixed(xp, a, b))
        assert sorted(fallbacks) == list(range(6))  # every chunk, by NumPy calls
        assert calls == []
        # A chain of integers too: its loops are not the runner's.
        i = xp.asarray(np.arange(N))
        assert np.array_equal(np.asarray(await ((i * 3 + 1) // 2)), (np.arange(N) * 3 + 1) // 2)
        assert calls == []
    assert np.array_equal(got, mixed(np, A, B))


@needs_runner
async def test_errstate_raise_fails_the_step_as_numpy_does(monkeypatch: pytest.MonkeyPatch) -> None:
    calls, fallbacks = counting(monkeypatch), numpy_calls(monkeypatch)
    async with ae.Engine() as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        x = xp.asarray(np.linspace(0.0, 10.0, N))
        with np.errstate(over="raise"):
            y = xp.exp(x * 100.0) + 1.0
        with pytest.raises(ae.DependencyError) as info:
            await y
        assert isinstance(info.value.__cause__, FloatingPointError)
        assert "overflow" in str(info.value.__cause__)
    overflowed = [r for r in calls if r & 2]
    assert overflowed
    assert len(fallbacks) == len(overflowed)


@needs_runner
async def test_errors_errstate_ignores_keep_the_runners_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls, fallbacks = counting(monkeypatch), numpy_calls(monkeypatch)
    X = np.linspace(0.0, 10.0, N)
    async with ae.Engine() as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        x = xp.asarray(X)
        with np.errstate(over="ignore", under="ignore"):
            got = np.asarray(await (xp.exp(x * 100.0) + xp.exp(-x * 100.0)))
            expected = np.exp(X * 100.0) + np.exp(-X * 100.0)
    assert np.array_equal(got, expected)
    assert any(r & 2 for r in calls)
    assert any(r & 4 for r in calls)
    assert fallbacks == []


@needs_runner
async def test_default_errstate_warns_about_an_overflow(monkeypatch: pytest.MonkeyPatch) -> None:
    counting(monkeypatch)
    async with ae.Engine() as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        x = xp.asarray(np.linspace(0.0, 10.0, N))
        with np.errstate(over="warn"):
            y = xp.exp(x * 100.0)
        with pytest.warns(RuntimeWarning, match="overflow"):
            await y
        assert np.isinf(np.asarray(await y)[-1])


async def test_an_exception_a_loop_set_is_computed_again_with_numpy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The runner's -1 (a loop set a Python exception, which it cleared): the chunk is
    computed again by NumPy's calls, which raise it or, here, compute the right values."""
    monkeypatch.setattr(_numpy_fuse, "RUN", lambda *args: -1)
    monkeypatch.setattr(_numpy_fuse, "_available", [True])
    fallbacks = numpy_calls(monkeypatch)
    rng = np.random.default_rng(7)
    A, B = rng.standard_normal(N), rng.standard_normal(N)
    async with ae.Engine() as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        got = np.asarray(await chain(xp, xp.asarray(A), xp.asarray(B)))
    assert np.array_equal(got, chain(np, A, B))
    assert sorted(fallbacks) == list(range(6))


def test_signed_zeros_and_nans_are_other_scalars() -> None:
    """``0.0 == -0.0``, but ``x * -0.0`` is another program: its plan holds its own
    constant (a cached plan of ``x * 0.0`` would give +0.0 where NumPy gives -0.0)."""

    def times(c: float | complex, dtype: np.dtype[Any] = F8) -> _numpy_fuse.Plan | None:
        return _numpy_fuse.plan(
            ((np.multiply, (("in", 0), ("const", c)), dtype),), (dtype,), (True,), [-1]
        )

    plus, minus = times(0.0), times(-0.0)
    assert plus is not None
    assert minus is not None
    assert plus is not minus
    assert [np.signbit(ref[0]) for kind, ref in minus.slots if kind == 3] == [True]
    c16 = np.dtype(np.complex128)
    assert times(complex(0.0, 0.0), c16) is not times(complex(-0.0, -0.0), c16)
    nan = float("nan")
    assert times(nan) is times(float("nan"))  # one plan, however many nan objects
    negative = times(-nan)  # another sign bit: copysign(x, -nan) is -|x|, NumPy's nan*x too
    assert negative is not None
    assert negative is not times(nan)
    assert [np.signbit(ref[0]) for kind, ref in negative.slots if kind == 3] == [True]


@pytest.mark.parametrize(
    ("value", "dtype"), [(1e300, np.float32), (70000, np.float16), (-1e39, np.float32)]
)
def test_a_scalar_the_dtype_cannot_hold_is_left_to_numpy(value: float, dtype: type) -> None:
    """NumPy's call warns or raises about such a cast at every call, as the caller's errstate
    says; a plan would cast it once, under whichever errstate was current then."""
    d = np.dtype(dtype)
    steps = ((np.multiply, (("in", 0), ("const", value)), d),)
    for errstate in ("ignore", "raise"):
        with np.errstate(all=errstate):  # type: ignore[arg-type]
            assert _numpy_fuse._encode(steps, (d,), (True,), [-1]) is None


def test_an_array_with_strides_is_left_to_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*args: Any) -> int:
        raise AssertionError("the runner was given a strided array")

    monkeypatch.setattr(_numpy_fuse, "RUN", never)
    plan = _numpy_fuse.plan(((np.negative, (("in", 0),), F8),), (F8,), (True,), [-1])
    assert plan is not None
    strided, out = np.arange(20.0)[::2], np.empty(10)
    assert not _numpy_fuse.run(plan, [strided], [out], 0, 10)


@needs_runner
@pytest.mark.parametrize("errstate", ["raise", "warn"])
async def test_an_overflowing_scalar_warns_or_raises_as_numpy_does(
    monkeypatch: pytest.MonkeyPatch, errstate: str
) -> None:
    calls = counting(monkeypatch)
    A = np.linspace(1.0, 2.0, N, dtype=np.float32)
    async with ae.Engine() as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        a = xp.asarray(A)
        await a
        with np.errstate(over=errstate):  # type: ignore[arg-type]
            d = a * 2.0
            c = d * 1e300
            e = d - 1.0
        if errstate == "raise":
            with pytest.raises(FloatingPointError, match="overflow"):
                await c
        else:
            with pytest.warns(RuntimeWarning, match="overflow"):
                await engine.wait_for_all()
            assert np.isinf(np.asarray(await c)).all()
        np.testing.assert_array_equal(await d, A * 2.0)
        np.testing.assert_array_equal(await e, A * 2.0 - 1.0)
    assert calls == []  # the program holds the scalar: NumPy's calls, every chunk


@needs_runner
async def test_a_negative_zero_scalar_keeps_its_sign(monkeypatch: pytest.MonkeyPatch) -> None:
    counting(monkeypatch)
    A = np.linspace(1.0, 2.0, N)
    async with ae.Engine() as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        a = xp.asarray(A)
        for c in (0.0, -0.0, 0.0):
            got = np.asarray(await ((a + 1.0) * c))
            assert np.array_equal(np.signbit(got), np.signbit((A + 1.0) * c))


@pytest.mark.parametrize(("value", "works"), [("0", True), ("1", True), ("yes", False)])
def test_the_environment_variable_turns_the_runner_off_or_is_refused(
    value: str, works: bool, tmp_path: Any
) -> None:
    code = "import aioengine.array._numpy_fuse as f; print(f.RUN is None)"
    env = {**os.environ, "AIOENGINE_ARRAY_NUMPY_LOOPS": value}
    done = subprocess.run(  # (in a folder of its own: the installed build, not the sources)
        [sys.executable, "-c", code],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if not works:
        assert done.returncode != 0
        assert "AIOENGINE_ARRAY_NUMPY_LOOPS must be 1" in done.stderr
        return
    assert done.returncode == 0, done.stderr
    off = done.stdout.strip() == "True"
    assert off if value == "0" else off == (_numpy_fuse.RUN is None)


@needs_runner
def test_the_runner_releases_the_gil() -> None:
    """While one thread runs a program through the runner, another runs Python: the loops
    hold no GIL (with NumPy calls a worker takes the GIL back between every two steps, and a
    caller busy in Python holds it up for a switch interval each time). Were the GIL held,
    this thread could not run at all while the loops run."""
    n = 4_000_000
    a = np.linspace(0.0, 1.0, n)
    out = np.empty(n)
    steps = tuple(
        (np.sin if k % 2 else np.cos, (("in", 0) if k == 0 else ("reg", k - 1),), F8)
        for k in range(12)
    )
    alive = (False,) * 11 + (True,)
    plan = _numpy_fuse.plan(steps, (F8,), alive, last_uses(steps))
    assert plan is not None
    flat = [None] * 11 + [out]
    span: list[float] = []

    def runs() -> None:
        span.append(time.perf_counter())
        assert _numpy_fuse.run(plan, [a], flat, 0, n)
        span.append(time.perf_counter())

    thread = threading.Thread(target=runs)
    thread.start()
    seen: list[float] = []
    while len(span) < 2:
        seen.append(time.perf_counter())  # Python on this thread, while the runner computes
    thread.join()
    # In the first half of the call: with the GIL held, this thread could run again only
    # once the runner returned (the worker then drops the GIL before it reads the clock).
    start, end = span
    inside = [t for t in seen if start < t < start + (end - start) / 2]
    assert len(inside) > 100, (len(seen), end - start)
    expected = a
    for fn, _, _ in steps:
        expected = fn(expected)
    assert np.array_equal(out, expected)
