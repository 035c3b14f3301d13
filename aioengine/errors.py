"""aioengine exceptions.

Everything the engine itself raises derives from :class:`EngineError`::

    EngineError                 base of everything the engine itself raises
      x EngineClosedError       a push or wait on an engine that is closing or closed
      x DependencyError         an operation was skipped: an input Var carries a failure
                                (``__cause__`` is that failure)
      x VarDeletedError         a push or wait names a Var after ``delete_var``
      x OperatorDeletedError    a push of an OprHandle after ``delete_operator``
      x DeviceUnavailableError  a push to a context whose device cannot be used here
          x DeviceFailedError   the GPU failed with a CUDA error (sticky: restart the process)

    Abort                       raised by *your* function to refuse work without poisoning
                                its Vars (a rolled-back transaction); not an EngineError

Exceptions raised by the functions you push are never wrapped: ``await op`` raises them
unchanged, and ``wait_for_var`` / ``wait_for_all`` raise them (the latter in an
:class:`ExceptionGroup`), except an :class:`Abort`, which only its operation's awaiter sees.
Cancellation stays :class:`asyncio.CancelledError`; bad arguments raise the builtin
:class:`TypeError` / :class:`ValueError`.
"""

from __future__ import annotations

import asyncio
import logging
import threading

__all__ = (
    "Abort",
    "DependencyError",
    "DeviceFailedError",
    "DeviceUnavailableError",
    "EngineClosedError",
    "EngineError",
    "OperatorDeletedError",
    "VarDeletedError",
    "report",
)


class Abort(Exception):
    """Raise it from an operation's function to refuse the work without poisoning its Vars.

    The operation fails for its awaiter only: ``await op`` (and ``op.exception()``) gives
    this very exception, unchanged, and the operation ends ``OpState.FAILED``. Its Vars are
    left as they were, like a rolled-back transaction: no failure is recorded on its
    ``mutate_vars`` (nor one it inherited passed on), so the operations after it run
    normally, :meth:`~aioengine.Engine.wait_for_var`, :meth:`~aioengine.Engine.wait_for_all`
    and :meth:`~aioengine.Engine.aclose` never raise it, and :attr:`Var.version
    <aioengine.Var.version>` does not count it as a write. With
    :meth:`~aioengine.Engine.submit` and ``out=`` the function's return value never becomes
    the Vars' values, so :meth:`Var.get <aioengine.Var.get>` returns the old ones.

    The engine restores nothing: raise it *before* changing a value in place (an array a
    ``writes=`` Var carries, say). A subclass aborts the same way and reaches the awaiter as
    itself (``class InsufficientFunds(ae.Abort)``, caught by its own ``except``); an exception
    that merely wraps one (an ``ExceptionGroup``, a ``__cause__``) is an ordinary failure.
    ``raise ae.Abort("insufficient funds")`` shows as ``Abort: insufficient funds``, its
    ``args`` as any exception's.
    """


class EngineError(Exception):
    """Base class of every exception raised by the engine itself."""


class EngineClosedError(EngineError):
    """A push or wait was made on an engine that is closing or closed."""


class DependencyError(EngineError):
    """An operation was skipped because a Var it reads or mutates carries a failure.

    Its ``__cause__`` is the original exception raised by the failed operation.
    """


class VarDeletedError(EngineError):
    """A push or wait named a Var after :meth:`Engine.delete_var` was called on it."""


class OperatorDeletedError(EngineError):
    """An :class:`OprHandle` was pushed after :meth:`Engine.delete_operator`."""


class DeviceUnavailableError(EngineError):
    """A push targeted a context whose device (or its driver library) is not available."""


class DeviceFailedError(DeviceUnavailableError):
    """A GPU failed with a CUDA error: its pending operations fail with this, later pushes raise it.

    CUDA errors such as an illegal memory access are sticky: the process must be restarted to
    use the device again. ``__cause__`` is the original error when one was raised.
    """


def summary(exc: BaseException) -> str:
    """``"Type: message"`` for an exception, for the engine's own messages and records.

    Never raises: a function's exception may have a ``__str__`` that does, and the engine
    formats failures with its lock held, where an error would strand the operations.
    """
    try:
        text = str(exc)
    except Exception as err:  # whatever __str__ raises
        text = f"<str() raised {type(err).__name__}>"
    return f"{type(exc).__name__}: {text}"


def trim_traceback(exc: BaseException) -> None:
    """Drop the engine's own frame, the outermost, from the traceback of ``exc``.

    The engine calls it where it catches a function's exception: the failure it records must
    not keep that frame, and through its locals the operation, its Vars and its function,
    alive until someone throws it (the one traceback trimmer of the package).
    """
    tb = exc.__traceback__
    exc.__traceback__ = tb.tb_next if tb is not None else None


def report(
    loop: asyncio.AbstractEventLoop | None, loop_thread: int, message: str, exc: BaseException
) -> None:
    """Report ``exc``, which no caller can receive any more (its caller returned long ago), to
    ``loop``'s exception handler (through ``call_soon_threadsafe`` from a thread other than
    ``loop_thread``), or log it when there is no open loop."""
    if loop is not None and not loop.is_closed():
        context = {"message": message, "exception": exc}
        if threading.get_ident() == loop_thread:
            loop.call_exception_handler(context)
        else:
            loop.call_soon_threadsafe(loop.call_exception_handler, context)
    else:
        logging.getLogger("aioengine").error(message, exc_info=exc)
