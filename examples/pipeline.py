"""A mixed pipeline with a progress bar and a trace: read, decode, transform, upload, reduce.

Every record goes through five stages, each an operation on the record's own Vars:

    read (coroutine, I/O)  ->  decode (CPU pool)  ->  transform (CPU pool, NumPy)
                                                  ->  upload (coroutine, I/O)
                                                  ->  reduce (inline on the loop, mutates
                                                      the shared ``summary`` Var)

Records are independent, so the engine overlaps them: while one record is uploading, others
are being read and transformed. The reductions all mutate ``summary`` and so run one at a
time, in push order: the summary is the same on every run. The stages live in the package
(``aioengine/pipeline.py``), so this script and ``python -m aioengine demo`` run the same code;
the demo also checks the result against a sequential run. Here the run is traced
(``engine.trace(path)``) and waited for with a progress bar (``wait_for_all(progress=True)``);
open the trace in ui.perfetto.dev or chrome://tracing.

Run: python examples/pipeline.py [TRACE.json]   (AIOENGINE_EXAMPLE_SMALL=1 for a quick run)
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time

import aioengine as ae
from aioengine.pipeline import PipelineSummary, run_pipeline

SMALL = os.environ.get("AIOENGINE_EXAMPLE_SMALL") == "1"
RECORDS = 24 if SMALL else 200
SIZE = 64 if SMALL else 192
IO_LATENCY = 0.002 if SMALL else 0.005


async def traced_pipeline(trace_path: str) -> PipelineSummary:
    async with ae.Engine() as engine, engine.trace(trace_path):
        return await run_pipeline(
            engine, records=RECORDS, size=SIZE, io_latency=IO_LATENCY, progress=True
        )


async def main() -> None:
    trace_path = (
        sys.argv[1]
        if len(sys.argv) > 1
        else os.path.join(tempfile.gettempdir(), "aioengine-pipeline.trace.json")
    )
    t0 = time.perf_counter()
    summary = await traced_pipeline(trace_path)
    wall = time.perf_counter() - t0
    print(
        f"{summary.records} records through read -> decode -> transform -> upload -> "
        f"reduce in {wall:.2f} s (checksum {summary.checksum:.3f}, "
        f"{summary.uploaded_bytes / 1e6:.1f} MB uploaded)"
    )
    print(f"trace: {trace_path}  (open it in ui.perfetto.dev or chrome://tracing)")
    assert summary.records == RECORDS
    assert summary.uploaded_bytes == RECORDS * SIZE * SIZE * 8


if __name__ == "__main__":
    asyncio.run(main())
