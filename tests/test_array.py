"""Engine-backed arrays (``aioengine.array``) on the event loop: the namespace, metadata at the
call, ``await``, ``repr``, views and in-place writes, raw pushes on ``x.var``, ``xp.apply``,
NumPy's protocols, devices, failures and memory.

Sync points, threads, ``BlockingEngine``, ``aioengine.array_api`` and backpressure are in
``test_array_sync.py``. Where a test needs an operation to be "not run yet", a raw coroutine
writer on the array's Var (:class:`Hold`) keeps its turn until released, so every assertion
is about ordering, never about timing.
"""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import tempfile
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import aioengine as ae
import aioengine.array as aa
from aioengine.array._buffer import Buffer

from .conftest import COMPILED, Hold
from .helpers import Boom


def _noop(rctx: ae.RunContext) -> None:
    pass


# -- the namespace and the type ------------------------------------------------------------


class TestNamespace:
    async def test_one_namespace_per_engine(self, engine: ae.Engine) -> None:
        xp = aa.namespace(engine)
        assert aa.namespace(engine) is xp
        assert isinstance(xp, aa.Namespace)
        x = xp.asarray([1.0, 2.0, 3.0])
        y = x + 1
        z = xp.linalg.inv(xp.eye(2))
        for a in (x, y, z, x[1:], x.T if x.ndim == 2 else x, xp.sum(x)):
            assert isinstance(a, aa.Array)
            assert a.__array_namespace__() is xp
        assert x.__array_namespace__(api_version="2024.12") is xp
        assert xp.__array_api_version__ == "2024.12"

    async def test_refuses_what_is_not_an_engine(self) -> None:
        with pytest.raises(TypeError):
            aa.namespace(object())  # type: ignore[arg-type]

    async def test_arrays_of_two_engines_in_one_call_raise_at_the_call(
        self, engine: ae.Engine
    ) -> None:
        xp = aa.namespace(engine)
        async with ae.Engine(cpu_workers=1) as other:
            xq = aa.namespace(other)
            assert xq is not xp
            a = xp.ones(3)
            b = xq.ones(3)
            calls: list[Callable[[], Any]] = [
                lambda: a + b,
                lambda: b + a,
                lambda: xp.add(a, b),
                lambda: xq.add(a, b),
                lambda: xp.concat([a, b]),
                lambda: xp.where(a > 0, a, b),
                lambda: xp.stack([a, b]),
                lambda: xp.asarray(b),
                lambda: np.add(a, b),
                lambda: np.add(a, 1, out=b),
                lambda: xp.apply(np.add, a, b, shape=(3,), dtype=xp.float64),
            ]
            for call in calls:
                with pytest.raises(ValueError, match="engine"):
                    call()

            def iadd() -> None:
                c = xp.ones(3)
                c += b

            def setitem() -> None:
                c = xp.ones(3)
                c[0:3] = b

            for call in (iadd, setitem):
                with pytest.raises(ValueError, match="engine"):
                    call()
            np.testing.assert_array_equal(await (a + a), [2.0, 2.0, 2.0])
            np.testing.assert_array_equal(await (b + b), [2.0, 2.0, 2.0])


# -- every operation returns at once; bad calls raise at the line ---------------------------


