"""docs/design.md describes the build that setup.py makes (issue 36: it listed the wrong
compiled modules)."""

from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
# A row of the table in "The compiled core": | `aioengine.x` | ... |
ROW = re.compile(r"^\|\s*`(aioengine(?:\.\w+)+)`\s*\|", re.M)


def compiled_in_setup(name: str = "COMPILED") -> list[str]:
    """setup.py's ``COMPILED`` (or ``NATIVE``), read from its syntax tree: importing setup.py
    would run ``setup()``."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            value = ast.literal_eval(node.value)
            assert isinstance(value, tuple | list), value
            return [str(module) for module in value]
    raise AssertionError(f"setup.py assigns no {name}")


def compiled_in_design() -> list[str]:
    """The modules listed in docs/design.md's section "The compiled core"."""
    text = (ROOT / "docs" / "design.md").read_text()
    start = text.index("\n## The compiled core\n")
    end = text.find("\n## ", start + 1)
    return ROW.findall(text[start : end if end != -1 else len(text)])


def test_the_design_lists_the_modules_setup_compiles() -> None:
    setup, design = compiled_in_setup(), compiled_in_design()
    assert len(set(setup)) == len(setup), setup
    assert sorted(design) == sorted(setup), (
        f"docs/design.md lists {sorted(design)}, setup.py's COMPILED is {sorted(setup)}: "
        "update the table in docs/design.md, 'The compiled core'"
    )


def test_every_compiled_module_is_a_source_file() -> None:
    """setup.py compiles ``name.replace(".", "/") + ".py"``: each name is such a file."""
    missing = [n for n in compiled_in_setup() if not (ROOT / f"{n.replace('.', '/')}.py").is_file()]
    assert missing == []


def test_every_native_module_is_a_pyx_file_the_design_names() -> None:
    """setup.py compiles ``NATIVE`` from ``.pyx`` files with no Python twin; docs/design.md
    says which, and a ``.pyi`` beside each types it for mypy."""
    text = (ROOT / "docs" / "design.md").read_text()
    for name in compiled_in_setup("NATIVE"):
        path = ROOT / name.replace(".", "/")
        assert path.with_suffix(".pyx").is_file(), name
        assert path.with_suffix(".pyi").is_file(), name
        assert not path.with_suffix(".py").exists(), name
        assert f"`{name}`" in text, f"docs/design.md does not name {name}"
