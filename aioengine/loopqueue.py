"""The loop queue: READY operations for the event-loop thread, best first.

Operations that run on the loop thread (coroutine functions, ``FnProperty.ASYNC`` functions,
serial mode, bulk segments) wait here once their turn has come, until the scheduler's
``_run_loop_queue`` claims them (or ``Operation.run_here``, called on the loop's thread, takes
one out: :meth:`LoopQueue.unqueue_locked`). Best means smallest ``key``: higher priority
first, then push order. Any thread puts (under the engine lock); the loop thread pops (under it
too).

The queue is two structures. A priority-0 operation (its key is its ``seq``) goes to the slot
of its ``seq`` in the FIFO ``fifo``, whose slot ``i`` holds the operation with ``seq ==
base + i``, or None (an operation not READY, a claimed one, or a number no loop operation
has). Its live part starts at ``head``: claimed and skipped slots before it are dropped in
bulk (as :meth:`LoopQueue.pop_locked` goes). Operations made ready in any order by completions on
the loop thread have larger numbers than the one that ran, so they usually land at or after
the head: a list's index and append, C operations compiled. Any other operation (a priority,
a number behind the head, or one so far ahead that the padding would more than double the
list) goes to the min-heap ``heap`` of keys, with the operation in ``heap_ops``. The best is
the smaller of the heap's head and the FIFO's first operation.

State (guarded by the engine lock):

- ``fifo``, ``head``, ``base``: the FIFO part, as above. Invariants: a slot is filled once;
  the last slot is an operation whenever ``head`` is below the list's length (padding only
  precedes a new operation).
- ``heap``, ``heap_ops``: the heap part; ``heap_ops`` holds exactly the heap's keys.
- ``scheduled``: a run of the queue is scheduled on the loop and has not emptied it.
  Invariant: an operation is queued only while ``scheduled`` is True.

The queue is empty iff the FIFO's live part and the heap are.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush
from typing import TYPE_CHECKING, Any

from .var import drop_consumed

if TYPE_CHECKING:
    from .operation import Operation

__all__ = ("LoopQueue",)


class LoopQueue:
    """READY operations for the loop thread, best first (see the module docstring)."""

    def __init__(self) -> None:
        self.fifo: list[Operation[Any] | None] = []
        self.head = 0
        self.base = 0
        self.heap: list[int] = []
        self.heap_ops: dict[int, Operation[Any]] = {}
        self.scheduled = False

    def put_locked(self, op: Operation[Any]) -> bool:
        """Queue READY ``op``; return True if the caller must schedule a run of the queue
        (none was scheduled), False if one is (lock held)."""
        if op.priority or not self._fifo_put(op):
            heappush(self.heap, op.key)
            self.heap_ops[op.key] = op
        if self.scheduled:
            return False
        self.scheduled = True
        return True

    def _fifo_put(self, op: Operation[Any]) -> bool:
        """Put priority-0 ``op`` in the slot of its number; False if that slot is behind the
        head, or so far ahead that padding would more than double the FIFO (lock held)."""
        fifo = self.fifo
        n = len(fifo)
        seq: int = op.seq
        if self.head == n:  # the FIFO is empty: it starts again at this operation
            del fifo[:]
            self.head = 0
            self.base = seq
            fifo.append(op)
            return True
        i = seq - self.base
        if i < n:
            if i < self.head:
                return False
            fifo[i] = op
            return True
        gap = i - n
        if gap > n + 64:
            return False
        while gap:  # padding, each slot appended once and passed once by the head
            fifo.append(None)
            gap -= 1
        fifo.append(op)
        return True

    def pop_locked(self) -> Operation[Any] | None:
        """Take the best queued operation out of the queue; None if it is empty (lock held).

        The FIFO's consumed prefix is dropped on the way (amortised, ``drop_consumed``), and
        ``head`` is written back before the caller starts the operation: a skip's release may
        put more, and :meth:`put_locked` reads it.
        """
        fifo = self.fifo
        heap = self.heap
        n = len(fifo)
        head = self.head
        while head < n and fifo[head] is None:
            head += 1  # a slot whose op is not READY yet, or never a loop op
        first = fifo[head] if head < n else None  # the FIFO's best; the heap's is heap[0]
        if first is not None and not (heap and heap[0] < first.key):
            fifo[head] = None
            head += 1
            op: Operation[Any] | None = first
        elif heap:
            op = self.heap_ops.pop(heappop(heap))
        else:
            op = None
        kept = drop_consumed(fifo, head)
        self.base += head - kept
        self.head = kept
        return op

    def unqueue_locked(self, op: Operation[Any]) -> bool:
        """Take queued ``op`` out of the queue, for the loop thread to run it now
        (``Operation.run_here``); False, changing nothing, if it is not queued (lock held).
        Padding the removal leaves at the end is dropped with it (the last slot stays an
        operation)."""
        fifo = self.fifo
        i = op.seq - self.base
        if self.head <= i < len(fifo) and fifo[i] is op:
            fifo[i] = None
            while len(fifo) > self.head and fifo[-1] is None:
                fifo.pop()
            return True
        key = op.key
        if self.heap_ops.get(key) is op:
            del self.heap_ops[key]
            self.heap.remove(key)
            heapify(self.heap)
            return True
        return False

    def empty_locked(self) -> bool:
        """Whether no operation is queued (lock held)."""
        return self.head == len(self.fifo) and not self.heap

    def check_invariants(self) -> None:
        """Assert the invariants of the module docstring (tests; lock held)."""
        fifo, head = self.fifo, self.head
        assert 0 <= head <= len(fifo), (head, len(fifo))
        assert head == len(fifo) or fifo[-1] is not None, "padding after the last slot"
        for i in range(head, len(fifo)):
            op = fifo[i]
            assert op is None or op.seq == self.base + i, (i, op)
        assert sorted(self.heap) == sorted(self.heap_ops), "heap and its ops"
        if not self.scheduled:
            assert self.empty_locked(), "queued but not scheduled"
