"""The engine lock: a mutex that the hot paths take and give back with one C call each.

Every push takes the engine's lock once, and so does every finish. On CPython 3.11,
``threading.Lock.acquire()`` parses its (absent) arguments with
``PyArg_ParseTupleAndKeywords``, which costs more instructions than the critical section of a
push. ``queue.SimpleQueue``'s ``get()`` and ``put()`` are ``METH_FASTCALL`` functions, and a
SimpleQueue that holds one token is a mutex: ``get()`` takes the token, waiting (without the
GIL) while another thread holds it; ``put()`` gives it back and wakes one waiter. A round trip
costs half of the Lock's (measured: 37 against 75 ns), and a no-op operation about 3% less.

User code runs inside a critical section without being called there: a finalizer (``__del__``,
a weakref callback) that the cycle collector runs at an allocation, or a signal handler in the
main thread. If it calls the engine, it runs on the thread that holds the lock, so the lock
knows its holder (:attr:`EngineLock.owner`) and keeps :attr:`EngineLock.after`, the work that
the critical section holds back until the token is given back:

Invariant (the engine lock's discipline, written once here): no user code runs and no user
object's last reference is dropped while the lock is held. A critical section that detaches
an object it may hold the last reference to appends it to ``after``; an engine call made on
the holder's thread (by a finalizer or a signal handler) never waits for the lock: pushes and
cancellations are appended to ``after`` as a :class:`Deferred` call, any other call raises
:class:`RuntimeError`. The garbage collector runs finalizers wherever the collecting thread
happens to be, which may be inside a thread pool's lock or one of ``concurrent.futures``'s as
well, so a push or cancellation made during a collection on its own thread is always
deferred (:func:`defer`): to the end of the collection, when ``lifecycle`` hands it to the
finalizer thread (:func:`start_finalizer_thread`), which holds no lock and makes the calls in
order. Whoever gives the token back with ``after`` not empty swaps the list out
first (only the holder appends to it) and empties it afterwards (:meth:`EngineLock.unlock`).

Ctrl-C: Python runs a signal handler in the main thread between two bytecodes, so a
``KeyboardInterrupt`` could stop pure-Python engine code half-way (the lock left held, an
operation READY and never submitted), and the compiled core wherever it calls Python code.
:func:`guard_interrupts`, called when an engine is first used on the main thread (so inside
``asyncio.run``, after the runner has installed its own handler), wraps the SIGINT handler:
while the main thread holds an engine lock or runs the engine's own code (not an operation's
function or another user callback), the wrapper hands the signal back to the main thread
half a millisecond later (:func:`signal_main_later`: a timer of the kernel's on Linux, which
needs no GIL) instead of calling the handler, until the engine's code has returned: the
interrupt is delayed by about a millisecond and never splits the engine's bookkeeping. The
same in a finalizer (``__del__``, a weakref callback), where the interpreter would drop it, and in
asyncio's loop between taking a callback and running it, where it would lose the callback,
and in asyncio's ``call_soon`` and ``create_task``, which the compiled core calls from C.
The engine's code is known by its file, or, where ``exec`` made it for one of the package's
modules (a dataclass's ``__init__``, whose file is "<string>"), by its module. A
handler installed later replaces the wrapper (and with it this guarantee). Once no open
engine is guarded (each is forgotten when it closes), :func:`unguard_interrupts` puts the
wrapped handler back, so that ``asyncio.run`` (which installs its own handler only over the
default one) and the runner's own restoring behave as without aioengine.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import logging
import os
import queue
import signal
import sys
import sysconfig
import threading
import weakref
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

from . import lifecycle

_collection = lifecycle.collection

__all__ = ("Deferred", "EngineLock", "guard_interrupts", "unguard_interrupts")

logger = logging.getLogger("aioengine")
_get_ident = threading.get_ident


class Deferred(functools.partial[Any]):
    """An engine call held back in :attr:`EngineLock.after` until the critical section that
    its caller (a finalizer or a signal handler on the holder's thread) interrupted ends."""

    __slots__ = ()


class EngineLock:
    """A non-reentrant mutex with :class:`threading.Lock`'s interface.

    :attr:`take` and :attr:`give` are the bare calls for the engine's hot paths, which pair
    them in a ``try`` statement: ``take()`` is ``acquire()`` and ``give()`` is ``release()``
    without its check that the lock is held. Those paths keep :attr:`owner` themselves (set
    right after ``take()``) and give the lock back with :meth:`unlock` when :attr:`after` is
    not empty (the module docstring says why).
    """

    __slots__ = ("__weakref__", "_token", "after", "give", "owner", "take")

    def __init__(self) -> None:
        # Invariant: the queue holds the one token (None) exactly while the lock is free.
        self._token: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._token.put(None)
        #: Acquire: take the token, waiting while another thread holds it.
        self.take: Callable[[], None] = self._token.get
        #: Release (by the holder only; unchecked): give the token back, waking one waiter.
        self.give: Callable[[], None] = functools.partial(self._token.put, None)
        #: The ident of the thread that holds the lock, 0 while it is free: set right after
        #: the token is taken, cleared right before it is given back, so a thread finds its
        #: own ident here exactly while it holds the lock.
        self.owner = 0
        #: What the current critical section holds back (see the module docstring): objects
        #: to release and :class:`Deferred` calls to make once the lock is free. Only the
        #: holder appends; :meth:`unlock` swaps it out before giving the token back.
        self.after: list[object] = []
        _locks.add(self)

    def enter(self, me: int) -> int:
        """Begin a critical section of the engine's hot paths on the thread whose ident is
        ``me``: take the lock (:attr:`take`) and record its owner. The one entry of those
        sections; pair it with :meth:`leave` in a ``finally`` clause. A C method in the
        compiled core (lock.pxd); returns 0."""
        self.take()
        self.owner = me
        return 0

    def leave(self) -> int:
        """End the critical section :meth:`enter` began: give the lock back (:attr:`give`),
        through :meth:`unlock` when :attr:`after` holds something back (released, and its
        deferred calls made, once the lock is free). Returns 0."""
        if self.after:
            self.unlock()
        else:
            self.owner = 0
            self.give()
        return 0

    def held_here(self) -> bool:
        """Whether the calling thread holds the lock (so user code runs inside its critical
        section: a finalizer or a signal handler)."""
        return self.owner == _get_ident()

    def unlock(self) -> None:
        """Give the lock back (the holder only), then release what :attr:`after` held back
        and make its deferred calls, in order, without the lock.

        A deferred call that raises is logged and the next one runs: its caller (a finalizer)
        has returned long ago.
        """
        after = self.after
        if after:
            self.after = []
        self.owner = 0
        self._token.put(None)
        if after:
            run_after(after)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Acquire the lock, as :meth:`threading.Lock.acquire`; return whether it was."""
        if not blocking:
            if timeout != -1:
                raise ValueError("can't specify a timeout for a non-blocking call")
            timeout = 0
        elif timeout < 0 and timeout != -1:
            raise ValueError("timeout value must be positive")
        me = _get_ident()
        if timeout == -1 and self.owner == me:  # it would wait for ever
            raise RuntimeError(
                "the engine's lock is held by this thread: an engine call made by a finalizer "
                "or a signal handler that runs inside the engine's critical section cannot "
                "wait for it (only pushes and cancellations are deferred until it ends)"
            )
        try:
            if timeout == -1:
                self._token.get()
            else:
                self._token.get(timeout > 0, timeout or None)
        except queue.Empty:
            return False
        self.owner = me
        return True

    def release(self) -> None:
        """Release the lock, as :meth:`threading.Lock.release` (any thread may release it).

        Raises:
            RuntimeError: if the lock is not held.
        """
        if not self._token.empty():
            raise RuntimeError("release unlocked lock")
        self.unlock()

    def locked(self) -> bool:
        """Return True if the lock is held."""
        return self._token.empty()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"<aioengine.EngineLock {'locked' if self.locked() else 'unlocked'}>"


_finalizer_thread: tuple[int, threading.Thread] | None = None  # (its process id, the thread)


def start_finalizer_thread() -> None:
    """Start, once per process, the daemon thread that makes the engine calls deferred by
    the finalizers of a garbage collection (``lifecycle.deferred_calls``), in order.

    Called when an engine is created (never during a collection: starting a thread takes
    locks of ``threading``'s that the collecting thread may hold).
    """
    global _finalizer_thread
    lifecycle.track_collections()
    pid = os.getpid()
    if _finalizer_thread is not None and _finalizer_thread[0] == pid:
        return  # (a forked child has no thread of its parent's: it starts its own)
    thread = threading.Thread(
        target=_make_deferred_calls, name="aioengine-finalizer-calls", daemon=True
    )
    _finalizer_thread = (pid, thread)
    thread.start()


def _make_deferred_calls() -> None:
    get = lifecycle.deferred_calls.get
    while True:
        run_after(get())


def defer(lock: EngineLock, me: int, call: Deferred) -> None:
    """Hold back ``call``, an engine call made by a finalizer on thread ``me``: until the
    garbage collection that ran the finalizer ends (then the finalizer thread makes it), or
    until ``me``'s critical section on ``lock`` ends."""
    if _collection.thread == me:
        _collection.calls.append(call)
    else:
        lock.after.append(call)


def run_after(after: list[object]) -> None:
    """Make the :class:`Deferred` calls of a swapped-out :attr:`EngineLock.after`, in order,
    then drop every object it held (no lock held)."""
    for item in after:
        if type(item) is Deferred:
            try:
                item()
            except Exception:
                logger.exception("aioengine: an engine call deferred from a finalizer failed")
    after.clear()


_RETRY = 0.0005  # seconds before a delayed Ctrl-C is signalled again


class _TimeSpec(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]


class _ITimerSpec(ctypes.Structure):
    _fields_ = [("interval", _TimeSpec), ("value", _TimeSpec)]


class _SigEvent(ctypes.Structure):
    # Linux's struct sigevent (64 bytes): the value, the signal, how to notify, then a union
    # whose first member is SIGEV_THREAD_ID's thread id. The padding makes it at least 64
    # bytes on 32-bit systems too (where the value is 4 bytes), as the kernel reads 64.
    _fields_ = [
        ("value", ctypes.c_void_p),
        ("signo", ctypes.c_int),
        ("notify", ctypes.c_int),
        ("tid", ctypes.c_int),
        ("pad", ctypes.c_int * 13),
    ]


_SIGEV_THREAD_ID = 4  # Linux: the signal goes to the thread ``tid``
_CLOCK_MONOTONIC = 1


@functools.cache
def _timer_calls() -> tuple[Any, Any] | None:
    """The C library's ``timer_create`` and ``timer_settime``, or None where there are none
    (not Linux, or neither libc nor librt has them)."""
    if not sys.platform.startswith("linux"):
        return None
    for name in (None, ctypes.util.find_library("rt")):
        try:
            lib = ctypes.CDLL(name, use_errno=True)
            create, settime = lib.timer_create, lib.timer_settime
        except (OSError, AttributeError):
            continue
        create.argtypes = [ctypes.c_int, ctypes.POINTER(_SigEvent), ctypes.c_void_p]
        settime.argtypes = [
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.POINTER(_ITimerSpec),
            ctypes.c_void_p,
        ]
        return create, settime
    return None


def _kernel_timer(signum: int) -> tuple[Any, ctypes.c_void_p] | None:
    """This process's POSIX timer that sends ``signum`` to the main thread (made on first
    use) and ``timer_settime``, or None."""
    return _made_timer(os.getpid(), signum)  # a forked child has none of its parent's timers


@functools.cache
def _made_timer(pid: int, signum: int) -> tuple[Any, ctypes.c_void_p] | None:
    calls = _timer_calls()
    tid = threading.main_thread().native_id
    if calls is not None and tid is not None:
        event = _SigEvent(None, signum, _SIGEV_THREAD_ID, tid)
        timer = ctypes.c_void_p()
        if calls[0](_CLOCK_MONOTONIC, ctypes.byref(event), ctypes.byref(timer)) == 0:
            return calls[1], timer
    return None


def signal_main_later(signum: int, delay: float) -> None:
    """Send ``signum`` to the main thread in ``delay`` seconds (from 1 µs), as a real signal.

    On Linux a POSIX timer of the kernel sends it, so it comes on time however busy the main
    thread is; one timer per signal, so a call made while one is pending replaces it.
    Elsewhere a daemon thread sends it; that thread needs the GIL, which a main thread that
    keeps giving it back and taking it again at once (an event loop whose ready queue never
    empties polls for I/O, without waiting, on every iteration) can keep for seconds.
    """
    kernel = _kernel_timer(signum)
    if kernel is not None:
        settime, timer = kernel
        sec = int(delay)
        when = _ITimerSpec(_TimeSpec(0, 0), _TimeSpec(sec, max(1000, int((delay - sec) * 1e9))))
        if settime(timer, 0, ctypes.byref(when), None) == 0:
            return
    main = threading.main_thread().ident
    sender = threading.Timer(delay, signal.pthread_kill, (main, signum))
    sender.daemon = True
    sender.start()


# Every engine lock, for the SIGINT wrapper: does the main thread hold one?
_locks: weakref.WeakSet[EngineLock] = weakref.WeakSet()
# The open engines (their schedulers) used on the main thread: the wrapper stays installed,
# and delays interrupts, while there is one.
_guarding: weakref.WeakSet[object] = weakref.WeakSet()
_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
# The engine's own code, where a KeyboardInterrupt must wait (the front ends' blocking waits
# are the user's: interruptible).
_FRONT_END_MODULES = ("blocking", "_blocking_generated", "__main__", "demo", "pipeline")
_FRONT_ENDS = frozenset(_PACKAGE + name + ".py" for name in _FRONT_END_MODULES)
# The same by module name, for code that exec made for one of the package's modules: a
# dataclass's generated __init__ (RunContext's, which the compiled core calls from C) has
# "<string>" for a file name, and the module's globals.
_MODULE_PREFIX = __name__.rpartition(".")[0] + "."
_FRONT_END_NAMES = frozenset(_MODULE_PREFIX + name for name in _FRONT_END_MODULES)
# Where asyncio's loop has taken a callback off its ready queue and not yet run it: an
# interrupt there loses the callback (one of the engine's own, say, leaving it unscheduled
# for good). Waiting in select() is elsewhere, so an idle loop is interrupted at once.
_LOOP_STEPS = frozenset(
    (
        asyncio.base_events.BaseEventLoop._run_once.__code__,  # type: ignore[attr-defined]
        asyncio.events.Handle._run.__code__,
    )
)
# Where asyncio schedules a callback or makes a task: an interrupt there loses it (the
# callback never scheduled, the task never made). Anywhere among the library frames, not
# only the innermost: the compiled core calls these from C, with no frame of its own above
# them for the walk below to find (its deferred wake of a pool, lost so, left an operation
# queued with its worker asleep).
_SCHEDULING = frozenset(
    (
        asyncio.base_events.BaseEventLoop.call_soon.__code__,
        asyncio.base_events.BaseEventLoop._call_soon.__code__,  # type: ignore[attr-defined]
        asyncio.base_events.BaseEventLoop.call_soon_threadsafe.__code__,
        asyncio.base_events.BaseEventLoop.create_task.__code__,
        asyncio.events.Handle.__init__.__code__,
    )
)
_CALLBACKS = frozenset((weakref.__file__, weakref.WeakSet.__init__.__code__.co_filename))
_LIBRARY = tuple(
    {os.path.abspath(sysconfig.get_paths()[key]) + os.sep for key in ("stdlib", "platstdlib")}
)


def _in_engine(frame: FrameType | None) -> bool:
    """Whether the main thread, stopped at ``frame``, is inside the engine: it holds an
    engine lock, or the innermost frame outside Python's own library is the engine's."""
    main = threading.main_thread().ident
    if any(lock.owner == main for lock in list(_locks)):
        return True
    if frame is not None and frame.f_code in _LOOP_STEPS:
        return True  # between taking a callback of the event loop and running it
    while frame is not None:
        code = frame.f_code
        filename = code.co_filename
        if filename in _CALLBACKS or code.co_name == "__del__":
            return True  # a finalizer: the interpreter would print the interrupt and drop it
        if filename.startswith(_PACKAGE):
            return filename not in _FRONT_ENDS
        if not filename.startswith(_LIBRARY) and not filename.startswith("<frozen"):
            module = frame.f_globals.get("__name__")
            if type(module) is str and module.startswith(_MODULE_PREFIX):
                return module not in _FRONT_END_NAMES  # exec'd for the package (above)
            return False  # the user's code: interrupt it
        if code in _SCHEDULING:
            return True
        frame = frame.f_back
    return False


class _Guard:
    """The SIGINT handler wrapper of :func:`guard_interrupts` (see the module docstring)."""

    __slots__ = ("handler",)

    def __init__(self, handler: Callable[[int, FrameType | None], Any]) -> None:
        self.handler = handler

    def __call__(self, signum: int, frame: FrameType | None) -> Any:
        if _guarding and _in_engine(frame):
            # Signalled again in a moment, by a timer: not from here, where the interpreter's
            # next check (still in this handler) would call it again at once. A real signal,
            # which also wakes a loop that has gone to sleep in select() since.
            signal_main_later(signum, _RETRY)
            return None
        return self.handler(signum, frame)

    def __repr__(self) -> str:
        return f"<aioengine SIGINT guard of {self.handler!r}>"


def guard_interrupts(owner: object) -> bool:
    """Make a Ctrl-C wait until the main thread is out of the engine's code (the module
    docstring says how) while ``owner`` (an engine's scheduler) is open; return whether it
    does, which is only from the main thread.

    Wraps the current SIGINT handler once, if it is a Python callable (the default one
    raises ``KeyboardInterrupt``); an ignored or default-action SIGINT stays as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    try:
        current = signal.getsignal(signal.SIGINT)
    except ValueError:  # pragma: no cover - not the main interpreter
        return False
    _guarding.add(owner)
    if callable(current) and type(current) is not _Guard:
        signal.signal(signal.SIGINT, _Guard(current))
    return True


def unguard_interrupts(owner: object | None = None) -> None:
    """Forget ``owner`` (an engine that has closed); once no open engine is guarded, put
    back the SIGINT handler that the wrapper wrapped.

    Only the main thread can change the handler: elsewhere the wrapper stays installed, and
    lets every interrupt through, until a call from the main thread (a front end's close)
    takes it away.
    """
    if owner is not None:
        _guarding.discard(owner)
    if _guarding or threading.current_thread() is not threading.main_thread():
        return
    try:
        current = signal.getsignal(signal.SIGINT)
    except ValueError:  # pragma: no cover - not the main interpreter
        return
    if type(current) is _Guard:
        signal.signal(signal.SIGINT, current.handler)
