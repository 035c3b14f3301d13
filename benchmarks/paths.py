"""The everyday paths against the core's push: ``submit`` and tracing (issue 37).

Two comparisons, each measured side by side in this process, the variants taking turns over
``--pairs`` rounds (fresh engine each run, the collector on, nothing frozen); each figure is
the median of the per-round ratios, so a VM's changing speed moves it little.

**submit.** The value chain of the issue: ``submit(np.add, v, b, out=v, prop=ASYNC)`` pushed
``--ops`` times, then awaited, against the same work pushed with ``push_sync`` and a closure
(``holder[0] = np.add(holder[0], b)`` declared as a write of ``v``). Two shapes: one Var (a
chain), and ``out=`` on one of 1,000 Vars in random order. Reported: CPU seconds per
operation (``time.process_time``, the pushes and the drain) and their ratio
(target <= 1.5x), and the collector-tracked objects per pending operation (the growth of
``gc.get_objects()`` while every operation is pushed and none has run; target <= 0.2).

**tracing.** No-op operations (``push_sync(noop, mutate_vars=[v], prop=ASYNC)``, on a chain,
on independent Vars, and on a fan-out of readers), with ``engine.start_trace()`` recording
every operation, against the same run untraced: throughput ratio traced / untraced
(target >= 0.6), and CPU per operation of each.

Prints one JSON object and writes it to ``results/paths.json`` (``--out`` elsewhere). Timings
are reported, never judged.

Usage::

    python benchmarks/paths.py             # 20,000 operations, 5 pairs
    python benchmarks/paths.py --quick     # 2,000 operations, 2 pairs
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import pathlib
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import aioengine as ae
from aioengine.engine import _COMPILED

ASYNC = ae.FnProperty.ASYNC
NVARS = 1000  # the random-out shape's Vars
OUT = pathlib.Path(__file__).resolve().parent / "results" / "paths.json"
# Where --quick writes by default: an ignored folder (.gitignore), never the committed figures.
QUICK_OUT = OUT.parent / "quick" / "paths.json"


def _noop(rctx: ae.RunContext) -> None:
    pass


async def submit_run(api: str, shape: str, ops: int, seed: int) -> tuple[float, float]:
    """One run: (CPU seconds per operation, tracked objects per pending operation)."""
    engine = ae.Engine()
    nvars = 1 if shape == "chain" else NVARS
    b = np.ones(4)
    order = [0] * ops if nvars == 1 else random.Random(seed).choices(range(nvars), k=ops)
    try:
        if api == "submit":
            vs = [engine.new_var(f"v{i}", value=np.zeros(4)) for i in range(nvars)]
        else:
            vs = [engine.new_var(f"v{i}") for i in range(nvars)]
            holders = [[np.zeros(4)] for _ in range(nvars)]
        await engine.wait_for_all()
        gc.collect()
        before = len(gc.get_objects())
        cpu = time.process_time()
        if api == "submit":
            submit = engine.submit
            for i in order:
                v = vs[i]
                submit(np.add, v, b, out=v, prop=ASYNC)
        else:
            push = engine.push_sync
            for i in order:
                holder = holders[i]

                def step(rctx: ae.RunContext, holder: list[Any] = holder) -> None:
                    holder[0] = np.add(holder[0], b)

                push(step, mutate_vars=[vs[i]], prop=ASYNC)
        tracked = (len(gc.get_objects()) - before) / ops
        await engine.wait_for_all()
        cpu = time.process_time() - cpu
        # Every chain added b once per operation on it.
        counts = np.bincount(order, minlength=nvars)
        for i in (0, nvars - 1):
            value = await vs[i].get() if api == "submit" else holders[i][0]
            assert np.array_equal(value, np.full(4, float(counts[i]))), (api, shape, value)
    finally:
        await engine.aclose()
    return cpu / ops, tracked


async def trace_run(traced: bool, shape: str, ops: int) -> float:
    """One run of no-op operations: CPU seconds per operation."""
    engine = ae.Engine()
    try:
        const = [engine.new_var("read")]  # fanout: every operation reads it
        vs = [engine.new_var(f"v{i}") for i in range(1 if shape == "chain" else 64)]
        await engine.wait_for_all()
        if traced:
            engine.start_trace()
        cpu = time.process_time()
        push = engine.push_sync
        n = len(vs)
        if shape == "fanout":
            for _ in range(ops):
                push(_noop, const_vars=const, prop=ASYNC)
        else:
            for i in range(ops):
                push(_noop, mutate_vars=[vs[i % n]], prop=ASYNC)
        await engine.wait_for_all()
        cpu = time.process_time() - cpu
        if traced:
            trace = engine.stop_trace()
            slices = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
            assert len(slices) >= ops, (shape, len(slices))
    finally:
        await engine.aclose()
    return cpu / ops


def paired(
    pairs: int, first: Callable[[], Any], second: Callable[[], Any]
) -> tuple[list[Any], list[Any]]:
    a, b = [], []
    for r in range(pairs):
        # Alternate which goes first: neither always has the warmer caches.
        runs = (first, second) if r % 2 == 0 else (second, first)
        out = [asyncio.run(f()) for f in runs]
        a.append(out[0] if r % 2 == 0 else out[1])
        b.append(out[1] if r % 2 == 0 else out[0])
    return a, b


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=20_000)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="2,000 operations, 2 pairs")
    parser.add_argument(
        "--out", help="where to write the JSON (results/paths.json; --quick: results/quick/)"
    )
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = str(QUICK_OUT if args.quick else OUT)
    if args.quick:
        args.ops, args.pairs = 2_000, 2
    report: dict[str, Any] = {
        "compiled": _COMPILED,
        "ops": args.ops,
        "pairs": args.pairs,
        "submit": {},
        "trace": {},
    }
    for shape in ("chain", "random_out"):
        subs, pushes = paired(
            args.pairs,
            lambda shape=shape: submit_run("submit", shape, args.ops, 1),  # type: ignore[misc]
            lambda shape=shape: submit_run("push_sync", shape, args.ops, 1),  # type: ignore[misc]
        )
        ratios = [s[0] / p[0] for s, p in zip(subs, pushes, strict=True)]
        report["submit"][shape] = {
            "submit_us_per_op": round(statistics.median(s[0] for s in subs) * 1e6, 2),
            "push_sync_us_per_op": round(statistics.median(p[0] for p in pushes) * 1e6, 2),
            "cpu_ratio": round(statistics.median(ratios), 2),
            "cpu_ratio_range": [round(min(ratios), 2), round(max(ratios), 2)],
            "tracked_per_pending_submit": round(statistics.median(s[1] for s in subs), 3),
            "tracked_per_pending_push_sync": round(statistics.median(p[1] for p in pushes), 3),
        }
    for shape in ("chain", "independent", "fanout"):
        traced, plain = paired(
            args.pairs,
            lambda shape=shape: trace_run(True, shape, args.ops),  # type: ignore[misc]
            lambda shape=shape: trace_run(False, shape, args.ops),  # type: ignore[misc]
        )
        ratios = [p / t for t, p in zip(traced, plain, strict=True)]
        report["trace"][shape] = {
            "traced_us_per_op": round(statistics.median(traced) * 1e6, 2),
            "untraced_us_per_op": round(statistics.median(plain) * 1e6, 2),
            "throughput_ratio": round(statistics.median(ratios), 2),
            "throughput_ratio_range": [round(min(ratios), 2), round(max(ratios), 2)],
        }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
