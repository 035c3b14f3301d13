"""Bursts: the chunked operations a caller pushes on the event loop's thread between two
iterations of the loop (one chain, as it is written), and when their kernels start.

The engine wakes sleeping workers for work pushed on the loop's thread at the loop's next
iteration (so ``aclose()`` right after a push wins, and a callback added before ``await`` has
run when it returns). Two things follow for a chain of chunk kernels (``_chain.py``):

* A worker that finishes an operation takes the next queued one at once: it may take a kernel
  while the caller is still pushing the chain's later steps, which join a kernel only while it
  has not started (else they make kernels of their own, and the intermediates are written to
  memory). So a kernel of the current burst waits (:meth:`Burst.wait`, GIL released) until the
  loop iterates or the caller has gone on with other work (:meth:`Burst.quiet`: :data:`QUIET`
  of CPU time, blocked in a system call after :data:`QUIET_BLOCKED`, or :data:`QUIET_MAX` of
  wall time, without a chunked push; :data:`QUIET_RUNNABLE` for a caller that waits for a
  core on a loaded machine, or is still pushing a program's kernels).
* A caller that pushes a chain and then keeps the loop busy (``time.sleep``, a long stretch of
  Python, a synchronous wait in a notebook cell) would hold it back until its next ``await``.
  So the burst's opening arms the process's :class:`Waker`: a daemon thread that, once the
  caller is quiet and the loop has still not iterated, pushes one
  no-op operation (``"array wake"``) on the burst's device from its own thread; a push from
  off the loop wakes the device's workers at once, and they take the queued kernels. Under
  the GIL a worker takes its turn from a caller spinning in pure Python only every
  ``sys.getswitchinterval()`` (5 ms), which bounds how soon it starts there.

A caller off the loop (``aioengine.array_api``, a ``BlockingEngine``'s namespace, any thread
of its own) has the same race and a burst per thread (``Burst(on_loop=False)``): its pushes
wake the workers at once, so its kernels wait until the thread reaches a wait of the namespace
(a sync point ends its burst: :meth:`Burst.end`) or is quiet. No
waker is needed there: a push from off the loop already wakes the workers.

State: :class:`Burst`'s fields are written on the thread that pushes (the loop's, or the one
caller's) and read by workers and the waker (one object each, no lock), except ``gen``, which
moves on under the burst's ``ended`` Condition (the kernels waiting for it sleep there);
:class:`Waker`'s ``armed`` and ``thread`` are guarded by its ``cond``.
"""

from __future__ import annotations

import os
import platform
import threading
import time
from typing import TYPE_CHECKING

from .. import FnProperty
from ._sync import running_loop

if TYPE_CHECKING:
    from .. import Context, Engine, RunContext

__all__ = (
    "LOOK",
    "QUIET",
    "QUIET_BLOCKED",
    "QUIET_MAX",
    "QUIET_RUNNABLE",
    "SAMPLE",
    "Burst",
    "Waker",
)

#: How much CPU time the caller's thread may spend on other work, without pushing a chunked
#: operation, while the loop has not iterated, before its burst's kernels start (and the
#: waker wakes the workers for them). Long beside the gap between two pushes of a chain
#: (tens of µs), short beside the busy stretch it is for. CPU time, not wall time: a caller
#: the machine deschedules mid-chain (a loaded machine) spends none, and its chain stays fused.
QUIET = 0.005
#: How long (wall time) the caller may go without pushing a chunked operation before its
#: burst's kernels start whatever it does (a wait for a lock; or its thread's CPU time and
#: state cannot be read on this platform), unless it is runnable and waiting for a core.
QUIET_MAX = 0.02
#: How long (wall time) a caller that is runnable, but has not had :data:`QUIET` of CPU time
#: (a loaded machine deschedules it mid-chain: Linux's ``/proc`` says ``R``), may go without
#: pushing before its burst's kernels start: it waits for a core, not for other work, and
#: starting them splits its chain (each intermediate then written to memory).
QUIET_RUNNABLE = 0.1
#: How long (wall time since its latest chunked push) a caller that is now blocked in a
#: system call other than a futex wait (``time.sleep``, ``select``, a read: Linux's ``/proc``
#: says which), having spent at most a quarter of that time on the CPU, may stay so before its
#: burst's kernels start. A futex wait does not count: it is how a thread waits for the GIL
#: (up to the 5 ms switch interval while another thread runs Python, between two pushes of a
#: chain) as well as for a lock, so those callers are quiet by :data:`QUIET_MAX` only.
QUIET_BLOCKED = 0.001

