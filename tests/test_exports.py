"""The public names: exactly what ``__all__`` lists, each documented."""

from __future__ import annotations

import inspect

import aioengine as ae


def test_all_is_a_sorted_tuple_of_existing_names() -> None:
    assert isinstance(ae.__all__, tuple)
    assert len(set(ae.__all__)) == len(ae.__all__)
    for name in ae.__all__:
        assert hasattr(ae, name), name


def test_no_public_name_is_missing_from_all() -> None:
    public = {
        name
        for name, value in vars(ae).items()
        if not name.startswith("_") and not inspect.ismodule(value)
    }
    assert public == set(ae.__all__)


def test_every_public_name_and_method_has_a_docstring() -> None:
    for name in ae.__all__:
        obj = getattr(ae, name)
        assert inspect.getdoc(obj), name
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                documented = callable(member) or isinstance(member, property)
                if attr.startswith("_") or not documented:
                    continue
                assert inspect.getdoc(member), f"{name}.{attr}"


def test_errors_derive_from_engine_error() -> None:
    for exc in (
        ae.EngineClosedError,
        ae.DependencyError,
        ae.VarDeletedError,
        ae.OperatorDeletedError,
        ae.DeviceUnavailableError,
    ):
        assert issubclass(exc, ae.EngineError)
    assert issubclass(ae.EngineError, Exception)


def test_the_wheel_lists_every_subpackage() -> None:
    """pyproject.toml lists the packages explicitly: a new subpackage missing from the list
    would be missing from the wheel users install (the editable install hides it)."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    listed = set(
        tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join(init.parent.relative_to(root).parts)
        for init in (root / "aioengine").rglob("__init__.py")
    }
    assert found == listed
