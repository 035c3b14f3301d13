"""The dependency graph of recent and pending operations (:meth:`Engine.graph`).

Nodes are operations with their state; an edge ``a -> b`` labelled ``x`` says that ``b``
waited for ``a`` because of Var ``x``: ``b`` reads ``x`` after ``a`` wrote it, or ``b`` writes
``x`` after ``a`` read or wrote it (a writer depends on the previous writer and on every reader
since, as in MXNet).

What is covered: every pending operation, always (their edges are computed from push order on
their Vars); and, while a recorder is installed (:meth:`Engine.record_history` or
``Engine(watchdog=...)``), the newest finished operations pushed since it was installed, with
the dependencies recorded at push time. Without a recorder, finished operations are gone and
the graph shows the pending ones only.

Rendering: :meth:`Graph.to_dot` (Graphviz), :meth:`Graph.to_mermaid`, ``str()`` (text).
Notebooks show an SVG where the ``graphviz`` package and its ``dot`` program are installed
(``pip install 'aioengine[graph]'``), Mermaid otherwise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..kinds import OpState
from .history import DepTracker, Recorder, kind_name, pool_name

if TYPE_CHECKING:
    from . import Observed

__all__ = ("Edge", "Graph", "Node", "build_graph")

_FILL = {
    OpState.PENDING: "#eeeeee",
    OpState.READY: "#fff59d",
    OpState.RUNNING: "#90caf9",
    OpState.DONE: "#c8e6c9",
    OpState.FAILED: "#ef9a9a",
    OpState.SKIPPED: "#ffcc80",
    OpState.CANCELLED: "#cfd8dc",
}


@dataclass(frozen=True, slots=True)
class Node:
    """One operation in a :class:`Graph`.

    Attributes:
        seq: its push sequence number (unique per engine, increasing in push order).
        name: its name.
        state: its state when the graph was taken.
        kind: ``sync``, ``coroutine`` or ``callback``.
        pool: where it runs (``cpu0``, ``cpu-priority``, ``loop``).
        accesses: ``(var name, mode)`` for each of its Vars, the mode being ``"read"``,
            ``"write"``, ``"commute"`` or ``"concurrent"``.
    """

    seq: int
    name: str
    state: OpState
    kind: str
    pool: str
    accesses: tuple[tuple[str, str], ...] = ()

    @property
    def modes_line(self) -> str:
        """Its commute and concurrent Vars (``"commute: acc"``), as the renderings show
        them; empty for an operation of reads and writes only."""
        parts = []
        for mode in ("commute", "concurrent"):
            named = [var for var, m in self.accesses if m == mode]
            if named:
                parts.append(f"{mode}: {', '.join(named)}")
        return " · ".join(parts)

    @property
    def label(self) -> str:
        """``#seq name``, as the renderings show it."""
        return f"#{self.seq} {self.name}"


@dataclass(frozen=True, slots=True)
class Edge:
    """``dst`` waited for ``src`` because of Var ``var``."""

    src: int
    dst: int
    var: str


