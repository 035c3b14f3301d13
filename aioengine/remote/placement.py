"""Where a value operation runs: the worker that holds its data, chosen before Dask would tie.

Dask places a task on a worker that holds its inputs, the one with the most input bytes. An
operation that reads several values of one size (a halo step reads its chunk and its two
neighbours) has several such workers, and Dask's choice among them crowds some workers and
leaves others idle: 16 chunk Vars on 16 workers ran on 14 of them, up to 35 steps on one
and 8 on another. The engine knows more than Dask at that point: which Var an operation
*writes*, and so which of its inputs is the previous version of its output. So each
version placed here has a *home*, the worker it is computed on, and an operation goes to a
worker chosen by :meth:`Placement.choose`, sent as a preference (``workers=[home],
allow_other_workers=True``): Dask still moves it where the home has gone, and its work
stealing may still move it to an idle worker.

Only operations of a plain :func:`~aioengine.remote` context are placed: where the user named
``workers=`` or ``resources=``, Dask decides (a preference with resources would let Dask drop
the resources when the home lacks them). So does it for an operation that reads a value
without a home (one this process scattered, or one Dask placed): Dask knows where that
is, this does not.

State (loop thread only; the backend owns the one instance):

- ``_homes``: per version placed here, by its Dask future (weak: a future dropped drops its
  home; a value gathered here keeps its future, so it keeps its home), the address of the
  worker it was placed on. A key's value never moves away (Dask may copy it), so a home
  never goes stale, except that its worker may leave.
- ``_turn``: where the next search for the least busy worker starts, so that ties go round
  the workers.
- ``_busy``: per worker address, the placed tasks sent there that have not settled.
- ``_workers``: the cluster's worker addresses when last asked (:meth:`Placement.refresh`),
  in the order the scheduler lists them, and ``_present`` the same as a set; ``_asked``:
  when (``time.monotonic()``), or None before the first answer; ``_asking``: the refresh
  in flight, if any.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Sequence

__all__ = ("Placement",)

#: How old (seconds) the list of workers may be before a placement asks the scheduler again
#: (in the background; the placement uses the old list meanwhile).
STALE_S = 2.0


class Placement:
    """The homes of one engine's remote versions, and the choice of a worker per operation (the
    design and the state are in the module docstring)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, ask: Callable[[], Awaitable[Iterable[str]]]
    ) -> None:
        """``ask`` returns the cluster's worker addresses (a call to its scheduler), on
        ``loop``, the engine's."""
        self._loop = loop
        self._ask = ask
        self._turn = 0  # where the search for the least busy worker starts (round robin)
        self._homes: weakref.WeakKeyDictionary[object, str] = weakref.WeakKeyDictionary()
        self._busy: dict[str, int] = {}
        self._workers: tuple[str, ...] = ()
        self._present: frozenset[str] = frozenset()
        self._asked: float | None = None
        self._asking: asyncio.Task[None] | None = None

    def choose(self, reads: Sequence[object], writes: Sequence[object]) -> str | None:
        """The worker to run an operation on, or None (Dask decides); one more busy task
        there until :meth:`settled`. ``reads`` are the versions it reads (None for a value
        that is not a version: a local value, sent by scatter), ``writes`` the versions its
        ``out`` Vars carry before it (None where they carry none), each as its Dask future;
        :meth:`home` records where its own versions go.

        None if a value it reads has no home (a local value this process scattered: Dask
        knows where that went; then what it writes has none either). Else, in order: the
        home of a version it overwrites, if a value it reads lives there too (an in-place
        step stays where its data is); else the least busy home among the values it reads
        (the first in argument order on a tie: Dask's data locality without its crowding);
        else the home of a version it overwrites; else the least busy worker of the cluster
        (an operation that reads no value; ties go round the workers).
        """
        self.refresh()
        homes = self._homes
        present = self._present
        candidates: list[str] = []
        for version in reads:
            home = None if version is None else homes.get(version)
            if home is None or home not in present:
                return None
            if home not in candidates:
                candidates.append(home)
        mine = None
        for version in writes:
            home = None if version is None else homes.get(version)
            if home is not None and home in present:
                mine = home
                break
        busy = self._busy
        if mine is not None and (mine in candidates or not candidates):
            where = mine
        elif candidates:
            where = min(candidates, key=lambda w: busy.get(w, 0))
        elif self._workers:
            workers = self._workers
            turn = self._turn % len(workers)
            # The least busy, the search starting one further each time: operations pushed
            # one at a time (each settled before the next) go round the workers.
            where = min(workers[turn:] + workers[:turn], key=lambda w: busy.get(w, 0))
            self._turn = turn + 1
        else:
            return None
        busy[where] = busy.get(where, 0) + 1
        return where

    def home(self, version: object, where: str) -> None:
        """``version`` (its Dask future) is computed on worker ``where`` (chosen by
        :meth:`choose`)."""
        self._homes[version] = where

    def settled(self, where: str) -> None:
        """A task placed on ``where`` (by :meth:`choose`) settled."""
        left = self._busy.get(where, 0) - 1
        if left > 0:
            self._busy[where] = left
        else:
            self._busy.pop(where, None)

    def refresh(self) -> None:
        """Ask the scheduler for its workers in the background, if the list is older than
        :data:`STALE_S` and no question is in flight."""
        asked = self._asked
        if self._asking is None and (asked is None or time.monotonic() - asked > STALE_S):
            task = self._loop.create_task(self._refresh(), name="aioengine-placement")
            if not task.done():  # (an eager task factory may have finished it already)
                self._asking = task

    async def known(self) -> None:
        """Wait until the list of workers has been asked for once (the first placements of
        a new engine would otherwise find no worker)."""
        self.refresh()
        asking = self._asking
        if self._asked is None and asking is not None:
            await asyncio.shield(asking)

    async def _refresh(self) -> None:
        try:
            self._workers = workers = tuple(await self._ask())
            self._present = frozenset(workers)
        except Exception:  # a scheduler that cannot answer: keep the list it gave last
            pass
        finally:
            self._asked = time.monotonic()
            self._asking = None

    async def aclose(self) -> None:
        """Stop a question in flight (the engine closes)."""
        asking = self._asking
        if asking is not None:
            asking.cancel()
            await asyncio.gather(asking, return_exceptions=True)
        self._homes.clear()
        self._busy.clear()
