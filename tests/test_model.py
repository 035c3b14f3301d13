"""Random programs against a sequential reference model (hypothesis).

A program is a list of *segments*. Each segment starts with a blocker (a ``NO_SKIP`` coroutine
that mutates every Var and waits on an ``asyncio.Event``), then pushes random operations: sync
(``push_sync``, or ``new_operator`` + ``push`` + ``delete_operator``), coroutine
(``push_async`` with ``async def``) or callback-style (``push_async`` with
``def fn(rctx, on_complete)``, completed inline or from a thread), with random read and write
sets (duplicates and a Var in both lists included), priorities and properties; some raise,
some are cancelled right after the push (they cannot have started: the blocker holds every
Var); some programs push them inside ``engine.bulk(n)``, which groups the inline ones into
bulk segments without changing any outcome. Then the blocker is released and the segment may
end with a wait: ``wait_for_var`` after the operations pushed so far finished,
``wait_for_var`` while they still run (only on a Var that the model says carries no failure,
the one case where throw-once clearing cannot race with operations still pending), or
``wait_for_all``.

The reference model applies the operations one at a time in push order with MXNet's failure
semantics (issue 2): a fn that raises records its exception on the Vars it mutates; a later
operation that reads or mutates such a Var is skipped (``DependencyError`` whose ``__cause__``
is the exception, its own mutated Vars record it too) unless it is ``NO_SKIP``; waits throw a
failure once and clear it everywhere; a cancelled operation never runs and records nothing.

Every operation body records its reads (the writer each Var's value came from) and enters an
exclusivity monitor; the test asserts each Operation's outcome, every body's reads, final Var
values and versions, what every wait raised, and that the monitor saw no overlap.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

import aioengine as ae

from .helpers import Boom, Outcome, SequentialModel

INITIAL = "init"  # the value every Var starts with; a write stores the writer's name


class Kind(enum.Enum):
    SYNC = "sync"  # push_sync
    CORO = "coro"  # push_async(async def)
    CB_INLINE = "cb-inline"  # push_async(def fn(rctx, on_complete)), completed inside fn
    CB_THREAD = "cb-thread"  # the same, completed from a thread fn starts
    HANDLE = "handle"  # a sync fn through new_operator + push, deleted right after the push


class WaitKind(enum.Enum):
    VAR_DRAINED = "wait_for_var after every op finished"
    VAR_CONCURRENT = "wait_for_var while ops run"
    ALL = "wait_for_all"


@dataclass(frozen=True)
class OpSpec:
    name: str
    kind: Kind
    const: tuple[int, ...]  # as pushed: may hold duplicates and Vars also in ``mutate``
    mutate: tuple[int, ...]
    prop: ae.FnProperty
    priority: int
    raises: bool
    cancel: bool
    yields: int  # awaits of asyncio.sleep(0) in a coroutine body
    blocker: bool = False

    def var_sets(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The deduplicated (reads, writes) the engine uses: a Var in both lists is written."""
        writes = tuple(dict.fromkeys(self.mutate))
        reads = tuple(v for v in dict.fromkeys(self.const) if v not in writes)
        return reads, writes


@dataclass(frozen=True)
class WaitSpec:
    kind: WaitKind
    var: int


@dataclass(frozen=True)
class Segment:
    blocker: OpSpec
    ops: tuple[OpSpec, ...]
    wait: WaitSpec | None


@dataclass(frozen=True)
class Program:
    n_vars: int
    segments: tuple[Segment, ...]
    # Push each segment's operations inside ``engine.bulk(bulk)`` (0: not at all). Bulk
    # segments change how operations are scheduled, never what the model predicts.
    bulk: int = 0


_PROPS = (
    ae.FnProperty.NORMAL,
    ae.FnProperty.NORMAL,
    ae.FnProperty.NORMAL,
    ae.FnProperty.NO_SKIP,
    ae.FnProperty.ASYNC,
    ae.FnProperty.CPU_PRIORITIZED,
    ae.FnProperty.COPY_TO_GPU,
)


