"""aioengine/_blocking_generated.py is what tools/gen_blocking.py writes from engine.py today.

BlockingEngine's mirrored methods (new_var, the pushes, op, the waits) are generated from the
Engine's signatures, so they cannot drift from them unseen: a change to a mirrored Engine
method without regenerating fails here, with the command that regenerates.
"""

from __future__ import annotations

import importlib.util
import inspect
import pathlib
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest

import aioengine as ae

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "gen_blocking.py"


@pytest.fixture(scope="module")
def gen() -> Iterator[ModuleType]:
    """tools/gen_blocking.py, loaded from its file (tools/ is not a package)."""
    spec = importlib.util.spec_from_file_location("gen_blocking", TOOL)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def test_the_generated_module_is_current(gen: ModuleType) -> None:
    expected = gen.generate()
    current = gen.TARGET.read_text()
    assert current == expected, (
        "aioengine/_blocking_generated.py is stale (engine.py or tools/gen_blocking.py "
        f"changed since it was written): regenerate it with `{gen.COMMAND}`"
    )


def test_a_changed_engine_signature_makes_it_stale(
    gen: ModuleType, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The check can fail: a new keyword on Engine.push_sync changes the generated text."""
    source = gen.SOURCE.read_text()
    old = "        name: str | None = None,\n    ) -> Operation[T]:\n"
    # push_sync's last parameter (push_sync_wait's, later, is not mirrored)
    assert source.index("    def push_sync(") < source.index(old) < source.index("def push_async(")
    changed = source.replace(old, old.replace("= None,\n", "= None,\n        tag: int = 0,\n"), 1)
    text = gen.generate(changed)
    assert text != gen.generate(source)
    assert "        tag: int = 0,\n    ) -> concurrent.futures.Future[T]:" in text
    # (the call may be wrapped over lines: compare with whitespace collapsed)
    assert "prop=prop, priority=priority, name=name, tag=tag" in " ".join(text.split())
    # --check says so, and how to fix it, without writing.
    target = tmp_path / "_blocking_generated.py"
    target.write_text(text)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gen, "TARGET", target)
        mp.setattr(gen, "ROOT", tmp_path)
        assert gen.main(["--check"]) == 1
        assert target.read_text() == text
    assert gen.COMMAND in capsys.readouterr().err


def test_either_name_of_the_decorator_type_generates_the_same_file(gen: ModuleType) -> None:
    """engine.py may annotate op's decorator overload with its own name for the protocol
    (``_OpDecorator``) or with ``OpDecorator[Operation[Any]]`` (ergonomic.py): the
    generator reads both as the one protocol, so either edit leaves the file current."""
    source = gen.SOURCE.read_text()
    alias, direct = "    ) -> _OpDecorator: ...\n", "    ) -> OpDecorator[Operation[Any]]: ...\n"
    assert source.count(alias) + source.count(direct) == 1
    other = source.replace(alias, direct) if alias in source else source.replace(direct, alias)
    assert other != source
    assert gen.generate(other) == gen.generate(source)


def test_a_missing_engine_method_is_an_error(gen: ModuleType) -> None:
    source = gen.SOURCE.read_text().replace("    def delete_operator(", "    def retire(")
    with pytest.raises(gen.GenerateError, match="delete_operator"):
        gen.generate(source)


def _parameters(fn: object) -> list[tuple[str, object, object, object]]:
    sig = inspect.signature(fn)  # type: ignore[arg-type]
    return [(p.name, p.kind, p.default, p.annotation) for p in sig.parameters.values()]


@pytest.mark.parametrize(
    "name",
    [
        "new_var",
        "new_operator",
        "delete_operator",
        "push_sync",
        "push_async",
        "push",
        "delete_var",
        "submit",
        "op",
        "wait_for_var",
        "wait_for_all",
    ],
)
def test_blocking_methods_take_the_engines_parameters(gen: ModuleType, name: str) -> None:
    """At run time too (inspect.signature, what an IDE shows): same names, kinds, defaults
    and annotations; only the result differs, as MIRRORED says."""
    assert name in gen.MIRRORED
    engine, blocking = getattr(ae.Engine, name), getattr(ae.BlockingEngine, name)
    assert _parameters(blocking) == _parameters(engine)
    summary = (inspect.getdoc(engine) or "").split("\n\n")[0]
    assert (inspect.getdoc(blocking) or "").startswith(summary)
    assert not inspect.iscoroutinefunction(blocking)
    returns = inspect.signature(blocking).return_annotation
    kind = gen.KINDS[gen.MIRRORED[name].kind]
    if kind.futures:
        assert "concurrent.futures.Future" in returns or returns == "Any"
    else:
        assert returns == inspect.signature(engine).return_annotation
