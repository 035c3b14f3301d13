"""tools/reach.py counts the writes to, and reads of, other modules' private names (issue 36).

Each test writes a small package to ``tmp_path`` and scans it with the script's functions.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import sys
import textwrap
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "reach.py"

# The owner of the private fields: an Operation with slots, a Scheduler with self._ fields.
OPERATION = """
class Operation:
    __slots__ = ("_state", "_seq")

    def __init__(self):
        self._state = 0
        self._seq = 0

    def _finish(self):
        self._state = 2
"""
SCHEDULER = """
from .operation import Operation

class Scheduler:
    _tick: int = 0

    def __init__(self):
        self._failures = {}
        self._waiters = []

    def run(self, op: Operation):
        self._failures[op] = None  # its own field
        op._state = 1  # Operation's
"""


@pytest.fixture(scope="module")
def reach() -> Iterator[ModuleType]:
    """tools/reach.py, loaded from its file (tools/ is not a package)."""
    spec = importlib.util.spec_from_file_location("reach", TOOL)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def package(tmp_path: pathlib.Path, **modules: str) -> pathlib.Path:
    """A package ``pkg`` under ``tmp_path`` with the modules given (``sub__mod`` is sub/mod)."""
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "__init__.py").write_text("")
    for name, source in modules.items():
        path = root.joinpath(*name.split("__")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "__init__.py").touch()
        path.write_text(textwrap.dedent(source))
    return root


def hits(reach: ModuleType, root: pathlib.Path, path: str) -> list[tuple[str, str]]:
    """(attr, kind) of each counted hit in the module at ``path`` (relative to the package)."""
    report = reach.scan(root)
    return [(hit.attr, hit.kind) for hit in report.counted if hit.path == f"pkg/{path}"]


def test_a_write_to_another_modules_field_is_an_outside_write(
    reach: ModuleType, tmp_path: pathlib.Path
) -> None:
    root = package(
        tmp_path,
        operation=OPERATION,
        scheduler=SCHEDULER,
        remote="""
        def settle(op, core, box, fut):
            op._state = 3
            op._seq += 1
            del op._seq
            core._failures[box] = None
            del core._failures[box]
            core._waiters.append(fut)
            setattr(op, "_state", 4)
            op._state, x = 5, 6
        """,
    )
    assert hits(reach, root, "remote.py") == [
        ("_state", "assign"),
        ("_seq", "augassign"),
        ("_seq", "del"),
        ("_failures", "setitem"),
        ("_failures", "delitem"),
        ("_waiters", "mutate"),
        ("_state", "setattr"),
        ("_state", "assign"),
    ]
    report = reach.scan(root)
    counts = report.per_module()
    assert (counts["pkg/remote.py"].writes, counts["pkg/remote.py"].reach) == (8, 8)
    # scheduler.py writes Operation's _state once; its own _failures is not counted.
    assert hits(reach, root, "scheduler.py") == [("_state", "assign")]
    assert (report.writes, report.reach) == (9, 9)


def test_writes_to_the_objects_own_fields_are_not_counted(
    reach: ModuleType, tmp_path: pathlib.Path
) -> None:
    root = package(
        tmp_path,
        operation=OPERATION,
        scheduler=SCHEDULER,
        engine="""
        class Engine:
            def __init__(self):
                self._state = 0  # Engine's own field, though Operation has one too
                self._core = None

            @classmethod
            def make(cls):
                cls._count = 1
                type(cls)._other = 2
                return super()._make()

            def __repr__(self):
                return self.__class__.__name__  # a dunder is public
        """,
    )
    assert hits(reach, root, "engine.py") == []
    assert hits(reach, root, "operation.py") == []


def test_a_field_the_module_owns_is_internal_through_any_name(
    reach: ModuleType, tmp_path: pathlib.Path
) -> None:
    # var.py owns _version (a Var declares it), and writes it through another Var and an
    # operation's reference; operation.py owns _state and writes another op's through `other`.
    root = package(
        tmp_path,
        operation=OPERATION
        + """
def copy_state(op, other):
    other._state = op._state
