"""The loop queue (``aioengine/loopqueue.py``): READY operations for the loop thread, best
first (higher priority, then push order), and the run of the queue that a put schedules.

The unit tests put real operations, admitted by an engine and held PENDING behind a writer,
into a queue of their own (the engine's is not involved): ``put_locked`` and ``pop_locked``
read only their numbers and priorities, and the compiled queue takes only operations."""

from __future__ import annotations

import asyncio
import heapq
import random
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import aioengine as ae
from aioengine.loopqueue import LoopQueue

from ..conftest import Hold, ci_examples


class Pending:
    """Operations pushed on ``engine`` behind a :class:`Hold`, so never READY meanwhile."""

    def __init__(self, engine: ae.Engine) -> None:
        self.engine = engine
        self.var = engine.new_var("held")
        self.hold = Hold(engine, self.var)

    def push(self, priority: int = 0) -> ae.Operation[None]:
        return self.engine.push_sync(lambda r: None, const_vars=[self.var], priority=priority)


@pytest.fixture
async def pending(threaded_engine: ae.Engine) -> AsyncIterator[Pending]:
    held = Pending(threaded_engine)
    yield held
    await held.hold.release()


def drain(queue: LoopQueue) -> list[Any]:
    """Pop until empty, checking the queue's invariants after every pop."""
    out = []
    while (op := queue.pop_locked()) is not None:
        queue.check_invariants()
        out.append(op)
    assert queue.empty_locked()
    return out


class TestPut:
    def test_an_empty_queue_pops_nothing(self) -> None:
        queue = LoopQueue()
        assert queue.empty_locked()
        assert queue.pop_locked() is None
        queue.check_invariants()

    async def test_only_the_first_put_asks_for_a_run(self, pending: Pending) -> None:
        queue = LoopQueue()
        a, b, c = (pending.push() for _ in range(3))
        assert queue.put_locked(a) is True  # the caller schedules a run
        assert queue.put_locked(b) is False  # one is scheduled already
        queue.check_invariants()
        assert queue.pop_locked() is a
        assert not queue.empty_locked()
        assert queue.put_locked(c) is False
        assert drain(queue) == [b, c]
        queue.scheduled = False  # the run ends once it found the queue empty
        queue.check_invariants()
        assert queue.put_locked(pending.push()) is True


class TestOrder:
    async def test_priority_zero_comes_out_in_push_order_whatever_the_order_of_puts(
        self, pending: Pending
    ) -> None:
        ops = [pending.push() for _ in range(40)]
        queue = LoopQueue()
        shuffled = ops[:]
        random.Random(5).shuffle(shuffled)
        for op in shuffled:
            queue.put_locked(op)
            queue.check_invariants()
        assert drain(queue) == ops

    async def test_higher_priority_first_then_push_order(self, pending: Pending) -> None:
        ops = [pending.push(p) for p in (0, 3, -1, 0, 3, 5, -1, 0)]
        queue = LoopQueue()
        for op in reversed(ops):
            queue.put_locked(op)
        expected = sorted(ops, key=lambda op: (-op.priority, op.seq))
        assert drain(queue) == expected

    async def test_a_put_behind_the_head_or_far_ahead_keeps_the_order(
        self, pending: Pending
    ) -> None:
        """Operations made READY out of order: one numbered before what was popped, one
        so far ahead that padding the FIFO up to it would more than double it."""
        ops = [pending.push() for _ in range(200)]
        queue = LoopQueue()
        for op in ops[10:13]:
            queue.put_locked(op)
        assert queue.pop_locked() is ops[10]
        queue.put_locked(ops[5])  # behind the head
        queue.put_locked(ops[199])  # far ahead
        queue.put_locked(ops[13])
        queue.check_invariants()
        assert sorted(queue.heap) == [ops[5].key, ops[199].key]  # neither fits the FIFO
        assert drain(queue) == [ops[5], ops[11], ops[12], ops[13], ops[199]]

    async def test_random_puts_and_pops_match_a_priority_queue(self, pending: Pending) -> None:
        ops = [pending.push(p) for p in [0] * 120 + [1, -2, 4] * 10]

        @ci_examples(100, deadline=None)
        @given(
            order=st.permutations(range(len(ops))),
            pops=st.lists(st.integers(0, 3), min_size=len(ops), max_size=len(ops)),
        )
        def check(order: list[int], pops: list[int]) -> None:
            queue = LoopQueue()
            model: list[tuple[int, int]] = []
            for i, n_pops in zip(order, pops, strict=True):
                queue.put_locked(ops[i])
                heapq.heappush(model, (ops[i].key, i))
                for _ in range(n_pops):
                    op = queue.pop_locked()
                    queue.check_invariants()
                    want = ops[heapq.heappop(model)[1]] if model else None
                    assert op is want
            assert drain(queue) == [ops[heapq.heappop(model)[1]] for _ in range(len(model))]

        check()


