"""Finalizers that call the engine, and Ctrl-C (issue 27, parts 1 and 2): the engine lock is
never held while user code runs, never left held, never a deadlock.

MXNet's NDArray deletes its Var in its destructor; the Python equivalent is an object whose
``__del__`` (or ``weakref.finalize``) calls ``engine.delete_var(var)``. Each path on which the
engine drops such an object's last reference runs in a subprocess with a timeout, so that a
deadlock fails the test instead of hanging the suite; the subprocess imports the same build
(pure or compiled) as this test.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

import aioengine as ae
from aioengine import lifecycle
from aioengine.lock import Deferred

from .conftest import COMPILED

TIMEOUT = 30.0

PRELUDE = """\
import asyncio, gc, sys, threading, weakref
import aioengine as ae

assert ae.engine._COMPILED is {compiled}, "the subprocess imported the other build"
deleted = []

class Tensor:
    def __init__(self, engine):
        self.engine, self.var = engine, engine.new_var("tensor")

    def __del__(self):
        deleted.append(self.engine.delete_var(self.var))

def fail(rctx):
    raise ValueError("boom")

async def settle(engine, count):
    assert len(deleted) == count, deleted
    for op in deleted:
        assert await op is None
        assert op.state is ae.OpState.DONE, op

async def main():
{body}

asyncio.run(main())
print("ok", flush=True)
"""


def run_script(
    script: str, hang: str, timeout: float = TIMEOUT
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a fresh interpreter on this build (the subprocess imports the build
    under test, not the checkout); fail, with ``hang`` in the message, if it does not finish,
    and unless it ends printing "ok"; return it."""
    env = dict(os.environ, PYTHONPATH=str(Path(ae.__file__).parent.parent))
    try:
        proc = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=tempfile.gettempdir(),
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{hang}: the script did not finish within {timeout} s: {exc.stderr!r}")
    assert proc.returncode == 0, f"{hang}: {proc.stderr}"
    assert proc.stdout.splitlines()[-1] == "ok", proc.stdout
    return proc


def run_body(body: str) -> subprocess.CompletedProcess[str]:
    """Run ``body`` as ``main()``'s after :data:`PRELUDE`; a deadlock fails the test."""
    script = PRELUDE.format(compiled=COMPILED, body=textwrap.indent(textwrap.dedent(body), "    "))
    return run_script(script, "deadlock")


@pytest.mark.parametrize("serial", [False, True], ids=["threaded", "serial"])
def test_cancel_drops_the_function_after_unlocking(serial: bool) -> None:
    run_body(f"""
        async with ae.Engine(serial={serial}) as engine:
            x = engine.new_var("x")
            gate = asyncio.Event()
            blocker = engine.push_async(lambda r: gate.wait(), mutate_vars=[x])
            t = Tensor(engine)
            op = engine.push_sync(lambda r, t=t: None, const_vars=[x])
            del t
            assert op.cancel()  # the function holding t's last reference is dropped
            gate.set()
            await blocker
            await settle(engine, 1)
    """)


def test_an_operation_skipped_for_a_failed_input() -> None:
    run_body("""
        async with ae.Engine() as engine:
            x = engine.new_var("x")
            gate = threading.Event()
            blocker = engine.push_sync(lambda r: gate.wait(10), mutate_vars=[x])
            failing = engine.push_sync(fail, mutate_vars=[x])
            t = Tensor(engine)
            op = engine.push_sync(lambda r, t=t: None, const_vars=[x])
            del t
            gate.set()
            try:
                await op
            except ae.DependencyError:
                pass
            await settle(engine, 1)
            try:
                await engine.wait_for_all()
            except ExceptionGroup:
                pass
    """)


def test_on_complete_called_from_another_thread() -> None:
    run_body("""
        async with ae.Engine() as engine:
            t = Tensor(engine)
            def start(rctx, on_complete, t=t):
                threading.Timer(0.01, on_complete).start()
            op = engine.push_async(start)
            del t, start
            await op  # its function is dropped when on_complete() finishes it
            await settle(engine, 1)
    """)


def test_aclose_with_cancel() -> None:
    proc = run_body("""
        engine = ae.Engine()
        x = engine.new_var("x")
        gate = threading.Event()
        blocker = engine.push_sync(lambda r: gate.wait(10), mutate_vars=[x])
        t = Tensor(engine)
        op = engine.push_sync(lambda r, t=t: None, const_vars=[x])
        del t
        threading.Timer(0.05, gate.set).start()
        await engine.aclose(cancel=True)
        assert op.cancelled()
        assert len(deleted) == 1  # a deletion is accepted while the engine closes
        assert deleted[0].state is ae.OpState.DONE  # and ran before the close ended
    """)
    assert "EngineClosedError" not in proc.stderr
    assert "Exception ignored" not in proc.stderr


