"""Vars: the read/write FIFO that orders access to one piece of data.

A :class:`Var` orders the operations that use one piece of data, as MXNet's ``ThreadedVar``
does. Every operation makes one *request* per Var it names, in push order: a read request for a
``const_vars`` entry, a write request for a ``mutate_vars`` entry. A request is *granted* when
the Var's turn reaches it; an operation runs when all of its requests are granted, and releases
them when it finishes.

The grant rule: a request has a *mode*, :data:`READ`, :data:`WRITE`, :data:`COMMUTE` or
:data:`CONCURRENT`. Consecutive requests of one set mode (read, commute, concurrent) form a
*group*; a write is a group of one. A group is granted once nothing else is held, and only at
the head of the queue (nothing overtakes a queued request); a request arriving while its own
kind of group is held, with nothing queued, joins it. So a run of reads at the head is granted
together, two operations of which at least one writes a common Var run in push order, readers
between two writes overlap, and whatever follows a group waits for all of it.
:meth:`Var._try_grant` is the one place that codes it; every grant, on a request's arrival
(:meth:`Var._append`) or from the queue (:meth:`Var._grant`), asks it.

A granted commute request only admits its operation to the group: members run one at a time,
so the operation must also take the Var's *token* (``_token``) before it is ready. An
operation takes the tokens of all its commute Vars at once or none (:func:`take_tokens`), only
once every request of it is granted; otherwise it parks on one busy Var's ``_contenders`` and
holds nothing, and the release of that token retries it. So no operation holds a token while
it waits, and two operations with opposite-order commute Vars cannot deadlock. Concurrent
members need no token. Operations with only reads and writes (``modes`` None) never look at
tokens: their path pays one ``is None`` test.

Requests are the "futures" of the design: instead of an ``asyncio.Future`` per request, a grant
decrements the operation's counter of ungranted requests and hands it to the engine when the
counter reaches zero (MXNet's ``wait`` counter). This keeps the observable behaviour of a FIFO of
futures while costing no event-loop round trip per grant; see ``scheduler.py``.

A request is not an object: the queue holds ``op, write, op, write, ...`` flattened into one
list, and a granted request is only counted (``_reads``, ``_writing``: see
:meth:`Var._try_grant`). An engine keeps hundreds of thousands of requests pending, and
every object it allocates per request makes each of the garbage collector's passes longer.
Two facts replace per-request state:

- A queued request whose operation was cancelled is a *tombstone*: its operation's state is
  ``CANCELLED``. Tombstones stay queued (counted in ``_dead``) until they reach the head.
- Requests are queued in push order (sequence numbers increase along the queue) and only the
  head is ever granted, so an operation's request is still queued iff the queue's head was
  pushed no later than the operation: :meth:`Var._holds` is O(1).

Locking: every method whose name starts with ``_`` is called with the owning engine's lock held,
from any thread; no method here runs user code or blocks.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from .kinds import FnProperty, OpState

if TYPE_CHECKING:
    from collections.abc import Callable

    from .operation import Operation

_ASYNC = FnProperty.ASYNC
_CANCELLED = OpState.CANCELLED

__all__ = (
    "COMMUTE",
    "CONCURRENT",
    "MODE_NAMES",
    "READ",
    "WRITE",
    "Failure",
    "Var",
    "VarStatistics",
    "append_all",
    "append_modes",
    "carry",
    "carry_failure_locked",
    "check_groups",
    "drop_consumed",
    "fences_of",
    "give",
    "no_value_error",
    "queued_behind",
    "release_all",
    "release_modes",
    "take_tokens",
    "withdraw_all",
)

T = TypeVar("T")

# A request's mode, as queued: read and write stay False and True (what the read/write-only
# paths pass); the set modes other than read are small ints.
READ = 0
WRITE = 1
COMMUTE = 2
CONCURRENT = 3
MODE_NAMES = ("read", "write", "commute", "concurrent")  # by mode


class _Waiter(Protocol):
    """The part of an operation a Var touches: its counter, push order and state.

    The compiled core (var.pxd) reads these as C struct members: there a waiter must be an
    operation (an ``_OperationCore``).
    """

    nwait: int  # ungranted requests: a grant counts it down
    seq: int  # push order (queue order)
    _state: Any  # OpState.CANCELLED: its queued requests are tombstones
    modes: tuple[int, ...] | None  # modes of its vars after the reads; None: all writes
    vars: tuple[Var, ...]  # its Vars: reads first
    nreads: int


class Failure:
    """A recorded failure, shared by every Var that carries it (MXNet's shared exception_ptr).

    A wait that throws it (``wait_for_var``, ``wait_for_all``, ``aclose``) sets ``cleared``
    to the engine's latest sequence number: the failure is cleared, at once, for every
    operation pushed after that moment, on every Var carrying it, while every operation
    pushed before it (:meth:`seen_by`) still sees it, however late it starts. So throwing
    once never lets an earlier operation run on an input its failed writer never produced.
    The engine drops ``exc`` (*retires* the box) once no operation pushed before the throw
    is live any more: a Var that still carries the box keeps no exception alive.
    """

    __slots__ = ("cleared", "exc")

    def __init__(self, exc: BaseException) -> None:
        self.exc: BaseException | None = exc  # None once retired
        self.cleared: int | None = None  # None until thrown: the sequence number at the throw

    def seen_by(self, seq: int) -> bool:
        """Whether the operation with sequence number ``seq`` sees this failure."""
        return self.exc is not None and (self.cleared is None or seq <= self.cleared)

    @property
    def unthrown(self) -> bool:
        """Whether a wait may still throw it (recorded, and neither thrown nor retired)."""
        return self.cleared is None and self.exc is not None


class _NoValue:
    """The type of :data:`NO_VALUE`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NO_VALUE"


NO_VALUE: Any = _NoValue()  # what a Var created without ``value=`` carries (ergonomic.py)


@dataclass(frozen=True, slots=True)
class VarStatistics:
    """A snapshot of a :class:`Var`'s queue, from :meth:`Var.statistics`.

    Attributes:
        pending_reads: granted requests of the held group not yet released (readers, or
            commute or concurrent members, running or about to).
        pending_write: whether a granted write has not been released yet.
        waiting: requests queued behind those (not granted yet).
        version: completed writes (and commute or concurrent accesses) so far.
        failed: whether the Var carries a failure that nobody has waited for yet.
        mode: the mode of what is held: ``"read"``, ``"write"``, ``"commute"``,
            ``"concurrent"``, or None when nothing is.
        waiting_modes: the mode of each queued request, in push order.
    """

    pending_reads: int
    pending_write: bool
    waiting: int
    version: int
    failed: bool
    mode: str | None = None
    waiting_modes: tuple[str, ...] = ()


class Var:
    """A handle on one piece of data whose readers and writers the engine orders.

    Create Vars with :meth:`Engine.new_var`; name them in ``const_vars`` (read) or
    ``mutate_vars`` (written) when you push an operation. A Var holds no data of its own: it is
    the token that the operations touching the same data agree on.

    Attributes:
        name: the name given to :meth:`Engine.new_var`, used in reprs and error messages.
    """

    __slots__ = (
        "__weakref__",
        "_contenders",
        "_dead",
        "_deleted",
        "_failure",
        "_fences",
        "_head",
        "_owner",
        "_queue",
        "_queued",
        "_reads",
        "_token",
        "_value",
        "_version",
        "_writing",
        "name",
    )

    def __init__(self, owner: object, name: str) -> None:
        self.name = name
        self._owner = owner  # the engine whose lock guards the fields below
        # Ungranted requests in push order, flattened: op, write, op, write, ... from index
        # _head on (granted ones before it are cleared to None, and dropped in bulk once they
        # are half the list: a list's append and index are C operations for the compiled
        # core, a deque's methods are Python calls). It may hold tombstones (cancelled
        # operations), never at its head. Created by the first request that has to queue:
        # most Vars of a program are never contended.
        self._queue: list[Any] | None = None
        self._head = 0  # even; _queue[_head] is the head request's operation
        # Requests in _queue from _head on, tombstones included: one field, so that a
        # snapshot read without the lock (_waiting) is never torn by a compaction.
        self._queued = 0
        self._dead = 0  # tombstones in _queue, so a snapshot never has to walk the queue
        # What is held, as _try_grant counts it: nothing (both 0); a read group (_reads
        # readers, _writing 0); a write (_writing WRITE, _reads 0); or a commute or concurrent
        # group (_writing its mode, _reads its members but one).
        self._reads = 0
        self._writing: int = False
        # A commute member runs (it took this token with all its commute Vars' at once);
        # invariant: implies _writing == COMMUTE.
        self._token = False
        # Operations admitted (every request granted) that wait for this Var's token, holding
        # none (take_tokens), first come first retried; None until the first.
        self._contenders: deque[Any] | None = None
        self._version = 0  # completed (run or skipped) writes
        # The failure this Var carries: its latest writer's (or an input's it passed on);
        # kept when thrown, for the operations pushed before the throw (Failure).
        self._failure: Failure | None = None
        # delete_var was called (the deleting operation, else False): no new request may be
        # appended. Set and cleared (when that operation is cancelled) under the engine lock.
        self._deleted: object = False
        self._value: object = NO_VALUE  # the data it carries (ergonomic.py); guarded by its turn
        # The GPU collaborator's sync state of this Var (fence.VarFences: the fences of its
        # last GPU writer and readers), None until a GPU operation first uses it; attached
        # by fences_of(), read and written only by fence.py (which this module does not
        # import), under the engine lock.
        self._fences: Any = None

    @property
    def version(self) -> int:
        """The number of writes to this Var that have completed (run or skipped).

        Cancelled writes and waits do not count. A GPU write counts once it is enqueued
        (when it releases the Var), before its device work has finished. Safe to read from
        any thread.
        """
        return self._version

    def statistics(self) -> VarStatistics:
        """Return a snapshot of this Var's queue and failure state, with the mode of what is
        held and of each queued request."""
        box = self._failure
        reads, writing = self._reads, self._writing
        held = MODE_NAMES[writing] if writing else "read" if reads else None
        return VarStatistics(
            pending_reads=reads + 1 if writing > WRITE else reads,
            pending_write=writing == WRITE,
            waiting=self._waiting(),
            version=self._version,
            failed=box is not None and box.unthrown,
            mode=held,
            waiting_modes=self._waiting_modes(),
        )

    def _waiting_modes(self) -> tuple[str, ...]:
        """The modes of the live queued requests, in push order: without the lock, so a
        snapshot that stops early where another thread is changing the queue."""
        queue, head = self._queue, self._head
        flat = queue[head:] if queue else []
        modes = []
        for i in range(0, len(flat) - 1, 2):
            op, mode = flat[i], flat[i + 1]
            if (type(mode) is not bool and type(mode) is not int) or not hasattr(op, "_state"):
                break
            if op._state is not _CANCELLED:
                modes.append(MODE_NAMES[mode])
        return tuple(modes)

    def __repr__(self) -> str:
        state = " deleted" if self._deleted else ""
        return (
            f"<Var {self.name!r}{state} version={self._version} reads={self._reads} "
            f"write={self._writing == WRITE} waiting={self._waiting()}>"
        )

    def _waiting(self) -> int:
        """The live requests queued: O(1) and without the lock (a repr may be taken with the
        engine lock held), so off by one at worst while another thread changes the queue."""
        return max(0, self._queued - self._dead)

    # -- the grant rule; caller holds the engine lock ------------------------------------

    def _try_grant(self, mode: int) -> bool:
        """The grant rule: grant a request of ``mode`` (False or :data:`READ`, True or
        :data:`WRITE`, :data:`COMMUTE`, :data:`CONCURRENT`) that is at the head of the
        queue, or arrives at an empty one, if the rule allows it now; return whether it did.

        A read is granted while no other mode is held (so readers overlap); a write once
        nothing is held; a commute or concurrent request once nothing is held, or while a
        group of its own mode is (so a group's members are granted together). A grant is
        only counted: ``_reads`` counts held reads, ``_writing`` holds the mode of a held
        write or other group (0 when none), whose invariant (a held write excludes anything
        else held) this keeps; a group's members but the first count in ``_reads`` too.
        So reads and writes pay what a rule of reads and writes only pays, but on a write
        that is refused: one comparison. The compiled core inlines it into its callers.
        """
        if mode:
            if self._writing or self._reads:
                if mode == 1 or self._writing != mode:
                    return False
                self._reads += 1  # joins the group of its own mode
                return True
            self._writing = mode
        elif self._writing:
            return False
        else:
            self._reads += 1
        return True

    def _append(self, op: _Waiter, write: int) -> bool:
        """Request this Var for ``op`` in mode ``write`` (a bool, or a mode): grant the
        request now if the queue is empty and the rule allows it (:meth:`_try_grant`), else
        queue it behind every earlier one; return whether it was granted.

        Appending never makes another request grantable, so the caller only has to count
        this one (``op.nwait``).
        """
        queued = self._queued
        if not queued and self._try_grant(write):
            return True
        queue = self._queue
        if queue is None:
            queue = self._queue = []
        queue.append(op)
        queue.append(write)
        self._queued = queued + 1
        return False

    def _holds(self, op: _Waiter) -> bool:
        """Whether ``op``'s request on this Var was granted (see the module docstring)."""
        return not self._queued or self._queue[self._head].seq > op.seq  # type: ignore[index]

    def _release(self, write: bool, ready: list[Any], completed_write: bool) -> None:
        """Hand back a granted read or (``write``) write and grant whatever the rule now
        allows, appending the operations that this leaves with no ungranted request to
        ``ready`` (a commute or concurrent member: :meth:`_release_member`).

        Only a release that leaves nothing held can let the head of the queue in: while reads
        are held the head is of another mode (a read there would have been granted with
        them), which the rule keeps out until the last of them is released.
        ``completed_write`` says whether a released write counts towards :attr:`version`.
        """
        if write:
            self._writing = False
            if completed_write:
                self._version += 1
        else:
            self._reads -= 1
        if self._queued and not self._reads:
            self._grant(ready)

    def _release_member(self, ready: list[Any], completed: bool) -> None:
        """:meth:`_release` for a member of the held commute or concurrent group (its token
        is handed back by :func:`release_modes`): the group ends with its last member, which
        may let the head of the queue in. ``completed`` says whether it counts towards
        :attr:`version`."""
        if self._reads:
            self._reads -= 1
        else:
            self._writing = False
        if completed:
            self._version += 1
        if self._queued and not self._writing:
            self._grant(ready)

    def _withdraw(self, ready: list[Any]) -> None:
        """A queued request's operation was cancelled (its state says so): the request stays
        queued as a tombstone, and what queued behind it may now be granted."""
        self._dead += 1
        self._grant(ready)

    def _grant(self, ready: list[Any]) -> None:
        """Grant requests from the head of the queue while the rule (:meth:`_try_grant`)
        allows; drop tombstones. An operation whose last request this grants is appended to
        ``ready``.

        After this returns the head of the queue (if any) is live and not grantable.
        """
        queue = self._queue
        assert queue is not None
        head = self._head
        end = len(queue)
        while head < end:
            op = queue[head]
            if self._dead and op._state is _CANCELLED:
                queue[head] = None
                head += 2
                self._queued -= 1  # with _dead, so that _waiting() stays within one
                self._dead -= 1
                continue
            mode = queue[head + 1]
            if not self._try_grant(mode):
                break
            queue[head] = None  # no reference kept to a granted request's operation
            head += 2
            self._queued -= 1
            op.nwait -= 1
            # Ready once all granted; one with commute Vars also takes their tokens, or parks.
            if not op.nwait and (op.modes is None or take_tokens(op)):
                ready.append(op)
            if mode == 1 and not self._dead:
                break  # the rule grants nothing beside a write, and no tombstone is queued
            # Go on after a write only to drop tombstones (the head is never a tombstone).
        self._head = drop_consumed(queue, head)

    def _requests(self) -> list[tuple[Any, int]]:
        """The queued requests as ``(op, mode)`` pairs, tombstones included (a copy)."""
        flat = self._queue[self._head :] if self._queue else []
        return list(zip(flat[::2], flat[1::2], strict=True))

    def _is_idle(self) -> bool:
        """True when no request is granted or queued."""
        return not (self._reads or self._writing or self._queued)

    def _wake_contenders(self, ready: list[Any]) -> None:
        """This Var's token was handed back: let the parked operations try again to take all
        their tokens, appending the one that does to ``ready``; the others park again (on
        another Var whose token is busy)."""
        parked = self._contenders
        assert parked is not None
        while parked and not self._token:
            op = parked.popleft()  # O(1): many may wait for one busy accumulator
            if take_tokens(op):  # else it parked on another Var (this token is free)
                ready.append(op)

    def _check_invariants(self) -> None:
        """Assert the grant rule's invariants (for tests): what is held is a write, reads or
        one other group, never two; the queue is in push order; its head is live and queued
        only because the rule (:meth:`_try_grant`) does not grant it."""
        assert self._reads >= 0, self
        assert self._writing in (READ, WRITE, COMMUTE, CONCURRENT), self
        assert not (self._writing == WRITE and self._reads), self
        assert not self._token or self._writing == COMMUTE, self
        assert not self._contenders or self._writing == COMMUTE, self
        for op in self._contenders or ():
            assert op.nwait == -1, (self, op)
            assert self in op.vars, (self, op)
        assert 0 <= self._dead <= self._queued, self
        queue = self._queue or []
        assert self._head % 2 == 0, self
        assert 0 <= self._head <= len(queue), self
        assert self._queued == (len(queue) - self._head) // 2, self
        assert not any(queue[: self._head : 2]), f"{self} keeps a granted request's operation"
        requests = self._requests()
        assert self._dead == sum(op._state is _CANCELLED for op, _ in requests), self
        seqs = [op.seq for op, _ in requests]
        assert seqs == sorted(seqs), f"{self} is not in push order"
        if requests:
            head, write = requests[0]
            assert head._state is not _CANCELLED, f"{self} has a tombstone at its head"
            # The head is queued only because the rule forbids granting it now: ask the rule,
            # then undo what it counted if it did grant.
            reads, writing = self._reads, self._writing
            granted = self._try_grant(write)
            self._reads, self._writing = reads, writing
            assert not granted, f"{self} keeps a grantable request queued"

    # -- values (the ergonomic layer, ergonomic.py): a Var may carry its data ------------

    @property
    def has_value(self) -> bool:
        """Whether this Var carries a value (``new_var(name, value=...)`` or a write ``out=``)."""
        return self._value is not NO_VALUE

    async def get(self) -> Any:
        """Return the value this Var carries, after every write to it pushed so far.

        A read operation run inline on the loop (``FnProperty.ASYNC``): it waits for earlier
        writers, overlaps with other readers, and returns the value object itself (not a
        copy). Must be awaited on the engine's loop. On a closed engine it returns the value as
        the engine left it (nothing can change it any more).

        Raises:
            DependencyError: if the Var carries a failure (its ``__cause__`` is the failure).
            ValueError: if the Var carries no value (raised here only: the read itself does
                not fail, so ``wait_for_all()`` and ``aclose()`` do not report it again).
        """
        # Through the engine (the façade), which delegates to the ergonomic layer: the core
        # never imports a collaborator.
        return await self._engine()._get_value(self)

    def set(self, value: T) -> Operation[T]:
        """Push a write that replaces the value, after every earlier use of this Var.

        Runs inline on the loop (``FnProperty.ASYNC``); returns the :class:`Operation`,
        whose result is ``value``.
        """
        # A partial: a Var given as the value stays a plain value, not a dependency.
        fn: Callable[[], T] = functools.partial(_identity, value)
        return self._engine().submit(fn, out=self, prop=_ASYNC, name=f"set({self.name})")

    def _engine(self) -> _ValueOwner:
        owner = self._owner
        if owner is None or not hasattr(owner, "submit"):  # none, or the serial sequencer's
            raise RuntimeError(f"{self!r} belongs to no Engine")
        return cast(_ValueOwner, owner)


class _ValueOwner(Protocol):
    """What :meth:`Var.get` and :meth:`Var.set` use of the engine a Var belongs to (its
    façade, which delegates to the ergonomic layer): the core imports neither."""

    async def _get_value(self, var: Var) -> Any: ...

    def submit(
        self, fn: Callable[..., T], /, *args: Any, out: Var, prop: FnProperty, name: str
    ) -> Operation[T]: ...


def append_all(op: _Waiter, reads: tuple[Var, ...], writes: tuple[Var, ...]) -> int:
    """:meth:`Var._append` for every Var of a push (reads, then writes); return how many of
    ``op``'s requests were queued, not granted (caller holds the engine lock).

    Every push's path, so :meth:`Var._append` is unrolled here: the grant rule is asked
    (:meth:`Var._try_grant`, a C function inlined in the compiled core) only when nothing is
    queued, and a request that must wait is queued in place.
    """
    wait = 0
    # Modes as the ints READ (0) and WRITE (1), not bools: comparing an int to WRITE is the
    # pure build's cheap int comparison (Var._grant, Var._try_grant).
    for v in reads:
        if v._queued or not v._try_grant(0):
            queue = v._queue
            if queue is None:
                queue = v._queue = []
            queue.append(op)
            queue.append(0)
            v._queued += 1
            wait += 1
    for v in writes:
        if v._queued or not v._try_grant(1):
            queue = v._queue
            if queue is None:
                queue = v._queue = []
            queue.append(op)
            queue.append(1)
            v._queued += 1
            wait += 1
    return wait


def append_modes(
    op: _Waiter, reads: tuple[Var, ...], others: tuple[Var, ...], modes: tuple[int, ...]
) -> int:
    """:func:`append_all` for an operation with commute or concurrent Vars: ``others`` are its
    Vars after the reads, ``modes`` theirs (WRITE, COMMUTE or CONCURRENT); return how many
    requests were queued (caller holds the engine lock). When none was, the caller still
    has to take the tokens (:func:`take_tokens`)."""
    wait = append_all(op, reads, ())
    for i in range(len(others)):
        v = others[i]
        if not v._append(op, modes[i]):
            wait += 1
    return wait


def take_tokens(op: _Waiter) -> bool:
    """Give ``op``, whose every request is granted, the tokens of all its commute Vars at
    once and return True; or, when one is busy, take none, park ``op`` on that Var's
    contenders (its release retries it), mark it parked (``nwait`` -1) and return False
    (caller holds the engine lock)."""
    modes = op.modes
    assert modes is not None
    vars_ = op.vars
    n = len(vars_)
    off = n - len(modes)
    for i in range(off, n):
        if modes[i - off] == COMMUTE:
            busy = vars_[i]
            if busy._token:
                if busy._contenders is None:
                    busy._contenders = deque((op,))
                else:
                    busy._contenders.append(op)
                op.nwait = -1  # parked: every request granted, no token taken
                return False
    for i in range(off, n):
        if modes[i - off] == COMMUTE:
            v = vars_[i]
            v._token = True
    op.nwait = 0
    return True


def release_modes(op: _Waiter, ready: list[Any], completed: bool) -> None:
    """:func:`release_all` for an operation with commute or concurrent Vars that was
    dispatched: it holds every request and its commute tokens (caller holds the engine
    lock). A parked one (``nwait`` -1) is released by the engine's withdrawal instead."""
    modes = op.modes
    assert modes is not None
    vars_ = op.vars
    nreads = op.nreads
    for i in range(nreads):  # its reads, as release_all releases them
        v = vars_[i]
        v._reads -= 1
        if v._queued and not v._reads:
            v._grant(ready)
    for i in range(nreads, len(vars_)):
        v = vars_[i]
        mode = modes[i - nreads]
        if mode == WRITE:
            v._release(True, ready, completed)
            continue
        if mode == COMMUTE:
            v._token = False
        v._release_member(ready, completed)
        if mode == COMMUTE and v._contenders and not v._token:
            v._wake_contenders(ready)


def withdraw_all(op: _Waiter, ready: list[Any], completed: bool) -> None:
    """Hand back what a cancelled operation (its state says so) holds of its Vars, granted
    or queued (caller holds the engine lock): a granted request is released, a queued one
    becomes a tombstone. One parked for a commute token (``nwait`` -1) holds every request
    and no token: it leaves the contenders it waits among."""
    nreads = op.nreads
    modes = op.modes
    vars_ = op.vars
    for i in range(len(vars_)):
        v = vars_[i]
        mode = READ if i < nreads else WRITE if modes is None else modes[i - nreads]
        if mode == COMMUTE and v._contenders and op in v._contenders:
            v._contenders.remove(op)
        if not v._holds(op):
            v._withdraw(ready)
        elif mode > WRITE:
            v._release_member(ready, completed)
        else:
            v._release(mode == WRITE, ready, completed)


def drop_consumed(items: list[Any], head: int) -> int:
    """Drop the consumed prefix ``items[:head]`` of a list read from a head index, once it is
    the whole list or at least half of it (amortised O(1) per item); return the new head.

    The queues on every operation's path (a Var's requests, the engine's loop queue) are such
    lists: the compiled core appends to a list and indexes it in C.
    """
    if head == len(items):
        del items[:]
        return 0
    if head >= 64 and head << 1 >= len(items):
        del items[:head]
        return 0
    return head


def release_all(vars_: tuple[Var, ...], nreads: int, ready: list[Any], completed: bool) -> None:
    """:meth:`Var._release` for every request of an operation that held all of them: its
    ``vars``, the first ``nreads`` read (caller holds the engine lock).

    Every operation's path, so :meth:`Var._release`'s bookkeeping is unrolled here (no call
    per Var in the pure build); what it lets in is still the grant rule's, through
    :meth:`Var._grant`, called only when requests are queued.
    """
    for i in range(nreads):
        v = vars_[i]
        v._reads -= 1
        if v._queued and not v._reads:
            v._grant(ready)
    for i in range(nreads, len(vars_)):
        v = vars_[i]
        v._writing = False
        if completed:
            v._version += 1
        if v._queued:
            v._grant(ready)


def carry(var: Var, value: object) -> None:
    """Make ``value`` the data ``var`` carries (``NO_VALUE``: none): the one way the layers
    above the core change it (the ergonomic layer's writes ``out=``, the remote versions).
    The caller holds ``var``'s write turn, or the engine lock for a remote version's
    transitions. A function of this module, not a method: users change a value through an
    operation (``Var.set``, ``submit(..., out=var)``), in push order."""
    var._value = value


def give(out: Var | tuple[Var, ...], result: Any) -> None:
    """Give ``out`` its new value: one Var ``result`` itself, or each Var of a tuple one value
    unpacked from ``result`` (ValueError if the counts differ, and no Var changes). The
    caller holds their write turn (a value operation's function, as it returns)."""
    if not isinstance(out, tuple):
        out._value = result  # (carry, inlined)
        return
    values = tuple(result)
    if len(values) != len(out):
        raise ValueError(
            f"the function returned {len(values)} value(s) for out= of {len(out)} Var(s)"
        )
    for var, value in zip(out, values, strict=True):
        var._value = value


def no_value_error(var: Var) -> ValueError:
    """The error of reading the value of ``var``, which carries none."""
    return ValueError(
        f"{var!r} carries no value: create it with engine.new_var(name, value=...) or "
        "write it first (submit(..., out=var) or var.set(value))"
    )


def carry_failure_locked(var: Var, box: Failure) -> None:
    """Make ``box`` the failure ``var`` carries: the one way the layers above the core change
    it (a remote version whose write failed, or whose value was lost). The core's API for
    collaborators, not a method: users see a failure through the operations that read
    ``var``. Caller holds the engine lock, which guards the failure: an operation that
    starts from now on finds ``box`` there (``Scheduler.skip_locked``; ``Failure.seen_by``
    decides whether it is skipped)."""
    var._failure = box


def fences_of(var: Var, new: Callable[[], T]) -> T:
    """The GPU collaborator's sync state of ``var``, made with ``new()`` on its first use:
    the one way a layer above the core attaches state to a Var (``fence.py``'s
    ``VarFences``, which then keeps its own fields; this module does not import it, and the
    core never reads it). Caller holds the engine lock. A Var keeps the state until it is
    collected: one object per Var that a GPU operation used, none for the others."""
    state = var._fences
    if state is None:
        state = var._fences = new()
    return cast(T, state)


def check_groups(ops: Iterable[Any]) -> None:
    """Check the invariants of groups and commute tokens across ``ops``, the live operations
    (``Scheduler.validate_state``; lock held): each Var's own; a token is held by exactly one
    dispatched commute member; a parked operation (``nwait`` -1) is PENDING and among the
    contenders of one of its commute Vars.

    Raises:
        AssertionError: naming the first invariant that does not hold.
    """
    holders: dict[Var, list[Any]] = {}
    tokens: set[Var] = set()
    checked: set[Var] = set()
    for op in ops:
        modes = op.modes
        if modes is None:  # read/write only: the queues' own tests cover them
            continue
        for v in op.vars:
            if v not in checked:
                checked.add(v)
                v._check_invariants()
                if v._token:
                    tokens.add(v)
        commute = [v for v, m in zip(op.mutate_vars, modes, strict=True) if m == COMMUTE]
        if op.nwait == -1:
            assert op._state is OpState.PENDING, op
            assert any(op in (v._contenders or ()) for v in commute), op
        elif op._state is OpState.READY or op._state is OpState.RUNNING:
            for v in commute:
                holders.setdefault(v, []).append(op)
    for v, ops_ in holders.items():
        assert len(ops_) == 1, (v, ops_)
    assert tokens == set(holders), tokens - set(holders)


def queued_behind(first: Any, target: Any = None) -> set[Any]:
    """The operations that cannot start before ``first`` ends, ``first`` included (caller
    holds the engine lock): ``first`` runs and holds its Vars, and the others are queued
    behind it on some Var, or behind another of them, by the grant rule. Stops once
    ``target`` is among them. Cancelled requests (tombstones) hold nothing back.

    A queued request is blocked when it conflicts with a request of one of these operations
    that is held or queued ahead of it (not of the same group), or when a blocked request is
    queued ahead of it: nothing overtakes a queued request. An operation parked for a commute
    token that ``first`` holds is blocked too (only a running operation holds a token).
    """
    behind = {first}
    new = [first]
    modes = first.modes
    if modes is not None:  # what waits for a commute token that first holds is behind it
        nreads = first.nreads
        for i, mode in enumerate(modes):
            v = first.vars[nreads + i]
            if mode == COMMUTE and v._token and v._contenders:
                for op in v._contenders:
                    if op not in behind:
                        behind.add(op)
                        new.append(op)
    # Vars one of them holds (first runs and holds all its Vars; the others, what was
    # granted before they queued). Whatever is queued on such a Var is blocked by it: a
    # request of the held group's own mode, with nothing queued ahead, would have joined it.
    held: set[Var] = set()
    while new and target not in behind:
        for op in new:
            held.update(v for v in op.vars if v._holds(op))
        # The Vars of the operations found last: their queues may block more now.
        vars_ = {v for op in new for v in op.vars if v._queued}
        new = []
        for v in vars_:
            blocked = v in held
            seen = 0  # the modes (bits) of their requests queued so far on v
            for op, mode in v._requests():
                if op._state is _CANCELLED:
                    continue
                # Queued behind one of theirs of another mode (or a write): not in its group.
                blocked = blocked or bool(seen & ~(1 << mode)) or (mode == WRITE and seen != 0)
                if op in behind:
                    seen |= 1 << mode
                elif blocked:
                    behind.add(op)
                    new.append(op)
    return behind


def _identity(value: T) -> T:
    return value


# -- the Var lists of a push: checked and deduplicated (every push calls both) -------------


def checked_writes(owner: object, mutate_vars: Iterable[Var]) -> tuple[Var, ...]:
    """Check ``mutate_vars`` of a push to ``owner`` (checked first, then ``const_vars`` by
    :func:`checked_reads`) and deduplicate it. Two calls, not one returning both tuples: no
    pair to build per push."""
    m: Sequence[Var] = (
        mutate_vars
        if type(mutate_vars) is list or type(mutate_vars) is tuple
        else _listed("mutate_vars", mutate_vars)
    )
    # A Var's owner is read through `var`, which the compiled core types as Var (a C
    # struct read) once the exact type is checked.
    for v in m:
        if type(v) is not Var:
            _bad_var(owner, "mutate_vars", m)
        var: Var = v
        if var._owner is not owner:
            _bad_var(owner, "mutate_vars", m)
    # Short lists (the usual case) are deduplicated without building dicts or sets, by
    # identity: Var has no __eq__, so `is` decides what `==` would, without its calls.
    nm = len(m)
    if nm < 2 or (nm == 2 and m[0] is not m[1]):
        return tuple(m)
    return tuple(dict.fromkeys(m))


def checked_reads(
    owner: object, const_vars: Iterable[Var], mutate: tuple[Var, ...]
) -> tuple[Var, ...]:
    """Check ``const_vars`` and deduplicate it, less the Vars in ``mutate`` (the
    deduplicated writes): a Var in both lists counts as mutated."""
    c: Sequence[Var] = (
        const_vars
        if type(const_vars) is list or type(const_vars) is tuple
        else _listed("const_vars", const_vars)
    )
    for v in c:
        if type(v) is not Var:
            _bad_var(owner, "const_vars", c)
        var: Var = v
        if var._owner is not owner:
            _bad_var(owner, "const_vars", c)
    nc = len(c)
    if not nc:
        return ()
    if (
        nc == 1
        or (nc == 2 and c[0] is not c[1])
        or (nc == 3 and c[0] is not c[1] and c[0] is not c[2] and c[1] is not c[2])
    ):
        const = tuple(c)
    else:
        const = tuple(dict.fromkeys(c))
    # Below, tuple([...]) rather than a generator: the compiled core (var.pxd) makes
    # this a cpdef method, in which Cython does not support closures.
    if len(mutate) > 8:  # long lists: a set, not nc * nm comparisons
        written = set(mutate)
        return tuple([v for v in const if v not in written])
    for v in const:
        for w in mutate:
            if v is w:  # in both lists: mutated
                return tuple([v for v in const if v not in mutate])
    return const


def checked_modes(
    owner: object,
    const: tuple[Var, ...],
    mutate: tuple[Var, ...],
    commute_vars: Iterable[Var],
    concurrent_vars: Iterable[Var],
) -> tuple[tuple[Var, ...], tuple[Var, ...], tuple[int, ...] | None]:
    """Check ``commute_vars`` and ``concurrent_vars`` of a push (whose checked reads and
    writes are ``const`` and ``mutate``) and return its reads, its other Vars (writes, then
    commute, then concurrent) and their modes (None when all are writes).

    Duplicates within one mode are dropped; a Var named in two different modes counts as a
    write."""
    if (
        (type(commute_vars) is list or type(commute_vars) is tuple)
        and not concurrent_vars
        and len(commute_vars) == 1
    ):  # the usual shape: one accumulator, nothing else to merge
        v = commute_vars[0]
        if type(v) is Var and v._owner is owner and v not in const and v not in mutate:
            modes = _ONE_COMMUTE.get(len(mutate))
            if modes is None:
                modes = (WRITE,) * len(mutate) + (COMMUTE,)
            return const, (*mutate, v), modes
    lists: list[tuple[Var, ...]] = []
    for arg, given in (("commute_vars", commute_vars), ("concurrent_vars", concurrent_vars)):
        vs = given if type(given) is list or type(given) is tuple else _listed(arg, given)
        for v in vs:
            if type(v) is not Var or v._owner is not owner:
                _bad_var(owner, arg, vs)
        lists.append(tuple(dict.fromkeys(vs)))
    commute, concurrent = lists
    count: dict[Var, int] = {}
    for group in (const, mutate, commute, concurrent):
        for v in group:
            count[v] = count.get(v, 0) + 1
    twice = [v for v, n in count.items() if n > 1 and v not in mutate]
    writes = mutate + tuple(twice)
    if twice:
        const = tuple([v for v in const if count[v] == 1])
    commute = tuple([v for v in commute if count[v] == 1])
    concurrent = tuple([v for v in concurrent if count[v] == 1])
    if not commute and not concurrent:
        return const, writes, None
    modes = (WRITE,) * len(writes) + (COMMUTE,) * len(commute) + (CONCURRENT,) * len(concurrent)
    return const, writes + commute + concurrent, modes


_ONE_COMMUTE = {n: (WRITE,) * n + (COMMUTE,) for n in range(4)}  # checked_modes' usual modes


def _listed(arg: str, vars_: object) -> list[Var]:
    if isinstance(vars_, Var):
        raise TypeError(f"{arg} must be a list of Vars, not a single Var; use [{vars_.name}]")
    if isinstance(vars_, (str, bytes)) or not isinstance(vars_, Iterable):
        raise TypeError(f"{arg} must be an iterable of aioengine.Var, got {vars_!r}")
    return list(vars_)


def _bad_var(owner: object, arg: str, vars_: Iterable[object]) -> None:
    for i, v in enumerate(vars_):
        if type(v) is not Var:
            raise TypeError(f"{arg}[{i}] is {v!r}, not an aioengine.Var")
        if v._owner is not owner:
            raise ValueError(f"{arg}[{i}] {v!r} belongs to another Engine")
