"""Everyday NumPy, matplotlib, pandas and scikit-learn calls on engine arrays: the results are
the ones the same calls give on the arrays' NumPy values.

A NumPy function with a namespace equivalent is a push (``tests/test_array.py``); any other is
a sync point: NumPy's own function on the values, waiting for them off the event loop's thread
and raising :class:`~aioengine.array.PendingArrayError` on it while one is pending. A raw writer
on an array's Var (:class:`Hold`) holds its value back and then changes it, so "it waited" is
proved by the result, never by timing. Generalized ufuncs, NumPy's keywords and defaults,
``__array__``'s ``copy=``, ``xp.apply`` returning an ``ndarray`` subclass, hashing, ``copy``,
``asarray`` of big ints and bool inputs to arithmetic are here too.
"""

from __future__ import annotations

import asyncio
import copy
import threading
import warnings
from collections.abc import Callable
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
import pytest

import aioengine as ae
import aioengine.array as aa
import aioengine.array_api as sxp

from .conftest import Hold

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after the backend is chosen

RNG = np.random.default_rng(44)
V = RNG.normal(size=50)
W = RNG.uniform(0.5, 1.5, size=50)
M = RNG.normal(size=(6, 4))


# -- NumPy functions without a namespace equivalent: sync points --------------------------

# name -> a call taking (module-or-values converter, v, w, m): run once on engine arrays and
# once on their NumPy values; the results must be equal.
SYNC_CALLS: dict[str, Callable[[Any, Any, Any], Any]] = {
    "median": lambda v, w, m: np.median(v),
    "median axis": lambda v, w, m: np.median(m, axis=0),
    "percentile": lambda v, w, m: np.percentile(v, [10, 50, 90]),
    "quantile": lambda v, w, m: np.quantile(m, 0.25, axis=1),
    "corrcoef": lambda v, w, m: np.corrcoef(v, w),
    "cov": lambda v, w, m: np.cov(m),
    "histogram": lambda v, w, m: np.histogram(v, bins=7),
    "histogram weights=": lambda v, w, m: np.histogram(v, bins=5, weights=w),
    "polyfit": lambda v, w, m: np.polyfit(v, w, 2),
    "allclose": lambda v, w, m: np.allclose(v, v + 0),
    "array_equal": lambda v, w, m: np.array_equal(v, w),
    "average weights=": lambda v, w, m: np.average(v, weights=w),
    "interp": lambda v, w, m: np.interp(v, np.sort(w), np.sort(w)),
    "nanmean": lambda v, w, m: np.nanmean(m, axis=1),
    "gradient": lambda v, w, m: np.gradient(v),
    "vstack of a tuple": lambda v, w, m: np.vstack((v, w)),
    "column_stack of a list": lambda v, w, m: np.column_stack([v, w]),
    "block of nested lists": lambda v, w, m: np.block([[m, m], [m, m]]),
    "atleast_2d": lambda v, w, m: np.atleast_2d(v),
    "ptp": lambda v, w, m: np.ptp(m, axis=0),
    "convolve": lambda v, w, m: np.convolve(v, w, mode="same"),
    "may_share_memory": lambda v, w, m: np.may_share_memory(v, np.ones(3)),
}


def _same(got: Any, want: Any, what: str) -> None:
    """``got`` is what NumPy gives (its type too: a NumPy result, never an engine array)."""
    if isinstance(want, tuple):
        assert isinstance(got, tuple), what
        assert len(got) == len(want), what
        for g, w in zip(got, want, strict=True):
            _same(g, w, what)
        return
    assert not isinstance(got, aa.Array), what
    assert type(got) is type(want), what
    np.testing.assert_allclose(got, want, err_msg=what)


