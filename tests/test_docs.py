"""Every Python code block in the README and docs/ runs (so the docs cannot rot)."""

from __future__ import annotations

import ast
import asyncio
import inspect
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
FENCE = re.compile(r"^[ \t]*```([^\n`]*)\n(.*?)^[ \t]*```[ \t]*$", re.S | re.M)
# Languages of blocks that are not run: shell commands, diagrams, output and C++ listings.
NOT_RUN = {"bash", "text", "mermaid"}
BLOCKS = [
    pytest.param(block, id=f"{path.relative_to(ROOT)}:{i}")
    for path in DOCS
    for i, block in enumerate(
        body for lang, body in FENCE.findall(path.read_text()) if lang.strip() == "python"
    )
]


@pytest.mark.parametrize("source", BLOCKS)
def test_code_block_runs(source: str) -> None:
    """A block runs as a script; one with top-level ``await`` (a notebook cell) on a new loop."""
    code = compile(source, "<doc>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    namespace = {"__name__": "__doc__"}
    if code.co_flags & inspect.CO_COROUTINE:
        asyncio.run(eval(code, namespace))
    else:
        exec(code, namespace)


def test_no_block_escapes_the_runner() -> None:
    """Every fence is Python (run above) or a language that is not code to run.

    Python written in a ``text`` fence (or in ``py``, ``pycon``...) would not be run, so it
    could rot unseen: a Python listing must use a ``python`` fence.
    """
    escaped = []
    for path in DOCS:
        for lang, body in FENCE.findall(path.read_text()):
            lang = lang.strip()
            looks_like_python = re.search(r"^\W*(import aioengine|await |async with )", body, re.M)
            if lang != "python" and (lang not in NOT_RUN or looks_like_python):
                escaped.append(f"{path.relative_to(ROOT)}: ```{lang}\n{body[:80]}")
    assert escaped == []


def test_readme_opens_with_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text()
    first_block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert first_block is not None
    commands = first_block.group(1).strip().splitlines()
    assert len(commands) == 2
    assert "aioengine demo" in commands[0]
    assert "nox" in commands[1]
    # CI runs the second command: its setup as written, then nox's default sessions, split
    # by .ci/run into two chains that run at once (one per core), each session exactly once.
    setup, _, run = commands[1].rpartition(" && ")
    assert run == ".venv/bin/nox"
    ci = (ROOT / ".ci" / "run").read_text()
    assert setup in ci
    chains = [c.split() for c in re.findall(r"^chain_[ab]=\(([^)]*)\)$", ci, re.M)]
    assert len(chains) == 2
    assert sorted(chains[0] + chains[1]) == sorted(nox_default_sessions())


def nox_default_sessions() -> list[str]:
    """``nox.options.sessions`` in noxfile.py (read, not imported: nox is not a test need)."""
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Attribute)
            and node.targets[0].attr == "sessions"
        ):
            sessions: list[str] = ast.literal_eval(node.value)
            return sessions
    raise AssertionError("noxfile.py sets no nox.options.sessions")


# Every call of MXNet's engine API (include/mxnet/engine.h, its C API and Python module, and
# the settings that change the engine): docs/mxnet.md must map each of them to its aioengine
# equivalent (or say there is none).
MXNET_CALLS = [
    "Engine::Get()",
    "_GetSharedRef",
    "NewVariable",
    "Var::version",
    "PushSync",
    "PushAsync",
    "CallbackOnComplete",
    "CreateCallback",
    "CallbackOnStart",
    "NewOperator",
    "Push(opr",
    "DeleteOperator",
    "DeleteVariable",
    "DeduplicateVarHandle",
    "WaitForVar",
    "WaitForAll",
    "Throw(var)",
    "NotifyShutdown",
    "~Engine()",
    "Stop()",
    "Start()",
    "bulk_size()",
    "set_bulk_size",
    "opr_name",
    "RunContext",
    "Context::CPU",
    "Context::GPU",
    *("kNormal", "kCopyFromGPU", "kCopyToGPU", "kCPUPrioritized", "kAsync", "kDeleteVar"),
    *("kGPUPrioritized", "kNoSkip"),
    *("MXEnginePushSync", "MXEnginePushAsync", "MXEngineSetBulkSize"),
    *("MXNDArrayWaitToRead", "MXNDArrayWaitToWrite", "MXNDArrayWaitAll"),
    *("MXNET_ENGINE_TYPE=NaiveEngine", "MXNET_ENGINE_TYPE=ThreadedEnginePerDevice"),
    *("MXNET_ENGINE_TYPE=ThreadedEngine`", "MXNET_ENGINE_INFO", "MXNET_CPU_WORKER_NTHREADS"),
    *("MXNET_CPU_PRIORITY_NTHREADS", "MXNET_GPU_WORKER_NTHREADS", "MXNET_GPU_PRIORITY_NTHREADS"),
    *("MXNET_GPU_COPY_NTHREADS", "MXNET_GPU_WORKER_NSTREAMS", "MXNET_MP_WORKER_NTHREADS"),
    *("MXNET_EXEC_BULK_EXEC", "MXNET_OMP_MAX_THREADS", "MXNET_PROFILER"),
]


def test_the_mxnet_page_maps_every_engine_call() -> None:
    table = [
        line.split(" | ")[0]
        for line in (ROOT / "docs" / "mxnet.md").read_text().splitlines()
        if line.startswith("| ")
    ]
    missing = [call for call in MXNET_CALLS if not any(call in row for row in table)]
    assert missing == []
