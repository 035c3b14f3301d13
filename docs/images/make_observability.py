"""Regenerate the pictures of docs/observability.md from a real run.

    python docs/images/make_observability.py

Writes ``observability-trace.json`` (open it in ui.perfetto.dev), ``observability-trace.png``
(the same trace drawn with matplotlib: one row per track, flow arrows in red) and
``observability-graph.svg`` / ``.png`` (``engine.graph()`` rendered by Graphviz's ``dot``).
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import threading
import time
from typing import Any

import aioengine as ae

HERE = pathlib.Path(__file__).resolve().parent


async def program(engine: ae.Engine) -> None:
    """Load two shards, fetch a config over the 'network', combine, then save."""
    a, b, cfg, out = (engine.new_var(n) for n in ("shard_a", "shard_b", "config", "result"))

    def load(rctx: ae.RunContext) -> None:
        time.sleep(0.004)

    async def fetch_config(rctx: ae.RunContext) -> None:
        for _ in range(3):
            await asyncio.sleep(0.003)  # suspended: the loop is free meanwhile
            sum(range(20_000))  # a little work on the loop between awaits

    def save(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
        threading.Timer(0.004, on_complete).start()  # completes from another thread

    engine.push_sync(load, mutate_vars=[a], name="load_a")
    engine.push_sync(load, mutate_vars=[b], name="load_b")
    engine.push_async(fetch_config, mutate_vars=[cfg], name="fetch_config")
    engine.push_sync(load, const_vars=[a, cfg], mutate_vars=[out], name="combine_a")
    engine.push_sync(load, const_vars=[b, cfg], mutate_vars=[out], name="combine_b")
    engine.push_async(save, const_vars=[out], name="save")
    await engine.wait_for_all()


def draw_trace(trace: dict[str, Any], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = trace["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    order = {e["tid"]: e["args"]["sort_index"] for e in events if e["name"] == "thread_sort_index"}
    slices = [e for e in events if e["ph"] == "X"]
    tids = sorted({e["tid"] for e in slices}, key=lambda t: order.get(t, 0))
    row = {tid: i for i, tid in enumerate(tids)}
    t0 = min(e["ts"] for e in slices)
    fig, ax = plt.subplots(figsize=(11, 0.8 + 0.7 * len(tids)), dpi=110)
    colors = {"op": "#90caf9", "run": "#1565c0", "await": "#e3f2fd"}
    for e in slices:
        y = row[e["tid"]]
        start, width = (e["ts"] - t0) / 1000, e["dur"] / 1000
        if e["cat"] == "op":
            ax.broken_barh([(start, width)], (y - 0.35, 0.7), color=colors["op"], ec="#0d47a1")
            ax.text(start + width / 2, y + 0.22, e["name"], ha="center", va="center", fontsize=8)
        else:
            hatch = "///" if e["cat"] == "await" else None
            ax.broken_barh(
                [(start, width)], (y - 0.3, 0.35), color=colors[e["cat"]], hatch=hatch, ec="#0d47a1"
            )
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    for s in (e for e in events if e["ph"] == "s"):
        f = ends[s["id"]]
        ax.annotate(
            "",
            xy=((f["ts"] - t0) / 1000, row[f["tid"]]),
            xytext=((s["ts"] - t0) / 1000, row[s["tid"]]),
            arrowprops={"arrowstyle": "->", "color": "#c62828", "lw": 1},
        )
    ax.set_yticks(range(len(tids)), [names[t] for t in tids])
    ax.invert_yaxis()
    ax.set_xlabel("ms  (op slices light; coroutine 'run' steps dark, 'await' hatched; red: flows)")
    ax.set_title("aioengine trace of docs/images/make_observability.py")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)


async def main() -> None:
    async with ae.Engine(cpu_workers=2) as engine:
        engine.record_history()
        async with engine.trace(HERE / "observability-trace.json") as session:
            await program(engine)
        assert session.trace is not None
        draw_trace(session.trace, HERE / "observability-trace.png")
        graph = engine.graph()
        (HERE / "observability-graph.dot").write_text(graph.to_dot())
        import graphviz

        source = graphviz.Source(graph.to_dot())
        (HERE / "observability-graph.svg").write_bytes(source.pipe(format="svg"))
        (HERE / "observability-graph.png").write_bytes(source.pipe(format="png"))
        print(graph)
        print(json.dumps(engine.statistics().pools, default=str, indent=1))


if __name__ == "__main__":
    asyncio.run(main())