class TestSyncPointFunctions:
    @pytest.mark.parametrize("name", SYNC_CALLS)
    def test_synchronous_code_gets_numpys_result(self, name: str) -> None:
        call = SYNC_CALLS[name]
        v, w, m = sxp.asarray(V) * 1, sxp.asarray(W) + 0, sxp.asarray(M) * 1  # pushes
        _same(call(v, w, m), call(V, W, M), name)

    @pytest.mark.parametrize("name", ["median", "histogram", "column_stack of a list"])
    async def test_ready_arrays_answer_on_the_loop_thread(
        self, engine: ae.Engine, name: str
    ) -> None:
        xp = aa.namespace(engine)
        v, w, m = xp.asarray(V) * 1, xp.asarray(W) + 0, xp.asarray(M) * 1
        for a in (v, w, m):
            await a
        _same(SYNC_CALLS[name](v, w, m), SYNC_CALLS[name](V, W, M), name)

    @pytest.mark.parametrize(
        ("name", "call"),
        [
            ("median", lambda x: np.median(x)),
            ("histogram", lambda x: np.histogram(x)),
            ("polyfit", lambda x: np.polyfit(x, x, 1)),
            ("allclose", lambda x: np.allclose(1.0, x)),
            ("vstack", lambda x: np.vstack([np.ones(3), x])),  # inside a list
            ("interp", lambda x: np.interp([0.5], xp=x, fp=[1.0, 2.0, 3.0])),  # a keyword
        ],
    )
    async def test_a_pending_argument_on_the_loop_thread_raises_naming_the_function(
        self, engine: ae.Engine, name: str, call: Callable[[aa.Array], Any]
    ) -> None:
        xp = aa.namespace(engine)
        x = xp.asarray([1.0, 2.0, 3.0])
        hold = Hold(engine, x.var)
        before = engine.pending
        with pytest.raises(aa.PendingArrayError) as ei:
            call(x)
        message = str(ei.value)
        assert f"numpy.{name}()" in message
        assert "await" in message
        assert "xp.apply" in message
        assert engine.pending == before  # nothing pushed
        await hold.release()
        _same(call(await x), call(np.asarray([1.0, 2.0, 3.0])), name)

    async def test_off_the_loop_thread_it_waits_for_the_pending_values(
        self, engine: ae.Engine
    ) -> None:
        xp = aa.namespace(engine)
        base = np.zeros(5)
        x = xp.asarray(base)

        def write() -> None:
            base[:] = [5.0, 1.0, 4.0, 2.0, 3.0]

        hold = Hold(engine, x.var, effect=write)
        y = x * 2  # pending behind the writer
        calling = threading.Event()

        def median_and_edges() -> Any:
            calling.set()
            return np.median(y), np.histogram([x, y], bins=2)[1]  # y, and x inside a list

        task = asyncio.ensure_future(asyncio.to_thread(median_and_edges))
        assert await asyncio.to_thread(calling.wait, 30)
        assert not task.done()
        await hold.release()
        median, edges = await task
        assert median == 6.0
        np.testing.assert_array_equal(edges, [1.0, 5.5, 10.0])

    async def test_metadata_functions_answer_without_the_value(self, engine: ae.Engine) -> None:
        xp = aa.namespace(engine)
        x = xp.ones((2, 3))
        hold = Hold(engine, x.var)
        assert np.ndim(x) == 2
        assert np.shape(x) == (2, 3)
        assert np.size(x) == 6
        assert np.isrealobj(x)
        assert not np.iscomplexobj(x)
        await hold.release()

    def test_out_an_engine_array_is_refused(self) -> None:
        x = sxp.asarray([1.0, 2.0, 3.0])
        out = sxp.zeros(())
        with pytest.raises(TypeError, match=r"numpy\.median\(\) with out="):
            np.median(x, out=out)

    def test_functions_with_an_equivalent_stay_pushes(self) -> None:
        x = sxp.asarray(M)
        for result in (np.mean(x), np.sum(x, axis=0), np.clip(x, 0.0, 1.0), np.cumsum(x)):
            assert isinstance(result, aa.Array)


# -- generalized ufuncs ----------------------------------------------------------------------


