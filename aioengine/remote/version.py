"""A Var's version written by a remote value operation, and its transitions.

A :class:`RemoteVersion` is created when its operation is submitted and then changes only
through its own methods, each called with the engine lock held, on the loop thread:
:meth:`~RemoteVersion.settle` when its operation ends (done, failed, skipped or
cancelled), :meth:`~RemoteVersion.gathered` when its value arrives here for local readers,
:meth:`~RemoteVersion.lost` when it cannot arrive (the cluster lost it), and
:meth:`~RemoteVersion.withdraw` when its operation is cancelled after its submission. Each
returns the operations it was holding, for the caller to dispatch.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import TYPE_CHECKING, Any

from ..errors import summary
from ..kinds import OpState
from ..var import NO_VALUE, Failure, Var, carry, carry_failure_locked

if TYPE_CHECKING:
    from ..operation import Operation

__all__ = ("RemoteVersion", "lost_error")

_PENDING = OpState.PENDING


class RemoteVersion:
    """One version of a Var written by a remote value operation: the value lives on the
    cluster under the key of :attr:`future`.

    A Var carries it as its value (``Var._value``) until the next write; an operation's
    function never sees it (a remote one gets the future, a local one the gathered value).
    Its fields are written on the loop thread under the engine lock, by its methods (and
    ``given``/``gathering`` by the backend that hands it out). ``waiters`` and ``watchers``
    stay None until something waits (most versions settle with nobody waiting: two lists
    fewer per remote operation).
    """

    __slots__ = (
        "__weakref__",
        "box",
        "exc",
        "fallback",
        "first",
        "future",
        "gathering",
        "given",
        "name",
        "previous",
        "settled",
        "var",
        "waiters",
        "watchers",
    )

    def __init__(self, future: Any, var: Var, previous: object) -> None:
        self.future = future  #: the Dask future of the value
        #: the future it was made with (``future`` changes if its operation is sent again,
        #: after an input of it was aborted): what the operations given it were sent
        self.first = future
        self.var = weakref.ref(var)  #: the Var it is a version of
        self.name = var.name
        #: the Var's value before this version, until it settles (then dropped, or kept in
        #: ``fallback`` if it failed: what the Var goes back to)
        self.previous: object = previous
        self.fallback: object = NO_VALUE
        self.settled = False  #: its operation finished (or was skipped)
        self.box: Failure | None = None  #: the failure record, if it failed
        self.exc: BaseException | None = None  #: that failure's exception
        self.gathering = False  #: a gather to this process is under way
        #: its future was handed to a later remote operation (an argument, or a dependency of
        #: its write): from then on its operation can no longer be withdrawn
        self.given = False
        #: operations held until it settles or arrives (None: none yet)
        self.waiters: list[Operation[Any]] | None = None
        #: loop futures woken when it settles (None: none yet)
        self.watchers: list[asyncio.Future[None]] | None = None

    def __repr__(self) -> str:
        state = "failed" if self.exc is not None else "settled" if self.settled else "pending"
        return f"<RemoteVersion of {self.name!r} {state} key={self.future.key!r}>"

    async def wait_settled(self, loop: asyncio.AbstractEventLoop) -> None:
        """Return once this version has settled (loop thread)."""
        if not self.settled:
            fut = loop.create_future()
            if self.watchers is None:
                self.watchers = [fut]
            else:
                self.watchers.append(fut)
            await fut

    def hold(self, op: Operation[Any]) -> None:
        """Hold ``op`` until this version settles or arrives here (lock held)."""
        if self.waiters is None:
            self.waiters = [op]
        else:
            self.waiters.append(op)

    def _before(self) -> object:
        """The value the Var goes back to if this version does not stand."""
        previous = self.previous
        if type(previous) is RemoteVersion and previous.exc is not None:
            previous = previous.fallback
        return previous

    def settle(
        self,
        exc: BaseException | None,
        box: Failure | None,
        ready: list[Any],
        watchers: list[asyncio.Future[None]],
    ) -> None:
        """Its operation ended: ``exc`` is None if it wrote the value, else why not (its
        dependents see that), ``box`` the failure to record on the Var (None: nothing, as
        for a cancel or an Abort). A version that does not stand gives the Var back the
        value before it. Appends the operations it held to ``ready`` and its watchers to
        ``watchers`` (to wake once unlocked). Lock held."""
        self.settled = True
        self.box = box
        self.exc = exc
        if exc is not None:
            self.fallback = previous = self._before()
            var = self.var()
            if var is not None and var._value is self:
                carry(var, previous)  # a failed write leaves the value as it was
                if box is not None:
                    carry_failure_locked(var, box)
        self.previous = None
        self._release(ready)
        if self.watchers is not None:
            watchers.extend(self.watchers)
            self.watchers = None

    def gathered(self, value: object, ready: list[Any]) -> Var | None:
        """Its value arrived here: the Var carries it now, if this is still its version
        (then that Var is returned, for the caller's cache of what the cluster holds).
        Appends the operations it held to ``ready``. Lock held."""
        var = self.var()
        current = var is not None and var._value is self
        if current:
            assert var is not None
            carry(var, value)
        self.gathering = False
        self._release(ready)
        return var if current else None

    def lost(self, exc: BaseException, box: Failure, ready: list[Any]) -> Var | None:
        """Its value cannot arrive (the cluster lost it, or it cannot be sent here): the
        failure ``box`` of the Var, which no longer carries a value, so nothing gathers it
        again (the Var is returned if this was its version). Appends the operations it held
        to ``ready``. Lock held."""
        self.exc = exc
        self.box = box
        var = self.var()
        current = var is not None and var._value is self
        if current:
            assert var is not None
            carry(var, NO_VALUE)
            carry_failure_locked(var, box)
        self.gathering = False
        self._release(ready)
        return var if current else None

    def withdraw(self) -> None:
        """Its operation was cancelled after its submission, before anyone was given this
        version: the Var gets back the value before it, which what starts from now on
        reads. It settles later, when the operation ends. Lock held."""
        var = self.var()
        if var is not None and var._value is self:
            carry(var, self._before())

    def _release(self, ready: list[Any]) -> None:
        if self.waiters is not None:
            ready.extend(op for op in self.waiters if op._state is _PENDING)
            self.waiters = None


def lost_error(version: RemoteVersion, cause: BaseException) -> RuntimeError:
    """The failure of a Var whose version could not be brought here: ``cause`` is Dask's."""
    exc = RuntimeError(
        f"the value of {version.name!r} (Dask key {version.future.key!r}) could not be "
        f"gathered: {summary(cause)}; it was lost with the worker that held it (and cannot "
        "be recomputed) or cannot be sent to this process"
    )
    exc.__cause__ = cause
    return exc
