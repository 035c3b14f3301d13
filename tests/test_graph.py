"""The dependency graph: the edges of a known program, before and after it runs; renderings."""

from __future__ import annotations

import asyncio
import sys
import threading

import pytest

import aioengine as ae
from aioengine.observe.history import Recorder

# open writes x; read and fetch read x; combine reads y, writes x; later writes y.
EXPECTED = {
    ("open", "read", "x"),
    ("open", "fetch", "x"),
    ("open", "combine", "x"),
    ("read", "combine", "x"),
    ("fetch", "combine", "x"),
    ("fetch", "combine", "y"),
    ("fetch", "later", "y"),
    ("combine", "later", "y"),
}


def push_program(engine: ae.Engine, gate: asyncio.Event) -> None:
    x, y = engine.new_var("x"), engine.new_var("y")

    async def opener(rctx: ae.RunContext) -> None:
        await gate.wait()

    async def fetch(rctx: ae.RunContext) -> None:
        pass

    engine.push_async(opener, mutate_vars=[x], name="open")
    engine.push_sync(lambda r: None, const_vars=[x], name="read")
    engine.push_async(fetch, const_vars=[x], mutate_vars=[y], name="fetch")
    engine.push_sync(lambda r: None, const_vars=[y], mutate_vars=[x], name="combine")
    engine.push_sync(lambda r: None, mutate_vars=[y], name="later")


