"""The main job: ``python -m aioengine demo`` runs the pipeline and verifies it.

Also ``bench-demo`` (a random NumPy program checked against a serial run) and ``--help``.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
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
        err = capsys.readouterr().err  # not a terminal: a line per refresh
        assert err.endswith("aioengine: 80/80 operations\n")
        assert "\r" not in err

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

    def test_reports_the_workers_the_engine_uses(
        self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("AIOENGINE_CPU_WORKERS", "1")
        argv = SMALL[:-2]  # no --workers
        assert argv[-1] == "0.001"
        assert main(["demo", *argv, "--no-trace", "--no-progress"]) == 0
        assert " s on 1 CPU worker(s)\n" in capsys.readouterr().out

    def test_on_a_local_dask_cluster(
        self,
        capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch,
        tmp_path: pathlib.Path,
    ) -> None:
        """``--cluster local``: the NumPy stages on the cluster, the same checksum."""
        pytest.importorskip("distributed")
        monkeypatch.chdir(tmp_path)
        args = ["demo", *SMALL, "--no-trace", "--no-progress", "--cluster", "local"]
        assert main(args) == 0
        out = capsys.readouterr().out
        assert "NumPy on the Dask cluster 'local'" in out
        assert "  verified:   " in out

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

    def test_the_header_names_the_workers_the_engine_uses(
        self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Not ``os.cpu_count()`` when ``AIOENGINE_CPU_WORKERS`` says otherwise."""
        monkeypatch.setenv("AIOENGINE_CPU_WORKERS", "1")
        argv = ["--ops", "30", "--vars", "4", "--size", "16", "--no-trace", "--no-progress"]
        assert main(["bench-demo", *argv]) == 0
        out = capsys.readouterr().out
        assert ", seed 0, 1 CPU worker(s)\n" in out
        assert " on 1 thread(s)\n" in out

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

    def test_a_negative_seed_is_rejected_up_front(self) -> None:
        with pytest.raises(ValueError, match=r"seed >= 0, got .*seed=-1$"):
            make_program(50, 5, 4, seed=-1)


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any run fail the test: a rejected argument must stop the command before it."""

    async def forbidden(**kwargs: object) -> None:
        raise AssertionError(f"the run started with {kwargs}")

    monkeypatch.setattr("aioengine.__main__.run_pipeline_demo", forbidden)
    monkeypatch.setattr("aioengine.__main__.run_demo", forbidden)


def _usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``main(argv)``, check it is a usage error that printed nothing else, return stderr."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # not even the header
    assert "usage: aioengine " in captured.err
    return captured.err


def test_help_names_the_command_as_it_was_run(tmp_path: pathlib.Path) -> None:
    """Issue 35: the ``aioengine`` script's ``--help`` said ``usage: python -m aioengine``."""
    bin_dir = pathlib.Path(sys.executable).parent
    script = shutil.which("aioengine", path=str(bin_dir))
    if script is None:
        pytest.skip(f"the aioengine console script is not installed in {bin_dir}")
    runs = {
        "aioengine": [script, "--help"],
        "python -m aioengine": [sys.executable, "-m", "aioengine", "--help"],
    }
    for prog, command in runs.items():
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=_python_env(),
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"usage: {prog} [-h] [--version] command ..."), done.stdout


@pytest.mark.usefixtures("no_work")
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["demo", "--records", "0"], "--records: must be >= 1, got 0", id="records"),
        pytest.param(["demo", "--size", "-2"], "--size: must be >= 1, got -2", id="size"),
        pytest.param(["demo", "--size", "x"], "--size: not an integer: 'x'", id="size-text"),
        pytest.param(
            ["demo", "--latency", "-1000"],
            "--latency: must be a finite number of seconds >= 0, got -1000",
            id="latency-negative",
        ),
        pytest.param(
            ["demo", "--latency", "inf"],
            "--latency: must be a finite number of seconds >= 0, got inf",
            id="latency-inf",
        ),
        pytest.param(
            ["demo", "--latency", "nan"],
            "--latency: must be a finite number of seconds >= 0, got nan",
            id="latency-nan",
        ),
        pytest.param(["demo", "--latency", "soon"], "--latency: not a number", id="latency-text"),
        pytest.param(["demo", "--seed", "-1"], "--seed: must be >= 0, got -1", id="demo-seed"),
        pytest.param(["demo", "--workers", "0"], "--workers: must be >= 1, got 0", id="workers"),
        pytest.param(["bench-demo", "--ops", "0"], "--ops: must be >= 1, got 0", id="ops"),
        pytest.param(["bench-demo", "--vars", "1"], "--vars: must be >= 2, got 1", id="vars"),
        pytest.param(["bench-demo", "--size", "0"], "--size: must be >= 1, got 0", id="bench-size"),
        pytest.param(["bench-demo", "--seed", "-1"], "--seed: must be >= 0, got -1", id="seed"),
        pytest.param(
            ["bench-demo", "--workers", "-1"], "--workers: must be >= 1, got -1", id="bench-workers"
        ),
    ],
)
def test_a_bad_option_is_a_usage_error_before_anything_runs(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _usage_error([*argv, "--no-trace", "--no-progress"], capsys)
    assert f"error: argument {message}" in err
    assert "cpu_workers" not in err  # the option, not the engine's argument


@pytest.mark.usefixtures("no_work")
@pytest.mark.parametrize("command", ["demo", "bench-demo"])
def test_a_bad_worker_setting_in_the_environment_is_a_usage_error(
    command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIOENGINE_CPU_WORKERS", "0")
    err = _usage_error([command, "--no-trace", "--no-progress"], capsys)
    assert "environment variable AIOENGINE_CPU_WORKERS='0' must be >= 1" in err


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


@pytest.mark.usefixtures("no_work")
@pytest.mark.parametrize("command", ["demo", "bench-demo"])
def test_a_directory_as_the_trace_path_fails_before_any_work(
    command: str, capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    """Not an IsADirectoryError once the whole run is done."""
    err = _usage_error([command, "--trace", str(tmp_path), "--no-progress"], capsys)
    assert f"--trace {tmp_path}: {tmp_path} is a directory, not a file" in err


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
