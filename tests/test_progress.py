"""wait_for_all(progress=True): a tqdm bar (a widget in Jupyter with ipywidgets), or a text
line without tqdm."""

from __future__ import annotations

import asyncio
import io
import pathlib
import sys

import pytest

import aioengine as ae
from aioengine.observe import progress

from .conftest import execute_notebook


class Stderr(io.StringIO):
    """A stand-in for ``sys.stderr`` that is, or is not, a terminal."""

    def __init__(self, *, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


async def run(engine: ae.Engine) -> None:
    gate = asyncio.Event()

    async def opener(rctx: ae.RunContext) -> None:
        await asyncio.sleep(progress.INTERVAL * 1.5)  # at least one refresh while pending
        await gate.wait()

    x = engine.new_var("x")
    engine.push_async(opener, mutate_vars=[x])
    for _ in range(3):
        engine.push_sync(lambda r: None, const_vars=[x])
    asyncio.get_running_loop().call_later(progress.INTERVAL * 2, gate.set)
    await engine.wait_for_all(progress=True)


def no_tqdm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make tqdm unimportable (both modules the bar may come from)."""
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    monkeypatch.setitem(sys.modules, "tqdm.std", None)


class TestProgress:
    async def test_tqdm_bar(
        self, threaded_engine: ae.Engine, capsys: pytest.CaptureFixture[str]
    ) -> None:
        pytest.importorskip("tqdm")
        await run(threaded_engine)
        err = capsys.readouterr().err
        assert "aioengine:" in err
        assert "4/4" in err

    async def test_text_fallback_in_a_terminal_rewrites_one_line(
        self, threaded_engine: ae.Engine, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        no_tqdm(monkeypatch)
        err = Stderr(tty=True)
        monkeypatch.setattr(sys, "stderr", err)
        await run(threaded_engine)
        out = err.getvalue()
        assert out.startswith("\raioengine: 0/4 operations\r")
        assert out.endswith("\raioengine: 4/4 operations\n")
        assert out.count("\n") == 1  # one line, rewritten, ended when the bar closes

    async def test_text_fallback_elsewhere_writes_a_line_per_refresh(
        self, threaded_engine: ae.Engine, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        no_tqdm(monkeypatch)
        err = Stderr(tty=False)  # a log file, a pipe, CI output
        monkeypatch.setattr(sys, "stderr", err)
        await run(threaded_engine)
        out = err.getvalue()
        assert "\r" not in out
        assert out.endswith("\n")
        lines = out.splitlines()
        assert lines[0] == "aioengine: 0/4 operations"
        assert lines[-1] == "aioengine: 4/4 operations"
        assert len(lines) == len(set(lines))  # a refresh that changed nothing wrote nothing

    def test_the_bar_is_tqdm_auto_with_ipywidgets(self) -> None:
        pytest.importorskip("ipywidgets")
        tqdm_auto = pytest.importorskip("tqdm.auto")
        bar = progress._make_bar(3)
        try:
            assert type(bar) is tqdm_auto.tqdm  # a widget in a kernel, text in a terminal
        finally:
            bar.close()

    def test_without_ipywidgets_the_bar_is_tqdm_text(
        self, monkeypatch: pytest.MonkeyPatch, recwarn: pytest.WarningsRecorder
    ) -> None:
        """Without ipywidgets, tqdm.auto is not even imported: in a Jupyter kernel it warns
        "IProgress not found" before drawing this same text bar."""
        tqdm_std = pytest.importorskip("tqdm.std")
        monkeypatch.setitem(sys.modules, "ipywidgets", None)  # as if not installed
        monkeypatch.delitem(sys.modules, "tqdm.auto", raising=False)
        bar = progress._make_bar(3)
        try:
            assert type(bar) is tqdm_std.tqdm
            assert "tqdm.auto" not in sys.modules
        finally:
            bar.close()
        assert list(recwarn) == []

    async def test_nothing_pending_shows_no_bar(
        self, threaded_engine: ae.Engine, capsys: pytest.CaptureFixture[str]
    ) -> None:
        await threaded_engine.wait_for_all(progress=True)
        assert capsys.readouterr().err == ""

    async def test_timeout_and_failures(self, threaded_engine: ae.Engine) -> None:
        engine = threaded_engine
        release = asyncio.Event()

        async def waiter(rctx: ae.RunContext) -> None:
            await release.wait()

        op = engine.push_async(waiter, name="waiter")
        with pytest.raises(TimeoutError, match="'waiter'"):
            await engine.wait_for_all(timeout=0.05, progress=True)
        release.set()
        await op

        def boom(rctx: ae.RunContext) -> None:
            raise ValueError("boom")

        engine.push_sync(boom)
        with pytest.raises(BaseExceptionGroup):
            await engine.wait_for_all(progress=True)

    async def test_idle_engine_returns_at_once(self, threaded_engine: ae.Engine) -> None:
        await threaded_engine.wait_for_all(progress=True)


class TestProgressInJupyter:
    def test_the_bar_is_a_widget_in_a_kernel(self, tmp_path: pathlib.Path) -> None:
        """Regression test for #6: the bar was text after "TqdmWarning: IProgress not found".

        tqdm draws its Jupyter widget with ipywidgets, which the ``test`` dependency group
        installs for the notebooks; without it this fails, as the notebooks' outputs did.
        """
        nbformat = pytest.importorskip("nbformat")
        pytest.importorskip("tqdm")
        source = (
            "import aioengine as ae\n"
            "async with ae.Engine(cpu_workers=1) as engine:\n"
            "    engine.push_sync(lambda r: None)\n"
            "    await engine.wait_for_all(progress=True)\n"
        )
        notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
        assert execute_notebook(notebook, tmp_path) == []
        outputs = notebook.cells[0].outputs
        streams = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
        assert "IProgress" not in streams
        widgets = [
            o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
        ]
        assert len(widgets) == 1, outputs

    def test_without_ipywidgets_a_text_bar_and_no_warning(self, tmp_path: pathlib.Path) -> None:
        """Issue 35: a plain install (no ``notebook`` extra) printed "TqdmWarning: IProgress
        not found" in every notebook that showed a bar; now the bar is text, without it."""
        nbformat = pytest.importorskip("nbformat")
        pytest.importorskip("tqdm")
        source = (
            "import sys\n"
            "sys.modules['ipywidgets'] = None  # as if it were not installed\n"
            "import aioengine as ae\n"
            "async with ae.Engine(cpu_workers=1) as engine:\n"
            "    engine.push_sync(lambda r: None)\n"
            "    await engine.wait_for_all(progress=True)\n"
        )
        notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
        assert execute_notebook(notebook, tmp_path) == []
        outputs = notebook.cells[0].outputs
        streams = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
        assert "IProgress" not in streams
        assert "Warning" not in streams
        assert "aioengine: 100%" in streams, outputs
        assert "1/1" in streams, outputs
