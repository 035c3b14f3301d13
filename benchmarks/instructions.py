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

Usage::

    python benchmarks/instructions.py                       # every config and shape
    python benchmarks/instructions.py --shapes chain,random --configs aio-inline,floor-inline
    python benchmarks/instructions.py --loop uvloop --out /tmp/uvloop.json   # on uvloop

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

from workloads import SHAPES, Checker, WorkloadSpec, generate, make_runner

CONFIGS = ("aio-inline", "aio-serial", "aio-async", "floor-inline", "floor-task")
FLOORS = {"aio-inline": "floor-inline", "aio-serial": "floor-inline", "aio-async": "floor-task"}


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
    else:
        fns = [partial(check.body, i) for i in range(len(prog))]
    prop = ae.FnProperty.ASYNC if config == "aio-inline" else ae.FnProperty.NORMAL
    await engine.wait_for_all()
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


def _child(config: str, shape: str, n: int, setup_only: bool, loop: str) -> None:
    body = "yield" if config in ("aio-async", "floor-task") else "noop"
    spec = WorkloadSpec(f"{body}/{shape}", shape, body, n)
    run = _floor if config.startswith("floor") else _aioengine
    with make_runner(loop) as runner:
        runner.run(run(config, spec, setup_only))


def _count(config: str, shape: str, n: int, setup_only: bool, loop: str) -> int:
    """Instructions of one child process, from callgrind's summary line."""
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        __file__,
        "--child",
        config,
        shape,
        str(n),
        "setup" if setup_only else "run",
        loop,
    ]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stderr
    for line in out.splitlines():
        if "Collected :" in line:
            return int(line.split()[-1])
    raise RuntimeError(f"no instruction count in valgrind's output:\n{out[-2000:]}")


def per_op(config: str, shape: str, n1: int, n2: int, loop: str, pool: ThreadPoolExecutor) -> float:
    """Instructions per operation of ``config`` on ``shape`` (see the module docstring)."""
    runs = [
        pool.submit(_count, config, shape, n, setup_only, loop)
        for n in (n1, n2)
        for setup_only in (False, True)
    ]
    i1, s1, i2, s2 = (r.result() for r in runs)
    return ((i2 - i1) - (s2 - s1)) / (n2 - n1)


def main() -> int:
    """Print instructions per operation for each configuration and shape, with ratios."""
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
    ap.add_argument("--child", nargs=5, metavar=("CONFIG", "SHAPE", "N", "MODE", "LOOP"))
    args = ap.parse_args()
    if args.child:
        config, shape, n, mode, loop = args.child
        _child(config, shape, int(n), mode == "setup", loop)
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind): nothing counted")
        return 0
    configs = [c for c in args.configs.split(",") if c]
    shapes = [s for s in args.shapes.split(",") if s]
    results: dict[tuple[str, str], float] = {}
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        for shape in shapes:
            for config in configs:
                results[config, shape] = per_op(config, shape, args.n1, args.n2, args.loop, pool)
                print(f"{shape:12s} {config:14s} {results[config, shape]:9,.0f} instructions/op")
    print("\nratio = floor instructions / aioengine instructions (>1: aioengine does less)")
    ratios = []
    for shape in shapes:
        for config, floor in FLOORS.items():
            if (config, shape) in results and (floor, shape) in results:
                ratio = results[floor, shape] / results[config, shape]
                ratios.append({"shape": shape, "aio": config, "vs": floor, "ratio": ratio})
                print(f"{shape:12s} {config:14s} vs {floor:14s} {ratio:5.2f}x")
    import aioengine.engine

    report = {
        "python": platform.python_version(),
        "aioengine_core": "compiled" if aioengine.engine._COMPILED else "pure Python",
        "loop": args.loop,
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
