"""Command line: ``python -m aioengine <command>``; ``--help`` lists the commands."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

from . import __version__
from .demo import run_demo


def _demo(args: argparse.Namespace) -> int:
    print(
        f"aioengine {__version__} demo: {args.ops} NumPy ops over {args.vars} arrays "
        f"of {args.size}x{args.size}, seed {args.seed}, "
        f"{args.workers or os.cpu_count()} CPU worker(s)"
    )
    trace_path = None if args.no_trace else os.path.abspath(args.trace)
    threaded, serial = asyncio.run(
        run_demo(
            n_ops=args.ops,
            n_vars=args.vars,
            size=args.size,
            seed=args.seed,
            workers=args.workers,
            trace_path=trace_path,
            progress=not args.no_progress,
        )
    )
    print(
        f"  threaded: {threaded.ops} ops ({threaded.uploads} coroutine uploads) in "
        f"{threaded.wall_s:.3f} s, {threaded.ops / threaded.wall_s:,.0f} ops/s, "
        f"parallelism {threaded.parallelism:.2f} on {len(threaded.threads)} thread(s)"
    )
    print(
        f"  serial:   {serial.ops} ops in {serial.wall_s:.3f} s, "
        f"{serial.ops / serial.wall_s:,.0f} ops/s"
    )
    print(
        f"  verified: all {threaded.vars} arrays bit-identical to the serial run "
        f"(checksum {threaded.checksum:.6f}); speed-up {serial.wall_s / threaded.wall_s:.2f}x"
    )
    if trace_path is not None:
        print(
            f"  trace:    {trace_path}\n"
            "            open it in https://ui.perfetto.dev (Open trace file) or chrome://tracing:"
            "\n            one track per worker thread, lanes for the coroutine uploads, and"
            "\n            arrows from each operation to the ones it waited for"
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m aioengine`` and the ``aioengine`` script."""
    parser = argparse.ArgumentParser(
        prog="python -m aioengine", description="aioengine: an asyncio-native dependency engine"
    )
    parser.add_argument("--version", action="version", version=f"aioengine {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="command", required=True)
    demo = commands.add_parser(
        "demo",
        help="the showcase: a traced NumPy + coroutine workload, checked against a serial run",
        description="Run a seeded random pipeline of NumPy kernels and coroutine uploads on "
        "the engine's thread pools with a progress bar, write a trace of it, re-run it "
        "serially, verify every array is bit-identical, and print a summary.",
    )
    demo.add_argument("--ops", type=int, default=600, help="operations to push (default 600)")
    demo.add_argument("--vars", type=int, default=32, help="arrays / Vars (default 32)")
    demo.add_argument("--size", type=int, default=256, help="array side (default 256)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.add_argument("--workers", type=int, default=None, help="CPU workers (default: CPUs)")
    demo.add_argument(
        "--trace",
        default="aioengine-demo.trace.json",
        metavar="PATH",
        help="where to write the threaded run's trace (default aioengine-demo.trace.json)",
    )
    demo.add_argument("--no-trace", action="store_true", help="do not write a trace")
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")
    demo.set_defaults(handler=_demo)
    args = parser.parse_args(argv)
    try:
        code: int = args.handler(args)
    except ValueError as exc:
        parser.error(str(exc))
    return code


if __name__ == "__main__":
    sys.exit(main())
