"""Write docs/performance.md from benchmarks/results/latest.json (``python benchmarks/report.py``).

The page shows the machine, the per-workload medians (µs per op), the targets of the benchmark
issue with their measured ratios, the chart, and how to reproduce. Run it after
``nox -s bench`` (the full run); it never re-measures anything.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import sys
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs"


def _relative(path: str | None) -> str:
    """``path`` relative to the checkout (the page is committed); "not run" if None."""
    if not path:
        return "not run"
    return os.path.relpath(path, ROOT) if os.path.isabs(path) else path


def _table(workload: dict[str, object]) -> list[str]:
    peers = workload["peers"]
    assert isinstance(peers, dict)
    rows = sorted(
        ((name, p) for name, p in peers.items() if p.get("us_per_op")),
        key=lambda item: item[1]["us_per_op"],
    )
    lines = ["| peer | µs/op | ops/s | spread | verified |", "|---|---:|---:|---:|:---:|"]
    for name, p in rows:
        lines.append(
            f"| `{name}` | {p['us_per_op']:.2f} | {p['ops_per_s']:,.0f} | "
            f"{100 * p['spread']:.0f} % | {'yes' if p['verified'] else '**no**'} |"
        )
    return lines


def _instructions_section() -> list[str]:
    """The instruction counts of ``benchmarks/instructions.py``, if it has been run: the
    installed build (``instructions.json``) and, when they were counted too, the pure-Python
    sources (``instructions-pure.json``) and the ``program`` workloads against MXNet's
    NaiveEngine (``instructions-program.json``, ``--program``)."""
    out: list[str] = []
    for name in ("instructions.json", "instructions-pure.json", "instructions-program.json"):
        path = RESULTS / name
        if path.exists():
            out += _instructions_table(json.loads(path.read_text()), first=not out)
    return out


def _paired_section() -> list[str]:
    """The ratios of ``benchmarks/paired.py`` (``paired.json``), if it has been run: each
    aioengine configuration against its reference, taken within each round of one process."""
    path = RESULTS / "paired.json"
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    out = [
        "### Paired rounds in one process (`benchmarks/paired.py`)",
        "",
        "Both engines in one interpreter, the MXNet venv's, taking turns: each round runs",
        "every configuration once on the same `program/` workload (the first to go rotates),",
        "and the ratio is taken within the round, so a slowdown of the VM that lasts a round",
        "hits both sides of it. A round takes about a second. Shown: the median of the",
        f"rounds' ratios with their range, and the ratio of the medians. {data['rounds']}",
        f"rounds of {data['n_ops']:,} operations per workload; aioengine {data['aioengine']};",
        f"{data['mxnet']}.",
        "",
        "| workload | ratio | median of the rounds' ratios | range | ratio of the medians |",
        "|---|---|---:|---:|---:|",
    ]
    for name, w in data["workloads"].items():
        for config, r in w["ratios"].items():
            out.append(
                f"| `{name}` | `{config}` / `{w['reference']}` | {r['paired_median']:.2f}x | "
                f"{r['paired_min']:.2f}-{r['paired_max']:.2f}x | {r['ratio_of_medians']:.2f}x |"
            )
    return [*out, ""]


def _instructions_table(data: dict[str, Any], *, first: bool) -> list[str]:
    per_op = {(r["config"], r["shape"]): r["instructions"] for r in data["per_op"]}
    configs = list(dict.fromkeys(c for c, _ in per_op))
    shapes = list(dict.fromkeys(s for _, s in per_op))
    core = data.get("aioengine_core", "pure Python")
    out = (
        [
            "## Instructions per operation",
            "",
            "Counted by valgrind (`python benchmarks/instructions.py`): the instructions that",
            "pushing, running and finishing one no-op (`yield` for coroutines) operation costs,",
            "garbage collection included, the same in every run. Single-threaded",
            f"configurations only; Python {data['python']}.",
            "",
        ]
        if first
        else []
    )
    title = f"### aioengine's {core} core"
    if data.get("program"):
        title += (
            ", program workloads (a heap of 200,000 objects, per-operation closures, no"
            " collection before the pushes: the collector's work is counted)"
        )
    out += [
        title,
        "",
        "| shape | " + " | ".join(f"`{c}`" for c in configs) + " |",
        "|---|" + "---:|" * len(configs),
    ]
    for shape in shapes:
        cells = [f"{per_op[c, shape]:,}" if (c, shape) in per_op else "" for c in configs]
        out.append(f"| {shape} | " + " | ".join(cells) + " |")
    out += [
        "",
        "Ratios (peer instructions / aioengine instructions; against `floor-inline` 0.6 is",
        "the target for inline and serial operations, against `floor-task` for coroutine",
        "operations, and against `mxnet-naive` 1.0):",
        "",
        "| shape | aioengine | peer | ratio |",
        "|---|---|---|---:|",
    ]
    for r in data["ratios"]:
        out.append(f"| {r['shape']} | `{r['aio']}` | `{r['vs']}` | {r['ratio']:.2f}x |")
    return [*out, ""]


def render(data: dict[str, object]) -> str:
    """The Markdown page for one results file."""
    meta = data["meta"]
    assert isinstance(meta, dict)
    versions = ", ".join(f"{k} {v}" for k, v in meta.get("versions", {}).items())
    out = [
        "# Performance",
        "",
        "Measured by `nox -s bench` (`benchmarks/run.py`): every peer runs the same seeded",
        "workloads in fresh processes, interleaved, and every run is checked against a serial",
        "replay, so a wrong order can never show up as a fast time. Figures are medians; ratios",
        "compare medians from the same run on the same machine. Lower µs/op is better.",
        "",
        "## Machine and run",
        "",
        f"- {meta.get('cpu_count')} CPUs, {meta.get('platform')}, Python {meta.get('python')}",
        f"- {versions}; MXNet 1.9.1 venv Python: {_relative(meta.get('mxnet_python'))}",
        f"- mode `{meta.get('mode')}`, {meta.get('reps')} repetition(s), {meta.get('date')}",
        f"- load average {meta.get('loadavg_start', 0):.2f} at start, "
        f"{meta.get('loadavg_end', 0):.2f} at end",
        "",
        "![benchmark chart](images/benchmark.png)",
        "",
        "## Targets",
        "",
        "| target | aioengine | measured | worst workload | met |",
        "|---|---|---:|---|:---:|",
    ]
    targets = data.get("targets", [])
    assert isinstance(targets, list)
    for t in targets:
        if "ratio" in t:
            measured = f"{t['ratio']:.2f}x vs `{t.get('vs', '')}`"
        else:
            measured = f"{t['value']:.1f} (limit {t['limit']})"
        out.append(
            f"| {t['target']} | `{t['aio']}` | {measured} | {t.get('worst_workload', '')} "
            f"| {'n/a' if t['met'] is None else 'yes' if t['met'] else 'no'} |"
        )
    notes = data.get("notes", [])
    if notes:
        # Paths in the checkout as relative ones (the page is committed; it names no machine).
        here = str(ROOT) + os.sep
        out += ["", "Notes from the run:", ""]
        out += [f"- {str(n).replace(here, '')}" for n in notes]  # type: ignore[union-attr]
    out += ["", "## Workloads", ""]
    workloads = data["workloads"]
    assert isinstance(workloads, dict)
    for name, workload in workloads.items():
        spec = workload["spec"]
        out += [
            f"### {name}",
            "",
            f"{spec['n_ops']:,} ops, shape `{spec['shape']}`, body `{spec['body']}`.",
            "",
            *_table(workload),
            "",
        ]
    out += _instructions_section()
    out += [
        "## The cost of tracing",
        "",
        "`aio-traced` is `aio-threaded` while `engine.start_trace()` records every operation;",
        "the target table above gives the ratio of the two on the no-op shapes. While it runs",
        "the engine's core only appends raw fields (times, thread, outcome, Var names) to the",
        "trace's log; thread names, lanes, dependencies, the JSON events, their arguments and",
        "the arrows are built by `stop_trace()`, outside the timed region, so that the trace",
        "perturbs the run it records as little as it can (`benchmarks/paths.py` measures inline",
        "no-op operations, the strictest case). Not tracing costs one `is None` test per push,",
        "start and finish.",
        "",
        "## What a user's program pays",
        "",
        "The `program/` workloads (see `benchmarks/README.md`) run the no-op and yield",
        "shapes the way a program runs them: the collector on and no collection before the",
        "clock, a heap of 200,000 live objects of the program's own, and per-operation",
        "closures built before the clock. There every young collection walks what the",
        "pending operations leave tracked, and every full collection walks it with the",
        "program's heap. Before the snapshot and the Var tuple were hidden (see below),",
        "20,000 pending operations left 28,431 tracked objects; now they leave about 1,000.",
        "",
        "First measurement, on the 2-core VM while other builds ran (1-minute load average",
        "10-16): two alternating runs of the compiled wheel of the commit before this change",
        "and of this one, each in its own `run.py` invocation, ratios of the median of the",
        "two against the same invocation's MXNet. Wall-clock ratios swung by up to 2x from",
        "one run to the next under that load, so only the large moves are findings:",
        "",
        "| `program/noop/` shape | ratio (default loop / uvloop) | before | after |",
        "|---|---|---:|---:|",
        "| `independent` | serial / NaiveEngine | 0.51x / 0.55x | 1.39x / 1.39x |",
        "| `independent` | inline / NaiveEngine | 0.72x / 0.61x | 1.12x / 1.33x |",
        "| `chain` | inline / NaiveEngine | 1.35x / 1.20x | 1.01x / 1.25x |",
        "| `chain` | serial / NaiveEngine | 1.30x / 1.32x | 1.18x / 1.14x |",
        "| `fanout` | inline / NaiveEngine | 1.25x / 1.25x | 1.17x / 1.03x |",
        "| `fanout` | serial / NaiveEngine | 1.42x / 1.38x | 1.14x / 1.03x |",
        "| `random` | inline / NaiveEngine | 1.18x / 1.19x | 0.78x / 0.95x |",
        "| `random` | serial / NaiveEngine | 1.10x / 0.95x | 0.87x / 0.97x |",
        "| worst shape | threaded / best MXNet threaded | 0.67x / 0.82x | 1.03x / 0.98x |",
        "| worst `coro-yield/` | coroutine / task floor | 0.98x / 0.90x | 0.87x / 0.95x |",
        "",
        "On `independent` (every operation writes a Var of its own, and all 20,000 are",
        "pending before the first runs) serial mode moved from below NaiveEngine in all four",
        "runs before (0.25-0.86x, both loops) to above it in all four after (1.01-1.78x);",
        "inline overlapped (0.42-0.96x before, 0.84-1.76x after). The other shapes' moves,",
        "`random` included, are within what the load made of one binary between two runs; a",
        "full `nox -s bench` on a quiet",
        "machine is what decides the targets of this configuration (inline and serial at",
        "least 1.0x NaiveEngine on every no-op shape), and it has not been run yet.",
        "Instruction counts, which the load does not move (`benchmarks/instructions.py`,",
        "1,000 and 3,000 operations, `random`, clock after a collection as in the clean-room",
        "workloads): compiled inline 18,807 before, 18,531 after; compiled serial 18,657",
        "before, 18,382 after; pure-Python inline 70,919 before, 70,902 after.",
        "",
        "### Later: the collector's share, and NaiveEngine counted the same way",
        "",
        "**The collector's share is now about 1 %.** Counted with `gc.callbacks` in one",
        "process (compiled wheel, `program/noop/random`, aio-inline), in the timed region of",
        "20,000 operations:",
        "- 158 young and 14 middle collections ran, together 1.5-2 ms;",
        "- no full collection ran;",
        "- the region itself took 120-170 ms.",
        "",
        "**The program's heap is now settled before the run.** `workloads.user_heap`",
        "collects once after building it. Until then, the heap's own overdue full collection",
        "(about 30 ms over 200,000 new survivors) landed at a random point of a runner's",
        "setup or timed region, and decided the ratios: spreads of 25-86 % between",
        "repetitions of the same binary. The clock still starts without a collection.",
        "",
        "**Instructions per operation against NaiveEngine.** `benchmarks/instructions.py",
        "--program --configs aio-inline,aio-serial,mxnet-naive` counts the `program`",
        "workloads, the collector's work included, and MXNet's C++ engine through its C API",
        "(the last table of the instruction counts above). NaiveEngine runs 1.32-1.46x",
        "aioengine's instructions per operation, inline and serial, on every no-op shape.",
        "",
        "**Fewer instructions are not the same ratio of wall time.** MXNet's C++ runs more",
        "instructions per cycle than CPython's interpreter loop.",
        "",
        "**This VM adds a slowdown of its own that can reach about 1.8x:**",
        "- It comes and goes within one process, from one 20,000-operation run to the next.",
        "- It hits every peer. Eight runs in a row of one process measured aio-inline on",
        "  `program/noop/chain` at 165, 164, 158, 272, 172, 138, 256 and 174 thousand",
        "  operations per second. MXNet measured 144, 205, 144, 149, 139, 147, 211 and 226.",
        "- Pinning the process to one CPU, fixing the hash seed or turning off address",
        "  randomisation does not remove it.",
        "",
        "**What that does to the ratios.** A median of five processes per peer depends on",
        "how many of each peer's runs happened to be slowed. In one `run.py` of the four",
        "`program/noop/` shapes (5 repetitions):",
        "- the aioengine runs spread 46-102 %, and NaiveEngine's 4-58 %;",
        "- the ratios against NaiveEngine ranged from 0.87x to 1.17x. The 0.87x is serial",
        "  on `fanout`, where none of its five runs was a fast one.",
        "",
        "Against runs that were slowed alike, aioengine is ahead or level:",
        "- on `chain`, 280,000 against 220,000 operations per second when both are fast,",
        "  and 160,000 against 145,000 when both are slowed;",
        "- on `random`, in a slowed run, the two are level (115,000-120,000 against 120,000).",
        "",
        "`benchmarks/paired.py` (`nox -s bench` runs it after `run.py`) measures exactly",
        "that: the ratio within rounds in which both engines ran back to back, in one",
        "process. In six such runs (3 to 11 rounds each), inline and serial operations ran",
        "above NaiveEngine on `independent`, `chain` and `fanout` in every run (medians of",
        "the rounds' ratios 1.10-1.45x), and level with it on `random` (inline 0.996-1.12x,",
        "serial 1.03-1.12x): there the target of 1.0x was met in five runs and missed by",
        "less than 1 % in one. Coroutine operations ran above the task floor on every",
        "`program/coro-yield/` shape in both runs that measured them (1.04-1.92x). The C",
        "shortcuts of the compiled hot path (below: 10% fewer instructions per operation)",
        "then moved `random` clear of parity: 1.15x inline and 1.16x serial in the run",
        "below, whose every round had inline above 1.1x. The last run:",
        "",
    ]
    out += _paired_section()
    out += [
        "## Where the time goes",
        "",
        "Every operation costs aioengine bookkeeping that MXNet does in C++: the push",
        "(argument checks, an `Operation`, the atomic append to each Var's queue under the",
        "engine lock), the start (state check, failure inheritance) and the finish (release",
        "and grant, counters, waking awaiters). The wall-clock medians above move by tens of",
        "percent from run to run on a shared 2-core VM, so the hot paths were tuned on",
        "instruction counts (the tables above, from `benchmarks/instructions.py`), which are",
        "the same every time, and a change was kept only when alternating wall-clock runs",
        "agreed: counts miss the cost of memory. Creating a ready coroutine operation's",
        "task inside its push counted 1.5% fewer instructions, yet a burst of 20,000 of",
        "them ran 25-40% slower, because every task then existed at once; it was reverted.",
        "What made operations cheaper, in that order of effect:",
        "",
        "- **The compiled core** (`setup.py`, see [Design](design.md#the-compiled-core)):",
        "  Cython compiles the core (`scheduler.py`, `loopqueue.py`, `bulk.py`, `var.py`,",
        "  `operation.py`) and the `engine.py` façade, typed by",
        "  `.pxd` files, so the hot path reads operations, Vars and the engine as C structs",
        "  and its methods call each other as C functions. Compiling the same modules",
        "  without the declarations gained nothing measurable: CPython 3.11's specialising",
        "  interpreter already does what a plain compile saves. With them, an inline",
        "  operation costs a quarter to a third of the instructions of the pure-Python build (the",
        "  two tables above) and its wall-clock time drops by 40-50% (an A/B in one process:",
        "  0.53-0.58x of the floor on the default loop interpreted, 0.81-1.00x compiled).",
        "- **Garbage collection** was the largest single cost before that: with 20,000",
        "  operations pending, each full collection took 20-35 ms, about 4 µs per operation.",
        "  A request is no longer an object (a Var's queue holds `op, write` pairs in one",
        "  list, created when a request first waits), executors queue integer keys instead",
        "  of a closure and a heap tuple per operation, and an operation keeps its Vars in",
        "  one tuple (its reads, then its writes, and the number of reads): a pending",
        "  operation costs 3 tracked objects (the operation, its context copy, that tuple)",
        "  instead of 7-10, and about 460 bytes instead of 709. Collection then still took",
        "  about a tenth of an inline operation's time on `random` (78 young and 7 middle",
        "  collections, no full one, in a timed region of 20,000 operations, measured with",
        "  `gc.callbacks`; about 3,000 of its 20,650 instructions, counted with the",
        "  collector off). The floor keeps about two small objects per operation.",
        "- **Live operations out of the collector's passes** (compiled core, `collector.py`,",
        "  see [Design](design.md#vars-are-fifos-of-requests)): until it completes, an",
        "  operation is reachable from its engine and refers back to it, so no collection",
        "  can free it, yet each one walked it and its Var tuple. The push untracked",
        "  both (then never a tuple the caller passed in) and the completion tracks them again;",
        "  before each full collection every engine tracks its live operations, so that an",
        "  engine dropped with operations that can never finish is still freed. 1,750-2,290",
        "  fewer instructions per operation (10-12%) on every shape and configuration, and",
        "  8-9% less wall-clock for inline, serial and threaded no-ops in alternating runs.",
        "- **A pending operation's context snapshot and Var tuple out of the collector too**",
        "  (compiled core, `collector.pxd`). The operation alone was hidden, while each push",
        "  still left its `copy_context()` snapshot and, for an operation that only writes,",
        "  its Var tuple in the collector's lists: 1.4 tracked objects per pending operation",
        "  (28,431 for 20,000 operations in `tests/test_collector.py`'s count). They are",
        "  hidden and shown with the operation now (a caller's tuple included, a refused",
        "  push showing what it hid before it raises): 0.05 per operation, the Vars' queue",
        "  lists. The clean-room workloads above barely see it (their clock starts after a",
        "  collection and the process holds little else); the `program/` workloads",
        "  (below) do. Reusing the previous snapshot while the pusher's context is unchanged",
        "  was not done: operations run inside their snapshot, so a ContextVar set by one",
        "  would reach the next, and two cannot enter one `Context` at once.",
        "- **Coroutine operations** finish inside their task, at the end of its last step,",
        "  instead of in a done-callback one loop iteration later; the loop starts at most",
        "  256 of them per callback, so 20,000 ready ones do not all exist as tasks at once;",
        "  a coroutine operation that a completion on the loop makes ready gets its task",
        "  at once.",
        "- **The loop thread runs inline operations as workers do**: finishing one claims",
        "  the next best in the same critical section, and the one operation a completion",
        "  made ready runs without a trip through the queue. Its queue appends keys that",
        "  arrive in order (priority 0, made ready in push order) to a FIFO and only the",
        "  others to a heap: with 20,000 operations ready, `heappop`'s comparisons had been",
        "  18% of the run.",
        "- **Lists read from a head index, not deques** (a Var's queue, the loop thread's",
        "  FIFO): the compiled core appends to a list and indexes it in C, where each deque",
        "  method is a Python call. With fewer attribute reads and method lookups per push",
        "  (a partial's function read once for its flags and its name, the lock's bound",
        "  methods kept), this took another 12-15% off an inline operation on uvloop.",
        "- **Short Var lists deduplicated by identity, pairwise**: three reads used to go",
        "  through `dict.fromkeys`, and each read was looked up in the writes with",
        "  `tuple.__contains__`, whose comparison of two distinct Vars costs about 100",
        "  instructions; 6% fewer instructions per operation on `random`.",
        "- **A loop queue indexed by push number**: on `random`, 93% of the inline",
        "  operations became ready below the last key of the loop queue's FIFO (the ones",
        "  ready at push time sit at its end) and went through its heap: `heappush`,",
        "  `heappop`, their integer comparisons and a key-to-operation dict. An operation",
        "  of priority 0 now waits in the slot of its push number, and only priorities and",
        "  numbers behind the head use the heap: 7% fewer instructions per operation on",
        "  `random` (21,903 to 20,442, uvloop).",
        "- **Operations made without a constructor call** (`new_operation()`):",
        "  `Operation(...)` went through `type.__call__`, an argument tuple and the parsing",
        "  of ten arguments; the compiled core calls the type's `tp_new` as a C function",
        "  and stores each field as a C struct member (675 fewer instructions per push).",
        "- **The engine lock is a one-token `queue.SimpleQueue`** (`aioengine/lock.py`):",
        "  CPython 3.11's `threading.Lock.acquire()` parses its absent arguments with",
        "  `PyArg_ParseTupleAndKeywords`, which cost more than a push's critical section;",
        "  `get()` and `put()` are single C calls (a round trip: 37 against 75 ns). The",
        "  instruction count barely moves, but valgrind's simulated instruction-cache",
        "  misses per operation fall from 581 to 437, and alternating runs take 2-3% off.",
        "- **C shortcuts where the compiled hot path made Python calls** (`functions.pxd`,",
        "  `lock.pxd`; the source branches on `_COMPILED`): the calling thread's ident, a",
        "  pushed function's `async def` flag and `__qualname__` read from its C struct,",
        "  the operation kinds as C ints, asyncio's `is_running()` read as the attribute it",
        "  tests, the statistics row of the loop kept at hand, and no coroutine-type test",
        "  for a function that returned None. On `random` (default loop, the program's",
        "  heap held), 19,366 to 17,419 instructions per inline operation and 19,097 to",
        "  17,188 per serial one (-10%); the pure build's count moved by less than 0.5%.",
        "- **Writes and reads checked in two calls**, each returning its tuple (no pair",
        "  built and unpacked per push), and the loop's `is_running` bound once: 2% fewer",
        "  instructions per operation on `random`.",
        "- **Serial mode's sequencer typed for the compiled core**: every serial operation",
        "  also queues on one engine-wide Var, and its append and release were Python method",
        "  calls (a lookup, a vectorcall, argument parsing) until that Var's type was",
        "  declared: 840 fewer instructions (4%) and 80 fewer simulated instruction-cache",
        "  misses per serial operation on `random`.",
        "- **One Var tuple per operation** instead of two (the pending-object count above):",
        "  110-150 fewer instructions per operation on `random`, and 1-3% less wall-clock in",
        "  alternating runs, more than the count says, as the collector's walks miss the",
        "  data cache.",
        "- **Every runner collects garbage before its clock starts** (`start_clock()`):",
        "  aioengine's runner prepares 60,000 objects (partials, Var lists) before its clock,",
        "  the floor almost none, and the first collections of the timed region used to walk",
        "  them, a full collection among them (1.4 µs per operation on `noop/fanout`).",
        "- **Fewer Python calls per operation** (15 instead of 22 for an inline one): the",
        "  Vars of an operation appended and released in one call each, locks taken with",
        "  `acquire()`/`release()` (`with lock:` costs twice as much on CPython 3.11), no",
        "  `getpid()` system call per push on the loop's thread, enum members bound to module",
        "  constants (`OpState.PENDING` is a lookup through the Enum metaclass each time).",
        "",
        "Wall-clock ratios of Python peers move between runs on this VM: in earlier runs",
        "every Python peer once ran 16-34% slower than the run before while MXNet's own",
        "timings did not move, with spreads of 17-51% between repetitions. The targets",
        "table is one run; the instruction counts are the steady figure.",
        "",
        "MXNet's threaded figures include a cost its C++ operators would not pay: ctypes",
        "sets up a Python thread state for every callback into a Python body on MXNet's",
        "own threads. The bodies, and the verification in them, are the same for every",
        "peer: each op records the versions of its vars at its start and at its end and",
        "marks a write under way, so that an overlap of a write with an earlier read also",
        "fails verification (`workloads.selftest()` checks that it does).",
        "",
        "**Inline and serial no-ops against MXNet's NaiveEngine on `random`: met, by",
        "14-22%.** Until live operations were hidden from the collector (above), inline",
        "on the default loop was a tie there (0.99x, within the spread). In the latest run",
        "inline is 1.14x NaiveEngine on `random` (default loop) and 1.16x (uvloop), serial",
        "1.17x and 1.22x; on `independent`, `chain` and `fanout` every inline and serial",
        "configuration is 1.37-1.61x NaiveEngine. (This run's VM was faster than the",
        "previous one's, NaiveEngine taking 2.11 µs per operation on `random` against 2.93:",
        "compare ratios, not times, across runs.) `random` stays the closest shape: each",
        "operation touches up to five Vars, whose queues the push and the finish visit.",
        "Inline and serial operations cost about the same instructions (18,457 and 18,321",
        "on the default loop), yet inline runs 2-5% slower: it goes through the loop queue",
        "(an operation made ready joins it in push order, and the best one is claimed), and",
        "valgrind's cache simulation counted 491 instruction-cache misses per inline",
        "operation against 422 for serial, which hands the one operation that a completion",
        "made ready straight on (before the change above). Running that operation ahead",
        "of the queue (depth first) was tried and ran 7% slower. A C mutex in place of the",
        "engine lock counted 930 fewer instructions per operation and about 2% less",
        "wall-clock, but it needs a second, compiled-only implementation of the lock beside",
        "the pure-Python one; not done. By instruction count an inline operation costs",
        "1.6-2.1x less than the floor's on every shape, and in this run it is also ahead of",
        "the floor in wall-clock on both loops and every shape (1.02x on `fanout` with",
        "uvloop to 2.08x on `chain` on the default loop). The floor has none of what a",
        "user relies on (argument checks, thread safety, failures, priorities, cancellation,",
        "an awaitable result per operation).",
        "NaiveEngine runs each operation inside the push, in C++ (its cost here is the",
        "ctypes round trip into the Python body); an aioengine push must return before the",
        "function runs, since the operation can still be cancelled then, so every",
        "operation is queued and taken back.",
        "mypyc, the compiler for typed Python, was tried earlier and rejected: its",
        "classes cannot be weakly referenced, which the engine and its users rely on.",
        "",
        "**Bulk execution does not save no-ops anything.**",
        "The `-bulk` rows push the same operations inside `engine.bulk(64)` (MXNet's bulk",
        "execution, see [bulk execution](howto/bulk.md)): a segment queues once on its Vars",
        "and runs its operations in one loop callback, which saves their Var-queue and",
        "run-queue round trips. Compiled, those round trips cost less than the segment's",
        "own bookkeeping, and plain operations gained more than segments from being",
        "hidden from the collector: bulk runs 8-11% slower than plain on `random` (still",
        "1.06-1.08x NaiveEngine) and 15-24% slower on the other shapes. It had once been",
        "20-55% slower: each member took the lock",
        "twice (the finish of a member and the start of the next now share one critical",
        "section), looked its run context up through `Context`'s Python `__hash__`, and",
        "every push inside the block asked `asyncio.current_task()`, which asks for the",
        "running loop with a `getpid()` system call. It still asks `current_task()` with",
        "the engine's loop named, a Python function on CPython 3.11 (C from 3.12).",
        "",
        "## Reproduce",
        "",
        "```text",
        "nox -s bench                       # full matrix (about 10 minutes on 2 cores)",
        "nox -s bench -- --quick            # smoke mode, under a minute",
        ".nox/bench/bin/python benchmarks/instructions.py  # instructions (valgrind, ~8 min)",
        ".venv/bin/python benchmarks/instructions.py \\",
        "    --out benchmarks/results/instructions-pure.json  # the same, pure-Python sources",
        "python benchmarks/report.py        # rewrite this page from benchmarks/results/",
        "```",
        "",
        "MXNet 1.9.1 runs from its own venv (`.venv-mxnet`, created on first use with",
        "`numpy<1.24`), driven through its C API with ctypes; see `benchmarks/README.md`.",
        "",
    ]
    return "\n".join(out)


def main() -> int:
    """Render the latest results into docs/performance.md and copy the chart."""
    latest = RESULTS / "latest.json"
    if not latest.exists():
        print(f"no {latest}: run nox -s bench first", file=sys.stderr)
        return 1
    data = json.loads(latest.read_text())
    (DOCS / "images").mkdir(exist_ok=True)
    if (RESULTS / "latest.png").exists():
        shutil.copyfile(RESULTS / "latest.png", DOCS / "images" / "benchmark.png")
    (DOCS / "performance.md").write_text(render(data))
    print(f"wrote {DOCS / 'performance.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
