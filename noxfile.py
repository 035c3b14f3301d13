"""Development sessions: ``nox`` runs lint, mypy and the tests (what CI runs)."""

from __future__ import annotations

import glob

import nox

nox.needs_version = ">=2025.02.09"
nox.options.sessions = ["lint", "mypy", "tests", "examples"]
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
    """Run every example script and the demo with small sizes."""
    session.install("-e", ".")
    for path in sorted(glob.glob("examples/*.py")):
        session.run("python", path, env={"AIOENGINE_EXAMPLE_SMALL": "1"})
    session.run("python", "-m", "aioengine", "demo", "--ops", "120", "--size", "64")
