"""Engine-backed arrays (``aioengine.array``) across threads: sync points, ``BlockingEngine``,
``aioengine.array_api``, backpressure, and the rule under concurrency (writers through views
against readers on other threads).

Sync points (``bool(x)``, ``float(x)``, ``np.asarray(x)``, ``x.tolist()``, pickling, ...) block
off the engine's loop thread until the value is ready and raise
:class:`~aioengine.array.PendingArrayError` on it while the value is pending. A raw writer on
the array's Var holds the value back and then changes it (the array shares a NumPy array's
memory: ``xp.asarray(base)``), so "it waited" is proved by the value a sync point returns,
never by timing.
"""

from __future__ import annotations

import asyncio
import hashlib
import operator
import os
import pickle
import random
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import aioengine as ae
import aioengine.array as aa

from .conftest import COMPILED, Hold
from .helpers import Pushes, chain


def _noop(rctx: ae.RunContext) -> None:
    pass


def _signalled(event: threading.Event, point: Callable[[aa.Array], Any], x: aa.Array) -> Any:
    """``point(x)`` on this thread, once ``event`` has told the test it is about to call it
    (x's writer still holds it then, so the call can only return after the release)."""
    event.set()
    return point(x)


# -- the sync points ------------------------------------------------------------------------

# name -> (shape, dtype, the sync point, what it gives once the value is 5 everywhere)
SYNC_POINTS: dict[str, tuple[tuple[int, ...], Any, Callable[[aa.Array], Any], Any]] = {
    "bool": ((), np.float64, bool, True),
    "int": ((), np.int64, int, 5),
    "float": ((), np.float64, float, 5.0),
    "complex": ((), np.float64, complex, 5 + 0j),
    "index": ((), np.int64, operator.index, 5),
    "__array__": ((3,), np.float64, np.asarray, [5.0, 5.0, 5.0]),
    "__dlpack__": ((3,), np.float64, np.from_dlpack, [5.0, 5.0, 5.0]),
    "tolist": ((2, 2), np.int64, lambda x: x.tolist(), [[5, 5], [5, 5]]),
    "pickle": ((3,), np.float64, lambda x: pickle.loads(pickle.dumps(x)), [5.0, 5.0, 5.0]),
}


def _check(name: str, got: Any, want: Any) -> None:
    if name == "pickle":
        assert type(got) is np.ndarray  # an Array unpickles to a NumPy array
    if isinstance(want, list):
        np.testing.assert_array_equal(got, want)
        if name == "tolist":
            assert type(got) is list
    else:
        assert got == want
        assert type(got) is type(want), (got, want)


def _zeros(xp: aa.Namespace, name: str) -> tuple[aa.Array, np.ndarray]:
    """An array sharing the memory of a zero NumPy array (so a raw writer can set it)."""
    shape, dtype, _, _ = SYNC_POINTS[name]
    base = np.zeros(shape, dtype=dtype)
    return xp.asarray(base), base


def _set5(base: np.ndarray) -> Callable[[], None]:
    def effect() -> None:
        base[...] = 5

    return effect


