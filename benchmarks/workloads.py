"""Seeded benchmark workloads shared by every peer.

A *program* is a list of ops; op ``i`` is a pair ``(const_var_indices, mutate_var_indices)``
over ``n_vars`` abstract variables.  Every runner (MXNet, dask, the asyncio floors, aioengine)
turns the same program into its own pushes/graph and runs the same body for each op.

Verification is identical for all peers and costs two list stores per var an op touches plus
two increments per var it mutates: op ``i`` records the current *version* of each var it
touches when it starts, then bumps the version of every var it mutates (odd: a write is under
way); when it ends it records the versions again and bumps its vars once more (even: done).
A serial replay in push order produces the expected records; any reordering or overlap that
breaks the dependency contract shows up as a mismatch: a read that overtakes a write or is
overtaken by one, a write that starts while an earlier read or write of its var still runs
(that op's closing record sees the odd version), two writes that swap, an op that never runs.

This module uses only the standard library (NumPy is imported lazily by the ``numpy`` body) so
that it can be imported by the MXNet runner, which lives in its own virtual environment.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import random
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

Op = tuple[tuple[int, ...], tuple[int, ...]]
Program = list[Op]
SyncBody = Callable[..., None]
CoroBody = Callable[..., Coroutine[Any, Any, None]]

SHAPES = ("independent", "chain", "fanout", "random")
SYNC_BODIES = ("noop", "sleep", "cpu", "numpy")
CORO_BODIES = ("yield", "io")

#: Pure-Python loop length of the ``cpu`` body (about 40 µs on a 2020s x86 core).
CPU_ITERS = 1000
#: Vector length of the ``numpy`` body (``np.sqrt`` over float64, GIL released, about 0.2 ms).
#: A BLAS kernel was avoided on purpose: the MXNet venv pins ``numpy<1.24`` whose bundled
#: OpenBLAS picks a very different kernel than current NumPy on some CPUs, whereas ``sqrt``
#: runs at the same speed in both builds (each result reports its measured ``body_us``).
NUMPY_LEN = 131072


@dataclass(frozen=True)
class WorkloadSpec:
    """Complete, JSON-serialisable description of one workload."""

    name: str
    shape: str
    body: str
    n_ops: int
    n_vars: int = 0
    seed: int = 1234
    width: int = 8
    sleep_s: float = 0.001
    io_s: float = 0.01
    cpu_iters: int = CPU_ITERS
    numpy_len: int = NUMPY_LEN
    tags: tuple[str, ...] = field(default_factory=tuple)

    @property
    def is_coro(self) -> bool:
        """True when the body is a coroutine (only asyncio-based peers can run it)."""
        return self.body in CORO_BODIES

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-friendly dict."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorkloadSpec:
        """Inverse of :meth:`to_json`."""
        data = dict(data)
        data["tags"] = tuple(data.get("tags", ()))
        return cls(**data)


def generate(spec: WorkloadSpec) -> tuple[Program, int]:
    """Return ``(program, n_vars)`` for *spec*; deterministic for a given seed."""
    rng = random.Random(spec.seed)
    n = spec.n_ops
    prog: Program = []
    if spec.shape == "independent":
        n_vars = spec.n_vars or n
        prog = [((), (i % n_vars,)) for i in range(n)]
    elif spec.shape == "chain":
        n_vars = 1
        prog = [((), (0,)) for _ in range(n)]
    elif spec.shape == "fanout":
        # var 0 is written once, then read by `width` readers that write nothing; repeated.
        n_vars = 1
        w = spec.width
        for i in range(n):
            prog.append(((), (0,)) if i % (w + 1) == 0 else ((0,), ()))
    elif spec.shape == "random":
        n_vars = spec.n_vars or 64
        for _ in range(n):
            r = rng.randint(0, 3)
            k = rng.randint(1, 2)
            vs = rng.sample(range(n_vars), r + k)
            prog.append((tuple(vs[:r]), tuple(vs[r:])))
    else:
        raise ValueError(f"unknown shape {spec.shape!r}")
    return prog, n_vars


def program_digest(prog: Program) -> str:
    """Short digest of a program, so the orchestrator can check every peer ran the same ops."""
    return hashlib.sha1(json.dumps(prog).encode()).hexdigest()[:12]


class Checker:
    """Per-run verification state plus the op bodies that update it.

    ``body(i, *_)`` and ``cbody(i, *_)`` accept (and ignore) extra positional arguments, so
    the same function can be called as ``fn(rctx)`` by aioengine (via ``functools.partial``),
    with dependency results by dask, or bare by the floors.
    """

    def __init__(self, spec: WorkloadSpec, prog: Program, n_vars: int) -> None:
        self.spec = spec
        self.prog = prog
        self.n_vars = n_vars
        self.touch: list[tuple[int, ...]] = [r + w for r, w in prog]
        self.writes: list[tuple[int, ...]] = [w for _, w in prog]
        self.off: list[int] = []  # op i's records: touch[i] at its start, then at its end
        pos = 0
        for t in self.touch:
            self.off.append(pos)
            pos += 2 * len(t)
        self.n_slots = pos
        self.ver: list[int] = [0] * n_vars
        self.out: list[int] = [-1] * pos
        self.body: SyncBody = self._make_sync_body()
        self.cbody: CoroBody = self._make_coro_body()

    def closures(self) -> list[SyncBody]:
        """One closure per op, over its index, with the no-op body's code: the per-op callables
        of a ``program`` workload, as a user's program builds them (no ``functools.partial``).
        Each accepts and ignores extra positional arguments, as :attr:`body` does."""
        touch, writes, off = self.touch, self.writes, self.off
        ver, out = self.ver, self.out

        def make(i: int) -> SyncBody:
            def op(*_: object) -> None:
                o = off[i]
                for v in touch[i]:
                    out[o] = ver[v]
                    o += 1
                for v in writes[i]:
                    ver[v] += 1
                for v in touch[i]:
                    out[o] = ver[v]
                    o += 1
                for v in writes[i]:
                    ver[v] += 1

            return op

        return [make(i) for i in range(len(self.prog))]

    def coro_closures(self) -> list[CoroBody]:
        """As :meth:`closures`, coroutine functions with the ``yield`` body's code."""
        touch, writes, off = self.touch, self.writes, self.off
        ver, out = self.ver, self.out
        sleep = asyncio.sleep

        def make(i: int) -> CoroBody:
            async def op(*_: object) -> None:
                o = off[i]
                for v in touch[i]:
                    out[o] = ver[v]
                    o += 1
                for v in writes[i]:
                    ver[v] += 1
                await sleep(0)
                for v in touch[i]:
                    out[o] = ver[v]
                    o += 1
                for v in writes[i]:
                    ver[v] += 1

            return op

        return [make(i) for i in range(len(self.prog))]

    def reset(self) -> None:
        """Clear versions and records in place (the bodies keep referring to the same lists)."""
        self.ver[:] = [0] * self.n_vars
        self.out[:] = [-1] * self.n_slots

    def _make_sync_body(self) -> SyncBody:
        touch, writes, off = self.touch, self.writes, self.off
        ver, out = self.ver, self.out
        kind = self.spec.body

        if kind == "noop" or kind in CORO_BODIES:

            def body(i: int, *_: object) -> None:
                o = off[i]
                for v in touch[i]:
                    out[o] = ver[v]
                    o += 1
                for v in writes[i]:
                    ver[v] += 1
                for v in touch[i]:
                    out[o] = ver[v]
                    o += 1
                for v in writes[i]:
                    ver[v] += 1

            return body

        work = make_work(self.spec)

        def body_work(i: int, *_: object) -> None:
            o = off[i]
            for v in touch[i]:
                out[o] = ver[v]
                o += 1
            for v in writes[i]:
                ver[v] += 1
            work()
            for v in touch[i]:
                out[o] = ver[v]
                o += 1
            for v in writes[i]:
                ver[v] += 1

        return body_work

    def _make_coro_body(self) -> CoroBody:
        touch, writes, off = self.touch, self.writes, self.off
        ver, out = self.ver, self.out
        delay = 0.0 if self.spec.body in ("yield", "noop") else self.spec.io_s
        sleep = asyncio.sleep

        async def cbody(i: int, *_: object) -> None:
            o = off[i]
            for v in touch[i]:
                out[o] = ver[v]
                o += 1
            for v in writes[i]:
                ver[v] += 1
            await sleep(delay)
            for v in touch[i]:
                out[o] = ver[v]
                o += 1
            for v in writes[i]:
                ver[v] += 1

        return cbody

    def expected(self) -> list[int]:
        """Return the records a serial replay in push order produces."""
        ver = [0] * self.n_vars
        out = [-1] * self.n_slots
        touch, writes, off = self.touch, self.writes, self.off
        for i in range(len(self.prog)):
            o = off[i]
            for _ in range(2):  # its start, then its end
                for v in touch[i]:
                    out[o] = ver[v]
                    o += 1
                for v in writes[i]:
                    ver[v] += 1
        return out

    def verify(self) -> dict[str, Any]:
        """Compare the run's records with the serial replay; return a small JSON report."""
        exp = self.expected()
        ok = exp == self.out
        first_bad = -1
        if not ok:
            bad_slot = next(k for k, (a, b) in enumerate(zip(exp, self.out, strict=True)) if a != b)
            first_bad = max(i for i, o in enumerate(self.off) if o <= bad_slot)
        return {"verified": ok, "first_bad_op": first_bad}