@st.composite
def programs(draw: st.DrawFn) -> Program:
    n_vars = draw(st.integers(1, 4))
    var = st.integers(0, n_vars - 1)
    segments = []
    count = 0
    for s in range(draw(st.integers(1, 3))):
        blocker = OpSpec(
            name=f"blocker{s}",
            kind=Kind.CORO,
            const=(),
            mutate=tuple(range(n_vars)),
            prop=ae.FnProperty.NO_SKIP,
            priority=0,
            raises=False,
            cancel=False,
            yields=0,
            blocker=True,
        )
        ops = []
        for _ in range(draw(st.integers(0, 7))):
            const = tuple(draw(st.lists(var, max_size=3)))
            mutate = tuple(draw(st.lists(var, max_size=3)))
            cancel = draw(st.integers(0, 5)) == 0
            if cancel and not const and not mutate:
                const = (0,)  # an op with no Var could start before cancel(); give it one
            ops.append(
                OpSpec(
                    name=f"op{count}",
                    kind=draw(st.sampled_from(Kind)),
                    const=const,
                    mutate=mutate,
                    prop=draw(st.sampled_from(_PROPS)),
                    priority=draw(st.integers(-2, 2)),
                    raises=draw(st.integers(0, 4)) == 0,
                    cancel=cancel,
                    yields=draw(st.integers(0, 3)),
                )
            )
            count += 1
        wait_kind = draw(st.sampled_from((None, *WaitKind)))
        wait = WaitSpec(wait_kind, draw(var)) if wait_kind is not None else None
        segments.append(Segment(blocker, tuple(ops), wait))
    return Program(n_vars, tuple(segments), draw(st.sampled_from((0, 0, 1, 2, 3, 8))))


# -- the sequential reference model ---------------------------------------------------------


@dataclass
class Expected:
    """What the model predicts. Failures are named by the op whose fn raised them."""

    outcome: dict[str, tuple[Outcome, str | None]] = field(default_factory=dict)
    reads: dict[str, tuple[tuple[int, str], ...]] = field(default_factory=dict)
    values: list[str] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    # Failures each drained wait raised (a concurrent one raises nothing).
    waits: list[tuple[str, ...]] = field(default_factory=list)
    final_wait_for_all: tuple[str, ...] = ()
    # Segment index -> the wait spec actually used: a concurrent wait goes to the first Var
    # from its own on that carries no failure, or runs drained if every Var carries one (its
    # clearing would race with operations still pending).
    wait_plan: list[WaitSpec | None] = field(default_factory=list)


def model(program: Program) -> Expected:
    """What ``program`` must do: its operations through the shared :class:`SequentialModel`
    (helpers.py), in push order, with the waits of its segments."""
    exp = Expected(values=[INITIAL] * program.n_vars)
    seq = SequentialModel()

    def name(failure: object) -> str:
        assert isinstance(failure, Boom), failure
        return str(failure.args[0])

    for segment in program.segments:
        for spec in (segment.blocker, *segment.ops):
            reads, writes = spec.var_sets()

            def body(spec: OpSpec = spec, used: tuple[int, ...] = (*reads, *writes)) -> None:
                exp.reads[spec.name] = tuple((v, exp.values[v]) for v in sorted(used))
                if spec.raises:
                    raise Boom(spec.name)
                for v in spec.var_sets()[1]:
                    exp.values[v] = spec.name

            outcome, detail = seq.push(
                body,
                reads,
                writes,
                no_skip=spec.prop is ae.FnProperty.NO_SKIP,
                cancelled=spec.cancel,
            )
            failed = outcome in (Outcome.FAILED, Outcome.SKIPPED)
            exp.outcome[spec.name] = (outcome, name(detail) if failed else None)
        wait = segment.wait
        if wait is not None and wait.kind is WaitKind.VAR_CONCURRENT:
            n = program.n_vars
            clean = [v for v in ((wait.var + i) % n for i in range(n)) if not seq.carries(v)]
            kind = WaitKind.VAR_CONCURRENT if clean else WaitKind.VAR_DRAINED
            wait = WaitSpec(kind, clean[0] if clean else wait.var)
        exp.wait_plan.append(wait)
        if wait is None or wait.kind is WaitKind.VAR_CONCURRENT:
            continue  # a concurrent wait raises nothing (run_program asserts it)
        thrown = seq.wait_for_all() if wait.kind is WaitKind.ALL else seq.wait_for_var(wait.var)
        exp.waits.append(tuple(map(name, thrown)))
    exp.final_wait_for_all = tuple(map(name, seq.failures))
    exp.versions = [seq.version(v) for v in range(program.n_vars)]
    return exp


# -- running a program on the engine --------------------------------------------------------


