"""Defects a hostile round found in the engine-backed arrays (issue 44): results that shared
their input's memory, errors that waited for ``await``, read-only memory accepted and then
refused, sync points that could only deadlock, large work run inline on the loop, ``await``
after a close, and clean-up during a close.

Where an operation runs is read from the operation itself (``FnProperty.ASYNC``: inline on the
loop; ``NORMAL``: the device's pool), never from timings.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import aioengine as ae
import aioengine.array as aa
from aioengine.array._array import buffer_of
from aioengine.instrument import Instrument

from .conftest import Hold

BIG = aa.INLINE_COST * 4  # elements: well past what runs inline


class _Pushes(Instrument):
    """Records the name and property of each operation pushed."""

    def __init__(self) -> None:
        self.ops: list[tuple[str, ae.FnProperty]] = []

    def on_push(self, op: Any) -> None:
        self.ops.append((op.name, op.prop))


def _prop(x: aa.Array) -> ae.FnProperty:
    """Where the operation that made ``x`` runs (ASYNC: inline on the loop)."""
    writer = buffer_of(x).writer
    assert writer is not None
    return writer.prop


# -- 1. a result that is its input's memory owns a copy -------------------------------------------


class TestResultsOwnTheirMemory:
    async def test_real_of_a_real_array_does_not_change_with_it(self, engine: ae.Engine) -> None:
        xp = aa.namespace(engine)
        x = xp.asarray([1.0, 2.0, 3.0])
        vy = await xp.real(x)
        x += 1
        np.testing.assert_array_equal(await x, [2.0, 3.0, 4.0])
        np.testing.assert_array_equal(vy, [1.0, 2.0, 3.0])

    async def test_apply_returning_its_argument_does_not_change_with_it(
        self, engine: ae.Engine
    ) -> None:
        xp = aa.namespace(engine)
        x = xp.asarray([1.0, 2.0, 3.0])
        y = xp.apply(lambda v: v, x, shape=(3,), dtype=xp.float64)
        vy = await y
        x[0] = 10.0
        y += 5
        np.testing.assert_array_equal(vy, [1.0, 2.0, 3.0])
        np.testing.assert_array_equal(await x, [10.0, 2.0, 3.0])
        np.testing.assert_array_equal(await y, [6.0, 7.0, 8.0])


# -- 2. reductions without an identity on empty arrays raise at the call -------------------------


class TestEmptyReductions:
    @pytest.mark.parametrize(
        ("name", "shape", "axis"),
        [
            ("max", (0,), None),
            ("min", (0, 3), 0),
            ("max", (3, 0), 1),
            ("min", (0, 0), 0),
            ("max", (2, 0), (0, 1)),
            ("argmax", (0,), None),
            ("argmin", (0, 3), 0),
            ("argmax", (3, 0), 1),
        ],
    )
    async def test_raise_at_the_call_with_numpys_message(
        self, engine: ae.Engine, name: str, shape: tuple[int, ...], axis: Any
    ) -> None:
        xp = aa.namespace(engine)
        x = xp.zeros(shape)
        with pytest.raises(ValueError) as expected:
            getattr(np, name)(np.zeros(shape), axis=axis)
        with pytest.raises(ValueError, match=f"^{expected.value}$"):
            getattr(xp, name)(x, axis=axis)

    @pytest.mark.parametrize("name", ["max", "min", "argmax", "argmin"])
    async def test_a_reduction_over_non_empty_axes_of_an_empty_array_works(
        self, engine: ae.Engine, name: str
    ) -> None:
        xp = aa.namespace(engine)
        got = await getattr(xp, name)(xp.zeros((0, 3)), axis=1)
        assert got.shape == (0,)


# -- 3. asarray of read-only memory gives a writable array ---------------------------------------


class TestAsarrayOfReadOnlyMemory:
    @pytest.mark.parametrize("copy", [None, False])
    async def test_writes_are_accepted_and_done(self, engine: ae.Engine, copy: Any) -> None:
        xp = aa.namespace(engine)
        async with ae.Engine(cpu_workers=1) as other:
            x = aa.namespace(other).asarray([1.0, 2.0, 3.0])
            value = await x  # read-only, as await gives it
            y = xp.asarray(value, copy=copy)
            y[0] = 5.0
            y += 1
            np.testing.assert_array_equal(await y, [6.0, 3.0, 4.0])
            np.testing.assert_array_equal(value, [1.0, 2.0, 3.0])  # never changes
            np.testing.assert_array_equal(await x, [1.0, 2.0, 3.0])

    async def test_a_read_only_numpy_array_is_not_written(self, engine: ae.Engine) -> None:
        xp = aa.namespace(engine)
        value = np.arange(4.0)
        value.flags.writeable = False
        y = xp.asarray(value)
        y[1:] = 0.0
        np.testing.assert_array_equal(await y, [0.0, 0.0, 0.0, 0.0])
        np.testing.assert_array_equal(value, [0.0, 1.0, 2.0, 3.0])


# -- 5, 6. large work goes to the pool ------------------------------------------------------------


class TestCost:
    async def test_a_boolean_mask_counts_the_input(self, engine: ae.Engine) -> None:
        xp = aa.namespace(engine)
        big = xp.arange(BIG, dtype=xp.float64)
        r = big[big > 1.0]
        assert _prop(r) is ae.FnProperty.NORMAL
        small = xp.arange(10, dtype=xp.float64)
        assert _prop(small[small > 1.0]) is ae.FnProperty.ASYNC

    async def test_operations_on_a_large_learnt_result_run_on_the_pool(
        self, engine: ae.Engine
    ) -> None:
        xp = aa.namespace(engine)
        big = xp.arange(BIG, dtype=xp.float64)
        r = big[big >= 0.0]
        await r
        for y in (r * 2.0, r + r, xp.sin(r)):
            assert _prop(y) is ae.FnProperty.NORMAL, y
        for reduce in (xp.sum, xp.max):
            # Per-chunk partials on the pool; only the combining of the partials is inline.
            pushes = _Pushes()
            engine.add_instrument(pushes)
            y = reduce(r)
            engine.remove_instrument(pushes)
            # (The partials may join the kernels of the operations above: they read r too.)
            props = [prop for _, prop in pushes.ops]
            assert props.count(ae.FnProperty.ASYNC) <= 1, pushes.ops
            assert set(props) <= {ae.FnProperty.NORMAL, ae.FnProperty.ASYNC}, pushes.ops
            want = getattr(np, reduce.__name__)(np.arange(BIG, dtype=np.float64))
            assert float(await y) == float(want)
        r += 1.0
        assert buffer_of(r).writer is not None
        assert buffer_of(r).writer.prop is ae.FnProperty.NORMAL
        np.testing.assert_array_equal((await r)[:3], [1.0, 2.0, 3.0])
        assert r.shape == (BIG,)

    async def test_a_small_learnt_result_still_runs_inline(self, engine: ae.Engine) -> None:
        xp = aa.namespace(engine)
        x = xp.arange(10, dtype=xp.float64)
        r = x[x > 4.0]
        await r
        for y in (r * 2.0, xp.sum(r), r + r):
            assert _prop(y) is ae.FnProperty.ASYNC, y
        np.testing.assert_array_equal(await (r * 2.0), [10.0, 12.0, 14.0, 16.0, 18.0])

    async def test_a_pending_data_dependent_result_is_not_assumed_small(
        self, engine: ae.Engine
    ) -> None:
        xp = aa.namespace(engine)
        big = xp.arange(BIG, dtype=xp.float64)
        r = big[big >= 0.0]
        assert _prop(r * 2.0) is ae.FnProperty.NORMAL
        assert _prop(xp.sum(r)) is ae.FnProperty.NORMAL
        assert float(await xp.sum(r * 2.0)) == float(np.sum(np.arange(BIG) * 2.0))

    async def test_a_small_write_into_an_awaited_large_buffer_counts_the_copy(
        self, engine: ae.Engine
    ) -> None:
        xp = aa.namespace(engine)
        big = xp.zeros((BIG,))
        held = await big
        head = big[:10]
        head[...] = 5.0
        assert buffer_of(big).writer is not None
        assert buffer_of(big).writer.prop is ae.FnProperty.NORMAL
        head += 1.0
        assert buffer_of(big).writer.prop is ae.FnProperty.NORMAL
        got = await big
        assert got[0] == 6.0
        assert got[10] == 0.0
        assert held[0] == 0.0  # what await returned never changes

    async def test_a_small_write_into_an_unexported_buffer_stays_inline(
        self, engine: ae.Engine
    ) -> None:
        xp = aa.namespace(engine)
        big = xp.zeros((BIG,))
        head = big[:10]
        head += 1.0
        assert buffer_of(big).writer is not None
        assert buffer_of(big).writer.prop is ae.FnProperty.ASYNC
        assert float(await xp.sum(big)) == 10.0


# -- 9. a ready value stays readable after the close ---------------------------------------------


class TestAfterClose:
    async def test_await_of_a_ready_array_after_aclose(self, serial: bool) -> None:
        engine = ae.Engine(cpu_workers=1, serial=serial)
        xp = aa.namespace(engine)
        x = xp.asarray([1.0, 2.0])
        y = x * 3.0
        await y
        await engine.aclose()
        np.testing.assert_array_equal(await y, [3.0, 6.0])
        np.testing.assert_array_equal(await x, np.asarray(x))

    async def test_await_of_a_failed_array_after_aclose_raises_its_failure(self) -> None:
        engine = ae.Engine(cpu_workers=1)
        xp = aa.namespace(engine)

        def boom(v: Any) -> Any:
            raise ZeroDivisionError("boom")

        y = xp.apply(boom, xp.asarray([1.0]), shape=(1,), dtype=xp.float64)
        with pytest.raises(ZeroDivisionError):
            await y
        await engine.aclose()
        with pytest.raises(ZeroDivisionError):
            await y

    async def test_await_of_a_pending_array_after_close_raises(self) -> None:
        engine = ae.Engine(cpu_workers=1)
        xp = aa.namespace(engine)
        x = xp.asarray([1.0, 2.0])
        hold = Hold(engine, x.var)
        await hold.started.wait()
        closing = asyncio.ensure_future(engine.aclose(cancel=True))
        await asyncio.sleep(0)
        with pytest.raises(ae.EngineClosedError):
            await x
        await hold.release()
        await closing


# -- 4. a sync point whose loop is not running raises ---------------------------------------------


def _in_thread(body: Callable[[], None], timeout: float = 30.0) -> None:
    """Run ``body`` on a thread of its own; fail if it does not finish within ``timeout``
    (a hang fails the test instead of hanging the suite); re-raise what it raised."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            body()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "the sync point blocked"
    if errors:
        raise errors[0]