@dataclass(frozen=True, slots=True)
class Graph:
    """A snapshot of the dependency graph; see the module notes for what it covers.

    Attributes:
        nodes: operations in push order.
        edges: dependencies, sorted by ``(dst, src, var)``.
        note: why there is nothing to draw, when there is nothing (for example "no operations
            pending and no history recorded; call engine.record_history() to see finished
            operations"); every rendering shows it. Empty when the graph has nodes.
    """

    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
    note: str = ""

    def node(self, seq: int) -> Node:
        """The node of the operation pushed as number ``seq`` (KeyError if absent)."""
        for n in self.nodes:
            if n.seq == seq:
                return n
        raise KeyError(seq)

    def named_edges(self) -> set[tuple[str, str, str]]:
        """The edges as ``(src name, dst name, var name)`` triples (handy in tests)."""
        names = {n.seq: n.name for n in self.nodes}
        return {(names[e.src], names[e.dst], e.var) for e in self.edges}

    def to_dot(self) -> str:
        """Graphviz DOT source: boxes coloured by state, edges labelled with the Var."""
        lines = [
            "digraph aioengine {",
            "  rankdir=LR;",
            '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=11];',
            '  edge [fontname="Helvetica", fontsize=10];',
        ]
        for n in self.nodes:
            extra = f"\n{n.modes_line}" if n.modes_line else ""
            label = _dot_escape(f"{n.label}\n{n.state.name.lower()} · {n.pool}{extra}")
            lines.append(f'  op{n.seq} [label="{label}", fillcolor="{_FILL[n.state]}"];')
        for e in self.edges:
            lines.append(f'  op{e.src} -> op{e.dst} [label="{_dot_escape(e.var)}"];')
        if self.note:
            lines.append(f'  empty [shape=plaintext, style="", label="{_dot_escape(self.note)}"];')
        lines.append("}")
        return "\n".join(lines) + "\n"

    def to_mermaid(self) -> str:
        """Mermaid ``flowchart`` source (GitHub, GitLab and Jupyter render it)."""
        lines = ["flowchart LR"]
        for n in self.nodes:
            label = _mermaid_escape(n.label)
            text = n.state.name.lower()
            if n.modes_line:
                text += f"<br/>{_mermaid_escape(n.modes_line)}"
            lines.append(f'  op{n.seq}["{label}<br/>{text}"]:::{n.state.name}')
        for e in self.edges:
            lines.append(f'  op{e.src} -->|"{_mermaid_escape(e.var)}"| op{e.dst}')
        if self.note:
            lines.append(f'  empty["{_mermaid_escape(self.note)}"]')
        for state, fill in _FILL.items():
            lines.append(f"  classDef {state.name} fill:{fill},stroke:#555")
        return "\n".join(lines) + "\n"

    def to_svg(self) -> str | None:
        """The graph rendered to SVG by Graphviz, or None without ``graphviz`` and ``dot``."""
        try:
            import graphviz
        except ImportError:
            return None
        try:
            svg: bytes = graphviz.Source(self.to_dot()).pipe(format="svg")
        except (graphviz.ExecutableNotFound, graphviz.CalledProcessError):
            return None
        return svg.decode()

    def _repr_svg_(self) -> str | None:
        return self.to_svg()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        bundle = {"text/plain": str(self)}
        svg = self.to_svg()
        if svg is not None:
            bundle["image/svg+xml"] = svg
        else:
            bundle["text/markdown"] = f"```mermaid\n{self.to_mermaid()}```\n"
        return bundle

    def __str__(self) -> str:
        if not self.nodes:
            return f"aioengine graph: {self.note or 'no operations'}"
        waits: dict[int, list[str]] = {}
        names = {n.seq: n.label for n in self.nodes}
        for e in self.edges:
            waits.setdefault(e.dst, []).append(f"{names[e.src]} ({e.var})")
        lines = [f"aioengine graph: {len(self.nodes)} operation(s), {len(self.edges)} edge(s)"]
        for n in self.nodes:
            after = waits.get(n.seq)
            suffix = f"  after {', '.join(after)}" if after else ""
            lines.append(f"  {n.label} [{n.state.name.lower()}, {n.pool}]{suffix}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        note = f" note={self.note!r}" if self.note else ""
        return f"<aioengine.Graph nodes={len(self.nodes)} edges={len(self.edges)}{note}>"


# What neither format can carry (control characters, lone surrogates as os.fsdecode makes of
# undecodable file names): replaced by U+FFFD, as in timeline.py's SVG.
_UNPRINTABLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _dot_escape(text: str) -> str:
    text = _UNPRINTABLE.sub("\ufffd", text)
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _mermaid_escape(text: str) -> str:
    # A line break would end the node's statement: it becomes a space.
    text = " ".join(_UNPRINTABLE.sub("\ufffd", text).splitlines())
    return text.replace('"', "#quot;").replace("<", "#lt;").replace(">", "#gt;")


def build_graph(engine: Observed) -> Graph:
    """Snapshot ``engine``'s recorded history and pending operations as a :class:`Graph`."""
    nodes: dict[int, Node] = {}
    edges: set[Edge] = set()
    core = engine._core  # read only (scheduler.py: the read-only API for observers)
    with core.lock:
        recorder = Recorder.of(engine)
        records = list(recorder.history) if recorder is not None else []
        live = [(op, op._state) for op in core.live.values()]
        recorded_live = dict(recorder.live) if recorder is not None else {}
    for r in records:
        accesses = tuple(zip((*r.const, *r.mutate), r.modes, strict=True))
        nodes[r.seq] = Node(r.seq, r.name, r.state, r.kind, r.pool, accesses)
    # Pending operations: their dependencies among each other, from push order on their Vars
    # (exact: a finished operation between two pending ones cannot be one they wait for).
    tracker = DepTracker()
    for op, state in live:
        nodes[op.seq] = Node(
            op.seq,
            op.name,
            state,
            kind_name(op.kind),
            pool_name(op.target),
            tuple((v.name, mode) for v, mode in op.accesses()),
        )
        for src, var in tracker.push(op):
            edges.add(Edge(src, op.seq, var))
    for r in (*records, *recorded_live.values()):
        for src, var in r.deps:
            if src in nodes:
                edges.add(Edge(src, r.seq, var))
    note = ""
    if not nodes:  # say why, and how to see more, instead of drawing an empty digraph
        note = _NO_HISTORY if recorder is None else _NOTHING_RECORDED
    return Graph(
        tuple(nodes[s] for s in sorted(nodes)),
        tuple(sorted(edges, key=lambda e: (e.dst, e.src, e.var))),
        note,
    )


_NO_HISTORY = (
    "no operations pending and no history recorded; "
    "call engine.record_history() to see finished operations"
)
_NOTHING_RECORDED = "no operations pending, and none finished since history recording started"
