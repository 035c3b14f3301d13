"""``xp.__array_namespace_info__()``: the namespace's capabilities, devices and dtypes."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import Context, gpu
from ._array import engine_of
from ._push import CPU0, Pusher

__all__ = ("DTYPE_NAMES", "Info")

#: The standard's dtypes, by name (the namespace's attributes of the same names).
DTYPE_NAMES = (
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float32",
    "float64",
    "complex64",
    "complex128",
)


class Info:
    """What ``xp.__array_namespace_info__()`` returns: the namespace's capabilities, devices
    and dtypes."""

    def __init__(self, ns: Pusher) -> None:
        self._ns = ns

    def capabilities(self) -> dict[str, Any]:
        """Boolean indexing and data-dependent shapes are supported (a dimension is None
        until the value is known); up to 64 dimensions (NumPy's limit)."""
        return {"boolean indexing": True, "data-dependent shapes": True, "max dimensions": 64}

    def default_device(self) -> Context:
        """``cpu(0)``."""
        return CPU0

    def devices(self) -> list[Context]:
        """``cpu(0)``, and ``gpu(0)`` where the engine's GPU backend has a device."""
        devices = [CPU0]
        backend = engine_of(self._ns).gpu_backend
        try:
            if backend is not None:
                backend.check(0)
                devices.append(gpu(0))
            else:
                from .. import gpu_available

                if gpu_available():
                    devices.append(gpu(0))
        except Exception:  # no device: only the CPU is listed
            pass
        return devices

    def default_dtypes(self, *, device: Context | None = None) -> dict[str, np.dtype[Any]]:
        """float64, complex128, int64 and int64 (indexing)."""
        return {
            "real floating": np.dtype(np.float64),
            "complex floating": np.dtype(np.complex128),
            "integral": np.dtype(np.int64),
            "indexing": np.dtype(np.int64),
        }

    def dtypes(
        self, *, device: Context | None = None, kind: str | tuple[str, ...] | None = None
    ) -> dict[str, np.dtype[Any]]:
        """The supported dtypes by name, optionally only those of ``kind`` (as ``isdtype``)."""
        out = {}
        for name in DTYPE_NAMES:
            dtype = np.dtype(name)
            if kind is None or np.isdtype(dtype, kind):
                out[name] = dtype
        return out
