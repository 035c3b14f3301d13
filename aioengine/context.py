"""Contexts: which device (and so which executor) runs an operation.

A :class:`Context` names a device, as MXNet's ``Context`` does. The engine keeps one executor
per distinct context (and, on the CPU, a separate pool for ``FnProperty.CPU_PRIORITIZED``); a
function learns where it runs from the :class:`RunContext` it is called with.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = ("Context", "DeviceType", "RemoteOptions", "RunContext", "cpu", "gpu", "remote")

T = TypeVar("T")


class DeviceType(enum.Enum):
    """Kind of device a :class:`Context` names."""

    CPU = "cpu"
    GPU = "gpu"
    REMOTE = "remote"  #: a worker of the engine's Dask cluster (``Engine(cluster=...)``)


@dataclass(frozen=True, slots=True)
class RemoteOptions:
    """Where and how a :func:`remote` context's operations run on the cluster.

    Attributes:
        resources: Dask worker resources each task needs, as sorted ``(name, amount)`` pairs.
        workers: the worker addresses (or names) allowed to run it, or None (any worker).
        retries: how many times Dask retries a task that failed.
        allow_other_workers: ``workers`` is a preference: another worker runs the task when
            none of them can (gone, or never there), instead of the task waiting for one.
    """

    resources: tuple[tuple[str, float], ...] = ()
    workers: tuple[str, ...] | None = None
    retries: int = 0
    allow_other_workers: bool = False


@dataclass(frozen=True, slots=True)
class Context:
    """A device: ``Context(DeviceType.CPU, 0)`` is what :func:`cpu` returns.

    Contexts are hashable values; two equal contexts share one executor.

    Raises:
        TypeError: if ``device_type`` is not a :class:`DeviceType` or ``device_id`` not an int.
        ValueError: if ``device_id`` is negative.
    """

    device_type: DeviceType
    device_id: int = 0
    #: For ``DeviceType.REMOTE`` only: the Dask task options (:func:`remote`), else None.
    options: RemoteOptions | None = None
    _hash: int = field(init=False, repr=False, compare=False, hash=False)

    def __hash__(self) -> int:
        return self._hash  # precomputed: contexts are looked up on every push

    def __post_init__(self) -> None:
        if not isinstance(self.device_type, DeviceType):
            raise TypeError(
                f"device_type is {self.device_type!r}, not an aioengine.DeviceType; "
                "use aioengine.cpu(i) or aioengine.gpu(i)"
            )
        if type(self.device_id) is not int:
            raise TypeError(f"device_id is {self.device_id!r}, not an int")
        if self.device_id < 0:
            raise ValueError(f"device_id must be >= 0, got {self.device_id}")
        if (self.options is not None) != (self.device_type is DeviceType.REMOTE):
            raise ValueError("options go with DeviceType.REMOTE only; use aioengine.remote()")
        object.__setattr__(
            self, "_hash", hash((self.device_type.value, self.device_id, self.options))
        )

    def __repr__(self) -> str:
        options = self.options
        if options is None:
            return f"{self.device_type.value}({self.device_id})"
        parts = []
        if options.resources:
            parts.append(f"resources={dict(options.resources)!r}")
        if options.workers is not None:
            parts.append(f"workers={list(options.workers)!r}")
        if options.retries:
            parts.append(f"retries={options.retries}")
        if options.allow_other_workers:
            parts.append("allow_other_workers=True")
        return f"remote({', '.join(parts)})"

    def __reduce__(
        self,
    ) -> tuple[type[Context], tuple[DeviceType, int, RemoteOptions | None]]:
        # Rebuilt, not copied: the hash of the device type's name differs between processes.
        return (Context, (self.device_type, self.device_id, self.options))


@functools.lru_cache(maxsize=256)
def cpu(device_id: int = 0) -> Context:
    """Return the CPU context ``device_id``; each id has its own thread pool.

    Equal calls return the same (immutable) object.
    """
    return Context(DeviceType.CPU, device_id)


@functools.lru_cache(maxsize=256)
def gpu(device_id: int = 0) -> Context:
    """Return the GPU context ``device_id`` (needs a GPU backend at push time).

    The engine's ``gpu_backend`` (CuPy by default) must have this device; see
    ``docs/howto/gpu.md``.

    Equal calls return the same (immutable) object.
    """
    return Context(DeviceType.GPU, device_id)


def remote(
    *,
    resources: dict[str, float] | None = None,
    workers: str | Iterable[str] | None = None,
    retries: int = 0,
    allow_other_workers: bool = False,
) -> Context:
    """Return a context whose operations run on a worker of the engine's Dask cluster.

    The engine needs a cluster (``Engine(cluster=...)`` or ``AIOENGINE_CLUSTER``); see
    ``docs/howto/cluster.md``. ``resources``, ``workers``, ``retries`` and
    ``allow_other_workers`` are passed to Dask's ``Client.submit`` for every operation pushed
    to this context: with ``allow_other_workers=True``, ``workers`` is a preference (a task
    whose workers are gone runs elsewhere instead of waiting for them). Equal arguments give
    equal (hashable) contexts; equal calls return the same (immutable) object, as
    :func:`cpu`'s do.

    Raises:
        TypeError: if an argument has the wrong type.
        ValueError: if ``retries`` is negative, or ``allow_other_workers`` is given without
            ``workers``.
    """
    if (
        resources is None
        and workers is None
        and retries == 0
        and type(retries) is int
        and allow_other_workers is False
    ):
        return _remote(_NO_OPTIONS)  # the common call, once per push in a loop: no checks
    if resources is None:
        pairs: tuple[tuple[str, float], ...] = ()
    elif isinstance(resources, dict):
        for key, amount in resources.items():
            if type(key) is not str or isinstance(amount, bool):
                raise TypeError(f"resources must map str to a number, got {resources!r}")
            if not isinstance(amount, (int, float)):
                raise TypeError(f"resources must map str to a number, got {resources!r}")
        pairs = tuple(sorted((k, float(v)) for k, v in resources.items()))
    else:
        raise TypeError(f"resources must be a dict or None, got {resources!r}")
    allowed: tuple[str, ...] | None
    if workers is None:
        allowed = None
    elif isinstance(workers, str):
        allowed = (workers,)
    elif isinstance(workers, Iterable):
        allowed = tuple(workers)
        if not all(type(w) is str for w in allowed):
            raise TypeError(f"workers must be a str or an iterable of str, got {workers!r}")
    else:
        raise TypeError(f"workers must be a str, an iterable of str or None, got {workers!r}")
    if type(retries) is not int:
        raise TypeError(f"retries must be an int, got {retries!r}")
    if retries < 0:
        raise ValueError(f"retries must be >= 0, got {retries}")
    if type(allow_other_workers) is not bool:
        raise TypeError(f"allow_other_workers must be a bool, got {allow_other_workers!r}")
    if allow_other_workers and allowed is None:
        raise ValueError("allow_other_workers=True needs workers= (the workers it prefers)")
    return _remote(RemoteOptions(pairs, allowed, retries, allow_other_workers))


_NO_OPTIONS = RemoteOptions((), None, 0)


@functools.lru_cache(maxsize=256)
def _remote(options: RemoteOptions) -> Context:
    return Context(DeviceType.REMOTE, 0, options)


@dataclass(frozen=True, slots=True)
class RunContext:
    """What a running function is told about where it runs.

    Attributes:
        ctx: the :class:`Context` the operation was pushed to.
        stream: ``None`` on the CPU; on a GPU, the stream the function's device work goes to
            (a ``cupy.cuda.Stream``, current while the function runs; a
            ``SimulatedStream`` on the simulated GPU).
    """

    ctx: Context
    stream: Any = None
    # Per GPU operation: what keep_alive() was given, and the backend that launch() uses.
    _keep: list[Any] | None = field(default=None, repr=False, compare=False)
    _backend: Any = field(default=None, repr=False, compare=False)

    @property
    def device_id(self) -> int:
        """The device number of :attr:`ctx`."""
        return self.ctx.device_id

    def launch(self, fn: Callable[..., T], *args: Any) -> T | None:
        """Run ``fn(*args)`` as device work on this operation's stream.

        With CuPy, ``fn`` is called at once with the stream current (CuPy calls enqueue
        themselves) and its result returned. On the simulated GPU it is enqueued as a kernel
        and run later by the device, in stream order (returns None). On the CPU it is simply
        called. Code written against ``launch`` runs on all three.
        """
        backend = self._backend
        if backend is None:
            return fn(*args)
        result: T | None = backend.launch(self.stream, fn, args)
        return result

    def keep_alive(self, *objs: object) -> None:
        """Keep ``objs`` alive until this operation's device work has completed.

        The engine already keeps the function (and so its closure), its result and the values
        of its Vars; pass anything else the enqueued work reads or writes (a temporary, a host
        buffer of an asynchronous copy), so the memory pool cannot reuse it too early. On the
        CPU the work is done when the function returns, so this does nothing.
        """
        keep = self._keep
        if keep is not None:
            keep.extend(objs)
