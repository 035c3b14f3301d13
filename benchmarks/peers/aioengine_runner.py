"""aioengine peer.

Configurations (each optionally suffixed ``-uvloop`` to run on uvloop instead of the default
asyncio loop):

``aio-threaded``  ``Engine(cpu_workers=os.cpu_count())``, ``push_sync`` (bodies on worker threads)
``aio-inline``    the same engine, ``push_sync(..., prop=FnProperty.ASYNC)`` (inline on the loop)
``aio-serial``    ``Engine(serial=True)``, ``push_sync`` (one at a time on the loop)
``aio-inline-bulk``  ``aio-inline`` with the push loop inside ``engine.bulk(BULK_SIZE)``
``aio-serial-bulk``  ``aio-serial`` with the push loop inside ``engine.bulk(BULK_SIZE)``
``aio-traced``    ``aio-threaded`` while ``engine.start_trace()`` records every operation
``aio-async``     ``Engine(cpu_workers=os.cpu_count())``, ``push_async`` of coroutine bodies
``aio-mem``       memory benchmarks (workloads tagged ``memory``): bytes per pending op
                  (tracemalloc) and RSS growth over many ops (``/proc/self/statm`` or psutil)

Per-op arguments (the var lists and ``functools.partial(body, i)``; closures for a ``program``
workload) are built before the clock starts, as the other runners prepare theirs (MXNet: ctypes
arrays); the timed region is the push loop plus ``await engine.wait_for_all()``.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import os
import time
import tracemalloc
from functools import partial
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    import aioengine

SYNC_KINDS = (
    "aio-threaded",
    "aio-inline",
    "aio-serial",
    "aio-traced",
    "aio-inline-bulk",
    "aio-serial-bulk",
)
#: Segment size of the ``-bulk`` configurations (a burst of 64 operations per segment).
BULK_SIZE = 64


def _engine(kind: str) -> aioengine.Engine:
    import aioengine as ae

    if kind.startswith("aio-serial"):
        return ae.Engine(serial=True)
    return ae.Engine(cpu_workers=os.cpu_count() or 1)


async def _run_program(
    engine: aioengine.Engine, spec: WorkloadSpec, kind: str
) -> tuple[float, Checker, Program]:
    import aioengine as ae

    prog, n_vars = generate(spec)
    check = Checker(spec, prog, n_vars)
    vs = [engine.new_var(f"v{k}") for k in range(n_vars)]
    cvs = [[vs[v] for v in reads] for reads, _ in prog]
    mvs = [[vs[v] for v in writes] for _, writes in prog]
    ctx = ae.cpu()
    n = len(prog)
    await engine.wait_for_all()
    if kind == "aio-async":
        if not spec.is_coro:
            raise ValueError("aio-async runs coroutine bodies only")
        if is_program(spec):
            cfns = check.coro_closures()
        else:
            cfns = [partial(check.cbody, i) for i in range(n)]
        push_async = engine.push_async
        t0 = start_clock(spec)
        for i in range(n):
            push_async(cfns[i], ctx, cvs[i], mvs[i])
        await engine.wait_for_all()
        return time.perf_counter() - t0, check, prog
    if spec.is_coro:
        raise ValueError(f"{kind} runs sync bodies only")
    fns = check.closures() if is_program(spec) else [partial(check.body, i) for i in range(n)]
    push_sync = engine.push_sync
    if kind == "aio-inline":
        prop = ae.FnProperty.ASYNC
        t0 = start_clock(spec)
        for i in range(n):
            push_sync(fns[i], ctx, const_vars=cvs[i], mutate_vars=mvs[i], prop=prop)
        await engine.wait_for_all()
    elif kind == "aio-inline-bulk":
        prop = ae.FnProperty.ASYNC
        t0 = start_clock(spec)
        with engine.bulk(BULK_SIZE):
            for i in range(n):
                push_sync(fns[i], ctx, const_vars=cvs[i], mutate_vars=mvs[i], prop=prop)
        await engine.wait_for_all()
    elif kind == "aio-serial-bulk":
        t0 = start_clock(spec)
        with engine.bulk(BULK_SIZE):
            for i in range(n):
                push_sync(fns[i], ctx, const_vars=cvs[i], mutate_vars=mvs[i])
        await engine.wait_for_all()
    else:
        t0 = start_clock(spec)
        for i in range(n):
            push_sync(fns[i], ctx, const_vars=cvs[i], mutate_vars=mvs[i])
        await engine.wait_for_all()
    return time.perf_counter() - t0, check, prog


async def _measure(spec: WorkloadSpec, kind: str) -> tuple[float, Checker, Program]:
    async with _engine(kind) as engine:
        warm = WARMUP
        if kind == "aio-async":
            warm = WorkloadSpec("warmup", "random", "yield", 500, n_vars=16, seed=99)
        await _run_program(engine, warm, kind)
        if kind != "aio-traced":
            return await _run_program(engine, spec, kind)
        # aio-threaded with a trace recording every operation (the trace's own cost).
        engine.start_trace()
        try:
            return await _run_program(engine, spec, kind)
        finally:
            engine.stop_trace()


def rss_bytes() -> int:
    """Return the resident set size in bytes (``/proc/self/statm``, else psutil, else 0)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        pass
    try:
        psutil = importlib.import_module("psutil")
    except ImportError:
        return 0
    return int(psutil.Process().memory_info().rss)