class TestMetadataAtOnce:
    async def test_operations_return_at_once_with_shape_dtype_and_device(
        self, engine: ae.Engine
    ) -> None:
        xp = aa.namespace(engine)
        m = np.arange(12.0).reshape(3, 4)
        x = xp.asarray(m, copy=True)
        hold = Hold(engine, x.var)
        results: dict[str, tuple[aa.Array, np.ndarray]] = {
            "add": (x + 1, m + 1),
            "matmul": (x @ x.T, m @ m.T),
            "sum": (xp.sum(x, axis=0), np.sum(m, axis=0)),
            "mean": (xp.mean(x), np.mean(m)),
            "greater": (x > 4, m > 4),
            "astype": (xp.astype(x, xp.float32), m.astype(np.float32)),
            "int": (xp.astype(x, xp.int32) // 2, m.astype(np.int32) // 2),
            "concat": (xp.concat([x, x], axis=1), np.concatenate([m, m], axis=1)),
            "reshape": (xp.reshape(x, (2, 6)), m.reshape(2, 6)),
            "slice": (x[1:, ::2], m[1:, ::2]),
            "T": (x.T, m.T),
            "sin": (np.sin(x), np.sin(m)),
            "fft": (xp.fft.fft(x), np.fft.fft(m)),
            "inv": (xp.linalg.inv(x[:, :3] @ x[:, :3].T + xp.eye(3)), None),  # type: ignore[dict-item]
            "complex": (x * 1j, m * 1j),
            "argmax": (xp.argmax(x, axis=1), np.argmax(m, axis=1)),
        }
        for name, (a, want) in results.items():
            assert not a.ready, name
            assert a.device == ae.cpu(0), name
            if want is not None:
                assert a.shape == want.shape, name
                assert a.dtype == want.dtype, name
            r = repr(a)
            assert "pending" in r, (name, r)
        assert results["inv"][0].shape == (3, 3)
        assert results["inv"][0].dtype == np.float64
        await hold.release()
        for name, (a, want) in results.items():
            got = await a
            assert a.ready, name
            if want is not None:
                np.testing.assert_allclose(got, want, err_msg=name)
                assert got.dtype == want.dtype, name

    @pytest.mark.parametrize(
        ("error", "call"),
        [
            # shapes: ValueError
            (ValueError, lambda xp, f, i: f + xp.ones(4)),
            (ValueError, lambda xp, f, i: xp.add(f, xp.ones((2, 4)))),
            (ValueError, lambda xp, f, i: xp.matmul(xp.ones((2, 3)), xp.ones((2, 3)))),
            (ValueError, lambda xp, f, i: f @ xp.ones(4)),
            (ValueError, lambda xp, f, i: xp.reshape(f, (4,))),
            (ValueError, lambda xp, f, i: xp.concat([f, xp.ones((3, 1))])),
            (ValueError, lambda xp, f, i: xp.linalg.inv(xp.ones((2, 3)))),
            (ValueError, lambda xp, f, i: f.__iadd__(xp.ones((2, 3)))),
            (ValueError, lambda xp, f, i: f.__setitem__(slice(0, 2), xp.ones(3))),
            (ValueError, lambda xp, f, i: np.add(f, xp.ones((2, 3)), out=f)),
            # dtypes: TypeError
            (TypeError, lambda xp, f, i: i.__iadd__(1.5)),
            (TypeError, lambda xp, f, i: i.__iadd__(f)),
            (TypeError, lambda xp, f, i: i.__itruediv__(2)),
            (TypeError, lambda xp, f, i: i.__setitem__(0, 1.5)),
            (TypeError, lambda xp, f, i: i.__setitem__(slice(None), f)),
            (TypeError, lambda xp, f, i: np.add(i, 1.5, out=i)),
            (TypeError, lambda xp, f, i: xp.bitwise_and(f, f)),
            (TypeError, lambda xp, f, i: f << 1),
            (TypeError, lambda xp, f, i: xp.astype(f, "float64")),
            (TypeError, lambda xp, f, i: xp.zeros(3, dtype="float64")),
            # devices: ValueError
            (ValueError, lambda xp, f, i: xp.zeros(3, device="cpu")),
            (ValueError, lambda xp, f, i: f.to_device("gpu")),
        ],
    )
    async def test_bad_calls_raise_at_the_line_while_inputs_are_pending(
        self, engine: ae.Engine, error: type[Exception], call: Callable[..., Any]
    ) -> None:
        xp = aa.namespace(engine)
        f = xp.ones(3)
        i = xp.ones(3, dtype=xp.int64)
        holds = [Hold(engine, f.var), Hold(engine, i.var)]
        with pytest.raises(error):
            call(xp, f, i)
        for h in holds:
            await h.release()
        np.testing.assert_array_equal(await f, [1.0, 1.0, 1.0])  # f unchanged
        np.testing.assert_array_equal(await i, [1, 1, 1])
        assert (await i).dtype == np.int64


# -- await, ready, repr ---------------------------------------------------------------------


class TestAwait:
    async def test_await_gives_the_value_after_every_op_pushed_before(
        self, engine: ae.Engine
    ) -> None:
        xp = aa.namespace(engine)
        x = xp.zeros(4)
        x += 1
        x[0] = 5
        np.add(x, 1, out=x)
        v = await x
        assert type(v) is np.ndarray
        np.testing.assert_array_equal(v, [6.0, 2.0, 2.0, 2.0])
        x *= 2
        x[1:] = 7
        x[...] = x + 1
        w = await x
        np.testing.assert_array_equal(w, [13.0, 8.0, 8.0, 8.0])
        np.testing.assert_array_equal(v, [6.0, 2.0, 2.0, 2.0])  # never changes afterwards

    async def test_an_awaited_value_never_changes_through_views_or_numpy_out(
        self, engine: ae.Engine
    ) -> None:
        xp = aa.namespace(engine)
        x = xp.asarray(np.arange(6.0).reshape(2, 3), copy=True)
        got = [await x, await x[1], await x.T, await xp.reshape(x, (6,))]
        copies = [g.copy() for g in got]
        x[1] = -1.0
        x.T[0] = 9.0
        xp.reshape(x, (6,))[2:4] += 100.0
        np.multiply(x, 3, out=x)
        x += x
        for g, c in zip(got, copies, strict=True):
            np.testing.assert_array_equal(g, c)
        m = np.arange(6.0).reshape(2, 3)
        m[1] = -1.0
        m.T[0] = 9.0
        m.reshape(6)[2:4] += 100.0
        m *= 3
        m += m
        np.testing.assert_array_equal(await x, m)
        for g, c in zip(got, copies, strict=True):
            np.testing.assert_array_equal(g, c)

    async def test_ready(self, engine: ae.Engine) -> None:
        xp = aa.namespace(engine)
        x = xp.asarray([1.0, 2.0])
        assert x.ready
        hold = Hold(engine, x.var)
        assert not x.ready
        y = x + 1
        assert not y.ready
        await hold.release()
        np.testing.assert_array_equal(await y, [2.0, 3.0])
        assert x.ready
        assert y.ready
        hold = Hold(engine, y.var)
        y += 1
        assert not y.ready
        await hold.release()
        np.testing.assert_array_equal(await y, [3.0, 4.0])
        assert y.ready


class TestRepr:
    async def test_pending_ready_and_failed(self, engine: ae.Engine) -> None:
        xp = aa.namespace(engine)
        x = xp.asarray([1.0, 2.0, 3.0])
        hold = Hold(engine, x.var)
        assert "pending" in repr(x)
        y = x @ xp.ones((3, 2))
        z = xp.sin(x)
        for a, producer in ((y, "matmul"), (z, "sin")):
            r = repr(a)
            assert "pending" in r, r
            assert producer in r, r
            assert str(a) == r
        # repr never waits, on another thread either (the hold is released only after).
        r = await asyncio.wait_for(asyncio.to_thread(repr, y), 30)
        assert "pending" in r
        await hold.release()
        await z
        await y
        assert repr(x) == "Array([1., 2., 3.], dtype=float64)"
        assert "[1., 2., 3.]" in repr(x)
        assert np.array_repr(await y)[len("array(") : -1] in repr(y)
        assert "pending" not in repr(y)
        i = xp.asarray([[1, 2], [3, 4]], dtype=xp.int32)
        assert "[[1, 2],\n" in repr(i)
        assert "int32" in repr(i)
        bad = xp.linalg.inv(xp.zeros((2, 2)))
        dep = bad + 1
        with pytest.raises(np.linalg.LinAlgError):
            await bad
        with pytest.raises(ae.DependencyError):
            await dep
        for a in (bad, dep):
            assert "failed" in repr(a), repr(a)
            assert "pending" not in repr(a)


# -- views and in-place writes --------------------------------------------------------------


class TestViews:
    async def test_views_share_the_var_copies_do_not(self, engine: ae.Engine) -> None:
        xp = aa.namespace(engine)
        x = xp.asarray(np.arange(24.0).reshape(4, 6), copy=True)
        views = {
            "row": x[1],
            "slice": x[1:3, ::2],
            "ellipsis": x[..., 0],
            "newaxis": x[None],
            "T": x.T,
            "mT": x.mT,
            "permute_dims": xp.permute_dims(x, (1, 0)),
            "reshape": xp.reshape(x, (24,)),
            "reshape of a row slice": xp.reshape(x[1:3], (3, 4)),
            "view of a view": x.T[::2][1:, 1],
            "expand_dims": xp.expand_dims(x, axis=0),
        }
        for name, v in views.items():
            assert v.var is x.var, name
        copies = {
            "reshape of a transpose": xp.reshape(x.T, (24,)),
            "reshape copy=True": xp.reshape(x, (24,), copy=True),
            "integer array index": x[xp.asarray([0, 2])],
            "boolean index": x[x > 3],
            "arithmetic": x + 0,
            "astype": xp.astype(x, xp.float64),
            "asarray copy": xp.asarray(x, copy=True),
        }
        for name, c in copies.items():
            assert c.var is not x.var, name
        with pytest.raises(ValueError):
            xp.reshape(x.T, (24,), copy=False)

    async def test_view_semantics_are_numpy_s(self, engine: ae.Engine) -> None:
        xp = aa.namespace(engine)
        m = np.arange(24.0).reshape(4, 6)
        x = xp.asarray(m, copy=True)
        before = x * 1  # pushed before the writes: never sees them
        v, mv = x[1:3], m[1:3]
        t, mt = x.T, m.T
        r, mr = xp.reshape(x, (24,)), m.reshape(24)
        early_view = x[0]  # a view made before the writes sees them, as in NumPy
        v[0] = 100.0
        mv[0] = 100.0
        t[0, 2] = -1.0
        mt[0, 2] = -1.0
        r[5:10] += 3.0
        mr[5:10] += 3.0
        x[:, 0] = xp.asarray([7.0, 8.0, 9.0, 10.0])
        m[:, 0] = [7.0, 8.0, 9.0, 10.0]
        np.multiply(v, 2.0, out=v)
        mv *= 2.0
        t[1:3] = t[1:3] + t[3:5]  # reads and writes the same buffer
        mt[1:3] = mt[1:3] + mt[3:5]
        x[-1] = x[0]
        m[-1] = m[0]
        after = x * 1
        for arr, want in (
            (x, m),
            (v, mv),
            (t, mt),
            (r, mr),
            (early_view, m[0]),
            (after, m),
            (before, np.arange(24.0).reshape(4, 6)),
        ):
            np.testing.assert_array_equal(await arr, want)

    @pytest.mark.parametrize("seed", range(3))
    async def test_random_programs_of_views_and_writes_match_numpy(
        self, engine: ae.Engine, seed: int
    ) -> None:
        """Views of views, writes through any of them (small ones inline on the loop, whole
        ones on the pool), copies and awaits, against the same program in NumPy."""
        import random

        rng = random.Random(seed)
        xp = aa.namespace(engine)
        m = np.arange(128 * 160, dtype=np.float64).reshape(128, 160)  # > INLINE_COST
        x = xp.asarray(m, copy=True)
        pool: list[tuple[aa.Array, np.ndarray]] = [(x, m)]
        copies: list[tuple[aa.Array, np.ndarray]] = []
        awaited: list[tuple[np.ndarray, np.ndarray]] = []
        for step in range(60):
            a, ma = rng.choice(pool)
            kind = rng.randrange(7)
            if kind == 0 and a.ndim >= 1 and ma.shape[0] > 1:
                lo = rng.randrange(ma.shape[0] - 1)
                hi = rng.randrange(lo + 1, ma.shape[0] + 1)
                pool.append((a[lo:hi:1], ma[lo:hi:1]))
            elif kind == 1 and a.ndim == 2:
                pool.append((a.T, ma.T))
            elif kind == 2:
                shaped = ma.reshape(-1)
                ra = xp.reshape(a, (ma.size,))
                assert (ra.var is x.var) == np.shares_memory(shaped, m)
                pool.append((ra, shaped))
            elif kind == 3:
                val = float(step)
                if a.ndim and ma.shape[0] > 1:
                    j = rng.randrange(ma.shape[0])
                    a[j] = val
                    ma[j] = val
                else:
                    a[...] = val
                    ma[...] = val
            elif kind == 4:
                a += 0.5
                ma += 0.5
            elif kind == 5:
                copies.append((a * 1, ma.copy()))
            else:
                got = await a
                np.testing.assert_array_equal(got, ma)
                awaited.append((got, ma.copy()))
        for c, want in copies:
            np.testing.assert_array_equal(await c, want)
        for arr, want in pool:
            np.testing.assert_array_equal(await arr, want)
        for got, want in awaited:
            np.testing.assert_array_equal(got, want)  # never changed afterwards

    async def test_broadcast_views_are_read_only(self, engine: ae.Engine) -> None:
        xp = aa.namespace(engine)
        x = xp.ones(3)
        b = xp.broadcast_to(x, (2, 3))
        with pytest.raises(ValueError):
            b[0] = 2.0
        with pytest.raises(ValueError):
            b += 1
        np.testing.assert_array_equal(await b, np.ones((2, 3)))


# -- raw pushes on x.var --------------------------------------------------------------------


class TestRawPushes:
    async def test_a_raw_writer_is_ordered_with_the_array_s_ops(self, engine: ae.Engine) -> None:
        xp = aa.namespace(engine)
        base = np.zeros(3)
        x = xp.asarray(base)  # shares base's memory: the raw writer writes the buffer
        assert x.ready
        y = x + 1  # pushed before the raw writer: reads zeros
        hold = Hold(engine, x.var, effect=lambda: base.__setitem__(slice(None), 7.0))
        z = x + 1  # pushed after it: reads sevens
        assert not x.ready
        assert not z.ready
        task = asyncio.ensure_future(_await(x))
        await hold.started.wait()
        for _ in range(5):
            await asyncio.sleep(0)
        assert not task.done()  # await x waits for the raw writer
        assert not x.ready
        with pytest.raises(aa.PendingArrayError):
            float(x[0])
        await hold.release()
        np.testing.assert_array_equal(await y, [1.0, 1.0, 1.0])
        np.testing.assert_array_equal(await task, [7.0, 7.0, 7.0])
        np.testing.assert_array_equal(await z, [8.0, 8.0, 8.0])
        assert x.ready
        assert float(x[0]) == 7.0

    async def test_raw_readers_see_the_writes_pushed_before_them(self, engine: ae.Engine) -> None:
        xp = aa.namespace(engine)
        base = np.zeros((4, 1000))  # > INLINE_COST in all: whole writes run on the pool
        x = xp.asarray(base)
        seen: list[np.ndarray] = []
        model = np.zeros((4, 1000))
        want: list[np.ndarray] = []

        def record(rctx: ae.RunContext) -> None:
            seen.append(base.copy())

        for k in range(1, 9):
            if k % 2:
                x[k % 4] = float(k)
                model[k % 4] = float(k)
            else:
                x += 1.0
                model += 1.0
            engine.push_sync(record, ae.cpu(), [x.var], [], name="record")
            want.append(model.copy())
        await engine.wait_for_all()
        assert len(seen) == len(want)
        # Readers of one Var may run in any order among themselves; each sees one prefix.
        for got in seen:
            assert any(np.array_equal(got, w) for w in want)
        assert sorted(float(s.sum()) for s in seen) == sorted(float(w.sum()) for w in want)
        np.testing.assert_array_equal(await x, model)

    async def test_raw_reader_and_writer_with_views(self, engine: ae.Engine) -> None:
        xp = aa.namespace(engine)
        base = np.zeros((3, 3))
        x = xp.asarray(base)
        col = x.T[1]
        seen: list[np.ndarray] = []
        col[...] = 5.0
        r1 = engine.push_sync(lambda r: seen.append(base.copy()), ae.cpu(), [col.var], [])
        hold = Hold(engine, col.var, effect=lambda: base.__setitem__((0, 0), -1.0))
        x[2] += 1.0
        r2 = engine.push_sync(lambda r: seen.append(base.copy()), ae.cpu(), [x[0].var], [])
        await hold.release()
        await r1
        await r2
        assert len(seen) == 2
        np.testing.assert_array_equal(seen[0], [[0, 5, 0], [0, 5, 0], [0, 5, 0]])
        np.testing.assert_array_equal(seen[1], [[-1, 5, 0], [0, 5, 0], [1, 6, 1]])
        np.testing.assert_array_equal(await x, seen[1])


async def _await(x: aa.Array) -> Any:
    return await x


# -- apply ----------------------------------------------------------------------------------


class TestApply:
    async def test_runs_on_the_pool_as_one_op(self, threaded_engine: ae.Engine) -> None:
        engine = threaded_engine
        xp = aa.namespace(engine)
        loop_thread = threading.get_ident()
        calls: list[tuple[int, tuple[Any, ...]]] = []

        def fn(a: np.ndarray, k: float, b: np.ndarray) -> np.ndarray:
            calls.append((threading.get_ident(), (type(a), k, type(b))))
            return np.asarray(a * k + b, dtype=np.float64)

        x = xp.asarray([1.0, 2.0, 3.0])
        hold = Hold(engine, x.var)
        before = engine.pending
        y = xp.apply(fn, x, 2.0, x[::-1], shape=(3,), dtype=xp.float64)
        assert engine.pending == before + 1  # one operation
        assert y.shape == (3,)
        assert y.dtype == np.float64
        assert y.device == ae.cpu(0)
        assert not y.ready
        assert calls == []
        await hold.release()
        np.testing.assert_array_equal(await y, [5.0, 6.0, 7.0])
        assert len(calls) == 1
        ident, types = calls[0]
        assert ident != loop_thread  # never inline on the loop, even for three elements
        assert types == (np.ndarray, 2.0, np.ndarray)
        z = xp.apply(lambda: np.full((2, 2), threading.get_ident()), shape=(2, 2), dtype=xp.int64)
        assert int((await z)[0, 0]) != loop_thread

    @pytest.mark.parametrize(
        ("result", "error"),
        [
            (lambda a: np.ones(4), ValueError),  # shape
            (lambda a: np.ones((3, 1)), ValueError),
            (lambda a: np.ones(3, dtype=np.float32), TypeError),  # dtype: no silent cast
            (lambda a: np.ones(3, dtype=np.int64), TypeError),
            (lambda a: [1.0, 1.0, 1.0], TypeError),  # not an array
            (lambda a: 1.0, TypeError),
        ],
    )
    async def test_a_result_of_another_shape_or_dtype_is_the_array_s_failure(
        self, engine: ae.Engine, result: Callable[[Any], Any], error: type[Exception]
    ) -> None:
        xp = aa.namespace(engine)
        x = xp.ones(3)
        y = xp.apply(result, x, shape=(3,), dtype=xp.float64)  # no error at the call
        assert y.shape == (3,)
        assert y.dtype == np.float64
        dep = y + 1
        with pytest.raises(error) as first:
            await y
        with pytest.raises(error) as second:
            await y
        assert second.value is first.value
        with pytest.raises(ae.DependencyError) as d:
            await dep
        assert d.value.__cause__ is first.value
        assert "failed" in repr(y)
        await engine.wait_for_all()  # thrown by await: not again

    async def test_a_raising_fn_fails_the_result_naming_the_operation(
        self, engine: ae.Engine
    ) -> None:
        xp = aa.namespace(engine)

        def explode(a: np.ndarray) -> np.ndarray:
            raise Boom("no")

        x = xp.ones((2, 5))
        y = xp.apply(explode, x, shape=(2, 5), dtype=xp.float64)
        with pytest.raises(Boom) as ei:
            await y
        text = _text(ei.value)
        for part in ("explode", "(2, 5)", "cpu(0)"):
            assert part in text, text
        await engine.wait_for_all()

    async def test_refuses_bad_arguments_at_the_call(self, engine: ae.Engine) -> None:
        xp = aa.namespace(engine)
        x = xp.ones(3)
        with pytest.raises(TypeError):
            xp.apply(42, x, shape=(3,), dtype=xp.float64)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            xp.apply(np.sin, x, shape=(3,), dtype="float64")
        with pytest.raises(ValueError):
            xp.apply(np.sin, x, shape=(-1,), dtype=xp.float64)


# -- NumPy's protocols ------------------------------------------------------------------------


class TestNumpyInterop:
    async def test_ufuncs_are_pushes_returning_arrays(self, engine: ae.Engine) -> None:
        xp = aa.namespace(engine)
        x = xp.asarray([0.0, 1.0, 2.0])
        a = xp.asarray([1.0, 1.0, 1.0])
        b = xp.asarray([2.0, 3.0, 4.0])
        out = xp.zeros(3)
        hold = Hold(engine, x.var)
        hold_out = Hold(engine, out.var)
        s = np.sin(x)
        p = np.add(x, 1)
        q = np.add(1, x)
        r = np.multiply(x, np.asarray([2.0, 2.0, 2.0]))
        o = np.add(a, b, out=out)
        assert o is out
        o2 = np.subtract(out, 1.0, out=(out,))
        assert o2 is out
        for arr in (s, p, q, r, out):
            assert isinstance(arr, aa.Array)
            assert not arr.ready
        await hold.release()
        await hold_out.release()
        np.testing.assert_allclose(await s, np.sin([0.0, 1.0, 2.0]))
        np.testing.assert_array_equal(await p, [1.0, 2.0, 3.0])
        np.testing.assert_array_equal(await q, [1.0, 2.0, 3.0])
        np.testing.assert_array_equal(await r, [0.0, 2.0, 4.0])
        np.testing.assert_array_equal(await out, [2.0, 3.0, 4.0])

    async def test_functions_with_a_namespace_equivalent_are_pushes(
        self, engine: ae.Engine
    ) -> None:
        xp = aa.namespace(engine)
        x = xp.asarray([[1.0, 2.0], [3.0, 4.0]])
        y = xp.asarray([[5.0, 6.0]])
        hold = Hold(engine, x.var)
        got = {
            "mean": (np.mean(x), 2.5),
            "mean axis": (np.mean(x, axis=0), [2.0, 3.0]),
            "concatenate": (np.concatenate([x, y]), [[1, 2], [3, 4], [5, 6]]),
            "sum": (np.sum(x, axis=1), [3.0, 7.0]),
            "transpose": (np.transpose(x), [[1, 3], [2, 4]]),
            "linalg.inv": (np.linalg.inv(x), np.linalg.inv([[1.0, 2.0], [3.0, 4.0]])),
            "where": (np.where(x > 2, x, 0.0), [[0, 0], [3, 4]]),
        }
        for name, (arr, _) in got.items():
            assert isinstance(arr, aa.Array), name
            assert not arr.ready, name
        await hold.release()
        for name, (arr, want) in got.items():
            np.testing.assert_allclose(await arr, want, err_msg=name)


# -- devices --------------------------------------------------------------------------------


class TestDevices:
    async def test_default_device_is_cpu0(self, engine: ae.Engine) -> None:
        xp = aa.namespace(engine)
        for a in (xp.ones(3), xp.asarray([1]), xp.zeros(20000), xp.ones(3) + 1, xp.eye(2)):
            assert a.device == ae.cpu(0)
        info = xp.__array_namespace_info__()
        assert info.default_device() == ae.cpu(0)
        assert ae.cpu(0) in info.devices()

    async def test_simulated_gpu(self) -> None:
        sim = ae.SimulatedGPU()
        async with ae.Engine(cpu_workers=2, gpu_backend=sim) as engine:
            xp = aa.namespace(engine)
            gpu = ae.gpu(0)
            assert gpu in xp.__array_namespace_info__().devices()
            g = xp.ones((2, 3), device=gpu)
            h = xp.asarray([[1.0, 2.0, 3.0]], device=gpu)
            big = xp.zeros(20000, device=gpu)
            for a in (g, h, big, g * 2 + h, xp.sum(g, axis=0), g.T, g[0], np.sin(g)):
                assert a.device == gpu, a
            y = g * 2 + h
            got = await y
            assert type(got) is np.ndarray  # the simulated device's arrays are NumPy's
            np.testing.assert_array_equal(got, [[3.0, 4.0, 5.0], [3.0, 4.0, 5.0]])
            c = y.to_device(ae.cpu())
            assert c.device == ae.cpu(0)
            assert c.var is not y.var
            assert c.shape == (2, 3)
            assert c.dtype == np.float64
            y[0, 0] = -5.0  # a copy: c does not see later writes to y
            np.testing.assert_array_equal(await c, [[3.0, 4.0, 5.0], [3.0, 4.0, 5.0]])
            np.testing.assert_array_equal((await y)[0], [-5.0, 4.0, 5.0])
            back = (c + 1).to_device(gpu)
            assert back.device == gpu
            np.testing.assert_array_equal(await back, [[4.0, 5.0, 6.0], [4.0, 5.0, 6.0]])
            assert y.to_device(gpu) is y
            from_thread = await asyncio.to_thread(np.asarray, y)  # a sync point, GPU array
            assert type(from_thread) is np.ndarray
            np.testing.assert_array_equal(from_thread[0], [-5.0, 4.0, 5.0])
            total = xp.sum(c)
            await total
            assert float(total) == 24.0

    async def test_mixing_devices_in_one_call_raises(self) -> None:
        async with ae.Engine(cpu_workers=2, gpu_backend=ae.SimulatedGPU()) as engine:
            xp = aa.namespace(engine)
            g = xp.ones(3, device=ae.gpu(0))
            c = xp.ones(3)
            calls: list[Callable[[], Any]] = [
                lambda: g + c,
                lambda: c * g,
                lambda: xp.add(g, c),
                lambda: xp.concat([g, c]),
                lambda: xp.stack([c, g]),
                lambda: xp.where(c > 0, g, c),
                lambda: np.add(g, c),
                lambda: np.add(c, 1, out=g),
                lambda: xp.apply(np.sin, g, shape=(3,), dtype=xp.float64),
            ]

            def iadd() -> None:
                c2 = xp.ones(3)
                c2 += g

            def setitem() -> None:
                c2 = xp.ones(3)
                c2[:] = g

            for call in [*calls, iadd, setitem]:
                with pytest.raises(ValueError):
                    call()
            np.testing.assert_array_equal(await (g + g), [2.0, 2.0, 2.0])

    async def test_a_gpu_failure_names_the_device(self) -> None:
        async with ae.Engine(cpu_workers=2, gpu_backend=ae.SimulatedGPU()) as engine:
            xp = aa.namespace(engine)
            bad = xp.linalg.inv(xp.zeros((2, 2), device=ae.gpu(0)))
            dep = bad + 1
            with pytest.raises(np.linalg.LinAlgError) as ei:
                await bad
            text = _text(ei.value)
            for part in ("inv", "(2, 2)", "gpu(0)"):
                assert part in text, text
            with pytest.raises(ae.DependencyError) as d:
                await dep
            assert d.value.__cause__ is ei.value
            await engine.wait_for_all()


# -- failures -------------------------------------------------------------------------------


def _text(exc: BaseException) -> str:
    return "\n".join([str(exc), *getattr(exc, "__notes__", [])])


class TestFailures:
    async def test_a_failed_op_fails_its_output_and_every_array_computed_from_it(
        self, engine: ae.Engine
    ) -> None:
        xp = aa.namespace(engine)
        m = xp.asarray([[1.0, 2.0], [2.0, 4.0]])
        hold = Hold(engine, m.var)
        inv = xp.linalg.inv(m)
        early = inv + 1  # pushed before the failure happened
        chain = early @ early
        view_dep = xp.sum(inv[0])
        unawaited = inv * 3
        await hold.release()
        with pytest.raises(np.linalg.LinAlgError) as first:
            await inv
        original = first.value
        text = _text(original)
        for part in ("linalg.inv", "(2, 2)", "cpu(0)"):
            assert part in text, text
        for _ in range(2):  # for good
            with pytest.raises(np.linalg.LinAlgError) as again:
                await inv
            assert again.value is original
        late = inv - 1  # pushed after the failure was raised
        late_chain = xp.exp(late)
        for dep in (early, chain, view_dep, late, late_chain, early):
            with pytest.raises(ae.DependencyError) as ei:
                await dep
            assert ei.value.__cause__ is original
        assert "failed" in repr(inv)
        assert "failed" in repr(late_chain)
        del unawaited
        await engine.wait_for_all()  # raised by await: not again
        await engine.wait_for_all()
        with pytest.raises(np.linalg.LinAlgError):
            await inv

    async def test_writes_into_a_failed_array_leave_it_failed(self, engine: ae.Engine) -> None:
        xp = aa.namespace(engine)
        inv = xp.linalg.inv(xp.zeros((2, 2)))
        with pytest.raises(np.linalg.LinAlgError) as first:
            await inv
        inv[...] = 0.0
        inv += 1.0
        np.add(inv, 1.0, out=inv)
        with pytest.raises(np.linalg.LinAlgError) as again:
            await inv
        assert again.value is first.value
        await engine.wait_for_all()

    async def test_an_unawaited_failure_is_raised_once_by_wait_for_all(
        self, engine: ae.Engine
    ) -> None:
        xp = aa.namespace(engine)
        inv = xp.linalg.inv(xp.zeros((3, 3)))
        dep = inv + 1
        dep2 = xp.sum(dep * 2)
        with pytest.raises(ExceptionGroup) as group:
            await engine.wait_for_all()
        (exc,) = group.value.exceptions  # the root, once: not again per dependent
        assert isinstance(exc, np.linalg.LinAlgError)
        await engine.wait_for_all()  # thrown: not again
        with pytest.raises(np.linalg.LinAlgError) as ei:
            await inv  # still failed for good
        assert ei.value is exc
        with pytest.raises(ae.DependencyError) as d:
            await dep2
        assert d.value.__cause__ is exc
        await engine.wait_for_all()

    async def test_an_awaited_failure_is_not_raised_by_aclose(self, serial: bool) -> None:
        async with ae.Engine(cpu_workers=2, serial=serial) as engine:
            xp = aa.namespace(engine)

            def fail(a: np.ndarray) -> np.ndarray:
                raise Boom("apply")

            y = xp.apply(fail, xp.ones(2), shape=(2,), dtype=xp.float64)
            bad = xp.linalg.inv(xp.zeros((2, 2)))
            dep = y + bad
            with pytest.raises(Boom):
                await y
            with pytest.raises(np.linalg.LinAlgError):
                await bad
            with pytest.raises(ae.DependencyError):
                await dep
        # the `async with` closed it without raising

    async def test_an_unawaited_failure_is_raised_by_aclose(self, serial: bool) -> None:
        engine = ae.Engine(cpu_workers=2, serial=serial)
        xp = aa.namespace(engine)
        xp.linalg.inv(xp.zeros((2, 2)))
        with pytest.raises(ExceptionGroup) as group:
            await engine.aclose()
        assert [type(e) for e in group.value.exceptions] == [np.linalg.LinAlgError]

    async def test_a_failure_awaited_through_a_dependent_only(self, engine: ae.Engine) -> None:
        """Awaiting a dependent raises DependencyError caused by the root; the root itself is
        reported by wait_for_all at most once, and never as a DependencyError."""
        xp = aa.namespace(engine)
        inv = xp.linalg.inv(xp.zeros((2, 2)))
        dep = inv + 1
        with pytest.raises(ae.DependencyError) as d:
            await dep
        root = d.value.__cause__
        assert isinstance(root, np.linalg.LinAlgError)
        reported: list[BaseException] = []
        try:
            await engine.wait_for_all()
        except ExceptionGroup as group:
            reported.extend(group.exceptions)
        assert reported in ([], [root])
        await engine.wait_for_all()
        with pytest.raises(np.linalg.LinAlgError) as ei:
            await inv
        assert ei.value is root


# -- memory ---------------------------------------------------------------------------------


def _live_buffers(engine: ae.Engine) -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is Buffer and o.engine is engine)


