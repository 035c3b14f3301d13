"""A bank served over HTTP: one Var per account, transfers as transactions, ``ae.Abort`` refusals.

The example starts an aiohttp server on a free port of 127.0.0.1 and its own load generator:

* every account is a Var carrying its balance; a transfer is
  ``engine.submit(move, a, b, amount, out=(a, b))``, a transaction over the two accounts: it
  holds both Vars' turns, so no other operation on either account overlaps it, and the
  transfers of one account run in the order they were pushed (no lock by hand);
* a transfer the balance cannot cover raises :class:`ae.Abort` (a subclass of it): the
  client gets 409, and the two accounts keep their balances, with no failure recorded on
  them, so the next transfer runs as usual;
* ``GET /total`` reads every account in one operation: a barrier (it waits for every earlier
  transfer, and every later one waits for it), so each audit sees a consistent total;
* the operations are cheap, so they run inline on the event loop (``FnProperty.ASYNC``),
  and ``Engine(max_pending=...)`` bounds the work queued in the engine: a handler waits for
  room before it pushes (backpressure);
* at the end the server stops, ``aclose()`` drains the engine, and the final balances are
  read with ``Var.get()`` after the close.

``--clients`` clients (one aiohttp session, as many connections) each make ``--requests``
requests: transfers mostly, some balance reads and audits. The run checks that money is
conserved, at every audit and at the end, and prints throughput and p50/p99 latency.

Run: python examples/service.py [--accounts N --clients N --requests N ...]
     (AIOENGINE_EXAMPLE_SMALL=1, or small flags, for a quick run)
Needs: aiohttp, with pip install '.[examples]' from a checkout (or 'aioengine[examples]')
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import ClientSession, TCPConnector, web

import aioengine as ae

SMALL = os.environ.get("AIOENGINE_EXAMPLE_SMALL") == "1"
INLINE = ae.FnProperty.ASYNC  # cheap functions: run on the loop, no thread hop


class InsufficientFunds(ae.Abort):
    """A refused transfer: the accounts stay as they were."""


def move(src: int, dst: int, amount: int) -> tuple[int, int]:
    """The transaction: the new balances of the two accounts (``out=(a, b)``)."""
    if amount > src:
        raise InsufficientFunds(f"balance {src} < {amount}")
    return src - amount, dst + amount


def read(balance: int) -> int:
    return balance


def total(*balances: int) -> int:
    return sum(balances)


@dataclass
class Bank:
    """The service's state: the engine and one Var per account."""

    engine: ae.Engine
    accounts: list[ae.Var]
    peak_pending: int = 0
    size: int = field(init=False)
    audits: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.size = len(self.accounts)

    async def run(self, push: Any) -> Any:
        """Push (``push()``) once the engine has room, and await the operation.

        Only the loop thread pushes, and nothing awaits between the room check and the push,
        so the engine never holds more than ``max_pending`` operations.
        """
        await self.engine.wait_for_capacity()
        op = push()
        self.peak_pending = max(self.peak_pending, self.engine.pending)
        return await op

    async def transfer(self, request: web.Request) -> web.Response:
        body = await request.json()
        src, dst, amount = int(body["src"]), int(body["dst"]), int(body["amount"])
        if src == dst or amount <= 0 or not 0 <= min(src, dst) <= max(src, dst) < self.size:
            return web.json_response({"error": "bad transfer"}, status=400)
        a, b = self.accounts[src], self.accounts[dst]
        try:
            balances = await self.run(
                lambda: self.engine.submit(move, a, b, amount, out=(a, b), prop=INLINE)
            )
        except InsufficientFunds as exc:
            return web.json_response({"refused": str(exc)}, status=409)
        return web.json_response({"balances": balances})

    async def balance(self, request: web.Request) -> web.Response:
        account = self.accounts[int(request.match_info["i"])]
        value = await self.run(lambda: self.engine.submit(read, account, prop=INLINE))
        return web.json_response({"balance": value})

    async def audit(self, request: web.Request) -> web.Response:
        # One read of every account: a barrier across the whole bank (see the docstring).
        value = await self.run(lambda: self.engine.submit(total, *self.accounts, prop=INLINE))
        self.audits.append(value)
        return web.json_response({"total": value})


