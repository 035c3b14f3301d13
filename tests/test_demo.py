"""The main job: ``python -m aioengine demo`` runs the pipeline and verifies it.

Also ``bench-demo`` (a random NumPy program checked against a serial run) and ``--help``.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

import aioengine
from aioengine.__main__ import main
from aioengine.demo import make_program, run_demo, run_pipeline_demo
from aioengine.pipeline import STAGES, PipelineSummary

from .test_pipeline import tracks_of

SMALL = ["--records", "16", "--size", "16", "--latency", "0.001", "--workers", "2"]


def _python_env() -> dict[str, str]:
    """The environment for a child ``python -m aioengine``: it imports this aioengine."""
    root = str(pathlib.Path(aioengine.__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root if not path else os.pathsep.join([root, path])}


class TestDemo:
    def test_prints_the_summary_and_writes_the_trace(
        self, capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
    ) -> None:
        trace = tmp_path / "demo.json"
        assert main(["demo", *SMALL, "--trace", str(trace)]) == 0
        captured = capsys.readouterr()
        out = captured.out
        assert out.startswith("aioengine ")
        assert "demo: 16 records of 16x16 floats, seed 0, through\n" in out
        assert "  read -> decode -> transform -> upload -> reduce\n" in out
        assert "  engine:     16 records (80 operations) in " in out
        assert " s on 2 CPU worker(s)\n" in out
        assert "records/s, " in out
        assert "  checksum:   " in out
        assert "  sequential: " in out
        assert (
            "  verified:   checksum and uploaded bytes bit-identical to the sequential run" in out
        )
        assert f"  trace:      {trace}\n" in out
        assert "https://ui.perfetto.dev" in out
        assert "chrome://tracing" in out
        # one track per worker thread that ran an operation: tiny records may leave one idle
        assert re.search(
            r"\b[12] worker-thread track\(s\) \(decode, transform\), \d+ coroutine", out
        )
        assert "80/80" in captured.err  # the progress bar
        tracks = tracks_of(json.loads(trace.read_text()))
        assert tracks["read"] == tracks["upload"] == {"coroutine ops"}
        assert tracks["decode"] | tracks["transform"] <= {"aioengine-cpu0_0", "aioengine-cpu0_1"}
        assert tracks["reduce"] == {"event loop"}

    def test_without_trace_or_progress(
        self,
        capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch,
        tmp_path: pathlib.Path,
    ) -> None:
        monkeypatch.chdir(tmp_path)
        assert main(["demo", *SMALL, "--no-trace", "--no-progress"]) == 0
        captured = capsys.readouterr()
        assert "  verified:   " in captured.out
        assert "trace:" not in captured.out
        assert captured.err == ""
        assert list(tmp_path.iterdir()) == []

    def test_progress_without_tqdm(
        self,
        capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # import fails: the text bar
        assert main(["demo", *SMALL, "--no-trace"]) == 0
        assert capsys.readouterr().err.endswith("\raioengine: 80/80 operations\n")

    def test_a_mismatch_fails_the_run(
        self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        async def wrong(**kwargs: object) -> PipelineSummary:
            return PipelineSummary(records=16, checksum=0.0, uploaded_bytes=0)

        monkeypatch.setattr("aioengine.demo.run_sequential", wrong)
        assert main(["demo", *SMALL, "--no-trace", "--no-progress"]) == 1
        captured = capsys.readouterr()
        assert "verified" not in captured.out
        assert captured.err.startswith("  MISMATCH:   the engine computed PipelineSummary(")

    @pytest.mark.parametrize(
        ("argv", "message"),
        [
            pytest.param(["--records", "0"], "need records >= 1", id="records"),
            pytest.param(["--latency", "-1"], "need records >= 1", id="latency"),
            pytest.param(["--workers", "0"], "cpu_workers must be >= 1", id="workers"),
        ],
    )
    def test_rejects_bad_options(
        self, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
    ) -> None:
        with pytest.raises(SystemExit) as info:
            main(["demo", "--no-trace", "--no-progress", *argv])
        assert info.value.code == 2
        assert message in capsys.readouterr().err

    def test_runs_as_a_module(self, tmp_path: pathlib.Path) -> None:
        done = subprocess.run(
            [sys.executable, "-m", "aioengine", "demo", *SMALL],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=_python_env(),
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert "  verified:   " in done.stdout
        trace = tmp_path / "aioengine-demo.trace.json"
        assert f"  trace:      {trace}\n" in done.stdout
        assert set(tracks_of(json.loads(trace.read_text()))) == set(STAGES)

    async def test_report(self) -> None:
        report = await run_pipeline_demo(records=6, size=4, io_latency=0.0, seed=5, workers=2)
        assert report.verified
        assert report.summary == report.sequential
        assert report.summary.records == 6
        assert report.workers == 2
        assert report.tracks == ()
        assert report.wall_s > 0
        assert report.sequential_wall_s > 0


class TestBenchDemo:
    def test_prints_what_ran(
        self, capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
    ) -> None:
        trace = tmp_path / "bench.json"
        argv = ["bench-demo", "--ops", "60", "--vars", "8", "--size", "32", "--workers", "2"]
        assert main([*argv, "--trace", str(trace)]) == 0
        captured = capsys.readouterr()
        out = captured.out
        assert "bench-demo: 60 NumPy ops over 8 arrays" in out
        assert "verified: all 8 arrays bit-identical to the serial run" in out
        assert "parallelism" in out
        assert f"trace:    {trace}" in out
        assert "ui.perfetto.dev" in out
        names = {e.get("name") for e in json.loads(trace.read_text())["traceEvents"]}
        assert "upload" in names
        assert "60/60" in captured.err  # the progress bar

    def test_without_trace_or_progress(
        self,
        capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch,
        tmp_path: pathlib.Path,
    ) -> None:
        monkeypatch.chdir(tmp_path)
        argv = ["--ops", "20", "--vars", "4", "--size", "8", "--no-trace", "--no-progress"]
        assert main(["bench-demo", *argv]) == 0
        captured = capsys.readouterr()
        assert "trace:" not in captured.out
        assert captured.err == ""
        assert list(tmp_path.iterdir()) == []

    def test_rejects_bad_sizes(self, capsys: pytest.CaptureFixture[str]) -> None:
        with pytest.raises(SystemExit) as info:
            main(["bench-demo", "--ops", "0"])
        assert info.value.code == 2
        assert "need n_ops >= 1" in capsys.readouterr().err

    async def test_threaded_and_serial_runs_agree(self) -> None:
        threaded, serial = await run_demo(n_ops=80, n_vars=6, size=16, seed=3, workers=2)
        assert threaded.ops == serial.ops == 80
        assert all(
            np.array_equal(a, b) for a, b in zip(threaded.arrays, serial.arrays, strict=True)
        )
        assert threaded.uploads == serial.uploads > 0

    def test_programs_are_seeded(self) -> None:
        assert make_program(50, 5, 4, seed=1) == make_program(50, 5, 4, seed=1)
        assert make_program(50, 5, 4, seed=1) != make_program(50, 5, 4, seed=2)


@pytest.mark.parametrize("command", ["demo", "bench-demo"])
def test_an_unwritable_trace_path_fails_before_any_work(
    command: str, capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    """The run is not made and then lost to a traceback when the trace cannot be written."""
    trace = tmp_path / "missing" / "run.json"
    with pytest.raises(SystemExit) as info:
        main([command, "--trace", str(trace), "--no-progress"])
    assert info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"--trace {trace}: cannot write to directory {trace.parent}" in captured.err


def test_help_lists_the_commands() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "aioengine", "--help"],
        capture_output=True,
        text=True,
        env=_python_env(),
        check=True,
    ).stdout
    commands = out.split("positional arguments:")[1]
    assert re.search(r"^ +demo +the showcase: a traced read/decode/transform", commands, re.M)
    assert re.search(r"^ +bench-demo\s+a random NumPy program", commands, re.M)
