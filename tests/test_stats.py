"""Engine statistics: counts per pool and state; busy time with a recorder."""

from __future__ import annotations

import asyncio

import pytest

import aioengine as ae

from .test_dump import Hang


def boom(rctx: ae.RunContext) -> None:
    raise ValueError("boom")


class TestStatistics:
    async def test_counts(self, threaded_engine: ae.Engine) -> None:
        engine = threaded_engine
        hang = Hang()
        try:
            x, y, z = engine.new_var("x"), engine.new_var("y"), engine.new_var("z")
            assert engine.statistics() == ae.EngineStatistics()

            async def coro(rctx: ae.RunContext) -> None:
                await asyncio.sleep(0)

            await engine.push_sync(lambda r: None, mutate_vars=[y])
            await engine.push_sync(lambda r: None, prop=ae.FnProperty.CPU_PRIORITIZED)
            await engine.push_async(coro)
            failed = engine.push_sync(boom, mutate_vars=[x])
            skipped = engine.push_sync(lambda r: None, const_vars=[x])
            await asyncio.gather(failed, skipped, return_exceptions=True)
            engine.push_async(hang, mutate_vars=[z], name="hang")
            waiting = engine.push_sync(lambda r: None, const_vars=[z])
            cancelled = engine.push_sync(lambda r: None, const_vars=[z])
            assert cancelled.cancel()
            await hang.running()
            stats = engine.statistics()
            assert stats.pools == {
                "cpu-priority": ae.PoolStatistics(pushed=1, done=1),
                "cpu0": ae.PoolStatistics(
                    pushed=6, done=1, failed=1, skipped=1, cancelled=1, running=1, waiting=1
                ),
                "loop": ae.PoolStatistics(pushed=1, done=1),
            }
            assert (stats.pushed, stats.done, stats.running, stats.waiting) == (8, 3, 1, 1)
            assert (stats.failed, stats.skipped, stats.cancelled, stats.queued) == (1, 1, 1, 0)
            assert stats.finished == 6
            assert stats.busy_s is None
            hang.release()
            await waiting
            with pytest.raises(BaseExceptionGroup):
                await engine.wait_for_all()
            assert engine.statistics().done == 5
        finally:
            hang.release()

    async def test_serial_mode_runs_everything_on_the_loop(self, serial: bool) -> None:
        async with ae.Engine(cpu_workers=1, serial=serial) as engine:
            await engine.push_sync(lambda r: None)
            stats = engine.statistics()
        assert list(stats.pools) == ["loop" if serial else "cpu0"]
        assert stats.pushed == stats.done == 1

    async def test_busy_time_with_a_recorder(self, threaded_engine: ae.Engine) -> None:
        engine = threaded_engine
        engine.record_history()
        await engine.push_sync(lambda r: __import__("time").sleep(0.02))
        stats = engine.statistics()
        assert stats.busy_s is not None
        assert stats.busy_s >= 0.015
        assert stats.pools["cpu0"].busy_s == stats.busy_s

    def test_var_statistics_still_work(self) -> None:
        engine = ae.Engine()
        assert engine.new_var("x").statistics() == ae.VarStatistics(0, False, 0, 0, False)
