"""A mixed pipeline with a progress bar and a trace: read, decode, transform, upload, reduce.

Every record goes through five stages, each an operation on the record's own Vars:

    read (coroutine, I/O)  ->  decode (CPU pool)  ->  transform (CPU pool, NumPy)
                                                       ->  upload (coroutine, I/O)
                                                       ->  reduce (inline on the loop, mutates
                                                           the shared ``summary`` Var)

Records are independent, so the engine overlaps them: while one record is uploading, others
are being read and transformed. The reductions all mutate ``summary`` and so run one at a
time, in push order: the summary is the same on every run. The run is traced
(``engine.trace(path)``) and waited for with a progress bar
(``wait_for_all(progress=True)``); open the trace in ui.perfetto.dev or chrome://tracing.

Run: python examples/pipeline.py [TRACE.json]   (AIOENGINE_EXAMPLE_SMALL=1 for a quick run)
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time

import numpy as np

import aioengine as ae

SMALL = os.environ.get("AIOENGINE_EXAMPLE_SMALL") == "1"
RECORDS = 24 if SMALL else 200
SIZE = 64 if SMALL else 192
IO_LATENCY = 0.002 if SMALL else 0.005


async def run_pipeline(trace_path: str) -> dict[str, float]:
    summary = {"records": 0.0, "checksum": 0.0, "uploaded": 0.0}
    async with ae.Engine() as engine:
        total = engine.new_var("summary", value=summary)

        async def read(i: int) -> bytes:
            await asyncio.sleep(IO_LATENCY)  # a file or object-store read
            rng = np.random.default_rng(i)
            return rng.standard_normal((SIZE, SIZE)).tobytes()

        def decode(raw: bytes) -> np.ndarray:
            return np.frombuffer(raw).reshape(SIZE, SIZE).copy()

        def transform(x: np.ndarray) -> np.ndarray:
            x = np.tanh(x @ x.T / SIZE)  # some real NumPy work
            x -= x.mean()
            return x

        async def upload(x: np.ndarray) -> int:
            await asyncio.sleep(IO_LATENCY)  # an HTTP PUT
            return x.nbytes

        def reduce(summary: dict[str, float], x: np.ndarray) -> None:
            summary["records"] += 1
            summary["checksum"] += float(np.abs(x).sum())

        def count_upload(summary: dict[str, float], nbytes: int) -> None:
            summary["uploaded"] += nbytes

        async with engine.trace(trace_path):
            for i in range(RECORDS):
                raw, array = engine.new_var(f"raw{i}"), engine.new_var(f"array{i}")
                engine.submit(read, i, out=raw, name="read")
                engine.submit(decode, raw, out=array, name="decode")
                engine.submit(transform, array, out=array, name="transform")  # in place
                sent = engine.new_var(f"sent{i}")
                engine.submit(upload, array, out=sent, name="upload")
                engine.submit(reduce, total, array, writes=[total], prop=ae.FnProperty.ASYNC)
                engine.submit(count_upload, total, sent, writes=[total], name="count")
            await engine.wait_for_all(progress=True)
    return summary


async def main() -> None:
    trace_path = (
        sys.argv[1]
        if len(sys.argv) > 1
        else os.path.join(tempfile.gettempdir(), "aioengine-pipeline.trace.json")
    )
    t0 = time.perf_counter()
    summary = await run_pipeline(trace_path)
    wall = time.perf_counter() - t0
    print(
        f"{int(summary['records'])} records through read -> decode -> transform -> upload -> "
        f"reduce in {wall:.2f} s (checksum {summary['checksum']:.3f}, "
        f"{summary['uploaded'] / 1e6:.1f} MB uploaded)"
    )
    print(f"trace: {trace_path}  (open it in ui.perfetto.dev or chrome://tracing)")
    assert summary["records"] == RECORDS
    assert summary["uploaded"] == RECORDS * SIZE * SIZE * 8


if __name__ == "__main__":
    asyncio.run(main())
