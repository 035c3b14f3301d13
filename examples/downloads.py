"""Parallel downloads accumulated into one Var, in any order and in push order.

The example starts a small HTTP server (aiohttp, on a free port of 127.0.0.1) whose files take
varied times to serve, so the downloads finish in another order than they were started. Then:

* ``engine.submit(fetch, url, accumulate=summary, merge=combine)`` downloads every file with
  a coroutine operation that holds no turn on ``summary`` (so all downloads overlap) and
  merges each file's byte count and 64-bit fingerprint into ``summary`` as a *commute*
  access: in the order the downloads finish, one merge at a time;
* the same with ``ordered=True`` and a merge that is not commutative (a SHA-256 chain over
  the files' bytes): the downloads still overlap, the merges run in push order, and the
  result is the sequential program's.

Run: python examples/downloads.py   (AIOENGINE_EXAMPLE_SMALL=1 for a quick run)
Needs: aiohttp, with pip install '.[examples]' from a checkout (or 'aioengine[examples]')
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import time

from aiohttp import ClientSession, web

import aioengine as ae

SMALL = os.environ.get("AIOENGINE_EXAMPLE_SMALL") == "1"
N_FILES = 12 if SMALL else 100
FILES = {f"f{i}.bin": random.Random(i).randbytes(2_000 + 97 * i) for i in range(N_FILES)}


async def serve() -> tuple[web.AppRunner, str]:
    """The server: each file takes a pseudo-random 1-20 ms to serve."""

    async def handler(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        await asyncio.sleep(random.Random(name).uniform(0.001, 0.02))
        return web.Response(body=FILES[name])

    app = web.Application()
    app.router.add_get("/{name}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


def fingerprint(body: bytes) -> tuple[int, int]:
    return len(body), int.from_bytes(hashlib.sha256(body).digest()[:8], "big")


def combine(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    """Commutative and associative: the result does not depend on the merge order."""
    return a[0] + b[0], a[1] ^ b[1]


def chain(state: tuple[int, bytes], body: bytes) -> tuple[int, bytes]:
    """Not commutative: the SHA-256 chain of the bodies in merge order."""
    return state[0] + len(body), hashlib.sha256(state[1] + body).digest()


async def main() -> None:
    runner, base = await serve()
    finished: list[str] = []
    try:
        async with ClientSession() as http, ae.Engine() as engine:

            async def get(name: str) -> bytes:
                async with http.get(f"{base}/{name}") as response:
                    body = await response.read()
                finished.append(name)
                return body

            async def fetch(name: str) -> tuple[int, int]:
                return fingerprint(await get(name))

            summary = engine.new_var("summary", value=(0, 0))
            start = time.perf_counter()
            for name in FILES:
                engine.submit(fetch, name, accumulate=summary, merge=combine)
            size, digest = await summary.get()
            unordered = time.perf_counter() - start

            stream = engine.new_var("stream", value=(0, b""))
            for name in FILES:
                engine.submit(get, name, accumulate=stream, merge=chain, ordered=True)
            total, chained = await stream.get()
    finally:
        await runner.cleanup()

    expected = (0, 0)
    expected_chain = (0, b"")
    for body in FILES.values():  # the sequential program
        expected = combine(expected, fingerprint(body))
        expected_chain = chain(expected_chain, body)
    assert (size, digest) == expected
    assert (total, chained) == expected_chain
    in_push_order = finished[:N_FILES] == list(FILES)
    print(
        f"{N_FILES} files, {size} bytes, fingerprint {digest:016x} in {unordered * 1000:.0f} ms "
        f"(finished {'in' if in_push_order else 'out of'} push order); "
        f"ordered=True: sha256 chain {chained.hex()[:16]}... as the sequential program's"
    )


if __name__ == "__main__":
    asyncio.run(main())
