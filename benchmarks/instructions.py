"""Instructions per operation, counted by valgrind: the engine's cost without the noise.

``run.py`` measures wall-clock time, the figure users care about, but on a shared 2-core
machine its medians move by tens of percent from run to run. This script counts the machine
instructions that one operation costs instead (valgrind's callgrind tool), which is the same
number every time for the same code and inputs, whatever else the machine is doing. It is
how the engine's hot paths were tuned, and it compares aioengine's loop-thread configurations
with the hand-written asyncio floors of ``peers/asyncio_floor.py`` on the same programs.

For each configuration and shape it runs four processes: the workload with ``N1`` and with
``N2`` operations, and the same two with the setup only (program, Vars, bodies, engine), and
reports ``((I(N2) - I(N1)) - (S(N2) - S(N1))) / (N2 - N1)``: the instructions per operation
of pushing, running and finishing it, garbage collection included, the fixed costs (imports,
start-up, warm-up) cancelled out. Only single-threaded configurations are counted (valgrind
runs threads one at a time, so a thread pool's figures would describe valgrind's scheduler).

Two options compare with MXNet itself, whose C++ engine the same counting sees through its C
API: ``--configs ...,mxnet-naive`` counts MXNet 1.9.1's NaiveEngine (run by the MXNet venv's
interpreter, ``--mxnet-python``, as ``run.py`` makes it: ``.venv-mxnet/``), and ``--program``
counts the ``program`` workloads of ``run.py`` (a heap of 200,000 objects, per-operation
closures, no collection before the pushes), so that what the collector costs is counted too.
Loading ``libmxnet.so`` under valgrind takes about 45 seconds per process.

Usage::

    python benchmarks/instructions.py                       # every config and shape
    python benchmarks/instructions.py --shapes chain,random --configs aio-inline,floor-inline
    python benchmarks/instructions.py --loop uvloop --out /tmp/uvloop.json   # on uvloop
    python benchmarks/instructions.py --program --configs aio-inline,aio-serial,mxnet-naive \
        --out /tmp/program.json                   # a user's program, against NaiveEngine

It counts the aioengine that its interpreter imports: run it with the bench venv's Python
(``.nox/bench/bin/python``, the compiled wheel) for ``results/instructions.json``, and with a
venv holding an editable install (the pure-Python sources) and ``--out
benchmarks/results/instructions-pure.json`` for the second table of the performance page.

It writes ``benchmarks/results/instructions.json``, which ``report.py`` shows on the
performance page. Needs valgrind (``apt-get install valgrind``); prints a note and exits 0
without it.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from workloads import SHAPES, Checker, WorkloadSpec, generate, make_runner, user_heap

CONFIGS = ("aio-inline", "aio-serial", "aio-async", "floor-inline", "floor-task")
MXNET = "mxnet-naive"  # opt-in (--configs): MXNet's NaiveEngine, in the MXNet venv
#: What each aioengine configuration is compared with, when both were counted.
PEERS = {
    "aio-inline": ("floor-inline", MXNET),
    "aio-serial": ("floor-inline", MXNET),
    "aio-async": ("floor-task",),
}
#: The MXNet venv's interpreter (``--mxnet-python``).
MXNET_PYTHON = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".venv-mxnet", "bin", "python"
)


async def _aioengine(config: str, spec: WorkloadSpec, setup_only: bool) -> None:
    import aioengine as ae

    prog, n_vars = generate(spec)
    check = Checker(spec, prog, n_vars)
    engine = ae.Engine(serial=config == "aio-serial", cpu_workers=1)
    vs = [engine.new_var(f"v{k}") for k in range(n_vars)]
    cvs = [[vs[v] for v in reads] for reads, _ in prog]
    mvs = [[vs[v] for v in writes] for _, writes in prog]
    ctx = ae.cpu()
    if config == "aio-async":
        cfns = [partial(check.cbody, i) for i in range(len(prog))]
    elif "program" in spec.tags:
        fns = check.closures()  # as the runner's program workloads push them
    else:
        fns = [partial(check.body, i) for i in range(len(prog))]
    prop = ae.FnProperty.ASYNC if config == "aio-inline" else ae.FnProperty.NORMAL
    await engine.wait_for_all()
    if "program" not in spec.tags:
        gc.collect()  # as start_clock() does in the runners (and in both modes: it cancels out)
    if not setup_only:
        if config == "aio-async":
            for i in range(len(prog)):
                engine.push_async(cfns[i], ctx, cvs[i], mvs[i])
        else:
            for i in range(len(prog)):
                engine.push_sync(fns[i], ctx, const_vars=cvs[i], mutate_vars=mvs[i], prop=prop)
        await engine.wait_for_all()
    await engine.aclose()


async def _floor(config: str, spec: WorkloadSpec, setup_only: bool) -> None:
    """The floors of ``peers/asyncio_floor.py`` themselves (their own timing is ignored)."""
    from peers.asyncio_floor import _run_counter, _run_tasks

    if setup_only:  # what both floors do before their first push (start_clock included)
        prog, n_vars = generate(spec)
        Checker(spec, prog, n_vars)
        gc.collect()
    elif config == "floor-inline":
        await _run_counter(spec, "inline", None)
    else:
        await _run_tasks(spec)


def _mxnet(spec: WorkloadSpec, setup_only: bool) -> None:
    """MXNet's NaiveEngine on ``spec``, through the runner of ``peers/mxnet_engine.py``."""
    from peers.mxnet_engine import _mx, _run_program

    _run_program(_mx("naive"), spec, run=not setup_only)