async def serve(bank: Bank) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_post("/transfer", bank.transfer)
    app.router.add_get("/balance/{i}", bank.balance)
    app.router.add_get("/total", bank.audit)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)  # a free port
    await site.start()
    server = site._server
    assert server is not None
    port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
    return runner, f"http://127.0.0.1:{port}"


@dataclass
class Load:
    """What the clients saw."""

    latencies: list[float] = field(default_factory=list)
    status: dict[str, int] = field(default_factory=dict)


async def client(
    session: ClientSession, url: str, who: int, args: argparse.Namespace, load: Load
) -> None:
    rng = random.Random(args.seed * 1_000_003 + who)
    for _ in range(args.requests):
        roll = rng.random()
        t0 = time.perf_counter()
        if roll < 0.01:
            kind = "audit"
            request = session.get(f"{url}/total")
        elif roll < 0.1:
            kind = "balance"
            request = session.get(f"{url}/balance/{rng.randrange(args.accounts)}")
        else:
            src, dst = rng.sample(range(args.accounts), 2)
            amount = rng.randint(1, args.balance // 2)
            kind = "transfer"
            request = session.post(
                f"{url}/transfer", json={"src": src, "dst": dst, "amount": amount}
            )
        async with request as response:
            await response.read()
            if response.status == 409:
                kind = "refused"
            elif response.status != 200:
                raise RuntimeError(f"{kind}: HTTP {response.status}: {await response.text()}")
        load.latencies.append(time.perf_counter() - t0)
        load.status[kind] = load.status.get(kind, 0) + 1


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(args: argparse.Namespace) -> int:
    expected = args.accounts * args.balance
    engine = ae.Engine(max_pending=args.max_pending)
    accounts = [engine.new_var(f"account{i}", value=args.balance) for i in range(args.accounts)]
    bank = Bank(engine, accounts)
    runner, url = await serve(bank)
    load = Load()
    try:
        t0 = time.perf_counter()
        connector = TCPConnector(limit=args.clients)
        async with ClientSession(connector=connector) as session, asyncio.TaskGroup() as tasks:
            for who in range(args.clients):
                tasks.create_task(client(session, url, who, args, load))
        wall = time.perf_counter() - t0
    finally:
        await runner.cleanup()  # no more requests
        await engine.aclose()  # drains what is left; raises a failure nobody waited for
    final = [await account.get() for account in accounts]  # a closed engine's final values
    n = len(load.latencies)
    print(
        f"bank of {args.accounts} accounts x {args.balance} = {expected}; "
        f"{args.clients} clients x {args.requests} requests over HTTP"
    )
    print(
        f"{n} requests in {wall:.2f} s: {n / wall:,.0f} requests/s; latency p50 "
        f"{percentile(load.latencies, 0.5) * 1e3:.2f} ms, "
        f"p99 {percentile(load.latencies, 0.99) * 1e3:.2f} ms"
    )
    s = load.status
    print(
        f"{s.get('transfer', 0)} transfers, {s.get('refused', 0)} refused with ae.Abort "
        f"(insufficient funds), {s.get('balance', 0)} balance reads, "
        f"{s.get('audit', 0)} audits; at most {bank.peak_pending} operations pending "
        f"(max_pending={args.max_pending})"
    )
    ok = sum(final) == expected and all(a == expected for a in bank.audits) and min(final) >= 0
    ok = ok and n == args.clients * args.requests and bank.peak_pending <= args.max_pending
    if not ok:
        print(f"FAILED: final total {sum(final)}, audits {sorted(set(bank.audits))}")
        return 1
    print(f"money conserved: {sum(final)} == {expected}, at every audit and after aclose()")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accounts", type=int, default=20 if SMALL else 200)
    parser.add_argument("--clients", type=int, default=10 if SMALL else 100)
    parser.add_argument("--requests", type=int, default=20 if SMALL else 50, help="per client")
    parser.add_argument("--balance", type=int, default=100, help="each account's opening one")
    parser.add_argument("--max-pending", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.accounts < 2 or min(args.clients, args.requests, args.max_pending) < 1:
        parser.error("needs 2 accounts or more, and at least one client, request and pending")
    if args.balance < 2:
        parser.error("--balance must be 2 or more")
    return args


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main(parse_args())))
