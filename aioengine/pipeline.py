"""The pipeline behind ``python -m aioengine demo`` and ``examples/pipeline.py``.

Every record goes through five stages, each an operation on the record's own Vars::

    read (coroutine, I/O)  ->  decode (CPU pool)  ->  transform (CPU pool, NumPy)
                                                  ->  upload (coroutine, I/O)
                                                  ->  reduce (inline on the loop thread,
                                                      mutates the shared ``summary`` Var)

Records are independent, so the engine overlaps them: while some records wait on their I/O,
others are being decoded and transformed on the worker threads. Every reduction mutates
``summary``, so the reductions run one at a time, in push order (the engine's one rule): the
checksum, a floating-point sum whose value depends on the order of its terms, is the same on
every run. :func:`run_sequential` calls the same stage functions one record after another with
no engine at all, and must give a bit-identical :class:`PipelineSummary`; that comparison is
what ``python -m aioengine demo`` verifies.

Record ``i`` is ``size`` x ``size`` standard normal floats from ``numpy.random.default_rng((seed,
i))``; the I/O stages only sleep ``io_latency`` seconds, standing in for a file read and an
HTTP PUT. A record's Vars are referenced only by its operations, so its arrays are freed once
its reduction has run.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

import numpy as np

from .context import cpu, remote
from .engine import Engine
from .operation import FnProperty

__all__ = ("STAGES", "PipelineSummary", "run_pipeline", "run_sequential")

STAGES = ("read", "decode", "transform", "upload", "reduce")  # one operation each per record

RECORDS = 200  # defaults of run_pipeline / run_sequential (and of the demo's options)
SIZE = 192
IO_LATENCY = 0.005  # seconds per read and per upload


@dataclass(frozen=True, slots=True)
class PipelineSummary:
    """What a run of the pipeline computed; equal on every run with the same arguments.

    Attributes:
        records: how many records were reduced.
        checksum: the sum over records, in record order, of ``abs(transform(record)).sum()``.
        uploaded_bytes: the bytes the upload stage reported as sent.
    """

    records: int
    checksum: float
    uploaded_bytes: int


class _Totals:
    """The value of the ``summary`` Var: running totals, changed only by :func:`_reduce`."""

    __slots__ = ("checksum", "records", "uploaded_bytes")

    def __init__(self) -> None:
        self.records = 0
        self.checksum = 0.0
        self.uploaded_bytes = 0

    def summary(self) -> PipelineSummary:
        return PipelineSummary(self.records, self.checksum, self.uploaded_bytes)


# -- the stages: plain functions, shared by the engine run and the sequential run ------------


async def _read(seed: int, index: int, size: int, io_latency: float) -> bytes:
    await asyncio.sleep(io_latency)  # a file or object-store read
    rng = np.random.default_rng((seed, index))
    return rng.standard_normal((size, size)).tobytes()


def _decode(raw: bytes, size: int) -> np.ndarray:
    return np.frombuffer(raw).reshape(size, size).copy()


def _transform(x: np.ndarray) -> np.ndarray:
    y: np.ndarray = np.tanh(x @ x.T / x.shape[0])  # some real NumPy work (BLAS releases the GIL)
    y -= y.mean()
    return y


async def _upload(x: np.ndarray, io_latency: float) -> int:
    await asyncio.sleep(io_latency)  # an HTTP PUT
    return x.nbytes


def _reduce(totals: _Totals, x: np.ndarray, sent: int) -> None:
    totals.records += 1
    totals.checksum += float(np.abs(x).sum())
    totals.uploaded_bytes += sent


def _check(records: int, size: int, io_latency: float, seed: int) -> None:
    # Checked here, not by the operations: a float size or seed would fail only inside every
    # read operation (an ExceptionGroup of TypeErrors at the end), and so would a negative
    # seed (NumPy's default_rng rejects it); an infinite io_latency would sleep forever and
    # nan is no duration.
    for name, value in (("records", records), ("size", size), ("seed", seed)):
        if type(value) is not int:
            raise TypeError(f"{name} must be an int, got {value!r}")
    if type(io_latency) not in (int, float):
        raise TypeError(f"io_latency must be a number of seconds, got {io_latency!r}")
    if records < 1 or size < 1 or not (math.isfinite(io_latency) and io_latency >= 0) or seed < 0:
        raise ValueError(
            f"need records >= 1, size >= 1, a finite io_latency >= 0 and seed >= 0, got "
            f"records={records}, size={size}, io_latency={io_latency}, seed={seed}"
        )


async def run_pipeline(
    engine: Engine,
    *,
    records: int = RECORDS,
    size: int = SIZE,
    io_latency: float = IO_LATENCY,
    seed: int = 0,
    progress: bool = False,
    on_cluster: bool = False,
) -> PipelineSummary:
    """Push every record's five stages on ``engine``, wait for all of them, and summarize.

    With ``on_cluster``, the NumPy stages (``decode``, ``transform``) are value operations on
    the engine's Dask cluster (``ctx=remote()``; ``docs/howto/cluster.md``): the uploads and
    the reduction get the gathered arrays, and the summary is the same.

    Pushes ``5 * records`` operations (``read``, ``decode``, ``transform``, ``upload``,
    ``reduce``), then awaits :meth:`Engine.wait_for_all`, with a progress bar when
    ``progress`` is true. Wrap the call in ``async with engine.trace(path):`` to trace it.
    Call it from the engine's event loop. A serial engine (``Engine(serial=True)``) gives the
    same summary.

    Raises:
        ValueError: if ``records < 1``, ``size < 1``, ``io_latency`` is negative or not
            finite, or ``seed < 0``; before anything is pushed.
        ExceptionGroup: from :meth:`Engine.wait_for_all`, if a stage failed.
    """
    _check(records, size, io_latency, seed)
    result = _Totals()
    totals = engine.new_var("summary", value=result)
    numpy_ctx = remote() if on_cluster else cpu()
    for i in range(records):
        raw = engine.new_var(f"raw{i}")
        array = engine.new_var(f"array{i}")
        sent = engine.new_var(f"sent{i}")
        engine.submit(_read, seed, i, size, io_latency, out=raw, name="read")
        engine.submit(_decode, raw, size, out=array, name="decode", ctx=numpy_ctx)
        # Replaces the array (a new one: a value operation must not modify its input).
        engine.submit(_transform, array, out=array, name="transform", ctx=numpy_ctx)
        engine.submit(_upload, array, io_latency, out=sent, name="upload")
        engine.submit(
            _reduce, totals, array, sent, writes=[totals], prop=FnProperty.ASYNC, name="reduce"
        )
    await engine.wait_for_all(progress=progress)
    return result.summary()  # every reduction has run: nothing else touches it now


async def run_sequential(
    *,
    records: int = RECORDS,
    size: int = SIZE,
    io_latency: float = IO_LATENCY,
    seed: int = 0,
) -> PipelineSummary:
    """Run the same stages one record after another, with no engine: the reference result.

    Awaits each read and upload in turn (so it takes about ``2 * records * io_latency``
    seconds plus the CPU work) and calls the CPU stages on the event loop thread.

    Raises:
        ValueError: if ``records < 1``, ``size < 1``, ``io_latency`` is negative or not
            finite, or ``seed < 0``.
    """
    _check(records, size, io_latency, seed)
    totals = _Totals()
    for i in range(records):
        x = _transform(_decode(await _read(seed, i, size, io_latency), size))
        _reduce(totals, x, await _upload(x, io_latency))
    return totals.summary()
