"""Processes: an engine is not usable in a forked child (clear error, no hang); spawn works.

After ``os.fork()`` the child has no copy of the parent's worker threads, and a lock may have
been copied while held, so every use of a parent's engine in the child raises RuntimeError at
once (MXNet deadlocks there with a pending Python op). The child can create its own Engine.
``multiprocessing`` with the ``spawn`` start method is the supported way to use processes.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import subprocess
import sys
import textwrap

import pytest

import aioengine as ae

HAS_FORK = hasattr(os, "fork")
needs_fork = pytest.mark.skipif(not HAS_FORK, reason="os.fork() is not available here")

# The child's report is printed as one line; the parent asserts on it. The parent has an
# operation running on a worker thread (holding the engine's Var) when it forks, and the
# child tries every kind of use of the parent's engine.
FORK_WITH_PENDING_OP = """
import asyncio, os, sys, threading, warnings
import aioengine as ae
warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads running (3.12+)

async def main():
    engine = ae.Engine(cpu_workers=2)
    x = engine.new_var("x")
    started, release = threading.Event(), threading.Event()
    running = engine.push_sync(lambda r: (started.set(), release.wait(10)), mutate_vars=[x])
    queued = engine.push_sync(lambda r: "queued", mutate_vars=[x])
    assert await asyncio.to_thread(started.wait, 10)
    pid = os.fork()
    if pid == 0:
        results = []
        def attempt(label, call):
            try:
                call()
            except RuntimeError as exc:
                results.append(label + ":" + ("ok" if "os.fork()" in str(exc) else repr(exc)))
            except BaseException as exc:
                results.append(label + ":wrong " + repr(exc))
            else:
                results.append(label + ":no error")
        attempt("push_sync", lambda: engine.push_sync(lambda r: None, mutate_vars=[x]))
        attempt("push_async", lambda: engine.push_async(lambda r, done: done()))
        attempt("wait_for_var", lambda: asyncio.run(engine.wait_for_var(x)))
        attempt("wait_for_all", lambda: asyncio.run(engine.wait_for_all()))
        attempt("aclose", lambda: asyncio.run(engine.aclose()))
        async def await_op():
            return await queued
        attempt("await", lambda: asyncio.run(await_op()))
        attempt("cancel", lambda: queued.cancel())
        async def own():
            async with ae.Engine(cpu_workers=2) as mine:
                v = mine.new_var("v")
                ops = [mine.push_sync(lambda r, i=i: i, mutate_vars=[v]) for i in range(100)]
                async def coro(rctx):
                    return "coro"
                ops.append(mine.push_async(coro, const_vars=[v]))
                return [await op for op in ops]
        results.append("own:" + repr(asyncio.run(own()) == list(range(100)) + ["coro"]))
        print(" ".join(results), flush=True)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    release.set()
    assert await queued == "queued"  # the parent is unaffected
    await engine.aclose()
    print("parent:ok", os.waitstatus_to_exitcode(status), flush=True)

asyncio.run(main())
"""


def run_script(body: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [sys.executable, "-c", body], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"deadlock: the processes did not finish within {timeout} s: {exc.stdout!r}")


class TestFork:
    @needs_fork
    def test_parent_engine_raises_in_the_child_and_the_child_can_make_its_own(self) -> None:
        proc = run_script(textwrap.dedent(FORK_WITH_PENDING_OP))
        assert proc.returncode == 0, proc.stderr
        child, parent = proc.stdout.splitlines()
        assert child.split() == [
            "push_sync:ok",
            "push_async:ok",
            "wait_for_var:ok",
            "wait_for_all:ok",
            "aclose:ok",
            "await:ok",
            "cancel:ok",
            "own:True",
        ]
        assert parent == "parent:ok 0"

    @needs_fork
    def test_the_error_says_what_to_do(self) -> None:
        body = textwrap.dedent(
            """
            import os, warnings
            import aioengine as ae
            warnings.simplefilter("ignore", DeprecationWarning)
            engine = ae.Engine(cpu_workers=1)
            engine.push_sync(lambda r: None)
            pid = os.fork()
            if pid == 0:
                try:
                    engine.new_var("x") and engine.push_sync(lambda r: None)
                except RuntimeError as exc:
                    print(exc, flush=True)
                os._exit(0)
            os.waitpid(pid, 0)
            """
        )
        proc = run_script(body)
        assert proc.returncode == 0, proc.stderr
        message = proc.stdout.strip()
        assert "cannot be used after os.fork()" in message
        assert "Create a new Engine in the child" in message
        assert "'spawn'" in message


# The parent's BlockingEngine is open when it forks: in the child it raises on use, a new one
# works, and the child's exit does not wait for the parent's loop thread (it used to hang).
FORK_WITH_BLOCKING_ENGINE = """
import os, sys, warnings
import aioengine as ae
warnings.simplefilter("ignore", DeprecationWarning)
be = ae.BlockingEngine(cpu_workers=1).__enter__()
assert be.submit(sum, [1, 2]).result(10) == 3
pid = os.fork()
if pid == 0:
    results = []
    for label, call in [("push", lambda: be.push_sync(lambda r: None)),
                        ("wait", lambda: be.wait_for_all(timeout=10))]:
        try:
            call()
        except RuntimeError as exc:
            results.append(label + ":" + ("ok" if "os.fork()" in str(exc) else repr(exc)))
        else:
            results.append(label + ":no error")
    with ae.BlockingEngine(cpu_workers=1) as mine:
        results.append("own:" + repr(mine.submit(sum, [3, 4]).result(10)))
    print(" ".join(results), flush=True)
    sys.exit(0)  # a normal exit: atexit runs in the child
