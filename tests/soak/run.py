"""Run the chaos soak for a long time: ``python -m tests.soak.run --minutes N``.

Runs ``tests/soak/chaos.py`` on the default asyncio loop and on uvloop (if installed), each for
half of the time, prints ops/s and the count of each fault survived, and exits 1 on the first
violation (the message names the seed; rerun with ``--seed`` to replay the same choices).

The nox session (in ``noxfile.py``)::

    @nox.session
    def soak(session: nox.Session) -> None:
        \"\"\"Long chaos soak: ``nox -s soak -- --minutes N`` (default 10).\"\"\"
        session.install("-e", ".", *nox.project.dependency_groups(PYPROJECT, "test"))
        session.run("python", "-m", "tests.soak.run", *session.posargs)
"""

from __future__ import annotations

import argparse
import random
import sys

from tests.soak import chaos


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.soak.run", description=__doc__)
    parser.add_argument("--minutes", type=float, default=10.0, help="total duration (10)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    parser.add_argument(
        "--loop",
        choices=("both", "asyncio", "uvloop"),
        default="both",
        help="event loop(s) to run on (both: half the time each)",
    )
    args = parser.parse_args(argv)
    if args.minutes <= 0:
        parser.error("--minutes must be > 0")
    loops = ["asyncio", "uvloop"] if args.loop == "both" else [args.loop]
    if "uvloop" in loops:
        try:
            import uvloop  # noqa: F401
        except ImportError:
            if args.loop == "uvloop":
                parser.error("uvloop is not installed")
            loops = ["asyncio"]
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    seconds = args.minutes * 60 / len(loops)
    for loop_name in loops:
        print(f"seed={seed}: soaking on {loop_name} for {seconds:.0f} s", flush=True)
        try:
            report = chaos.run(seconds, seed, loop_name)
        except AssertionError as exc:
            print(f"FAILED: {exc}", file=sys.stderr)
            return 1
        print(report.summary(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
