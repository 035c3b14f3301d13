"""Command line: ``aioengine <command>`` (the console script) or ``python -m aioengine
<command>``; ``--help`` lists the commands."""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
from collections.abc import Callable, Sequence

from . import __version__
from .demo import run_demo, run_pipeline_demo
from .errors import DeviceUnavailableError
from .pipeline import IO_LATENCY, RECORDS, SIZE, STAGES
from .settings import Settings


def _trace_path(args: argparse.Namespace) -> str | None:
    """The absolute trace path, checked before any work runs (None with ``--no-trace``).

    Raises:
        ValueError: if the path is a directory, an existing file that cannot be written, or
            in a directory that does not exist or cannot be written.
    """
    if args.no_trace:
        return None
    path: str = os.path.abspath(args.trace)
    if os.path.isdir(path):
        raise ValueError(f"--trace {args.trace}: {path} is a directory, not a file")
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise ValueError(f"--trace {args.trace}: cannot write to file {path}")
    directory = os.path.dirname(path)
    if not os.path.isdir(directory) or not os.access(directory, os.W_OK):
        raise ValueError(f"--trace {args.trace}: cannot write to directory {directory}")
    return path


def _int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer >= ``minimum`` (argparse names the option)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def _seconds(text: str) -> float:
    """An argparse ``type``: a finite number of seconds >= 0 (not ``inf`` or ``nan``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text}")
    return value


def _demo(args: argparse.Namespace) -> int:
    trace_path: str | None = args.trace_path
    where = (
        "the CPU worker threads"
        if args.cluster is None
        else f"the Dask cluster {args.cluster!r} (value operations)"
    )
    print(
        f"aioengine {__version__} demo: {args.records} records of {args.size}x{args.size} "
        f"floats, seed {args.seed}, through\n"
        f"  {' -> '.join(STAGES)}\n"
        f"  read, upload:      coroutines on the event loop ({args.latency * 1e3:g} ms of "
        "simulated I/O each)\n"
        f"  decode, transform: NumPy on {where}\n"
        "  reduce:            inline on the loop thread, one record at a time in push order",
        flush=True,  # before the progress bar on stderr
    )
    report = asyncio.run(
        run_pipeline_demo(
            records=args.records,
            size=args.size,
            io_latency=args.latency,
            seed=args.seed,
            workers=args.workers,
            trace_path=trace_path,
            progress=not args.no_progress,
            cluster=args.cluster,
        )
    )
    s, wall, seq_wall = report.summary, report.wall_s, report.sequential_wall_s
    print(
        f"  engine:     {s.records} records ({len(STAGES) * s.records} operations) in "
        f"{wall:.3f} s on {report.workers} CPU worker(s)\n"
        f"              {s.records / wall:,.0f} records/s, "
        f"{s.uploaded_bytes / wall / 1e6:,.1f} MB/s uploaded\n"
        f"  checksum:   {s.checksum:.6f} ({s.uploaded_bytes / 1e6:.1f} MB uploaded)\n"
        f"  sequential: {seq_wall:.3f} s for the same stages one record after another, "
        f"no engine\n"
        f"              ({seq_wall / wall:.2f}x the engine's time)"
    )
    if not report.verified:
        print(
            f"  MISMATCH:   the engine computed {s},\n"
            f"              the sequential run {report.sequential}",
            file=sys.stderr,
        )
        return 1
    print("  verified:   checksum and uploaded bytes bit-identical to the sequential run")
    if trace_path is not None:
        workers = sum(t.startswith("aioengine-cpu") for t in report.tracks)
        lanes = sum(t.startswith("coroutine ops") for t in report.tracks)
        print(
            f"  trace:      {trace_path}\n"
            "              open it in https://ui.perfetto.dev (Open trace file) or "
            "chrome://tracing:\n"
            f"              {workers} worker-thread track(s) (decode, transform), "
            f"{lanes} coroutine lane(s)\n"
            "              (read, upload), the event loop's track (reduce), and arrows from\n"
            "              each operation to the ones it waited for"
        )
    return 0


def _bench_demo(args: argparse.Namespace) -> int:
    trace_path: str | None = args.trace_path
    print(
        f"aioengine {__version__} bench-demo: {args.ops} NumPy ops over {args.vars} arrays "
        f"of {args.size}x{args.size}, seed {args.seed}, "
        f"{args.workers} CPU worker(s)"
    )
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


def _add_common(parser: argparse.ArgumentParser, *, trace: str, what: str) -> None:
    parser.add_argument(
        "--seed", type=_int_at_least(0), default=0, help="random seed, >= 0 (default 0)"
    )
    parser.add_argument(
        "--workers",
        type=_int_at_least(1),
        default=None,
        help="CPU worker threads (default: the engine's, AIOENGINE_CPU_WORKERS or the CPUs)",
    )
    parser.add_argument(
        "--trace",
        default=trace,
        metavar="PATH",
        help=f"where to write {what} trace (default {trace})",
    )
    parser.add_argument("--no-trace", action="store_true", help="do not write a trace")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def main(argv: Sequence[str] | None = None, *, prog: str = "aioengine") -> int:
    """Entry point of the ``aioengine`` script and of ``python -m aioengine``.

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).
        prog: the command's name in usage lines and errors: the script's ``aioengine`` by
            default; ``python -m aioengine`` passes its own (argparse would say
            ``__main__.py``).
    """
    parser = argparse.ArgumentParser(
        prog=prog, description="aioengine: an asyncio-native dependency engine"
    )
    parser.add_argument("--version", action="version", version=f"aioengine {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="command", required=True)
    demo = commands.add_parser(
        "demo",
        help="the showcase: a traced read/decode/transform/upload/reduce pipeline, verified",
        description="Run the pipeline of examples/pipeline.py (coroutine reads and uploads, "
        "NumPy decode and transform on the CPU pool, an inline reduction in push order) with "
        "a progress bar, write a trace of it, recompute it sequentially without the engine, "
        "verify the summary is bit-identical, and print a summary.",
    )
    demo.add_argument(
        "--records",
        type=_int_at_least(1),
        default=RECORDS,
        help=f"records to process (default {RECORDS})",
    )
    demo.add_argument(
        "--size",
        type=_int_at_least(1),
        default=SIZE,
        help=f"a record is SIZE x SIZE floats (default {SIZE})",
    )
    demo.add_argument(
        "--latency",
        type=_seconds,
        default=IO_LATENCY,
        metavar="SECONDS",
        help=f"simulated I/O time of each read and upload (default {IO_LATENCY})",
    )
    demo.add_argument(
        "--cluster",
        default=None,
        metavar="ADDRESS",
        help="run the NumPy stages on a Dask cluster: a scheduler address, or 'local' for a "
        "LocalCluster in this process (needs pip install 'aioengine[dask]')",
    )
    _add_common(demo, trace="aioengine-demo.trace.json", what="the engine run's")
    demo.set_defaults(handler=_demo, command_parser=demo)
    bench = commands.add_parser(
        "bench-demo",
        help="a random NumPy program on the thread pools, checked bit-for-bit against a serial run",
        description="Run a seeded random program of NumPy kernels and coroutine uploads on "
        "the engine's thread pools with a progress bar, write a trace of it, re-run it "
        "serially, verify every array is bit-identical, and print the speed-up.",
    )
    bench.add_argument(
        "--ops", type=_int_at_least(1), default=600, help="operations to push (default 600)"
    )
    bench.add_argument(
        "--vars", type=_int_at_least(2), default=32, help="arrays / Vars, >= 2 (default 32)"
    )
    bench.add_argument(
        "--size", type=_int_at_least(1), default=256, help="array side (default 256)"
    )
    _add_common(bench, trace="aioengine-bench-demo.trace.json", what="the threaded run's")
    bench.set_defaults(handler=_bench_demo, command_parser=bench)
    args = parser.parse_args(argv)  # checks the options' values: a usage error, exit 2
    command_parser: argparse.ArgumentParser = args.command_parser
    try:  # what argparse cannot check, also before any work runs (or anything is printed)
        args.trace_path = _trace_path(args)
        # the workers the engine will have (--workers, else AIOENGINE_CPU_WORKERS, else the
        # CPUs), passed on explicitly so the header and the run agree; bad settings fail here
        args.workers = Settings.resolve(cpu_workers=args.workers).cpu_workers
    except ValueError as exc:
        command_parser.error(str(exc))
    try:
        code: int = args.handler(args)
    except ValueError as exc:
        command_parser.error(str(exc))
    except (DeviceUnavailableError, BaseExceptionGroup) as exc:
        # A cluster that cannot be reached (or a device that is missing): one line, not a
        # traceback; a group made of anything else is a bug to show in full.
        leaves = _leaves(exc)
        if not all(isinstance(leaf, DeviceUnavailableError) for leaf in leaves):
            raise
        for message in dict.fromkeys(str(leaf) for leaf in leaves):
            print(f"{command_parser.prog}: error: {message}", file=sys.stderr)
        return 1
    return code


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside ``exc``, nested groups flattened (``exc`` itself otherwise)."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


if __name__ == "__main__":
    sys.exit(main(prog="python -m aioengine"))
