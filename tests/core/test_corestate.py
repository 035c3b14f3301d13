"""The core's state (``aioengine/corestate.py``): :class:`CoreState`, the base of the
scheduler, which holds every field of an engine's core and the methods that keep them: the
binding to a loop, the lifecycle, the collaborators' attachment, the failure ledger's throws,
an operation's completion, the loop's callbacks and ``validate_state()``.

Seen through a real :class:`aioengine.Engine` (``engine._core`` is its scheduler, a
``CoreState``). A test that changes a field by hand restores it, or does so on an engine of its
own that it closes."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

import aioengine as ae
from aioengine.corestate import COMPILED, CoreState, State
from aioengine.var import Failure

from ..conftest import Hold
from ..helpers import Boom


@pytest.fixture
async def own_engine() -> AsyncIterator[ae.Engine]:
    """A threaded engine of the test's own, not used yet (so not bound to a loop), closed
    after the test if it is bound by then."""
    eng = ae.Engine(cpu_workers=2, serial=False)
    try:
        yield eng
    finally:
        if eng._core.loop is not None and not eng.closed:
            await eng.aclose(cancel=True, timeout=30)


class _StandIn:
    """A collaborator that is never called: the tests attach it and detach it again before
    anything is pushed."""


def _detach(core: CoreState) -> None:
    """Undo :meth:`CoreState.attach_locked` by hand (what no collaborator ever does)."""
    with core.lock:
        core.gpu = None
        core.remote = None
        core.may_hold = False


class TestFreshState:
    """A new engine's core: open, empty, unbound; fields a user's first call relies on."""

    async def test_a_new_engine_is_open_empty_and_bound_to_no_loop(
        self, own_engine: ae.Engine
    ) -> None:
        core = own_engine._core
        assert isinstance(core, CoreState)
        assert core.state is State.OPEN
        assert not core.closed
        assert core.seq == 0
        assert core.live == {}
        assert core.loop is None
        assert core.loop_thread == 0
        assert core.gpu is None
        assert core.remote is None
        assert core.may_hold is False
        assert core.failures == {}
        assert core.failures is core.ledger.failures
        assert core.routes.executors == {}
        assert core.finished == {}
        assert core.segments.open is None
        assert core.forked is False
        core.validate_state()

    async def test_serial_mode_has_a_sequencer_var_threaded_mode_none(self) -> None:
        """Serial mode's hidden Var that every operation writes; none in threaded mode."""
        serial, threaded = ae.Engine(serial=True), ae.Engine(cpu_workers=1, serial=False)
        assert isinstance(serial._core._sequencer, ae.Var)
        assert threaded._core._sequencer is None

    async def test_each_push_takes_the_next_sequence_number_and_is_live_until_it_finishes(
        self, engine: ae.Engine
    ) -> None:
        core = engine._core
        x = engine.new_var("x")
        hold = Hold(engine, x)
        op = engine.push_sync(lambda r: None, mutate_vars=[x])
        assert core.seq == 2
        assert list(core.live) == [1, 2]
        assert core.live[2] is op
        core.validate_state()
        await hold.release()
        await op
        assert core.live == {}
        assert core.seq == 2  # a finish takes no number
        core.validate_state()

    def test_compiled_is_the_one_test_of_the_build(self) -> None:
        assert type(COMPILED) is bool
        assert COMPILED == ae.engine._COMPILED

    def test_the_lifecycle_states(self) -> None:
        assert [s.value for s in State] == ["open", "closing", "closed"]
        assert State("closing") is State.CLOSING


class TestRepr:
    """The scheduler shows as its engine: the core's error messages name the engine."""

    async def test_threaded_and_serial(self, engine: ae.Engine) -> None:
        mode = "serial" if engine.serial else "cpu_workers=2"
        assert repr(engine._core) == f"<aioengine.Engine open pending=0 {mode}>"
        assert repr(engine) == repr(engine._core)

    async def test_it_shows_the_pending_count_and_the_lifecycle(
        self, own_engine: ae.Engine
    ) -> None:
        engine = own_engine
        hold = Hold(engine, engine.new_var("x"))
        assert repr(engine) == "<aioengine.Engine open pending=1 cpu_workers=2>"
        await hold.release()
        await engine.aclose()
        assert repr(engine) == "<aioengine.Engine closed pending=0 cpu_workers=2>"


