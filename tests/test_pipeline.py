"""The pipeline of ``python -m aioengine demo`` and ``examples/pipeline.py``."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

import pytest

import aioengine as ae
from aioengine.pipeline import STAGES, PipelineSummary, run_pipeline, run_sequential

from .test_trace import check_format

SMALL: dict[str, Any] = {"records": 12, "size": 8, "io_latency": 0.0}


def tracks_of(trace: dict[str, Any]) -> dict[str, set[str]]:
    """Map each operation name in a Chrome trace to the tracks it ran on.

    Tracks are named as in the trace, less the numbering: ``coroutine ops`` (any lane),
    ``event loop`` (whatever the loop thread is called) and ``aioengine-cpu0_0``, ....
    """
    events = check_format(trace)
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    tracks: defaultdict[str, set[str]] = defaultdict(set)
    for e in events:
        if e["ph"] == "X" and e.get("cat") == "op":
            tracks[e["name"]].add(names[e["tid"]].split(" #")[0].split(" (")[0])
    return dict(tracks)


class TestPipeline:
    async def test_engine_run_equals_the_sequential_run(self, engine: ae.Engine) -> None:
        summary = await run_pipeline(engine, **SMALL)
        assert summary == await run_sequential(**SMALL)
        assert summary.records == 12
        assert summary.uploaded_bytes == 12 * 8 * 8 * 8
        assert summary.checksum > 0

    async def test_stages_run_where_the_docstring_says(self, threaded_engine: ae.Engine) -> None:
        with threaded_engine.trace() as session:
            await run_pipeline(threaded_engine, **SMALL)
        assert session.trace is not None
        tracks = tracks_of(session.trace)
        assert set(tracks) == set(STAGES)
        assert tracks["read"] == tracks["upload"] == {"coroutine ops"}
        assert tracks["decode"] | tracks["transform"] <= {"aioengine-cpu0_0", "aioengine-cpu0_1"}
        assert tracks["reduce"] == {"event loop"}

    async def test_reductions_run_in_push_order(self, threaded_engine: ae.Engine) -> None:
        with threaded_engine.trace() as session:
            await run_pipeline(threaded_engine, **SMALL)
        assert session.trace is not None
        reduces = sorted(
            (e["ts"], e["args"]["seq"], e["args"]["mutate_vars"])
            for e in session.trace["traceEvents"]
            if e["ph"] == "X" and e["name"] == "reduce"
        )
        assert [seq for _, seq, _ in reduces] == sorted(seq for _, seq, _ in reduces)
        assert all(mutates == ["summary"] for _, _, mutates in reduces)
        assert len(reduces) == 12

    async def test_the_seed_picks_the_records(self) -> None:
        first = await run_sequential(**SMALL, seed=1)
        assert first == await run_sequential(**SMALL, seed=1)
        assert first.checksum != (await run_sequential(**SMALL, seed=2)).checksum
        assert first == PipelineSummary(12, first.checksum, 12 * 8 * 8 * 8)

    @pytest.mark.parametrize(
        "bad",
        [
            pytest.param({"records": 0}, id="records"),
            pytest.param({"size": 0}, id="size"),
            pytest.param({"io_latency": -1.0}, id="io_latency"),
            pytest.param({"io_latency": float("inf")}, id="io_latency-inf"),  # would sleep forever
            pytest.param({"io_latency": float("nan")}, id="io_latency-nan"),
            pytest.param({"seed": -1}, id="seed"),  # would fail only inside the reads
        ],
    )
    async def test_bad_arguments_raise_before_pushing(
        self, threaded_engine: ae.Engine, bad: dict[str, Any]
    ) -> None:
        message = r"^need records >= 1, size >= 1, a finite io_latency >= 0 and seed >= 0, got"
        async with asyncio.timeout(30):  # an unchecked io_latency=inf would sleep forever
            with pytest.raises(ValueError, match=message):
                await run_pipeline(threaded_engine, **{**SMALL, **bad})
            with pytest.raises(ValueError, match=message):
                await run_sequential(**{**SMALL, **bad})
        assert threaded_engine.statistics().pushed == 0

    @pytest.mark.parametrize(
        ("bad", "message"),
        [
            pytest.param({"size": 8.0}, "size must be an int", id="size"),
            pytest.param({"seed": 1.5}, "seed must be an int", id="seed"),
            pytest.param({"records": 3.0}, "records must be an int", id="records"),
            pytest.param({"io_latency": "0"}, "io_latency must be a number", id="io_latency"),
        ],
    )
    async def test_wrong_types_raise_before_pushing(
        self, threaded_engine: ae.Engine, bad: dict[str, Any], message: str
    ) -> None:
        """Not an ExceptionGroup of TypeErrors from every read operation, at the end."""
        with pytest.raises(TypeError, match=f"^{message}"):
            await run_pipeline(threaded_engine, **{**SMALL, **bad})
        with pytest.raises(TypeError, match=f"^{message}"):
            await run_sequential(**{**SMALL, **bad})
        assert threaded_engine.statistics().pushed == 0
