"""Development sessions: ``nox`` runs lint, mypy and the tests (what CI runs)."""

from __future__ import annotations

import glob
import os

import nox

nox.needs_version = ">=2025.02.09"
nox.options.sessions = ["lint", "mypy", "examples", "docs", "bench_smoke", "tests"]
nox.options.reuse_venv = "yes"

PYPROJECT = nox.project.load_toml("pyproject.toml")


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite on asyncio and uvloop, with coverage (GPU tests skip without CuPy)."""
    session.install("-e", ".", *nox.project.dependency_groups(PYPROJECT, "test"))
    args = session.posargs or [
        "--cov=aioengine",
        "--cov-report=term-missing:skip-covered",
        "--cov-fail-under=90",
    ]
    session.run("pytest", *args)


@nox.session
def lint(session: nox.Session) -> None:
    """Check style and formatting with ruff."""
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def mypy(session: nox.Session) -> None:
    """Type-check the package (strict) and this noxfile."""
    session.install("-e", ".", *nox.project.dependency_groups(PYPROJECT, "lint"))
    session.run("mypy", "--strict", "aioengine", "tests/test_typing.py")
    session.run("mypy", "noxfile.py")


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
    Then benchmarks/gpu_overlap.py measures GPU copy/compute overlap (JSON, ``--quick`` passed
    on; it reports itself skipped without CuPy and a CUDA device).
    """
    session.install("-e", ".", *nox.project.dependency_groups(PYPROJECT, "bench"))
    session.run("python", "benchmarks/run.py", *session.posargs)
    session.run("python", "benchmarks/gpu_overlap.py", *{"--quick"} & set(session.posargs))


@nox.session
def bench_smoke(session: nox.Session) -> None:
    """The benchmark's smoke mode (CI): every peer runs and verifies; timings are not judged."""
    session.install("-e", ".", *nox.project.dependency_groups(PYPROJECT, "bench"))
    session.run("python", "benchmarks/run.py", "--quick", *session.posargs)


@nox.session
def soak(session: nox.Session) -> None:
    """Long chaos soak: ``nox -s soak -- --minutes N`` (default 10)."""
    session.install("-e", ".", *nox.project.dependency_groups(PYPROJECT, "test"))
    session.run("python", "-m", "tests.soak.run", *session.posargs)