class TestBinding:
    """An engine serves the loop it is first used on, and says so when used elsewhere."""

    async def test_require_loop_binds_on_first_use_from_a_coroutine(
        self, own_engine: ae.Engine
    ) -> None:
        core = own_engine._core
        with pytest.raises(RuntimeError, match="not bound to an event loop yet") as caught:
            await asyncio.to_thread(core.require_loop)  # a thread with no running loop
        assert repr(own_engine) in str(caught.value)
        assert core.loop is None
        loop = asyncio.get_running_loop()
        assert core.require_loop() is loop
        assert core.loop is loop
        assert core.loop_thread == threading.get_ident()
        assert core._loop_is_running is not None
        assert core._loop_is_running()
        assert core.require_loop() is loop  # bound once
        # Another thread without a loop of its own gets the bound loop (sync pushes).
        assert await asyncio.to_thread(core.require_loop) is loop
        core.validate_state()

    async def test_a_second_loop_is_refused_and_a_closed_one_is_named(self) -> None:
        """Bound on a loop of another thread (now closed): this loop is refused, and a
        thread without a loop is told the bound loop is closed."""
        engine = ae.Engine(cpu_workers=1)
        core = engine._core
        bound: list[asyncio.AbstractEventLoop] = []

        async def first_use() -> None:
            bound.append(core.require_loop())

        thread = threading.Thread(target=asyncio.run, args=(first_use(),))
        thread.start()
        thread.join(10)
        assert not thread.is_alive()
        assert bound == [core.loop]
        with pytest.raises(RuntimeError, match="bound to another event loop") as caught:
            core.require_loop()
        assert repr(engine) in str(caught.value)
        with pytest.raises(RuntimeError, match="bound to an event loop that is closed"):
            await asyncio.to_thread(core.require_loop)
        assert core.loop is bound[0]  # unchanged by the refusals

    async def test_an_engine_marked_forked_raises_on_use(self, own_engine: ae.Engine) -> None:
        """In a child after ``os.fork()`` (``forked``, set by hand here) every use raises."""
        core = own_engine._core
        core.require_loop()
        core.forked = True
        try:
            with pytest.raises(RuntimeError, match=r"cannot be used after os\.fork\(\)"):
                core.check_fork()
            with pytest.raises(RuntimeError, match=r"os\.fork\(\)"):
                core.require_loop()
        finally:
            core.forked = False
        core.check_fork()


class TestAttach:
    """A collaborator attaches itself once: from then on dispatch asks it (``may_hold``)."""

    async def test_attaching_the_gpu_sets_it_and_may_hold(self, own_engine: ae.Engine) -> None:
        core = own_engine._core
        gpu = _StandIn()
        try:
            with core.lock:
                core.attach_locked(gpu=cast(Any, gpu))
            assert core.gpu is gpu
            assert core.remote is None
            assert core.may_hold is True
        finally:
            _detach(core)
        core.validate_state()

    async def test_attaching_the_remote_keeps_the_gpu(self, own_engine: ae.Engine) -> None:
        core = own_engine._core
        gpu, remote = _StandIn(), _StandIn()
        try:
            with core.lock:
                core.attach_locked(remote=cast(Any, remote))
                assert (core.gpu, core.remote, core.may_hold) == (None, remote, True)
                core.attach_locked(gpu=cast(Any, gpu))
            assert (core.gpu, core.remote, core.may_hold) == (gpu, remote, True)
        finally:
            _detach(core)
        # Detached again: the local-only fast path works as before.
        assert await own_engine.push_sync(lambda r: "local") == "local"