async def _mem_pending(spec: WorkloadSpec) -> dict[str, Any]:
    """Bytes per pending op: ops queued behind a gate op that holds a var, traced by tracemalloc.

    Two layouts: ``chain`` (every op mutates the gate var) and ``fanout`` (every op reads the
    gate var and mutates one of 100 vars).  The same function object is pushed every time, so
    only the engine's own per-op state (operation object, var-queue entries, bookkeeping) counts.
    """
    import aioengine as ae

    out: dict[str, Any] = {}
    n = spec.n_ops
    for layout in ("chain", "fanout"):
        async with ae.Engine(cpu_workers=os.cpu_count() or 1) as engine:
            ctx = ae.cpu()
            gate = engine.new_var("gate")
            targets = [engine.new_var(f"t{k}") for k in range(100)]
            release = asyncio.Event()

            async def hold(_rctx: object, ev: asyncio.Event = release) -> None:
                await ev.wait()

            def noop(_rctx: object) -> None:
                return None

            engine.push_async(hold, ctx, [], [gate])
            await asyncio.sleep(0)
            gc.collect()
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            push = engine.push_sync
            if layout == "chain":
                for _ in range(n):
                    push(noop, ctx, const_vars=[], mutate_vars=[gate])
            else:
                for i in range(n):
                    push(noop, ctx, const_vars=[gate], mutate_vars=[targets[i % 100]])
            gc.collect()
            after = tracemalloc.get_traced_memory()[0]
            tracemalloc.stop()
            pending = getattr(engine, "pending", None)
            release.set()
            await engine.wait_for_all()
            out[f"pending_bytes_per_op_{layout}"] = (after - before) / n
            if pending is not None:
                out[f"pending_reported_{layout}"] = pending
    out["pending_bytes_per_op"] = max(
        out["pending_bytes_per_op_chain"], out["pending_bytes_per_op_fanout"]
    )
    return out


async def _mem_rss(spec: WorkloadSpec) -> dict[str, Any]:
    """RSS before and after ``spec.n_ops`` no-op ops pushed in batches of 10,000 (threaded).

    One extra batch runs first as a warm-up (pools started, free lists populated) and is not
    counted; RSS is sampled after every batch for the peak.
    """
    import aioengine as ae

    batch_spec = WorkloadSpec("rss-batch", "random", "noop", 10_000, n_vars=256, seed=7)
    prog, n_vars = generate(batch_spec)
    async with ae.Engine(cpu_workers=os.cpu_count() or 1) as engine:
        ctx = ae.cpu()
        vs = [engine.new_var(f"v{k}") for k in range(n_vars)]

        def noop(_rctx: object) -> None:
            return None

        push = engine.push_sync
        n_batches = max(1, spec.n_ops // len(prog))

        async def one_batch() -> None:
            for reads, writes in prog:
                push(
                    noop,
                    ctx,
                    const_vars=[vs[v] for v in reads],
                    mutate_vars=[vs[v] for v in writes],
                )
            await engine.wait_for_all()

        await one_batch()  # warm-up: pools started, free lists populated
        gc.collect()
        start = rss_bytes()
        peak = start
        t0 = time.perf_counter()
        for _ in range(n_batches):
            await one_batch()
            peak = max(peak, rss_bytes())
        dt = time.perf_counter() - t0
        gc.collect()
        end = rss_bytes()
    mib = 1 << 20
    return {
        "rss_ops": n_batches * len(prog),
        "rss_start_mib": start / mib,
        "rss_peak_mib": peak / mib,
        "rss_end_mib": end / mib,
        "rss_growth_mib": (end - start) / mib,
        "rss_us_per_op": dt / (n_batches * len(prog)) * 1e6,
    }


def run_memory(spec: WorkloadSpec, config: str) -> dict[str, Any]:
    """Memory benchmark record for ``memory/pending`` or ``memory/rss``."""
    _, loop_kind = split_loop(config)
    with make_runner(loop_kind) as runner:
        if spec.name.endswith("pending"):
            data = runner.run(_mem_pending(spec))
        else:
            data = runner.run(_mem_rss(spec))
    return {"workload": spec.name, "config": config, "n_ops": spec.n_ops, **data}


def run_workload(spec: WorkloadSpec, config: str) -> dict[str, Any]:
    """Run one workload with the aioengine *config*; return the result record."""
    import aioengine

    kind, loop_kind = split_loop(config)
    if "memory" in spec.tags:
        return run_memory(spec, config)
    if kind not in (*SYNC_KINDS, "aio-async"):
        raise ValueError(f"unknown aioengine config {config!r}")
    heap = user_heap(spec)  # a program workload's own heap, held until it is measured
    with make_runner(loop_kind) as runner:
        dt, check, prog = runner.run(_measure(spec, kind))
    del heap
    return result_record(
        spec,
        config,
        dt,
        check,
        prog,
        extra={"loop": loop_kind, "aioengine": getattr(aioengine, "__version__", "?")},
    )


if __name__ == "__main__":
    run_cli(run_workload, "aioengine peer")