@pytest.mark.parametrize("name", list(SYNC_POINTS))
class TestSyncPoints:
    async def test_on_the_loop_thread_a_pending_array_raises(
        self, engine: ae.Engine, name: str
    ) -> None:
        xp = aa.namespace(engine)
        _, _, point, want = SYNC_POINTS[name]
        x, base = _zeros(xp, name)
        hold = Hold(engine, x.var, effect=_set5(base))
        y = x + 0  # an operation's result, pending too
        for a in (x, y):
            with pytest.raises(aa.PendingArrayError) as ei:
                point(a)
            assert isinstance(ei.value, ValueError)
            assert isinstance(ei.value, RuntimeError)
            assert "await" in str(ei.value)
        await hold.release()
        await x
        await y
        # Ready: it answers on the loop thread too.
        _check(name, point(x), want)
        _check(name, point(y), want)

    async def test_off_the_loop_thread_it_blocks_until_ready(
        self, engine: ae.Engine, name: str
    ) -> None:
        xp = aa.namespace(engine)
        _, _, point, want = SYNC_POINTS[name]
        x, base = _zeros(xp, name)
        hold = Hold(engine, x.var, effect=_set5(base))
        y = x + 0
        calling = [threading.Event(), threading.Event()]
        tasks = [
            asyncio.ensure_future(asyncio.to_thread(_signalled, event, point, a))
            for event, a in zip(calling, (x, y), strict=True)
        ]
        await hold.started.wait()
        for event in calling:  # each thread is at its sync point while the writer holds x
            assert await asyncio.to_thread(event.wait, 30)
        assert not any(t.done() for t in tasks)
        await hold.release()
        for t in tasks:
            _check(name, await asyncio.wait_for(t, 30), want)  # it saw the raw writer's value
        # Ready: from a thread it answers at once.
        _check(name, await asyncio.to_thread(point, x), want)

    async def test_off_the_loop_thread_before_any_array_op_was_pushed(
        self, engine: ae.Engine, name: str
    ) -> None:
        """The same, where the namespace has pushed no array operation yet (the array was
        made from a NumPy array; only the raw writer was pushed)."""
        xp = aa.namespace(engine)
        _, _, point, want = SYNC_POINTS[name]
        x, base = _zeros(xp, name)
        hold = Hold(engine, x.var, effect=_set5(base))
        calling = threading.Event()
        task = asyncio.ensure_future(asyncio.to_thread(_signalled, calling, point, x))
        await hold.started.wait()
        assert await asyncio.to_thread(calling.wait, 30)  # at its sync point, x still held
        assert not task.done()
        await hold.release()
        _check(name, await asyncio.wait_for(task, 30), want)

    def test_a_script_on_a_blocking_engine_blocks_until_ready(self, name: str) -> None:
        _, _, point, want = SYNC_POINTS[name]
        with ae.BlockingEngine(cpu_workers=2) as be:
            xp = aa.namespace(be)
            x, base = _zeros(xp, name)
            release = threading.Event()

            def writer(rctx: ae.RunContext) -> None:
                assert release.wait(30)
                base[...] = 5

            be.push_sync(writer, ae.cpu(), [], [x.var], name="writer")
            y = x + 0
            timer = threading.Timer(0.02, release.set)
            timer.start()
            try:
                _check(name, point(x), want)  # no array op pushed on x itself yet
                _check(name, point(y), want)
                _check(name, point(x), want)
            finally:
                release.set()
                timer.join()

    def test_a_script_blocks_for_an_array_of_an_unused_namespace(self, name: str) -> None:
        """The first thing the script does with the namespace is a sync point behind a raw
        writer: the namespace has pushed no array operation yet."""
        _, _, point, want = SYNC_POINTS[name]
        with ae.BlockingEngine(cpu_workers=2) as be:
            xp = aa.namespace(be)
            x, base = _zeros(xp, name)
            release = threading.Event()

            def writer(rctx: ae.RunContext) -> None:
                assert release.wait(30)
                base[...] = 5

            be.push_sync(writer, ae.cpu(), [], [x.var], name="writer")
            timer = threading.Timer(0.02, release.set)
            timer.start()
            try:
                _check(name, point(x), want)
            finally:
                release.set()
                timer.join()


