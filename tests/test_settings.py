"""Settings: argument, else environment variable, else default; bad values fail in Engine()."""

from __future__ import annotations

import os

import pytest

import aioengine as ae


class TestSettings:
    def test_defaults(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name in ("AIOENGINE_CPU_WORKERS", "AIOENGINE_CPU_PRIORITY_WORKERS", "AIOENGINE_SERIAL"):
            monkeypatch.delenv(name, raising=False)
        engine = ae.Engine()
        assert engine.cpu_workers == (os.cpu_count() or 1)
        assert engine.cpu_priority_workers == min(4, os.cpu_count() or 1)
        assert engine.serial is False

    def test_environment(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("AIOENGINE_CPU_WORKERS", "3")
        monkeypatch.setenv("AIOENGINE_CPU_PRIORITY_WORKERS", " 5 ")
        monkeypatch.setenv("AIOENGINE_SERIAL", "yes")
        engine = ae.Engine()
        assert (engine.cpu_workers, engine.cpu_priority_workers, engine.serial) == (3, 5, True)

    def test_arguments_win_over_environment(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("AIOENGINE_CPU_WORKERS", "not a number")
        monkeypatch.setenv("AIOENGINE_SERIAL", "1")
        engine = ae.Engine(cpu_workers=2, serial=False)
        assert (engine.cpu_workers, engine.serial) == (2, False)

    def test_empty_environment_variable_means_unset(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("AIOENGINE_SERIAL", "")
        monkeypatch.setenv("AIOENGINE_CPU_WORKERS", "")
        engine = ae.Engine()
        assert engine.serial is False
        assert engine.cpu_workers == (os.cpu_count() or 1)

    @pytest.mark.parametrize(
        ("env", "value", "match"),
        [
            ("AIOENGINE_CPU_WORKERS", "two", r"^environment variable AIOENGINE_CPU_WORKERS='two'"),
            ("AIOENGINE_CPU_WORKERS", "0", r"^environment variable AIOENGINE_CPU_WORKERS='0'"),
            (
                "AIOENGINE_CPU_PRIORITY_WORKERS",
                "-1",
                r"^environment variable AIOENGINE_CPU_PRIORITY_WORKERS='-1'",
            ),
            ("AIOENGINE_SERIAL", "maybe", r"^environment variable AIOENGINE_SERIAL='maybe'"),
        ],
    )
    def test_bad_environment_names_the_variable(
        self, monkeypatch: pytest.MonkeyPatch, env: str, value: str, match: str
    ) -> None:
        monkeypatch.setenv(env, value)
        with pytest.raises(ValueError, match=match):
            ae.Engine()

    @pytest.mark.parametrize(
        ("kwargs", "match"),
        [
            ({"cpu_workers": 0}, r"^cpu_workers must be >= 1"),
            ({"cpu_workers": "2"}, r"^cpu_workers must be an int"),
            ({"cpu_workers": True}, r"^cpu_workers must be an int"),
            ({"cpu_priority_workers": 1.5}, r"^cpu_priority_workers must be an int"),
            ({"serial": 1}, r"^serial must be True, False or None"),
            ({"watchdog": 10**400}, r"^watchdog must be a finite number of seconds > 0"),
        ],
    )
    def test_bad_argument_names_it(self, kwargs: dict[str, object], match: str) -> None:
        with pytest.raises(ValueError, match=match):
            ae.Engine(**kwargs)  # type: ignore[arg-type]
