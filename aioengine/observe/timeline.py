"""A trace drawn as a timeline: what :meth:`TraceSession.timeline` returns.

:meth:`Engine.trace` records a Chrome trace-event object for Perfetto; a notebook wants to see
it without leaving the page. :class:`Timeline` reads such an object (any producer's, not only
the engine's) and draws a compact Gantt chart as self-contained SVG, with no plotting library:

* **one row per track**: a track is a ``(pid, tid)`` pair, labelled with its ``thread_name``
  metadata and ordered by ``thread_sort_index`` (then by tid), as Perfetto orders them. For the
  engine that is one row per worker thread and one per ``coroutine ops #k`` /
  ``callback ops #k`` lane (see ``trace.py``);
* **one rectangle per complete event** (``ph: "X"``), placed by ``ts`` and ``dur`` on a time
  axis that starts at the earliest event. Slices that nest (a coroutine operation and its
  ``run`` / ``await`` steps) are stacked in sub-rows, outermost on top;
* **one small triangle per instant event** (``ph: "i"``): operations that never ran;
* **a tooltip** (an SVG ``<title>``) on every slice: its name, duration and ``args`` (``seq``,
  ``const_vars``, ``mutate_vars``, ``outcome``...). Flow arrows are not drawn.

Colours: a slice is filled by its name, from a fixed palette indexed by the name's CRC-32, so
an operation has the same colour in every row, every timeline and every process; ``await``
slices (a suspended coroutine) are grey; a failed operation has a red outline.

Bounds: the SVG is ``width`` pixels wide (900 by default) whatever the trace's length; its
height grows with the number of tracks and nesting levels only. Labels use a monospace font
and are cut (with ``…``) to what fits inside their rectangle, or left out. At most
``max_slices`` rectangles are drawn (the longest; the header says how many were left out),
and at most as many instant marks (the earliest), so a trace of a million tiny slices, or of
a failure that skipped a million operations, still gives a displayable image.

Plain data: a :class:`Timeline` is computed once from the trace and never refers back to the
engine, so it can be built, drawn and printed from any thread.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

__all__ = ("Slice", "Timeline", "Track")

# Light fills that dark text reads on: ColorBrewer Set3 without its grey (kept for ``await``)
# and with Paired's light blue in place of its red (which would read as a failure).
_PALETTE = (
    "#8dd3c7",
    "#ffffb3",
    "#bebada",
    "#a6cee3",
    "#80b1d3",
    "#fdb462",
    "#b3de69",
    "#fccde5",
    "#bc80bd",
    "#ccebc5",
    "#ffed6f",
)
_AWAIT_FILL = "#e0e0e0"
_FAILED_STROKE = "#c62828"

_FONT = "ui-monospace, SFMono-Regular, Menlo, Consolas, 'DejaVu Sans Mono', monospace"
_FONT_SIZE = 10  # px, every text in the picture
_CHAR_W = 0.62 * _FONT_SIZE  # a monospace advance is 0.6em (0.55 to 0.61 in common fonts)
_TEXT_PAD = 3.0  # px between a rectangle's edge and its label
_PAD = 8.0  # outer margin
_HEADER_H = 20.0  # the summary line
_AXIS_H = 18.0  # tick labels
_LANE_H = 16.0  # one nesting level of a row
_ROW_PAD = 2.0  # above and below the lanes of a row
_MIN_W = 1.0  # px: a zero-duration slice is still drawn
_LABEL_MAX_FRACTION = 0.3  # of the width, for the track labels' column
_EPS = 1e-6  # µs: slices that merely touch share a sub-row

# Characters that XML 1.0 forbids, which a trace's names could still contain.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")  # + lone surrogates


@dataclass(frozen=True, slots=True)
class Slice:
    """One complete event (or instant event) of a :class:`Track`.

    Attributes:
        name: the event's name (the operation's name for the engine's slices).
        cat: its category (``op``, ``run``, ``await`` in the engine's traces).
        ts: its start, in microseconds on the trace's clock.
        dur: its duration in microseconds (0 for an instant event).
        depth: its sub-row in the track: its nesting level (0 for an outermost slice).
        args: the event's ``args``.
    """

    name: str
    cat: str
    ts: float
    dur: float
    depth: int
    args: Mapping[str, Any]

    @property
    def end(self) -> float:
        """``ts + dur``."""
        return self.ts + self.dur


@dataclass(frozen=True, slots=True)
class Track:
    """One row of a :class:`Timeline`: a thread, or a lane of coroutine or callback operations.

    Attributes:
        name: its ``thread_name`` (``tid <n>`` where the trace names none).
        pid: the process id of the events.
        tid: the thread id of the events.
        sort_index: its ``thread_sort_index`` (None where the trace gives none).
        slices: its complete events, by start time (outer before inner at equal starts).
        instants: its instant events, by time.
    """

    name: str
    pid: int
    tid: int
    sort_index: int | None
    slices: tuple[Slice, ...]
    instants: tuple[Slice, ...]

    @property
    def depth(self) -> int:
        """How many nesting levels its slices use (at least 1, so an empty row still shows)."""
        return max((s.depth for s in self.slices), default=0) + 1

    @property
    def busy(self) -> float:
        """Microseconds covered by its outermost slices."""
        return sum(s.dur for s in self.slices if s.depth == 0)


class Timeline:
    """A trace as a Gantt chart: one row per track, one rectangle per slice.

    Build one from any Chrome trace-event object, such as :attr:`TraceSession.trace`, the value
    :meth:`Engine.stop_trace` returns, or ``json.load()`` of a trace file; or call
    :meth:`TraceSession.timeline`. In Jupyter it displays itself as SVG; ``str()`` gives a
    text summary. Layout, colours and bounds are described in the module notes.

    Args:
        trace: the trace: a dict with a ``traceEvents`` list (the JSON Object Format), or the
            list of events itself (the JSON Array Format).
        width: the SVG's width in pixels.
        max_slices: the most rectangles drawn; beyond it the shortest slices are left out of
            the picture (not of the summary). As many instant marks at most are drawn, the
            earliest.

    Attributes:
        width: the SVG's width in pixels.
        max_slices: the most rectangles drawn (and the most instant marks).
        tracks: the rows, top to bottom.
        start: the earliest event's time, in microseconds on the trace's clock (0 if none).
        end: the latest end of an event (``start`` if none).

    Raises:
        TypeError: if ``trace`` is neither a trace object nor a list of events.
        ValueError: if ``width`` is below 200 or ``max_slices`` below 0.
    """

    def __init__(
        self,
        trace: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        width: int = 900,
        max_slices: int = 2000,
    ) -> None:
        if isinstance(trace, Mapping):
            events = trace.get("traceEvents")
            if not isinstance(events, list):
                raise TypeError(
                    f"trace has no 'traceEvents' list (keys: {list(trace)!r}); pass the "
                    "object that engine.trace() records, or its 'traceEvents'"
                )
        elif isinstance(trace, (list, tuple)):
            events = list(trace)
        else:
            raise TypeError(
                f"trace is {type(trace).__name__}, not a Chrome trace object (a dict with "
                "'traceEvents') or a list of trace events"
            )
        if width < 200:
            raise ValueError(f"width must be >= 200, not {width!r}")
        if max_slices < 0:
            raise ValueError(f"max_slices must be >= 0, not {max_slices!r}")
        self.width: int = width
        self.max_slices: int = max_slices
        self.tracks: tuple[Track, ...] = _build_tracks(events)
        times = [
            t
            for track in self.tracks
            for s in (*track.slices, *track.instants)
            for t in (s.ts, s.end)
        ]
        self.start: float = min(times, default=0.0)
        self.end: float = max(times, default=self.start)

    @property
    def span(self) -> float:
        """Microseconds from the earliest event to the latest end."""
        return self.end - self.start

    @property
    def slice_count(self) -> int:
        """How many complete events the trace holds, over all tracks."""
        return sum(len(t.slices) for t in self.tracks)

    def to_svg(self) -> str:
        """The chart as a standalone SVG document (text), ``width`` pixels wide.

        The root element carries ``class="aioengine-timeline"``, each row is a
        ``<g class="track">`` and each slice a ``<g class="slice">`` holding its ``<title>``
        (the tooltip), its ``<rect>`` and, where it fits, its ``<text>`` label.
        """
        return _Drawing(self).svg()

    def _repr_svg_(self) -> str:
        return self.to_svg()

    def __str__(self) -> str:
        if not self.slice_count and not any(t.instants for t in self.tracks):
            return "aioengine timeline: no slices"
        lines = [
            f"aioengine timeline: {_duration(self.span)}, {len(self.tracks)} track(s), "
            f"{self.slice_count} slice(s)"
        ]
        name_w = max(len(t.name) for t in self.tracks)
        for t in self.tracks:
            line = f"  {t.name:<{name_w}}  {len(t.slices)} slice(s)"
            if t.slices:
                share = f" ({t.busy / self.span:.0%})" if self.span > 0 else ""
                line += f", busy {_duration(t.busy)}{share}"
            if t.instants:
                line += f", {len(t.instants)} instant(s)"
            lines.append(line)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (
            f"<aioengine.Timeline tracks={len(self.tracks)} slices={self.slice_count} "
            f"span={_duration(self.span)}>"
        )


def _build_tracks(events: Sequence[Any]) -> tuple[Track, ...]:
    """Group the events by ``(pid, tid)``, nest each group's slices, and order the groups."""
    names: dict[tuple[int, int], str] = {}
    sort_index: dict[tuple[int, int], int] = {}
    processes: dict[int, str] = {}
    complete: dict[tuple[int, int], list[Mapping[str, Any]]] = {}
    instant: dict[tuple[int, int], list[Mapping[str, Any]]] = {}
    for e in events:
        if not isinstance(e, Mapping):
            continue
        ph, pid, tid = e.get("ph"), _int(e.get("pid")), _int(e.get("tid"))
        args = e.get("args")
        args = args if isinstance(args, Mapping) else {}
        if ph == "M":
            if e.get("name") == "thread_name":
                names[pid, tid] = str(args.get("name", ""))
            elif e.get("name") == "thread_sort_index" and isinstance(args.get("sort_index"), int):
                sort_index[pid, tid] = args["sort_index"]
            elif e.get("name") == "process_name":
                processes[pid] = str(args.get("name", ""))
        elif ph == "X" and isinstance(e.get("ts"), (int, float)):
            complete.setdefault((pid, tid), []).append(e)
        elif ph in ("i", "I") and isinstance(e.get("ts"), (int, float)):
            instant.setdefault((pid, tid), []).append(e)
    keys = sorted(
        {*names, *complete, *instant},
        key=lambda k: (k[0], sort_index.get(k, math.inf), k[1]),
    )
    several_processes = len({pid for pid, _ in keys}) > 1
    tracks = []
    for key in keys:
        pid, tid = key
        name = names.get(key) or f"tid {tid}"
        if several_processes:
            name = f"{processes.get(pid) or f'pid {pid}'}: {name}"
        tracks.append(
            Track(
                name=name,
                pid=pid,
                tid=tid,
                sort_index=sort_index.get(key),
                slices=_nest(complete.get(key, [])),
                instants=tuple(
                    _slice(e, float(e["ts"]), 0.0, 0)
                    for e in sorted(instant.get(key, []), key=lambda e: float(e["ts"]))
                ),
            )
        )
    return tuple(tracks)


def _int(value: object) -> int:
    """A pid or tid as an int (producers may write strings; a missing one is 0)."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    try:
        return int(str(value))
    except ValueError:
        return zlib.crc32(str(value).encode())


def _nest(events: list[Mapping[str, Any]]) -> tuple[Slice, ...]:
    """The slices of one track, each in the first sub-row that is free when it starts.

    For properly nested slices (the engine's) that sub-row is the nesting depth: the rows above
    hold the enclosing slices, and whatever was below them has ended. Slices that overlap
    without nesting (other producers) still never share a sub-row.
    """
    spans = sorted(
        ((float(e["ts"]), max(float(e.get("dur", 0.0) or 0.0), 0.0), e) for e in events),
        key=lambda t: (t[0], -t[1]),
    )
    row_ends: list[float] = []  # per sub-row: when its last slice ends
    result = []
    for ts, dur, e in spans:
        depth = next((i for i, end in enumerate(row_ends) if end <= ts + _EPS), len(row_ends))
        if depth == len(row_ends):
            row_ends.append(ts + dur)
        else:
            row_ends[depth] = ts + dur
        result.append(_slice(e, ts, dur, depth))
    return tuple(result)


def _slice(e: Mapping[str, Any], ts: float, dur: float, depth: int) -> Slice:
    args = e.get("args")
    return Slice(
        name=str(e.get("name", "")),
        cat=str(e.get("cat", "")),
        ts=ts,
        dur=dur,
        depth=depth,
        args=args if isinstance(args, Mapping) else {},
    )


class _Drawing:
    """Lays a :class:`Timeline` out and writes the SVG (one use, then dropped)."""

    def __init__(self, timeline: Timeline) -> None:
        self.t = timeline
        self.width = float(timeline.width)
        longest = max((len(t.name) for t in timeline.tracks), default=0)
        self.label_w = min(
            max(longest * _CHAR_W + 2 * _PAD, 60.0), self.width * _LABEL_MAX_FRACTION
        )
        self.left = self.label_w  # the time axis runs from left to right
        self.right = self.width - _PAD
        span = timeline.span
        self.scale = (self.right - self.left) / span if span > 0 else 0.0
        drawn = [s for t in timeline.tracks for s in t.slices]
        self.omitted = max(len(drawn) - timeline.max_slices, 0)
        if self.omitted:
            drawn.sort(key=lambda s: (-s.dur, s.ts))
            keep = {id(s) for s in drawn[: timeline.max_slices]}
            self.keep: Callable[[Slice], bool] = lambda s: id(s) in keep
        else:
            self.keep = lambda s: True
        instants = [s for t in timeline.tracks for s in t.instants]
        self.instants_omitted = max(len(instants) - timeline.max_slices, 0)
        if self.instants_omitted:
            instants.sort(key=lambda s: s.ts)
            shown = {id(s) for s in instants[: timeline.max_slices]}
            self.keep_instant: Callable[[Slice], bool] = lambda s: id(s) in shown
        else:
            self.keep_instant = lambda s: True

    def x(self, ts: float) -> float:
        return self.left + (ts - self.t.start) * self.scale

    def svg(self) -> str:
        top = _HEADER_H + _AXIS_H
        rows: list[str] = []
        y = top
        for index, track in enumerate(self.t.tracks):
            rows.append(self.track(track, index, y))
            y += track.depth * _LANE_H + 2 * _ROW_PAD
        height = y + _PAD
        parts = [
            f'<svg xmlns="http://www.w3.org/2000/svg" class="aioengine-timeline" '
            f'width="{self.width:.0f}" height="{height:.0f}" '
            f'viewBox="0 0 {self.width:.0f} {height:.0f}" '
            f'font-family="{_FONT}" font-size="{_FONT_SIZE}">',
            f'<rect class="background" width="{self.width:.0f}" height="{height:.0f}" '
            'fill="#ffffff"/>',
            f'<text class="summary" x="{_PAD:.0f}" y="14" fill="#222222">'
            f"{_text(self.summary())}</text>",
            self.axis(top, height - _PAD),
            *rows,
            "</svg>",
        ]
        return "\n".join(parts) + "\n"

    def summary(self) -> str:
        t = self.t
        if not t.slice_count and not any(track.instants for track in t.tracks):
            return "aioengine timeline: no slices"
        text = (
            f"aioengine timeline · {_duration(t.span)} · {len(t.tracks)} track(s) · "
            f"{t.slice_count} slice(s)"
        )
        if self.omitted:
            text += f" ({t.max_slices} longest drawn)"
        if self.instants_omitted:
            text += f" · {self.instants_omitted} instant(s) not drawn"
        return _fit(text, self.width - 2 * _PAD)

    def axis(self, top: float, bottom: float) -> str:
        """The axis line, ticks with labels, and faint grid lines down through the rows."""
        y = top - 4
        parts = [
            '<g class="axis" stroke="#999999" stroke-width="1">',
            f'<line class="axis-line" x1="{self.left:.2f}" y1="{y:.2f}" '
            f'x2="{self.right:.2f}" y2="{y:.2f}"/>',
        ]
        span = self.t.span
        if span > 0:
            step = _nice_step(span / 8)
            unit, suffix = (
                (1e6, "s") if step >= 1e6 else (1e3, "ms") if step >= 1e3 else (1.0, "µs")
            )
            k = 0
            while k * step <= span * (1 + 1e-9):
                x = self.x(self.t.start + k * step)
                label = f"{round(k * step / unit, 6):g} {suffix}" if k else "0"
                half = len(label) * _CHAR_W / 2
                parts.append(
                    f'<line x1="{x:.2f}" y1="{y - 3:.2f}" x2="{x:.2f}" y2="{bottom:.2f}" '
                    'stroke="#eeeeee"/>'
                )
                if x + half <= self.width:
                    parts.append(
                        f'<text class="tick" x="{x:.2f}" y="{y - 5:.2f}" text-anchor="middle" '
                        f'stroke="none" fill="#666666">{label}</text>'
                    )
                k += 1
        parts.append("</g>")
        return "\n".join(parts)

    def track(self, track: Track, index: int, y: float) -> str:
        height = track.depth * _LANE_H + 2 * _ROW_PAD
        fill = "#f7f7f7" if index % 2 else "#ffffff"
        label = _fit(track.name, self.label_w - 2 * _PAD)
        parts = [
            f'<g class="track" data-tid="{track.tid}">',
            f'<rect class="row" x="0" y="{y:.2f}" width="{self.width:.0f}" '
            f'height="{height:.2f}" fill="{fill}"/>',
            f'<text class="track-label" x="{_PAD:.0f}" y="{y + _ROW_PAD + _LANE_H - 4:.2f}" '
            f'fill="#222222"><title>{_text(track.name)}</title>{_text(label)}</text>',
        ]
        for s in sorted(track.slices, key=lambda s: (s.depth, s.ts)):
            if self.keep(s):
                parts.append(self.slice(s, y + _ROW_PAD + s.depth * _LANE_H))
        for s in track.instants:
            if self.keep_instant(s):
                parts.append(self.instant(s, y + _ROW_PAD))
        parts.append("</g>")
        return "\n".join(parts)

    def slice(self, s: Slice, y: float) -> str:
        x = self.x(s.ts)
        w = max(s.dur * self.scale, _MIN_W)
        h = _LANE_H - 2
        failed = s.args.get("outcome") == "failed" or "error" in s.args
        stroke = (
            f'stroke="{_FAILED_STROKE}" stroke-width="1.5"'
            if failed
            else 'stroke="#555555" stroke-width="0.5"'
        )
        parts = [
            '<g class="slice">',
            f"<title>{_text(_tooltip(s))}</title>",
            f'<rect x="{x:.2f}" y="{y + 1:.2f}" width="{w:.2f}" height="{h:.2f}" '
            f'fill="{_fill(s)}" {stroke}/>',
        ]
        label = _fit(s.name, w - 2 * _TEXT_PAD, minimum=min(len(s.name), 3))
        if label:
            parts.append(
                f'<text class="label" x="{x + _TEXT_PAD:.2f}" y="{y + h - 3:.2f}" '
                f'fill="#222222">{_text(label)}</text>'
            )
        parts.append("</g>")
        return "".join(parts)

    def instant(self, s: Slice, y: float) -> str:
        x = self.x(s.ts)
        return (
            f'<g class="instant"><title>{_text(_tooltip(s, instant=True))}</title>'
            f'<path d="M{x - 4:.2f},{y + 1:.2f} L{x + 4:.2f},{y + 1:.2f} L{x:.2f},{y + 9:.2f} Z" '
            f'fill="{_fill(s)}" stroke="#555555" stroke-width="0.5"/></g>'
        )


def _fill(s: Slice) -> str:
    if s.cat == "await":
        return _AWAIT_FILL
    return _PALETTE[zlib.crc32(s.name.encode("utf-8", "surrogatepass")) % len(_PALETTE)]


def _tooltip(s: Slice, *, instant: bool = False) -> str:
    """``name — duration`` (or ``name (instant)``), then a ``key: value`` line per arg."""
    lines = [f"{s.name} (instant)" if instant else f"{s.name} — {_duration(s.dur)}"]
    for key, value in s.args.items():
        if key == "name":
            continue
        if isinstance(value, (list, tuple)):
            value = ", ".join(map(str, value)) or "-"
        lines.append(f"{key}: {value}")
    return "\n".join(lines)


def _duration(us: float) -> str:
    """``12.3 µs``, ``4.56 ms`` or ``7.89 s``."""
    if us < 1e3:
        return f"{us:.1f} µs"
    if us < 1e6:
        return f"{us / 1e3:.2f} ms"
    return f"{us / 1e6:.2f} s"


def _nice_step(raw: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten that is at least ``raw``."""
    power = 10.0 ** math.floor(math.log10(raw))
    for factor in (1.0, 2.0, 5.0, 10.0):
        if factor * power >= raw * (1 - 1e-9):
            return factor * power
    return 10.0 * power  # pragma: no cover - the loop always returns


def _fit(text: str, room: float, minimum: int = 1) -> str:
    """``text``, cut with ``…`` to fit ``room`` pixels; empty if not even ``minimum`` chars fit."""
    chars = int(room // _CHAR_W)
    if chars >= len(text):
        return text
    if chars < max(minimum, 2):
        return ""
    return text[: chars - 1] + "…"


def _text(text: str) -> str:
    """``text`` escaped for XML content and attributes."""
    return escape(_NOT_XML.sub("\ufffd", text), quote=True)