class TestSyncPointsMore:
    async def test_failed_array_raises_its_failure_from_a_thread(self, engine: ae.Engine) -> None:
        xp = aa.namespace(engine)
        bad = xp.linalg.inv(xp.zeros((2, 2)))
        dep = xp.sum(bad)
        with pytest.raises(np.linalg.LinAlgError) as ei:
            await asyncio.to_thread(bad.tolist)
        with pytest.raises(ae.DependencyError) as d:
            await asyncio.to_thread(float, dep)
        assert d.value.__cause__ is ei.value
        with pytest.raises(np.linalg.LinAlgError):
            await bad
        await engine.wait_for_all()  # raised to the user already

    async def test_a_sync_point_result_never_changes(self, engine: ae.Engine) -> None:
        xp = aa.namespace(engine)
        x = xp.asarray([1.0, 2.0, 3.0], copy=True)
        await x
        got = [np.asarray(x), np.asarray(x[1:]), np.from_dlpack(x), x.tolist()]
        from_thread = await asyncio.to_thread(np.asarray, x)
        x[...] = 0.0
        x += 7.0
        np.testing.assert_array_equal(await x, [7.0, 7.0, 7.0])
        np.testing.assert_array_equal(got[0], [1.0, 2.0, 3.0])
        np.testing.assert_array_equal(got[1], [2.0, 3.0])
        np.testing.assert_array_equal(got[2], [1.0, 2.0, 3.0])
        assert got[3] == [1.0, 2.0, 3.0]
        np.testing.assert_array_equal(from_thread, [1.0, 2.0, 3.0])

    def test_blocking_engine_script(self) -> None:
        with ae.BlockingEngine(cpu_workers=2) as be:
            xp = aa.namespace(be)
            assert aa.namespace(be) is xp
            a = xp.reshape(xp.arange(6.0), (2, 3))
            b = a @ a.T + 1
            assert b.__array_namespace__() is xp
            assert b.tolist() == [[6.0, 15.0], [15.0, 51.0]]
            assert float(xp.sum(b)) == 87.0
            assert int(xp.argmax(xp.reshape(b, (4,)))) == 3
            b[0, 0] = 100.0
            assert bool(b[0, 0] == 100.0)
            np.testing.assert_array_equal(np.asarray(b)[0], [100.0, 15.0])
            bad = xp.linalg.inv(xp.zeros((2, 2)))
            with pytest.raises(np.linalg.LinAlgError):
                bad.tolist()
            be.wait_for_all()  # raised to the user by the sync point... not again


# -- a sync point inside an operation -------------------------------------------------------

INSIDE_SCRIPT = """\
import asyncio, threading
import numpy as np
import aioengine as ae, aioengine.array as aa

assert ae.engine._COMPILED is {compiled}, "the subprocess imported the other build"

async def main():
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine)
        x = xp.zeros(4)
        x[0] = 1.0
        seen = []
        go = threading.Event()

        def reader(rctx):
            assert go.wait(10)
            try:
                seen.append(np.array(x).tolist())  # holds a read turn on x.var
            except aa.PendingArrayError as exc:
                seen.append(type(exc))

        # Nothing queued behind the reader: x is ready, the reader reads it.
        op = engine.push_sync(reader, ae.cpu(), [x.var], [])
        go.set()
        await asyncio.wait_for(op, 10)
        assert seen == [[1.0, 0.0, 0.0, 0.0]], seen

        # A write queued behind the reader: x is pending, and waiting for it there could
        # only deadlock (the write waits for the reader): PendingArrayError, at once.
        seen.clear()
        go.clear()
        op = engine.push_sync(reader, ae.cpu(), [x.var], [])
        x[1] = 2.0
        go.set()
        await asyncio.wait_for(op, 10)
        assert seen == [aa.PendingArrayError], seen
        assert (await x).tolist() == [1.0, 2.0, 0.0, 0.0]

asyncio.run(main())
print("ok", flush=True)
"""


def test_a_sync_point_inside_a_raw_reader_of_the_array() -> None:
    """A raw reader of ``x.var`` on the CPU pool reads ``x`` (a sync point). With nothing
    queued behind it, it gets the value; with a write of ``x`` queued behind it, waiting for
    that write could only deadlock (it waits for the reader): PendingArrayError, never a hang.
    In a subprocess: a deadlock fails the test, not the suite."""
    script = INSIDE_SCRIPT.format(compiled=COMPILED)
    env = dict(os.environ, PYTHONPATH=str(Path(ae.__file__).parent.parent))
    try:
        proc = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=30,
            env=env,
            cwd=tempfile.gettempdir(),
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"deadlock: the script did not finish within 30 s: {exc.stderr!r}")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "ok", proc.stdout