class TestSyncPointWithoutARunningLoop:
    def test_between_two_runs_of_the_loop(self) -> None:
        def body() -> None:
            with asyncio.Runner() as runner:

                async def start() -> tuple[ae.Engine, Hold, aa.Array, aa.Array]:
                    engine = ae.Engine(cpu_workers=1)
                    xp = aa.namespace(engine)
                    x = xp.asarray([1.0, 2.0])
                    ready = xp.asarray([3.0])
                    await ready
                    return engine, Hold(engine, x.var), x * 2.0, ready

                engine, hold, y, ready = runner.run(start())
                with pytest.raises(aa.PendingArrayError, match="loop is not running"):
                    float(y[0])
                with pytest.raises(aa.PendingArrayError, match="loop is not running"):
                    np.asarray(y)
                assert float(ready) == 3.0  # a ready value answers

                async def finish() -> None:
                    await hold.release()
                    np.testing.assert_array_equal(await y, [2.0, 4.0])
                    await engine.aclose()

                runner.run(finish())
                np.testing.assert_array_equal(np.asarray(y), [2.0, 4.0])

        _in_thread(body)


# -- 10. unobserved failures of an array_api script are said once, plainly ------------------------

_SCRIPT = """\
import time
import aioengine.array_api as xp

def boom(value):
    raise ValueError("boom")

y = xp.apply(boom, xp.asarray([1.0]), shape=(1,), dtype=xp.float64)
while not y.ready:
    time.sleep(0.01)
print("done", flush=True)
"""


