"""``await engine.wait_for_all(progress=True)``: a progress bar of finished vs pushed operations.

The bar is ``tqdm.auto.tqdm`` (a widget in Jupyter, text in a terminal) where ipywidgets is
installed (the ``notebook`` extra), else ``tqdm.std.tqdm`` (text everywhere): ``tqdm.auto`` in
a Jupyter kernel without ipywidgets warns "IProgress not found" before printing that same text
bar, and the warning only says to install an optional package. tqdm is a dependency of
aioengine, and where it is missing anyway a plain ``done/total`` line goes to stderr
(:class:`_TextBar`). Its total is the number of operations pending when the wait started plus
those pushed while it runs, so it grows when more work arrives. It is refreshed every
:data:`INTERVAL` seconds from the engine's counters; the operations themselves pay nothing.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from typing import TYPE_CHECKING, Any, Protocol

from .stats import finished_total

if TYPE_CHECKING:
    from . import Observed

__all__ = ("INTERVAL", "drain_with_progress")

INTERVAL = 0.1  # seconds between refreshes


class _Bar(Protocol):
    total: Any
    n: Any

    def refresh(self) -> Any: ...
    def close(self) -> Any: ...


class _TextBar:
    """The fallback without tqdm: ``aioengine: 3/10 operations`` on stderr.

    In a terminal the line is rewritten in place: each refresh starts with a carriage return,
    and closing ends the line. Anywhere else (a log file, a pipe, CI output) carriage returns
    would pile every refresh onto one line, so each refresh is a line of its own, ending with
    a newline; a refresh that would repeat the previous line writes nothing, so a long wait
    does not fill the log with copies.
    """

    def __init__(self, total: int) -> None:
        self.total = total
        self.n = 0
        self._stream = sys.stderr
        self._tty = _isatty(self._stream)
        self._last: str | None = None  # the line written last (not a terminal)

    def refresh(self) -> None:
        line = f"aioengine: {self.n}/{self.total} operations"
        if self._tty:
            self._stream.write(f"\r{line}")
        elif line != self._last:
            self._last = line
            self._stream.write(f"{line}\n")
        else:
            return
        self._stream.flush()

    def close(self) -> None:
        self.refresh()
        if self._tty:
            self._stream.write("\n")
            self._stream.flush()


def _isatty(stream: Any) -> bool:
    """Whether ``stream`` is a terminal (False for a stream without ``isatty`` or closed)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _widgets() -> bool:
    """Whether ipywidgets can be imported (looked up, not imported: it is large)."""
    try:
        return importlib.util.find_spec("ipywidgets") is not None
    except (ImportError, ValueError):  # ValueError: a module in sys.modules without a spec
        return False


def _make_bar(total: int) -> _Bar:
    try:
        if _widgets():
            from tqdm.auto import tqdm  # the widget in a Jupyter kernel, text elsewhere
        else:  # text everywhere, without tqdm.auto's "IProgress not found" in a kernel
            from tqdm.std import tqdm
    except ImportError:
        return _TextBar(total)
    bar: _Bar = tqdm(total=total, unit="op", desc="aioengine", leave=True)
    return bar


async def drain_with_progress(engine: Observed, timeout: float | None) -> None:  # noqa: ASYNC109
    """``engine._drained(timeout)`` while showing a progress bar."""
    core = engine._core  # read only (scheduler.py: the read-only API for observers)
    with core.lock:
        base = finished_total(engine)
        total = len(core.live)
    if not total:  # nothing to show: a bar of 0 operations is noise
        await engine._drained(timeout)
        return
    bar = _make_bar(total)
    drained = asyncio.ensure_future(engine._drained(None))
    try:
        async with asyncio.timeout(timeout):
            while True:
                done, _ = await asyncio.wait({drained}, timeout=INTERVAL)
                with core.lock:
                    finished = finished_total(engine) - base
                    pending = len(core.live)
                bar.total = max(bar.total, finished + pending)
                bar.n = finished
                bar.refresh()
                if done:
                    drained.result()
                    return
    finally:
        drained.cancel()  # no-op when done; else its waiter is removed as it unwinds
        bar.close()
