"""The chaos soak: random programs with injected faults, checked against a sequential model.

A soak runs *rounds*; each round creates an Engine (threaded, or serial every fourth round) and
runs *epochs* on it. In an epoch the event loop (inside ``engine.bulk(n)`` in half of the
epochs) and ``PRODUCERS`` threads push random operations at the same time: sync, coroutine and
callback-style functions and pushes of pre-built operators, on random Vars, with random
properties, priorities and contexts (some sync operations go to two simulated GPUs, where they
release their Vars once enqueued and complete when their fence does, so CPU users of the same
Vars wait for fences). Faults are injected on the way: functions raise (or pass an exception to
``on_complete``) or are slow; operations are cancelled (from the loop and from producer
threads, before and while they run); Vars are deleted while threads push on them; operators are
deleted while threads push them; and the loop waits on random Vars, with and without a timeout.
An epoch ends with ``wait_for_all()``; a round ends with ``aclose()``, or with
``aclose(cancel=True)`` started while the producer threads are still pushing.

Every function records, when it runs, each Var's write counter as it saw it, and bumps the
counters of the Vars it mutates. After each epoch the soak checks:

* the sequential model: for each Var, in push order (recorded by an Instrument's ``on_push``,
  which the engine calls under its lock, so it is the engine's own order), every operation
  that ran saw exactly the number of writes that ran before it in push order (writers saw
  strictly increasing values; readers the count of writes pushed before them), a
  ``delete_var`` is the last user of its Var, and the counter equals the writes that ran;
* the exclusivity monitor (``tests/conftest.py``): no writer overlapped another user;
* nothing lost: every operation ended done, failed, skipped or cancelled, consistently with
  whether its function ran, and ``engine.pending`` is 0;
* throw-once: the failures thrown by ``wait_for_var``, ``wait_for_all`` and ``aclose`` are
  exactly the exceptions of the failed operations, each thrown once; every skipped operation
  names one of them as its cause.

Any violation raises ``AssertionError`` at once, naming the epoch and the seed.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import random
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import aioengine as ae
from aioengine.instrument import Instrument
from tests.conftest import Monitor

PRODUCERS = 3  # pushing threads, besides the event loop
VARS = 24  # live Vars per round (deleted ones are replaced)
OPS_PER_PRODUCER = 250  # pushes per producer (and by the loop) per epoch
EPOCHS_PER_ROUND = 10
WAIT_LIMIT = 60.0  # seconds: a wait that takes longer than this is reported as a hang

P_FAIL = 0.01
P_SLOW = 0.05
P_GPU = 0.15  # share of plain sync operations pushed to a simulated GPU instead
GPU_PROPS = (
    ae.FnProperty.NORMAL,
    ae.FnProperty.COPY_TO_GPU,
    ae.FnProperty.COPY_FROM_GPU,
    ae.FnProperty.GPU_PRIORITIZED,
)
P_CANCEL = 0.03
P_DELETE_VAR = 0.006
P_WAIT_VAR = 0.03
P_WAIT_TIMEOUT = 0.005
P_REPLACE_OPERATOR = 0.004

_REC: contextvars.ContextVar[Rec] = contextvars.ContextVar("soak_rec")


class Injected(Exception):
    """A fault injected by the soak (the engine never raises it by itself)."""


@dataclass(eq=False)
class Rec:
    """One push: what it names, what it was told to do, and what its function saw."""

    world: World
    name: str
    kind: str  # "sync", "coro", "callback" or "delete"
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    fail: str | None  # None, "raise" or "on_complete"
    slow: float  # seconds the function takes (0: fast)
    exc: Injected | None = None  # the exception it fails with, made up front (identity)
    order: int = -1  # position in the engine's push order (PushOrder.on_push)
    seen: dict[str, int] | None = None  # counters seen when it ran; None: it never ran
    op: ae.Operation[Any] | None = None
    cancel_returned_true: bool = False

    def start(self) -> None:
        """Enter the monitor, observe the counters and bump those of the mutated Vars."""
        world = self.world
        world.monitor.enter(self.name, self.reads, self.writes)
        counters = world.counters
        seen = {n: counters[n] for n in self.reads}
        for n in self.writes:
            seen[n] = counters[n]
            if self.kind != "delete":
                counters[n] = seen[n] + 1
        self.seen = seen

    def end(self) -> None:
        self.world.monitor.exit(self.reads, self.writes)


class PushOrder(Instrument):
    """Stamps each soak push with its position in the engine's push order (lock held)."""

    def __init__(self) -> None:
        self.count = 0

    def on_push(self, op: ae.Operation[Any]) -> None:
        rec = _REC.get(None)  # on_push runs on the pushing thread, in its context
        if rec is not None:
            rec.order = self.count
        self.count += 1


