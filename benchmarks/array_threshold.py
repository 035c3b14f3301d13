"""Where small array operations should run: inline on the event loop or on the CPU pool.

``aioengine.array`` runs an operation inline on the loop (``FnProperty.ASYNC``) when it touches
at most ``aioengine.array.INLINE_COST`` elements, on the device's thread pool otherwise. This
script measures, for arrays of 2**k float64 elements, the wall time per operation of two
programs run both ways (the threshold forced to 0, or to infinity):

* a chain (``c = c + b``, each operation needs the previous one): no parallelism to gain, so
  the pool costs a thread hop per operation;
* four independent chains (``y_i = y_i * 0.999 + 0.5``): the pool can run two at a time on
  two cores.

and the time one operation occupies the loop when inline (a loop that serves I/O should not be
held for long). Run: ``python benchmarks/array_threshold.py [--quick]``; it prints a table of
pool/inline ratios per size (below 1: the pool is faster) and writes JSON with ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import numpy as np

import aioengine as ae
import aioengine.array as aa
from aioengine.array import _push


async def _chain(xp: Any, n: int, ops: int) -> float:
    c = xp.asarray(np.zeros(n))
    b = xp.asarray(np.ones(n))
    await c
    start = time.perf_counter()
    for _ in range(ops):
        c = c + b
    await c
    return (time.perf_counter() - start) / ops


async def _branches(xp: Any, n: int, ops: int) -> float:
    ys = [xp.asarray(np.full(n, float(i))) for i in range(4)]
    start = time.perf_counter()
    for _ in range(ops // 4):
        ys = [y * 0.999 + 0.5 for y in ys]
    for y in ys:
        await y
    return (time.perf_counter() - start) / (ops // 4 * 2 * 4)


async def measure(sizes: list[int], ops: int) -> list[dict[str, Any]]:
    rows = []
    saved = _push.INLINE_COST
    try:
        async with ae.Engine(cpu_workers=2) as engine:
            xp = aa.namespace(engine)
            for n in sizes:
                row: dict[str, Any] = {"elements": n}
                for mode, cost in (("inline", 1 << 62), ("pool", 0)):
                    _push.INLINE_COST = cost
                    k = max(ops * 1024 // max(n, 1024), 20)
                    row[f"chain_{mode}_us"] = min([await _chain(xp, n, k) for _ in range(3)]) * 1e6
                    row[f"branches_{mode}_us"] = (
                        min([await _branches(xp, n, k) for _ in range(3)]) * 1e6
                    )
                a = np.ones(n)
                start = time.perf_counter()
                for _ in range(50):
                    np.add(a, a)
                row["numpy_add_us"] = (time.perf_counter() - start) / 50 * 1e6
                rows.append(row)
    finally:
        _push.INLINE_COST = saved
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes and operations")
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args()
    sizes = [1 << k for k in (range(8, 21, 4) if args.quick else range(6, 21, 2))]
    rows = asyncio.run(measure(sizes, 200 if args.quick else 2000))
    header = ("elements", "np.add µs", "chain pool/inline", "branches pool/inline")
    print(f"{header[0]:>9} {header[1]:>10} {header[2]:>18} {header[3]:>21}")
    for r in rows:
        chain = r["chain_pool_us"] / r["chain_inline_us"]
        branches = r["branches_pool_us"] / r["branches_inline_us"]
        print(f"{r['elements']:>9} {r['numpy_add_us']:>10.1f} {chain:>18.2f} {branches:>21.2f}")
    print(f"current threshold: INLINE_COST = {aa.INLINE_COST} elements")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "inline_cost": aa.INLINE_COST}, f, indent=2)


if __name__ == "__main__":
    main()
