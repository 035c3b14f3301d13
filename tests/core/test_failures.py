"""The failure ledger (failures.py): throw-once and retirement, on its own and in an engine."""

from __future__ import annotations

import pytest

import aioengine as ae
from aioengine.failures import Ledger
from aioengine.var import Failure

from ..helpers import Boom


def test_a_failure_is_thrown_once_and_retired_when_nothing_can_see_it() -> None:
    ledger = Ledger()
    first, second = Failure(Boom("first")), Failure(Boom("second"))
    ledger.record(first)
    ledger.record(second)
    assert ledger.take(first, seq=5, oldest=3) is first.exc
    assert ledger.take(first, seq=6, oldest=3) is None  # thrown already
    assert first.seen_by(5)
    assert not first.seen_by(6)
    assert list(ledger.failures) == [first, second]  # operation 3 may still see it
    ledger.retire(oldest=6)
    assert list(ledger.failures) == [second]
    assert first.exc is None  # retired: its exception is dropped
    errors = ledger.take_all(seq=7, oldest=None)
    assert [str(e) for e in errors] == ["second"]
    assert ledger.failures == {}
    assert ledger.thrown == []
    ledger.validate()


def test_retire_keeps_what_an_older_live_operation_sees() -> None:
    ledger = Ledger()
    box = Failure(Boom())
    ledger.record(box)
    ledger.throw(box, seq=10)
    ledger.retire(oldest=10)  # operation 10 was pushed before the throw (seq <= cleared)
    assert box in ledger.failures
    ledger.retire(oldest=11)
    assert box not in ledger.failures


async def test_the_engine_throws_a_failure_once() -> None:
    async with ae.Engine() as engine:
        v = engine.new_var("v")

        def fail(rctx: ae.RunContext) -> None:
            raise Boom("once")

        engine.push_sync(fail, mutate_vars=[v])
        with pytest.raises(Boom):
            await engine.wait_for_var(v)
        await engine.wait_for_var(v)  # thrown: the second wait does not raise
        assert engine._core.ledger.failures == {}  # retired: nothing live saw it
