"""The core's API for its collaborators (issue 36): what gpu_sync, fence, remote and the façade
call instead of writing an operation's, a Var's or a handle's private fields.

- ``var.fences_of``: the one slot a Var keeps for the GPU collaborator, holding a
  ``fence.VarFences`` that fence.py alone changes;
- ``var.carry_failure_locked``: the failure a Var carries (remote versions);
- ``operation.wait_for_fences_locked`` / ``fence_settled_locked``: a host consumer's count of
  GPU fences to wait for;
- ``operation.delete_handle_locked``: retiring an ``OprHandle``;
- a GPU operation's outcome travels on its fence until the fence settles, then is dropped
  there (its Vars keep their last fences).
"""

from __future__ import annotations

import gc
import os
import textwrap
import time
import weakref
from typing import Any

import pytest

import aioengine as ae
from aioengine.fence import Fence, VarFences, has_pending, note_launch
from aioengine.operation import (
    Operation,
    delete_handle_locked,
    fence_settled_locked,
    new_operation,
    wait_for_fences_locked,
)
from aioengine.var import Failure, Var, carry_failure_locked, fences_of

from .helpers import until
from .test_fork import FORK_WITH_BLOCKING_ENGINE, needs_fork, run_script

GPU0 = ae.gpu(0)


def standalone_op(name: str = "op") -> Operation[Any]:
    """A PENDING operation of no engine (its fields as every push makes them)."""
    return new_operation(None, None, None, 0, ae.cpu(0), (), (), ae.FnProperty.NORMAL, 0, name)  # type: ignore[arg-type]


class Blob:
    """A weak-referenceable stand-in for a device array."""


# -- a Var's GPU sync state ----------------------------------------------------------------


def test_a_var_has_no_fence_state_until_a_gpu_operation_uses_it() -> None:
    var = Var(object(), "x")
    assert var._fences is None
    assert not has_pending(var)
    state = fences_of(var, VarFences)
    assert isinstance(state, VarFences)
    assert fences_of(var, VarFences) is state  # made once


def test_note_launch_records_readers_per_stream_and_a_write_replaces_them() -> None:
    owner = object()
    x, y = Var(owner, "x"), Var(owner, "y")
    s1, s2 = Blob(), Blob()
    read1 = Fence(None, None, "e1", s1, 0, 1, ())
    read2 = Fence(None, None, "e2", s2, 0, 2, ())
    note_launch((x,), (y,), read1)
    note_launch((x,), (), read2)
    state = x._fences
    assert state._writer is None
    assert state._readers == {id(s1): read1, id(s2): read2}
    assert y._fences._writer is read1
    assert y._fences._readers is None
    assert has_pending(x)
    assert has_pending(y)
    write = Fence(None, None, "e3", s1, 0, 3, ())
    note_launch((), (x,), write)
    assert state._writer is write
    assert state._readers is None
    write.status = 0
    assert not has_pending(x)


# -- a host consumer's fence count ---------------------------------------------------------


def test_a_host_consumer_may_start_once_its_last_fence_settled() -> None:
    op = standalone_op()
    wait_for_fences_locked(op, 2)
    assert op.nfwait == 2
    assert fence_settled_locked(op) is False
    assert fence_settled_locked(op) is True
    assert op.nfwait == 0
    assert fence_settled_locked(op) is False  # not waiting: nothing to count


def test_a_cancelled_host_consumer_is_not_counted() -> None:
    op = standalone_op()
    wait_for_fences_locked(op, 1)
    op._state = ae.OpState.CANCELLED
    assert fence_settled_locked(op) is False
    assert op.nfwait == 1


# -- a Var's failure, a handle's deletion ------------------------------------------------------


def test_carry_failure_locked_sets_the_failure_a_var_carries() -> None:
    var = Var(object(), "x")
    box = Failure(ValueError("lost"))
    carry_failure_locked(var, box)
    assert var._failure is box
    assert var.statistics().failed


async def test_a_handle_is_deleted_once() -> None:
    async with ae.Engine() as engine:
        x = engine.new_var("x")
        handle = engine.new_operator(lambda r: None, mutate_vars=[x])
        with engine._core.lock:
            assert delete_handle_locked(handle) is True
            assert delete_handle_locked(handle) is False
        assert "deleted" in repr(handle)
        with pytest.raises(ae.OperatorDeletedError):
            engine.delete_operator(handle)
        with pytest.raises(ae.OperatorDeletedError):
            engine.push(handle)


# -- a GPU operation's outcome ------------------------------------------------------------------


@pytest.mark.parametrize("gpu_sync", ["event", "host"])
async def test_a_gpu_result_reaches_its_operation_and_not_the_vars_last_fence(
    gpu_sync: str,
) -> None:
    sim = ae.SimulatedGPU(manual=True)
    async with ae.Engine(gpu_backend=sim, gpu_sync=gpu_sync) as engine:
        x = engine.new_var("x")
        made = [Blob()]  # only the operation's function holds it: it returns it
        ref = weakref.ref(made[0])

        def make(rctx: ae.RunContext) -> Blob:
            rctx.launch(time.sleep, 0)
            return made.pop()

        op = engine.push_sync(make, GPU0, [], [x])
        await until(lambda: sim.queued == 1)
        sim.run_until_idle()
        assert await op is ref()
        fence = x._fences._writer  # the Var keeps its last fence after it settled
        assert fence.status == 0
        assert fence.result is None
        assert fence.exc is None
        assert fence.op is None
        del op
        await until(lambda: (gc.collect(), ref() is None)[1])


@pytest.mark.parametrize("gpu_sync", ["event", "host"])
async def test_a_gpu_exception_reaches_its_operation(gpu_sync: str) -> None:
    sim = ae.SimulatedGPU()
    async with ae.Engine(gpu_backend=sim, gpu_sync=gpu_sync) as engine:
        x = engine.new_var("x")

        def bad(rctx: ae.RunContext) -> None:
            rctx.launch(time.sleep, 0)
            raise ValueError("after the launch")

        op = engine.push_sync(bad, GPU0, [], [x])
        with pytest.raises(ValueError, match="after the launch"):
            await op
        assert isinstance(op.exception(), ValueError)
        with pytest.raises(ValueError):
            await engine.wait_for_var(x)


# -- a BlockingEngine in a forked child, under asyncio's debug mode -------------------------------


@needs_fork
def test_a_blocking_engine_in_a_forked_child_exits_in_asyncio_debug_mode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The child marks the parent's portal stopped without its loop; in debug mode asyncio
    refuses the stop event's wake-up from the child's thread, after the portal is marked."""
    monkeypatch.setenv("PYTHONASYNCIODEBUG", "1")
    assert os.environ["PYTHONASYNCIODEBUG"] == "1"
    proc = run_script(textwrap.dedent(FORK_WITH_BLOCKING_ENGINE))
    assert proc.returncode == 0, proc.stderr
    child, parent = proc.stdout.splitlines()
    assert child.split() == ["push:ok", "wait:ok", "own:7"]
    assert parent == "parent:ok 0"
