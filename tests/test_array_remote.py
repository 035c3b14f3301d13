"""Arrays whose chunks live on a Dask cluster (``aioengine/array/_remote*.py``): results vs
NumPy, aliasing across chunk boundaries, fusion (one task per chunk), keys, errors.

An in-process ``LocalCluster`` (workers are threads of this process) per test: about 50 ms to
start. Small chunks (``chunk_bytes``) so that every array has several.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aioengine as ae
import aioengine.array as aa
from aioengine.array import _remote_kernel

from .helpers import engine_keys, in_process_cluster, no_keys_left, until

pytest.importorskip("distributed")

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")

R = ae.remote()


@pytest.fixture
async def cluster() -> AsyncIterator[Any]:
    async with in_process_cluster(2, 1) as c:
        yield c


class Blocks:
    """How the tasks of a test evaluate their programs (:func:`blocks`)."""

    def __init__(self, cut: bool) -> None:
        self.cut = cut
        #: Per task, whether it was cut in blocks.
        self.taken: list[bool] = []

    def check(self) -> None:
        """With blocks, some task was cut in blocks (the path under test ran)."""
        assert any(self.taken) if self.cut else not self.taken


@pytest.fixture(params=["whole", "blocks"])
def blocks(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Blocks:
    """Each task's program evaluated whole, or in blocks of 3 elements (so that blocks cut the
    rows of 2-D arrays and straddle the chunks a halo reads): the test's results must not
    change. The workers are threads of this process, so the patch reaches them."""
    mode = Blocks(request.param == "blocks")
    if mode.cut:
        real = _remote_kernel._block_rows

        def block_rows(program: Any) -> int:
            per: int = real(program)
            mode.taken.append(per > 0)
            return per

        monkeypatch.setattr(_remote_kernel, "BLOCK_ELEMS", 3)
        monkeypatch.setattr(_remote_kernel, "_block_rows", block_rows)
    return mode


def remote_ops(engine: ae.Engine) -> int:
    pools = engine.statistics().pools
    return pools["remote"].pushed if "remote" in pools else 0


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_a_views_rows_are_the_rows_numpy_slices(data: st.DataObject) -> None:
    """``View.rows`` (a chunk's part of a view, computed without reading an address) has the
    shape, strides and offset that NumPy's own slice of the view's layout has, for views with
    steps, reversed and transposed axes."""
    from aioengine.array._meta import layout
    from aioengine.array._remote_store import View

    shape = tuple(data.draw(st.lists(st.integers(1, 7), min_size=1, max_size=3)))
    base = layout(shape, np.dtype(data.draw(st.sampled_from(["f8", "i4", "u1"]))))
    index = tuple(
        slice(
            data.draw(st.none() | st.integers(-d, d)),
            data.draw(st.none() | st.integers(-d, d)),
            data.draw(st.sampled_from([None, 1, 2, -1, -3])),
        )
        for d in shape
    )
    lay = base[index]
    if data.draw(st.booleans()):
        lay = lay.T
    if not lay.shape or lay.shape[0] == 0:
        return
    view = View(lay, base)
    lo = data.draw(st.integers(0, lay.shape[0] - 1))
    hi = data.draw(st.integers(lo + 1, lay.shape[0]))
    rows, sliced = view.rows(lo, hi), View(lay[lo:hi], base)
    assert rows.key() == sliced.key()
    assert rows.lay.shape == sliced.lay.shape
    assert rows.lay.strides == sliced.lay.strides


def test_a_window_reaches_a_worker_whole() -> None:
    """A task's Window (a class of its own, not a tuple) is pickled to a worker process with
    every field (the in-process clusters of these tests never pickle it)."""
    import pickle

    from aioengine.array._remote_kernel import Window

    window = Window((0, 2), 1, 3, (5, 2), (-16, 8), 24, np.dtype("f8"))
    back = pickle.loads(pickle.dumps(window))
    fields = ("parts", "start", "stop", "shape", "strides", "offset", "dtype")
    assert [getattr(back, f) for f in fields] == [getattr(window, f) for f in fields]


async def test_placement_and_gather(cluster: Any) -> None:
    async with ae.Engine(cluster=cluster) as engine:
        xp = aa.namespace(engine, chunk_bytes=8 * 100)
        a = np.arange(1000.0).reshape(250, 4)
        x = xp.asarray(a, device=R)
        assert (x.shape, x.dtype, x.device, x.chunks) == ((250, 4), a.dtype, R, 10)
        assert np.array_equal(await x, a)
        assert np.array_equal(await x[3:200:7, 1:], a[3:200:7, 1:])
        local = x.to_device(ae.cpu())
        assert isinstance(local, aa.Array)
        assert np.array_equal(await local, a)
        back = local.to_device(R)
        assert np.array_equal(await back, a)
        for got, want in [
            (xp.zeros((30, 3), device=R), np.zeros((30, 3))),
            (xp.ones(77, dtype=xp.int32, device=R), np.ones(77, np.int32)),
            (xp.full((40,), 2.5, device=R), np.full(40, 2.5)),
            (xp.arange(3, 500, 4, device=R), np.arange(3, 500, 4)),
            (xp.arange(0.0, 30.0, 0.25, device=R), np.arange(0.0, 30.0, 0.25)),
            (xp.linspace(-1, 1, 301, device=R), np.linspace(-1, 1, 301)),
            (xp.zeros_like(x), np.zeros_like(a)),
        ]:
            value = await got
            assert value.dtype == want.dtype
            assert np.allclose(value, want)


async def test_fused_chain_is_one_task_per_chunk(cluster: Any) -> None:
    async with ae.Engine(cluster=cluster) as engine:
        xp = aa.namespace(engine, chunk_bytes=8 * 128)
        a = np.linspace(0, 3, 1024)
        x = xp.asarray(a, device=R)
        await x
        before = remote_ops(engine)
        y = xp.sin(x) * 2.0 + x
        y = xp.where(y > 1.0, y, -y)
        y = xp.astype(y * y, xp.float32)
        got = await y
        assert remote_ops(engine) - before == x.chunks == 8
        want = np.sin(a) * 2.0 + a
        want = np.where(want > 1.0, want, -want)
        assert np.allclose(got, (want * want).astype(np.float32))


async def test_reduction_moves_partials_not_the_array(cluster: Any, blocks: Blocks) -> None:
    async with ae.Engine(cluster=cluster) as engine:
        xp = aa.namespace(engine, chunk_bytes=8 * 128)
        a = np.linspace(-2, 5, 1000)
        x = xp.asarray(a, device=R)
        await x
        before = remote_ops(engine)
        s = xp.sum(x * x)
        assert s.shape == ()
        assert np.isclose(float(await s), np.sum(a * a))
        assert remote_ops(engine) - before == x.chunks + 1  # partials fused, one combine
        for name in ("sum", "prod", "max", "min", "mean"):
            got = await getattr(xp, name)(x[::3] / 4.0)
            assert np.isclose(got, getattr(np, name)(a[::3] / 4.0)), name
        with pytest.raises(NotImplementedError, match="every axis"):
            xp.sum(x, axis=0, keepdims=True)
        k = xp.asarray(np.arange(1000), device=R)  # integers: exact, whole or in blocks
        assert int(await xp.sum(k * 3 - 7)) == int(np.sum(np.arange(1000) * 3 - 7))
        assert int(await xp.max(k % 97 - 50)) == 46
        blocks.check()


@pytest.mark.parametrize("n", [8, 10_000, 20_000])
async def test_cupynumeric_aliasing_programs(cluster: Any, n: int, blocks: Blocks) -> None:
    async with ae.Engine(cluster=cluster) as engine:
        xp = aa.namespace(engine, chunk_bytes=8 * 3000)
        base = np.arange(n, dtype=np.float64) * 0.5 + 1.0
        data = xp.asarray(base, device=R)
        data[1:] += data[:-1]  # cupynumeric#1110
        want = base.copy()
        want[1:] += want[:-1]
        assert np.array_equal(await data, want)
        a = xp.asarray(base, device=R)
        a[0:2] = a[1:3]  # cupynumeric#40
        want = base.copy()
        want[0:2] = want[1:3]
        assert np.array_equal(await a, want)
        b = xp.asarray(base, device=R)
        b[2:] = b[:-2] + b[2:]  # overlapping source and destination (#57's shape)
        want = base.copy()
        want[2:] = want[:-2] + want[2:]
        assert np.array_equal(await b, want)
        blocks.check()


async def test_stencil_halo_rows_and_in_place_writes(cluster: Any, blocks: Blocks) -> None:
    async with ae.Engine(cluster=cluster) as engine:
        xp = aa.namespace(engine, chunk_bytes=8 * 64)
        u0 = np.random.default_rng(1).random((40, 16))
        u = xp.asarray(u0, device=R)
        want = u0.copy()
        before = remote_ops(engine)
        for _ in range(5):
            u[1:-1, 1:-1] = u[1:-1, 1:-1] + 0.1 * (
                u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:] - 4 * u[1:-1, 1:-1]
            )
            want[1:-1, 1:-1] = want[1:-1, 1:-1] + 0.1 * (
                want[:-2, 1:-1] + want[2:, 1:-1] + want[1:-1, :-2] + want[1:-1, 2:]
                - 4 * want[1:-1, 1:-1]
            )  # fmt: skip
        assert np.allclose(await u, want)
        assert remote_ops(engine) - before == 5 * u.chunks  # one write task per chunk a step
        x = xp.asarray(np.arange(100.0), device=R)
        x[:10] += 1
        x[95] = -1
        x[::-7] = 0.0
        x[10:90] = np.arange(80.0)  # a NumPy value across two chunks: each gets its rows
        x[::-2] = -np.arange(50.0)
        w = np.arange(100.0)
        w[:10] += 1
        w[95] = -1
        w[::-7] = 0.0
        w[10:90] = np.arange(80.0)
        w[::-2] = -np.arange(50.0)
        assert np.array_equal(await x, w)
        mine = np.arange(100.0)
        sent = xp.asarray(mine, device=R)
        mine[:] = -1.0  # the caller's array changes at once: what was sent does not
        assert np.array_equal(await sent, np.arange(100.0))
        y = xp.asarray(np.arange(200.0).reshape(50, 4), device=R)
        z = xp.sin(y[::-3]) * 2.0 + y[1::3, ::-1]  # strided windows: read whole, then cut
        assert np.allclose(await z, np.sin(np.arange(200.0).reshape(50, 4)[::-3]) * 2.0
                           + np.arange(200.0).reshape(50, 4)[1::3, ::-1])  # fmt: skip
        blocks.check()


async def test_a_value_read_before_a_write_keeps_its_version(cluster: Any) -> None:
    async with ae.Engine(cluster=cluster) as engine:
        xp = aa.namespace(engine, chunk_bytes=8 * 16)
        x = xp.asarray(np.arange(64.0), device=R)
        y = x * 2  # pending: reads x as it is now
        v = x[10:20]  # a view sees later writes
        x[...] = 0.0
        assert np.array_equal(await y, np.arange(64.0) * 2)
        assert np.array_equal(await v, np.zeros(10))


OPS = ["add", "subtract", "multiply", "maximum", "negative", "abs", "sin", "square", "greater"]


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    program=st.lists(
        st.tuples(st.sampled_from(OPS), st.integers(0, 3), st.integers(0, 3), st.floats(-2, 2)),
        min_size=1,
        max_size=6,
    ),
    writes=st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50), st.integers(0, 3))),
)
def test_random_programs_match_numpy(
    blocks: Blocks,
    program: list[tuple[str, int, int, float]],
    writes: list[tuple[int, int, int]],
) -> None:
    async def run() -> None:
        async with in_process_cluster(1, 2) as cluster, ae.Engine(cluster=cluster) as engine:
            xp = aa.namespace(engine, chunk_bytes=8 * 7)
            base = np.linspace(-3, 3, 50)
            mine = [xp.asarray(base + k, device=R) for k in range(4)]
            ref = [base + k for k in range(4)]
            for name, i, j, c in program:
                fn, npf = getattr(xp, name), getattr(np, name)
                if name in ("negative", "abs", "sin", "square"):
                    mine.append(fn(mine[-1 - i]))
                    ref.append(npf(ref[-1 - i]))
                elif name == "greater":
                    mine.append(xp.where(fn(mine[-1 - i], c), mine[-1 - j], c))
                    ref.append(np.where(npf(ref[-1 - i], c), ref[-1 - j], c))
                else:
                    mine.append(fn(mine[-1 - i], mine[-1 - j]) + c)
                    ref.append(npf(ref[-1 - i], ref[-1 - j]) + c)
            for lo, hi, k in writes:  # in-place writes through views, overlapping sources
                lo, hi = min(lo, hi), max(lo, hi)
                n = hi - lo
                mine[-1][lo:hi] = mine[-1 - k][50 - n :] * 0.5
                ref[-1][lo:hi] = ref[-1 - k][50 - n :] * 0.5
            for m, r in zip(mine, ref, strict=True):
                assert np.allclose(await m, r, equal_nan=True)

    asyncio.run(run())


def _row_norms(x: np.ndarray[Any, Any], scale: float) -> np.ndarray[Any, Any]:
    return scale * np.sqrt(np.sum(x * x, axis=1, keepdims=True))


def _load_rows(base: float, *, rows: slice) -> np.ndarray[Any, Any]:
    """A loader: the rows it is asked for (a shard of a file on the worker)."""
    return base + np.arange(rows.start, rows.stop, dtype=np.float64)


async def test_apply_runs_per_chunk_on_the_workers(cluster: Any) -> None:
    async with ae.Engine(cluster=cluster) as engine:
        xp = aa.namespace(engine, chunk_bytes=8 * 40)
        a = np.linspace(-3, 3, 400).reshape(100, 4)
        x = xp.asarray(a, device=R)
        await x
        before = remote_ops(engine)
        # A per-row function (the result keeps the leading axis), fused with what follows.
        norms = xp.apply(_row_norms, x * 2.0, 0.5, shape=(100, 1), dtype=xp.float64)
        got = await (norms + 1.0)
        assert np.allclose(got, _row_norms(a * 2.0, 0.5) + 1.0)
        assert remote_ops(engine) - before <= 2 * x.chunks  # per chunk, never a gather
        # A loader: no array argument, each chunk read on a worker.
        loaded = xp.apply(_load_rows, 10.0, shape=(1000,), dtype=xp.float64, device=R)
        assert loaded.chunks > 1
        assert np.array_equal(await loaded, 10.0 + np.arange(1000.0))
        assert float(await xp.sum(loaded)) == np.sum(10.0 + np.arange(1000.0))
        # What apply checks: the arrays' leading axis, and the result's dtype and shape.
        with pytest.raises(ValueError, match="leading axis"):
            xp.apply(np.sum, x, shape=(100,), dtype=xp.float64)
        with pytest.raises(ValueError, match="leading axis"):
            xp.apply(np.sum, x, shape=(), dtype=xp.float64)
        with pytest.raises(ValueError, match="different devices"):
            xp.apply(np.negative, xp.asarray(a), shape=(100, 4), dtype=xp.float64, device=R)
        with pytest.raises(TypeError, match="argument of its own"):
            xp.apply(np.concatenate, [x, x], shape=(100, 4), dtype=xp.float64)
        wrong = xp.apply(np.negative, x, shape=(100, 4), dtype=xp.float32)
        with pytest.raises(ae.DependencyError, match="dtype float64, not float32"):
            await wrong
        with pytest.raises(BaseExceptionGroup):  # one failure per chunk, each reported
            await engine.wait_for_all()
        here = xp.apply(
            np.negative, xp.asarray(a), shape=(100, 4), dtype=xp.float64, device=ae.cpu()
        )
        assert np.array_equal(await here, -a)
        with pytest.raises(ValueError, match="CPU pool or the cluster"):
            xp.apply(np.negative, xp.asarray(a), shape=(100, 4), dtype=xp.float64, device=ae.gpu())


def _rows_seen(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return np.full(len(x), float(len(x)))


def _plus_len(x: np.ndarray[Any, Any], items: list[Any]) -> np.ndarray[Any, Any]:
    return x + len(items)


_BIG = np.arange(320.0).reshape(80, 4)


def _every_other_row(*, rows: slice) -> np.ndarray[Any, Any]:
    """A loader returning a strided view (rows of ``_BIG[::2]``)."""
    return _BIG[2 * rows.start : 2 * rows.stop : 2]


def _record_field(*, rows: slice) -> np.ndarray[Any, Any]:
    """A loader returning one field of a record array (a stride of 16 bytes)."""
    rec = np.zeros(rows.stop - rows.start, dtype=[("a", "f8"), ("b", "f8")])
    rec["a"] = np.arange(rows.start, rows.stop)
    return rec["a"]


async def test_apply_sees_whole_chunks_and_strided_chunks_read_right(
    cluster: Any, blocks: Blocks
) -> None:
    # apply's function runs on all of a chunk's rows, however a task cuts elementwise work;
    # chunks that are strided views (a loader's, a one-row chunk's) are read as their rows.
    async with ae.Engine(cluster=cluster) as engine:
        xp = aa.namespace(engine, chunk_bytes=8 * 40)
        x = xp.asarray(np.zeros(100), device=R)
        seen = await xp.apply(_rows_seen, x * 2.0, shape=(100,), dtype=xp.float64)
        assert np.array_equal(seen, np.array([40.0] * 80 + [20.0] * 20))
        plus = await xp.apply(_plus_len, x, [[1, 2], [3]], shape=(100,), dtype=xp.float64)
        assert np.array_equal(plus, np.full(100, 2.0))
        y = xp.apply(_record_field, shape=(200,), dtype=xp.float64, device=R)
        assert np.array_equal(await (y[::2] + 0.0), np.arange(0.0, 200.0, 2.0))
        blocks.check()
    async with ae.Engine(cluster=cluster) as engine:
        rows = aa.namespace(engine, chunk_bytes=32)  # one row of 4 per chunk
        z = rows.apply(_every_other_row, shape=(40, 4), dtype=rows.float64, device=R)
        assert np.array_equal(await (z[::2, 0] * 1.0), _BIG[::2][::2, 0])
        w = rows.asarray(_BIG)[::2].to_device(R)
        assert np.array_equal(await (w[::2, 0] * 1.0), _BIG[::2][::2, 0])


async def test_errors_name_the_function_and_how_to_gather(cluster: Any) -> None:
    async with ae.Engine(cluster=cluster) as engine:
        xp = aa.namespace(engine, chunk_bytes=8 * 16)
        x = xp.asarray(np.arange(40.0), device=R)
        with pytest.raises(NotImplementedError, match=r"xp\.sort .*to_device\(ae\.cpu\(\)\)"):
            xp.sort(x)
        with pytest.raises(IndexError, match="basic indices"):
            x[np.array([1, 2])]
        with pytest.raises(ValueError, match="different devices"):
            x + xp.asarray(np.arange(40.0))
        with pytest.raises(TypeError, match="cannot change the dtype"):
            x += xp.asarray(np.arange(40.0) + 1j, device=R)
        with pytest.raises(ValueError, match="broadcast"):
            x[:5] = x[:6]
        with pytest.raises(aa.PendingArrayError):
            float(xp.sum(x))  # on the loop thread: await instead
        assert float(await xp.sum(x)) == np.sum(np.arange(40.0))


@pytest.mark.filterwarnings("error::RuntimeWarning")
async def test_a_failed_chunk_fails_the_array_and_names_it(cluster: Any) -> None:
    # In-process workers share this process's warnings filters: a NumPy warning raises there.
    async with ae.Engine(cluster=cluster) as engine:
        xp = aa.namespace(engine, chunk_bytes=8 * 16)
        x = xp.asarray(np.arange(40), device=R)
        y = x // 0
        with pytest.raises(ae.DependencyError, match="divide by zero") as info:
            await y
        assert any("remote array 'floor_divide'" in note for note in info.value.__notes__)
        z = y + 1  # what reads it is skipped too
        with pytest.raises(ae.DependencyError):
            await z
        with pytest.raises(BaseExceptionGroup):
            await engine.wait_for_all()
        assert np.array_equal(await (x + 1), np.arange(40) + 1)


async def test_dropped_arrays_and_aclose_release_keys(cluster: Any) -> None:
    engine = ae.Engine(cluster=cluster)
    async with engine:
        xp = aa.namespace(engine, chunk_bytes=8 * 16)
        keep = xp.asarray(np.arange(64.0), device=R)
        drop = xp.sin(keep) + 1
        await drop
        await keep
        count = len(engine_keys(cluster, engine))
        del drop
        gc.collect()
        for _ in range(300):
            if len(engine_keys(cluster, engine)) <= count - 4:
                break
            await asyncio.sleep(0.01)
        assert len(engine_keys(cluster, engine)) == keep.chunks
        assert np.array_equal(await keep, np.arange(64.0))
    await no_keys_left(cluster, engine)


def test_a_worker_that_dies_fails_what_dask_cannot_recompute_and_names_it() -> None:
    """Worker processes (processes=True): one is killed mid-program. Chunks Dask can make
    again (a creation's) are recomputed; an array computed from data sent from here cannot
    be, and reading what depends on it raises an error naming the chunk, the worker and the
    array (it used to be a FutureCancelledError naming nothing, which also failed the
    unrelated arrays pushed with it). Never a hang, never a wrong value."""
    import os
    import signal

    import distributed

    async def main() -> None:
        async with (
            distributed.LocalCluster(  # type: ignore[no-untyped-call]
                processes=True, n_workers=2, threads_per_worker=1, dashboard_address=":0",
                asynchronous=True,
            ) as cluster,
            ae.Engine(cluster=cluster) as engine,
        ):  # fmt: skip
            xp = aa.namespace(engine, chunk_bytes=8 * 16)
            a = np.arange(64.0)
            x = xp.asarray(a, device=R)  # sent from here: Dask cannot make it again
            z = xp.arange(64.0, device=R)  # made on the workers: Dask can
            y = x * 2
            await z
            await engine.wait_for_all()
            assert y._store.chunks is not None
            key = y._store.chunks[0]._value.future.key
            victim = next(iter(cluster.scheduler.tasks[key].who_has)).address
            nanny = next(n for n in cluster.workers.values() if n.worker_address == victim)
            os.kill(nanny.process.process.pid, signal.SIGKILL)
            await until(lambda: victim not in cluster.scheduler.workers, 30)
            w = y + 1
            v = z + 1
            with pytest.raises(ae.DependencyError) as info:
                await asyncio.wait_for(w, 60)
            text = str(info.value)
            assert victim in text
            assert "'multiply[0]'" in text
            assert "died" in text
            assert any("remote array 'add'" in note for note in info.value.__notes__)
            # z's lost chunks are made again; v's tasks, cancelled by Dask with w's (one graph
            # with a lost input), are sent again.
            got = await asyncio.wait_for(v, 60)
            assert got.dtype == np.float64
            assert np.array_equal(got, a + 1)
            with pytest.raises(BaseExceptionGroup):
                await asyncio.wait_for(engine.wait_for_all(), 60)

    asyncio.run(main())


async def test_zarr_round_trips_chunk_by_chunk_on_the_workers(cluster: Any, tmp_path: Any) -> None:
    zarr = pytest.importorskip("zarr")
    rng = np.random.default_rng(3)
    a = rng.random((90, 7))
    src = str(tmp_path / "in.zarr")
    zarr.create_array(src, shape=a.shape, dtype=a.dtype, chunks=(10, 7))[...] = a
    async with ae.Engine(cluster=cluster) as engine:
        xp = aa.namespace(engine, chunk_bytes=8 * 7 * 25)
        before = remote_ops(engine)
        u = xp.from_zarr(src, device=R)
        assert (u.shape, u.dtype, u.chunks) == (a.shape, a.dtype, 5)  # 20 rows: 2 Zarr chunks
        assert remote_ops(engine) - before == u.chunks  # one read task per chunk
        u[1:-1] = 0.5 * (u[:-2] + u[2:])  # a halo write, then back to Zarr
        want = a.copy()
        want[1:-1] = 0.5 * (want[:-2] + want[2:])
        dst = str(tmp_path / "out.zarr")
        before = remote_ops(engine)
        assert await u.to_zarr(dst) == a.size
        assert remote_ops(engine) - before == u.chunks  # one write task per chunk
        assert np.array_equal(zarr.open_array(dst, mode="r")[...], want)
        assert zarr.open_array(dst, mode="r").chunks == (20, 7)
        # A view is written as an array of its own; wait_for_all() covers the write.
        view = str(tmp_path / "view.zarr")
        u[::3, 2:].to_zarr(view)
        await engine.wait_for_all()
        assert np.array_equal(zarr.open_array(view, mode="r")[...], want[::3, 2:])
        # Local reads: one operation on the CPU pool.
        local = xp.from_zarr(dst)
        assert isinstance(local, aa.Array)
        assert np.array_equal(await local, want)
        assert np.array_equal(await xp.from_zarr(view, device=R), want[::3, 2:])
        with pytest.raises(Exception, match=r"not found|does not exist|No array"):
            xp.from_zarr(str(tmp_path / "missing.zarr"), device=R)


SYNC_SCRIPT = """
import numpy as np
import aioengine as ae
import aioengine.array_api as xp

u = xp.asarray(np.arange(4000.0))  # no device: on the cluster
assert u.device == ae.remote(), u.device
z = xp.zeros(4000)
assert z.device == ae.remote()
for _ in range(3):
    u[1:-1] = 0.5 * (u[:-2] + u[2:])
want = np.arange(4000.0)
for _ in range(3):
    want[1:-1] = 0.5 * (want[:-2] + want[2:])
assert np.allclose(np.asarray(u), want)
assert float(xp.sum(u + z)) == float(np.sum(want))
assert xp.asarray(np.ones(3), device=ae.cpu()).device == ae.cpu()
print("on the cluster", u.chunks)
"""


def test_array_api_scales_out_with_aioengine_cluster() -> None:
    """A synchronous script on ``aioengine.array_api``, unchanged, with AIOENGINE_CLUSTER set:
    the arrays it places live on the cluster (a subprocess: the module's engine is global)."""
    import os
    import subprocess
    import sys

    import distributed

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with distributed.LocalCluster(  # type: ignore[no-untyped-call]
        processes=False,
        n_workers=1,
        threads_per_worker=2,
        dashboard_address=":0",
        protocol="tcp",
    ) as cluster:
        env = dict(
            os.environ,
            AIOENGINE_CLUSTER=cluster.scheduler_address,
            AIOENGINE_ARRAY_CHUNK_BYTES="8000",
            PYTHONPATH=root,
        )
        proc = subprocess.run(
            [sys.executable, "-c", SYNC_SCRIPT],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "on the cluster 4" in proc.stdout
