"""Every example runs as a script, with the small sizes CI uses."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

import aioengine as ae
from aioengine.pipeline import STAGES

from .test_pipeline import tracks_of

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs(path: pathlib.Path, tmp_path: pathlib.Path) -> None:
    if path.stem in ("crawler", "downloads", "service"):
        pytest.importorskip("aiohttp")
    if path.stem == "cluster":
        pytest.importorskip("distributed")
    env = {**os.environ, "AIOENGINE_EXAMPLE_SMALL": "1"}
    args = [str(tmp_path / "trace.json")] if path.stem == "pipeline" else []
    done = subprocess.run(
        [sys.executable, str(path), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()
    if path.stem == "pipeline":
        assert done.stdout.startswith("24 records through read -> decode -> transform")
        assert "120/120" in done.stderr  # the progress bar (tqdm's, or the text line without it)
        tracks = tracks_of(json.loads((tmp_path / "trace.json").read_text()))
        assert set(tracks) == set(STAGES)
    if path.stem == "crawler":
        assert "(politeness: 1)" in done.stdout
    if path.stem == "cluster":
        assert "matches the local computation" in done.stdout
    if path.stem == "downloads":
        assert "as the sequential program's" in done.stdout
    if path.stem == "arrays":
        assert "match NumPy" in done.stdout
    if path.stem == "service":
        assert "money conserved" in done.stdout
    if path.stem == "gpu_pipeline":
        assert "results match NumPy" in done.stdout
        if not ae.gpu_available():
            assert "running on the simulated GPU" in done.stdout.splitlines()[0]


def test_the_expected_examples_exist() -> None:
    expected = {
        "quickstart",
        "crawler",
        "training",
        "pipeline",
        "gpu_pipeline",
        "cluster",
        "downloads",
        "arrays",
        "service",
    }
    assert expected <= {p.stem for p in EXAMPLES}


def test_service_with_flags_refuses_and_bounds(tmp_path: pathlib.Path) -> None:
    """examples/service.py with its size flags: tiny balances make refusals (ae.Abort)
    common, max_pending 3 makes the handlers wait for room, and money is still conserved."""
    pytest.importorskip("aiohttp")
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "service.py"),
            *("--accounts", "5", "--clients", "8", "--requests", "15"),
            *("--balance", "4", "--max-pending", "3", "--seed", "1"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("bank of 5 accounts x 4 = 20; 8 clients x 15 requests")
    assert lines[1].startswith("120 requests in ")
    assert "p99" in lines[1]
    refused = int(lines[2].split(" transfers, ")[1].split(" refused")[0])
    assert refused > 0
    assert "at most 3 operations pending (max_pending=3)" in lines[2]
    assert lines[3] == "money conserved: 20 == 20, at every audit and after aclose()"