class Runner:
    """Builds the operation bodies of a program and pushes them on an engine."""

    def __init__(self, engine: ae.Engine, program: Program, monitor: Any) -> None:
        self.engine = engine
        self.monitor = monitor
        self.vars = [engine.new_var(f"v{i}") for i in range(program.n_vars)]
        self.values = [INITIAL] * program.n_vars
        self.reads: dict[str, tuple[tuple[int, str], ...]] = {}
        self.raised: dict[str, Boom] = {}
        self.threads: list[threading.Thread] = []
        self.ops: dict[str, ae.Operation[Any]] = {}
        self.specs: dict[str, OpSpec] = {}

    def _enter(self, spec: OpSpec) -> None:
        reads, writes = spec.var_sets()
        self.monitor.enter(spec.name, reads, writes)
        self.reads[spec.name] = tuple((v, self.values[v]) for v in sorted((*reads, *writes)))

    def _exit(self, spec: OpSpec) -> Boom | None:
        """Write (or fail) and leave the monitor; return the exception to fail with."""
        reads, writes = spec.var_sets()
        exc = None
        if spec.raises:
            exc = self.raised[spec.name] = Boom(spec.name)
        else:
            for v in writes:
                self.values[v] = spec.name
        self.monitor.exit(reads, writes)
        return exc

    def push(self, spec: OpSpec, gate: asyncio.Event | None = None) -> ae.Operation[Any]:
        const = [self.vars[i] for i in spec.const]
        mutate = [self.vars[i] for i in spec.mutate]
        kw: dict[str, Any] = {"prop": spec.prop, "priority": spec.priority, "name": spec.name}
        op: ae.Operation[Any]
        if spec.kind in (Kind.SYNC, Kind.HANDLE):

            def sync_fn(rctx: ae.RunContext) -> str:
                self._enter(spec)
                exc = self._exit(spec)
                if exc is not None:
                    raise exc
                return spec.name

            if spec.kind is Kind.SYNC:
                op = self.engine.push_sync(sync_fn, ae.cpu(), const, mutate, **kw)
            else:
                handle = self.engine.new_operator(
                    sync_fn, const, mutate, prop=spec.prop, name=spec.name
                )
                op = self.engine.push(handle, ae.cpu(), priority=spec.priority)
                self.engine.delete_operator(handle)  # the push made already still runs
        elif spec.kind is Kind.CORO:

            async def coro_fn(rctx: ae.RunContext) -> str:
                self._enter(spec)
                if gate is not None:
                    await gate.wait()
                for _ in range(spec.yields):
                    await asyncio.sleep(0)
                exc = self._exit(spec)
                if exc is not None:
                    raise exc
                return spec.name

            op = self.engine.push_async(coro_fn, ae.cpu(), const, mutate, **kw)
        else:

            def complete(on_complete: ae.OnComplete) -> None:
                on_complete(self._exit(spec))

            def callback_fn(rctx: ae.RunContext, on_complete: ae.OnComplete) -> None:
                self._enter(spec)
                if spec.kind is Kind.CB_INLINE:
                    complete(on_complete)
                else:
                    thread = threading.Thread(target=complete, args=(on_complete,))
                    self.threads.append(thread)
                    thread.start()

            op = self.engine.push_async(callback_fn, ae.cpu(), const, mutate, **kw)
        self.ops[spec.name] = op
        self.specs[spec.name] = spec
        return op

    async def settle(self) -> None:
        """Wait until every operation pushed so far has finished (raising nothing)."""
        loop = asyncio.get_running_loop()
        for op in list(self.ops.values()):
            if not op.done():
                finished: asyncio.Future[None] = loop.create_future()

                def wake(_op: ae.Operation[Any], f: asyncio.Future[None] = finished) -> None:
                    if not f.done():
                        f.set_result(None)

                op.add_done_callback(wake)
                await finished

    def check_invariants(self) -> None:
        for var in self.vars:
            var._check_invariants()
        self.engine._core.validate_state()  # the scheduler's own state (scheduler.py)


async def raised_by(wait: Callable[[], Any]) -> tuple[BaseException, ...]:
    """Await ``wait()``; return what it raised, flattened (an ExceptionGroup's members)."""
    try:
        await wait()
    except ExceptionGroup as group:
        caught: BaseException = group
    except Boom as exc:
        return (exc,)
    else:
        return ()
    assert isinstance(caught, ExceptionGroup)
    assert caught.message == "unhandled errors in aioengine.Engine"
    return tuple(caught.exceptions)