class TestLifecycle:
    """OPEN admits pushes; CLOSING (``aclose`` draining) refuses them; CLOSED is final."""

    async def test_aclose_moves_through_closing_to_closed(self, own_engine: ae.Engine) -> None:
        engine = own_engine
        core = engine._core
        hold = Hold(engine, engine.new_var("x"))
        await hold.started.wait()
        closing = asyncio.ensure_future(engine.aclose())
        await asyncio.sleep(0)  # aclose's first step, up to its wait for the hold
        assert core.state is State.CLOSING
        assert not core.closed
        with pytest.raises(ae.EngineClosedError, match="closing"):
            engine.push_sync(lambda r: None)
        await hold.release()
        await asyncio.wait_for(closing, 10)
        assert core.state is State.CLOSED
        assert core.closed
        assert engine.closed
        core.validate_state()

    async def test_set_state_locked_is_what_pushes_and_closed_read(
        self, own_engine: ae.Engine
    ) -> None:
        engine = own_engine
        core = engine._core
        with core.lock:
            core.set_state_locked(State.CLOSING)
        try:
            with pytest.raises(ae.EngineClosedError):
                engine.push_sync(lambda r: None)
            assert not core.closed
            with core.lock:
                core.set_state_locked(State.CLOSED)
            assert core.closed
        finally:
            with core.lock:
                core.set_state_locked(State.OPEN)
        assert await engine.push_sync(lambda r: 1) == 1


class TestFailures:
    """A failure a collaborator records is raised by the next wait, once."""

    async def test_a_recorded_failure_is_thrown_by_wait_for_all_once(
        self, engine: ae.Engine
    ) -> None:
        core = engine._core
        exc = Boom("device lost")
        with core.lock:
            core.record_failure_locked(Failure(exc))
        core.validate_state()
        with pytest.raises(ExceptionGroup) as group:
            await engine.wait_for_all()
        assert group.value.exceptions == (exc,)
        await engine.wait_for_all()  # thrown once
        assert core.failures == {}  # retired: nothing live could see it
        core.validate_state()

    async def test_take_failure_locked_throws_a_box_once(self, engine: ae.Engine) -> None:
        core = engine._core
        exc = Boom()
        box = Failure(exc)
        with core.lock:
            core.record_failure_locked(box)
            assert core.take_failure_locked(None) is None  # the Var carried none
            assert core.take_failure_locked(box) is exc
            assert core.take_failure_locked(box) is None  # thrown already
        assert core.take_failures() == []
        assert core.failures == {}
        core.validate_state()

    async def test_take_failures_claims_all_in_order_once(self, engine: ae.Engine) -> None:
        core = engine._core
        first, second = Boom("first"), Boom("second")
        with core.lock:
            core.record_failure_locked(Failure(first))
            core.record_failure_locked(Failure(second))
        assert core.take_failures() == [first, second]
        assert core.take_failures() == []
        await engine.wait_for_all()  # nothing left to raise
        core.validate_state()

    async def test_a_failure_stays_tracked_while_an_operation_pushed_before_the_throw_is_live(
        self, engine: ae.Engine
    ) -> None:
        core = engine._core
        hold = Hold(engine, engine.new_var("x"))
        box = Failure(Boom())
        with core.lock:
            core.record_failure_locked(box)
        assert len(core.take_failures()) == 1
        assert box in core.failures  # the hold, pushed before the throw, may still see it
        core.validate_state()
        await hold.release()
        assert core.failures == {}  # retired when the last such operation finished
        assert box.exc is None
        core.validate_state()