def _child(config: str, shape: str, n: int, mode: str, loop: str) -> None:
    body = "yield" if config in ("aio-async", "floor-task") else "noop"
    program = mode.startswith("program-")
    spec = WorkloadSpec(f"{body}/{shape}", shape, body, n, tags=("program",) if program else ())
    setup_only = mode.endswith("setup")
    heap = user_heap(spec)  # a program's own heap, held until the end (empty otherwise)
    if config == MXNET:
        _mxnet(spec, setup_only)
    else:
        run = _floor if config.startswith("floor") else _aioengine
        with make_runner(loop) as runner:
            runner.run(run(config, spec, setup_only))
    del heap


def _count(config: str, shape: str, n: int, mode: str, loop: str) -> int:
    """Instructions of one child process, from callgrind's summary line."""
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        MXNET_PYTHON if config == MXNET else sys.executable,
        __file__,
        "--child",
        config,
        shape,
        str(n),
        mode,
        loop,
    ]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stderr
    for line in out.splitlines():
        if "Collected :" in line:
            return int(line.split()[-1])
    raise RuntimeError(f"no instruction count in valgrind's output:\n{out[-2000:]}")


def per_op(
    config: str,
    shape: str,
    n1: int,
    n2: int,
    loop: str,
    pool: ThreadPoolExecutor,
    program: bool = False,
) -> float:
    """Instructions per operation of ``config`` on ``shape`` (see the module docstring)."""
    prefix = "program-" if program else ""
    runs = [
        pool.submit(_count, config, shape, n, prefix + mode, loop)
        for n in (n1, n2)
        for mode in ("run", "setup")
    ]
    i1, s1, i2, s2 = (r.result() for r in runs)
    return ((i2 - i1) - (s2 - s1)) / (n2 - n1)


def main() -> int:
    """Print instructions per operation for each configuration and shape, with ratios."""
    global MXNET_PYTHON  # the children's interpreter for mxnet-naive (--mxnet-python)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--n1", type=int, default=2000)
    ap.add_argument("--n2", type=int, default=6000)
    ap.add_argument(
        "--out",
        default=os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "results", "instructions.json"
        ),
    )
    ap.add_argument(
        "--loop",
        choices=("asyncio", "uvloop"),
        default="asyncio",
        help="the event loop every configuration runs on (default: asyncio's)",
    )
    ap.add_argument(
        "--program",
        action="store_true",
        help="count run.py's program workloads (heap, closures, the collector's work)",
    )
    ap.add_argument("--mxnet-python", default=MXNET_PYTHON, help="the MXNet venv's interpreter")
    ap.add_argument("--child", nargs=5, metavar=("CONFIG", "SHAPE", "N", "MODE", "LOOP"))
    args = ap.parse_args()
    if args.child:
        config, shape, n, mode, loop = args.child
        _child(config, shape, int(n), mode, loop)
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind): nothing counted")
        return 0
    configs = [c for c in args.configs.split(",") if c]
    shapes = [s for s in args.shapes.split(",") if s]
    if args.program and not set(configs) <= {"aio-inline", "aio-serial", MXNET}:
        ap.error(f"--program counts aio-inline, aio-serial and {MXNET} only")
    if MXNET in configs:
        if not os.path.exists(args.mxnet_python):
            ap.error(f"{MXNET}: no MXNet venv at {args.mxnet_python} (run.py makes it)")
        MXNET_PYTHON = args.mxnet_python
    results: dict[tuple[str, str], float] = {}
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        for shape in shapes:
            for config in configs:
                results[config, shape] = per_op(
                    config, shape, args.n1, args.n2, args.loop, pool, args.program
                )
                print(f"{shape:12s} {config:14s} {results[config, shape]:9,.0f} instructions/op")
    print("\nratio = peer instructions / aioengine instructions (>1: aioengine does less)")
    ratios = []
    for shape in shapes:
        for config, peers in PEERS.items():
            for peer in peers:
                if (config, shape) in results and (peer, shape) in results:
                    ratio = results[peer, shape] / results[config, shape]
                    ratios.append({"shape": shape, "aio": config, "vs": peer, "ratio": ratio})
                    print(f"{shape:12s} {config:14s} vs {peer:14s} {ratio:5.2f}x")
    import aioengine.engine

    report = {
        "python": platform.python_version(),
        "aioengine_core": "compiled" if aioengine.engine._COMPILED else "pure Python",
        "loop": args.loop,
        "program": args.program,
        "n1": args.n1,
        "n2": args.n2,
        "per_op": [
            {"config": c, "shape": s, "instructions": round(v)} for (c, s), v in results.items()
        ],
        "ratios": ratios,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
