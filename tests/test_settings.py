"""Settings: argument, else environment variable, else default; bad values fail in Engine()."""

from __future__ import annotations

import os

import numpy as np
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

    @pytest.mark.parametrize(
        ("kwargs", "match"),
        [
            (
                {"cpu_workers": True},
                r"^cpu_workers must be an int >= 1 or None, got True \(bool\)$",
            ),
            (
                {"max_pending": 2.0},
                r"^max_pending must be an int >= 1 or None, got 2\.0 \(float\)$",
            ),
            (
                {"watchdog": "5"},
                r"^watchdog must be a number of seconds > 0 or None, got '5' \(str\)$",
            ),
        ],
    )
    def test_bad_type_is_named(self, kwargs: dict[str, object], match: str) -> None:
        with pytest.raises(ValueError, match=match):
            ae.Engine(**kwargs)  # type: ignore[arg-type]


class TestNumpyNumbers:
    """Any integer (``numbers.Integral``: NumPy's too, never a bool) is an integer setting,
    and any real number (``numbers.Real``) a number of seconds."""

    def test_integer_settings(self) -> None:
        engine = ae.Engine(
            cpu_workers=np.int64(3),
            cpu_priority_workers=np.uint8(2),
            max_pending=np.int32(5),
            gpu_max_inflight=np.int16(4),
        )
        assert (engine.cpu_workers, engine.cpu_priority_workers, engine.max_pending) == (3, 2, 5)
        assert type(engine.cpu_workers) is int
        assert type(engine.max_pending) is int

    def test_seconds(self) -> None:
        settings = ae.Engine(watchdog=np.float64(2.5))._settings
        assert settings.watchdog == 2.5
        assert type(settings.watchdog) is float

    def test_numpy_bool_is_not_an_integer(self) -> None:
        with pytest.raises(ValueError, match=r"^cpu_workers must be an int >= 1 or None, got "):
            ae.Engine(cpu_workers=np.bool_(True))  # type: ignore[arg-type]
