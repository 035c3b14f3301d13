"""Paired runs: aioengine and MXNet's NaiveEngine in one process, taking turns.

``run.py`` runs every measurement in a fresh process and reports medians over repetitions.
On a shared VM whose speed changes by up to 1.8x from one 20,000-operation run to the next
(the same in one process: it hits every peer), a median of five processes per peer depends on
how many of each peer's runs were slowed, and the ``program/noop/`` ratios against
NaiveEngine spread from 0.87x to 1.17x in one run. Here both engines run in one interpreter,
the MXNet venv's, with this session's aioengine importable after that venv's own packages (its
numpy stays the one MXNet needs): each round runs aio-inline, aio-serial and NaiveEngine back
to back on the same ``program/noop/`` workload, the first to go rotating from round to round,
and the ratio is taken within each round. The reported figure is the median of the rounds'
ratios, with their range. A round takes about a second, so most rounds see one speed.

Each measurement is what ``run.py``'s runners do for a ``program`` workload (same code: the
peers' modules): its own setup, the program's heap of 200,000 objects held throughout, no
collection before the clock; a collection before each setup stands in for a fresh process's
settled heap. Every run is verified against the serial replay.

Usage::

    python benchmarks/paired.py              # 9 rounds per shape (about 2 minutes)
    python benchmarks/paired.py --quick      # 3 rounds of 2,000 operations (smoke)

Writes ``benchmarks/results/paired.json``; ``report.py`` shows it on the performance page.
Skips, with a note, where MXNet or an interpreter of this one's version for it is missing.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
OUT = BENCH / "results" / "paired.json"
# Where --quick writes by default: an ignored folder (.gitignore), never the committed figures.
QUICK_OUT = BENCH / "results" / "quick" / "paired.json"
# Workload family -> its body and the configurations that take turns on it, the reference
# (the ratios' denominator) last: no-op operations against MXNet's NaiveEngine, coroutine
# ones against asyncio's own tasks (the task floor).
GROUPS = {
    "noop": ("noop", ("aio-inline", "aio-serial", "mxnet-naive")),
    "coro-yield": ("yield", ("aio-async", "floor-task")),
}
SITE_ENV = "AIOENGINE_PAIRED_SITES"  # where the child finds this session's aioengine


def _child(rounds: int, quick: bool, shapes: list[str]) -> dict[str, Any]:
    """Run the rounds (in the MXNet venv's interpreter); return the raw figures."""
    sys.path += os.environ[SITE_ENV].split(os.pathsep)  # after the venv's own: its numpy
    from peers import aioengine_runner, asyncio_floor, mxnet_engine
    from workloads import WARMUP, WorkloadSpec, user_heap

    import aioengine
    from aioengine.engine import _COMPILED

    n_ops = 2_000 if quick else 20_000
    mx = mxnet_engine._mx("naive")
    heap = user_heap(WorkloadSpec("heap", "chain", "noop", 1, tags=("program",)))

    def measure(spec: WorkloadSpec, config: str) -> float:
        gc.collect()  # as a fresh runner's settled heap; the clock starts without one
        if config == "mxnet-naive":
            mxnet_engine._run_program(mx, WARMUP)
            seconds, check, prog = mxnet_engine._run_program(mx, spec)
        elif config.startswith("floor-"):
            seconds, check, prog = asyncio.run(asyncio_floor._measure(spec, config))
        else:
            seconds, check, prog = asyncio.run(aioengine_runner._measure(spec, config))
        if not check.verify()["verified"]:
            raise AssertionError(f"{config} on {spec.name}: wrong result (serial replay)")
        return len(prog) / seconds

    out: dict[str, Any] = {}
    for family, (body, configs) in GROUPS.items():
        for shape in shapes:
            name = f"program/{family}/{shape}"
            spec = WorkloadSpec(name, shape, body, n_ops, tags=("program",))
            runs: dict[str, list[float]] = {c: [] for c in configs}
            for r in range(rounds):
                k = r % len(configs)
                for config in configs[k:] + configs[:k]:
                    runs[config].append(measure(spec, config))
            out[name] = runs
    del heap
    core = "compiled" if _COMPILED else "pure Python"
    return {"runs": out, "aioengine": f"{aioengine.__version__} ({core})", "n_ops": n_ops}


def summarise(runs: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Per aioengine configuration: the median of the rounds' ratios to the reference (the
    last configuration), their range, and the ratio of the medians (what a run.py-style
    table would show)."""
    *mine_configs, reference = runs
    ref = runs[reference]
    rows: dict[str, dict[str, float]] = {}
    for config in mine_configs:
        mine = runs[config]
        paired = [a / b for a, b in zip(mine, ref, strict=True)]
        rows[config] = {
            "paired_median": statistics.median(paired),
            "paired_min": min(paired),
            "paired_max": max(paired),
            "ratio_of_medians": statistics.median(mine) / statistics.median(ref),
        }
    return rows


def _sites() -> list[str]:
    """The directories that hold the aioengine this interpreter imports (a wheel installed in
    the session's venv, or the checkout when none is) and its dependencies."""
    sites: list[str] = []
    for name in ("aioengine", "anyio", "tqdm"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin is not None:
            site = str(Path(spec.origin).resolve().parent.parent)
        elif name == "aioengine":
            site = str(ROOT)
        else:
            continue
        if site not in sites:
            sites.append(site)
    return sites


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, help="rounds per shape (9; 3 with --quick)")
    ap.add_argument("--quick", action="store_true", help="smoke mode: 2,000 operations")
    ap.add_argument("--shapes", default="independent,chain,fanout,random")
    ap.add_argument("--mxnet-venv", type=Path, default=ROOT / ".venv-mxnet")
    ap.add_argument("--no-install", action="store_true", help="never install MXNet's venv")
    ap.add_argument("--out", type=Path, help="the JSON file (results/paired.json; --quick: quick/)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.out = args.out or (QUICK_OUT if args.quick else OUT)
    rounds = args.rounds or (3 if args.quick else 11)
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    if args.child:
        print(json.dumps(_child(rounds, args.quick, shapes)))
        return 0

    sys.path.insert(0, str(BENCH))
    import run

    python, note = run.ensure_mxnet(args.mxnet_venv, not args.no_install, retry=False)
    if python is None:
        print(f"paired: skipped ({note})")
        return 0
    version = subprocess.run(
        [python, "-c", "import sys; print(sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if version != str(sys.version_info[:2]):
        print(f"paired: skipped (MXNet's interpreter is {version}: this aioengine cannot load)")
        return 0
    env = run.child_env()
    env[SITE_ENV] = os.pathsep.join(_sites())
    cmd = [python, str(Path(__file__).resolve()), "--child", "--rounds", str(rounds)]
    cmd += ["--shapes", ",".join(shapes), *(["--quick"] if args.quick else [])]
    proc = subprocess.run(cmd, env=env, cwd=BENCH, capture_output=True, text=True, check=False)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode or not lines or not lines[-1].startswith("{"):
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        print(f"paired: the run failed (rc={proc.returncode})\n{tail}")
        return 1
    raw = json.loads(lines[-1])
    note = note.replace(str(ROOT) + os.sep, "")  # the checkout's paths, relative: committed
    result: dict[str, Any] = {
        "about": "aioengine against NaiveEngine and the task floor in one process, in turns",
        "mxnet": note,
        "aioengine": raw["aioengine"],
        "rounds": rounds,
        "n_ops": raw["n_ops"],
        "workloads": {},
    }
    print(f"\npaired rounds in one process ({rounds} per shape, {raw['aioengine']}; {note})")
    print(f"{'workload':30} {'ratio':24} {'paired median':>13} {'range':>12} {'medians':>8}")
    for name, runs in raw["runs"].items():
        rows = summarise(runs)
        reference = list(runs)[-1]
        result["workloads"][name] = {"ops_per_s": runs, "reference": reference, "ratios": rows}
        for config, row in rows.items():
            span = f"{row['paired_min']:.2f}-{row['paired_max']:.2f}"
            print(
                f"{name:30} {config + ' / ' + reference:24} {row['paired_median']:12.2f}x "
                f"{span:>12} {row['ratio_of_medians']:7.2f}x"
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {os.path.relpath(args.out, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
