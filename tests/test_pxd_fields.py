"""The ``.pxd`` files and the Python classes they type must declare the same fields.

The compiled core (setup.py) compiles a module with the ``.pxd`` file beside it: a ``cdef
class X`` there makes the Python class ``X`` an extension type whose fields are exactly the
``cdef`` fields listed. The two lists are kept by hand, and nothing else notices when they
drift: a field assigned in Python but missing from the ``.pxd`` fails only in the compiled
build (an ``AttributeError`` on a path its tests may not take), and a field left in the
``.pxd`` after the Python code stopped using it costs memory in every instance. So for every
``aioengine/**/*.pxd`` this test reads each ``cdef class`` block's fields and compares them
with what the Python class beside it assigns, found in its source:

- ``self.NAME = ...`` (annotated or not, augmented, or in a tuple target) in its methods;
- the names in a class-level ``__slots__``;
- the stores of the module function that builds its instances without a constructor
  (:data:`_FACTORIES`).

A class whose ``.pxd`` declares ``cdef dict __dict__`` may hold more attributes than it
declares; every declared field must still be assigned somewhere. ``__dict__`` and
``__weakref__`` are never fields. Each ``cpdef``/``cdef`` function a ``.pxd`` declares must
also exist in the Python source: a method of its class, or a module function.

The sources are read, not imported: the test means the same under the compiled build.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "aioengine"

# Module functions that build a class's instances by storing each field on a new object
# (class name: (function, the local that holds the object)), as operation.py's new_operation
# does for _OperationCore: the compiled core allocates it without calling a constructor.
_FACTORIES = {"_OperationCore": ("new_operation", "op")}

_NOT_FIELDS = frozenset({"__dict__", "__weakref__"})

_CLASS = re.compile(r"cdef\s+class\s+(\w+)\s*(?:\(\s*(\w+)\s*\))?\s*:")
# ``cdef [public|readonly] [unsigned ...] TYPE name``: a field (a function declaration has a
# parenthesis).
_FIELD = re.compile(
    r"cdef\s+(?:(?:public|readonly)\s+)?(?:(?:unsigned|signed|long|short)\s+)*[\w.]+\s+(\w+)\s*$"
)
# ``cpdef|cdef [inline] [TYPE ...] name(``: a function (its arguments may go on for lines).
_FUNCTION = re.compile(r"c(?:p)?def\s+(?:inline\s+)?(?:[\w.\[\]]+\s+)*?(\w+)\s*\(")


@dataclass
class PxdClass:
    """One ``cdef class`` block of a ``.pxd`` file."""

    name: str
    fields: set[str] = field(default_factory=set)
    methods: set[str] = field(default_factory=set)
    has_dict: bool = False
    base: str | None = None  # the cdef class it derives from (another .pxd declares it)


@dataclass
class Pxd:
    """What one ``.pxd`` file declares: its classes, and its module functions."""

    classes: dict[str, PxdClass] = field(default_factory=dict)
    functions: set[str] = field(default_factory=set)


def _code(line: str) -> str:
    """``line`` without its comment and its trailing blanks."""
    return line.split("#", 1)[0].rstrip()


def parse_pxd(text: str) -> Pxd:
    """The classes, fields and functions that a ``.pxd`` file's text declares.

    A function defined with a body in the ``.pxd`` itself (``cdef inline ...:``) is its own
    implementation, not a declaration of one in the ``.py``: it is left out, as are the
    declarations of a ``cdef extern from`` block.
    """
    pxd = Pxd()
    current: PxdClass | None = None
    in_extern = False
    for raw in text.splitlines():
        line = _code(raw)
        if not line.strip():
            continue
        indented = line[0].isspace()
        if not indented:
            current = None
            in_extern = False
        stripped = line.strip()
        if match := _CLASS.fullmatch(stripped):
            current = pxd.classes.setdefault(match[1], PxdClass(match[1], base=match[2]))
            continue
        if stripped.startswith("cdef extern"):
            in_extern = True
            continue
        if in_extern or (not indented and stripped.endswith(":")):
            continue  # an extern block, or a function defined here (its body is indented)
        if current is not None and indented:
            if match := _FIELD.fullmatch(stripped):
                if match[1] == "__dict__":
                    current.has_dict = True
                elif match[1] not in _NOT_FIELDS:
                    current.fields.add(match[1])
            elif (match := _FUNCTION.match(stripped)) and not stripped.endswith(":"):
                current.methods.add(match[1])
        elif not indented and (match := _FUNCTION.match(stripped)):
            pxd.functions.add(match[1])
    return pxd


def _stored_on(node: ast.AST, owner: str) -> set[str]:
    """The attributes of the name ``owner`` that the code under ``node`` assigns."""
    names: set[str] = set()

    def targets(target: ast.expr) -> None:
        if isinstance(target, ast.Attribute):
            if isinstance(target.value, ast.Name) and target.value.id == owner:
                names.add(target.attr)
        elif isinstance(target, ast.Tuple | ast.List):
            for elt in target.elts:
                targets(elt)
        elif isinstance(target, ast.Starred):
            targets(target.value)

    for sub in ast.walk(node):
        if isinstance(sub, ast.Assign):
            for target in sub.targets:
                targets(target)
        elif isinstance(sub, ast.AnnAssign | ast.AugAssign):
            targets(sub.target)
    return names


def _slots(cls: ast.ClassDef) -> set[str]:
    """The names in ``cls``'s class-level ``__slots__``, if it has one."""
    for stmt in cls.body:
        if isinstance(stmt, ast.Assign):
            targets = stmt.targets
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets = [stmt.target]
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == "__slots__" for t in targets):
            value = ast.literal_eval(stmt.value)  # type: ignore[arg-type]
            return {value} if isinstance(value, str) else set(value)
    return set()