def test_unobserved_failures_of_an_array_api_script_are_one_warning() -> None:
    env = dict(os.environ, PYTHONPATH=str(Path(ae.__file__).parent.parent))
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tempfile.gettempdir(),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "done\n"
    assert "Exception ignored" not in proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "RuntimeWarning" in lines[0]
    assert "1 failure(s)" in lines[0]
    assert "ValueError: boom" in lines[0]


# -- 7. delete_var from a finalizer while the engine closes ---------------------------------------


class _Tensor:
    """MXNet's NDArray in Python: deletes its Var, with a function, in ``__del__``."""

    def __init__(self, engine: ae.Engine, deleted: list[str]) -> None:
        self.engine, self.var, self.deleted = engine, engine.new_var("tensor"), deleted

    def __del__(self) -> None:
        self.engine.delete_var(self.var, lambda rctx, d=self.deleted: d.append("deleted"))


async def test_delete_var_from_a_finalizer_while_aclose_cancels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    unraisable: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    engine = ae.Engine(cpu_workers=2)
    deleted: list[str] = []
    x = engine.new_var("x")
    gate, started = threading.Event(), threading.Event()
    engine.push_sync(lambda r: started.set() or gate.wait(10), mutate_vars=[x], name="blocker")
    await asyncio.to_thread(started.wait, 10)
    tensor = _Tensor(engine, deleted)
    tensor_var = tensor.var
    engine.push_sync(lambda r: None, const_vars=[x, tensor_var], name="reader")
    closing = asyncio.ensure_future(engine.aclose(cancel=True))
    await asyncio.sleep(0.01)  # the close has begun: the reader is cancelled
    assert not engine.closed
    del tensor  # its finalizer deletes its Var while the engine closes
    gate.set()
    await closing
    assert [u.exc_value for u in unraisable] == []
    assert deleted == ["deleted"]  # the deletion function ran, before the close ended


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("reshape", (np.ones(4), (2, 2))),
        ("sort", (np.ones(4),)),
        ("flip", (np.ones(4),)),
        ("concat", ([np.ones(2), np.ones(2)],)),
        ("unique_values", (np.ones(4),)),
    ],
)
async def test_a_numpy_array_given_to_a_namespace_function_is_named(
    name: str, args: tuple[Any, ...]
) -> None:
    # Not an AttributeError from inside the package: what went wrong and what to do.
    async with ae.Engine() as engine:
        xp = aa.namespace(engine)
        with pytest.raises(TypeError, match=rf"xp\.{name} takes arrays of this namespace.*asarray"):
            getattr(xp, name)(*args)