async def test_a_sync_point_inside_an_operation_not_holding_the_array(
    threaded_engine: ae.Engine,
) -> None:
    """An operation that does not name ``x.var`` reads ``x`` while a write of ``x`` is
    pending (queued behind a raw reader that another operation holds): ``x`` is not ready and
    waiting there could deadlock, so it is PendingArrayError, not the value from before the
    pending write (nor, once the raw reader ends, memory the write is changing)."""
    engine = threaded_engine
    xp = aa.namespace(engine)
    x = xp.zeros(3)
    await x
    go = threading.Event()
    reader = engine.push_sync(lambda r: go.wait(30), ae.cpu(), [x.var], [], name="reader")
    x[0] = 1.0  # queued behind the raw reader
    seen: list[Any] = []

    def other(rctx: ae.RunContext) -> None:
        try:
            ready = x.ready
            try:
                seen.append((ready, np.asarray(x).tolist()))
            except aa.PendingArrayError:
                seen.append((ready, "PendingArrayError"))
        finally:
            go.set()

    await engine.push_sync(other, ae.cpu(), [], [engine.new_var()], name="other")
    await reader
    assert seen == [(False, "PendingArrayError")]
    np.testing.assert_array_equal(await x, [1.0, 0.0, 0.0])


# -- the rule under concurrency ---------------------------------------------------------------


def _digest(a: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(a).tobytes(), digest_size=16).digest()


class Program:
    """A base array (64 x 512 float64: whole writes run on the pool, row and column writes
    inline), views of it, and the NumPy model of the same: ``write(k)`` makes the k-th write
    through a view (a setitem or an in-place add) on both and returns the model's digest."""

    def __init__(self, xp: aa.Namespace, seed: int) -> None:
        self.rng = random.Random(seed)
        self.base = np.zeros((64, 512))
        self.model = np.zeros((64, 512))
        self.x = xp.asarray(self.base)  # shares base's memory: raw readers copy base
        x, m = self.x, self.model
        self.views: list[tuple[aa.Array, np.ndarray]] = [
            (x, m),
            (x[3], m[3]),
            (x[10:40, 100:300], m[10:40, 100:300]),
            (x.T[7], m.T[7]),
            (x.T, m.T),
            (xp.reshape(x, (32768,))[1000:9000], m.reshape(32768)[1000:9000]),
            (xp.reshape(x[20:30], (10, 16, 32))[:, 3], m[20:30].reshape(10, 16, 32)[:, 3]),
        ]
        for v, _ in self.views:
            assert v.var is x.var
        self.digests = [_digest(m)]

    def write(self, k: int) -> None:
        v, mv = self.rng.choice(self.views)
        if self.rng.random() < 0.5:
            v[...] = float(k)
            mv[...] = float(k)
        else:
            v += float(k)
            mv += float(k)
        self.digests.append(_digest(self.model))


