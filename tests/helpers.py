"""What several test modules share and is not a fixture: the exception failing operations
raise, the sequential reference model that the random-program tests compare the engine
with, what the remote tests ask Dask's scheduler, and the clusters they start (fixtures,
monitors and blockers are in ``conftest.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
import subprocess
import sys
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from typing import Any

import aioengine as ae
from aioengine.instrument import Instrument

__all__ = (
    "Boom",
    "Outcome",
    "Pushes",
    "SequentialModel",
    "chain",
    "command_line_cluster",
    "engine_keys",
    "in_process_cluster",
    "no_keys_left",
    "run_sequential",
)


class Boom(Exception):
    """What a test's failing operation raises (a fresh instance per failure)."""


class Outcome(enum.Enum):
    """How an operation ended, as the model and the tests name it."""

    DONE = "done"
    FAILED = "failed"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"


class SequentialModel:
    """The engine's rule run one operation at a time, in push order: what the engine must
    agree with whatever it runs concurrently.

    Failure semantics are MXNet's (issue 2): an operation whose function raises records the
    exception on the Vars it mutates; a later operation that reads or mutates a Var carrying
    a failure is skipped (unless ``no_skip``) and its own mutated Vars carry that failure
    too; a ``no_skip`` operation that runs passes the failure its inputs carried on to its
    outputs; a wait throws each failure once and clears it from every Var; a cancelled
    operation never runs and records nothing. Every operation that is not cancelled bumps
    the version of each Var it mutates, skipped or not.

    Vars are any hashable keys (the tests use indices); the operations' functions take no
    argument and change the test's own model state (values, reads) themselves.
    """

    def __init__(self) -> None:
        self._carried: dict[Hashable, BaseException] = {}
        self._recorded: list[BaseException] = []  # not thrown yet, in the order they happened
        self._versions: dict[Hashable, int] = {}

    def push(
        self,
        fn: Callable[[], object],
        const: Sequence[Hashable] = (),
        mutate: Sequence[Hashable] = (),
        *,
        no_skip: bool = False,
        cancelled: bool = False,
    ) -> tuple[Outcome, object]:
        """Run ``fn`` now if the rule lets it run; return its outcome and, with it, ``fn``'s
        result (DONE), the exception it raised (FAILED), the failure it inherited (SKIPPED),
        or None (CANCELLED).

        A Var in both lists is mutated, duplicates count once (as the engine takes them);
        a skipped operation inherits the failure of its first input that carries one,
        reads before writes.
        """
        if cancelled:
            return Outcome.CANCELLED, None
        writes = tuple(dict.fromkeys(mutate))
        reads = tuple(v for v in dict.fromkeys(const) if v not in writes)
        inherited = next((self._carried[v] for v in (*reads, *writes) if v in self._carried), None)
        for v in writes:
            self._versions[v] = self._versions.get(v, 0) + 1
        if inherited is not None and not no_skip:
            self._carry(writes, inherited)
            return Outcome.SKIPPED, inherited
        try:
            result = fn()
        except Exception as exc:
            self._recorded.append(exc)
            self._carry(writes, exc)
            return Outcome.FAILED, exc
        self._carry(writes, inherited)
        return Outcome.DONE, result

    def _carry(self, writes: Iterable[Hashable], failure: BaseException | None) -> None:
        for v in writes:
            if failure is None:
                self._carried.pop(v, None)
            else:
                self._carried[v] = failure

    def carries(self, var: Hashable) -> BaseException | None:
        """The failure ``var`` carries, if any."""
        return self._carried.get(var)

    def version(self, var: Hashable) -> int:
        """How many operations (not cancelled) mutated ``var``."""
        return self._versions.get(var, 0)

    @property
    def failures(self) -> tuple[BaseException, ...]:
        """The failures not thrown yet, in the order they happened (what ``wait_for_all``
        raises)."""
        return tuple(self._recorded)

    def _clear(self, failure: BaseException) -> None:
        for v in [v for v, f in self._carried.items() if f is failure]:
            del self._carried[v]
        self._recorded.remove(failure)

    def wait_for_var(self, var: Hashable) -> tuple[BaseException, ...]:
        """What ``wait_for_var(var)`` raises once every operation pushed so far finished:
        the failure ``var`` carries, thrown once (cleared from every Var)."""
        failure = self._carried.get(var)
        if failure is None:
            return ()
        self._clear(failure)
        return (failure,)

    def wait_for_all(self) -> tuple[BaseException, ...]:
        """What ``wait_for_all()`` raises: every failure not thrown yet, thrown once."""
        thrown = self.failures
        for failure in thrown:
            self._clear(failure)
        return thrown


def run_sequential(
    ops: Iterable[tuple[Callable[[], object], Sequence[Hashable], Sequence[Hashable]]],
) -> list[tuple[Outcome, object]]:
    """Run ``(fn, const_vars, mutate_vars)`` operations through a fresh
    :class:`SequentialModel`, in push order; their outcomes."""
    model = SequentialModel()
    return [model.push(fn, const, mutate) for fn, const, mutate in ops]


