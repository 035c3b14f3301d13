"""Per-operation DEBUG logging on the ``aioengine`` logger.

:class:`OpLogger` logs every push, start and finish (``done``, ``failed``, ``skipped``,
``cancelled``). The engine installs it when it is created while the ``aioengine`` logger is
enabled for DEBUG, so an engine created without DEBUG logging pays nothing; to log an engine
that already exists, ``engine.add_instrument(aioengine.observe.log.OpLogger())``.

``on_push`` and ``on_finish`` run under the engine lock (see ``instrument.py``): a logging
handler must not call back into the engine.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..errors import summary
from ..instrument import Instrument
from .history import pool_name

if TYPE_CHECKING:
    from ..operation import Operation

__all__ = ("OpLogger",)

logger = logging.getLogger("aioengine")


def _vars(op: Operation[Any]) -> str:
    reads = ",".join(v.name for v in op.const_vars)
    writes = ",".join(v.name for v in op.mutate_vars)
    return f"reads=[{reads}] writes=[{writes}]"


class OpLogger(Instrument):
    """Logs push, start and finish of every operation at DEBUG (checked per call)."""

    def on_push(self, op: Operation[Any]) -> None:
        """Log the push."""
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("push #%d %r %s on %s", op.seq, op.name, _vars(op), pool_name(op.target))

    def on_start(self, op: Operation[Any]) -> None:
        """Log the start."""
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("start #%d %r", op.seq, op.name)

    def on_finish(self, op: Operation[Any]) -> None:
        """Log the outcome (``skipped`` for an operation not run because of a failure)."""
        if logger.isEnabledFor(logging.DEBUG):
            exc = op._exception
            detail = f": {summary(exc)}" if exc is not None else ""
            logger.debug("%s #%d %r%s", op._state.name.lower(), op.seq, op.name, detail)
