"""The engine lock behaves as threading.Lock: each check runs on both."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import aioengine as ae
from aioengine import lock as lock_module
from aioengine.lock import EngineLock

LOCKS: list[Callable[[], Any]] = [threading.Lock, EngineLock]


@pytest.fixture(params=LOCKS, ids=["threading.Lock", "EngineLock"])
def lock(request: pytest.FixtureRequest) -> Any:
    return request.param()


def test_acquire_release_and_locked(lock: Any) -> None:
    assert not lock.locked()
    assert lock.acquire() is True
    assert lock.locked()
    assert lock.acquire(blocking=False) is False
    assert lock.acquire(timeout=0) is False
    assert lock.acquire(True, 0.01) is False  # times out while held
    lock.release()
    assert not lock.locked()
    assert lock.acquire(False) is True
    lock.release()
    assert lock.acquire(timeout=5) is True
    lock.release()


def test_with_statement(lock: Any) -> None:
    with lock as entered:
        assert entered is True
        assert lock.locked()
    assert not lock.locked()
    with pytest.raises(KeyError), lock:
        raise KeyError
    assert not lock.locked()


def test_releasing_an_unlocked_lock_raises(lock: Any) -> None:
    with pytest.raises(RuntimeError, match="release unlocked lock"):
        lock.release()
    assert not lock.locked()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"blocking": False, "timeout": 1}, "can't specify a timeout for a non-blocking call"),
        ({"timeout": -2}, "timeout value must be positive"),
    ],
)
def test_bad_arguments_raise_as_threading_lock_does(
    lock: Any, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        lock.acquire(**kwargs)
    assert not lock.locked()


def test_another_thread_may_release_it(lock: Any) -> None:
    lock.acquire()
    thread = threading.Thread(target=lock.release)
    thread.start()
    thread.join()
    assert not lock.locked()


def test_a_waiter_gets_it_once_released(lock: Any) -> None:
    """A thread blocked in acquire() gets the lock when the holder releases it."""
    lock.acquire()
    got = threading.Event()

    def waiter() -> None:
        lock.acquire()
        got.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    assert not got.wait(0.05)  # still held: the waiter waits
    lock.release()
    thread.join()
    assert got.is_set()
    assert lock.locked()  # now held by the waiter's acquire
    lock.release()


@pytest.mark.parametrize("fast", [False, True], ids=["acquire/release", "take/give"])
def test_mutual_exclusion_under_contention(fast: bool) -> None:
    """Four threads incrementing a counter in a read-yield-write critical section lose no
    increment: only one holds the lock at a time (take/give are the hot paths' calls)."""
    lock = EngineLock()
    take, give = (lock.take, lock.give) if fast else (lock.acquire, lock.release)
    count = [0]
    inside = [0]
    overlaps: list[int] = []

    def work() -> None:
        for _ in range(2_000):
            take()
            try:
                inside[0] += 1
                if inside[0] != 1:
                    overlaps.append(inside[0])
                value = count[0]
                if value % 97 == 0:
                    time.sleep(0)  # let another thread run while this one holds the lock
                count[0] = value + 1
                inside[0] -= 1
            finally:
                give()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == []
    assert count[0] == 8_000
    assert not lock.locked()


def test_repr() -> None:
    lock = EngineLock()
    assert repr(lock) == "<aioengine.EngineLock unlocked>"
    with lock:
        assert repr(lock) == "<aioengine.EngineLock locked>"


async def test_the_engine_takes_its_lock_on_every_push_and_finish() -> None:
    """The engine's hot paths take its EngineLock: held by another thread, a push waits."""
    async with ae.Engine() as engine:
        assert type(engine._core.lock) is EngineLock
        x = engine.new_var("x")
        engine._core.lock.acquire()
        pushed = threading.Event()

        def push() -> None:
            engine.push_sync(lambda r: None, mutate_vars=[x])
            pushed.set()

        thread = threading.Thread(target=push)
        thread.start()
        assert not pushed.wait(0.05)  # the push waits for the lock
        engine._core.lock.release()
        thread.join()
        assert pushed.is_set()
        await engine.wait_for_all()
        assert x.version == 1
        assert not engine._core.lock.locked()


class TestSignalMainLater:
    """``signal_main_later``, which the Ctrl-C guard uses to hand an interrupt back: a real
    signal, to the main thread, that comes on time however busy the event loop is."""

    @pytest.fixture
    def received(self) -> Iterator[list[float]]:
        got: list[float] = []
        previous = signal.signal(signal.SIGUSR1, lambda signum, frame: got.append(time.monotonic()))
        try:
            yield got
        finally:
            signal.signal(signal.SIGUSR1, previous)

    async def test_it_arrives_while_the_loop_never_waits(self, received: list[float]) -> None:
        """The main thread pushes all along and the loop never waits: the signal comes
        after its delay, within a few rounds of pushes. (A thread that needs the GIL to send
        it lost the race for the GIL there for 2 to more than 5,000 rounds in a script; the
        kernel's timer came within one, every time.)"""
        async with ae.Engine(serial=True) as engine:
            x = engine.new_var("x")
            for _ in range(5):
                sent = time.monotonic()
                lock_module.signal_main_later(signal.SIGUSR1, 0.001)
                spins = 0
                while not received and spins < 5_000:  # 100 pushes a spin: seconds, a bound
                    for _ in range(50):
                        engine.push_sync(lambda r: None, mutate_vars=[x])
                        engine.push_sync(lambda r: None, const_vars=[x])
                    await asyncio.sleep(0)  # serial mode runs them here
                    spins += 1
                assert received, "the signal never came while the loop was busy"
                # It came after the delay asked for, within a few rounds.
                assert received[0] - sent >= 0.001
                assert spins < 50
                received.clear()

    def test_without_a_kernel_timer_a_thread_sends_it(
        self, received: list[float], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Where the C library has no POSIX timers (not Linux), a daemon thread sends it."""
        monkeypatch.setattr(lock_module, "_kernel_timer", lambda signum: None)
        lock_module.signal_main_later(signal.SIGUSR1, 0.001)
        for _ in range(1000):
            if received:
                break
            time.sleep(0.01)  # the thread's turn; the handler runs between two of these
        assert len(received) == 1

    def test_one_timer_per_signal_and_process(self) -> None:
        """The kernel's timer is made once per signal and process (a later call re-arms it;
        the key holds the process id, as a forked child has none of its parent's timers)."""
        first = lock_module._kernel_timer(signal.SIGUSR1)
        assert lock_module._kernel_timer(signal.SIGUSR1) is first
        assert lock_module._made_timer(os.getpid(), signal.SIGUSR1) is first
        if sys.platform.startswith("linux"):
            assert first is not None


def test_an_interrupt_waits_inside_code_exec_made_for_the_engine() -> None:
    """A dataclass's ``__init__`` is made by ``exec`` and its file name is "<string>": the
    guard must still see RunContext's as engine code. The compiled core builds one from C
    for an operation it has marked RUNNING; an interrupt let through there stranded that
    operation, and every wait on its Vars hung."""
    from aioengine.context import RunContext, cpu

    seen: list[tuple[str, bool]] = []

    def profile(frame: Any, event: str, arg: object) -> None:
        if event == "call" and frame.f_code.co_name == "__init__":
            seen.append((frame.f_code.co_filename, lock_module._in_engine(frame)))

    namespace: dict[str, Any] = {"__name__": "users_module"}
    exec("def __init__():\n    pass\n", namespace)
    sys.setprofile(profile)
    try:
        RunContext(cpu(0), None)
        namespace["__init__"]()
    finally:
        sys.setprofile(None)
    assert seen == [("<string>", True), ("<string>", False)]


def test_an_interrupt_waits_while_asyncio_schedules_a_callback() -> None:
    """Inside asyncio's ``call_soon`` an interrupt would lose the callback. The compiled core
    calls it from C, with no frame of its own above it: the guard must see asyncio's frame
    alone as engine code (a deferred wake of a thread pool, lost so, left an operation queued
    with its worker asleep)."""
    loop = asyncio.new_event_loop()
    seen: list[bool] = []
    scheduling = asyncio.base_events.BaseEventLoop._call_soon.__code__  # type: ignore[attr-defined]

    def profile(frame: Any, event: str, arg: object) -> None:
        if event == "call" and frame.f_code is scheduling:
            seen.append(lock_module._in_engine(frame))

    sys.setprofile(profile)
    try:
        loop.call_soon(lambda: None)
    finally:
        sys.setprofile(None)
        loop.close()
    assert seen == [True]
    assert not lock_module._in_engine(sys._getframe())  # the user's own code: interrupted