async def run_program(
    engine: ae.Engine, program: Program, exp: Expected, monitor: Any
) -> tuple[Runner, list[tuple[BaseException, ...]], tuple[BaseException, ...]]:
    runner = Runner(engine, program, monitor)
    waits: list[tuple[BaseException, ...]] = []
    concurrent: list[asyncio.Task[tuple[BaseException, ...]]] = []
    for segment, wait in zip(program.segments, exp.wait_plan, strict=True):
        gate = asyncio.Event()
        runner.push(segment.blocker, gate)
        with engine.bulk(program.bulk) if program.bulk else contextlib.nullcontext():
            for spec in segment.ops:
                op = runner.push(spec)
                if spec.cancel:
                    assert op.cancel() is True, op
                    assert op.cancelled(), op
        gate.set()
        if wait is None:
            continue
        if wait.kind is WaitKind.VAR_CONCURRENT:
            # Every op pushed so far that reads or mutates the Var must be done on return.
            users = [
                op
                for name, op in runner.ops.items()
                if wait.var in (*runner.specs[name].const, *runner.specs[name].mutate)
            ]
            queued = asyncio.Event()

            async def wait_for(
                var: ae.Var = runner.vars[wait.var],
                queued: asyncio.Event = queued,
                users: list[ae.Operation[Any]] = users,
            ) -> None:
                queued.set()  # runs before wait_for_var queues its marker, then suspends
                await engine.wait_for_var(var)
                assert [op for op in users if not op.done()] == []

            task = asyncio.ensure_future(raised_by(wait_for))
            await queued.wait()
            concurrent.append(task)
            continue
        await runner.settle()
        runner.check_invariants()
        if wait.kind is WaitKind.ALL:
            waits.append(await raised_by(engine.wait_for_all))
        else:
            wait_for_var = functools.partial(engine.wait_for_var, runner.vars[wait.var])
            waits.append(await raised_by(wait_for_var))
    for task in concurrent:
        assert await task == ()
    final = await raised_by(engine.wait_for_all)
    assert await raised_by(engine.wait_for_all) == ()  # thrown once
    for thread in runner.threads:
        thread.join()
    runner.check_invariants()
    assert engine.pending == 0
    assert monitor.violations == []
    return runner, waits, final


def outcome_of(
    op: ae.Operation[Any], spec: OpSpec, raised: dict[str, Boom]
) -> tuple[Outcome, str | None]:
    """Name ``op``'s outcome as the model does (failures by the op that raised them)."""
    assert op.done(), op
    assert op.name == spec.name
    if op.cancelled():
        return Outcome.CANCELLED, None
    exc = op.exception()
    if exc is None:
        # A callback-style fn completes with on_complete(), which carries no value.
        returns = spec.kind in (Kind.SYNC, Kind.CORO, Kind.HANDLE)
        assert op.result() == (spec.name if returns else None)
        return Outcome.DONE, None
    if isinstance(exc, ae.DependencyError):
        cause = exc.__cause__
        assert isinstance(cause, Boom), exc
        assert raised[cause.args[0]] is cause  # the very exception the failing fn raised
        return Outcome.SKIPPED, cause.args[0]
    assert isinstance(exc, Boom), exc
    assert raised[op.name] is exc
    return Outcome.FAILED, op.name


def names(excs: Sequence[BaseException], raised: dict[str, Boom]) -> list[str]:
    out = []
    for exc in excs:
        assert isinstance(exc, Boom), exc
        assert raised[exc.args[0]] is exc
        out.append(exc.args[0])
    return out