class TestGufuncs:
    async def test_matmul_and_vecdot_are_the_namespaces_pushes(self, engine: ae.Engine) -> None:
        xp = aa.namespace(engine)
        a = xp.asarray(M)
        b = xp.asarray(M.T)
        n = np.ones((2, 6))
        hold = Hold(engine, a.var)
        got = {
            "np.matmul": (np.matmul(a, b), M @ M.T),
            "ndarray @ array": (n @ a, n @ M),
            "array @ ndarray": (b @ n.T[:6, :1], M.T @ n.T[:6, :1]),
            "np.vecdot": (np.vecdot(a, a), np.vecdot(M, M)),
            "np.vecdot axis=": (np.vecdot(a, a, axis=0), np.vecdot(M, M, axis=0)),
        }
        for name, (arr, want) in got.items():
            assert isinstance(arr, aa.Array), name
            assert arr.shape == want.shape, name
        assert not got["np.matmul"][0].ready
        await hold.release()
        for name, (arr, want) in got.items():
            np.testing.assert_allclose(await arr, want, err_msg=name)

    async def test_matmul_out_an_array_is_a_write_on_it(self, engine: ae.Engine) -> None:
        xp = aa.namespace(engine)
        a = xp.asarray(M)
        out = xp.zeros((6, 6))
        view = out[:2]
        hold = Hold(engine, a.var)
        assert np.matmul(a, a.T, out=out) is out
        assert np.matmul(a, a.T, out=(out,)) is out
        assert not view.ready  # a write on out's buffer, seen through its views
        with pytest.raises(ValueError, match=r"matmul\(\.\.\., out=\)"):
            np.matmul(a, a.T, out=xp.zeros((6, 4)))
        await hold.release()
        np.testing.assert_allclose(await out, M @ M.T)
        np.testing.assert_allclose(await view, (M @ M.T)[:2])

    def test_matmul_out_a_numpy_array_is_a_sync_point_writing_it(self) -> None:
        a = sxp.asarray(M)
        out = np.zeros((6, 6))
        assert np.matmul(a, a.T, out=out) is out
        np.testing.assert_allclose(out, M @ M.T)

    def test_a_gufunc_without_an_equivalent_is_a_sync_point(self) -> None:
        if not hasattr(np, "matvec"):
            pytest.skip("numpy.matvec is NumPy 2.2's")
        a = sxp.asarray(M)
        v = sxp.asarray(M[0])
        got = np.matvec(a, v)
        assert type(got) is np.ndarray
        np.testing.assert_allclose(got, np.matvec(M, M[0]))

    def test_a_gufunc_with_a_keyword_the_namespace_lacks_is_a_sync_point(self) -> None:
        a = sxp.asarray(M)
        got = np.matmul(a, a.T, dtype=np.float32)
        assert type(got) is np.ndarray
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, np.matmul(M, M.T, dtype=np.float32), rtol=1e-6)


# -- NumPy's keywords and defaults -----------------------------------------------------------


class TestNumpySignatures:
    @pytest.mark.parametrize(
        ("name", "call"),
        [
            ("clip positional", lambda x: np.clip(x, 0.0, 1.0)),
            ("clip a_min=/a_max=", lambda x: np.clip(x, a_min=-0.5, a_max=0.5)),
            ("clip min=/max=", lambda x: np.clip(x, min=-1.0, max=0.2)),
            ("clip one bound", lambda x: np.clip(x, None, 0.0)),
            ("cumsum of 2-D", lambda x: np.cumsum(x)),
            ("cumprod of 2-D", lambda x: np.cumprod(x)),
            ("cumsum axis=", lambda x: np.cumsum(x, axis=1)),
            ("squeeze", lambda x: np.squeeze(x[None, :, :1])),
            ("squeeze axis=", lambda x: np.squeeze(x[None], axis=0)),
            ("reshape -1", lambda x: np.reshape(x, -1)),
            ("reshape tuple", lambda x: np.reshape(x, (4, 6))),
        ],
    )
    def test_numpys_calls_give_numpys_results_as_pushes(
        self, name: str, call: Callable[[Any], Any]
    ) -> None:
        got = call(sxp.asarray(M))
        want = call(M)
        assert isinstance(got, aa.Array), name
        assert got.shape == want.shape, name
        assert got.dtype == want.dtype, name
        np.testing.assert_allclose(np.asarray(got), want, err_msg=name)

    def test_a_bound_given_twice_is_refused(self) -> None:
        with pytest.raises(TypeError, match="a_min= and min= give one argument twice"):
            np.clip(sxp.asarray(M), a_min=0.0, min=0.0)

    def test_a_namespace_error_names_the_numpy_function(self) -> None:
        with pytest.raises(ValueError) as ei:
            np.reshape(sxp.asarray(M), (5, 5))
        assert any("numpy.reshape" in note for note in ei.value.__notes__)


# -- __array__ and NumPy 2's copy= -----------------------------------------------------------


