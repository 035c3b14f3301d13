"""Timeline: a trace drawn as SVG rows and rectangles that match the trace's tracks and times."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import re
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any

import pytest

import aioengine as ae
from aioengine.observe.trace import TraceSession

SVG = "{http://www.w3.org/2000/svg}"
TOLERANCE = 0.011  # px: the SVG writes coordinates with two decimals


@dataclass
class Drawn:
    """One ``<g class="slice">`` (or instant) of the SVG."""

    title: str
    x: float
    y: float
    width: float
    fill: str
    stroke: str
    label: str | None

    @property
    def name(self) -> str:
        return re.split(r" — | \(instant\)", self.title.splitlines()[0])[0]


@dataclass
class Row:
    """One ``<g class="track">`` of the SVG."""

    name: str
    y: float
    height: float
    slices: list[Drawn]
    instants: list[Drawn]


@dataclass
class Picture:
    root: ET.Element
    rows: list[Row]
    left: float
    right: float
    font_size: float


def parse(svg: str) -> Picture:
    """Parse the SVG (it must be well-formed XML) into rows of drawn slices."""
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    rows = []
    for g in root.iter(f"{SVG}g"):
        if g.get("class") != "track":
            continue
        row_rect = g.find(f"{SVG}rect[@class='row']")
        label = g.find(f"{SVG}text[@class='track-label']")
        assert row_rect is not None
        assert label is not None
        label_title = label.find(f"{SVG}title")
        assert label_title is not None
        rows.append(
            Row(
                name=label_title.text or "",
                y=float(row_rect.get("y", "nan")),
                height=float(row_rect.get("height", "nan")),
                slices=[_drawn(s) for s in g.findall(f"{SVG}g[@class='slice']")],
                instants=[_drawn(s) for s in g.findall(f"{SVG}g[@class='instant']")],
            )
        )
    axis = root.find(f".//{SVG}line[@class='axis-line']")
    assert axis is not None
    return Picture(
        root,
        rows,
        float(axis.get("x1", "nan")),
        float(axis.get("x2", "nan")),
        float(root.get("font-size", "nan")),
    )


def _drawn(g: ET.Element) -> Drawn:
    title = g.find(f"{SVG}title")
    assert title is not None
    shape = g.find(f"{SVG}rect")
    if shape is None:  # an instant: a triangle whose apex is at its time
        shape = g.find(f"{SVG}path")
        assert shape is not None
        apex = re.findall(r"L([\d.]+),([\d.]+) Z", shape.get("d", ""))
        x, y, width = float(apex[0][0]), float(apex[0][1]), 0.0
    else:
        x, y, width = (float(shape.get(a, "nan")) for a in ("x", "y", "width"))
    text = g.find(f"{SVG}text")
    return Drawn(
        title=title.text or "",
        x=x,
        y=y,
        width=width,
        fill=shape.get("fill", ""),
        stroke=shape.get("stroke", ""),
        label=None if text is None else text.text,
    )


def thread_names(trace: dict[str, Any]) -> dict[int, str]:
    return {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}


def sort_indexes(trace: dict[str, Any]) -> dict[int, int]:
    return {
        e["tid"]: e["args"]["sort_index"]
        for e in trace["traceEvents"]
        if e["name"] == "thread_sort_index"
    }


def complete(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


async def run_program(engine: ae.Engine) -> TraceSession:
    """Two sync fills (one per worker, held together by a barrier), a coroutine, a reader."""
    x, y = engine.new_var("x"), engine.new_var("y")
    both = threading.Barrier(2, timeout=10)

    def fill(rctx: ae.RunContext) -> None:
        both.wait()  # each fill has a worker thread to itself, so there are two thread tracks

    async def fetch(rctx: ae.RunContext) -> int:
        await asyncio.sleep(0.001)  # an 'await' slice between two 'run' slices
        return 1

    async with engine.trace() as session:
        engine.push_sync(fill, mutate_vars=[x], name="fill_x")
        engine.push_sync(fill, mutate_vars=[y], name="fill_y")
        engine.push_async(fetch, const_vars=[x], mutate_vars=[y], name="fetch")
        engine.push_sync(lambda r: None, const_vars=[y], name="use")
        await engine.wait_for_all()
    return session


class TestEngineTrace:
    async def test_one_row_per_track_named_and_ordered_as_in_the_trace(
        self, threaded_engine: ae.Engine
    ) -> None:
        session = await run_program(threaded_engine)
        trace = session.trace
        assert trace is not None
        picture = parse(session.timeline().to_svg())
        names, order = thread_names(trace), sort_indexes(trace)
        expected = [names[tid] for tid in sorted(names, key=lambda t: (order[t], t))]
        assert [row.name for row in picture.rows] == expected
        assert expected[0] == "coroutine ops #1"
        assert [n.rsplit("_", 1)[0] for n in expected[1:]] == ["aioengine-cpu0"] * 2
        # Rows are stacked top to bottom without overlapping.
        for upper, lower in zip(picture.rows, picture.rows[1:], strict=False):
            assert lower.y == pytest.approx(upper.y + upper.height)
        # Each row holds exactly the slices of its thread, whatever their names.
        for row in picture.rows:
            (tid,) = [t for t, n in names.items() if n == row.name]
            on_track = sorted(e["name"] for e in complete(trace) if e["tid"] == tid)
            assert sorted(s.name for s in row.slices) == on_track

    async def test_one_rect_per_slice_placed_by_its_time(self, threaded_engine: ae.Engine) -> None:
        session = await run_program(threaded_engine)
        assert session.trace is not None
        events = complete(session.trace)
        picture = parse(session.timeline().to_svg())
        drawn = [s for row in picture.rows for s in row.slices]
        assert len(drawn) == len(events)
        assert len(picture.root.findall(f".//{SVG}g[@class='slice']/{SVG}rect")) == len(events)
        start = min(e["ts"] for e in events)
        span = max(e["ts"] + e["dur"] for e in events) - start
        scale = (picture.right - picture.left) / span
        names = thread_names(session.trace)
        for row in picture.rows:
            mine = sorted(
                (e for e in events if names[e["tid"]] == row.name),
                key=lambda e: (e["ts"], -e["dur"]),
            )
            ordered = sorted(row.slices, key=lambda s: (s.x, -s.width))
            assert [s.name for s in ordered] == [e["name"] for e in mine]
            for s, e in zip(ordered, mine, strict=True):
                assert s.x == pytest.approx(picture.left + (e["ts"] - start) * scale, abs=TOLERANCE)
                assert s.width == pytest.approx(max(e["dur"] * scale, 1.0), abs=TOLERANCE)
        by_name: dict[str, Drawn] = {s.name: s for s in drawn if s.name not in ("run", "await")}
        fill_x, fill_y, fetch, use = (by_name[n] for n in ("fill_x", "fill_y", "fetch", "use"))
        # The fills overlap (the barrier held them together); fetch waits for both, use for fetch.
        assert fill_x.x < fill_y.x + fill_y.width
        assert fill_y.x < fill_x.x + fill_x.width
        assert fetch.x >= max(fill_x.x + fill_x.width, fill_y.x + fill_y.width) - TOLERANCE
        assert use.x >= fetch.x + fetch.width - TOLERANCE
        assert min(fill_x.x, fill_y.x) == pytest.approx(picture.left, abs=TOLERANCE)
        # The coroutine's steps sit inside its slice, one sub-row down.
        (coroutine_row,) = [r for r in picture.rows if r.name == "coroutine ops #1"]
        steps = [s for s in coroutine_row.slices if s.name in ("run", "await")]
        assert {s.name for s in steps} == {"run", "await"}
        for step in steps:
            assert step.y > fetch.y
            assert fetch.x - TOLERANCE <= step.x
            assert step.x + step.width <= fetch.x + fetch.width + TOLERANCE

    async def test_tooltips_name_the_duration_and_the_vars(
        self, threaded_engine: ae.Engine
    ) -> None:
        session = await run_program(threaded_engine)
        drawn = {s.name: s for row in parse(session.timeline().to_svg()).rows for s in row.slices}
        fetch = drawn["fetch"].title.splitlines()
        assert re.fullmatch(r"fetch — \d+\.\d+ (µs|ms)", fetch[0]), fetch
        assert {"const_vars: x", "mutate_vars: y", "kind: coroutine", "outcome: done"} <= set(fetch)
        fill_x = drawn["fill_x"].title.splitlines()
        assert {"const_vars: -", "mutate_vars: x", "pool: cpu0"} <= set(fill_x)
        assert not any(line.startswith("name:") for line in fetch + fill_x)

    async def test_text_summary(self, threaded_engine: ae.Engine) -> None:
        session = await run_program(threaded_engine)
        assert session.trace is not None
        timeline = session.timeline()
        events = complete(session.trace)
        lines = str(timeline).splitlines()
        assert re.fullmatch(
            rf"aioengine timeline: \d+\.\d+ (µs|ms), 3 track\(s\), {len(events)} slice\(s\)",
            lines[0],
        )
        names = thread_names(session.trace)
        assert len(lines) == 4
        for line, row in zip(lines[1:], parse(timeline.to_svg()).rows, strict=True):
            count = sum(names[e["tid"]] == row.name for e in events)
            assert re.fullmatch(
                rf"  {re.escape(row.name)} +{count} slice\(s\), busy \S+ \S+ \(\d+%\)", line
            ), line
        assert re.fullmatch(
            rf"<aioengine\.Timeline tracks=3 slices={len(events)} span=\d+\.\d+ (µs|ms)>",
            repr(timeline),
        )

    async def test_session_timeline_draws_its_trace(self, threaded_engine: ae.Engine) -> None:
        session = await run_program(threaded_engine)
        assert session.trace is not None
        svg = session.timeline().to_svg()
        assert svg == ae.Timeline(session.trace).to_svg()
        assert svg == ae.Timeline(json.loads(json.dumps(session.trace))).to_svg()
        assert svg == ae.Timeline(session.trace["traceEvents"]).to_svg()  # JSON Array Format

    async def test_a_trace_that_cannot_be_written_is_kept(
        self, engine: ae.Engine, tmp_path: pathlib.Path
    ) -> None:
        session = engine.trace(tmp_path / "no-such-directory" / "run.json")
        with pytest.raises(FileNotFoundError):
            async with session:
                await engine.push_sync(lambda r: None, name="traced")
        assert session.trace is not None
        assert [s.name for t in session.timeline().tracks for s in t.slices] == ["traced"]

    async def test_names_that_are_not_text_are_drawn(self, engine: ae.Engine) -> None:
        """A lone surrogate (os.fsdecode of an undecodable file name) becomes U+FFFD."""
        async with engine.trace() as session:
            await engine.push_sync(lambda r: None, name="file-\udcff")
        svg = session.timeline().to_svg()
        assert "file-\ufffd" in svg
        svg.encode("utf-8")  # writable as the UTF-8 it declares

    async def test_timeline_before_the_block_exits_raises(self, engine: ae.Engine) -> None:
        session = engine.trace()
        message = r"^the trace of <.*> is not finished; call timeline\(\) after the `with"
        with pytest.raises(RuntimeError, match=message):
            session.timeline()
        async with session:
            with pytest.raises(RuntimeError, match=message):
                session.timeline()
        assert isinstance(session.timeline(), ae.Timeline)

    async def test_empty_trace(self, engine: ae.Engine) -> None:
        async with engine.trace() as session:
            pass
        timeline = session.timeline()
        assert timeline.tracks == ()
        assert str(timeline) == "aioengine timeline: no slices"
        assert repr(timeline) == "<aioengine.Timeline tracks=0 slices=0 span=0.0 µs>"
        picture = parse(timeline.to_svg())
        assert picture.rows == []
        assert picture.root.get("class") == "aioengine-timeline"
        assert picture.root.get("width") == "900"
        summary = picture.root.find(f"{SVG}text[@class='summary']")
        assert summary is not None
        assert summary.text == "aioengine timeline: no slices"

    async def test_failed_and_skipped_operations(self, engine: ae.Engine) -> None:
        x = engine.new_var("x")

        def boom(rctx: ae.RunContext) -> None:
            raise ValueError("boom")

        async with engine.trace() as session:
            failed = engine.push_sync(boom, mutate_vars=[x], name="boom")
            skipped = engine.push_sync(lambda r: None, const_vars=[x], name="skipped")
            with pytest.raises(ValueError, match="boom"):
                await failed
            with pytest.raises(ae.DependencyError):
                await skipped
        rows = parse(session.timeline().to_svg()).rows
        (boom_slice,) = [s for r in rows for s in r.slices]
        assert boom_slice.name == "boom"
        assert boom_slice.stroke == "#c62828"
        assert {"outcome: failed", "error: ValueError: boom"} <= set(boom_slice.title.splitlines())
        (instant,) = [s for r in rows for s in r.instants]
        assert instant.title.splitlines()[0] == "skipped (instant)"
        assert "outcome: skipped" in instant.title.splitlines()


def thread(tid: int, name: str, index: int | None = None) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": name}}
    ]
    if index is not None:
        events.append(
            {"name": "thread_sort_index", "ph": "M", "pid": 1, "tid": tid,
             "args": {"sort_index": index}}
        )  # fmt: skip
    return events


def x(name: str, tid: int, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    return {"name": name, "cat": "op", "ph": "X", "ts": ts, "dur": dur, "pid": 1, "tid": tid,
            "args": args}  # fmt: skip


class TestLayout:
    def test_rows_sorted_by_sort_index_then_tid_and_exact_positions(self) -> None:
        trace = {
            "traceEvents": [
                *thread(5, "main", 5),
                *thread(7, "worker", 1),
                x("a", 7, 100.0, 400.0),
                x("b", 5, 300.0, 0.0),
                x("c", 9, 500.0, 500.0),  # a track the metadata does not name
            ]
        }
        timeline = ae.Timeline(trace, width=600)
        picture = parse(timeline.to_svg())
        assert picture.root.get("width") == "600"
        assert [r.name for r in picture.rows] == ["worker", "main", "tid 9"]
        assert [[s.name for s in r.slices] for r in picture.rows] == [["a"], ["b"], ["c"]]
        assert (timeline.start, timeline.end, timeline.span) == (100.0, 1000.0, 900.0)
        plot = picture.right - picture.left
        (a,), (b,), (c,) = (r.slices for r in picture.rows)
        assert a.x == pytest.approx(picture.left, abs=TOLERANCE)
        assert a.width == pytest.approx(plot * 400 / 900, abs=TOLERANCE)
        assert b.x == pytest.approx(picture.left + plot * 200 / 900, abs=TOLERANCE)
        assert b.width == 1.0  # zero duration: still visible
        assert c.x == pytest.approx(picture.left + plot * 400 / 900, abs=TOLERANCE)
        assert c.x + c.width == pytest.approx(picture.right, abs=TOLERANCE)
        assert b.title.splitlines()[0] == "b — 0.0 µs"
        assert c.title.splitlines()[0] == "c — 500.0 µs"
        assert a.title.splitlines()[0] == "a — 400.0 µs"

    def test_nested_slices_stack_in_sub_rows(self) -> None:
        trace = [
            *thread(1, "lane", 1),
            x("parent", 1, 0.0, 100.0),
            x("child1", 1, 10.0, 10.0),
            x("child2", 1, 30.0, 60.0),
            x("grandchild", 1, 40.0, 10.0),
            x("next", 1, 100.0, 50.0),  # touches parent's end: same sub-row
        ]
        timeline = ae.Timeline(trace)
        (track,) = timeline.tracks
        assert {s.name: s.depth for s in track.slices} == {
            "parent": 0,
            "child1": 1,
            "child2": 1,
            "grandchild": 2,
            "next": 0,
        }
        assert track.depth == 3
        assert track.busy == 150.0
        (row,) = parse(timeline.to_svg()).rows
        y = {s.name: s.y for s in row.slices}
        assert y["parent"] == y["next"] < y["child1"] == y["child2"] < y["grandchild"]
        (flat,) = parse(ae.Timeline([x("only", 1, 0.0, 1.0)]).to_svg()).rows
        assert row.height > flat.height

    def test_labels_never_overflow_their_rectangle(self) -> None:
        names = ["a_rather_long_operation_name", "mid_name", "x", "tiny", "too_long_" * 8]
        events = [
            x(name, 1, i * 1000.0, dur)
            for i, name in enumerate(names)
            for dur in (1000.0, 120.0, 40.0, 3.0)
        ]
        picture = parse(ae.Timeline(events).to_svg())
        char_w = 0.6 * picture.font_size  # a monospace advance
        drawn = picture.rows[0].slices
        assert len(drawn) == 20
        labelled = [s for s in drawn if s.label]
        assert {s.label for s in labelled} >= {"mid_name", "tiny", "x"}
        assert any(s.label is not None and s.label.endswith("…") for s in labelled)
        for s in drawn:
            if s.label is None:
                continue
            assert len(s.label) * char_w <= s.width, s
            assert s.label == s.name or (
                s.label.endswith("…") and s.name.startswith(s.label[:-1])
            ), s
        narrowest = min(drawn, key=lambda s: s.width)
        assert narrowest.label is None

    def test_many_slices_keep_the_picture_bounded(self) -> None:
        events = [x(f"op{i % 7}", 1 + i % 3, i * 10.0, float(i % 50)) for i in range(10_000)]
        timeline = ae.Timeline(events, max_slices=500)
        svg = timeline.to_svg()
        picture = parse(svg)
        assert picture.root.get("width") == "900"
        drawn = [s for r in picture.rows for s in r.slices]
        assert len(drawn) == 500
        assert min(s.width for s in drawn) >= 1.0
        assert max(s.x + s.width for s in drawn) <= 900
        # The longest are drawn; everything is still counted.
        drawn_durations = sorted(float(s.title.split(" — ")[1].split()[0]) for s in drawn)
        assert drawn_durations == sorted(e["dur"] for e in events)[-500:]
        assert timeline.slice_count == 10_000
        assert "10000 slice(s)" in str(timeline)
        summary = picture.root.find(f"{SVG}text[@class='summary']")
        assert summary is not None
        assert summary.text is not None
        assert summary.text.endswith("10000 slice(s) (500 longest drawn)")
        assert len(svg) < 500 * 1000
        assert float(picture.root.get("height", "inf")) < 200

    def test_many_instants_keep_the_picture_bounded(self) -> None:
        """A failure that skipped thousands of operations leaves an instant for each."""
        events = [
            {"name": f"skipped{i}", "ph": "i", "s": "t", "ts": 10.0 * i, "pid": 1, "tid": 1}
            for i in range(5_000)
        ]
        timeline = ae.Timeline([x("failed", 1, 0.0, 5.0), *events], max_slices=300)
        svg = timeline.to_svg()
        drawn = [s.name for r in parse(svg).rows for s in r.instants]
        assert drawn == [f"skipped{i}" for i in range(300)]  # the earliest
        summary = parse(svg).root.find(f"{SVG}text[@class='summary']")
        assert summary is not None
        assert summary.text is not None
        assert summary.text.endswith("4700 instant(s) not drawn")
        assert len(svg) < 300 * 1000

    def test_events_without_pid_or_tid_are_on_track_zero(self) -> None:
        trace = [
            {"name": "bare", "ph": "X", "ts": 0.0, "dur": 1.0},
            {"name": "zero", "ph": "X", "ts": 2.0, "dur": 1.0, "pid": 0, "tid": 0},
        ]
        (track,) = ae.Timeline(trace).tracks
        assert track.tid == 0
        assert [s.name for s in track.slices] == ["bare", "zero"]

    def test_colour_depends_on_the_name_only(self) -> None:
        events = [
            x("load", 1, 0.0, 10.0),
            x("load", 2, 5.0, 10.0),
            x("save", 1, 20.0, 10.0),
            {**x("await", 2, 30.0, 5.0), "cat": "await"},
        ]
        drawn = {
            (s.name, s.x): s for r in parse(ae.Timeline(events).to_svg()).rows for s in r.slices
        }
        loads = [s.fill for (name, _), s in drawn.items() if name == "load"]
        assert len(loads) == 2
        assert loads[0] == loads[1]
        assert all(re.fullmatch(r"#[0-9a-f]{6}", s.fill) for s in drawn.values())
        (awaiting,) = [s for (name, _), s in drawn.items() if name == "await"]
        assert awaiting.fill == "#e0e0e0"
        # The same in another process, whatever its hash seed.
        script = (
            "import aioengine as ae, sys, json; events = json.loads(sys.argv[1]); "
            "print(ae.Timeline(events).to_svg(), end='')"
        )
        env = {**os.environ, "PYTHONHASHSEED": "12345"}
        other = subprocess.run(
            [sys.executable, "-c", script, json.dumps(events)],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        ).stdout
        assert other == ae.Timeline(events).to_svg()

    def test_names_are_escaped(self) -> None:
        name = 'a<b>&"c"\x01'
        picture = parse(ae.Timeline([*thread(1, "<lane & co>"), x(name, 1, 0.0, 10.0)]).to_svg())
        (row,) = picture.rows
        assert row.name == "<lane & co>"
        assert row.slices[0].title.splitlines()[0] == 'a<b>&"c"\ufffd — 10.0 µs'

    def test_bad_arguments(self) -> None:
        with pytest.raises(TypeError, match=r"^trace has no 'traceEvents' list"):
            ae.Timeline({"events": []})
        with pytest.raises(TypeError, match=r"^trace is str, not a Chrome trace object"):
            ae.Timeline("run.json")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"^width must be >= 200, not 100$"):
            ae.Timeline([], width=100)
        with pytest.raises(ValueError, match=r"^max_slices must be >= 0, not -1$"):
            ae.Timeline([], max_slices=-1)

    def test_jupyter_displays_the_svg(self) -> None:
        formatters = pytest.importorskip("IPython.core.formatters")
        timeline = ae.Timeline([*thread(1, "lane"), x("op", 1, 0.0, 10.0)])
        data, _ = formatters.DisplayFormatter().format(timeline)
        assert data["image/svg+xml"] == timeline.to_svg()
        assert data["text/plain"] == repr(timeline)