class TestUnqueue:
    async def test_unqueue_takes_out_one_operation_and_the_padding_it_ends(
        self, pending: Pending
    ) -> None:
        ops = [pending.push() for _ in range(200)]
        queue = LoopQueue()
        for i in (10, 11, 14, 199):  # 12 and 13 are padding; 199 goes to the heap
            queue.put_locked(ops[i])
        assert queue.unqueue_locked(ops[14]) is True  # the last slot: padding dropped too
        queue.check_invariants()
        assert queue.unqueue_locked(ops[14]) is False  # not queued any more
        assert queue.unqueue_locked(ops[12]) is False  # never queued (a padding slot)
        assert queue.unqueue_locked(ops[199]) is True  # from the heap
        queue.check_invariants()
        assert drain(queue) == [ops[10], ops[11]]
        assert queue.unqueue_locked(ops[10]) is False  # popped

    async def test_random_puts_pops_and_unqueues_match_a_priority_queue(
        self, pending: Pending
    ) -> None:
        ops = [pending.push(p) for p in [0] * 120 + [1, -2, 4] * 10]

        @ci_examples(40, deadline=None)
        @given(
            order=st.permutations(range(len(ops))),
            moves=st.lists(st.integers(0, 5), min_size=len(ops), max_size=len(ops)),
            picks=st.randoms(use_true_random=False),
        )
        def check(order: list[int], moves: list[int], picks: random.Random) -> None:
            queue = LoopQueue()
            model: dict[int, int] = {}  # key -> index, of the queued operations
            for i, move in zip(order, moves, strict=True):
                queue.put_locked(ops[i])
                model[ops[i].key] = i
                if move == 0:  # pop the best
                    op = queue.pop_locked()
                    assert op is ops[model.pop(min(model))]
                elif move == 1:  # take a queued one out
                    key = picks.choice(sorted(model))
                    assert queue.unqueue_locked(ops[model.pop(key)]) is True
                elif move == 2:  # one not queued: unchanged
                    j = picks.randrange(len(ops))
                    assert queue.unqueue_locked(ops[j]) is (ops[j].key in model)
                    model.pop(ops[j].key, None)
                queue.check_invariants()
            assert drain(queue) == [ops[model[k]] for k in sorted(model)]

        check()


class TestThroughTheEngine:
    """The engine's own queue: loop operations run best first, and a put from a worker
    thread wakes the loop."""

    async def test_ready_loop_operations_run_best_first(self, engine: ae.Engine) -> None:
        x = engine.new_var("x")
        hold = Hold(engine, x)
        trace: list[int] = []
        for p in (0, 2, 0, -1, 2, 1):
            engine.push_sync(
                lambda r, p=p: trace.append(p),
                const_vars=[x],
                prop=ae.FnProperty.ASYNC,
                priority=p,
            )
        await hold.release()  # every reader is READY at once, in one critical section
        await engine.wait_for_all()
        # Serial mode's hidden Var, which every operation writes, keeps them in push order.
        assert trace == ([0, 2, 0, -1, 2, 1] if engine.serial else [2, 2, 1, 0, 0, -1])
        engine._core.validate_state()

    async def test_the_run_of_the_queue_ends_when_it_is_empty(self, engine: ae.Engine) -> None:
        queue = engine._core.loop_queue
        ops = [engine.push_sync(lambda r: None, prop=ae.FnProperty.ASYNC) for _ in range(5)]
        assert queue.scheduled
        assert not queue.empty_locked()
        await asyncio.gather(*ops)
        await asyncio.sleep(0)
        assert not queue.scheduled
        assert queue.empty_locked()

    async def test_a_put_from_a_worker_thread_wakes_the_loop(
        self, threaded_engine: ae.Engine
    ) -> None:
        engine = threaded_engine
        loop_thread = threading.get_ident()
        x = engine.new_var("x")
        gate = threading.Event()
        writer = engine.push_sync(lambda r: gate.wait(10), mutate_vars=[x])
        ran: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        engine.push_sync(
            lambda r: ran.set_result(threading.get_ident()),
            const_vars=[x],
            prop=ae.FnProperty.ASYNC,
        )
        threading.Thread(target=gate.set).start()
        await writer
        assert await asyncio.wait_for(ran, 10) == loop_thread
