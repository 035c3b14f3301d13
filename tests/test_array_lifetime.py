"""How long an array namespace, its engine and its loop thread live, and which loop a
namespace serves: engines that had ``aioengine.array.namespace()`` called on them are freed
once dropped; a ``BlockingEngine`` dropped unclosed does not keep its loop thread; and a
``BlockingEngine``'s namespace (``aioengine.array_api``'s too) works when first used inside a
running loop of another (a notebook's, ``asyncio.run()``'s), where a sync point waits (the
engine's loop runs on its own thread, so it cannot deadlock) and ``await`` works too.
"""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import tempfile
import threading
import weakref
from pathlib import Path

import numpy as np
import pytest

import aioengine as ae
import aioengine.array as aa

from .conftest import COMPILED

# -- engines with namespaces are freed ------------------------------------------------------


async def test_engines_with_namespaces_are_freed() -> None:
    refs = []
    for i in range(20):
        engine = ae.Engine(cpu_workers=1)
        async with engine:
            xp = aa.namespace(engine)
            x = xp.ones(3) * i
            assert (await x).tolist() == [float(i)] * 3
            assert aa.namespace(engine) is xp  # the same object while it is held
        refs.append(weakref.ref(engine))
        del engine, xp, x
    gc.collect()
    assert [ref() for ref in refs] == [None] * 20


def test_blocking_engines_with_namespaces_are_freed() -> None:
    refs = []
    for i in range(20):
        with ae.BlockingEngine(cpu_workers=1) as be:
            xp = aa.namespace(be)
            assert float(xp.sum(xp.ones(3) * i)) == 3.0 * i
        refs += [weakref.ref(be), weakref.ref(be.engine)]
        del be, xp
    gc.collect()
    assert [ref() for ref in refs] == [None] * 40


@pytest.mark.filterwarnings("ignore:.*garbage collected without being closed:ResourceWarning")
def test_an_unclosed_blocking_engine_dropped_stops_its_threads() -> None:
    """Dropped without close(), with a namespace and arrays: the loop thread stops (and the
    engine's pool, as for an unclosed Engine: with a ResourceWarning)."""
    before = set(threading.enumerate())
    be = ae.BlockingEngine(cpu_workers=1).__enter__()
    xp = aa.namespace(be)
    assert float(xp.sum(xp.ones(100_000))) == 100_000.0  # big enough for the pool
    started = {t for t in set(threading.enumerate()) - before if t.name.startswith("aioengine-")}
    ref, engine_ref = weakref.ref(be), weakref.ref(be.engine)
    del be, xp
    gc.collect()
    assert ref() is None
    assert any(t.name == "aioengine-loop" for t in started)
    for thread in started:
        if thread.name != "aioengine-finalizer-calls":  # the process's one, for good
            thread.join(30)
            assert not thread.is_alive(), thread.name
    gc.collect()  # here, where its ResourceWarning is expected
    assert engine_ref() is None


# -- a BlockingEngine's namespace inside another loop ---------------------------------------


async def test_a_blocking_engines_namespace_made_inside_a_running_loop() -> None:
    with ae.BlockingEngine(cpu_workers=1) as be:
        xp = aa.namespace(be)  # this thread runs another loop than the engine's
        x = xp.arange(4.0) * 2
        assert float(xp.sum(x)) == 12.0  # a sync point waits: the engine's loop is elsewhere
        assert (await x).tolist() == [0.0, 2.0, 4.0, 6.0]  # await works too
        positive = x[x > 1]
        assert positive.shape == (3,)
        assert str(positive) == "[2. 4. 6.]"
        np.testing.assert_array_equal(np.asarray(xp.cumulative_sum(x)), [0.0, 2.0, 6.0, 12.0])


NOTEBOOK_SCRIPT = """\
import asyncio
import aioengine as ae

assert ae.engine._COMPILED is {compiled}, "the subprocess imported the other build"

async def main():
    # A notebook cell: the kernel's loop runs; aioengine.array_api is first used here.
    import aioengine.array_api as xp
    x = xp.ones(3) + 1
    print(float(xp.sum(x)))
    assert (await x).tolist() == [2.0, 2.0, 2.0]
    assert x[x > 1].shape == (3,)
    assert str(x) == "[2. 2. 2.]"
    assert xp.default_namespace().__name__ == "aioengine.array_api"

asyncio.run(main())
print("ok", flush=True)
"""


def test_the_array_api_module_first_used_inside_a_running_loop() -> None:
    """In a subprocess, where ``aioengine.array_api``'s engine is not started yet."""
    script = NOTEBOOK_SCRIPT.format(compiled=COMPILED)
    env = dict(os.environ, PYTHONPATH=str(Path(ae.__file__).parent.parent))
    try:
        proc = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            cwd=tempfile.gettempdir(),
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"deadlock: the script did not finish within 60 s: {exc.stderr!r}")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["6.0", "ok"], proc.stdout


async def test_an_engine_on_the_running_loop_still_refuses_to_block_it(
    engine: ae.Engine,
) -> None:
    """Waiting is right only for an engine whose loop is not the caller's."""
    xp = aa.namespace(engine)
    s = xp.sum(xp.ones(3))
    with pytest.raises(aa.PendingArrayError):
        float(s)
    assert float(await s) == 3.0
    assert await asyncio.to_thread(float, xp.sum(xp.ones(4))) == 4.0
