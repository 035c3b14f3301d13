"""Remote arrays (``aioengine/array/_remote*.py``) on the deployments issue 43 names beside
``LocalCluster``: a cluster over TLS, and a ``dask scheduler`` + ``dask worker`` pair started
from the command line (the scheduler in another process, so the keys left are asked of it).

Each runs the same small program (placement, a fused chain, a halo stencil written in place,
an aliasing write, a reduction) against NumPy, then checks that ``aclose()`` left no key.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

import aioengine as ae
import aioengine.array as aa

from .helpers import command_line_cluster, engine_keys, no_keys_left

distributed = pytest.importorskip("distributed")

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")

R = ae.remote()


def expected() -> tuple[np.ndarray[Any, Any], float]:
    """The program's result on NumPy (see :func:`program`)."""
    a = np.arange(120.0).reshape(40, 3)
    u = np.sin(a) * 2.0 + a
    u[1:-1] = 0.5 * (u[:-2] + u[2:])
    u += 1.0
    u[1:] += u[:-1]
    w = u + np.arange(40.0)[:, None]
    return w, float(np.sum(w))


async def program(engine: ae.Engine) -> tuple[np.ndarray[Any, Any], float]:
    """Chunks of two rows (20 chunks): every halo read crosses a chunk boundary."""
    xp = aa.namespace(engine, chunk_bytes=8 * 6)
    a = np.arange(120.0).reshape(40, 3)
    u = xp.sin(xp.asarray(a, device=R)) * 2.0 + xp.asarray(a, device=R)
    u[1:-1] = 0.5 * (u[:-2] + u[2:])
    u += 1.0
    u[1:] += u[:-1]  # reads the chunk it writes and its neighbour's last row
    w = u + xp.reshape(xp.arange(40.0, device=ae.cpu()), (40, 1)).to_device(R)
    assert (w.device, w.chunks) == (R, 20)
    return await w, float(await xp.sum(w))


def same(got: tuple[np.ndarray[Any, Any], float]) -> None:
    want, total = expected()
    assert np.allclose(got[0], want)
    assert got[1] == pytest.approx(total)


def test_over_tls() -> None:
    """Sync (one loop, not once per loop implementation): the TLS cluster is slow to start."""
    pytest.importorskip("cryptography")
    asyncio.run(over_tls())


async def over_tls() -> None:
    security = distributed.security.Security.temporary()
    async with distributed.LocalCluster(
        processes=False,
        n_workers=2,
        threads_per_worker=1,
        dashboard_address=":0",
        asynchronous=True,
        protocol="tls://",
        security=security,
    ) as cluster:
        assert cluster.scheduler_address.startswith("tls://")
        engine = ae.Engine(cluster=cluster.scheduler_address, security=security)
        async with engine:
            same(await program(engine))
            assert engine_keys(cluster, engine)  # the chunks live on the cluster
        await no_keys_left(cluster, engine)


def scheduler_keys(dask_scheduler: Any) -> list[str]:
    """The keys the scheduler knows (run on the scheduler: this module is importable there)."""
    return [str(k) for k in dask_scheduler.tasks]


def test_a_scheduler_and_worker_started_from_the_command_line(tmp_path: Any) -> None:
    """Sync (one loop): the processes are slow to start and stop."""
    with command_line_cluster(str(tmp_path), nthreads=2) as address:
        asyncio.run(command_line(address))


async def command_line(scheduler: str) -> None:
    async with distributed.Client(scheduler, asynchronous=True) as client:
        async with ae.Engine(cluster=scheduler) as engine:
            same(await program(engine))
            assert await client.run_on_scheduler(scheduler_keys)
        for _ in range(300):  # releases reach the scheduler in batches
            if not await client.run_on_scheduler(scheduler_keys):
                break
            await asyncio.sleep(0.02)
        assert await client.run_on_scheduler(scheduler_keys) == []
        assert await client.who_has() == {}
