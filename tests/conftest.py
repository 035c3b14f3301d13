"""Shared fixtures: every async test runs on the default asyncio loop and on uvloop."""

from __future__ import annotations

import asyncio
import functools
import os
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

import pytest
from hypothesis import settings

import aioengine as ae

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is in the test group
    uvloop = None


# CI replays the same examples every run: a red CI run is about the change, not the seed.
# ``nox -s fuzz`` loads "fuzz" (``--hypothesis-profile=fuzz``) to look for new races.
settings.register_profile("ci", derandomize=True, database=None, deadline=None)
settings.register_profile(
    "fuzz", max_examples=1500, derandomize=False, database=None, deadline=None, print_blob=True
)
settings.load_profile("ci")


def ci_examples(n: int, **kwargs: Any) -> settings:
    """Settings (``kwargs``) for a property test with ``n`` examples in CI (the "ci" profile),
    and the loaded profile's own number under any other (``nox -s fuzz`` loads "fuzz" after
    this file, before the test modules are imported): a plain ``settings(max_examples=n)``
    would hold the fuzz session to ``n`` too. Such a test belongs in noxfile.py's ``_FUZZED``."""
    if settings.default is settings.get_profile("ci"):
        return settings(max_examples=n, **kwargs)
    return settings(**kwargs)


# SciPy's array API support (which scikit-learn's needs too) is read once, when SciPy is first
# imported: on before any test module is collected, whichever imports SciPy first
# (tests/test_array_libraries.py tests it on engine arrays).
os.environ.setdefault("SCIPY_ARRAY_API", "1")

# Whether the compiled core (setup.py) is what runs: the wheel compiles engine.py, and an
# editable install runs the sources.
COMPILED = ae.engine._COMPILED


def pytest_report_header(config: pytest.Config) -> str:
    """Say which build of aioengine the tests run, and from where."""
    build = "compiled core" if COMPILED else "pure Python"
    return f"aioengine: {build}, from {os.path.dirname(ae.__file__)}"


# ``AIOENGINE_VALIDATE=1`` (nox -s tests): after every test, the scheduler of each Engine the
# test created and that is still alive checks its invariants (``validate_state()``), open or
# closed. Pure Python only: the compiled Engine's ``__init__`` cannot be wrapped.
VALIDATE = os.environ.get("AIOENGINE_VALIDATE", "") not in ("", "0")