def in_process_cluster(n_workers: int, threads_per_worker: int, **kwargs: Any) -> Any:
    """An asynchronous ``LocalCluster`` whose workers are threads of this process (a function
    of a test module runs on them by reference, so it can block on the test's Events), to use
    as ``async with``; the running loop leaves asyncio's debug mode, which makes Dask's own
    loop-bound work (it shares the loop) several times slower."""
    import distributed

    asyncio.get_running_loop().set_debug(False)
    return distributed.LocalCluster(  # type: ignore[no-untyped-call]
        processes=False,
        n_workers=n_workers,
        threads_per_worker=threads_per_worker,
        dashboard_address=":0",
        asynchronous=True,
        **kwargs,
    )


def engine_keys(cluster: Any, engine: ae.Engine) -> list[str]:
    """The keys of ``engine`` that the in-process ``cluster``'s scheduler still knows."""
    from aioengine.remote import RemoteBackend

    remote = engine._core.remote
    assert isinstance(remote, RemoteBackend)
    return [str(k) for k in cluster.scheduler.tasks if remote._token in str(k)]


async def no_keys_left(cluster: Any, engine: ae.Engine) -> None:
    """Wait (bounded) until the scheduler has forgotten every key of ``engine``: releases
    reach it in batches."""
    for _ in range(300):
        if not engine_keys(cluster, engine):
            return
        await asyncio.sleep(0.01)
    assert engine_keys(cluster, engine) == []


async def until(condition: Callable[[], object], timeout: float = 10.0) -> None:  # noqa: ASYNC109
    """Yield to the loop until ``condition()`` holds; AssertionError after ``timeout``
    seconds of the loop's clock (a bound for a wait that could hang, not a timing)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not condition():
        if loop.time() > end:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.001)


@contextlib.contextmanager
def command_line_cluster(folder: str, nthreads: int = 1) -> Iterator[str]:
    """A ``dask scheduler`` and one ``dask worker`` started from the command line, as a team
    moving to a cluster starts them, on 127.0.0.1 (the scheduler out of this process): the
    scheduler's address, for the ``with`` block; both are stopped at its end. ``folder``
    (a test's ``tmp_path``) holds the scheduler file. The processes import this repository
    first (``PYTHONPATH``), so the workers find the tests' functions and this checkout's
    aioengine. Skips the test where the ``dask`` command is not beside this interpreter."""
    import distributed
    import pytest

    dask_cli = os.path.join(os.path.dirname(sys.executable), "dask")
    if not os.path.exists(dask_cli):
        pytest.skip("the dask command is not installed beside this interpreter")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root)
    scheduler_file = os.path.join(folder, "scheduler.json")
    common = ["--scheduler-file", scheduler_file, "--no-dashboard"]
    quiet: dict[str, Any] = {"env": env, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    procs = [
        subprocess.Popen(
            [dask_cli, "scheduler", "--host", "127.0.0.1", "--port", "0", *common], **quiet
        )
    ]
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(scheduler_file):
            assert time.monotonic() < deadline, "the scheduler did not start"
            time.sleep(0.05)
        worker = [dask_cli, "worker", "--nthreads", str(nthreads), "--host", "127.0.0.1"]
        procs.append(subprocess.Popen([*worker, *common], cwd=root, **quiet))
        with distributed.Client(  # type: ignore[no-untyped-call]
            scheduler_file=scheduler_file, timeout=60
        ) as client:
            client.wait_for_workers(1, timeout=60)
            address: str = client.scheduler.address
        yield address
    finally:
        # One at a time, the worker first: a worker whose scheduler went first waits to
        # reconnect (seconds), where one stopped first leaves at once.
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def chain(xp: Any, a: Any, b: Any) -> Any:
    """Issue 45's 10-step elementwise chain: binary and unary functions, Python scalars, and
    the inputs read again along the way."""
    c = a * 1.5 + b
    c = c * c - a
    c = xp.sqrt(xp.abs(c)) + 2.0
    c = c * b - a * 0.5
    return xp.exp(-c * c) + c


class Pushes(Instrument):
    """The names of the operations pushed on ``engine`` while installed (``with Pushes(engine)
    as pushes:``, from any thread); :meth:`ops`, those of the array operations (the reads that
    ``await`` and the sync points push left out)."""

    def __init__(self, engine: ae.Engine) -> None:
        self.engine = engine
        self.names: list[str] = []

    def on_push(self, op: Any) -> None:
        self.names.append(op.name)

    def ops(self) -> list[str]:
        return [n for n in self.names if n != "await"]

    def __enter__(self) -> Pushes:
        self.engine.add_instrument(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.engine.remove_instrument(self)