class TestArrayProtocol:
    def test_copy_false_never_copies_and_raises_where_a_copy_is_needed(self) -> None:
        x = sxp.asarray(V) * 1
        shared = np.asarray(x, copy=False)
        assert np.shares_memory(shared, np.asarray(x))
        with pytest.raises(ValueError, match="Unable to avoid copy"):
            np.asarray(x, dtype=np.float32, copy=False)
        with pytest.raises(ValueError, match="Unable to avoid copy"):
            np.array(x, dtype=np.float32, copy=False)

    def test_copy_true_and_none(self) -> None:
        x = sxp.asarray(V) * 1
        copied = np.array(x, copy=True)
        assert copied.flags.writeable
        assert not np.shares_memory(copied, np.asarray(x))
        cast = np.asarray(x, dtype=np.float32)
        assert cast.dtype == np.float32
        np.testing.assert_array_equal(cast, V.astype(np.float32))


# -- xp.apply returning an ndarray subclass --------------------------------------------------


def _matrix(value: Any) -> Any:
    """``np.matrix(value)`` (what SciPy's ``todense()`` returns), without its warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PendingDeprecationWarning)
        return np.matrix(value)


class TestApplySubclass:
    @pytest.mark.parametrize("make", [_matrix, np.ma.masked_array], ids=["matrix", "masked_array"])
    async def test_stored_as_a_plain_ndarray(
        self, engine: ae.Engine, make: Callable[[Any], Any]
    ) -> None:
        xp = aa.namespace(engine)
        y = xp.apply(lambda v: make(v * 2), xp.ones((1, 2)), shape=(1, 2), dtype=xp.float64)
        row = y[0]
        assert row.shape == (2,)
        value = await y
        assert type(value) is np.ndarray
        assert value.shape == (1, 2)
        got = await row
        assert type(got) is np.ndarray
        assert got.shape == (2,)
        np.testing.assert_array_equal(await xp.sum(y, axis=0), [2.0, 2.0])


# -- matplotlib and pandas -------------------------------------------------------------------


def _draw(data: dict[str, Any]) -> dict[str, Any]:
    """What the plotting calls return, as NumPy data, for ``data``'s arrays."""
    v, w, m = data["v"], data["w"], data["m"]
    fig, axes = plt.subplots(2, 3)
    try:
        out: dict[str, Any] = {}
        (line,) = axes[0, 0].plot(v, w)
        out["plot"] = line.get_xydata()
        n, bins, patches = axes[0, 1].hist(v, bins=8)
        out["hist"] = (n, bins, len(patches))
        n2, bins2, _ = axes[0, 1].hist(m, bins=4)  # 2-D: one dataset per column
        out["hist 2-D"] = (np.asarray(n2), bins2)
        out["scatter"] = axes[0, 2].scatter(v, w, s=w * 10).get_offsets().data
        out["imshow"] = np.asarray(axes[1, 0].imshow(m).get_array())
        box = axes[1, 1].boxplot(m)
        out["boxplot"] = [
            np.asarray(artist.get_ydata()) for key in sorted(box) for artist in box[key]
        ]
        container = axes[1, 2].errorbar(v[:10], w[:10], yerr=w[:10] / 10)
        data_line, _caps, (bars,) = container.lines
        out["errorbar"] = (data_line.get_xydata(), [s.copy() for s in bars.get_segments()])
        return out
    finally:
        plt.close(fig)


class TestPlotting:
    def test_matplotlib_draws_engine_arrays_as_their_values(self) -> None:
        want = _draw({"v": V, "w": W, "m": M})
        got = _draw({"v": sxp.asarray(V) * 1, "w": sxp.asarray(W) + 0, "m": sxp.asarray(M)})
        assert got.keys() == want.keys()
        for name in want:
            g, w = got[name], want[name]
            if name == "hist":
                assert g[2] == w[2] == 8  # one bar per bin: one dataset, not 50
                g, w = g[:2], w[:2]
            if name == "errorbar":
                np.testing.assert_allclose(g[0], w[0], err_msg=name)
                np.testing.assert_allclose(np.asarray(g[1]), np.asarray(w[1]), err_msg=name)
                continue
            if isinstance(w, list | tuple):
                assert len(g) == len(w), name
                for a, b in zip(g, w, strict=True):
                    np.testing.assert_allclose(a, b, err_msg=name)
            else:
                np.testing.assert_allclose(g, w, err_msg=name)

    def test_pandas_builds_series_and_frames(self) -> None:
        v = sxp.asarray(V) * 1
        m = sxp.asarray(M) + 0
        series = pd.Series(v)
        frame = pd.DataFrame(m, columns=list("abcd"))
        pd.testing.assert_series_equal(series, pd.Series(V))
        pd.testing.assert_frame_equal(frame, pd.DataFrame(M, columns=list("abcd")))
        assert series.to_numpy().dtype == np.float64


