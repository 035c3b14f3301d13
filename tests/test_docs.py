"""Every Python code block in the README and docs/ runs (so the docs cannot rot)."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
BLOCKS = [
    pytest.param(block, id=f"{path.relative_to(ROOT)}:{i}")
    for path in DOCS
    for i, block in enumerate(re.findall(r"```python\n(.*?)```", path.read_text(), re.S))
]


@pytest.mark.parametrize("source", BLOCKS)
def test_code_block_runs(source: str) -> None:
    exec(compile(source, "<doc>", "exec"), {"__name__": "__doc__"})


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
