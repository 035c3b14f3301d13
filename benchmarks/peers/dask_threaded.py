"""dask threaded-scheduler peer (``dask.threaded.get``).

The program becomes a dask graph whose edges encode the engine's ordering rule: an op depends on
the last writer of every var it touches and, for every var it writes, on all readers since that
writer.  Building the graph is timed together with ``get`` (it is the dask user's equivalent of
pushing: the dependency tracking that an engine does internally).

Configurations: ``dask-N`` (``num_workers=os.cpu_count()``) or ``dask-<k>``.
Coroutine workloads do not apply.
"""

from __future__ import annotations

import os
import time
from typing import Any

from workloads import (
    WARMUP,
    Checker,
    Program,
    SyncBody,
    WorkloadSpec,
    generate,
    result_record,
    run_cli,
    start_clock,
)


def build_graph(prog: Program, n_vars: int, body: SyncBody) -> tuple[dict[str, Any], list[str]]:
    """Return ``(dsk, keys)`` for *prog*; task ``op-i`` is ``(body, i, *dependency_keys)``."""
    last_writer: list[str | None] = [None] * n_vars
    readers: list[list[str]] = [[] for _ in range(n_vars)]
    dsk: dict[str, Any] = {}
    keys: list[str] = []
    for i, (reads, writes) in enumerate(prog):
        key = f"op-{i}"
        deps: list[str] = []
        for v in reads:
            lw = last_writer[v]
            if lw is not None:
                deps.append(lw)
        for v in writes:
            lw = last_writer[v]
            if lw is not None:
                deps.append(lw)
            deps.extend(readers[v])
        for v in reads:
            readers[v].append(key)
        for v in writes:
            last_writer[v] = key
            readers[v] = []
        dsk[key] = (body, i, *dict.fromkeys(deps))
        keys.append(key)
    return dsk, keys


def _workers(config: str) -> int:
    _, _, k = config.partition("-")
    return (os.cpu_count() or 1) if k in ("", "N") else int(k)


def _run(spec: WorkloadSpec, workers: int) -> tuple[float, Checker, Program]:
    from dask.threaded import get

    prog, n_vars = generate(spec)
    check = Checker(spec, prog, n_vars)
    t0 = start_clock()
    dsk, keys = build_graph(prog, n_vars, check.body)
    get(dsk, keys, num_workers=workers)
    dt = time.perf_counter() - t0
    return dt, check, prog


def run_workload(spec: WorkloadSpec, config: str) -> dict[str, Any]:
    """Run one workload with ``dask.threaded.get``; return the result record."""
    if spec.is_coro:
        raise ValueError("coroutine workloads do not apply to dask")
    import dask

    workers = _workers(config)
    _run(WARMUP, workers)
    dt, check, prog = _run(spec, workers)
    return result_record(
        spec,
        config,
        dt,
        check,
        prog,
        extra={"workers": workers, "dask": str(getattr(dask, "__version__", "?"))},
    )


if __name__ == "__main__":
    run_cli(run_workload, "dask threaded scheduler peer")
