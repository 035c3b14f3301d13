"""The main job: ``python -m aioengine demo`` runs real work and verifies it."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from aioengine.__main__ import main
from aioengine.demo import make_program, run_demo


def test_demo_prints_what_ran(capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    trace = tmp_path / "demo.json"
    argv = ["demo", "--ops", "60", "--vars", "8", "--size", "32", "--workers", "2"]
    assert main([*argv, "--trace", str(trace)]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "60 NumPy ops over 8 arrays" in out
    assert "verified: all 8 arrays bit-identical to the serial run" in out
    assert "parallelism" in out
    assert f"trace:    {trace}" in out
    assert "ui.perfetto.dev" in out
    names = {e.get("name") for e in json.loads(trace.read_text())["traceEvents"]}
    assert "upload" in names
    assert "60/60" in captured.err  # the progress bar


def test_demo_without_trace_or_progress(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    monkeypatch.chdir(tmp_path)
    argv = ["demo", "--ops", "20", "--vars", "4", "--size", "8", "--no-trace", "--no-progress"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "trace:" not in captured.out
    assert captured.err == ""
    assert list(tmp_path.iterdir()) == []


def test_demo_rejects_bad_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["demo", "--ops", "0"])
    assert info.value.code == 2
    assert "need n_ops >= 1" in capsys.readouterr().err


def test_help_lists_the_commands() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "aioengine", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "demo" in out


async def test_threaded_and_serial_runs_agree() -> None:
    threaded, serial = await run_demo(n_ops=80, n_vars=6, size=16, seed=3, workers=2)
    assert threaded.ops == serial.ops == 80
    assert all(np.array_equal(a, b) for a, b in zip(threaded.arrays, serial.arrays, strict=True))
    assert threaded.uploads == serial.uploads > 0


def test_programs_are_seeded() -> None:
    assert make_program(50, 5, 4, seed=1) == make_program(50, 5, 4, seed=1)
    assert make_program(50, 5, 4, seed=1) != make_program(50, 5, 4, seed=2)
