"""The notebooks in docs/notebooks run top to bottom in a real kernel, with the outputs shown."""

from __future__ import annotations

import pathlib
import xml.etree.ElementTree as ET
from typing import Any

import pytest

from .conftest import execute_notebook

nbformat = pytest.importorskip("nbformat")

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "docs" / "notebooks"
SVG = "{http://www.w3.org/2000/svg}"

EXPECTED = {
    "engine_basics.ipynb": [
        "norm: 4.0",
        "uploaded: [-8.0, -8.0, -8.0, -8.0, -8.0]",
        "aioengine graph: 10 operation(s), 9 edge(s)",
        "#5 norm [done, cpu0]  after #4 sgd_step (weights)",
        "sgd_step slices: 3",
        "weights: [-3.5 -3.5 -3.5 -3.5]",
    ],
    "arrays.ipynb": [
        "Array(shape=(400, 400), dtype=float64, pending: matmul)",
        "ready: False",
        "value: (400, 400) float64 read-only",
        "float() of a pending array on the loop thread: PendingArrayError",
        "sin² + cos² summed over a 400x400 matrix: 160000",
        "raised: not finite | in aioengine.array operation apply(check)",
        "dependent: DependencyError caused by ValueError('not finite')",
        "closed",
    ],
    "failures.ipynb": [
        "op raised: bad value 1",
        "skipped: DependencyError caused by ValueError('bad value 1')",
        "wait_for_var raised: bad value 1",
        "value still 1",
        "cancelled: True",
        "first: 1 | queued cancelled: True",
    ],
}


def _text(notebook: object) -> str:
    """Each cell's printed text as a reader sees it, its stdout, then its stderr, each joined
    in order (the kernel may send one print() in several stream messages, with another
    stream's between them: a progress bar's on stderr), then its results' text."""
    out = []
    for cell in notebook.cells:  # type: ignore[attr-defined]
        outputs = cell.get("outputs", [])
        for stream in ("stdout", "stderr"):
            out.append(
                "".join(
                    o.get("text", "")
                    for o in outputs
                    if o.get("output_type") == "stream" and o.get("name") == stream
                )
            )
        out += [o["data"].get("text/plain", "") for o in outputs if "data" in o]
    return "\n".join(out)


def test_every_notebook_is_checked() -> None:
    assert {p.name for p in NOTEBOOKS.glob("*.ipynb")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_notebook_runs(name: str, tmp_path: pathlib.Path) -> None:
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    assert execute_notebook(notebook, tmp_path) == []
    text = _text(notebook)
    for expected in EXPECTED[name]:
        assert expected in text, f"{expected!r} not in the outputs of {name}:\n{text}"
    if name == "arrays.ipynb":
        # The trace is drawn inline: the 400x400 matrix has two chunks of the default 1 MiB,
        # and each chunk's sin, cos, squares and partial sums are one kernel (a bar named
        # after its first operation); the two sums' operations combine the partials.
        titles = _slice_titles(_timelines(notebook))
        assert sum(t.startswith("sin — ") for t in titles) == 2, titles
        assert sum(t.startswith("sum — ") for t in titles) == 2, titles
    if name == "engine_basics.ipynb":
        results = [
            o["data"]
            for c in notebook.cells
            for o in c.get("outputs", [])
            if o.get("output_type") == "execute_result"
        ]
        svgs = [_svg(d) for d in results if "image/svg+xml" in d]
        timelines = [root for root in svgs if root.get("class") == "aioengine-timeline"]
        # The graph is drawn inline: an SVG (with Graphviz's dot) or a Mermaid diagram.
        graphs = [root for root in svgs if root.get("class") != "aioengine-timeline"] + [
            d for d in results if "```mermaid" in d.get("text/markdown", "")
        ]
        assert len(graphs) == 1, [c.get("outputs") for c in notebook.cells]
        # So is the trace: a timeline with a row per thread and a bar per sgd_step.
        assert len(timelines) == 1, [c.get("outputs") for c in notebook.cells]
        titles = [
            title.text or ""
            for g in timelines[0].iter(f"{SVG}g")
            if g.get("class") == "slice"
            for title in g.iter(f"{SVG}title")
        ]
        assert sum(t.startswith("sgd_step — ") for t in titles) == 3, titles
        rows = [g for g in timelines[0].iter(f"{SVG}g") if g.get("class") == "track"]
        assert 1 <= len(rows) <= 2  # the three updates ran on one or two worker threads


def _timelines(notebook: Any) -> list[ET.Element]:
    """The timelines (``session.timeline()``) among the notebook's results."""
    svgs = [
        _svg(o["data"])
        for c in notebook.cells
        for o in c.get("outputs", [])
        if o.get("output_type") == "execute_result" and "image/svg+xml" in o["data"]
    ]
    timelines = [root for root in svgs if root.get("class") == "aioengine-timeline"]
    assert len(timelines) == 1, [c.get("outputs") for c in notebook.cells]
    return timelines


def _slice_titles(timelines: list[ET.Element]) -> list[str]:
    return [
        title.text or ""
        for g in timelines[0].iter(f"{SVG}g")
        if g.get("class") == "slice"
        for title in g.iter(f"{SVG}title")
    ]


def _svg(data: dict[str, Any]) -> ET.Element:
    svg = data["image/svg+xml"]
    return ET.fromstring(svg if isinstance(svg, str) else "".join(svg))