def test_weakref_finalize_calling_delete_var() -> None:
    run_body("""
        async with ae.Engine() as engine:
            x = engine.new_var("x")
            gate = threading.Event()
            blocker = engine.push_sync(lambda r: gate.wait(10), mutate_vars=[x])
            class Data:
                pass
            data, var = Data(), engine.new_var("data")
            weakref.finalize(data, lambda: deleted.append(engine.delete_var(var)))
            op = engine.push_sync(lambda r, data=data: None, const_vars=[x])
            del data
            assert op.cancel()
            gate.set()
            await settle(engine, 1)
    """)


def test_a_var_value_replaced_or_dropped() -> None:
    run_body("""
        async with ae.Engine() as engine:
            v = engine.new_var("v", value=Tensor(engine))
            await v.set(Tensor(engine))  # the first value is dropped
            await engine.push_sync(lambda r: None, mutate_vars=[v])
            blocked = engine.push_sync(lambda r: None, const_vars=[v])
            del v  # the Var, and its value, die with the operation that holds them
            await blocked
            del blocked
            gc.collect()
            await settle(engine, 2)
    """)


def test_cyclic_garbage_collected_while_threads_push() -> None:
    """The cycle collector runs ``__del__`` at allocations inside critical sections; the
    engine calls it makes are deferred to the end of the section, never waited for."""
    run_body("""
        class Cyclic(Tensor):
            def __init__(self, engine):
                super().__init__(engine)
                self.cycle = self

        gc.set_threshold(2, 2, 2)  # collect very often: inside critical sections too
        async with ae.Engine(cpu_workers=2) as engine:
            x = engine.new_var("x")
            await engine.push_sync(lambda r: None, mutate_vars=[x])

            def producer():
                # A fixed count: pushing until told to stop made the work, and the cost of
                # each collection over it, grow with how slowly the loop got scheduled.
                for _ in range(300):
                    Cyclic(engine)
                    engine.push_sync(lambda r: [Cyclic(engine)], const_vars=[x])

            threads = [threading.Thread(target=producer) for _ in range(2)]
            for thread in threads:
                thread.start()
            for _ in range(300):
                Cyclic(engine)
                engine.push_sync(lambda r: None, mutate_vars=[x])
                await asyncio.sleep(0)
            for thread in threads:
                await asyncio.to_thread(thread.join)
            gc.collect()
            await engine.wait_for_all()
            gc.collect()
            assert len(deleted) > 300, len(deleted)
            await asyncio.gather(*deleted)
    """)


class TestDeferredCalls:
    """An engine call made on the thread that holds the lock, as a finalizer inside a
    critical section makes it: a push or a cancellation waits for the section's end, any
    other call raises instead of deadlocking."""

    async def test_a_push_is_admitted_when_the_section_ends(self, engine: ae.Engine) -> None:
        x = engine.new_var("x")
        await engine.push_sync(lambda r: None, mutate_vars=[x])  # binds the engine
        lock = engine._core.lock
        lock.acquire()
        try:
            op = engine.push_sync(lambda r: "later", mutate_vars=[x])
            var = engine.new_var()  # takes no lock
            deleting = engine.delete_var(var)
            assert op.state is ae.OpState.PENDING
            assert [type(item) for item in lock.after] == [Deferred, Deferred]
        finally:
            lock.release()
        assert not lock.after
        assert await op == "later"
        await deleting
        with pytest.raises(ae.VarDeletedError):
            engine.push_sync(lambda r: None, const_vars=[var])

    async def test_a_push_in_a_collection_is_made_by_the_finalizer_thread(
        self, engine: ae.Engine
    ) -> None:
        """During a garbage collection on this thread (which may hold any lock: a pool's, say),
        a push and a cancellation are made once the collection ends, on the finalizer thread,
        in order."""
        x = engine.new_var("x")
        gate = asyncio.Event()
        blocker = engine.push_async(lambda r: gate.wait(), mutate_vars=[x])
        queued = engine.push_sync(lambda r: None, const_vars=[x])
        lifecycle._around_collection("start", {"generation": 0})
        try:
            op = engine.push_sync(lambda r: "made", mutate_vars=[x])
            assert queued.cancel()  # requested: made after the collection
            assert op.state is ae.OpState.PENDING
            assert not queued.done()
            assert len(lifecycle.collection.calls) == 2
        finally:
            lifecycle._around_collection("stop", {"generation": 0})
        assert not lifecycle.collection.calls
        finished = asyncio.Event()  # set on the loop once the finalizer thread cancels it
        queued.add_done_callback(lambda op: finished.set())
        await asyncio.wait_for(finished.wait(), 10)
        assert queued.cancelled()
        gate.set()
        await blocker
        assert await op == "made"

    async def test_a_cancellation_is_deferred(self, engine: ae.Engine) -> None:
        x = engine.new_var("x")
        gate = threading.Event()
        blocker = engine.push_sync(lambda r: gate.wait(10), mutate_vars=[x])
        op = engine.push_sync(lambda r: None, const_vars=[x])
        lock = engine._core.lock
        with lock:
            assert op.cancel()  # requested: it happens when the section ends
            assert not op.done()
        assert op.cancelled()
        gate.set()
        await blocker

    async def test_other_calls_raise(self, engine: ae.Engine) -> None:
        lock = engine._core.lock
        with lock, pytest.raises(RuntimeError, match="held by this thread"):
            engine.statistics()
        engine.statistics()

    async def test_a_refused_deferred_push_fails_its_operation(
        self, engine: ae.Engine, caplog: pytest.LogCaptureFixture
    ) -> None:
        var = engine.new_var("v")
        await engine.delete_var(var)  # (binds the engine)
        reported: list[dict[str, object]] = []
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: reported.append(ctx))
        with engine._core.lock:
            op = engine.push_sync(lambda r: None, const_vars=[var])
        assert op.state is ae.OpState.FAILED
        assert isinstance(op.exception(), ae.VarDeletedError)
        assert isinstance(reported[0]["exception"], ae.VarDeletedError)

    def test_the_owner_is_the_holder(self) -> None:
        lock = ae.lock.EngineLock()
        assert lock.owner == 0
        assert not lock.held_here()
        with lock:
            assert lock.held_here()
            seen: list[bool] = []
            thread = threading.Thread(target=lambda: seen.append(lock.held_here()))
            thread.start()
            thread.join()
            assert seen == [False]
        assert lock.owner == 0