_, status = os.waitpid(pid, 0)
assert be.submit(sum, [5, 6]).result(10) == 11
be.close()
print("parent:ok", os.waitstatus_to_exitcode(status), flush=True)
"""

# The parent forks while another thread holds a fence poller's lock and the poller registry's
# lock, and the poller's thread is alive: in the child, the poller starts over.
FORK_WITH_POLLER = """
import asyncio, os, threading, time, warnings
from aioengine import poller as poller_module
warnings.simplefilter("ignore", DeprecationWarning)
loop = asyncio.new_event_loop()
p = poller_module.poller_for(loop)
p.release([])  # starts its thread, which lingers
held, done = threading.Event(), threading.Event()
def hold():
    with poller_module._pollers_lock, p._cond:
        held.set()
        done.wait(30)
threading.Thread(target=hold).start()
held.wait(30)
assert p.alive
pid = os.fork()
if pid == 0:
    same = poller_module.poller_for(loop) is p
    forgot = not p.alive
    p.release([object()])  # takes the lock, starts a thread of the child's
    deadline = time.monotonic() + 30
    while p.alive and time.monotonic() < deadline:
        time.sleep(0.01)
    print(f"same:{same} forgot:{forgot} ended:{not p.alive}", flush=True)
    os._exit(0)
done.set()
_, status = os.waitpid(pid, 0)
print("parent:ok", os.waitstatus_to_exitcode(status), flush=True)
"""


class TestForkFrontEnds:
    @needs_fork
    def test_a_blocking_engine_raises_in_the_child_which_exits(self) -> None:
        proc = run_script(textwrap.dedent(FORK_WITH_BLOCKING_ENGINE))
        assert proc.returncode == 0, proc.stderr
        child, parent = proc.stdout.splitlines()
        assert child.split() == ["push:ok", "wait:ok", "own:7"]
        assert parent == "parent:ok 0"

    @needs_fork
    def test_a_poller_starts_over_in_the_child(self) -> None:
        proc = run_script(textwrap.dedent(FORK_WITH_POLLER))
        assert proc.returncode == 0, proc.stderr
        child, parent = proc.stdout.splitlines()
        assert child == "same:True forgot:True ended:True"
        assert parent == "parent:ok 0"


def spawned_job(n: int) -> list[int]:
    """Run in a spawned process: an Engine of its own computes a running sum."""

    async def main() -> list[int]:
        async with ae.Engine(cpu_workers=2) as engine:
            total = engine.new_var("total")
            box = [0]

            def add(rctx: ae.RunContext, i: int) -> int:
                box[0] += i
                return box[0]

            ops = [
                engine.push_sync(lambda r, i=i: add(r, i), mutate_vars=[total]) for i in range(n)
            ]
            return [await op for op in ops]

    return asyncio.run(main())


class TestSpawn:
    def test_multiprocessing_spawn_runs_engines_in_children(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(2) as pool:
            results = pool.map(spawned_job, [10, 20])
        assert results == [[sum(range(i + 1)) for i in range(n)] for n in (10, 20)]