def make_work(spec: WorkloadSpec) -> Callable[[], None]:
    """Return the payload of a sync body (without the verification bookkeeping)."""
    kind = spec.body
    if kind == "noop":
        return lambda: None
    if kind == "sleep":
        sleep, dt = time.sleep, spec.sleep_s
        return lambda: sleep(dt)
    if kind == "cpu":
        iters = spec.cpu_iters

        def cpu() -> None:
            s = 0
            for k in range(iters):
                s += k

        return cpu
    if kind == "numpy":
        import numpy as np

        src = np.random.default_rng(spec.seed).random(spec.numpy_len)
        # One output buffer per thread, keyed by its id: MXNet calls each body through ctypes
        # on its own threads, with a new Python thread state every time, so a threading.local
        # would be empty at every call there and the buffer reallocated per op.
        bufs: dict[int, Any] = {}
        get_ident = threading.get_ident
        sqrt = np.sqrt

        def kernel() -> None:
            ident = get_ident()
            buf = bufs.get(ident)
            if buf is None:
                buf = bufs[ident] = np.empty_like(src)
            sqrt(src, out=buf)

        return kernel
    raise ValueError(f"unknown sync body {kind!r}")


def start_clock(spec: WorkloadSpec | None = None) -> float:
    """Collect garbage, then return ``time.perf_counter()``: every runner's timed region starts
    here, after its setup (program, Vars, bodies, engine), so that no runner's collections of
    its own setup's objects are charged to its operations. Python's collector is
    generational: the first young collections of the timed region would otherwise walk
    whatever the setup left young, which differs from runner to runner.

    A ``program`` workload (:func:`is_program`) measures what a user's program pays, its
    collections included: its clock starts without one.
    """
    if spec is None or not is_program(spec):
        gc.collect()
    return time.perf_counter()