# -- Ctrl-C (issue 27, part 2) ------------------------------------------------------------

INTERRUPTS = """\
import asyncio, random, signal, time
import aioengine as ae
from aioengine.lock import signal_main_later

assert ae.engine._COMPILED is {compiled}, "the subprocess imported the other build"
SERIAL = {serial}
random.seed({seed})

def ctrl_c_soon():
    # Sent by a kernel timer: a thread's os.kill could wait seconds for the GIL while the
    # loop polls without waiting on every iteration, and land only once the loop idles.
    delay = random.uniform(0, 0.004)
    signal_main_later(signal.SIGINT, delay)
    return time.monotonic() + delay

def sent(deadline):
    while time.monotonic() < deadline:  # the Ctrl-C is on its way, or delivered
        time.sleep(0.0005)

def engine_round():
    loop = asyncio.new_event_loop()  # no asyncio.run: Ctrl-C raises KeyboardInterrupt
    engine = ae.Engine(serial=SERIAL, cpu_workers=2)
    x = engine.new_var("x")

    async def produce():
        deadline = ctrl_c_soon()
        try:
            for i in range(1_000_000):
                engine.push_sync(lambda r: None, mutate_vars=[x])
                engine.push_sync(lambda r: None, const_vars=[x])
                if i % 50 == 0:
                    await asyncio.sleep(0)  # serial mode runs them here, on this thread
        finally:
            sent(deadline)

    async def finish():
        # Not awaited: an interrupt inside asyncio's own code (call_soon, say) can lose the
        # producer's wake-up, so that it never finishes; the engine is what is tested here.
        task.cancel()
        await asyncio.sleep(0)
        try:
            await engine.wait_for_var(x)
        except KeyboardInterrupt:
            pass  # delivered inside an operation: its failure, thrown once here
        assert await engine.push_sync(lambda r: 7, mutate_vars=[x]) == 7  # still usable
        try:
            await engine.aclose(cancel=True)
        except BaseExceptionGroup:
            pass  # the interrupt, recorded as an inline operation's failure
        assert engine.closed

    task = loop.create_task(produce())
    try:
        loop.run_until_complete(task)
    except KeyboardInterrupt:
        pass
    loop.run_until_complete(finish())
    loop.close()

def blocking_round():
    try:
        with ae.BlockingEngine(serial=SERIAL, cpu_workers=2) as be:
            x = be.new_var("x")
            deadline = ctrl_c_soon()
            try:
                while True:
                    be.push_sync(lambda r: None, mutate_vars=[x])
            finally:
                sent(deadline)
    except KeyboardInterrupt:
        pass
    assert be.closed

for _ in range({rounds}):
    {kind}_round()
print("ok", flush=True)
"""


