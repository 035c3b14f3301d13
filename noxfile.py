"""Development sessions: ``nox`` runs lint, mypy and the tests (what CI runs: session ``ci``)."""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tempfile
import time

import nox

nox.needs_version = ">=2025.02.09"
# Every check CI makes, as two chains that ``nox -s ci`` (the default) runs at once, one per core
# of a 2-core machine: the pure-Python tests under coverage (the longest session) beside the
# others in turn. tests/test_docs.py checks that each session is in exactly one chain.
CHAINS = (
    ["tests", "lint", "docs"],
    ["mypy", "examples", "bench_smoke", "tests_compiled"],
)
nox.options.sessions = ["ci"]
nox.options.reuse_venv = "yes"
# uv makes each venv and installs into it in seconds (CI's .ci/run installs it beside nox:
# ``pip install 'nox[uv]'``); without uv, virtualenv and pip do the same, slower.
nox.options.default_venv_backend = "uv|virtualenv"

PYPROJECT = nox.project.load_toml("pyproject.toml")


@nox.session(venv_backend="none")
def ci(session: nox.Session) -> None:
    """Every check (the default session): the sessions of :data:`CHAINS`, the two chains at
    once, each session once. The first chain's output is printed after the second's; the
    session fails if either chain fails."""
    # The sessions' own subprocesses (benchmarks/run.py's MXNet venv) find uv beside nox.
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    nox_cmd = [sys.executable, "-m", "nox", "-s"]
    start = time.monotonic()
    with tempfile.TemporaryFile("w+") as log:
        first = subprocess.Popen(
            [*nox_cmd, *CHAINS[0]], stdout=log, stderr=subprocess.STDOUT, env=env
        )
        try:
            rc_second = subprocess.run([*nox_cmd, *CHAINS[1]], env=env, check=False).returncode
        finally:
            rc_first = first.wait()
        session.log(f"{' '.join(CHAINS[1])}: rc={rc_second}; {' '.join(CHAINS[0])}: rc={rc_first}")
        log.seek(0)
        print(log.read(), flush=True)
    session.log(f"both chains done in {time.monotonic() - start:.0f} s")
    if rc_first or rc_second:
        session.error(f"a chain failed (rc {rc_first} and {rc_second})")


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite on asyncio and uvloop, with coverage (GPU tests skip without CuPy).

    The sources run (an editable install is pure Python); ``tests_compiled`` runs the suite
    again against the compiled core. ``AIOENGINE_VALIDATE=1`` checks the scheduler's
    invariants (``validate_state()``) of every engine a test created, after each test
    (tests/conftest.py); it costs no measurable time.
    """
    session.install("-e", ".", *nox.project.dependency_groups(PYPROJECT, "test", "interop"))
    args = session.posargs or [
        "--cov=aioengine",
        "--cov-report=term-missing:skip-covered",
        "--cov-fail-under=90",
    ]
    # The chaos soak (tests/soak) runs 16 s of random programs here, over both loops (its
    # default, 40 s, is for a run of its own): CI stays near its 12 minutes on 2 cores.
    session.run("pytest", *args, env={"AIOENGINE_VALIDATE": "1", "AIOENGINE_SOAK_SECONDS": "16"})


@nox.session
def tests_compiled(session: nox.Session) -> None:
    """Run the test suite against the compiled core: a wheel built by setup.py, not the sources.

    ``tests`` runs the sources (an editable install is pure Python) and measures coverage;
    this session builds and installs the wheel, whose engine, operation and var modules are
    compiled, and fails if they are not. ``--import-mode=append`` keeps the source tree
    behind site-packages on ``sys.path``.
    """
    session.install(
        ".",
        *nox.project.dependency_groups(PYPROJECT, "test", "interop"),
        env={"AIOENGINE_REQUIRE_EXTENSIONS": "1"},
    )
    session.run(
        "pytest",
        "--import-mode=append",
        "-p",
        "no:cacheprovider",
        *session.posargs,
        # The chaos soak runs 16 s here as in ``tests``, beside which this session runs in CI
        # (``nox -s soak`` runs it for as long as it is asked).
        env={"AIOENGINE_EXPECT_COMPILED": "1", "AIOENGINE_SOAK_SECONDS": "16"},
    )


@nox.session
def lint(session: nox.Session) -> None:
    """Check style and formatting with ruff, the import layers with import-linter, and how
    much the modules reach into each other's private state with tools/reach.py.

    ``lint-imports`` checks the contracts in pyproject.toml (``[tool.importlinter]``): the
    package's layers import downwards only, and the observers do not import each other.
    """
    session.install("ruff", "import-linter>=2.1")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("lint-imports")
    # A ratchet (issue 36): writes to another module's private fields (and, from outside the
    # core, to the scheduler's public state or an operation's record), and reads of private
    # names. The targets were 0 outside writes and under 300 reaches; these ceilings are
    # today's counts and only go down: lower them with every change that removes some.
    session.run("python", "tools/reach.py", "--max-writes", "0", "--max-reach", "202")


@nox.session
def mypy(session: nox.Session) -> None:
    """Type-check the package and tools/ (strict), this noxfile, and the tests.

    The ``dask`` extra is installed so that ``remote/`` is checked against distributed's
    own type hints, and the test group so that the tests are checked against what they
    import. The tests run under pyproject.toml's settings with the override for ``tests.*``,
    which turns off the error codes they trip on purpose (wrong argument types, ...).
    """
    session.install(
        "-e",
        ".[dask]",
        *nox.project.dependency_groups(PYPROJECT, "lint"),
        *nox.project.dependency_groups(PYPROJECT, "test", "interop"),
    )
    session.run(
        "mypy",
        "--strict",
        "aioengine",
        "tests/test_typing.py",
        "tools/gen_blocking.py",
        "tools/reach.py",
    )
    session.run("mypy", "noxfile.py")
    session.run("mypy", "tests")


@nox.session
def examples(session: nox.Session) -> None:
    """Run every example script and both demos with small sizes."""
    session.install("-e", ".[examples]")
    for path in sorted(glob.glob("examples/*.py")):
        session.run("python", path, env={"AIOENGINE_EXAMPLE_SMALL": "1"})
    tmp = session.create_tmp()
    trace = os.path.join(tmp, "demo.trace.json")
    session.run(
        "python", "-m", "aioengine", "demo", "--records", "48", "--size", "64", "--trace", trace
    )
    trace = os.path.join(tmp, "bench-demo.trace.json")
    session.run(
        "python", "-m", "aioengine", "bench-demo", "--ops", "120", "--size", "64", "--trace", trace
    )


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site with warnings as errors (offline: no plugin fetches)."""
    session.install("-e", ".", *nox.project.dependency_groups(PYPROJECT, "docs"))
    session.run(
        "mkdocs", "build", "--strict", "--site-dir", os.path.join(session.create_tmp(), "site")
    )


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmark aioengine against MXNet 1.9.1, dask and the asyncio floors, in one run.

    ``nox -s bench`` runs the full matrix (about 8 minutes on 2 cores, plus a one-time MXNet
    venv install); ``nox -s bench -- --quick`` is the smoke mode. Extra arguments go to
    benchmarks/run.py (``nox -s bench -- --help``). Timings are printed, never asserted.
    Then benchmarks/paired.py runs aioengine and MXNet's NaiveEngine (and the task floor)
    in one process, taking turns, and reports the ratios within each round;
    benchmarks/accumulate.py compares the commute access mode with write mode and
    ``submit(accumulate=)``, benchmarks/gpu_overlap.py measures GPU copy/compute overlap
    (both JSON, ``--quick`` passed on; the latter reports itself skipped without CuPy and a
    CUDA device), benchmarks/remote.py remote operations against hand-written Dask
    (``--quick`` passed on), and benchmarks/arrays.py engine-backed arrays against NumPy,
    numexpr, MXNet's NDArray, JAX and dask.array (ratios and targets, ``results/arrays.json``,
    ``--quick`` passed on), benchmarks/paths.py ``submit`` and tracing against the
    core's push (ratios, JSON), and benchmarks/arrays_cluster.py remote arrays against
    dask.array on a ``LocalCluster(processes=True)`` (ratios, JSON).
    """
    # The wheel, with the compiled core: what a user installs. JAX is a peer of
    # benchmarks/arrays.py only (a large install; without it that peer is skipped, with a note).
    session.install(".", *nox.project.dependency_groups(PYPROJECT, "bench"), "jax>=0.4.30")
    session.run("python", "benchmarks/run.py", *session.posargs)
    # aioengine and NaiveEngine (and the task floor) in one process, in turns: the ratios
    # within each round, which a VM's changing speed moves far less than medians over
    # processes (--quick passed on).
    session.run("python", "benchmarks/paired.py", *{"--quick"} & set(session.posargs))
    # Access modes: commute vs write mode vs submit(accumulate=) (JSON, --quick passed on).
    session.run("python", "benchmarks/accumulate.py", *{"--quick"} & set(session.posargs))
    session.run("python", "benchmarks/gpu_overlap.py", *{"--quick"} & set(session.posargs))
    # Remote operations against hand-written Dask on one LocalCluster (ratios, one run).
    session.run("python", "benchmarks/remote.py", *{"--quick"} & set(session.posargs))
    # Engine-backed arrays: tiny operations, independent branches, I/O overlap, memory, and
    # issue 45's programs (elementwise chain, reductions, memory, lag, MLP, k-means).
    session.run("python", "benchmarks/arrays.py", *{"--quick"} & set(session.posargs))
    # submit and tracing against the core's push, in turns (ratios, JSON; --quick passed on).
    session.run("python", "benchmarks/paths.py", *{"--quick"} & set(session.posargs))
    # Remote arrays against dask.array on LocalCluster(processes=True) (ratios, JSON).
    session.run("python", "benchmarks/arrays_cluster.py", *{"--quick"} & set(session.posargs))


@nox.session
def bench_smoke(session: nox.Session) -> None:
    """The benchmark's smoke mode (CI): every peer runs and verifies; timings are not judged."""
    # Editable (the sources, pure Python): CI builds the compiled wheel once, for its tests.
    session.install("-e", ".", *nox.project.dependency_groups(PYPROJECT, "bench"))
    # Every output goes to the session's temporary folder: a test run never rewrites the
    # committed figures under benchmarks/results (tests/test_docs.py checks each call).
    tmp = session.create_tmp()
    out, png = f"{tmp}/latest.json", f"{tmp}/latest.png"
    session.run(
        "python", "benchmarks/run.py", "--quick", "--out", out, "--png", png, *session.posargs
    )
    # One round of each paired workload: it runs and verifies, in the time CI has.
    out = f"{session.create_tmp()}/paired.json"
    session.run("python", "benchmarks/paired.py", "--quick", "--rounds", "1", "--out", out)
    # Engine-backed arrays, every peer at small sizes, two repetitions (JAX only where
    # installed): under a minute on 2 cores once MXNet's venv exists (run.py above makes it).
    out = f"{session.create_tmp()}/arrays.json"
    session.run("python", "benchmarks/arrays.py", "--quick", "--out", out)
    # submit and tracing against the core's push: runs and checks its results (seconds).
    out = f"{session.create_tmp()}/paths.json"
    session.run("python", "benchmarks/paths.py", "--quick", "--out", out)
    # Remote arrays against dask.array: 8 chunks, 10 steps, both checked against NumPy
    # (about 10 s, most of it starting the worker processes).
    out = f"{session.create_tmp()}/arrays-cluster.json"
    session.run("python", "benchmarks/arrays_cluster.py", "--quick", "--out", out)


