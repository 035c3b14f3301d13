"""Remote operations: the collaborator that runs operations on a Dask cluster.

The scheduler (``scheduler.py``) reaches this package through its ``_remote`` field, which stays
None until the first push to a :func:`~aioengine.remote` context, so a local-only engine pays
one ``is None`` test. Dask distributed does the work (keys, futures as arguments, cancel,
TLS); this package only maps the engine's rule onto it. ``docs/howto/cluster.md`` is the
user's side of the same design.

Two kinds of remote operation:

- *Side-effect operations* (``push_sync`` / ``push_async`` / ``push`` on a remote context):
  ``fn(rctx)`` runs on a worker and may touch anything, so the operation holds its Vars until
  the Dask task has finished, exactly like a local one. A task on the engine's loop
  (``op.task``) awaits the Dask future; cancelling it cancels the Dask task.
- *Value operations* (``Engine.submit(..., ctx=remote())``, a
  :class:`~aioengine.functions.ValueCall`): every write makes a new *version* of its ``out``
  Vars, a :class:`RemoteVersion` that the Var carries as its value and whose Dask future
  (a new key) stays on the cluster. A Var argument reaches the worker as the Dask future of
  the version it must see (a local value is scattered once per version). Dask then orders
  such operations by data, and the engine's rule holds without waiting: read-after-write,
  the reader has the writer's future as an argument; write-after-read and write-after-write,
  the writer makes a new key and the version a reader was given never changes. So a value
  operation releases its Vars once *submitted* (as a GPU operation once enqueued), and a
  dependent chain reaches the scheduler at once: one whose arguments are all futures already
  is *collected* as it starts (:meth:`RemoteBackend.start`) and released there, and the
  collected tasks are sent as one graph at the next loop iteration (:meth:`RemoteBackend._flush`,
  one ``update-graph`` message instead of one per task). It completes (``await op``) when its task
  has: its Dask future's state tells the operation's record, and no asyncio task runs per
  operation (:mod:`~aioengine.remote.backend` documents the record). Two conditions,
  documented for users: the function must not modify its inputs in place, and Dask may run it
  more than once. One that declares ``writes=`` (side effects),
  and every value operation in serial mode, holds its Vars until it has finished instead.

Any other operation that uses a Var whose version is still being computed (a local one, a
side-effect one, ``wait_for_var``, ``delete_var``) is held before it starts
(:meth:`RemoteBackend.hold_locked`, called by the scheduler's dispatch, like the GPU's fences)
until the version has *settled*; a local reader also until the value is gathered to this
process, once per version (the Var then carries the local value, and the scatter cache
remembers its future, so a later remote reader sends nothing).

Failures keep the local semantics. A version settles failed when its operation failed, or
when the operation was *skipped*: one of the versions it depends on (those of the Vars it reads
and the previous versions of those it writes) settled failed; Dask then fails it with the
upstream exception, and the engine reports ``DependencyError`` as for a local skip, sharing the
upstream failure record. A settled failure is recorded on the Var (``Var._failure``) if that
version is still its latest, and the Var's value goes back to the last version that did not
fail (a failed operation leaves its Vars' values as they were): so what starts later is
skipped, as locally, until the failure is thrown.

The package, one module per concept:

- :mod:`~aioengine.remote.backend`: :class:`RemoteBackend`, the collaborator (routing, holding,
  starting, sending, settling, gathering), and :class:`RemoteExecutor`;
- :mod:`~aioengine.remote.version`: :class:`RemoteVersion` and its transitions (settle,
  gathered, lost, withdraw);
- :mod:`~aioengine.remote.placement`: :class:`~aioengine.remote.placement.Placement`, the
  worker each value operation is sent to (its data's, without Dask's ties);
- :mod:`~aioengine.remote.connection`: the Dask client, made on first use;
- :mod:`~aioengine.remote.worker`: the functions that run on the workers;
- :mod:`~aioengine.remote.dask_api`: every private name of Dask it uses, the one file to read
  on a Dask upgrade.
"""

from __future__ import annotations

from .backend import RemoteBackend, RemoteExecutor, open_remote
from .version import RemoteVersion

__all__ = ("RemoteBackend", "RemoteExecutor", "RemoteVersion", "open_remote")