#: Live objects that a ``program`` workload's process holds as its own heap (lists, which the
#: collector always tracks): every full collection walks them, as it walks a user's data.
PROGRAM_HEAP = 200_000


def is_program(spec: WorkloadSpec) -> bool:
    """Whether ``spec`` is a ``program`` workload: measured as a user's program runs it, with
    the collector on, no collection before the clock, a heap of its own (:func:`user_heap`)
    and per-op closures (:meth:`Checker.closures`)."""
    return "program" in spec.tags


def user_heap(spec: WorkloadSpec) -> list[Any]:
    """The program's own heap for ``spec`` (:data:`PROGRAM_HEAP` live lists), or an empty
    list for other workloads. A runner builds it before its warm-up and holds it until its
    measurement ends.

    The heap is settled: one collection after it is built, as a long-running program's data
    has been through many. Otherwise the full collection that its 200,000 new survivors are
    owed (one is due once the objects promoted since the last exceed a quarter of the old
    generation) lands at a random point of the runner's setup or of its timed region, about
    30 ms in a 60-150 ms measurement, and decided the ratios (spreads of 25-86 % between
    repetitions). The clock still starts without a collection: what the operations leave to
    the collector, and the full collections that it triggers over this heap, are charged.
    """
    if not is_program(spec):
        return []
    heap = [[k] for k in range(PROGRAM_HEAP)]
    gc.collect()
    return heap


