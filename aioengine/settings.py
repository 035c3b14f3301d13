"""Engine settings: keyword argument, else environment variable, else default.

Every setting is resolved once, in ``Engine()``, so a bad value fails there with a
:class:`ValueError` that names the argument or the environment variable, never later inside a
worker.
"""

from __future__ import annotations

import numbers
import os
from dataclasses import dataclass

__all__ = ("Settings",)

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def _default_workers() -> int:
    return os.cpu_count() or 1


def _positive_int(value: object, arg: str, env: str, default: int) -> int:
    if value is None:
        raw = os.environ.get(env, "").strip()
        if not raw:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(
                f"environment variable {env}={raw!r} is not an integer; "
                f"set it to a whole number >= 1 or unset it"
            ) from None
        if value < 1:
            raise ValueError(f"environment variable {env}={raw!r} must be >= 1")
        return value
    if type(value) is not int:
        # Any integer (NumPy's included), but not a bool.
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise ValueError(
                f"{arg} must be an int >= 1 or None, got {value!r} ({type(value).__name__})"
            )
        value = int(value)
    if value < 1:
        raise ValueError(f"{arg} must be >= 1, got {value}")
    return value


def _optional_int(value: object, arg: str, env: str) -> int | None:
    if value is None and not os.environ.get(env, "").strip():
        return None
    return _positive_int(value, arg, env, 0)


def _optional_seconds(value: object, arg: str, env: str) -> float | None:
    if value is None:
        raw = os.environ.get(env, "").strip()
        if not raw:
            return None
        try:
            seconds = float(raw)
        except ValueError:
            raise ValueError(
                f"environment variable {env}={raw!r} is not a number of seconds; "
                "set it to a number > 0 or unset it"
            ) from None
        if not seconds > 0 or seconds == float("inf"):
            raise ValueError(f"environment variable {env}={raw!r} must be a finite number > 0")
        return seconds
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(
            f"{arg} must be a number of seconds > 0 or None, got {value!r} ({type(value).__name__})"
        )
    try:
        seconds = float(value)
    except OverflowError:  # an int too large for a float
        seconds = float("inf")
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"{arg} must be a finite number of seconds > 0, got {value!r}")
    return seconds


def _flag(value: object, arg: str, env: str) -> bool:
    if value is None:
        raw = os.environ.get(env, "").strip().lower()
        if not raw:
            return False
        if raw in _TRUE:
            return True
        if raw in _FALSE:
            return False
        raise ValueError(
            f"environment variable {env}={raw!r} is not a boolean; use 1 or 0 (or unset it)"
        )
    if type(value) is not bool:
        raise ValueError(f"{arg} must be True, False or None, got {value!r}")
    return value


_GPU_SYNC_MODES = ("event", "host")


def _gpu_sync(value: object) -> str:
    if value is None:
        raw = os.environ.get("AIOENGINE_GPU_SYNC", "").strip().lower()
        if not raw:
            return "event"
        if raw not in _GPU_SYNC_MODES:
            raise ValueError(
                f"environment variable AIOENGINE_GPU_SYNC={raw!r} must be 'event' or 'host' "
                "(or unset)"
            )
        return raw
    if value not in _GPU_SYNC_MODES:
        raise ValueError(f"gpu_sync must be 'event', 'host' or None, got {value!r}")
    return str(value)


@dataclass(frozen=True, slots=True)
class Settings:
    """The resolved configuration of one :class:`~aioengine.Engine`."""

    cpu_workers: int
    cpu_priority_workers: int
    serial: bool
    max_pending: int | None
    watchdog: float | None = None  # seconds without a finished operation before a dump is logged
    gpu_workers: int = 1  # threads (each with its stream) per GPU for compute/priority work
    gpu_copy_workers: int = 1  # threads (each with its stream) per GPU and copy direction
    gpu_sync: str = "event"  # "event": release Var turns at enqueue; "host": at completion
    gpu_max_inflight: int | None = None  # enqueued, uncompleted GPU operations per device

    @classmethod
    def resolve(
        cls,
        *,
        cpu_workers: object = None,
        cpu_priority_workers: object = None,
        serial: object = None,
        max_pending: object = None,
        watchdog: object = None,
        gpu_workers: object = None,
        gpu_copy_workers: object = None,
        gpu_sync: object = None,
        gpu_max_inflight: object = None,
    ) -> Settings:
        """Resolve each setting from its argument, its environment variable, or its default."""
        workers = _default_workers()
        return cls(
            cpu_workers=_positive_int(cpu_workers, "cpu_workers", "AIOENGINE_CPU_WORKERS", workers),
            cpu_priority_workers=_positive_int(
                cpu_priority_workers,
                "cpu_priority_workers",
                "AIOENGINE_CPU_PRIORITY_WORKERS",
                min(4, workers),
            ),
            serial=_flag(serial, "serial", "AIOENGINE_SERIAL"),
            max_pending=_optional_int(max_pending, "max_pending", "AIOENGINE_MAX_PENDING"),
            watchdog=_optional_seconds(watchdog, "watchdog", "AIOENGINE_WATCHDOG"),
            gpu_workers=_positive_int(gpu_workers, "gpu_workers", "AIOENGINE_GPU_WORKERS", 1),
            gpu_copy_workers=_positive_int(
                gpu_copy_workers, "gpu_copy_workers", "AIOENGINE_GPU_COPY_WORKERS", 1
            ),
            gpu_sync=_gpu_sync(gpu_sync),
            gpu_max_inflight=_optional_int(
                gpu_max_inflight, "gpu_max_inflight", "AIOENGINE_GPU_MAX_INFLIGHT"
            ),
        )


def cluster_setting(cluster: object) -> object:
    """The cluster an :class:`~aioengine.Engine` uses: ``cluster`` itself, or, when it is
    None, the scheduler address in ``AIOENGINE_CLUSTER`` (None if that is unset or empty).

    Objects (a ``distributed.Client`` or cluster) are checked when first used, by the remote
    backend (``remote/``); here only strings are.

    Raises:
        ValueError: if ``cluster`` is an empty string.
    """
    if cluster is None:
        raw = os.environ.get("AIOENGINE_CLUSTER", "").strip()
        return raw or None
    if isinstance(cluster, str) and not cluster.strip():
        raise ValueError("cluster must be a scheduler address, 'local' or a Dask object, got ''")
    return cluster