# -- scikit-learn without array-API dispatch ---------------------------------------------------


class TestScikitLearn:
    def test_standard_scaler_fit_transform(self) -> None:
        preprocessing = pytest.importorskip("sklearn.preprocessing")
        x = sxp.asarray(M) * 1
        got = preprocessing.StandardScaler().fit_transform(x)
        want = preprocessing.StandardScaler().fit_transform(M)
        assert type(got) is np.ndarray
        np.testing.assert_allclose(got, want)


# -- Python's protocols ----------------------------------------------------------------------


class TestPythonProtocols:
    async def test_asyncio_gather_of_arrays(self, engine: ae.Engine) -> None:
        xp = aa.namespace(engine)
        x = xp.asarray([1.0, 2.0])
        y = x * 3
        got = await asyncio.gather(x, y, x)  # the same array twice: one dict entry
        np.testing.assert_array_equal(got[1], [3.0, 6.0])
        np.testing.assert_array_equal(got[2], got[0])
        assert hash(x) != hash(y)
        assert len({x, y, x}) == 2

    def test_iter_of_a_0d_array_raises_at_once(self) -> None:
        # As NumPy's: libraries tell a scalar from a sequence by whether iter() raises.
        with pytest.raises(TypeError, match="0-d"):
            iter(sxp.asarray(1.0))
        assert [float(e) for e in sxp.asarray([1.0, 2.0])] == [1.0, 2.0]

    @pytest.mark.parametrize("how", [copy.copy, copy.deepcopy], ids=["copy", "deepcopy"])
    async def test_copy_is_a_new_engine_array_of_the_same_value(
        self, engine: ae.Engine, how: Callable[[Any], Any]
    ) -> None:
        xp = aa.namespace(engine)
        x = xp.asarray([1.0, 2.0, 3.0])
        hold = Hold(engine, x.var)
        c = how(x)  # a push, not a sync point: x is pending
        assert isinstance(c, aa.Array)
        assert c is not x
        assert c.__array_namespace__() is xp
        assert (c.shape, c.dtype, c.device) == (x.shape, x.dtype, x.device)
        assert c.var is not x.var
        await hold.release()
        x[0] = -1.0  # after the copy: not seen by it
        np.testing.assert_array_equal(await c, [1.0, 2.0, 3.0])
        np.testing.assert_array_equal(await x, [-1.0, 2.0, 3.0])

    @pytest.mark.parametrize("value", [2**70, -(2**63) - 1, [1, 2**70], [[0.5], [2**64]]])
    def test_asarray_of_an_int_out_of_range_raises_overflow_error(self, value: Any) -> None:
        with pytest.raises(OverflowError, match="out of the integer dtypes' range"):
            sxp.asarray(value)

    def test_asarray_of_ints_in_range(self) -> None:
        assert sxp.asarray(2**63 - 1).dtype == np.int64
        assert sxp.asarray(2**63).dtype == np.uint64  # as NumPy and array_api_strict
        with pytest.raises(OverflowError):  # NumPy's own, for a given dtype
            sxp.asarray(2**70, dtype=sxp.int64)


class TestBoolArithmetic:
    @pytest.mark.parametrize("name", ["expm1", "square", "sin", "sqrt", "reciprocal", "round"])
    def test_numeric_functions_refuse_bool_as_array_api_strict_does(self, name: str) -> None:
        strict = pytest.importorskip("array_api_strict")
        with pytest.raises(TypeError):
            getattr(strict, name)(strict.asarray([True, False]))
        with pytest.raises(TypeError, match=f"{name}\\(\\) needs a numeric array, not bool"):
            getattr(sxp, name)(sxp.asarray([True, False]))

    @pytest.mark.parametrize("name", ["logical_not", "bitwise_invert", "isnan", "abs"])
    def test_functions_that_keep_bool_accept_it(self, name: str) -> None:
        got = getattr(sxp, name)(sxp.asarray([True, False]))
        want = getattr(np, name)(np.asarray([True, False]))
        assert got.dtype == want.dtype == np.bool_
        np.testing.assert_array_equal(np.asarray(got), want)
