"""The engine lock behaves as threading.Lock: each check runs on both."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import aioengine as ae
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
        assert type(engine._core._lock) is EngineLock
        x = engine.new_var("x")
        engine._core._lock.acquire()
        pushed = threading.Event()

        def push() -> None:
            engine.push_sync(lambda r: None, mutate_vars=[x])
            pushed.set()

        thread = threading.Thread(target=push)
        thread.start()
        assert not pushed.wait(0.05)  # the push waits for the lock
        engine._core._lock.release()
        thread.join()
        assert pushed.is_set()
        await engine.wait_for_all()
        assert x.version == 1
        assert not engine._core._lock.locked()