def sync_fn(rctx: ae.RunContext) -> str:
    rec = _REC.get()
    rec.start()
    try:
        if rctx.stream is not None:  # on the simulated GPU: device work after this returns
            rctx.launch(time.sleep, rec.slow)
        elif rec.slow:
            time.sleep(rec.slow)
        if rec.exc is not None:
            raise rec.exc
    finally:
        rec.end()
    return rec.name


async def coro_fn(rctx: ae.RunContext) -> str:
    rec = _REC.get()
    rec.start()
    try:
        await asyncio.sleep(rec.slow)  # yields at least once: a point to be cancelled at
        if rec.exc is not None:
            raise rec.exc
    finally:
        rec.end()
    return rec.name


def callback_fn(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
    rec = _REC.get()
    rec.start()
    if rec.fail == "raise":
        rec.end()
        assert rec.exc is not None
        raise rec.exc

    def complete() -> None:
        try:
            if rec.slow:
                time.sleep(rec.slow)
            rec.end()
            on_complete(rec.exc)
        except BaseException as exc:  # pragma: no cover - reported as a soak failure
            rec.world.errors.append(exc)

    if rec.slow:
        rec.world.completer.submit(complete)  # on_complete() from another thread, later
    else:
        complete()


FNS: dict[str, Callable[..., Any]] = {"sync": sync_fn, "coro": coro_fn, "callback": callback_fn}


@dataclass(eq=False)
class Handle:
    """A pre-built operator and what its pushes name."""

    handle: ae.OprHandle[Any]
    kind: str
    reads: tuple[ae.Var, ...]
    writes: tuple[ae.Var, ...]
    slow_ok: bool


class EngineClosing(Exception):
    """A producer found the engine closing (a round ending with ``aclose(cancel=True)``)."""


@dataclass(eq=False)
class World:
    """Everything one soak shares between the loop, the producers and the functions."""

    seed: int
    monitor: Monitor
    completer: ThreadPoolExecutor
    engine: ae.Engine = field(init=False)
    order: PushOrder = field(init=False)
    counters: dict[str, int] = field(default_factory=dict)
    vars: list[ae.Var] = field(default_factory=list)
    handles: list[Handle] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    thrown: list[BaseException] = field(default_factory=list)  # failures raised by waits
    stats: Counter[str] = field(default_factory=Counter)
    var_count: int = 0
    op_count: int = 0
    epoch: int = 0

    def new_var(self) -> ae.Var:
        self.var_count += 1
        v = self.engine.new_var(f"v{self.var_count}")
        self.counters[v.name] = 0
        return v

    def fail(self, message: str) -> None:
        raise AssertionError(f"soak seed={self.seed} epoch={self.epoch}: {message}")


def _pick_vars(rng: random.Random, pool: list[ae.Var]) -> tuple[list[ae.Var], list[ae.Var]]:
    chosen = rng.sample(pool, rng.randint(0, 4))
    n_writes = rng.randint(0, min(2, len(chosen)))
    return chosen[n_writes:], chosen[:n_writes]


def new_handle(world: World, rng: random.Random) -> Handle:
    """Build an operator on random Vars, of a random kind."""
    kind = rng.choice(["sync", "sync", "coro", "callback"])
    reads, writes = _pick_vars(rng, world.vars)
    prop = ae.FnProperty.NO_SKIP if rng.random() < 0.1 else ae.FnProperty.NORMAL
    inline = kind == "sync" and rng.random() < 0.2
    if inline:
        prop = ae.FnProperty.ASYNC
    handle = world.engine.new_operator(
        FNS[kind], reads, writes, prop=prop, name=f"handle-{kind}", is_async=kind != "sync"
    )
    return Handle(handle, kind, tuple(reads), tuple(writes), slow_ok=not inline)


def push_one(world: World, rng: random.Random, stats: Counter[str], mine: list[Rec]) -> None:
    """Push one random operation (from the loop or a producer thread) and maybe cancel one.

    Raises:
        EngineClosing: if the engine is closing.
    """
    engine = world.engine
    kind = rng.choices(("sync", "coro", "callback", "handle"), (45, 20, 20, 15))[0]
    handle: Handle | None = None
    prop = ae.FnProperty.NORMAL
    slow_ok = True
    if kind == "handle" and world.handles:
        handle = rng.choice(world.handles)
        kind, reads, writes, slow_ok = handle.kind, handle.reads, handle.writes, handle.slow_ok
    else:
        kind = "sync" if kind == "handle" else kind
        r, w = _pick_vars(rng, world.vars)
        reads, writes = tuple(r), tuple(w)
        roll = rng.random()
        if roll < 0.05:
            prop = ae.FnProperty.NO_SKIP
        elif roll < 0.10 and kind != "coro":
            prop = ae.FnProperty.CPU_PRIORITIZED
        elif roll < 0.15 and kind == "sync":
            prop = ae.FnProperty.ASYNC  # inline on the loop thread: never slow
            slow_ok = False
    fail = None
    if rng.random() < P_FAIL:
        fail = rng.choice(("raise", "on_complete")) if kind == "callback" else "raise"
    slow = rng.uniform(0.0005, 0.003) if slow_ok and rng.random() < P_SLOW else 0.0
    world.op_count += 1  # approximate across threads; names only need to be readable
    rec = Rec(
        world,
        f"{kind}#{world.op_count}",
        kind,
        tuple(v.name for v in reads),
        tuple(v.name for v in writes),
        fail,
        slow,
    )
    if fail is not None:
        rec.exc = Injected(rec.name)
    ctx = ae.cpu(rng.randint(0, 1))
    if (
        handle is None
        and kind == "sync"
        and prop is not ae.FnProperty.ASYNC
        and rng.random() < P_GPU
    ):
        # A GPU operation: released once enqueued, completed when its fence is.
        ctx = ae.gpu(rng.randint(0, 1))
        if prop is not ae.FnProperty.NO_SKIP:
            prop = rng.choice(GPU_PROPS)
        stats["gpu ops"] += 1
    priority = rng.randint(-2, 2)
    token = _REC.set(rec)
    try:
        if handle is not None:
            op: ae.Operation[Any] = engine.push(handle.handle, ctx, priority=priority)
            stats["operator pushes"] += 1
        elif kind == "sync":
            op = engine.push_sync(
                sync_fn, ctx, reads, writes, prop=prop, priority=priority, name=rec.name
            )
        else:
            op = engine.push_async(
                FNS[kind], ctx, reads, writes, prop=prop, priority=priority, name=rec.name
            )
    except ae.VarDeletedError:
        stats["pushes refused: deleted Var"] += 1
        return
    except ae.OperatorDeletedError:
        stats["pushes refused: deleted operator"] += 1
        return
    except ae.EngineClosedError:
        stats["pushes refused: engine closing"] += 1
        raise EngineClosing from None
    finally:
        _REC.reset(token)
    rec.op = op
    mine.append(rec)
    if op.segment is not None:  # an engine.bulk() scope grouped it (loop_producer)
        stats["ops grouped in bulk segments"] += 1
    if rng.random() < P_CANCEL:
        victim = rng.choice(mine[-50:])
        assert victim.op is not None
        if victim.op.cancel():
            victim.cancel_returned_true = True
            stats["cancel() -> True"] += 1
        else:
            stats["cancel() -> False (running or finished)"] += 1


def thread_producer(world: World, seed: int, mine: list[Rec], stats: Counter[str]) -> None:
    """A producer thread: push random operations until done or the engine closes."""
    rng = random.Random(seed)
    try:
        for _ in range(OPS_PER_PRODUCER):
            push_one(world, rng, stats, mine)
    except EngineClosing:
        pass


async def loop_producer(
    world: World, rng: random.Random, mine: list[Rec], stats: Counter[str]
) -> None:
    """The loop's producer: pushes, deletes Vars and operators, and waits on Vars.

    In half of the epochs it pushes inside ``engine.bulk(n)``: its inline operations (and,
    in serial rounds, its CPU sync ones) then run in segments while the threads push too.
    """
    engine = world.engine
    size = rng.choice((2, 8, 64)) if rng.random() < 0.5 else 1
    if size > 1:
        stats[f"epochs in bulk({size})"] += 1
    try:
        with engine.bulk(size):
            await _loop_pushes(world, rng, mine, stats)
    except EngineClosing:
        pass


async def _loop_pushes(
    world: World, rng: random.Random, mine: list[Rec], stats: Counter[str]
) -> None:
    engine = world.engine
    for i in range(OPS_PER_PRODUCER):
        push_one(world, rng, stats, mine)
        if rng.random() < P_DELETE_VAR:
            delete_one(world, rng, mine)
            stats["delete_var"] += 1
        if rng.random() < P_REPLACE_OPERATOR and world.handles:
            j = rng.randrange(len(world.handles))
            engine.delete_operator(world.handles[j].handle)
            world.handles[j] = new_handle(world, rng)
            stats["delete_operator"] += 1
        roll = rng.random()
        if roll < P_WAIT_VAR + P_WAIT_TIMEOUT:
            timeout = 0.0002 if roll < P_WAIT_TIMEOUT else WAIT_LIMIT
            try:
                await engine.wait_for_var(rng.choice(world.vars), timeout=timeout)
                stats["wait_for_var"] += 1
            except Injected as exc:
                world.thrown.append(exc)
                stats["wait_for_var"] += 1
            except TimeoutError:
                if timeout == WAIT_LIMIT:
                    world.fail(f"wait_for_var hung: {engine!r}")
                stats["wait_for_var timeouts"] += 1
        elif i % 16 == 0:
            await asyncio.sleep(0)  # let coroutine operations and wake-ups run


def delete_one(world: World, rng: random.Random, mine: list[Rec]) -> None:
    """Delete a random Var (its delete_fn may fail) and replace it with a new one."""
    i = rng.randrange(len(world.vars))
    v = world.vars[i]
    fail = "raise" if rng.random() < 0.1 else None
    rec = Rec(world, f"delete#{v.name}", "delete", (), (v.name,), fail, 0.0)
    if fail:
        rec.exc = Injected(rec.name)
    token = _REC.set(rec)
    try:
        op = world.engine.delete_var(v, sync_fn, ae.cpu(rng.randint(0, 1)))
    except ae.EngineClosedError:
        raise EngineClosing from None
    finally:
        _REC.reset(token)
    rec.op = op
    mine.append(rec)
    world.vars[i] = world.new_var()
    for j, h in enumerate(world.handles):  # retire the operators that name it
        if v in h.reads or v in h.writes:
            world.engine.delete_operator(h.handle)
            world.handles[j] = new_handle(world, rng)


async def run_epoch(world: World, rng: random.Random, close: str | None) -> int:
    """Run one epoch; end it with wait_for_all (close=None) or by closing the engine.

    Returns the number of operations pushed.
    """
    engine = world.engine
    base = dict(world.counters)
    world.thrown = []
    recs: list[list[Rec]] = [[] for _ in range(PRODUCERS + 1)]
    stats: list[Counter[str]] = [Counter() for _ in range(PRODUCERS + 1)]
    threads = asyncio.gather(
        *(
            asyncio.to_thread(thread_producer, world, rng.getrandbits(32), recs[i], stats[i])
            for i in range(PRODUCERS)
        )
    )
    await loop_producer(world, rng, recs[PRODUCERS], stats[PRODUCERS])
    try:
        async with asyncio.timeout(WAIT_LIMIT):
            if close == "aclose-cancel":
                # Start closing while the threads may still push: they must be refused.
                closing = asyncio.ensure_future(engine.aclose(cancel=True))
                await threads
                await _collect(world, closing)
            else:
                await threads
                await _collect(world, engine.aclose() if close else engine.wait_for_all())
    except TimeoutError:
        world.fail(f"hang: {engine!r} did not drain within {WAIT_LIMIT} s")
    if world.errors:
        world.fail(f"errors in completer threads: {world.errors!r}")
    if engine.pending:
        world.fail(f"{engine!r} still has pending operations after draining")
    if close and not engine.closed:
        world.fail(f"{engine!r} is not closed after aclose()")
    all_recs = [rec for mine in recs for rec in mine]
    check(world, all_recs, base)
    for s in stats:
        world.stats.update(s)
    return len(all_recs)


async def _collect(world: World, waiting: Any) -> None:
    """Await wait_for_all()/aclose(); keep the failures it raises (all must be injected)."""
    try:
        await waiting
    except BaseExceptionGroup as group:
        for exc in group.exceptions:
            if not isinstance(exc, Injected):
                world.fail(f"unexpected failure {exc!r} from the engine")
            world.thrown.append(exc)


def check(world: World, recs: list[Rec], base: dict[str, int]) -> None:
    """Check an epoch's operations: outcomes, the sequential model, the monitor, throw-once."""
    stats = world.stats
    failed: dict[int, Injected] = {}
    skipped_causes: list[BaseException | None] = []
    by_var: dict[str, list[Rec]] = {}
    for rec in recs:
        op = rec.op
        assert op is not None
        if not op.done():
            world.fail(f"{op!r} never finished (lost)")
        if rec.order < 0:
            world.fail(f"{rec.name} was pushed but the engine never reported the push")
        ran = rec.seen is not None
        if op.cancelled():
            if ran and rec.kind != "coro":
                world.fail(f"{rec.name} ran, yet reports cancelled")
            stats["ops cancelled while running" if ran else "ops cancelled before start"] += 1
        else:
            exc = op.exception()
            if rec.cancel_returned_true and not (rec.kind == "coro" and ran):
                world.fail(f"{rec.name}: cancel() returned True but it ended {op!r}")
            if exc is None:
                if not ran or rec.exc is not None:
                    world.fail(f"{rec.name} reports done but ran={ran} fail={rec.fail}")
                stats["ops done"] += 1
            elif isinstance(exc, ae.DependencyError):
                if ran:
                    world.fail(f"{rec.name} ran, yet reports skipped")
                skipped_causes.append(exc.__cause__)
                stats["ops skipped (input failed)"] += 1
            elif isinstance(exc, Injected):
                if exc is not rec.exc or not ran:
                    world.fail(f"{rec.name} failed with {exc!r}, not its own injected fault")
                failed[id(exc)] = exc
                stats[f"faults injected: {rec.kind} {rec.fail}"] += 1
            else:
                world.fail(f"{rec.name} failed with unexpected {exc!r}")
        if rec.slow and ran:
            stats["slow ops"] += 1
        for n in (*rec.reads, *rec.writes):
            by_var.setdefault(n, []).append(rec)
    # Throw-once: every failure is thrown exactly once, and nothing else is.
    thrown_ids = [id(e) for e in world.thrown]
    if len(set(thrown_ids)) != len(thrown_ids):
        world.fail("a failure was thrown twice")
    if set(thrown_ids) != set(failed):
        lost = [e for i, e in failed.items() if i not in thrown_ids]
        world.fail(f"failures thrown {world.thrown!r} != failures recorded; never thrown: {lost}")
    for cause in skipped_causes:
        if cause is None or id(cause) not in failed:
            world.fail(f"a skipped op's cause {cause!r} is not a failure of this epoch")
    stats["failures thrown once"] += len(thrown_ids)
    # The sequential model, per Var, in push order.
    for n, users in by_var.items():
        users.sort(key=lambda r: r.order)
        expected = base.get(n, 0)
        for i, rec in enumerate(users):
            # A delete_var cancelled before it ran did not happen: the Var stays usable, so a
            # producer thread that picked it before it was replaced may still push on it.
            undone = rec.seen is None and rec.op is not None and rec.op.cancelled()
            if rec.kind == "delete" and i != len(users) - 1 and not undone:
                world.fail(
                    f"{users[i + 1].name} was pushed on {n} after its delete_var ({rec.op!r})"
                )
            if rec.seen is not None:
                if rec.seen[n] != expected:
                    trace = [(r.name, r.seen and r.seen.get(n)) for r in users]
                    world.fail(f"{rec.name} saw {n}={rec.seen[n]}, model says {expected}: {trace}")
                if n in rec.writes and rec.kind != "delete":
                    expected += 1
        if world.counters[n] != expected:
            world.fail(f"{n}: counter {world.counters[n]} != {expected} writes that ran")
    if world.monitor.violations:
        world.fail(f"exclusivity violated: {world.monitor.violations[:5]}")


def _rss() -> int | None:
    """Resident set size in bytes (Linux), else None."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


@dataclass
class SoakReport:
    """What a soak did and survived."""

    loop: str
    seconds: float
    ops: int
    rounds: int
    epochs: int
    faults: Counter[str]
    rss_after_first_round: int | None
    rss_end: int | None

    @property
    def ops_per_s(self) -> float:
        return self.ops / self.seconds if self.seconds else 0.0

    @property
    def rss_growth(self) -> int | None:
        if self.rss_end is None or self.rss_after_first_round is None:
            return None
        return self.rss_end - self.rss_after_first_round

    def summary(self) -> str:
        lines = [
            f"chaos soak on {self.loop}: {self.ops} ops in {self.seconds:.1f} s "
            f"({self.ops_per_s:,.0f} ops/s), {self.rounds} engines, {self.epochs} epochs",
        ]
        if self.rss_growth is not None:
            lines.append(f"  RSS growth after the first engine: {self.rss_growth / 2**20:+.1f} MiB")
        lines += [f"  {count:>8}  {name}" for name, count in sorted(self.faults.items())]
        return "\n".join(lines)


async def soak(seconds: float, seed: int, loop_name: str = "asyncio") -> SoakReport:
    """Run the chaos soak for about ``seconds`` on the running loop; raise on a violation."""
    rng = random.Random(seed)
    deadline = time.monotonic() + seconds
    start = time.monotonic()
    ops = rounds = epochs = 0
    rss_first: int | None = None
    with ThreadPoolExecutor(2, thread_name_prefix="soak-completer") as completer:
        world = World(seed, Monitor(), completer)
        while True:
            serial = rounds % 4 == 3
            world.engine = ae.Engine(
                cpu_workers=2,
                cpu_priority_workers=1,
                serial=serial,
                gpu_backend=ae.SimulatedGPU(devices=2, seed=rng.randrange(2**32)),
            )
            world.order = PushOrder()
            world.engine.add_instrument(world.order)
            world.vars = [world.new_var() for _ in range(VARS)]
            world.handles = [new_handle(world, rng) for _ in range(6)]
            close_mode = "aclose-cancel" if rounds % 2 else "aclose"
            try:
                for e in range(EPOCHS_PER_ROUND):
                    last = e == EPOCHS_PER_ROUND - 1 or time.monotonic() >= deadline
                    world.epoch = epochs
                    ops += await run_epoch(world, rng, close_mode if last else None)
                    epochs += 1
                    if last:
                        break
            finally:
                # After a violation too: an engine left open would warn (ResourceWarning,
                # an error under pytest) in whichever later test the collector frees it.
                if not world.engine.closed:
                    with contextlib.suppress(Exception):  # the failures it throws: Injected
                        await world.engine.aclose(cancel=True, timeout=WAIT_LIMIT)
            world.stats["serial engines" if serial else "threaded engines"] += 1
            world.stats[f"rounds ended by {close_mode}"] += 1
            rounds += 1
            if rounds == 1:
                rss_first = _rss()
            if time.monotonic() >= deadline:
                break
    return SoakReport(
        loop_name,
        time.monotonic() - start,
        ops,
        rounds,
        epochs,
        world.stats,
        rss_first,
        _rss(),
    )


def run(seconds: float, seed: int, loop_name: str = "asyncio") -> SoakReport:
    """Run :func:`soak` on a fresh loop of kind ``loop_name`` ("asyncio" or "uvloop")."""
    factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
    if loop_name == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(soak(seconds, seed, loop_name))


def default_seconds() -> float:
    """``AIOENGINE_SOAK_SECONDS`` (the CI-sized run's total over both loops), default 40."""
    raw = os.environ.get("AIOENGINE_SOAK_SECONDS", "").strip()
    try:
        value = float(raw) if raw else 40.0
    except ValueError:
        raise ValueError(f"AIOENGINE_SOAK_SECONDS={raw!r} is not a number of seconds") from None
    return value