class TestExecutors:
    """The façade's close shuts the pools down; its finalizer abandons them."""

    async def test_shutdown_executors_returns_the_pools_and_forgets_them(
        self, own_engine: ae.Engine
    ) -> None:
        engine = own_engine
        core = engine._core
        await engine.push_sync(lambda r: None)
        await engine.push_sync(lambda r: None, prop=ae.FnProperty.CPU_PRIORITIZED)
        pools = dict(core.routes.executors)
        assert sorted(pools) == ["cpu-priority", "cpu0"]
        executors = core.shutdown_executors(wait=True)
        assert sorted(executors, key=id) == sorted(pools.values(), key=id)
        assert core.routes.executors == {}
        assert core._last_route == (None, None, None)
        assert all(e.submit(object(), 0) is False for e in executors)  # shut: take nothing
        core.validate_state()
        assert core.shutdown_executors(wait=True) == []  # nothing left
        await engine.aclose()

    async def test_abandon_executors_shuts_them_down_without_waiting(
        self, own_engine: ae.Engine
    ) -> None:
        engine = own_engine
        core = engine._core
        await engine.push_sync(lambda r: None)
        (pool,) = core.routes.executors.values()
        core.abandon_executors()
        assert core.routes.executors == {}
        assert core._last_route == (None, None, None)
        assert pool.submit(object(), 0) is False
        core.validate_state()
        await engine.aclose()


class TestRunningOp:
    """``running_op()``: the coroutine operation of this engine the caller is inside."""

    async def test_inside_and_outside_an_operation_and_for_another_engine(
        self, engine: ae.Engine
    ) -> None:
        core = engine._core
        other = ae.Engine(cpu_workers=1)
        seen: list[object] = []

        async def body(rctx: ae.RunContext) -> None:
            seen.append(core.running_op())
            seen.append(other._core.running_op())

        assert core.running_op() is None
        op = engine.push_async(body)
        await op
        assert seen == [op, None]
        assert core.running_op() is None
        await other.aclose()


class TestValidateState:
    """``validate_state()`` passes at every step of the cycle and on a busy engine, and names
    an invariant a hand broke."""

    async def test_it_passes_on_a_busy_engine(self, engine: ae.Engine) -> None:
        core = engine._core
        x, y = engine.new_var("x"), engine.new_var("y")
        hold = Hold(engine, x)
        readers = [engine.push_sync(lambda r: None, const_vars=[x]) for _ in range(3)]
        writer = engine.push_sync(lambda r: None, mutate_vars=[x, y])
        inline = engine.push_sync(lambda r: None, prop=ae.FnProperty.ASYNC, mutate_vars=[y])
        waiting = asyncio.ensure_future(engine.wait_for_var(x))
        with core.lock:
            core.record_failure_locked(Failure(Boom()))
        core.validate_state()
        await hold.started.wait()
        core.validate_state()
        await hold.release()
        for op in [*readers, writer, inline]:
            await op
            core.validate_state()
        await asyncio.wait_for(waiting, 10)
        assert len(core.take_failures()) == 1
        core.validate_state()

    async def test_it_holds_at_every_step_of_the_cycle(self, engine: ae.Engine) -> None:
        core = engine._core
        x, acc = engine.new_var("x"), engine.new_var("acc")
        core.validate_state()  # nothing pushed
        hold = Hold(engine, x)
        ops = [
            engine.push_sync(lambda r: None, const_vars=[x], commute_vars=[acc]) for _ in range(3)
        ]
        ops.append(engine.push_sync(lambda r: None, const_vars=[x], prop=ae.FnProperty.ASYNC))
        core.validate_state()  # admitted, waiting behind the holder
        await hold.started.wait()
        core.validate_state()  # the holder running
        await hold.release()
        for op in ops:
            await op
            core.validate_state()
        await engine.aclose()
        core.validate_state()  # closed

    async def test_a_live_operation_under_another_number_is_reported(
        self, engine: ae.Engine
    ) -> None:
        core = engine._core
        hold = Hold(engine, engine.new_var("x"))
        live = core.live
        (seq, op), *_ = live.items()
        del live[seq]
        live[seq + 1000] = op
        try:
            with pytest.raises(AssertionError):
                core.validate_state()
        finally:
            del live[seq + 1000]
            live[seq] = op
        core.validate_state()
        await hold.release()

    async def test_a_finished_operation_left_live_is_reported(self, engine: ae.Engine) -> None:
        core = engine._core
        op = engine.push_sync(lambda r: None)
        await op
        core.live[op.seq] = op
        try:
            with pytest.raises(AssertionError):
                core.validate_state()
        finally:
            del core.live[op.seq]
        core.validate_state()

    async def test_a_replaced_failures_dict_is_reported(self, engine: ae.Engine) -> None:
        core = engine._core
        saved = core.failures
        core.failures = {}
        try:
            with pytest.raises(AssertionError, match="the ledger's dict was replaced"):
                core.validate_state()
        finally:
            core.failures = saved
        core.validate_state()