#: The wall time between two reads of the caller's CPU clock as it records chunked operations
#: (:meth:`Burst.enter`).
SAMPLE = 0.00005

#: How often a kernel waiting for its burst to end looks whether its caller is quiet (the end
#: itself wakes it at once).
LOOK = 0.0002

#: The number of ``futex`` on this machine's architecture (None: unknown, the blocked rule is
#: off), as ``/proc/<pid>/task/<tid>/syscall`` gives it.
_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine())


def _cpu_clock() -> int | None:
    """The CPU-time clock of the calling thread, for other threads to read (None where the
    platform has none, or it cannot be read)."""
    try:
        clock = time.pthread_getcpuclockid(threading.get_ident())
        time.clock_gettime(clock)
    except (AttributeError, OSError):
        return None
    return clock


class Burst:
    """The chunk kernels a namespace pushes on the event loop's thread between two iterations
    of the loop (see the module docstring)."""

    __slots__ = (
        "clock",
        "cpu",
        "ended",
        "gen",
        "last",
        "on_loop",
        "open",
        "pushing",
        "sampled",
        "thread",
    )

    def __init__(self, on_loop: bool = True) -> None:
        #: The bursts ended (the loop iterated after them, or the caller off the loop waited).
        self.gen = 0
        #: Notified as ``gen`` moves on: the kernels waiting in :meth:`wait` start at once,
        #: not at their next look at :meth:`quiet`.
        self.ended = threading.Condition(threading.Lock())
        #: Pushed on the loop's thread (ended by its next iteration), else by one thread off
        #: it (ended by :meth:`end`).
        self.on_loop = on_loop
        #: When the latest chunked operation of the current burst was recorded (or its pushes
        #: were done: :meth:`touch`).
        self.last = 0.0
        #: A burst is open: its end is scheduled on the loop.
        self.open = False
        #: The caller is recording a chunked operation (between :meth:`enter` and
        #: :meth:`touch`: a program's first step pushes a kernel per chunk), so it is not quiet.
        self.pushing = False
        #: The pushing thread, its CPU-time clock (None: none here), and that clock when the
        #: latest chunked operation was recorded.
        self.thread = 0
        self.clock: int | None = None
        self.cpu = 0.0
        #: When ``cpu`` was read (``perf_counter``).
        self.sampled = -SAMPLE

    def enter(self, engine: Engine, device: Context) -> int:
        """On the loop's thread, as a chunked operation on ``device`` is recorded: the burst
        it is in (its ``gen``); the first one opens the burst and arms the waker. Off the loop
        (``on_loop`` false), on the caller's thread: the burst it is in."""
        thread = threading.get_native_id()  # (a new thread may reuse a finished one's ident)
        if thread != self.thread:
            self.thread, self.clock = thread, _cpu_clock()
            self.sampled = -SAMPLE
        self._mark(True)
        if self.on_loop and not self.open:
            self.open = True
            loop = running_loop()
            assert loop is not None
            loop.call_soon(self._end)
            WAKER.arm(self, self.gen, engine, device)
        return self.gen

    def touch(self) -> None:
        """On the pushing thread, as a chunked operation's pushes are done (or failed): the
        caller was busy with them, not quiet."""
        self._mark(False)

    def _mark(self, pushing: bool) -> None:
        """Record the caller's wall and CPU time now, on its thread, and whether it is
        ``pushing``. The CPU clock is a system call (0.5 µs here, a tenth of a join): read
        once per SAMPLE of wall time. ``cpu`` is then at most SAMPLE behind, which can make
        :meth:`quiet` see at most SAMPLE more CPU time than the caller spent: QUIET is 100
        times that, and the blocked rule only grows stricter."""
        now = time.perf_counter()
        if now - self.sampled >= SAMPLE:
            self.cpu = time.thread_time()
            self.sampled = now
        self.last = now
        self.pushing = pushing

    def _end(self) -> None:
        self.open = False
        self._next()

    def end(self) -> None:
        """On the caller's thread off the loop, as it starts to wait on the engine (a sync
        point): the kernels it pushed start now."""
        self._next()

    def _next(self) -> None:
        # Under ``ended``: a kernel in :meth:`wait` reads ``gen`` under it before it sleeps,
        # so it either sees the new ``gen`` or is woken.
        with self.ended:
            self.gen += 1
            self.ended.notify_all()

    def quiet(self) -> bool:
        """Whether the caller has gone on with other work since its latest chunked push:
        :data:`QUIET` of its thread's CPU time, blocked in a system call after
        :data:`QUIET_BLOCKED`, or :data:`QUIET_MAX` of wall time (any thread) unless it is
        runnable and waiting for a core, or still pushing (then :data:`QUIET_RUNNABLE`)."""
        wall = time.perf_counter() - self.last
        if self.pushing:  # (bounded: a push off the loop may wait for room, or have failed)
            return wall >= QUIET_RUNNABLE
        clock = self.clock
        if clock is None:
            return wall >= QUIET_MAX
        try:
            cpu = time.clock_gettime(clock) - self.cpu
        except OSError:  # the thread is gone
            return True
        if cpu >= QUIET:
            return True
        if wall >= QUIET_MAX:
            return wall >= QUIET_RUNNABLE or not _runnable(self.thread)
        # Blocked: in a system call now (not a futex wait: the GIL's, between two pushes), and
        # it has hardly run since its push.
        return wall >= QUIET_BLOCKED and cpu < wall / 4 and _blocked(self.thread)

    def wait(self, gen: int) -> None:
        """On a worker, before a kernel of burst ``gen`` starts: wait until the burst ends
        (woken as it does) or its caller is :meth:`quiet` (looked at every :data:`LOOK`)."""
        ended = self.ended
        while self.gen == gen and not self.quiet():
            with ended:
                if self.gen == gen:
                    ended.wait(LOOK)