@nox.session
def soak(session: nox.Session) -> None:
    """Long chaos soak: ``nox -s soak -- --minutes N`` (default 10)."""
    session.install("-e", ".", *nox.project.dependency_groups(PYPROJECT, "test"))
    session.run("python", "-m", "tests.soak.run", *session.posargs)


# The property tests that run random programs against a model or a second implementation.
_FUZZED = [
    "tests/test_model.py::TestAgainstSequentialModel",
    "tests/test_var.py::TestBatchForms",
    "tests/test_gpu.py::test_random_programs_event_mode_matches_host_mode_and_the_model",
    "tests/test_engine.py::TestPriority::test_the_loop_queue_matches_a_priority_queue",
    "tests/test_array_chunk_reductions.py::test_random_chains_ending_in_a_reduction_equal_numpy",
    "tests/test_array_differential.py::test_random_program",
    "tests/test_array_differential.py::test_sync_program",
    "tests/core/test_loopqueue.py::TestOrder::test_random_puts_and_pops_match_a_priority_queue",
    "tests/core/test_loopqueue.py::TestUnqueue::"
    "test_random_puts_pops_and_unqueues_match_a_priority_queue",
]


@nox.session
def fuzz(session: nox.Session) -> None:
    """Random programs with fresh seeds: ``nox -s fuzz -- --minutes N`` (default 10).

    CI replays the same examples on every run (the "ci" Hypothesis profile), so it cannot
    find a new race; this session draws new ones (the "fuzz" profile, 1,500 per variant and
    round) until the time is up, and stops at the first failure with the blob that replays it.
    """
    parser = argparse.ArgumentParser(prog="nox -s fuzz --")
    parser.add_argument("--minutes", type=float, default=10.0, help="total duration (10)")
    args, pytest_args = parser.parse_known_args(session.posargs)
    session.install("-e", ".", *nox.project.dependency_groups(PYPROJECT, "test"))
    end = time.monotonic() + args.minutes * 60
    rounds = 0
    while not rounds or time.monotonic() < end:
        rounds += 1
        session.log(f"round {rounds}")
        session.run("pytest", "-q", "-x", "--hypothesis-profile=fuzz", *_FUZZED, *pytest_args)