class TestCompletion:
    """``complete_locked``: each finished operation is counted by state, and the waits on
    the engine wake."""

    async def test_statistics_count_finished_operations_by_state(self, engine: ae.Engine) -> None:
        core = engine._core
        x, y, z = engine.new_var("x"), engine.new_var("y"), engine.new_var("z")

        def fail(rctx: ae.RunContext) -> None:
            raise Boom()

        hold = Hold(engine, z)
        cancelled = engine.push_sync(lambda r: None, mutate_vars=[z])
        assert cancelled.cancel() is True
        ok = engine.push_sync(lambda r: None, mutate_vars=[x])
        failed = engine.push_sync(fail, mutate_vars=[y])
        skipped = engine.push_sync(lambda r: None, const_vars=[y])
        await hold.release()
        await ok
        with pytest.raises(Boom):
            await failed
        with pytest.raises(ae.DependencyError):
            await skipped
        stats = engine.statistics()
        assert (stats.pushed, stats.done, stats.failed, stats.skipped, stats.cancelled) == (
            5,
            2,
            1,
            1,
            1,
        )
        assert (stats.waiting, stats.queued, stats.running) == (0, 0, 0)
        assert sum(sum(row) for row in core.finished.values()) == 5
        assert core.live == {}
        with pytest.raises(ExceptionGroup):
            await engine.wait_for_all()
        core.validate_state()

    async def test_wait_for_all_wakes_when_the_last_operation_completes(
        self, engine: ae.Engine
    ) -> None:
        hold = Hold(engine, engine.new_var("x"))
        waiter = asyncio.ensure_future(engine.wait_for_all())
        await hold.started.wait()
        assert not waiter.done()
        await hold.release()
        await asyncio.wait_for(waiter, 10)
        engine._core.validate_state()

    async def test_an_awaiter_is_woken_from_a_worker_thread(
        self, threaded_engine: ae.Engine
    ) -> None:
        """A sync operation finishes on a worker; its awaiter's future is the loop's."""
        core = threaded_engine._core
        ran_on: list[int] = []
        op = threaded_engine.push_sync(lambda r: ran_on.append(threading.get_ident()) or 7)
        assert await asyncio.wait_for(op, 10) == 7
        assert ran_on != [threading.get_ident()]
        assert list(core.finished) == [core.routes.executors["cpu0"]]  # its pool's row
        assert core._loop_finished is None  # nothing finished on the loop itself


class TestCallSoon:
    """``call_soon_locked``: a callback on the engine's loop, from any thread."""

    async def test_from_a_worker_thread_the_callback_runs_on_the_loop(
        self, engine: ae.Engine
    ) -> None:
        core = engine._core
        loop = core.require_loop()
        ran = asyncio.Event()
        ran_on: list[int] = []

        def callback() -> None:
            ran_on.append(threading.get_ident())
            ran.set()

        def from_a_thread() -> None:
            with core.lock:
                core.call_soon_locked(callback)

        await asyncio.to_thread(from_a_thread)
        await asyncio.wait_for(ran.wait(), 10)
        assert ran_on == [threading.get_ident()]
        assert loop is asyncio.get_running_loop()

    async def test_from_the_loop_thread_it_runs_later_not_inline(self, engine: ae.Engine) -> None:
        core = engine._core
        core.require_loop()
        ran = asyncio.Event()
        with core.lock:
            core.call_soon_locked(ran.set)
        assert not ran.is_set()  # not under the lock
        await asyncio.wait_for(ran.wait(), 10)
