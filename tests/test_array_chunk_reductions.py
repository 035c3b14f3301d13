"""Reductions and scans of chunked arrays (``aioengine/array/_reducers.py``, ``_scan.py``):
``var``/``std``, ``argmax``/``argmin`` as per-chunk partials combined in chunk order, fused
into a pending chain or not; ``cumulative_sum``/``cumulative_prod`` carrying between chunks;
whole-array operations reading every chunk.

What a user relies on: NumPy's results (exactly for ``argmax``/``argmin``, the scans and
integer inputs; ``var``/``std`` within the tolerance ``_reducers.py`` states), with NaN,
infinities and ties across chunk boundaries, for any number of chunks; a failure in a fused
chain fails the reduction with the failing step named, and is reported even if nobody
awaits; a whole-array operation waits for every chunk. The namespaces use small chunks
(``chunk_bytes``) so that arrays of a few tens of thousands of elements have many.
"""

from __future__ import annotations

import asyncio
import gc
import math
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

import aioengine as ae
import aioengine.array as aa
from aioengine.array import _push

from .conftest import Hold, ci_examples
from .test_array_chunks import CHUNK, HeldWorkers, N

buffer_of = aa._array.buffer_of
RNG = np.random.default_rng(45)


def _tol(dtype: Any) -> float:
    """The tolerance ``_reducers.py`` states for ``var``/``std`` against NumPy's."""
    return 1e-5 if np.dtype(dtype) == np.float32 else 1e-12


def _values(dtype: str, n: int = N) -> np.ndarray[Any, Any]:
    if dtype == "bool":
        return RNG.random(n) > 0.5
    if np.dtype(dtype).kind == "f":
        return RNG.standard_normal(n).astype(dtype) + 3
    info = np.iinfo(dtype)
    return RNG.integers(max(info.min, -100), min(info.max, 100), n).astype(dtype)


# -- var and std --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float64", "float32", "int32", "int64", "uint8", "bool"])
@pytest.mark.parametrize("fused", [True, False])
async def test_var_and_std_equal_numpys(dtype: str, fused: bool) -> None:
    an, bn = _values(dtype), _values(dtype)
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        a, b = xp.asarray(an), xp.asarray(bn)
        if dtype == "bool":
            x, xn = (a & b, an & bn) if fused else (a, an)
        else:
            x, xn = (a - b, an - bn) if fused else (a, an)
        for name in ("var", "std"):
            for correction in (0, 1, 2.5):
                got = await getattr(xp, name)(x, correction=correction)
                want = getattr(np, name)(xn, correction=correction)
                assert got.dtype == want.dtype, (name, correction)
                np.testing.assert_allclose(got, want, rtol=_tol(want.dtype), err_msg=name)
        kept = await xp.var(x, axis=(0,), keepdims=True)
        assert kept.shape == (1,)
        np.testing.assert_allclose(kept, np.var(xn, keepdims=True), rtol=_tol(kept.dtype))