class TestConcurrentViews:
    @pytest.mark.parametrize("seed", range(3))
    async def test_writers_through_views_against_raw_readers_on_other_threads(
        self, engine: ae.Engine, seed: int
    ) -> None:
        """Writes through views from the loop thread; raw readers of ``x.var`` pushed from two
        other threads, running on the CPU pool, copy the buffer. Pushes are serialized by a
        lock (to know each reader's place in push order), execution is not: each reader must
        see exactly the writes pushed before it, whole."""
        asyncio.get_running_loop().set_debug(False)  # a volume test
        xp = aa.namespace(engine)
        prog = Program(xp, seed)
        lock = threading.Lock()
        pushed = 0  # writes pushed so far
        seen: list[tuple[int, bytes]] = []
        seen_lock = threading.Lock()
        writes, readers, reads = 120, 2, 60

        def record(count: int, rctx: ae.RunContext) -> None:
            got = _digest(prog.base)
            with seen_lock:
                seen.append((count, got))

        def reader(r: int) -> None:
            rng = random.Random(seed * 10 + r)
            ops = []
            for _ in range(reads):
                view = rng.choice(prog.views)[0]
                with lock:
                    ops.append(
                        engine.push_sync(
                            lambda rctx, c=pushed: record(c, rctx), ae.cpu(), [view.var], []
                        )
                    )

        async def writer() -> None:
            nonlocal pushed
            for k in range(1, writes + 1):
                with lock:
                    prog.write(k)
                    pushed = k
                if k % 8 == 0:
                    await asyncio.sleep(0)

        await asyncio.gather(writer(), *(asyncio.to_thread(reader, r) for r in range(readers)))
        await engine.wait_for_all()
        assert len(seen) == readers * reads
        for count, got in seen:
            assert got == prog.digests[count], (
                f"a reader pushed after {count} writes saw another state"
            )
        np.testing.assert_array_equal(await prog.x, prog.model)

    def test_writers_on_a_thread_against_sync_points_on_other_threads(self) -> None:
        """A script thread writes through views of a BlockingEngine's array; three threads
        read it with sync points. Each read gives the state after a prefix of the writes that
        lies between those pushed before the read started and those pushed when it returned,
        and what it gave never changes afterwards."""
        writes, readers, reads = 150, 3, 40
        with ae.BlockingEngine(cpu_workers=2) as be:
            xp = aa.namespace(be)
            prog = Program(xp, 42)
            lock = threading.Lock()
            pushed = 0
            results: list[tuple[int, int, np.ndarray, np.ndarray]] = []
            results_lock = threading.Lock()
            start = threading.Barrier(readers + 1)

            def writer() -> None:
                nonlocal pushed
                start.wait()
                for k in range(1, writes + 1):
                    with lock:
                        prog.write(k)
                        pushed = k

            def reader(r: int) -> None:
                start.wait()
                for i in range(reads):
                    with lock:
                        lo = pushed
                    got = np.asarray(prog.x) if (i + r) % 2 else np.from_dlpack(prog.x)
                    copy = got.copy()
                    with lock:
                        hi = pushed
                    with results_lock:
                        results.append((lo, hi, got, copy))

            threads = [threading.Thread(target=writer)] + [
                threading.Thread(target=reader, args=(r,)) for r in range(readers)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert not any(t.is_alive() for t in threads)
            be.wait_for_all()
            index = {d: k for k, d in enumerate(prog.digests)}
            for lo, hi, got, copy in results:
                np.testing.assert_array_equal(got, copy)  # never changed afterwards
                k = index.get(_digest(copy))
                assert k is not None, "a sync point gave a state no prefix of the writes makes"
                assert lo <= k <= hi, (lo, k, hi)
            np.testing.assert_array_equal(np.asarray(prog.x), prog.model)


# -- aioengine.array_api --------------------------------------------------------------------


class TestArrayApiModule:
    def test_plain_sync_code(self) -> None:
        import aioengine.array_api as xp

        assert xp.__array_api_version__ == "2024.12"
        assert xp.float64 == np.float64
        a = xp.asarray([1.0, 2.0, 3.0])
        assert isinstance(a, aa.Array)
        assert a.__array_namespace__() is xp.default_namespace()
        b = xp.sum(a * 2)
        assert float(b) == 12.0
        m = xp.reshape(xp.arange(4.0), (2, 2))
        m += 1
        np.testing.assert_allclose((xp.linalg.inv(m) @ m).tolist(), np.eye(2), atol=1e-12)
        np.testing.assert_array_equal(np.asarray(np.sin(a)), np.sin([1.0, 2.0, 3.0]))

    def test_from_several_threads_at_once(self) -> None:
        import aioengine.array_api as xp

        shared = xp.asarray(np.arange(1000.0))
        n = 4
        start = threading.Barrier(n)
        errors: list[BaseException] = []
        results: dict[int, list[float]] = {}

        def work(t: int) -> None:
            try:
                start.wait()
                a = xp.full((100,), float(t))
                out = []
                for i in range(30):
                    a = a * 0.5 + shared[:100] * 0 + 1
                    if i % 10 == 9:
                        out.append(float(xp.max(a)))
                total = float(xp.sum(shared))
                results[t] = [*out, total, float(a[0])]
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(n)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        assert not errors, errors
        for t in range(n):
            want = float(t)
            expected = []
            for i in range(30):
                want = want * 0.5 + 1
                if i % 10 == 9:
                    expected.append(want)
            assert results[t] == pytest.approx([*expected, 499500.0, want])

    async def test_from_a_thread_running_a_loop_of_its_own(self) -> None:
        """A notebook's cell: the thread runs an event loop that is not the engine's."""
        import aioengine.array_api as xp

        a = xp.asarray([1.0, 2.0])
        b = (a + 1) * 3
        assert b.tolist() == [6.0, 9.0]
        np.testing.assert_array_equal(await b, [6.0, 9.0])

    def test_max_pending_bounds_a_sync_loop(self) -> None:
        """AIOENGINE_MAX_PENDING=8: a synchronous loop on array_api waits for room before
        an operation returns (in a subprocess: the module's engine reads the environment
        once)."""
        script = textwrap.dedent(
            """\
            import aioengine as ae
            import aioengine.array_api as xp
            assert ae.engine._COMPILED is {compiled}
            a = xp.ones(20000)
            engine = xp.default_namespace()._engine
            assert engine.max_pending == 8, engine.max_pending
            most = 0
            for i in range(300):
                a = a * 0.5 + 1
                most = max(most, engine.pending)
            assert abs(float(a[0]) - (2 - 0.5 ** 300)) < 1e-12
            print("most", most, flush=True)
            print("ok", flush=True)
            """
        ).format(compiled=COMPILED)
        env = dict(
            os.environ,
            PYTHONPATH=str(Path(ae.__file__).parent.parent),
            AIOENGINE_MAX_PENDING="8",
            AIOENGINE_CPU_WORKERS="2",
        )
        proc = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            cwd=tempfile.gettempdir(),
        )
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        assert lines[-1] == "ok", proc.stdout
        most = int(lines[-2].split()[1])
        assert most <= 8 + 2, most


