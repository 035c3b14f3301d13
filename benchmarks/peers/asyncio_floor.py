"""The asyncio floor: the smallest correct hand-written schedulers for the same ops.

Configurations (each optionally suffixed ``-uvloop``):

``floor-inline``
    callbacks + counters; dependency tracking at push time (last writer / readers since the last
    write of each var), a per-op counter of unfinished predecessors, ready ops scheduled with
    ``loop.call_soon`` and run on the loop thread.  Sync bodies.
``floor-pool``
    the same tracker; ready ops go to a ``ThreadPoolExecutor(os.cpu_count())`` and report back
    with ``loop.call_soon_threadsafe``.  Sync bodies.
``floor-cb``
    the same tracker; a ready op becomes an ``asyncio`` task of the coroutine body and its done
    callback releases the dependents.  Coroutine bodies.
``floor-task``
    one task per op, created at push time; it awaits its predecessors' tasks, then runs the
    body (awaited when it is a coroutine).  Sync or coroutine bodies.
``gather``
    a bare ``asyncio.gather`` of the coroutine bodies, no dependency tracking at all; only valid
    for the ``independent`` shape.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from workloads import (
    WARMUP,
    Checker,
    Program,
    WorkloadSpec,
    generate,
    is_program,
    make_runner,
    result_record,
    run_cli,
    split_loop,
    start_clock,
    user_heap,
)


class _Op:
    __slots__ = ("dependents", "done", "i", "pending")

    def __init__(self, i: int) -> None:
        self.i = i
        self.pending = 0
        self.dependents: list[_Op] = []
        self.done = False


class CounterScheduler:
    """Callbacks + counters dependency scheduler; *dispatch* starts a ready op."""

    def __init__(self, n_vars: int, dispatch: Callable[[_Op], None]) -> None:
        self.last_writer: list[_Op | None] = [None] * n_vars
        self.readers: list[list[_Op]] = [[] for _ in range(n_vars)]
        self.dispatch = dispatch
        self.inflight = 0
        self.waiter: asyncio.Future[None] | None = None

    def push(self, i: int, reads: tuple[int, ...], writes: tuple[int, ...]) -> None:
        """Register op *i*; dispatch it at once when it has no unfinished predecessor."""
        op = _Op(i)
        deps = 0
        last_writer, readers = self.last_writer, self.readers
        for v in reads:
            lw = last_writer[v]
            if lw is not None and not lw.done:
                lw.dependents.append(op)
                deps += 1
            readers[v].append(op)
        for v in writes:
            lw = last_writer[v]
            if lw is not None and not lw.done:
                lw.dependents.append(op)
                deps += 1
            for r in readers[v]:
                if not r.done:
                    r.dependents.append(op)
                    deps += 1
            readers[v] = []
            last_writer[v] = op
        self.inflight += 1
        op.pending = deps
        if not deps:
            self.dispatch(op)

    def complete(self, op: _Op) -> None:
        """Mark *op* finished and dispatch the dependents that became ready (loop thread)."""
        op.done = True
        for d in op.dependents:
            d.pending -= 1
            if not d.pending:
                self.dispatch(d)
        op.dependents = []
        self.inflight -= 1
        if not self.inflight and self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def wait_all(self) -> None:
        """Wait until every pushed op completed."""
        if self.inflight:
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter


async def _run_counter(
    spec: WorkloadSpec, mode: str, pool: ThreadPoolExecutor | None
) -> tuple[float, Checker, Program]:
    prog, n_vars = generate(spec)
    check = Checker(spec, prog, n_vars)
    loop = asyncio.get_running_loop()
    body, cbody = check.body, check.cbody
    sched: CounterScheduler

    if mode == "inline" and is_program(spec):
        fns = check.closures()

        def run_inline(op: _Op) -> None:
            fns[op.i]()
            sched.complete(op)

        def dispatch(op: _Op) -> None:
            loop.call_soon(run_inline, op)

    elif mode == "inline":

        def run_inline(op: _Op) -> None:
            body(op.i)
            sched.complete(op)

        def dispatch(op: _Op) -> None:
            loop.call_soon(run_inline, op)

    elif mode == "pool":
        assert pool is not None
        submit, call_soon_threadsafe = pool.submit, loop.call_soon_threadsafe

        def run_thread(op: _Op) -> None:
            body(op.i)
            call_soon_threadsafe(sched.complete, op)

        def dispatch(op: _Op) -> None:
            submit(run_thread, op)

    elif mode == "cb":
        create_task = loop.create_task

        def dispatch(op: _Op) -> None:
            task = create_task(cbody(op.i))
            task.add_done_callback(lambda _t: sched.complete(op))

    else:
        raise ValueError(mode)

    sched = CounterScheduler(n_vars, dispatch)
    push = sched.push
    t0 = start_clock(spec)
    for i, (reads, writes) in enumerate(prog):
        push(i, reads, writes)
    await sched.wait_all()
    return time.perf_counter() - t0, check, prog


async def _run_tasks(spec: WorkloadSpec) -> tuple[float, Checker, Program]:
    prog, n_vars = generate(spec)
    check = Checker(spec, prog, n_vars)
    loop = asyncio.get_running_loop()
    create_task = loop.create_task
    is_coro = spec.is_coro
    body, cbody = check.body, check.cbody
    # A program workload's per-op closures, each called without arguments.
    fns = check.closures() if is_program(spec) and not is_coro else None
    cfns = check.coro_closures() if is_program(spec) and is_coro else None
    state = {"inflight": 0}
    done: asyncio.Future[None] = loop.create_future()

    async def op_task(i: int, deps: list[asyncio.Task[None]]) -> None:
        for d in deps:
            if not d.done():
                await d
        if cfns is not None:
            await cfns[i]()
        elif fns is not None:
            fns[i]()
        elif is_coro:
            await cbody(i)
        else:
            body(i)
        state["inflight"] -= 1
        if not state["inflight"] and not done.done():
            done.set_result(None)

    last_writer: list[asyncio.Task[None] | None] = [None] * n_vars
    readers: list[list[asyncio.Task[None]]] = [[] for _ in range(n_vars)]
    t0 = start_clock(spec)
    for i, (reads, writes) in enumerate(prog):
        deps: list[asyncio.Task[None]] = []
        for v in reads:
            lw = last_writer[v]
            if lw is not None and not lw.done():
                deps.append(lw)
        for v in writes:
            lw = last_writer[v]
            if lw is not None and not lw.done():
                deps.append(lw)
            deps.extend(r for r in readers[v] if not r.done())
        state["inflight"] += 1
        task = create_task(op_task(i, deps))
        for v in reads:
            readers[v].append(task)
        for v in writes:
            last_writer[v] = task
            readers[v] = []
    if state["inflight"]:
        await done
    return time.perf_counter() - t0, check, prog


async def _run_gather(spec: WorkloadSpec) -> tuple[float, Checker, Program]:
    if spec.shape != "independent":
        raise ValueError("bare gather has no dependency tracking: independent shape only")
    prog, n_vars = generate(spec)
    check = Checker(spec, prog, n_vars)
    cbody = check.cbody
    t0 = start_clock(spec)
    await asyncio.gather(*[cbody(i) for i in range(len(prog))])
    return time.perf_counter() - t0, check, prog


async def _measure(spec: WorkloadSpec, kind: str) -> tuple[float, Checker, Program]:
    if kind in ("floor-inline", "floor-pool", "floor-cb"):
        if (kind == "floor-cb") != spec.is_coro:
            raise ValueError(f"{kind} does not run {spec.body} bodies")
        mode = kind.removeprefix("floor-")
        if mode != "pool":
            return await _run_counter(spec, mode, None)
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            warm = WARMUP
            await _run_counter(warm, mode, pool)
            return await _run_counter(spec, mode, pool)
    if kind == "floor-task":
        return await _run_tasks(spec)
    if kind == "gather":
        return await _run_gather(spec)
    raise ValueError(f"unknown floor config {kind!r}")


def run_workload(spec: WorkloadSpec, config: str) -> dict[str, Any]:
    """Run one workload with the floor *config*; return the result record."""
    kind, loop_kind = split_loop(config)
    heap = user_heap(spec)  # a program workload's own heap, held until it is measured
    with make_runner(loop_kind) as runner:
        if kind not in ("floor-pool", "gather"):
            warm = WARMUP
            if kind == "floor-cb":
                warm = WorkloadSpec("warmup", "random", "yield", 500, n_vars=16, seed=99)
            runner.run(_measure(warm, kind))
        dt, check, prog = runner.run(_measure(spec, kind))
    del heap
    return result_record(spec, config, dt, check, prog, extra={"loop": loop_kind})


if __name__ == "__main__":
    run_cli(run_workload, "asyncio floor peers")