@pytest.mark.parametrize("kind", ["engine", "blocking"])
@pytest.mark.parametrize("serial", [False, True], ids=["threaded", "serial"])
def test_ctrl_c_at_random_points_of_a_push_loop(kind: str, serial: bool) -> None:
    """A real SIGINT, many times at random points of a push loop: the interrupt reaches the
    program, and the engine stays usable and closes (``BlockingEngine.__exit__`` too)."""
    seed = random.randrange(1 << 30)
    script = INTERRUPTS.format(compiled=COMPILED, serial=serial, seed=seed, rounds=25, kind=kind)
    run_script(script, f"wedged after a Ctrl-C (seed {seed})")


def test_a_ctrl_c_in_the_full_collection_hook_is_delivered_after_it() -> None:
    """A KeyboardInterrupt inside the hooks that run before a full collection does not skip
    the remaining hooks, and reaches the program once the hook returns."""
    ran: list[str] = []

    class Target:
        pass

    first, second = Target(), Target()

    def interrupted(obj: Target) -> None:
        if not ran:
            ran.append("interrupted")
            raise KeyboardInterrupt
        ran.append("first")

    lifecycle.engines_before_full_collection.add(first, interrupted)
    lifecycle.engines_before_full_collection.add(second, lambda obj: ran.append("second"))
    try:
        with pytest.raises(KeyboardInterrupt):  # noqa: PT012  (handed back to the interpreter)
            lifecycle._before_collection("start", {"generation": 2})
            for _ in range(1000):
                time.sleep(0)  # the interpreter's next checks
    finally:
        lifecycle.engines_before_full_collection.discard(first)
        lifecycle.engines_before_full_collection.discard(second)
    assert ran == ["interrupted", "first", "second"]


def test_engine_code_is_not_interrupted() -> None:
    """The SIGINT wrapper delays a Ctrl-C while the main thread holds an engine lock."""
    engine = ae.Engine()
    engine.push_sync(lambda r: None)  # first use on the main thread: the wrapper goes in
    handler = signal.getsignal(signal.SIGINT)
    assert type(handler).__name__ == "_Guard", handler
    lock = engine._core.lock
    with pytest.raises(KeyboardInterrupt):  # noqa: PT012
        with lock:
            signal.raise_signal(signal.SIGINT)
            for _ in range(100):
                time.sleep(0)  # checks that would deliver it, had the engine not held it
            assert lock.held_here()
        for _ in range(100):
            time.sleep(0)
        pytest.fail("the interrupt never came")
    # Released, not left half-held by the interrupt: free for this thread to take. (Not
    # `not lock.locked()`: the pool thread finishing the push above may hold it a moment.)
    assert lock.acquire(timeout=10), "the engine lock was left held"
    lock.release()
    asyncio.run(engine.aclose())


ASYNCIO_RUN = """\
import asyncio, os, signal, threading
import aioengine as ae

assert ae.engine._COMPILED is {compiled}, "the subprocess imported the other build"
made_before = ae.Engine() if {before} else None  # not used yet: no wrapper
assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
if {blocking}:
    with ae.BlockingEngine() as be:
        x = be.new_var("x")
        assert be.push_sync(lambda r: 1, mutate_vars=[x]).result() == 1
        assert type(signal.getsignal(signal.SIGINT)).__name__ == "_Guard"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
cancelled = []

async def main():
    async with made_before or ae.Engine() as engine:
        x = engine.new_var("x")
        await engine.push_sync(lambda r: None, mutate_vars=[x])
        assert type(signal.getsignal(signal.SIGINT)).__name__ == "_Guard"
        threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT)).start()
        try:
            await asyncio.sleep(20)
        except asyncio.CancelledError:
            cancelled.append(True)  # the runner's first Ctrl-C cancels the main task
            raise

try:
    asyncio.run(main())
except KeyboardInterrupt:
    pass
else:
    raise AssertionError("no KeyboardInterrupt")
assert cancelled == [True], cancelled
assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
print("ok", flush=True)
"""


@pytest.mark.parametrize(
    ("before", "blocking"),
    [(False, False), (True, False), (False, True)],
    ids=["engine-inside", "engine-made-before", "after-a-blocking-engine"],
)
def test_asyncio_run_keeps_its_ctrl_c(before: bool, blocking: bool) -> None:
    """The wrapper goes in when an engine is first used on the main thread (inside
    ``asyncio.run``: over the runner's handler) and out when the last one closes, so the
    runner's first Ctrl-C still cancels the main task and it restores the default handler."""
    script = ASYNCIO_RUN.format(compiled=COMPILED, before=before, blocking=blocking)
    run_script(script, "asyncio.run with an engine")
