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
    threaded, serial = asyncio.run(
        run_demo(
            n_ops=args.ops, n_vars=args.vars, size=args.size, seed=args.seed, workers=args.workers
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
        help="run a random NumPy workload threaded and serially and check they agree",
        description="Run a seeded random NumPy workload on the engine's thread pools, "
        "re-run it serially, verify every array is bit-identical, and print what ran.",
    )
    demo.add_argument("--ops", type=int, default=600, help="operations to push (default 600)")
    demo.add_argument("--vars", type=int, default=32, help="arrays / Vars (default 32)")
    demo.add_argument("--size", type=int, default=256, help="array side (default 256)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.add_argument("--workers", type=int, default=None, help="CPU workers (default: CPUs)")
    demo.set_defaults(handler=_demo)
    args = parser.parse_args(argv)
    try:
        code: int = args.handler(args)
    except ValueError as exc:
        parser.error(str(exc))
    return code


if __name__ == "__main__":
    sys.exit(main())