def pytest_configure(config: pytest.Config) -> None:
    """``AIOENGINE_EXPECT_COMPILED=1`` (nox -s tests_compiled): refuse to test the sources
    instead of the compiled core, which a stray ``sys.path`` entry would make happen; and
    refuse ``AIOENGINE_VALIDATE=1`` on the compiled core rather than check nothing."""
    if os.environ.get("AIOENGINE_EXPECT_COMPILED", "") not in ("", "0") and not COMPILED:
        raise pytest.UsageError(f"expected the compiled aioengine core, got {ae.engine.__file__}")
    if VALIDATE and COMPILED:
        raise pytest.UsageError("AIOENGINE_VALIDATE=1 needs the pure-Python build (nox -s tests)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``gpu``-marked tests unless CuPy is installed and sees a usable CUDA device."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items or ae.gpu_available():
        return
    skip = pytest.mark.skip(reason="needs CuPy and a CUDA device (aioengine.gpu_available())")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.hookimpl(optionalhook=True)  # plain pytest (no pytest-asyncio) must load this file
def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Run each async test once per loop implementation (hostile loops, as anyio does)."""
    factories: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
        "asyncio": asyncio.new_event_loop
    }
    if uvloop is not None:
        factories["uvloop"] = uvloop.new_event_loop
    return factories


class EngineRecorder:
    """The Engines created while it records (weakly: it keeps none alive)."""

    def __init__(self) -> None:
        self._refs: list[weakref.ref[ae.Engine]] = []

    def record(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Record every Engine constructed from now until ``monkeypatch`` is undone."""
        init = ae.Engine.__init__
        refs = self._refs

        @functools.wraps(init)
        def recording_init(engine: ae.Engine, *args: Any, **kwargs: Any) -> None:
            init(engine, *args, **kwargs)
            refs.append(weakref.ref(engine))

        monkeypatch.setattr(ae.Engine, "__init__", recording_init)

    def engines(self) -> list[ae.Engine]:
        """The recorded Engines still alive, in the order they were created."""
        return [e for e in (ref() for ref in self._refs) if e is not None]

    def validate(self) -> int:
        """Check the invariants of every recorded Engine still alive (``validate_state()``);
        return how many were checked.

        Raises:
            AssertionError: naming the first invariant that does not hold.
        """
        engines = self.engines()
        for engine in engines:
            engine._core.validate_state()
        return len(engines)


@pytest.fixture(autouse=True)
def validated_engines(monkeypatch: pytest.MonkeyPatch) -> Iterator[EngineRecorder]:
    """With ``AIOENGINE_VALIDATE=1``, record the Engines a test creates and validate them
    after it (the engine fixtures, set up later, have closed theirs by then); without it,
    an idle recorder."""
    recorder = EngineRecorder()
    if not VALIDATE:
        yield recorder
        return
    recorder.record(monkeypatch)
    yield recorder
    recorder.validate()


@pytest.fixture(params=[pytest.param(False, id="threaded"), pytest.param(True, id="serial")])
def serial(request: pytest.FixtureRequest) -> bool:
    """Both engine modes: every test taking ``engine`` runs threaded and serial."""
    value: bool = request.param
    return value


@pytest.fixture
async def engine(serial: bool) -> AsyncIterator[ae.Engine]:
    """An engine with two CPU workers, closed (and drained) after the test."""
    eng = ae.Engine(cpu_workers=2, serial=serial)
    try:
        yield eng
    finally:
        _open_gates()
        if not eng.closed:
            try:
                await eng.aclose(cancel=True, timeout=30)  # a hung op fails, never hangs, CI
            except BaseExceptionGroup:
                pass


@pytest.fixture
async def threaded_engine() -> AsyncIterator[ae.Engine]:
    """A threaded engine with two CPU workers (for tests about threads and pools)."""
    eng = ae.Engine(cpu_workers=2, serial=False)
    try:
        yield eng
    finally:
        _open_gates()
        if not eng.closed:
            try:
                await eng.aclose(cancel=True, timeout=30)  # a hung op fails, never hangs, CI
            except BaseExceptionGroup:
                pass


# The gates of the Hold writers a test made: opened when its engine fixture closes (a failed
# test's holds then finish instead of being cancelled).
_GATES: list[asyncio.Event] = []


def _open_gates() -> None:
    for gate in _GATES:
        gate.set()
    _GATES.clear()


class Hold:
    """A raw coroutine writer on ``var`` (pushed now) that keeps its turn until
    :meth:`release`, then runs ``effect()`` (on the loop thread) and finishes."""

    def __init__(
        self, engine: ae.Engine, var: ae.Var, effect: Callable[[], None] | None = None
    ) -> None:
        self.gate = asyncio.Event()
        self.started = asyncio.Event()
        _GATES.append(self.gate)

        async def hold(rctx: ae.RunContext) -> None:
            self.started.set()
            await self.gate.wait()
            if effect is not None:
                effect()

        self.op = engine.push_async(hold, mutate_vars=[var], name="hold")

    async def release(self) -> None:
        self.gate.set()
        await self.op


class Monitor:
    """Records every operation's start and end per Var and fails on a forbidden overlap.

    ``enter(reads, writes)`` / ``exit(...)`` are called by operations from any thread; an
    overlap of a writer with any other user of the same Var is recorded in ``violations``.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.readers: dict[Any, int] = {}
        self.writers: dict[Any, int] = {}
        self.violations: list[str] = []
        self.max_readers = 0

    def enter(self, name: str, reads: tuple[Any, ...], writes: tuple[Any, ...]) -> None:
        with self._lock:
            for v in writes:
                if self.writers.get(v, 0) or self.readers.get(v, 0):
                    self.violations.append(f"{name} writes {v} while it is in use")
                self.writers[v] = self.writers.get(v, 0) + 1
            for v in reads:
                if self.writers.get(v, 0):
                    self.violations.append(f"{name} reads {v} while it is written")
                self.readers[v] = self.readers.get(v, 0) + 1
                self.max_readers = max(self.max_readers, self.readers[v])

    def exit(self, reads: tuple[Any, ...], writes: tuple[Any, ...]) -> None:
        with self._lock:
            for v in writes:
                self.writers[v] -= 1
            for v in reads:
                self.readers[v] -= 1


@pytest.fixture
def monitor() -> Monitor:
    """A fresh exclusivity monitor."""
    return Monitor()


class Blocker:
    """A coroutine operation that holds its Vars until :meth:`release` is called."""

    def __init__(
        self,
        engine: ae.Engine,
        trace: list[str],
        *,
        const: Sequence[ae.Var] = (),
        mutate: Sequence[ae.Var] = (),
        name: str = "block",
    ) -> None:
        self.gate = asyncio.Event()
        self.started = asyncio.Event()

        async def block(rctx: ae.RunContext) -> str:
            trace.append(f"{name}:start")
            self.started.set()
            await self.gate.wait()
            trace.append(f"{name}:end")
            return name

        self.op = engine.push_async(block, const_vars=const, mutate_vars=mutate, name=name)

    def release(self) -> None:
        self.gate.set()


def blocked_var(engine: ae.Engine, name: str = "x") -> tuple[ae.Var, list[str], Blocker]:
    """A new Var that a :class:`Blocker` writes, holding it until ``release()``; and the
    trace the blocker records into (for the test's own operations to record into too)."""
    var = engine.new_var(name)
    trace: list[str] = []
    return var, trace, Blocker(engine, trace, mutate=[var])


def execute_notebook(notebook: Any, path: Any) -> list[Any]:
    """Run ``notebook`` (an nbformat object) top to bottom in a real ipykernel, in ``path``;
    return its outputs' error entries (the caller asserts there are none)."""
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    client = nbclient.NotebookClient(
        notebook, timeout=60, kernel_name="python3", resources={"metadata": {"path": str(path)}}
    )
    client.execute()
    return [
        o for c in notebook.cells for o in c.get("outputs", []) if o.get("output_type") == "error"
    ]
