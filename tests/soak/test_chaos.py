"""The CI-sized chaos soak (see ``chaos.py`` for what it injects and checks).

``AIOENGINE_SOAK_SECONDS`` sets the total duration over both loops (default 40 s: half on the
default asyncio loop, half on uvloop). For long runs use ``python -m tests.soak.run --minutes N``
(``nox -s soak -- --minutes N``).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

from tests.soak import chaos


class TestChaosSoak:
    async def test_random_faulty_programs_keep_every_promise(
        self, record_property: Callable[[str, object], None]
    ) -> None:
        loop = asyncio.get_running_loop()
        loop_name = "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
        loop.set_debug(False)  # debug mode's slow-callback checks would dominate the run
        seed = random.randrange(2**32)
        seconds = chaos.default_seconds() / 2  # the test runs once per loop implementation
        report = await chaos.soak(seconds, seed, loop_name)
        print(f"\nseed={seed}\n{report.summary()}")
        record_property("seed", seed)
        record_property("ops_per_s", round(report.ops_per_s))
        for name, count in sorted(report.faults.items()):
            record_property(name, count)
        # It really ran, and really injected each kind of fault.
        assert report.ops > 0
        for fault in (
            "faults injected: sync raise",
            "faults injected: coro raise",
            "faults injected: callback on_complete",
            "ops skipped (input failed)",
            "ops cancelled before start",
            "delete_var",
            "operator pushes",
            "wait_for_var",
            "slow ops",
            "gpu ops",
            "ops grouped in bulk segments",
        ):
            assert report.faults[fault] > 0, f"the soak never exercised {fault!r}"
        # No growth: 64 MiB would be ~100 bytes per op of a typical run; RSS is noisy below.
        if report.rss_growth is not None:
            assert report.rss_growth < 64 * 2**20, report.summary()