""",
        var="""
        class Var:
            _version: int

            def bump(self, other):
                other._version += 1
                self._peer._version = 0
        """,
    )
    assert hits(reach, root, "operation.py") == []
    assert hits(reach, root, "var.py") == []
    assert (reach.scan(root).writes, reach.scan(root).reach) == (0, 0)


def test_a_name_owned_by_several_modules_is_outside_for_the_others(
    reach: ModuleType, tmp_path: pathlib.Path
) -> None:
    root = package(
        tmp_path,
        operation=OPERATION,
        version="""
        class Version:
            def __init__(self):
                self._state = None
        """,
        remote="""
        def settle(op, version):
            op._state = 1
            version._state = 2
        """,
    )
    assert hits(reach, root, "remote.py") == [("_state", "assign"), ("_state", "assign")]
    assert hits(reach, root, "version.py") == []


def test_reading_another_modules_private_field_is_a_reach(
    reach: ModuleType, tmp_path: pathlib.Path
) -> None:
    root = package(
        tmp_path,
        operation=OPERATION,
        scheduler=SCHEDULER
        + """
def _dispatch_locked(ready):
    return ready
""",
        observe__dump="""
        from .. import scheduler
        from ..scheduler import _dispatch_locked, Scheduler
        from ..operation import Operation as _Op

        def dump(op, core):
            if op._state and core._waiters:
                op._finish()
            getattr(op, "_seq")
            return scheduler._dispatch_locked(core._failures)
        """,
    )
    found = hits(reach, root, "observe/dump.py")
    assert found == [
        ("_dispatch_locked", "import"),
        ("_state", "read"),
        ("_waiters", "read"),
        ("_finish", "read"),
        ("_seq", "getattr"),
        ("_dispatch_locked", "module"),
        ("_failures", "read"),
    ]
    report = reach.scan(root)
    assert report.writes == 1  # scheduler.py's op._state
    assert report.reach == 8


def test_private_names_of_no_module_of_the_package_are_foreign(
    reach: ModuleType, tmp_path: pathlib.Path
) -> None:
    root = package(
        tmp_path,
        operation=OPERATION,
        remote="""
        import asyncio
        import sys
        from ._helpers import helper  # a private submodule: not a private name

        def submit(client, op, task):
            loop = asyncio._get_running_loop()
            client._graph_to_futures()
            task._log_destroy_pending = False
            return sys._getframe(), op._state
        """,
        _helpers="""
        def helper():
            pass
        """,
    )
    report = reach.scan(root)
    assert hits(reach, root, "remote.py") == [("_state", "read")]
    foreign = [(hit.attr, hit.kind) for hit in report.hits if hit.foreign]
    assert foreign == [
        ("_get_running_loop", "read"),
        ("_graph_to_futures", "read"),
        ("_log_destroy_pending", "assign"),
        ("_getframe", "read"),
    ]
    assert (report.writes, report.reach, report.foreign) == (0, 1, 4)


def test_the_exit_status_holds_the_totals_to_the_ceilings(
    reach: ModuleType, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = package(
        tmp_path,
        operation=OPERATION,
        remote="""
        def settle(op):
            op._state = op._seq
        """,
    )
    # One outside write (_state), two reaches (_state, _seq).
    assert reach.main([str(root)]) == 0
    assert reach.main([str(root), "--max-writes", "1", "--max-reach", "2"]) == 0
    capsys.readouterr()

    assert reach.main([str(root), "--max-writes", "0", "--max-reach", "2"]) == 1
    err = capsys.readouterr().err
    assert "1 outside writes, over the ceiling of 0" in err
    assert "--list" in err
    assert "private reaches" not in err

    assert reach.main([str(root), "--max-writes", "1", "--max-reach", "1"]) == 1
    err = capsys.readouterr().err
    assert "2 private reaches, over the ceiling of 1" in err
    assert "outside writes" not in err


def test_list_and_json_show_every_occurrence(
    reach: ModuleType, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = package(
        tmp_path,
        operation=OPERATION,
        remote="""
        def settle(op):
            op._state = op._seq
        """,
    )
    assert reach.main([str(root), "--list"]) == 0
    out = capsys.readouterr().out
    assert "pkg/remote.py:3: _state (assign)\n" in out
    assert "pkg/remote.py:3: _seq (read)\n" in out
    assert out.splitlines()[-1].split() == ["total", "1", "2", "0"]

    assert reach.main([str(root), "--json"]) == 0
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert data["totals"] == {"writes": 1, "reach": 2, "foreign": 0}
    assert data["modules"]["pkg/remote.py"] == {"writes": 1, "reach": 2, "foreign": 0}
    assert {(hit["attr"], hit["kind"], hit["write"]) for hit in data["hits"]} == {
        ("_state", "assign", True),
        ("_seq", "read", False),
    }


def test_writes_inside_the_core_are_not_outside_writes(
    reach: ModuleType, tmp_path: pathlib.Path
) -> None:
    """The scheduler writing an operation's field is the core changing its own state (still a
    reach); a collaborator writing it is an outside write."""
    root = tmp_path / "aioengine"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "operation.py").write_text(textwrap.dedent(OPERATION))
    (root / "scheduler.py").write_text(textwrap.dedent(SCHEDULER))
    (root / "remote.py").write_text("def settle(op):\n    op._state = 3\n")
    report = reach.scan(root)
    counts = report.per_module()
    assert (counts["aioengine/scheduler.py"].writes, counts["aioengine/scheduler.py"].reach) == (
        0,
        1,
    )
    assert (counts["aioengine/remote.py"].writes, counts["aioengine/remote.py"].reach) == (1, 1)
    assert {hit.path: hit.core for hit in report.hits} == {
        "aioengine/remote.py": False,
        "aioengine/scheduler.py": True,
    }


def test_a_write_to_the_schedulers_public_state_from_outside_the_core_is_an_outside_write(
    reach: ModuleType, tmp_path: pathlib.Path
) -> None:
    # The scheduler's state is public (read by collaborators), as WorkerState's is; changing
    # it stays the core's business, so a collaborator writing it is counted.
    root = package(
        tmp_path,
        scheduler="""
        class Scheduler:
            def __init__(self):
                self.live = {}
                self.gpu = None

            def push(self, op):
                self.live[1] = op
        """,
        bulk="""
        def join(core, op):
            core.live[2] = op  # inside the core
        """,
        observe__dump="""
        def dump(engine, core, other):
            n = len(core.live)  # a read
            core.live[3] = None
            engine._core.live.clear()
            core.gpu = object()
            other.live = {}  # not reached from a scheduler
            return n
        """,
    )
    found = hits(reach, root, "observe/dump.py")
    assert found == [
        ("live", "state:setitem"),
        ("live", "state:mutate"),
        ("gpu", "state:assign"),
    ]
    report = reach.scan(root)
    assert report.writes == 3
    assert not [h for h in report.hits if h.path.endswith("bulk.py")]


def test_a_write_to_an_operations_public_record_from_outside_the_core_is_an_outside_write(
    reach: ModuleType, tmp_path: pathlib.Path
) -> None:
    # Operation's record fields are public to read (observers, tests); only the core writes
    # them. A name that a class the writer imports declares too is that class's business.
    root = package(
        tmp_path,
        operation="""
        class _OperationCore:
            __slots__ = ("_state", "seq", "waiters", "callbacks", "name")
        """,
        scheduler="""
        def push(op):
            op.seq = 1  # inside the core
            op.waiters = []
        """,
        fence="""
        class Fence:
            def __init__(self):
                self.seq = 0
                self.waiters = []
        """,
        gpu_sync="""
        import gc
        from .fence import Fence

        def launch(op, fence: Fence):
            fence.seq = 3  # a Fence's field: not counted, even though an operation has one
            op.waiters = None  # (the same spelling: not counted either, here)
            gc.callbacks.append(print)  # another library's
            op.callbacks = []
            n = op.seq  # a read
            return n
        """,
        observe__trace="""
        def meddle(op, other):
            op.seq += 1
            op.waiters.append(other)
            del op.callbacks
            op.name = "renamed"
        """,
    )
    assert hits(reach, root, "gpu_sync.py") == [("callbacks", "record:assign")]
    assert hits(reach, root, "observe/trace.py") == [
        ("seq", "record:augassign"),
        ("waiters", "record:mutate"),
        ("callbacks", "record:del"),
        ("name", "record:assign"),
    ]
    report = reach.scan(root)
    assert report.writes == 5
    assert not [h for h in report.hits if h.path.endswith(("scheduler.py", "fence.py"))]
