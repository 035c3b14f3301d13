"""Buffer: one piece of array memory, the engine Var that orders every access to it, and its
outcome.

MXNet's ``NDArray::Chunk``: every operation that makes a new array makes a new Buffer (and Var);
views (basic indexing, reshape of contiguous data, transposes) share their base's Buffer, so a
write through any view is ordered against every read through any other view, conservatively,
without overlap analysis.

State of a Buffer, each field guarded by the turn its Var gives (written only by an operation
that holds a write on ``var``, read only by one that holds at least a read), except where said:

* ``value``: the data (a NumPy array, or the GPU backend's array): :data:`MISSING` until the
  first write has run; always C-contiguous (reshape views rely on it).
* ``failure``: the exception that makes this Buffer unusable for good (sticky): the one its
  producing operation raised, or a :class:`~aioengine.DependencyError` whose ``__cause__`` is
  the root failure of an input. Also written by ``await`` on the loop thread once the engine
  has reported a skip (the write it stands for has finished by then).
* ``writer``: the :class:`~aioengine.Operation` of the latest array write pushed (set on the
  pushing thread at push; read to tell a skipped write from one that ran, and for reprs).
* ``exported``: ``await`` or a sync point handed ``value`` out as a read-only view; the next
  write copies it first (inside that write, which holds the turn), so what the user holds never
  changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .. import Engine, Operation, Var

__all__ = ("MISSING", "Buffer")


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


#: The value of a Buffer whose first write has not run (or never will: it failed or was skipped).
MISSING: Any = _Missing()


class Buffer:
    """The memory and the Var behind one or more :class:`~aioengine.array.Array` views."""

    __slots__ = ("__weakref__", "engine", "exported", "failure", "value", "var", "writer")

    def __init__(self, engine: Engine, var: Var, value: Any = MISSING) -> None:
        self.engine = engine
        self.var = var
        self.value = value
        self.failure: BaseException | None = None
        self.writer: Operation[Any] | None = None
        self.exported = False

    def __del__(self) -> None:
        # The last Array (view) and the last pushed operation holding this Buffer are gone: its
        # Var is deleted after whatever raw pushes on it are still pending (MXNet's
        # DeleteVariable from ~Chunk). The engine accepts delete_var from a finalizer, on any
        # thread; a closed engine has nothing left to delete.
        try:
            self.engine.delete_var(self.var)
        except Exception:  # a closed engine, a deleted Var, interpreter exit
            pass

    def __repr__(self) -> str:
        return f"<Buffer {self.var.name}>"
