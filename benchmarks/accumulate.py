"""The accumulate workload: commute mode vs write mode vs ``submit(accumulate=)``.

``ops`` operations each read one of ``inputs`` input Vars and add its value into one of
``accs`` accumulator Vars. The values are NumPy arrays of ``--size`` float64 elements (800 KB by
default: an addition is real work, 30-50 microseconds, as when the gradients of a 100,000-weight
model are accumulated), added in place; ``--size 0`` makes them Python ints, so that an
addition costs nothing next to the engine's own work. The inputs are written first by coroutines
that finish after random durations, in random order (``--arrival random``), or in push order
(``in-order``). With random arrival, addition ``i`` reads input ``i % inputs``; in order, it
reads input ``i * inputs // ops``, so that every addition's input is ready no later than the
next one's: the case in which push order costs write mode nothing.
Declared as writers of their accumulator, the additions run in push order, so one late input
stalls every later addition into the same accumulator; declared commute, an addition runs as
soon as its input is ready. ``submit`` is the reduction API, which runs the call without the
accumulator and merges its result as a commute access (two operations per addition).

The wall time has three parts, each reported: the pushes (``push_s``; nothing runs meanwhile,
the inputs' writers start once the loop is free), the inputs' arrival (``--spread``), and what
is left after the last input (``after_last_input_s``). Commute mode adds while the inputs
arrive and has only the last input's additions left; write mode has nearly all of them left
(each accumulator waits for its slowest input). The modes pay the first two parts alike, so
the commute/write ratio is ``(push + spread + write's rest) / (push + spread + commute's
rest)``: the cheaper an addition is next to a push and to the spread, the closer to 1. With
``--size 0`` write mode's backlog drains in a few milliseconds and the ratio measures only how
long the inputs take to arrive, which is why the figure of record uses real additions.

Each configuration runs ``reps`` times in this process (fresh engine, same seeds), the
configurations taking turns; the figure is the median throughput (additions per second).
Every run checks the accumulators' final values. Prints one JSON object; timings are
reported, never judged (the issue's targets: commute >= 1.3x write mode with random arrival,
and no slower than write mode in order).

Usage::

    python benchmarks/accumulate.py             # 20,000 additions, 100 inputs, 8 accumulators
    python benchmarks/accumulate.py --quick     # 2,000 additions of 10,000 elements, once
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from typing import Any

import numpy as np

import aioengine as ae
from aioengine.engine import _COMPILED

MODES = ("commute", "write", "submit")


async def run_once(
    mode: str, arrival: str, ops: int, inputs: int, accs: int, spread: float, size: int
) -> tuple[float, float, float]:
    """One run; returns its wall time in seconds (pushes to the last addition), and the part
    of it spent pushing and after the last input was written."""
    rng = random.Random(1234)
    engine = ae.Engine()
    in_vars = [engine.new_var(f"in{k}", value=0) for k in range(inputs)]
    acc_vars = [engine.new_var(f"acc{j}", value=_zero(size)) for j in range(accs)]
    delays = [spread * k / inputs for k in range(inputs)]
    if arrival == "random":
        rng.shuffle(delays)
    totals = [0] * accs

    last_input = [0.0]

    async def produce(k: int) -> None:
        await asyncio.sleep(delays[k])
        in_vars[k]._value = _zero(size) + (k + 1)
        last_input[0] = time.perf_counter()

    start = time.perf_counter()
    for k in range(inputs):
        engine.push_async(lambda rctx, k=k: produce(k), mutate_vars=[in_vars[k]])
    for i in range(ops):
        k, j = (i % inputs if arrival == "random" else i * inputs // ops), i % accs
        totals[j] += k + 1
        src, dst = in_vars[k], acc_vars[j]
        if mode == "submit":
            engine.submit(_identity, src, accumulate=dst)
            continue

        def add(rctx: ae.RunContext, src: ae.Var = src, dst: ae.Var = dst) -> None:
            dst._value += src._value  # in place for an array: no new accumulator per addition

        if mode == "commute":
            engine.push_sync(add, const_vars=[src], commute_vars=[dst])
        else:
            engine.push_sync(add, const_vars=[src], mutate_vars=[dst])
    pushed = time.perf_counter()
    await engine.wait_for_all()
    end = time.perf_counter()
    got = [_total(v._value) for v in acc_vars]
    await engine.aclose()
    if got != totals:
        raise AssertionError(f"{mode}: accumulators {got} != {totals}")
    return end - start, pushed - start, end - last_input[0]


def _identity(x: Any) -> Any:
    return x


def _zero(size: int) -> Any:
    """An accumulator's start: 0, or a float64 array of ``size`` zeros."""
    return np.zeros(size) if size else 0


def _total(value: Any) -> int:
    """What an accumulator holds, checked whole: every element of an array must be equal (the
    sums are integers well below 2**53, so float64 adds them exactly, in any order)."""
    if isinstance(value, np.ndarray):
        if not (value == value[0]).all():
            raise AssertionError("an accumulator's elements differ: a lost or torn addition")
        return int(value[0])
    return int(value)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2,000 additions of 10,000 elements, once")
    ap.add_argument("--ops", type=int, default=20_000)
    ap.add_argument("--inputs", type=int, default=100)
    ap.add_argument("--accs", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument(
        "--size",
        type=int,
        default=100_000,
        help="float64 elements per value (0: Python ints, additions that cost nothing)",
    )
    ap.add_argument(
        "--spread", type=float, default=1.0, help="seconds over which the inputs arrive"
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.ops, args.reps, args.spread, args.size = 2_000, 1, 0.05, 10_000
    results: dict[str, Any] = {
        "benchmark": "accumulate",
        "core": "compiled" if _COMPILED else "pure Python",
        "ops": args.ops,
        "inputs": args.inputs,
        "accs": args.accs,
        "spread_s": args.spread,
        "size": args.size,
        "reps": args.reps,
    }
    for mode in MODES:  # warm-up, untimed: the first run in a process pays its start-up
        asyncio.run(
            run_once(mode, "random", min(args.ops, 2_000), args.inputs, args.accs, 0.01, args.size)
        )
    for arrival in ("random", "in-order"):
        row: dict[str, Any] = {}
        # The configurations take turns, repetition by repetition: on a shared machine a
        # change of load then falls on all of them, not on one configuration's runs.
        times: dict[str, list[tuple[float, float, float]]] = {mode: [] for mode in MODES}
        for _ in range(args.reps):
            for mode in MODES:
                times[mode].append(
                    asyncio.run(
                        run_once(
                            mode, arrival, args.ops, args.inputs, args.accs, args.spread, args.size
                        )
                    )
                )
        for mode in MODES:
            walls = [t[0] for t in times[mode]]
            row[mode] = {
                "ops_per_s": round(args.ops / statistics.median(walls)),
                "spread": round((max(walls) - min(walls)) / statistics.median(walls), 3),
                # Where the time went: pushing (nothing can run meanwhile: the inputs' writers
                # start when the loop is free), then the inputs' arrival, and after the last.
                "push_s": round(statistics.median(t[1] for t in times[mode]), 3),
                "after_last_input_s": round(statistics.median(t[2] for t in times[mode]), 3),
            }
        row["commute_vs_write"] = round(row["commute"]["ops_per_s"] / row["write"]["ops_per_s"], 2)
        row["submit_vs_write"] = round(row["submit"]["ops_per_s"] / row["write"]["ops_per_s"], 2)
        results[arrival] = row
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
