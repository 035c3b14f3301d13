"""Zarr I/O of remote arrays: ``xp.from_zarr(store, device=ae.remote())`` and
``x.to_zarr(store)``, each chunk read or written by a remote operation on a worker.

Zarr (the ``zarr`` extra) is the chunked format Dask and Pangeo users keep their data in. The
client opens or creates only the array's metadata; the data never passes through it. A
remote array's chunk is a run of whole Zarr chunks along the leading axis (its ``rows`` a
multiple of the Zarr chunk's, for reading), and ``to_zarr`` creates the Zarr array with one
Zarr chunk per chunk of the Store, so that no two tasks write into one Zarr chunk (a Zarr
chunk is rewritten whole: two writers of one would race). ``store`` is what
``zarr.open_array`` takes (a path, a URL, a store object) and must name the same data on
every worker: a path on a shared file system or an object store, not a memory store (the
in-process clusters of tests excepted, whose workers share this process).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..context import cpu, remote
from ._remote_store import Store, chunk_rows

if TYPE_CHECKING:
    from .. import Engine, Operation

__all__ = ("read_all", "read_store", "write_store", "zarr_meta")

_REMOTE = remote()
_CPU = cpu()


def _zarr() -> Any:
    try:
        import zarr
    except ImportError:
        raise ImportError("from_zarr/to_zarr need zarr: pip install 'aioengine[zarr]'") from None
    return zarr


def zarr_meta(store: Any) -> tuple[tuple[int, ...], np.dtype[Any], int]:
    """The shape, dtype and rows of a Zarr chunk of the array at ``store`` (its metadata
    only, read on the client)."""
    arr = _zarr().open_array(store, mode="r")
    shape = tuple(int(d) for d in arr.shape)
    rows = int(arr.chunks[0]) if shape else 1
    return shape, np.dtype(arr.dtype), rows


def read_rows(store: Any, lo: int, hi: int) -> Any:
    """Rows ``lo:hi`` of the Zarr array at ``store`` (on a worker), as a new array."""
    arr = _zarr().open_array(store, mode="r")
    return np.ascontiguousarray(arr[lo:hi] if arr.ndim else arr[...])


def read_all(store: Any) -> Any:
    """The whole Zarr array at ``store`` (on this machine's CPU pool)."""
    return np.ascontiguousarray(_zarr().open_array(store, mode="r")[...])


def write_rows(store: Any, lo: int, value: Any) -> int:
    """Write ``value`` (a chunk) as rows ``lo:`` of the Zarr array at ``store`` (on a
    worker); returns the number of elements written."""
    arr = _zarr().open_array(store, mode="r+")
    if arr.ndim:
        arr[lo : lo + value.shape[0]] = value
    else:
        arr[...] = value
    return int(np.size(value))


def _written(*counts: int) -> int:
    return sum(counts)


def read_store(engine: Engine, store: Any, chunk_bytes: int) -> Store:
    """A Store of the Zarr array at ``store``: one remote task per chunk reads its rows."""
    shape, dtype, zrows = zarr_meta(store)
    rows = chunk_rows(shape, chunk_bytes)
    rows = max(zrows, rows // zrows * zrows)  # whole Zarr chunks per task
    out = Store(engine, shape, dtype, rows, "from_zarr")
    chunks = []
    for i in range(out.count):
        lo = i * rows
        hi = min(lo + rows, shape[0]) if shape else 1
        var = engine.new_var(f"from_zarr[{i}]")
        engine.submit(read_rows, store, lo, hi, out=var, ctx=_REMOTE, name="from_zarr")
        chunks.append(var)
    out.chunks = tuple(chunks)
    return out


def write_store(src: Store, store: Any) -> Operation[int]:
    """Write the whole of ``src`` as a new Zarr array at ``store`` (replacing what is there):
    the metadata from the client, each chunk by a remote task reading it. Returns the local
    operation that ends when every chunk is written (its result: the elements written)."""
    engine = src.engine
    chunks = src.materialized()
    zchunks = (src.rows, *src.shape[1:]) if src.shape else ()
    _zarr().create_array(store, shape=src.shape, dtype=src.dtype, chunks=zchunks, overwrite=True)
    counts = []
    for i, var in enumerate(chunks):
        count = engine.new_var(f"to_zarr[{i}]")
        engine.submit(write_rows, store, i * src.rows, var, out=count, ctx=_REMOTE,
                      name="to_zarr")  # fmt: skip
        counts.append(count)
    return engine.submit(_written, *counts, ctx=_CPU, name="to_zarr")