def _blocked(thread: int) -> bool:
    """Whether the thread of native id ``thread`` (of this process) is in a system call other
    than a futex wait (Linux's ``/proc``: the call's number, or ``running``); False where that
    cannot be read."""
    if _FUTEX is None:
        return False
    try:
        fd = os.open(f"/proc/self/task/{thread}/syscall", os.O_RDONLY)
    except OSError:
        return False
    try:
        line = os.read(fd, 64)
    except OSError:
        return False
    finally:
        os.close(fd)
    number = line.split(b" ", 1)[0]
    # "running" (user code), "-1" (blocked outside a call: a page fault), or the call's number.
    return number.isdigit() and int(number) != _FUTEX


def _runnable(thread: int) -> bool:
    """Whether the thread of native id ``thread`` (of this process) is runnable (running, or
    waiting for a core: state ``R`` in Linux's ``/proc``); False where that cannot be read."""
    try:
        with open(f"/proc/self/task/{thread}/stat", "rb") as stat:
            line = stat.read()
    except OSError:
        return False
    # "pid (comm) state ...": the command may hold spaces and parentheses, the state follows
    # the last ")".
    fields = line.rpartition(b")")[2].split()
    return bool(fields) and fields[0] == b"R"


def _nothing(rctx: RunContext) -> None:
    """The waker's operation: its push from off the loop is what wakes the workers."""


class Waker:
    """The daemon thread that starts a burst's kernels when its caller keeps the loop busy
    (see the module docstring); one per process, started on first use (and again in a
    forked child)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        #: The bursts opened and not yet done with, oldest first: (the burst, its gen, its
        #: engine, its device); one leaves after its wake-up, if due, was pushed. Guarded by
        #: ``cond``.
        self.armed: list[tuple[Burst, int, Engine, Context]] = []
        #: The thread and the process that started it. Guarded by ``cond``.
        self.thread: tuple[int, threading.Thread] | None = None

    def arm(self, burst: Burst, gen: int, engine: Engine, device: Context) -> None:
        """Watch burst ``gen`` of ``burst`` (on the loop's thread, as it opens)."""
        with self.cond:
            self.armed.append((burst, gen, engine, device))
            pid = os.getpid()
            if self.thread is None or self.thread[0] != pid:
                thread = threading.Thread(target=self._run, name="aioengine-array-waker")
                thread.daemon = True
                self.thread = (pid, thread)
                thread.start()
            elif len(self.armed) == 1:  # it was idle; else it gets to this one in turn
                self.cond.notify()

    def _run(self) -> None:
        cond, armed = self.cond, self.armed
        while True:
            with cond:
                while not armed:
                    cond.wait()
                burst, gen, engine, device = armed[0]
            while burst.gen == gen and not burst.quiet():
                time.sleep(0.0005)
            if burst.gen == gen:  # quiet, and the loop has not iterated: wake the workers
                _wake(engine, device)
            with cond:  # (only now: an empty ``armed`` means every wake-up due was pushed)
                armed.pop(0)
            del burst, engine, device  # an idle waker keeps no engine alive


def _wake(engine: Engine, device: Context) -> None:
    """Push the no-op that wakes ``device``'s workers (from the waker's thread)."""
    try:
        engine.push_sync(_nothing, device, prop=FnProperty.NORMAL, name="array wake")
    except Exception:
        pass


#: The process's waker.
WAKER = Waker()
