"""The failure ledger of one engine: the failures its operations may still see, and which of
them have been thrown (MXNet's throw-once).

A failure is a shared :class:`~aioengine.var.Failure` record: the Vars an operation wrote
carry it, and the operations that start afterwards inherit it (they are skipped). A wait
that raises it *throws* it (``wait_for_var``, ``wait_for_all``, ``aclose``): from then on
the operations pushed later no longer see it, while those pushed before still do, however
late they start. The ledger keeps each failure until nothing can see it any more, then
*retires* it (drops its exception). The scheduler owns one (``Scheduler.ledger``) and
calls it with the engine lock held.

State (lock held for every access):

- ``failures``: the failures an operation may still see, in the order they happened: those
  not thrown yet, and those thrown while an operation pushed before the throw is live. The
  scheduler reads the same dict as ``failures`` on its fast path (empty: nothing to skip).
- ``thrown``: the thrown failures still in ``failures``, in the order they were thrown (so by
  ``Failure.cleared``); invariant: each is in ``failures``, its ``cleared`` set.
"""

from __future__ import annotations

from .var import Failure

__all__ = ("Ledger",)


class Ledger:
    """The failures of one engine (see the module docstring); every method: lock held."""

    __slots__ = ("failures", "thrown")

    def __init__(self) -> None:
        self.failures: dict[Failure, None] = {}
        self.thrown: list[Failure] = []

    def record(self, box: Failure) -> None:
        """Track a new failure: waits raise it until it is thrown."""
        self.failures[box] = None

    def throw(self, box: Failure, seq: int) -> None:
        """Mark ``box`` thrown at sequence number ``seq``: operations pushed from then on no
        longer see it, the ones pushed before still do. It stays tracked until retired."""
        box.cleared = seq
        self.thrown.append(box)

    def retire(self, oldest: int | None) -> None:
        """Retire the thrown failures that no live operation sees any more: those thrown
        before ``oldest``, the sequence number of the oldest live operation (None: none is
        live), whose exceptions are dropped."""
        thrown = self.thrown
        n = 0
        for box in thrown:
            if oldest is not None and box.cleared >= oldest:  # type: ignore[operator]
                break  # an operation pushed before this throw may still see it
            box.exc = None
            del self.failures[box]
            n += 1
        del thrown[:n]

    def take(self, box: Failure | None, seq: int, oldest: int | None) -> BaseException | None:
        """Claim the exception of ``box``, the failure a Var carried at a wait's turn, unless
        it was thrown already, and throw it (under the lock, so two waits never both do)."""
        if box is None or not box.unthrown:
            return None
        exc = box.exc
        self.throw(box, seq)
        self.retire(oldest)
        return exc

    def take_all(self, seq: int, oldest: int | None) -> list[BaseException]:
        """Claim every failure not thrown yet, in the order they happened, and throw them."""
        errors = []
        for box in self.failures:
            if box.cleared is None:
                assert box.exc is not None
                errors.append(box.exc)
                self.throw(box, seq)
        self.retire(oldest)
        return errors

    def unthrown(self) -> list[BaseException]:
        """The failures no wait has raised (what ``aclose()`` would raise), for
        ``Engine.__del__``, which takes no lock: a snapshot of ``failures`` (``list()`` of a
        dict runs in C, under the GIL, without calling back into Python)."""
        return [
            box.exc for box in list(self.failures) if box.cleared is None and box.exc is not None
        ]

    def validate(self) -> None:
        """Check the invariants above (``Scheduler.validate_state``)."""
        cleared = [box.cleared for box in self.thrown]
        assert None not in cleared, cleared
        assert cleared == sorted(cleared), cleared  # type: ignore[type-var]
        assert all(box in self.failures for box in self.thrown), "thrown box not tracked"
        assert all(box.cleared is not None or box.exc is not None for box in self.failures), (
            "a retired failure is tracked"
        )