async def test_var_of_a_constant_array_is_zero_or_a_rounding_residue() -> None:
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        for value in (0.1, 3.0, -7e12):
            for dtype in (np.float64, np.float32):
                xn = np.full(N, value, dtype=dtype)
                got = float(await xp.var(xp.asarray(xn) * 1.0))
                # The residue NumPy's own two-pass method leaves too: of the order eps * v**2.
                assert 0.0 <= got <= 4 * np.finfo(dtype).eps * value**2, (value, dtype, got)
                assert float(np.var(xn)) <= 4 * np.finfo(dtype).eps * value**2
        ints = xp.asarray(np.full((N // 7, 7), 123456789, dtype=np.int64))
        assert float(await xp.var(ints + 0)) == 0.0  # an integer constant: exactly 0
        assert float(await xp.std(ints + 0, correction=1)) == 0.0


async def test_var_with_nan_or_inf_is_nans_as_numpy() -> None:
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        for bad in (np.nan, np.inf, -np.inf):
            xn = RNG.standard_normal(N)
            xn[3 * 8192 + 1] = bad  # inside the fourth chunk
            for name in ("var", "std"):
                # NumPy warns of inf - inf, and so do the partials (in the caller's errstate).
                with np.errstate(invalid="ignore"):
                    want = getattr(np, name)(xn)
                    result = getattr(xp, name)(xp.asarray(xn) + 0.0)
                np.testing.assert_equal(await result, want)


async def test_var_fused_into_a_chain_makes_no_intermediate_array() -> None:
    async with ae.Engine(cpu_workers=1) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        an, bn = RNG.standard_normal(N), RNG.standard_normal(N)
        a, b = xp.asarray(an), xp.asarray(bn)
        held = HeldWorkers(engine, 1)
        v = xp.var(a - b)  # joins the kernels of a - b, which nobody holds
        a += 1.0  # a write pushed after: v reads a before it
        s = xp.std(a - b, correction=1)
        await held.release()
        np.testing.assert_allclose(await v, np.var(an - bn), rtol=1e-12)
        np.testing.assert_allclose(await s, np.std(an + 1.0 - bn, correction=1), rtol=1e-12)
        gc.collect()
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            await xp.var(a - b)
            await xp.argmax(a * b)
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
        assert peak < an.nbytes / 2, peak


# -- argmax and argmin --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float64", "float32", "int64", "int8", "uint16", "bool"])
async def test_argmax_and_argmin_equal_numpys_exactly(dtype: str) -> None:
    xn = _values(dtype)
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        x = xp.asarray(xn)
        y, yn = (x ^ True, xn ^ True) if dtype == "bool" else (x * 1, xn * 1)
        for name in ("argmax", "argmin"):
            for arr, arrn in ((x, xn), (y, yn)):
                got = await getattr(xp, name)(arr)
                want = getattr(np, name)(arrn)
                assert got.dtype == want.dtype
                assert got == want, name
            kept = await getattr(xp, name)(y, keepdims=True)
            assert kept.shape == (1,)
            assert kept[0] == getattr(np, name)(yn)
            assert await getattr(xp, name)(y, axis=0) == getattr(np, name)(yn)


async def test_argmax_ties_across_chunks_nan_and_inf_follow_numpy() -> None:
    boundary = 3 * 8192  # the first element of the fourth chunk
    cases: list[tuple[str, dict[int, float]]] = [
        ("ties at boundaries", {boundary - 1: 9.0, boundary: 9.0, 5 * 8192: 9.0}),
        ("a later chunk ties", {5 * 8192 + 3: 9.0, 2 * 8192 + 7: 9.0}),
        ("first nan wins", {4 * 8192: np.nan, boundary + 2: np.nan, 10: 9.0}),
        ("nan after the max", {0: 9.0, N - 1: np.nan}),
        ("infinities", {boundary: np.inf, 7: -np.inf, N - 2: np.inf}),
        ("the last element", {N - 1: 9.0}),
    ]
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        for label, marks in cases:
            xn = RNG.uniform(-1, 1, N)
            for i, v in marks.items():
                xn[i] = v
            for name in ("argmax", "argmin"):
                for sign in (1.0, -1.0):
                    yn = xn * sign
                    got = await getattr(xp, name)(xp.asarray(xn) * sign)
                    assert got == getattr(np, name)(yn), (label, name, sign)


async def test_argmax_of_a_flattened_2d_chunked_array() -> None:
    xn = RNG.integers(0, 50, (N // 41, 41))
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        y = xp.asarray(xn) * 2
        assert len(buffer_of(y).vars) > 1
        assert await xp.argmax(y) == np.argmax(xn * 2)
        assert (await xp.argmin(y, keepdims=True)).shape == (1, 1)
        np.testing.assert_array_equal(await xp.argmax(y, axis=1), np.argmax(xn * 2, axis=1))


@pytest.mark.parametrize("chunks", [1, 2, 3, 7, 16])
async def test_every_reduction_for_several_chunk_counts(chunks: int) -> None:
    n = 20011
    chunk_bytes = 8 * math.ceil(n / chunks)
    an, bn = RNG.standard_normal(n), RNG.standard_normal(n)
    bn[n // 2] = an[n // 2] * 0.5 + 40.0  # one large value: a clear max of the chain
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=chunk_bytes)
        a, b = xp.asarray(an), xp.asarray(bn)
        c, cn = a * 0.5 + b, an * 0.5 + bn
        assert len(buffer_of(c).vars) == chunks
        for name in ("sum", "mean", "max", "min", "var", "std", "argmax", "argmin"):
            got, want = await getattr(xp, name)(c), getattr(np, name)(cn)
            np.testing.assert_allclose(got, want, rtol=1e-12, err_msg=name)
        for name in ("cumulative_sum", "cumulative_prod"):
            np.testing.assert_array_equal(await getattr(xp, name)(c), getattr(np, name)(cn))


# -- a failure inside a fused chain feeding a reduction -------------------------------------------


def _notes(exc: BaseException) -> str:
    return " ".join(getattr(exc, "__notes__", []))


@pytest.mark.parametrize("name", ["var", "argmax", "sum"])
async def test_a_failing_step_fails_the_reduction_naming_the_step(name: str) -> None:
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        x = xp.asarray(np.ones(N, dtype=np.int64))
        y = xp.asarray(-np.ones(N, dtype=np.int64))
        # Nobody holds x ** y: the reduction raises the step's own failure when the three
        # are one kernel, a DependencyError from it when a worker took the first kernel
        # before the rest joined (a loaded machine: the caller was quiet for QUIET).
        with pytest.raises((ValueError, ae.DependencyError)) as info:
            await getattr(xp, name)(x**y + 1)
        root = info.value if isinstance(info.value, ValueError) else info.value.__cause__
        assert isinstance(root, ValueError)
        assert "negative integer powers" in str(root)
        assert "pow" in _notes(root)
        assert "fused chain" in _notes(root)
        # Someone holds it: the reduction was not computed; the step raises on its own.
        bad = x**y
        total = getattr(xp, name)(bad * 2)
        with pytest.raises(ae.DependencyError, match="was not computed") as dep:
            await total  # (named after the reduction, or after bad * 2 if it ran apart)
        assert isinstance(dep.value.__cause__, ValueError)
        assert "pow" in _notes(dep.value.__cause__)
        with pytest.raises(ValueError, match="negative integer powers"):
            await bad


async def test_a_failing_step_nobody_holds_or_awaits_is_still_reported() -> None:
    makers: list[Callable[[Any, Any, Any], Any]] = [
        lambda xp, x, y: xp.var(x**y),
        lambda xp, x, y: x**y + 1,  # its dependent, which nobody awaits either
        lambda xp, x, y: xp.cumulative_sum(x**y),
    ]
    for make in makers:
        async with ae.Engine(cpu_workers=2) as engine:
            xp = aa.namespace(engine, chunk_bytes=CHUNK)
            x = xp.asarray(np.ones(N, dtype=np.int64))
            result = make(xp, x, xp.asarray(-np.ones(N, dtype=np.int64)))
            with pytest.raises(ExceptionGroup) as info:
                await engine.wait_for_all()
            (err,) = info.value.exceptions  # once, not once per chunk
            assert isinstance(err, ValueError), err
            assert "pow" in _notes(err)
            del result


# -- cumulative_sum and cumulative_prod -------------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "out"),
    [
        ("float64", None),
        ("float32", None),
        ("float32", "float64"),
        ("int8", None),  # promoted to int64, as NumPy's
        ("int64", "float32"),
        ("uint8", None),
        ("bool", None),
    ],
)
@pytest.mark.parametrize("include_initial", [False, True])
async def test_cumulative_sum_and_prod_equal_numpys_bit_for_bit(
    dtype: str, out: str | None, include_initial: bool
) -> None:
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        kw: dict[str, Any] = {"include_initial": include_initial}
        for name in ("cumulative_sum", "cumulative_prod"):
            xn = _values(dtype)
            if name == "cumulative_prod" and np.dtype(dtype).kind == "f":
                xn = (1.0 + (xn - 3) * 1e-4).astype(dtype)  # a product in range for long
            elif name == "cumulative_prod" and np.dtype(dtype).kind in "iu":
                xn = np.ones(N, dtype=dtype)  # a few 2s: within float32's range
                xn[RNG.choice(N, 30, replace=False)] = 2
            x = xp.asarray(xn)
            xd = None if out is None else getattr(xp, out)
            got_arr = getattr(xp, name)(x, dtype=xd, **kw)
            assert len(buffer_of(got_arr).vars) > 1  # a chunked result
            got = await got_arr
            want = getattr(np, name)(xn, dtype=None if out is None else np.dtype(out), **kw)
            assert got.dtype == want.dtype
            assert got.shape == want.shape
            np.testing.assert_array_equal(got, want, strict=True, err_msg=name)


@pytest.mark.parametrize("include_initial", [False, True])
async def test_a_scan_of_an_array_whose_data_decided_its_shape(
    monkeypatch: pytest.MonkeyPatch, include_initial: bool
) -> None:
    """A scan in chunks reads its input's size from the result's: the Buffer of a mask's
    result (``x[m]``, 0-d here) may not know the shape its data decided, even once awaited
    (found by the differential programs, every operation pushed: ``INLINE_COST`` 0)."""
    import importlib
    import pkgutil

    for info in pkgutil.iter_modules(aa.__path__):
        module = importlib.import_module(f"aioengine.array.{info.name}")
        if hasattr(module, "INLINE_COST"):
            monkeypatch.setattr(module, "INLINE_COST", 0)
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine)
        x = xp.asarray(np.array(5, dtype=np.int8))[xp.asarray(np.array(True))]
        await x  # its shape, (1,), learnt
        for name in ("cumulative_sum", "cumulative_prod"):
            got = await getattr(xp, name)(x, axis=0, include_initial=include_initial)
            want = getattr(np, name)(np.array([5], np.int8), include_initial=include_initial)
            np.testing.assert_array_equal(got, want, strict=True)


async def test_cumulative_sum_of_a_chain_with_nan_inf_and_signed_zeros() -> None:
    an, bn = RNG.standard_normal(N), RNG.standard_normal(N)
    an[0] = -0.0
    bn[0] = 0.0
    an[4 * 8192 + 3] = np.inf
    an[5 * 8192 + 1] = np.nan
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        a, b = xp.asarray(an), xp.asarray(bn)
        for inc in (False, True):
            got = await xp.cumulative_sum(a * b - b, include_initial=inc)
            with np.errstate(invalid="ignore"):
                want = np.cumulative_sum(an * bn - bn, include_initial=inc)
            np.testing.assert_array_equal(got, want)
            assert np.signbit(got[int(inc)])
            assert np.signbit(want[int(inc)])
        for shape, axis in (((1, N), 1), ((N, 1), 0), ((1, 1, N), -1)):
            xn = RNG.standard_normal(shape)
            got = await xp.cumulative_sum(xp.asarray(xn) + 1.0, axis=axis, include_initial=True)
            np.testing.assert_array_equal(
                got, np.cumulative_sum(xn + 1.0, axis=axis, include_initial=True)
            )
        # Along an axis that is not the flat order, and through a view: the whole array.
        xn = RNG.standard_normal((N // 8, 8))
        got = await xp.cumulative_sum(xp.asarray(xn) + 1.0, axis=0)
        np.testing.assert_array_equal(got, np.cumulative_sum(xn + 1.0, axis=0))
        got = await xp.cumulative_prod((xp.asarray(bn) * 1.0)[1:])
        np.testing.assert_array_equal(got, np.cumulative_prod(bn[1:]))


async def test_a_later_chain_starts_on_chunk_0_before_the_last_chunk_is_computed() -> None:
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        xn = RNG.standard_normal(N)
        x = xp.asarray(xn) * 1.0
        xbuf = buffer_of(x)
        last = len(xbuf.vars) - 1
        lo = last * 8192
        hold = Hold(engine, xbuf.vars[last], effect=lambda: xbuf.value[lo:].__imul__(2.0))
        c = xp.cumulative_sum(x)
        y = c * 2.0
        ybuf = buffer_of(y)
        # y's chunk 0 is computed while the input's last chunk is held (no wait on it).
        await asyncio.wait_for(asyncio.shield(ybuf.chunked.writers[0]), 30)
        assert not buffer_of(c).chunked.writers[-1].done()
        await hold.release()
        xn[lo:] *= 2.0
        np.testing.assert_array_equal(await y, np.cumulative_sum(xn) * 2.0)


async def test_a_scan_is_ordered_with_writes_and_its_input_failure_fails_it() -> None:
    async with ae.Engine(cpu_workers=1) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        xn = RNG.standard_normal(N)
        x = xp.asarray(xn.copy())
        held = HeldWorkers(engine, 1)
        c = xp.cumulative_sum(x)
        x += 1.0  # after the scan's reads
        c[:10] = 0.0  # a write on the result: after every chunk
        d = xp.cumulative_prod(x * 0.0 + 1.0)
        await held.release()
        want = np.cumsum(xn)
        want[:10] = 0.0
        np.testing.assert_array_equal(await c, want)
        np.testing.assert_array_equal(await d, np.ones(N))

        def bad(v: Any) -> Any:
            raise KeyError("load")

        broken = xp.apply(bad, xp.asarray(xn), shape=(N,), dtype=xp.float64)
        scan = xp.cumulative_sum(broken)
        with pytest.raises(KeyError):
            await broken
        with pytest.raises(ae.DependencyError) as info:
            await scan
        assert isinstance(info.value.__cause__, KeyError)


# -- whole-array operations read every chunk ------------------------------------------------------


def _whole(xp: Any) -> dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]]:
    """Whole-array operations on a (200, 200) array, and NumPy's."""
    eye = np.eye(200) * 400.0
    return {
        "sort": (lambda m: xp.sort(m, axis=0), lambda m: np.sort(m, axis=0)),
        "fft": (lambda m: xp.fft.fft(m, axis=0), lambda m: np.fft.fft(m, axis=0)),
        "linalg": (
            lambda m: xp.linalg.inv(m + xp.asarray(eye)),
            lambda m: np.linalg.inv(m + eye),
        ),
        "reshape view": (lambda m: xp.reshape(m, (400, 100)), lambda m: m.reshape(400, 100)),
        "reshape copy": (
            lambda m: xp.reshape(m.T, (100, 400)),
            lambda m: m.T.reshape(100, 400),
        ),
        "reduce axis": (
            lambda m: xp.sum(xp.reshape(m, (400, 100)), axis=0),
            lambda m: np.sum(m.reshape(400, 100), axis=0),
        ),
    }


@pytest.mark.parametrize(
    "kind", ["sort", "fft", "linalg", "reshape view", "reshape copy", "reduce axis"]
)
async def test_a_whole_array_operation_waits_for_every_chunk(kind: str) -> None:
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=CHUNK)
        mn = RNG.standard_normal((200, 200))
        m = xp.asarray(mn) * 1.0  # 40,000 elements: 5 chunks
        mbuf = buffer_of(m)
        assert len(mbuf.vars) == 5
        held_var = mbuf.vars[3]  # a middle chunk, across rows 122..163
        await m  # computed: only the hold below keeps chunk 3 from being read

        def rewrite() -> None:
            mbuf.value.reshape(-1)[3 * 8192 : 4 * 8192] += 100.0

        hold = Hold(engine, held_var, effect=rewrite)
        ours, theirs = _whole(xp)[kind]
        result = ours(m)
        got = asyncio.ensure_future(_value(result))
        await asyncio.sleep(0)  # the await's read is pushed
        assert "read" in held_var.statistics().waiting_modes  # it waits behind the hold
        assert not got.done()
        await hold.release()
        mn.reshape(-1)[3 * 8192 : 4 * 8192] += 100.0
        np.testing.assert_allclose(await got, theirs(mn), rtol=1e-12, atol=1e-12)


async def _value(x: Any) -> Any:
    return await x


# -- a differential: random chains ending in a random reduction, against NumPy -----------------

_STEPS: dict[str, Callable[[Any, Any, Any], Any]] = {
    "add": lambda xp, x, y: x + y,
    "mul": lambda xp, x, y: x * y,
    "sub_scalar": lambda xp, x, y: x - 0.75,
    "abs": lambda xp, x, y: xp.abs(x),
    "sin": lambda xp, x, y: xp.sin(x),
    "max": lambda xp, x, y: xp.maximum(x, y),
}
_EXACT = ("max", "min", "argmax", "argmin", "cumulative_sum", "cumulative_prod")
_REDUCTIONS = ("sum", "mean", "var", "std", *_EXACT)


@ci_examples(30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
async def test_random_chains_ending_in_a_reduction_equal_numpy(data: st.DataObject) -> None:
    n = data.draw(st.integers(_push.INLINE_COST + 1, 3 * _push.INLINE_COST), label="n")
    chunks = data.draw(st.integers(1, 16), label="chunks")
    steps = data.draw(
        st.lists(st.tuples(st.sampled_from(sorted(_STEPS)), st.integers(0, 9)), max_size=6),
        label="steps",
    )
    held = data.draw(st.booleans(), label="hold the intermediates")
    wait = data.draw(st.booleans(), label="await before reducing")
    name = data.draw(st.sampled_from(_REDUCTIONS), label="reduction")
    seed = data.draw(st.integers(0, 3), label="seed")
    rng = np.random.default_rng(seed)
    an, bn = rng.standard_normal(n), rng.standard_normal(n)
    if name == "cumulative_prod":
        an, bn = 1.0 + an * 1e-3, 1.0 + bn * 1e-3  # a product in range

    async def program(xp: Any, a: Any, b: Any, is_np: bool) -> Any:
        vals = [a, b]
        for step, j in steps:
            vals.append(_STEPS[step](xp, vals[-1], vals[j % len(vals)]))
            if not held:
                del vals[:-2]  # nobody holds the older results: never materialised
        x = vals[-1]
        if wait and not is_np:
            await x
        return getattr(xp, name)(x)

    want = await program(np, an, bn, True)
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine, chunk_bytes=8 * math.ceil(n / chunks))
        got = await (await program(xp, xp.asarray(an), xp.asarray(bn), False))
    assert got.dtype == want.dtype
    if name in _EXACT:
        np.testing.assert_array_equal(got, want, err_msg=f"{name} of {steps}")
    else:
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=f"{name} {steps}")