# The number of examples and the seed come from the loaded profile (tests/conftest.py):
# the same 100 programs in CI; ``nox -s fuzz`` draws new ones.
_SETTINGS = settings(
    # ``monitor`` is only used for its type: each example builds a fresh Monitor.
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def _blocker(name: str) -> OpSpec:
    return OpSpec(name, Kind.CORO, (), (0, 1), ae.FnProperty.NO_SKIP, 0, False, False, 0, True)


# Found by random seeds: op0's failure reaches var 0 only through blocker1, pushed after the
# concurrent wait on var 0, which must not throw it (it did when the wait read the Var's
# failure on resuming instead of at its turn).
_LATER_FAILURE = Program(
    n_vars=2,
    segments=(
        Segment(
            _blocker("blocker0"),
            (
                OpSpec("op0", Kind.SYNC, (0,), (1,), ae.FnProperty.NORMAL, 0, True, False, 0),
                OpSpec("op1", Kind.CB_THREAD, (), (0,), ae.FnProperty.ASYNC, 0, False, False, 0),
            ),
            WaitSpec(WaitKind.VAR_CONCURRENT, 0),
        ),
        Segment(_blocker("blocker1"), (), None),
    ),
)


class TestAgainstSequentialModel:
    @pytest.mark.parametrize(
        "serial", [pytest.param(False, id="threaded"), pytest.param(True, id="serial")]
    )
    @_SETTINGS
    @given(program=programs())
    @example(program=_LATER_FAILURE)
    async def test_random_program_matches_model(
        self, serial: bool, monitor: Any, program: Program
    ) -> None:
        exp = model(program)
        for outcome in sorted({o.value for o, _ in exp.outcome.values()}):
            event(f"has {outcome} ops")
        for wait in exp.wait_plan:
            event(f"wait: {wait.kind.value if wait else None}")
        event(f"bulk size {program.bulk}")
        engine = ae.Engine(cpu_workers=2, cpu_priority_workers=1, serial=serial)
        try:
            runner, waits, final = await run_program(engine, program, exp, type(monitor)())
        finally:
            if not engine.closed:
                await engine.aclose(cancel=True)

        outcomes = {
            name: outcome_of(op, runner.specs[name], runner.raised)
            for name, op in runner.ops.items()
        }
        assert outcomes == exp.outcome
        assert runner.reads == exp.reads
        assert runner.values == exp.values
        assert [v.version for v in runner.vars] == exp.versions

        # wait_for_all raises failures in the order they happened: push order in serial
        # mode; independent ones may happen in any order on a threaded engine.
        def order(failures: Sequence[str]) -> list[str]:
            return list(failures) if serial else sorted(failures)

        assert [order(names(w, runner.raised)) for w in waits] == [order(w) for w in exp.waits]
        assert order(names(final, runner.raised)) == order(exp.final_wait_for_all)


class TestModel:
    """The reference model itself, on hand-written programs (so its rules are pinned)."""

    def _op(self, name: str, const: tuple[int, ...], mutate: tuple[int, ...], **kw: Any) -> OpSpec:
        fields: dict[str, Any] = {
            "kind": Kind.SYNC,
            "prop": ae.FnProperty.NORMAL,
            "priority": 0,
            "raises": False,
            "cancel": False,
            "yields": 0,
        }
        fields.update(kw)
        return OpSpec(name=name, const=const, mutate=mutate, **fields)

    def _program(self, *ops: OpSpec, wait: WaitSpec | None = None) -> Program:
        blocker = self._op("b", (), (0, 1), kind=Kind.CORO, prop=ae.FnProperty.NO_SKIP)
        return Program(2, (Segment(blocker, ops, wait),))

    def test_failure_skips_readers_and_propagates_through_writes(self) -> None:
        exp = model(
            self._program(
                self._op("w", (), (0,), raises=True),
                self._op("r", (0,), (1,)),
                self._op("n", (1,), (), prop=ae.FnProperty.NO_SKIP),
            )
        )
        assert exp.outcome == {
            "b": (Outcome.DONE, None),
            "w": (Outcome.FAILED, "w"),
            "r": (Outcome.SKIPPED, "w"),
            "n": (Outcome.DONE, None),
        }
        assert exp.reads == {"b": ((0, INITIAL), (1, INITIAL)), "w": ((0, "b"),), "n": ((1, "b"),)}
        assert exp.versions == [2, 2]
        assert exp.final_wait_for_all == ("w",)

    def test_wait_for_var_throws_once_and_clears_everywhere(self) -> None:
        exp = model(
            self._program(
                self._op("w", (), (0,), raises=True),
                self._op("r", (0,), (1,)),
                wait=WaitSpec(WaitKind.VAR_CONCURRENT, 1),
            )
        )
        assert exp.wait_plan == [WaitSpec(WaitKind.VAR_DRAINED, 1)]
        assert exp.waits == [("w",)]
        assert exp.final_wait_for_all == ()

    def test_cancelled_op_never_runs_and_records_nothing(self) -> None:
        exp = model(
            self._program(
                self._op("w", (), (0, 0), raises=True, cancel=True),
                self._op("r", (0, 0), (0,)),
            )
        )
        assert exp.outcome["w"] == (Outcome.CANCELLED, None)
        assert exp.outcome["r"] == (Outcome.DONE, None)
        assert exp.reads["r"] == ((0, "b"),)
        assert exp.values == ["r", "b"]
        assert exp.versions == [2, 1]
