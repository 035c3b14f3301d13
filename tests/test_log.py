"""DEBUG logging of push/start/finish/skip, installed only when enabled at engine creation."""

from __future__ import annotations

import logging

import pytest

import aioengine as ae
from aioengine.observe.log import OpLogger


def boom(rctx: ae.RunContext) -> None:
    raise ValueError("boom")


class TestDebugLog:
    async def test_records_every_step(self, caplog: pytest.LogCaptureFixture) -> None:
        caplog.set_level(logging.DEBUG, logger="aioengine")
        async with ae.Engine(cpu_workers=1) as engine:
            assert any(isinstance(i, OpLogger) for i in engine._core.instruments)
            x = engine.new_var("x")
            failed = engine.push_sync(boom, mutate_vars=[x], name="boom")
            skipped = engine.push_sync(lambda r: None, const_vars=[x], name="after")
            with pytest.raises(ValueError, match="boom"):
                await failed
            with pytest.raises(ae.DependencyError):
                await skipped
            with pytest.raises(ValueError, match="boom"):
                await engine.wait_for_var(x)
        messages = [r.getMessage() for r in caplog.records if r.name == "aioengine"]
        assert any(m.startswith("push #1 'boom' reads=[] writes=[x] on cpu0") for m in messages)
        assert "start #1 'boom'" in messages
        assert "failed #1 'boom': ValueError: boom" in messages
        assert any(m.startswith("push #2 'after' reads=[x] writes=[]") for m in messages)
        assert "skipped #2 'after': DependencyError" in "\n".join(messages)
        assert "start #2 'after'" not in messages

    def test_not_installed_without_debug(self, caplog: pytest.LogCaptureFixture) -> None:
        caplog.set_level(logging.INFO, logger="aioengine")
        assert ae.Engine()._core.instruments == ()

    async def test_quiet_when_debug_is_turned_off_later(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.DEBUG, logger="aioengine")
        async with ae.Engine(cpu_workers=1) as engine:
            caplog.set_level(logging.INFO, logger="aioengine")
            caplog.clear()
            await engine.push_sync(lambda r: None)
        assert [r for r in caplog.records if r.levelno == logging.DEBUG] == []