class TestMemory:
    async def test_a_collected_array_deletes_its_var(self, engine: ae.Engine) -> None:
        xp = aa.namespace(engine)
        x = xp.ones(3) + 1
        var = x.var
        view = x[1:]
        y = x * 2  # an op still holding x's buffer
        del x
        gc.collect()
        await engine.push_sync(_noop, ae.cpu(), [var], [])  # the view keeps the buffer
        await y
        del view
        gc.collect()
        await engine.wait_for_all()
        with pytest.raises(ae.VarDeletedError):
            engine.push_sync(_noop, ae.cpu(), [var], [])
        np.testing.assert_array_equal(await y, [4.0, 4.0, 4.0])

    async def test_a_pending_op_keeps_its_input_until_it_ran(self, engine: ae.Engine) -> None:
        xp = aa.namespace(engine)
        x = xp.asarray([1.0, 2.0])
        var = x.var
        hold = Hold(engine, var)
        y = x + 1
        del x
        gc.collect()
        await asyncio.sleep(0)
        engine.push_sync(_noop, ae.cpu(), [var], [])  # not deleted while y's op needs it
        await hold.release()
        np.testing.assert_array_equal(await y, [2.0, 3.0])
        gc.collect()
        await engine.wait_for_all()
        with pytest.raises(ae.VarDeletedError):
            engine.push_sync(_noop, ae.cpu(), [var], [])

    @pytest.mark.parametrize(("size", "n"), [(64, 3000), (20000, 600)])
    async def test_a_long_loop_runs_in_bounded_memory(
        self, engine: ae.Engine, size: int, n: int
    ) -> None:
        asyncio.get_running_loop().set_debug(False)  # a volume test
        xp = aa.namespace(engine)
        every = 200
        a = xp.ones(size)
        base_buffers = _live_buffers(engine)
        max_pending = 0
        saved_vars: list[ae.Var] = []
        live: list[weakref.ref[aa.Array]] = []
        for i in range(n):
            a = a * 0.5 + 1
            live.append(weakref.ref(a))
            max_pending = max(max_pending, engine.pending)
            if i % every == every - 1:
                await a
                saved_vars.append(a.var)
        value = await a
        np.testing.assert_allclose(value, np.full(size, 2.0 - 0.5**n))
        assert max_pending <= 4 * every + 8  # two ops and two delete_var per iteration
        del value
        gc.collect()
        assert sum(r() is not None for r in live) <= 1
        await engine.wait_for_all()
        assert _live_buffers(engine) <= base_buffers + 2
        for var in saved_vars[:-1]:
            with pytest.raises(ae.VarDeletedError):
                engine.push_sync(_noop, ae.cpu(), [var], [])


BIG_ASSIGNMENT_SCRIPT = """\
import aioengine as ae
import aioengine.array_api as xp

assert ae.engine._COMPILED is {compiled}, "the subprocess imported the other build"
x = xp.zeros(2**30, dtype=xp.int8)  # untouched memory: only the written pages are used
x[2**30 - 1] = 7
x[2**29] = 5
print(int(x[2**30 - 1]), int(x[2**29]), int(xp.sum(x)), flush=True)
"""


def test_an_assignment_far_into_a_big_array() -> None:
    """``x[i] = v``'s target shape comes from a 0-d view of the layout stand-in, which has
    the memory of one element: reading ``x[i]`` from it read a gigabyte past it (a
    segfault). In a subprocess: a crash fails the test, not the suite."""
    env = dict(os.environ, PYTHONPATH=str(Path(ae.__file__).parent.parent))
    proc = subprocess.run(
        [sys.executable, "-c", BIG_ASSIGNMENT_SCRIPT.format(compiled=COMPILED)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tempfile.gettempdir(),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["7", "5", "12"]
