"""How a chunked ``cumulative_sum`` should carry between chunks: one chunk after the other, or
in two passes.

``aioengine.array`` computes ``cumulative_sum`` of a chunked array chunk by chunk, each chunk
starting from the last element of the one before (``aioengine/array/_scan.py``): NumPy's
sequential ``cumsum`` exactly, on one worker at a time. The alternative is two passes: every
chunk's own ``cumsum`` at once, then each chunk adds the total of those before it (two workers,
but the result is read and written twice and rounds differently from NumPy's). This script
times, on ``n`` float64 elements with 2 workers, NumPy's ``cumsum``, the namespace's
``cumulative_sum`` and the two-pass scheme (on a thread pool of 2, as the engine's workers
would run it), each ratio taken within one repetition, and counts how many of the two-pass
results differ from NumPy's. Run: ``python benchmarks/array_scan.py [--quick] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

import aioengine as ae
import aioengine.array as aa
from aioengine.array._chain import chunking


def two_pass(pool: ThreadPoolExecutor, x: Any, chunk: int) -> Any:
    """``cumsum`` in two passes over chunks of ``chunk`` elements, on ``pool``."""
    out = np.empty_like(x)
    bounds = [(lo, min(lo + chunk, x.size)) for lo in range(0, x.size, chunk)]
    list(pool.map(lambda b: np.cumsum(x[b[0] : b[1]], out=out[b[0] : b[1]]), bounds))
    offsets = np.cumsum([out[hi - 1] for _, hi in bounds[:-1]])

    def add(k: int) -> None:
        lo, hi = bounds[k + 1]
        np.add(out[lo:hi], offsets[k], out=out[lo:hi])

    list(pool.map(add, range(len(offsets))))
    return out


async def main(n: int, reps: int) -> dict[str, Any]:
    x = np.random.default_rng(0).standard_normal(n)
    want = np.cumsum(x)
    rows: dict[str, list[float]] = {"numpy": [], "ours": [], "two_pass": []}
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine)
        chunk = chunking(n, xp.chunk_bytes // 8)[1]  # the namespace's chunks of n elements
        ax = xp.asarray(x)
        await ax
        with ThreadPoolExecutor(2) as pool:
            got_two = two_pass(pool, x, chunk)
            assert np.array_equal(await xp.cumulative_sum(ax), want)
            for _ in range(reps):
                start = time.perf_counter()
                np.cumsum(x)
                rows["numpy"].append(time.perf_counter() - start)
                start = time.perf_counter()
                await xp.cumulative_sum(ax)
                rows["ours"].append(time.perf_counter() - start)
                start = time.perf_counter()
                two_pass(pool, x, chunk)
                rows["two_pass"].append(time.perf_counter() - start)
    differ = int(np.count_nonzero(got_two != want))
    return {
        "n": n,
        "chunk_elems": chunk,
        "seconds_median": {k: statistics.median(v) for k, v in rows.items()},
        "ours_over_numpy": statistics.median(
            o / p for o, p in zip(rows["ours"], rows["numpy"], strict=True)
        ),
        "two_pass_over_numpy": statistics.median(
            o / p for o, p in zip(rows["two_pass"], rows["numpy"], strict=True)
        ),
        "two_pass_elements_differing_from_numpy": differ,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1e6 elements, 3 repetitions")
    parser.add_argument("--out", help="write the result as JSON here")
    args = parser.parse_args()
    n, reps = (1_000_000, 3) if args.quick else (8_000_000, 15)
    result = asyncio.run(main(n, reps))
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