# -- backpressure: Engine(max_pending=...) -------------------------------------------------


class TestBackpressure:
    async def test_on_the_loop_thread_nothing_blocks(self, serial: bool) -> None:
        async with ae.Engine(cpu_workers=2, serial=serial, max_pending=8) as engine:
            xp = aa.namespace(engine)
            x = xp.ones(100)
            hold = Hold(engine, x.var)
            ys = [x * float(i) for i in range(50)]  # none can run: all must return
            assert engine.pending >= 50
            await hold.release()
            await engine.wait_for_capacity()
            assert engine.pending < 8
            np.testing.assert_array_equal(await ys[-1], np.full(100, 49.0))
            a = xp.ones(20000)
            for _ in range(100):
                a = a * 0.5 + 1
                await engine.wait_for_capacity()
                assert engine.pending <= 8
            assert float((await a)[0]) == pytest.approx(2 - 0.5**100)

    def test_a_blocking_engine_loop_waits_for_room(self) -> None:
        with ae.BlockingEngine(cpu_workers=2, max_pending=8) as be:
            xp = aa.namespace(be)
            engine = be.engine
            a = xp.ones(20000)
            most = 0
            for _ in range(300):
                a = a * 0.5 + 1
                most = max(most, engine.pending)
            assert most <= 8 + 2, most
            assert float(a[0]) == pytest.approx(2 - 0.5**300)

    async def test_a_worker_thread_waits_for_room(self, serial: bool) -> None:
        async with ae.Engine(cpu_workers=2, serial=serial, max_pending=8) as engine:
            xp = aa.namespace(engine)
            await (xp.ones(1) + 1)  # the namespace knows its loop

            def produce() -> tuple[int, aa.Array]:
                a = xp.ones(20000)
                most = 0
                for _ in range(200):
                    a = a * 0.5 + 1
                    most = max(most, engine.pending)
                return most, a

            most, a = await asyncio.to_thread(produce)
            assert most <= 8 + 2, most
            assert float((await a)[0]) == pytest.approx(2 - 0.5**200)


