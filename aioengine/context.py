"""Contexts: which device (and so which executor) runs an operation.

A :class:`Context` names a device, as MXNet's ``Context`` does. The engine keeps one executor
per distinct context (and, on the CPU, a separate pool for ``FnProperty.CPU_PRIORITIZED``); a
function learns where it runs from the :class:`RunContext` it is called with.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = ("Context", "DeviceType", "RunContext", "cpu", "gpu")

T = TypeVar("T")


class DeviceType(enum.Enum):
    """Kind of device a :class:`Context` names."""

    CPU = "cpu"
    GPU = "gpu"


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
        object.__setattr__(self, "_hash", hash((self.device_type.value, self.device_id)))

    def __repr__(self) -> str:
        return f"{self.device_type.value}({self.device_id})"

    def __reduce__(self) -> tuple[type[Context], tuple[DeviceType, int]]:
        # Rebuilt, not copied: the hash of the device type's name differs between processes.
        return (Context, (self.device_type, self.device_id))


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
