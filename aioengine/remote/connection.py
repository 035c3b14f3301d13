"""The remote collaborator's link to the cluster: one Dask client, made on first use.

:class:`Connection` turns what ``Engine(cluster=, security=)`` (or ``AIOENGINE_CLUSTER``) gave
into a connected ``distributed.Client``: an address, ``"local"`` (a ``LocalCluster`` of the
engine's own), a cluster object (asynchronous on the engine's loop, or reached through its
scheduler's address), or a client (asynchronous on the engine's loop, or a blocking one on
its own thread). It connects once, on the engine's loop; a failure to connect is one
failure record shared by every operation that waited for it.

State (loop thread only, except ``unreachable``, written under the engine lock by the
backend's callback):

- ``cluster``, ``security``: what the engine was given; ``client``: the connected client
  (None until connected, and after :meth:`Connection.aclose`); ``connecting``: the task
  that connects.
- ``own_client``, ``own_cluster``: what the engine made, and so closes; ``on_loop``: the
  client runs on the engine's loop (else on its own thread: a blocking client).
- ``unreachable``: the failure of connecting, once it failed; ``unreachable_text``: its
  message, for the pushes refused afterwards.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from ..errors import DeviceUnavailableError, summary
from ..var import Failure
from . import dask_api

__all__ = ("Connection", "describe")


class Connection:
    """The Dask client of one engine's remote collaborator (see the module docstring)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        cluster: object,
        security: object,
        on_unreachable: Callable[[Failure], None],
    ) -> None:
        self.loop = loop
        self.cluster = cluster
        self.security = security
        self.client: Any = None
        self.connecting: asyncio.Task[Any] | None = None
        self.own_client = False
        self.own_cluster: Any = None
        self.on_loop = True
        self.unreachable: Failure | None = None
        self.unreachable_text = ""
        self._on_unreachable = on_unreachable

    async def ready(self) -> Any:
        """The connected client (connecting on first use, on the engine's loop).

        Raises:
            DeviceUnavailableError: if the cluster cannot be reached (the same exception
                for every caller).
        """
        client = self.client
        if client is not None:
            return client
        if self.connecting is None:
            self.connecting = self.loop.create_task(self._connect())
        return await asyncio.shield(self.connecting)

    async def _connect(self) -> Any:
        try:
            return await self._connect_once()
        except Exception as exc:
            error = DeviceUnavailableError(
                f"could not connect to the Dask cluster {describe(self.cluster)}: {summary(exc)}"
            )
            error.__cause__ = exc
            box = Failure(error)
            self.unreachable_text = str(error)
            self.unreachable = box
            self._on_unreachable(box)
            raise error from exc

    async def _connect_once(self) -> Any:
        distributed = dask_api.distributed()
        cluster = self.cluster
        if isinstance(cluster, distributed.Client):
            if cluster.asynchronous:
                if cluster.loop.asyncio_loop is not self.loop:
                    raise RuntimeError(
                        f"{cluster!r} is asynchronous on another event loop; create it on the "
                        "engine's loop (or pass a blocking Client, or an address)"
                    )
            else:
                self.on_loop = False
            client = cluster
        else:
            target = cluster
            if cluster == "local":
                self.own_cluster = target = await distributed.LocalCluster(
                    processes=False,
                    dashboard_address=":0",
                    asynchronous=True,
                    security=self.security,
                )
            elif not isinstance(cluster, str):
                if not hasattr(cluster, "scheduler_address"):
                    raise TypeError(
                        "cluster must be a distributed.Client, a cluster object, a scheduler "
                        f"address or 'local', got {cluster!r}"
                    )
                loop = getattr(getattr(cluster, "loop", None), "asyncio_loop", None)
                if not (getattr(cluster, "asynchronous", False) and loop is self.loop):
                    # A blocking cluster (or one on another loop) runs its own loop on a
                    # thread; a client on this loop cannot share that object, so it
                    # connects to the scheduler's address (what the cluster's own client
                    # would do), with the cluster's security unless one was given.
                    target = cluster.scheduler_address
                    if self.security is None:
                        self.security = getattr(cluster, "security", None)
            kwargs: dict[str, Any] = {}
            if self.security is not None:
                kwargs["security"] = self.security
            client = await distributed.Client(
                target, asynchronous=True, set_as_default=False, **kwargs
            )
            self.own_client = True
        self.client = client
        return client

    async def call(self, awaitable: Any) -> Any:
        """Await a coroutine of the client's (``asynchronous=True``) on the client's loop."""
        if self.on_loop:
            return await awaitable
        assert self.client is not None
        return await asyncio.wrap_future(
            asyncio.run_coroutine_threadsafe(awaitable, self.client.loop.asyncio_loop)
        )

    def finished(self, future: Any) -> Awaitable[None]:
        """What to await until ``future`` has finished, erred or been cancelled (no data moves).

        On the engine's loop, the future's own state (no thread involved; it is what awaiting
        the future does, without the transfer of its result), returned itself: one coroutine
        frame fewer per operation; otherwise a done callback, which Dask runs on a thread of
        its own, wakes the loop.
        """
        if self.on_loop:
            wait = dask_api.state_wait(future)
            if wait is not None:
                return wait
        return self._settled_by_callback(future)

    async def _settled_by_callback(self, future: Any) -> None:
        loop = self.loop
        done = loop.create_future()

        def settle(_: object) -> None:  # a Dask callback thread
            if not loop.is_closed():
                loop.call_soon_threadsafe(_set_done, done)

        future.add_done_callback(settle)
        await done

    async def aclose(self) -> None:
        """Stop connecting, and close the client and the cluster the engine made."""
        connecting = self.connecting
        if connecting is not None and not connecting.done():
            connecting.cancel()
            try:
                await connecting
            except (asyncio.CancelledError, Exception):
                pass
        client = self.client
        self.client = None
        if client is not None and self.own_client:
            await client.close()
        if self.own_cluster is not None:
            cluster, self.own_cluster = self.own_cluster, None
            await cluster.close()


def describe(cluster: object) -> str:
    """How an error names the cluster: its address, and the connect timeout Dask used."""
    address = cluster if isinstance(cluster, str) else getattr(cluster, "scheduler_address", None)
    try:
        import dask.config
        from dask.utils import parse_timedelta

        timeout = parse_timedelta(dask.config.get("distributed.comm.timeouts.connect"))
    except Exception:
        return repr(address if address is not None else cluster)
    return f"at {address if address is not None else cluster!r} within {timeout:g} s"


def _set_done(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