def calibrate_body_us(spec: WorkloadSpec, reps: int = 20) -> float:
    """Mean wall time (µs) of one body payload run serially in this process (0 for no-ops)."""
    if spec.body in ("noop", "yield"):
        return 0.0
    if spec.body == "io":
        return spec.io_s * 1e6
    work = make_work(spec)
    work()
    t0 = time.perf_counter()
    for _ in range(reps):
        work()
    return (time.perf_counter() - t0) / reps * 1e6


def result_record(
    spec: WorkloadSpec,
    config: str,
    seconds: float,
    check: Checker,
    prog: Program,
    *,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Build the JSON record a runner prints for one measurement."""
    n = len(prog)
    rec: dict[str, Any] = {
        "workload": spec.name,
        "config": config,
        "n_ops": n,
        "seconds": seconds,
        "ops_per_s": n / seconds if seconds > 0 else float("inf"),
        "us_per_op": seconds / n * 1e6,
        "digest": program_digest(prog),
        "body_us": calibrate_body_us(spec),
    }
    rec.update(check.verify())
    if extra:
        rec.update(extra)
    return rec


def standard_workloads(quick: bool = False) -> list[WorkloadSpec]:
    """Return the workload matrix of the issue (full sizes) or its small smoke version."""
    n_noop = 2_000 if quick else 20_000
    n_sleep = 200 if quick else 2_000
    v_sleep = 50 if quick else 200
    n_cpu = 300 if quick else 2_000
    n_np = 300 if quick else 2_000
    n_coro = 2_000 if quick else 20_000
    n_io = 1_000 if quick else 10_000
    specs: list[WorkloadSpec] = []
    for shape in SHAPES:
        specs.append(WorkloadSpec(f"noop/{shape}", shape, "noop", n_noop, n_vars=0))
    specs.append(WorkloadSpec("sleep/random", "random", "sleep", n_sleep, n_vars=v_sleep))
    specs.append(WorkloadSpec("cpu/random", "random", "cpu", n_cpu, n_vars=v_sleep))
    specs.append(WorkloadSpec("numpy/random", "random", "numpy", n_np, n_vars=v_sleep))
    for shape in SHAPES:
        specs.append(WorkloadSpec(f"coro-yield/{shape}", shape, "yield", n_coro))
    specs.append(WorkloadSpec("coro-io/independent", "independent", "io", n_io))
    # What a user's program pays (is_program): the no-op and yield shapes again.
    program = ("program",)
    for shape in SHAPES:
        specs.append(WorkloadSpec(f"program/noop/{shape}", shape, "noop", n_noop, tags=program))
    for shape in SHAPES:
        specs.append(
            WorkloadSpec(f"program/coro-yield/{shape}", shape, "yield", n_coro, tags=program)
        )
    return specs


def select(specs: Sequence[WorkloadSpec], pattern: str | None) -> list[WorkloadSpec]:
    """Filter specs by comma-separated substrings of their names (``None`` keeps all)."""
    if not pattern:
        return list(specs)
    pats = [p.strip() for p in pattern.split(",") if p.strip()]
    return [s for s in specs if any(p in s.name for p in pats)]


WARMUP = WorkloadSpec("warmup", "random", "noop", 500, n_vars=16, seed=99)


def run_cli(runner: Callable[[WorkloadSpec, str], dict[str, Any]], description: str) -> None:
    """Shared command line of the peer runners.

    ``--config NAME --workloads JSON`` runs each workload (a JSON list of spec dicts) with the
    given configuration and prints ``{"results": [...]}`` as the last line of stdout.  A failing
    workload yields a record with an ``error`` field instead of aborting the others.
    """
    import argparse
    import sys
    import traceback

    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--config", required=True)
    ap.add_argument("--workloads", required=True, help="JSON list of WorkloadSpec dicts")
    args = ap.parse_args()
    results: list[dict[str, Any]] = []
    for data in json.loads(args.workloads):
        spec = WorkloadSpec.from_json(data)
        try:
            results.append(runner(spec, args.config))
        except Exception as exc:  # reported to the orchestrator as a record
            traceback.print_exc(file=sys.stderr)
            results.append(
                {
                    "workload": spec.name,
                    "config": args.config,
                    "error": f"{type(exc).__name__}: {exc}",
                }
            )
    sys.stdout.write(json.dumps({"results": results}) + "\n")
    sys.stdout.flush()


def split_loop(config: str) -> tuple[str, str]:
    """Split ``"name-uvloop"`` into ``("name", "uvloop")``; other names use the default loop."""
    if config.endswith("-uvloop"):
        return config[: -len("-uvloop")], "uvloop"
    return config, "asyncio"


def make_runner(loop_kind: str) -> asyncio.Runner:
    """Return an ``asyncio.Runner`` on the default event loop or on uvloop."""
    if loop_kind == "uvloop":
        import uvloop

        return asyncio.Runner(loop_factory=uvloop.new_event_loop)
    return asyncio.Runner()


def selftest() -> list[str]:
    """Check that verification accepts legal orders and rejects illegal ones; return failures.

    For every shape: push order and a random legal order (a topological order of the
    dependency graph) must verify; swapping two conflicting ops, dropping an op and running
    everything in reverse must not.  Overlaps too: two consecutive ops that do not conflict
    may overlap (the later one runs while the earlier one is suspended in its coroutine body),
    two that conflict may not.  The programs of two ``generate`` calls must be identical.
    """
    problems: list[str] = []
    rng = random.Random(5)
    for shape in SHAPES:
        spec = WorkloadSpec(f"selftest/{shape}", shape, "noop", 300, n_vars=12, width=4)
        prog, n_vars = generate(spec)
        if generate(spec)[0] != prog:
            problems.append(f"{shape}: generate() is not deterministic")
        preds = _predecessors(prog, n_vars)

        def outcome(
            order: Sequence[int], spec: WorkloadSpec = spec, prog: Program = prog, nv: int = n_vars
        ) -> bool:
            check = Checker(spec, prog, nv)
            for i in order:
                check.body(i)
            return bool(check.verify()["verified"])

        n = len(prog)

        def legal(order: Sequence[int], preds: list[list[int]] = preds, n: int = n) -> bool:
            pos = {op: k for k, op in enumerate(order)}
            return len(pos) == n and all(pos[j] < pos[i] for i in range(n) for j in preds[i])

        orders: list[tuple[str, list[int]]] = [
            ("push order", list(range(n))),
            ("random legal order", _random_topological_order(preds, rng)),
            ("reverse order", list(range(n))[::-1]),
            ("one op dropped", list(range(n - 1))),
        ]
        conflict = next(((p, i) for i in range(n) for p in preds[i]), None)
        if conflict is not None:
            a, b = conflict
            swapped = list(range(n))
            swapped[a], swapped[b] = swapped[b], swapped[a]
            orders.append((f"conflicting ops {a} and {b} swapped", swapped))
        for label, order in orders:
            want = legal(order)
            if label.startswith("random legal") and not want:
                problems.append(f"{shape}: selftest bug, random order is not legal")
            if outcome(order) != want:
                problems.append(f"{shape}: {label} verified={not want}, expected {want}")
        # Consecutive ops a and a + 1 overlapping: the first pair of each kind of conflict.
        firsts: dict[str, int] = {}
        for a in range(n - 1):
            firsts.setdefault(_conflict(prog[a], prog[a + 1]), a)
        for kind, a in firsts.items():
            want = kind == "no conflict"
            if _overlapped(spec, prog, n_vars, a) != want:
                problems.append(
                    f"{shape}: ops {a} and {a + 1} overlapping ({kind}) verified={not want}, "
                    f"expected {want}"
                )
        if legal(orders[2][1]) or legal(orders[3][1]):
            problems.append(f"{shape}: selftest programs too weak (reverse order is legal)")
    return problems


def _conflict(first: Op, second: Op) -> str:
    """How two ops conflict on a var: ``write-read``, ``read-write``, ``write-write``, or
    ``no conflict`` (the first kind found, writes first)."""
    (r1, w1), (r2, w2) = first, second
    if set(w1) & set(w2):
        return "write-write"
    if set(w1) & set(r2):
        return "write-read"
    if set(r1) & set(w2):
        return "read-write"
    return "no conflict"


def _overlapped(spec: WorkloadSpec, prog: Program, n_vars: int, a: int) -> bool:
    """Run ``prog``'s coroutine bodies in push order, except that op ``a + 1`` runs whole
    while op ``a`` is suspended in its ``await``; return whether that verifies."""
    check = Checker(spec, prog, n_vars)

    def run(coro: Coroutine[Any, Any, None]) -> None:
        try:
            while True:
                coro.send(None)  # asyncio.sleep(0) yields once and needs no loop
        except StopIteration:
            pass

    for i in range(len(prog)):
        if i == a:
            first = check.cbody(a)
            first.send(None)  # started, suspended at its await
            run(check.cbody(a + 1))
            run(first)
        elif i != a + 1:
            run(check.cbody(i))
    return bool(check.verify()["verified"])


def _predecessors(prog: Program, n_vars: int) -> list[list[int]]:
    """Direct predecessors of each op under the engine rule (last writer / readers since)."""
    last_writer: list[int | None] = [None] * n_vars
    readers: list[list[int]] = [[] for _ in range(n_vars)]
    preds: list[list[int]] = []
    for i, (reads, writes) in enumerate(prog):
        p: set[int] = set()
        for v in reads:
            lw = last_writer[v]
            if lw is not None:
                p.add(lw)
            readers[v].append(i)
        for v in writes:
            lw = last_writer[v]
            if lw is not None:
                p.add(lw)
            p.update(readers[v])
            readers[v] = []
            last_writer[v] = i
        preds.append(sorted(p))
    return preds


def _random_topological_order(preds: list[list[int]], rng: random.Random) -> list[int]:
    succ: list[list[int]] = [[] for _ in preds]
    count = [len(p) for p in preds]
    for i, p in enumerate(preds):
        for j in p:
            succ[j].append(i)
    ready = [i for i, c in enumerate(count) if c == 0]
    order: list[int] = []
    while ready:
        i = ready.pop(rng.randrange(len(ready)))
        order.append(i)
        for j in succ[i]:
            count[j] -= 1
            if not count[j]:
                ready.append(j)
    return order