class TestGraph:
    async def test_pending_graph_without_recorder(self, engine: ae.Engine) -> None:
        gate = asyncio.Event()
        push_program(engine, gate)
        await asyncio.sleep(0)
        graph = engine.graph()
        assert graph.named_edges() == EXPECTED
        states = {n.name: n.state for n in graph.nodes}
        assert states["open"] is ae.OpState.RUNNING
        assert states["later"] is ae.OpState.PENDING
        gate.set()
        await engine.wait_for_all()
        assert engine.graph().nodes == ()  # nothing recorded: finished operations are gone

    async def test_an_empty_graph_says_why_and_how_to_record(self, engine: ae.Engine) -> None:
        """Nothing pending and no history: every rendering says so, instead of an empty
        digraph, and names the call that records finished operations."""
        await engine.push_sync(lambda r: None, name="gone")
        graph = engine.graph()
        assert (graph.nodes, graph.edges) == ((), ())
        assert graph.note.startswith("no operations pending and no history recorded")
        hint = "call engine.record_history() to see finished operations"
        renderings = {
            "str": str(graph),
            "repr": repr(graph),
            "dot": graph.to_dot(),
            "mermaid": graph.to_mermaid(),
            "notebook": graph._repr_mimebundle_()["text/plain"],
        }
        assert [name for name, text in renderings.items() if hint not in text] == []
        assert str(graph) == f"aioengine graph: {graph.note}"

        engine.record_history()  # recording, but nothing finished since: a different note
        recorded = engine.graph()
        assert recorded.nodes == ()
        assert recorded.note
        assert "record_history" not in recorded.note
        assert recorded.note in recorded.to_dot()
        await engine.push_sync(lambda r: None, name="seen")
        drawn = engine.graph()
        assert [n.name for n in drawn.nodes] == ["seen"]
        assert drawn.note == ""
        assert "empty" not in drawn.to_dot()
        assert "empty" not in drawn.to_mermaid()

    async def test_history_keeps_finished_ops_and_their_edges(self, engine: ae.Engine) -> None:
        engine.record_history(100)
        gate = asyncio.Event()
        push_program(engine, gate)
        gate.set()
        await engine.wait_for_all()
        graph = engine.graph()
        assert graph.named_edges() == EXPECTED
        assert {n.state for n in graph.nodes} == {ae.OpState.DONE}
        assert [n.name for n in graph.nodes] == ["open", "read", "fetch", "combine", "later"]

    async def test_history_is_bounded(self, threaded_engine: ae.Engine) -> None:
        engine = threaded_engine
        engine.record_history(3)
        x = engine.new_var("x")
        for i in range(6):
            engine.push_sync(lambda r: None, mutate_vars=[x], name=f"w{i}")
        await engine.wait_for_all()
        graph = engine.graph()
        assert [n.name for n in graph.nodes] == ["w3", "w4", "w5"]
        assert graph.named_edges() == {("w3", "w4", "x"), ("w4", "w5", "x")}
        with pytest.raises(ValueError, match="n must be an int >= 0"):
            engine.record_history(-1)

    def test_two_threads_enabling_history_at_once_install_one_recorder(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The second thread calls record_history() while the first builds its recorder:
        a second recorder would record every operation twice."""
        engine = ae.Engine()
        built = Recorder.__init__
        others: list[threading.Thread] = []

        def slow_init(self: Recorder, history: int) -> None:
            if not others:
                others.append(threading.Thread(target=engine.record_history, args=(50,)))
                others[0].start()
                # Its call can end only if it does not wait for this one's lock (the bug):
                # give it the chance, returning at once if it took it.
                others[0].join(0.05)
            built(self, history)

        monkeypatch.setattr(Recorder, "__init__", slow_init)
        engine.record_history(10)
        others[0].join(5)
        recorders = [i for i in engine._core.instruments if isinstance(i, Recorder)]
        assert len(recorders) == 1
        assert recorders[0].history.maxlen == 50  # the later call resized it

    async def test_renderings(self, threaded_engine: ae.Engine) -> None:
        engine = threaded_engine
        engine.record_history()
        x = engine.new_var('say "x"')
        a = engine.push_sync(lambda r: None, mutate_vars=[x], name="a\nline two")
        b = engine.push_sync(lambda r: None, const_vars=[x], name="b")
        await a
        await b
        graph = engine.graph()
        sa, sb = (n.seq for n in graph.nodes)
        dot = graph.to_dot()
        assert dot.startswith("digraph aioengine {")
        assert f'op{sa} -> op{sb} [label="say \\"x\\""];' in dot
        mermaid = graph.to_mermaid()
        assert mermaid.startswith("flowchart LR")
        assert f'op{sa} -->|"say #quot;x#quot;"| op{sb}' in mermaid
        assert all(line.startswith(("flowchart", "  ")) for line in mermaid.splitlines())
        assert f'op{sa}["#{sa} a line two' in mermaid  # a line break would end the statement
        assert f"#{sb} b [done, cpu0]  after #{sa} a" in str(graph)
        assert repr(graph) == "<aioengine.Graph nodes=2 edges=1>"
        assert graph.node(sb).label == f"#{sb} b"
        with pytest.raises(KeyError):
            graph.node(10**6)

    async def test_renderings_carry_any_name(self, threaded_engine: ae.Engine) -> None:
        """A lone surrogate (os.fsdecode of an undecodable file name) or a control character
        in a name cannot be written as UTF-8 DOT or Mermaid: it shows as U+FFFD."""
        engine = threaded_engine
        engine.record_history()
        x = engine.new_var("x\x00")
        await engine.push_sync(lambda r: None, mutate_vars=[x], name="load \udcff.bin")
        await engine.push_sync(lambda r: None, const_vars=[x], name="b\x1b")
        graph = engine.graph()
        for text in (graph.to_dot(), graph.to_mermaid()):
            text.encode("utf-8")  # no lone surrogate left
            assert "load \ufffd.bin" in text
            assert "\x00" not in text
            assert "\x1b" not in text
        svg = graph._repr_svg_()  # None without graphviz (or its dot program)
        assert svg is None or "<svg" in svg  # dot accepted it

    def test_notebook_display(self) -> None:
        pytest.importorskip("graphviz")
        graph = ae.Graph((), ())
        bundle = graph._repr_mimebundle_()
        assert bundle["text/plain"] == "aioengine graph: no operations"
        svg = graph._repr_svg_()
        if svg is None:
            pytest.skip("graphviz's dot program is not installed")
        assert "<svg" in svg
        assert bundle["image/svg+xml"] == svg

    def test_notebook_display_without_graphviz(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setitem(sys.modules, "graphviz", None)
        graph = ae.Graph((), ())
        assert graph._repr_svg_() is None
        bundle = graph._repr_mimebundle_()
        assert bundle["text/markdown"].startswith("```mermaid\nflowchart LR")
