"""An async web crawler: fetches are I/O operations, parsing is CPU work, politeness is a Var.

The example starts its own small web of sites: one aiohttp server per "host", each on a free
port of 127.0.0.1, serving pages that link to each other across hosts. The crawler then:

* fetches every page with a coroutine operation (aiohttp) that *mutates* its host's
  ``polite`` Var, so the engine never sends two requests to one host at once and keeps a
  gap between them, while different hosts are fetched concurrently (no lock, no semaphore:
  the rule does it);
* parses each page on the CPU pool with an ordinary function (``engine.submit``) that
  receives the page text through a Var carrying it;
* follows new links as each parse finishes, until the whole web is crawled.

The servers count how many requests each host has in flight, so the run proves politeness.

Run: python examples/crawler.py   (AIOENGINE_EXAMPLE_SMALL=1 for a quick run)
Needs: aiohttp, with pip install '.[examples]' from a checkout (or 'aioengine[examples]')
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import time
from urllib.parse import urlsplit

from aiohttp import ClientSession, web

import aioengine as ae

SMALL = os.environ.get("AIOENGINE_EXAMPLE_SMALL") == "1"
HOSTS = 3 if SMALL else 5
PAGES = 8 if SMALL else 40  # per host
POLITE_GAP = 0.002 if SMALL else 0.01  # seconds between two requests to one host
LINK = re.compile(r'href="([^"]+)"')


class Web:
    """``HOSTS`` local servers; every page links to the next one, to another host and at random."""

    def __init__(self) -> None:
        self.ports: list[int] = []
        self.in_flight = [0] * HOSTS
        self.max_in_flight = [0] * HOSTS
        self.served = 0
        self._runners: list[web.AppRunner] = []

    def url(self, host: int, page: int) -> str:
        return f"http://127.0.0.1:{self.ports[host]}/page/{page}"

    def _handler(self, host: int) -> web.RequestHandler:
        async def page(request: web.Request) -> web.Response:
            i = int(request.match_info["i"])
            self.in_flight[host] += 1
            self.max_in_flight[host] = max(self.max_in_flight[host], self.in_flight[host])
            try:
                await asyncio.sleep(0.003)  # the network and the server's own work
                rng = random.Random(host * 1000 + i)
                links = [self.url(host, (i + 1) % PAGES), self.url((host + 1) % HOSTS, i)]
                links += [self.url(rng.randrange(HOSTS), rng.randrange(PAGES)) for _ in range(3)]
                words = " ".join(f"word{rng.randrange(100)}" for _ in range(200))
                body = "".join(f'<a href="{u}">link</a> ' for u in links)
                self.served += 1
                return web.Response(text=f"<html><p>{words}</p>{body}</html>")
            finally:
                self.in_flight[host] -= 1

        return page

    async def start(self) -> None:
        for host in range(HOSTS):
            app = web.Application()
            app.router.add_get("/page/{i}", self._handler(host))
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)  # a free port
            await site.start()
            server = site._server
            assert server is not None
            self.ports.append(server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]
            self._runners.append(runner)

    async def stop(self) -> None:
        for runner in self._runners:
            await runner.cleanup()


def parse(html: str) -> tuple[list[str], int]:
    """CPU work on the engine's pool: the links of a page and its word count."""
    return LINK.findall(html), len(re.findall(r"\bword\d+\b", html))


async def crawl(site: Web, start: str, max_pages: int) -> dict[str, int]:
    words: dict[str, int] = {}
    async with ClientSession() as session, ae.Engine() as engine:
        polite: dict[str, ae.Var] = {}  # one Var per host: fetches to a host mutate it
        seen: set[str] = set()

        async def fetch(url: str) -> str:
            async with session.get(url) as response:
                response.raise_for_status()
                text = await response.text()
            await asyncio.sleep(POLITE_GAP)  # still holding the host's Var: the polite gap
            return text

        async with asyncio.TaskGroup() as tasks:

            def visit(url: str) -> None:
                if url in seen or len(seen) >= max_pages:
                    return
                seen.add(url)
                host = urlsplit(url).netloc
                if host not in polite:
                    polite[host] = engine.new_var(f"polite {host}")
                page = engine.new_var(f"page {url}")
                # I/O: a coroutine operation; one at a time per host, hosts in parallel.
                engine.submit(fetch, url, writes=[polite[host]], out=page, name=f"fetch {url}")
                # CPU: runs on the pool once the page Var holds the text.
                parsed = engine.submit(parse, page, name=f"parse {url}")
                tasks.create_task(follow(url, parsed))

            async def follow(url: str, parsed: ae.Operation[tuple[list[str], int]]) -> None:
                links, count = await parsed
                words[url] = count
                for link in links:
                    visit(link)

            visit(start)
    return words


async def main() -> None:
    site = Web()
    await site.start()
    try:
        t0 = time.perf_counter()
        words = await crawl(site, site.url(0, 0), max_pages=HOSTS * PAGES)
        wall = time.perf_counter() - t0
    finally:
        await site.stop()
    serial_floor = len(words) * (0.003 + POLITE_GAP)
    print(
        f"crawled {len(words)} pages on {HOSTS} hosts in {wall:.2f} s "
        f"({sum(words.values())} words); one-at-a-time would take >= {serial_floor:.2f} s"
    )
    print(f"max requests in flight per host: {site.max_in_flight} (politeness: 1)")
    assert len(words) == HOSTS * PAGES == site.served
    assert max(site.max_in_flight) == 1


if __name__ == "__main__":
    asyncio.run(main())
