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
# Pages whose blocks run as ``__main__``, their ``if __name__ == "__main__":`` part included:
# scripts that need the guard (a multi-process Dask cluster starts its workers by importing the
# main module). Elsewhere a guarded part is only compiled, so that a block may show a server
# that runs until Ctrl-C.
RUN_AS_MAIN = {ROOT / "docs" / "howto" / "cluster.md"}
BLOCKS = [
    pytest.param(
        block, "__main__" if path in RUN_AS_MAIN else "__doc__", id=f"{path.relative_to(ROOT)}:{i}"
    )
    for path in DOCS
    for i, block in enumerate(
        body for lang, body in FENCE.findall(path.read_text()) if lang.strip() == "python"
    )
]


@pytest.mark.parametrize(("source", "name"), BLOCKS)
def test_code_block_runs(source: str, name: str) -> None:
    """A block runs as a script named ``name``; one with top-level ``await`` (a notebook cell)
    on a new loop."""
    code = compile(source, "<doc>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    namespace = {"__name__": name}
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


def test_the_cluster_blocks_are_guarded_scripts() -> None:
    """Issue 35: with ``LocalCluster(processes=True)`` swapped in, a block without the guard
    printed pages of bootstrapping errors (each worker process imports the main module)."""
    text = (ROOT / "docs" / "howto" / "cluster.md").read_text()
    blocks = [body for lang, body in FENCE.findall(text) if lang.strip() == "python"]
    assert blocks
    unguarded = [b for b in blocks if '\nif __name__ == "__main__":\n' not in b]
    assert unguarded == []
    assert ROOT / "docs" / "howto" / "cluster.md" in RUN_AS_MAIN  # the guarded parts run
    assert any("processes=True" in b for b in blocks)
    assert any("ae.BlockingEngine(cluster=" in b for b in blocks)


def test_the_index_and_the_readme_lead_to_every_page() -> None:
    """Issue 35: the docs had no "start here" (README linked neither the index nor getting
    started) and the index's how-to list had fallen behind docs/howto/. (mkdocs.yml's nav is
    checked by ``mkdocs build --strict``, which fails on a page left out of it.)"""
    index = (ROOT / "docs" / "index.md").read_text()
    linked = set(re.findall(r"\]\((howto/[\w.-]+\.md)\)", index))
    pages = {f"howto/{p.name}" for p in (ROOT / "docs" / "howto").glob("*.md")}
    assert pages - linked == set()
    readme = (ROOT / "README.md").read_text()
    assert "(docs/index.md)" in readme
    assert "(docs/getting-started.md)" in readme


def test_readme_opens_with_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text()
    first_block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert first_block is not None
    commands = first_block.group(1).strip().splitlines()
    assert len(commands) == 2
    assert "aioengine demo" in commands[0]
    assert "nox" in commands[1]
    ci = (ROOT / ".ci" / "run").read_text()
    assert commands[1] in ci
    # nox's default session runs every other default check once, in one of two chains.
    assert nox_names("sessions") == [["ci"]]
    chains = nox_names("CHAINS")
    assert len(chains) == 2
    everything = sorted(chains[0] + chains[1])
    assert everything == sorted(set(everything))
    assert set(everything) == {
        "tests",
        "tests_compiled",
        "lint",
        "mypy",
        "docs",
        "examples",
        "bench_smoke",
    }


def test_bench_smoke_never_writes_the_committed_results() -> None:
    """``nox`` (the README's test command) runs bench_smoke: each benchmark it runs writes
    its output to the session's temporary folder (issue 44: a clean clone was left dirty,
    its committed quick-mode figures rewritten); and each one's own ``--quick`` default is
    an ignored folder, not a committed file."""
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    smoke = next(
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name == "bench_smoke"
    )
    scripts = []
    for node in ast.walk(smoke):
        if not (isinstance(node, ast.Call) and ast.unparse(node.func) == "session.run"):
            continue
        args = [a.value for a in node.args if isinstance(a, ast.Constant)]
        script = next((str(a) for a in args if str(a).startswith("benchmarks/")), None)
        if script is None:
            continue
        scripts.append(script)
        assert "--out" in args, f"bench_smoke runs {script} without --out"
        if script == "benchmarks/run.py":
            assert "--png" in args, "bench_smoke runs benchmarks/run.py without --png"
    assert sorted(scripts) == sorted(
        [
            "benchmarks/run.py",
            "benchmarks/paired.py",
            "benchmarks/arrays.py",
            "benchmarks/paths.py",
            "benchmarks/arrays_cluster.py",
        ]
    )
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert "benchmarks/results/quick/" in ignored
    for script in scripts:
        text = (ROOT / script).read_text()
        assert '"quick"' in text, f"{script}: --quick has no default of its own"


def nox_names(target: str) -> list[list[str]]:
    """The literal assigned to ``target`` (a name or ``nox.options.<name>``) in noxfile.py,
    as a list of lists (read, not imported: nox is not a test need)."""
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            t = node.targets[0]
            name = t.attr if isinstance(t, ast.Attribute) else getattr(t, "id", None)
            if name == target:
                value = ast.literal_eval(node.value)
                return [value] if value and isinstance(value[0], str) else list(value)
    raise AssertionError(f"noxfile.py assigns no {target}")


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
