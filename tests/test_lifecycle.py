"""lifecycle.py: the package's fork, exit and garbage-collection hooks, in one place."""

from __future__ import annotations

import gc
import logging
import textwrap

import pytest

import aioengine as ae
from aioengine import lifecycle

from .test_fork import needs_fork, run_script


class Thing:
    """A registrable object: weakly referenceable, and unhashable (compared by identity)."""

    __hash__ = None  # type: ignore[assignment]

    def __init__(self, name: str) -> None:
        self.name = name

    def __eq__(self, other: object) -> bool:
        return True  # every Thing equals every other: the registry must not care

    def hook(self) -> None:
        pass


def test_hooks_run_in_registration_order_and_a_second_add_replaces_in_place() -> None:
    registry = lifecycle.Registry("test")
    calls: list[str] = []
    a, b, c = Thing("a"), Thing("b"), Thing("c")
    for thing in (a, b, c):
        registry.add(thing, lambda t: calls.append(t.name))
    registry.add(a, lambda t: calls.append(t.name.upper()))
    assert len(registry) == 3
    registry.run()
    assert calls == ["A", "b", "c"]


def test_registrations_are_weak_and_a_dropped_object_is_not_called() -> None:
    registry = lifecycle.Registry("test")
    calls: list[str] = []
    kept, dropped = Thing("kept"), Thing("dropped")
    registry.add(kept, lambda t: calls.append(t.name))
    registry.add(dropped, lambda t: calls.append(t.name))
    assert dropped in registry
    del dropped
    gc.collect()
    assert len(registry) == 1
    registry.run()
    assert calls == ["kept"]


def test_discard_forgets_only_that_object() -> None:
    registry = lifecycle.Registry("test")
    calls: list[str] = []
    a, b = Thing("a"), Thing("b")
    registry.add(a, lambda t: calls.append(t.name))
    registry.add(b, lambda t: calls.append(t.name))
    registry.discard(a)
    registry.discard(Thing("never added"))
    assert a not in registry
    assert b in registry
    registry.run()
    assert calls == ["b"]


def test_a_hook_that_raises_is_logged_and_the_others_run(caplog: pytest.LogCaptureFixture) -> None:
    registry = lifecycle.Registry("test_registry")
    calls: list[str] = []

    def fail(thing: Thing) -> None:
        raise ValueError(f"broken {thing.name}")

    things = [Thing("a"), Thing("b"), Thing("c")]
    registry.add(things[0], lambda t: calls.append(t.name))
    registry.add(things[1], fail)
    registry.add(things[2], lambda t: calls.append(t.name))
    with caplog.at_level(logging.ERROR, logger="aioengine"):
        registry.run()
    assert calls == ["a", "c"]
    (record,) = caplog.records
    assert record.name == "aioengine"
    assert "test_registry" in record.getMessage()
    assert record.exc_info is not None
    assert str(record.exc_info[1]) == "broken b"


def test_a_hook_bound_to_its_object_is_refused() -> None:
    registry = lifecycle.Registry("test")
    thing = Thing("a")
    with pytest.raises(ValueError, match="would keep it alive"):
        registry.add(thing, thing.hook)  # type: ignore[arg-type]
    registry.add(thing, Thing.hook)  # the function, which takes the object, is fine
    assert thing in registry


def test_install_runs_once_with_the_first_registration() -> None:
    installs: list[int] = []
    registry = lifecycle.Registry("test", install=lambda: installs.append(1))
    assert installs == []
    a, b = Thing("a"), Thing("b")
    registry.add(a, Thing.hook)
    registry.add(b, Thing.hook)
    assert installs == [1]


def test_full_collections_run_the_gc_registry() -> None:
    calls: list[str] = []
    thing = Thing("watched")
    lifecycle.engines_before_full_collection.add(thing, lambda t: calls.append(t.name))
    try:
        assert gc.callbacks.count(lifecycle._before_collection) == 1
        gc.collect(0)
        assert calls == []  # a young collection does not
        gc.collect()
        assert calls == ["watched"]
    finally:
        lifecycle.engines_before_full_collection.discard(thing)


# The child prints the hooks it runs, in order; the parent runs none of them.
FORK_ORDER = """
import gc, os, warnings
from aioengine import lifecycle
warnings.simplefilter("ignore", DeprecationWarning)

class Thing:
    def __init__(self, name):
        self.name = name

calls = []
things = []
for registry in (lifecycle.portals_after_fork, lifecycle.engines_after_fork,
                 lifecycle.pollers_after_fork, lifecycle.pools_after_fork):
    for i in range(2):
        thing = Thing(f"{registry.name}{i}")
        registry.add(thing, lambda t: calls.append(t.name))
        things.append(thing)
dropped = Thing("dropped")
lifecycle.pools_after_fork.add(dropped, lambda t: calls.append(t.name))
del dropped
gc.collect()
pid = os.fork()
if pid == 0:
    print(" ".join(calls), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
print("parent:", calls, flush=True)
"""


@needs_fork
def test_fork_runs_the_child_hooks_lower_layers_first() -> None:
    proc = run_script(textwrap.dedent(FORK_ORDER))
    assert proc.returncode == 0, proc.stderr
    child, parent = proc.stdout.splitlines()
    assert child.split() == [
        "pools_after_fork0",
        "pools_after_fork1",
        "pollers_after_fork0",
        "pollers_after_fork1",
        "engines_after_fork0",
        "engines_after_fork1",
        "portals_after_fork0",
        "portals_after_fork1",
    ]
    assert parent == "parent: []"


# A non-daemon thread waits for the pools' exit hook: pools run before Python joins it, the
# portals only after it has ended.
EXIT_ORDER = """
import threading
from aioengine import lifecycle

class Thing:
    pass

pools, portals = Thing(), Thing()
stopped = threading.Event()

def stop(thing):
    print("pools", flush=True)
    stopped.set()

lifecycle.pools_at_exit.add(pools, stop)
lifecycle.portals_at_exit.add(portals, lambda t: print("portals", flush=True))

def worker():
    stopped.wait(30)
    print("thread ends", flush=True)

threading.Thread(target=worker).start()
print("main ends", flush=True)
"""


def test_exit_runs_pools_before_joining_threads_and_portals_after() -> None:
    proc = run_script(textwrap.dedent(EXIT_ORDER))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:-1] == ["main ends", "pools", "thread ends", "portals"]


async def test_new_var_on_a_closed_engine_raises_like_every_other_call() -> None:
    engine = ae.Engine()
    engine.new_var("before")
    await engine.aclose()
    with pytest.raises(ae.EngineClosedError, match="closed"):
        engine.new_var("after")
    with pytest.raises(ae.EngineClosedError, match="closed"):
        engine.new_var("after", value=1)


def test_a_plain_with_says_to_use_async_with_or_blocking_engine() -> None:
    engine = ae.Engine()
    with pytest.raises(TypeError, match=r"async with.*BlockingEngine"), engine:
        pytest.fail("the body of a plain `with` must not run")
