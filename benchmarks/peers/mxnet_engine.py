r"""Apache MXNet 1.9.1 engine peer, driven through its C API with ctypes.

Runs inside the MXNet virtual environment (``mxnet==1.9.1``, ``numpy<1.24``); it loads
``libmxnet.so`` from the installed ``mxnet`` package without importing the Python package, and it
never imports aioengine.  Vars are the engine vars of 1-element NDArrays; sync ops are pushed with
``MXEnginePushSyncND`` and a single reused ``CFUNCTYPE`` callback that receives the op index as
its ``param``; ``MXNDArrayWaitAll`` waits for everything.

Configurations (``--config``): ``perdevice-1`` and ``perdevice-N`` (ThreadedEnginePerDevice with
1 or ``os.cpu_count()`` CPU workers, or ``perdevice-<k>``), ``threaded`` (ThreadedEngine, the
pooled engine: 16 threads) and ``naive`` (NaiveEngine).  The engine type is read once at the
first engine use, so each configuration needs its own process.

Usage (from ``benchmarks/``)::

    ../.venv-mxnet/bin/python -m peers.mxnet_engine --probe
    ../.venv-mxnet/bin/python -m peers.mxnet_engine --config perdevice-N \\
        --workloads '[{"name": "noop/chain", "shape": "chain", "body": "noop", "n_ops": 2000}]'
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import sys
import threading
import time
from ctypes import CFUNCTYPE, POINTER, Structure, byref, c_char_p, c_int, c_size_t, c_uint, c_void_p
from pathlib import Path
from typing import Any

from workloads import (
    WARMUP,
    Checker,
    WorkloadSpec,
    generate,
    is_program,
    result_record,
    run_cli,
    start_clock,
    user_heap,
)

ENGINE_TYPES = {
    "perdevice": "ThreadedEnginePerDevice",
    "threaded": "ThreadedEngine",
    "naive": "NaiveEngine",
}

# void (*EngineSyncFunc)(RunContext*, void* param); param carries the op index.
SyncFunc = CFUNCTYPE(None, c_void_p, c_size_t)
# void (*EngineAsyncFunc)(RunContext*, CallbackOnComplete*, void* param)  (1.9.1 ABI)
AsyncFunc = CFUNCTYPE(None, c_void_p, c_void_p, c_size_t)
# CallbackOnComplete::callback_ : void (*)(Engine*, void* param, const dmlc::Error*)
CompleteFunc = CFUNCTYPE(None, c_void_p, c_void_p, c_void_p)
NDArrayArray = POINTER(c_void_p)


class Context(Structure):
    """``mxnet::Context`` (8 bytes): dev_type 1 = CPU."""

    _fields_ = [("dev_type", c_int), ("dev_id", c_int)]


class CallbackOnComplete(Structure):
    """``engine::CallbackOnComplete`` layout (24 bytes, private members)."""

    _fields_ = [("callback", c_void_p), ("engine", c_void_p), ("param", c_void_p)]


def configure_env(config: str) -> None:
    """Set ``MXNET_ENGINE_TYPE`` / ``MXNET_CPU_WORKER_NTHREADS`` for *config* (before loading)."""
    kind, _, workers = config.partition("-")
    if kind not in ENGINE_TYPES:
        raise ValueError(f"unknown MXNet config {config!r}")
    os.environ["MXNET_ENGINE_TYPE"] = ENGINE_TYPES[kind]
    if kind == "perdevice":
        n = (os.cpu_count() or 1) if workers in ("", "N") else int(workers)
        os.environ["MXNET_CPU_WORKER_NTHREADS"] = str(n)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MXNET_ENGINE_INFO", "false")


def find_lib() -> Path:
    """Locate ``libmxnet.so`` inside the installed ``mxnet`` package without importing it."""
    spec = importlib.util.find_spec("mxnet")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("mxnet is not installed in this interpreter")
    for loc in spec.submodule_search_locations:
        cand = Path(loc) / "libmxnet.so"
        if cand.exists():
            return cand
    raise RuntimeError("libmxnet.so not found in the mxnet package")


class MXNet:
    """Minimal ctypes binding of the MXNet 1.9.1 engine C API (vars = NDArray vars)."""

    def __init__(self) -> None:
        lib = ctypes.CDLL(str(find_lib()), ctypes.RTLD_LOCAL)
        self.lib = lib
        lib.MXGetLastError.restype = c_char_p
        lib.MXGetVersion.argtypes = [POINTER(c_int)]
        lib.MXNDArrayCreateEx.argtypes = [
            POINTER(c_uint), c_uint, c_int, c_int, c_int, c_int, POINTER(c_void_p)
        ]  # fmt: skip
        lib.MXNDArrayFree.argtypes = [c_void_p]
        lib.MXNDArrayWaitToRead.argtypes = [c_void_p]
        lib.MXNDArrayWaitAll.argtypes = []
        lib.MXEnginePushSyncND.argtypes = [
            SyncFunc, c_void_p, c_void_p, c_void_p,
            NDArrayArray, c_int, NDArrayArray, c_int,
            c_void_p, c_int, c_char_p,
        ]  # fmt: skip
        lib.MXEnginePushAsyncND.argtypes = [
            AsyncFunc, c_void_p, c_void_p, c_void_p,
            NDArrayArray, c_int, NDArrayArray, c_int,
            c_void_p, c_int, c_char_p, ctypes.c_bool,
        ]  # fmt: skip
        self.ctx = Context(1, 0)
        self.ctx_p = ctypes.cast(byref(self.ctx), c_void_p)
        self._keep: list[Any] = []

    def check(self, rc: int) -> None:
        """Raise ``RuntimeError`` with ``MXGetLastError`` when *rc* is non-zero."""
        if rc != 0:
            msg = self.lib.MXGetLastError() or b""
            raise RuntimeError(msg.decode(errors="replace"))

    def version(self) -> int:
        """``MXGetVersion`` (10901 for 1.9.1)."""
        v = c_int()
        self.check(self.lib.MXGetVersion(byref(v)))
        return v.value

    def new_var(self) -> int:
        """Create a 1-element float32 CPU NDArray (delay-allocated); its chunk var is the var."""
        h = c_void_p()
        shape = (c_uint * 1)(1)
        self.check(self.lib.MXNDArrayCreateEx(shape, 1, 1, 0, 1, 0, byref(h)))
        assert h.value is not None
        return h.value

    def free(self, handles: list[int]) -> None:
        """Free NDArray handles (after all their ops completed)."""
        for h in handles:
            self.check(self.lib.MXNDArrayFree(h))

    def wait_all(self) -> None:
        """``MXNDArrayWaitAll`` = ``Engine::WaitForAll``."""
        self.check(self.lib.MXNDArrayWaitAll())

    @staticmethod
    def nd_array(handles: list[int]) -> Any:
        """Build a ``NDArrayHandle*`` argument (``None`` when empty)."""
        if not handles:
            return None
        return (c_void_p * len(handles))(*handles)

    def push_async_probe(self, delay: float) -> bool:
        """Self-test of ``MXEnginePushAsyncND``: an async op completed from a timer thread.

        Op A (writes var x) copies its ``on_complete`` words (the pointer is to a temporary) and
        completes from a ``threading.Timer`` after *delay*; op B (reads x) must start after that.
        Returns True when B observed A's completion.
        """
        x = self.new_var()
        events: list[str] = []

        def complete(words: tuple[int, int, int]) -> None:
            events.append("A-done")
            fn = CompleteFunc(words[0])
            fn(words[1], words[2], None)

        def a_body(_rctx: int, on_complete: int, _param: int) -> None:
            cb = CallbackOnComplete.from_address(on_complete)
            words = (cb.callback, cb.engine, cb.param)
            threading.Timer(delay, complete, args=(words,)).start()

        def b_body(_rctx: int, _param: int) -> None:
            events.append("B")

        a_cb, b_cb = AsyncFunc(a_body), SyncFunc(b_body)
        self._keep += [a_cb, b_cb]  # keep CFUNCTYPE objects alive until completion
        arr = self.nd_array([x])
        lib = self.lib
        self.check(
            lib.MXEnginePushAsyncND(
                a_cb, 0, None, self.ctx_p, None, 0, arr, 1, None, 0, None, False
            )
        )
        self.check(
            lib.MXEnginePushSyncND(b_cb, 0, None, self.ctx_p, arr, 1, None, 0, None, 0, None)
        )
        self.wait_all()
        self.free([x])
        return events == ["A-done", "B"]


_MX: MXNet | None = None


def _mx(config: str) -> MXNet:
    global _MX
    if _MX is None:
        configure_env(config)
        _MX = MXNet()
    return _MX


def _run_program(mx: MXNet, spec: WorkloadSpec, run: bool = True) -> tuple[float, Checker, Any]:
    """Set up ``spec``'s program (Vars, argument arrays, bodies) and, if ``run``, push and
    time it; ``run=False`` is the setup alone, which ``instructions.py`` subtracts."""
    prog, n_vars = generate(spec)
    check = Checker(spec, prog, n_vars)
    handles = [mx.new_var() for _ in range(n_vars)]
    args = []
    for reads, writes in prog:
        args.append(
            (
                mx.nd_array([handles[v] for v in reads]),
                len(reads),
                mx.nd_array([handles[v] for v in writes]),
                len(writes),
            )
        )
    if is_program(spec):
        fns = check.closures()

        def trampoline(_rctx: int, i: int) -> None:
            fns[i]()

    else:
        body = check.body

        def trampoline(_rctx: int, i: int) -> None:
            body(i)

    cb = SyncFunc(trampoline)  # one callback object, alive for the whole run
    push = mx.lib.MXEnginePushSyncND
    ctx = mx.ctx_p
    mx.wait_all()
    t0 = start_clock(spec)
    for i in range(len(prog) if run else 0):
        c, nc, m, nm = args[i]
        if push(cb, i, None, ctx, c, nc, m, nm, None, 0, None):
            mx.check(-1)
    mx.wait_all()
    dt = time.perf_counter() - t0
    mx.free(handles)
    del cb
    return dt, check, prog


def run_workload(spec: WorkloadSpec, config: str) -> dict[str, Any]:
    """Run one workload under the MXNet *config*; return the result record."""
    if spec.is_coro:
        raise ValueError("coroutine workloads do not apply to MXNet")
    mx = _mx(config)
    heap = user_heap(spec)  # a program workload's own heap, held until it is measured
    _run_program(mx, WARMUP)
    dt, check, prog = _run_program(mx, spec)
    del heap
    return result_record(
        spec,
        "mxnet-" + config,
        dt,
        check,
        prog,
        extra={
            "engine": os.environ["MXNET_ENGINE_TYPE"],
            "cpu_workers": os.environ.get("MXNET_CPU_WORKER_NTHREADS"),
        },
    )


def probe() -> None:
    """Print the MXNet version and the outcome of the async-completion self-test as JSON."""
    mx = _mx("perdevice-N")
    out = {"version": mx.version(), "lib": str(find_lib()), "async_ok": mx.push_async_probe(0.05)}
    sys.stdout.write(json.dumps(out) + "\n")


def main() -> None:
    """Entry point; exits with ``os._exit`` to dodge MXNet's static-destruction crashes."""
    code = 0
    try:
        if sys.argv[1:] == ["--probe"]:
            probe()
        else:
            run_cli(run_workload, "MXNet 1.9.1 engine peer (ctypes)")
    except SystemExit as exc:
        code = int(exc.code or 0)
    except BaseException:  # report and exit non-zero without MXNet teardown
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