@dataclass
class PyClass:
    """What a Python class's source assigns and defines."""

    attributes: set[str]
    methods: set[str]


def python_class(module: ast.Module, name: str) -> PyClass | None:
    """The attributes that class ``name`` of ``module`` assigns, and its methods."""
    cls = next(
        (n for n in module.body if isinstance(n, ast.ClassDef) and n.name == name),
        None,
    )
    if cls is None:
        return None
    attributes = _slots(cls)
    methods: set[str] = set()
    for stmt in cls.body:
        if not isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        methods.add(stmt.name)
        decorators = {d.id for d in stmt.decorator_list if isinstance(d, ast.Name)}
        params = stmt.args.posonlyargs + stmt.args.args
        if params and "staticmethod" not in decorators:
            attributes |= _stored_on(stmt, params[0].arg)  # self (cls stores on the class)
    if name in _FACTORIES:
        function, local = _FACTORIES[name]
        factory = _module_functions(module).get(function)
        assert factory is not None, f"{function}(), which builds {name}, is gone"
        attributes |= _stored_on(factory, local)
    return PyClass(attributes - _NOT_FIELDS, methods)


def _module_functions(module: ast.Module) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    return {n.name: n for n in module.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def drift(pxd_path: Path, root: Path = PACKAGE.parent) -> list[str]:
    """Every way in which ``pxd_path`` and the ``.py`` beside it disagree, in words (paths
    relative to ``root``)."""
    pxd = parse_pxd(pxd_path.read_text(encoding="utf-8"))
    py_path = pxd_path.with_suffix(".py")
    where = pxd_path.relative_to(root).as_posix()
    if not py_path.exists():
        return [f"{where}: no {py_path.name} beside it"]
    module = ast.parse(py_path.read_text(encoding="utf-8"), filename=str(py_path))
    problems = []
    for cls in pxd.classes.values():
        py = python_class(module, cls.name)
        if py is None:
            problems.append(f"{where}: cdef class {cls.name} has no class in {py_path.name}")
            continue
        only_pxd = sorted(cls.fields - py.attributes)
        # With a __dict__, attributes it does not declare are allowed (they live there); a
        # derived class may assign its base's fields (the base's own .pxd lists them).
        inherited = _base_fields(cls.base)
        only_py = [] if cls.has_dict else sorted(py.attributes - cls.fields - inherited)
        if only_pxd:
            problems.append(
                f"{where}: {cls.name} declares fields that {py_path.name} never assigns: "
                f"{', '.join(only_pxd)}"
            )
        if only_py:
            problems.append(
                f"{where}: {cls.name} in {py_path.name} assigns fields that the .pxd lacks: "
                f"{', '.join(only_py)}"
            )
        missing = sorted(cls.methods - py.methods)
        if missing:
            problems.append(
                f"{where}: {cls.name} declares methods that {py_path.name} lacks: "
                f"{', '.join(missing)}"
            )
    missing = sorted(pxd.functions - set(_module_functions(module)))
    if missing:
        problems.append(
            f"{where}: declares functions that {py_path.name} lacks: {', '.join(missing)}"
        )
    return problems


PXD_FILES = sorted(PACKAGE.rglob("*.pxd"))


def _base_fields(name: str | None) -> set[str]:
    """The fields of the cdef class ``name``, declared in one of the package's ``.pxd``
    files, with its own bases' (empty for None)."""
    if name is None:
        return set()
    for path in PXD_FILES:
        cls = parse_pxd(path.read_text(encoding="utf-8")).classes.get(name)
        if cls is not None:
            return cls.fields | _base_fields(cls.base)
    raise AssertionError(f"no .pxd declares the base class {name}")


def test_the_package_has_pxd_files() -> None:
    # Guards the parametrisation below from passing on nothing.
    names = {p.name for p in PXD_FILES}
    assert {"engine.pxd", "operation.pxd", "var.pxd", "bulk.pxd"} <= names


@pytest.mark.parametrize("pxd_path", PXD_FILES, ids=lambda p: p.name)
def test_pxd_matches_the_python_source(pxd_path: Path) -> None:
    problems = drift(pxd_path)
    assert not problems, "\n".join(problems)


def test_the_parser_reads_every_cdef_class() -> None:
    # The classes the compiled core types: a parser that misread their blocks would compare
    # nothing and pass.
    seen = {
        name: parse_pxd(p.read_text(encoding="utf-8")).classes.get(name)
        for p, name in (
            (PACKAGE / "engine.pxd", "Engine"),
            (PACKAGE / "corestate.pxd", "CoreState"),
            (PACKAGE / "operation.pxd", "_OperationCore"),
            (PACKAGE / "var.pxd", "Var"),
            (PACKAGE / "bulk.pxd", "Bulk"),
        )
    }
    for name, cls in seen.items():
        assert cls is not None, name
        assert cls.fields, name
    state = seen["CoreState"]
    assert state is not None
    assert not state.has_dict  # every field of the scheduler is declared
    assert "complete_locked" in state.methods
    scheduler = parse_pxd((PACKAGE / "scheduler.pxd").read_text(encoding="utf-8")).classes
    assert "push" in scheduler["Scheduler"].methods


SAMPLE_PXD = """\
cimport cython


@cython.final
cdef class Thing:
    cdef dict __dict__
    cdef object __weakref__
    cdef public Py_ssize_t _count  # a comment
    cdef readonly object name
    cdef list _items

    @cython.locals(i=Py_ssize_t)
    cpdef bint _step(self, list ready,
                     bint more=*) except -1
    cdef inline int _fast(self) noexcept:
        return 1


cdef extern from "Python.h":
    void PyObject_GC_Track(object)


@cython.locals(v=Thing)
cpdef Py_ssize_t helper(tuple items) except -1

cdef inline bint _defined_here(object x) noexcept:
    return x is None
"""


def test_parse_pxd_reads_fields_methods_and_functions() -> None:
    pxd = parse_pxd(SAMPLE_PXD)
    assert set(pxd.classes) == {"Thing"}
    thing = pxd.classes["Thing"]
    assert thing.fields == {"_count", "name", "_items"}
    assert thing.has_dict
    assert thing.methods == {"_step"}  # _fast has its body here
    assert pxd.functions == {"helper"}


SAMPLE_PY = """\
class Thing:
    __slots__ = ("__weakref__", "_a")

    def __init__(self, n: int) -> None:
        self._b: int = n
        self._c, (self._d, other.e) = 1, (2, 3)

    def bump(me) -> None:
        me._e += 1

    @staticmethod
    def make(self) -> None:
        self._not_a_field = 1

    @property
    def p(self) -> int:
        return self._a


def new_thing() -> None:
    t = object.__new__(Thing)
    t._f = 1
"""


def test_python_class_collects_assigned_attributes() -> None:
    module = ast.parse(SAMPLE_PY)
    py = python_class(module, "Thing")
    assert py is not None
    assert py.attributes == {"_a", "_b", "_c", "_d", "_e"}
    assert py.methods == {"__init__", "bump", "make", "p"}
    assert python_class(module, "Other") is None


def test_drift_names_missing_and_extra_fields(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "thing.pxd").write_text(
        "cdef class Thing:\n    cdef public object _a\n    cdef public object _gone\n"
        "    cpdef _missing(self)\n\ncpdef absent(x)\n",
        encoding="utf-8",
    )
    (pkg / "thing.py").write_text(
        "class Thing:\n    def __init__(self):\n        self._a = self._new = 1\n",
        encoding="utf-8",
    )
    problems = "\n".join(drift(pkg / "thing.pxd", tmp_path))
    assert "never assigns: _gone" in problems
    assert "the .pxd lacks: _new" in problems
    assert "methods that thing.py lacks: _missing" in problems
    assert "functions that thing.py lacks: absent" in problems
    # With a __dict__, the undeclared attribute is allowed; the unassigned field is not.
    (pkg / "thing.pxd").write_text(
        "cdef class Thing:\n    cdef dict __dict__\n    cdef public object _a\n"
        "    cdef public object _gone\n",
        encoding="utf-8",
    )
    assert drift(pkg / "thing.pxd", tmp_path) == [
        "pkg/thing.pxd: Thing declares fields that thing.py never assigns: _gone"
    ]