class TestSmallOperationsOffTheLoop:
    """Off the loop, a small elementwise operation of settled arrays is computed at the call
    (``aioengine/array/_push.py``): NumPy's values, a failure raised where a pushed
    operation's would be, and operands still pending pushed and ordered as before."""

    def test_a_chain_of_computed_arrays_gives_numpys_values_without_a_push(self) -> None:
        with ae.BlockingEngine(cpu_workers=2) as be:
            xp = aa.namespace(be)
            an, bn = np.linspace(-2.0, 2.0, 1000), np.linspace(1.0, 3.0, 1000)
            a, b = xp.asarray(an), xp.asarray(bn)
            with Pushes(be.engine) as pushes:
                c = chain(xp, a, b)
                assert c.ready  # computed at the call
                value = np.asarray(c)
            np.testing.assert_array_equal(value, chain(np, an, bn))
            assert pushes.ops() == []

    @pytest.mark.parametrize("read", ["bad", "dependent", "nothing"])
    def test_a_failure_is_raised_where_a_pushed_ones_would_be(self, read: str) -> None:
        with ae.BlockingEngine(cpu_workers=2) as be:
            xp = aa.namespace(be)
            a = xp.asarray(np.array([2, 3], dtype=np.int64))
            e = xp.asarray(np.array([-1, -1], dtype=np.int64))
            bad = a**e  # computed at once: it raises there, and the call does not
            after = xp.sum(bad + a)  # a failed operand is not settled: pushed, and skipped
            fine = a * a
            np.testing.assert_array_equal(np.asarray(fine), [4, 9])
            if read == "bad":
                with pytest.raises(ValueError, match="negative integer powers"):
                    np.asarray(bad)
                with pytest.raises(ValueError, match="negative integer powers"):
                    np.asarray(bad)  # for good
                be.wait_for_all()  # the engine's record was thrown by the read, once
            elif read == "dependent":
                with pytest.raises(ae.DependencyError) as dep:
                    float(after)
                assert isinstance(dep.value.__cause__, ValueError)
                be.wait_for_all()  # thrown by that read, as for a pushed operation
            else:
                with pytest.raises(ExceptionGroup) as group:
                    be.wait_for_all()  # recorded once, as a pushed operation's failure
                assert [type(x) for x in group.value.exceptions] == [ValueError]

    def test_a_small_linalg_failure_in_synchronous_code(self) -> None:
        with ae.BlockingEngine(cpu_workers=2) as be:
            xp = aa.namespace(be)
            bad = xp.linalg.inv(xp.zeros((2, 2)))  # computed at the call: no raise there
            with pytest.raises(np.linalg.LinAlgError, match="Singular"):
                np.asarray(bad)
            be.wait_for_all()

    def test_pending_operands_are_pushed_and_ordered(self) -> None:
        with ae.BlockingEngine(cpu_workers=2) as be:
            xp = aa.namespace(be)
            base = np.zeros(3)
            x = xp.asarray(base, copy=False)
            b = xp.asarray(np.full(3, 2.0))
            release = threading.Event()

            def writer(rctx: ae.RunContext) -> None:
                assert release.wait(30)
                base[...] = 5.0

            be.push_sync(writer, ae.cpu(), [], [x.var], name="writer")
            y = x + 0.0  # x's Var was handed out: pushed
            z = y * b  # y is pending: pushed, after y
            assert not z.ready
            b += 1.0  # a write on b after z's read of it: z reads 2.0
            c = b * 1.0  # b's write may be pending: pushed after it, or computed after it
            release.set()
            np.testing.assert_array_equal(np.asarray(z), [10.0] * 3)
            np.testing.assert_array_equal(np.asarray(c), [3.0] * 3)

    def test_an_in_place_write_after_a_computed_read_leaves_its_result(self) -> None:
        with ae.BlockingEngine(cpu_workers=2) as be:
            xp = aa.namespace(be)
            a = xp.asarray(np.ones(4))
            c = a + 1.0
            a += 5.0
            d = a * 2.0
            np.testing.assert_array_equal(np.asarray(c), [2.0] * 4)
            np.testing.assert_array_equal(np.asarray(d), [12.0] * 4)
            np.testing.assert_array_equal(np.asarray(a), [6.0] * 4)

    def test_an_in_place_write_waits_for_a_pending_reader_of_its_target(self) -> None:
        with ae.BlockingEngine(cpu_workers=2) as be:
            xp = aa.namespace(be)
            a = xp.asarray(np.ones(4))
            release = threading.Event()

            def slow_copy(v: Any) -> Any:
                assert release.wait(30)
                return v.copy()

            seen = xp.apply(slow_copy, a, shape=(4,), dtype=xp.float64)  # pending, reads a
            with Pushes(be.engine) as pushes:
                a += 1.0  # a pending reader: pushed after it, not computed at the call
                b = xp.ones(4)
                b += 1.0  # nothing pending on b: computed at the call
            assert pushes.ops() == ["iadd"]
            release.set()
            np.testing.assert_array_equal(np.asarray(seen), [1.0] * 4)
            np.testing.assert_array_equal(np.asarray(a), [2.0] * 4)
            np.testing.assert_array_equal(np.asarray(b), [2.0] * 4)

    def test_an_in_place_write_that_fails_at_the_call_fails_its_target(self) -> None:
        with ae.BlockingEngine(cpu_workers=2) as be:
            xp = aa.namespace(be)
            a = xp.asarray(np.array([2, 3], dtype=np.int64))
            a **= xp.asarray(np.array([-1, -1], dtype=np.int64))  # raises: not here
            after = a + 1  # a failed target: pushed, skipped
            with pytest.raises(ValueError, match="negative integer powers"):
                np.asarray(a)
            with pytest.raises(ae.DependencyError):
                np.asarray(after)
            be.wait_for_all()

    def test_a_small_view_of_a_chunked_array_is_computed_at_the_call(self) -> None:
        with ae.BlockingEngine(cpu_workers=2) as be:
            xp = aa.namespace(be, chunk_bytes=8192)
            base = np.arange(40_000.0)
            x = xp.asarray(base) * 2.0  # chunked (4 Ki elements a chunk)
            np.asarray(x)  # computed
            with Pushes(be.engine) as pushes:
                y = x[4090:4100] + 1.0  # a view across two chunks
                z = xp.sum(x[:10])
            assert pushes.ops() == []
            x[:3] += 1.0  # a write into a chunked array: pushed, on its first chunk
            np.testing.assert_array_equal(np.asarray(y), base[4090:4100] * 2.0 + 1.0)
            assert float(z) == float(np.sum(base[:10] * 2.0))
            expected = base * 2.0
            expected[:3] += 1.0
            np.testing.assert_array_equal(np.asarray(x), expected)

    def test_a_second_thread_on_the_namespace_makes_every_operation_a_push(self) -> None:
        # A small operation computed at the call is not ordered by the engine against other
        # threads' pushes and reads: once two threads use the namespace's arrays, it is pushed.
        with ae.BlockingEngine(cpu_workers=2) as be:
            xp = aa.namespace(be)
            a = xp.asarray(np.ones(4))
            with Pushes(be.engine) as pushes:
                b = a + 1.0  # the one thread: at the call
                assert pushes.ops() == []
                seen = []
                other = threading.Thread(target=lambda: seen.append(np.asarray(a).copy()))
                other.start()
                other.join(30)
                c = b * 2.0  # two threads now: a push
                a += 1.0
            assert pushes.ops() == ["multiply", "iadd"]
            np.testing.assert_array_equal(seen[0], [1.0] * 4)
            np.testing.assert_array_equal(np.asarray(c), [4.0] * 4)
            np.testing.assert_array_equal(np.asarray(a), [2.0] * 4)

    def test_a_closed_engine_refuses_operations_computed_at_the_call_too(self) -> None:
        be = ae.BlockingEngine(cpu_workers=2)
        with be:
            xp = aa.namespace(be)
            a = xp.asarray(np.ones(3))
            np.testing.assert_array_equal(np.asarray(a + 1.0), [2.0] * 3)
        for call in (lambda: a + 1.0, lambda: xp.sum(a), lambda: a.__iadd__(1.0)):
            # (what a push raises: EngineClosedError, or the closed loop's RuntimeError)
            with pytest.raises((ae.EngineClosedError, RuntimeError)):
                call()
        np.testing.assert_array_equal(np.asarray(a), [1.0] * 3)  # unchanged, still readable
