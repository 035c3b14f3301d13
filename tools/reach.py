"""Measure how much the modules of ``aioengine/`` reach into each other's private state.

The core (the scheduler, its operations, Vars and locks) stays correct only while its state
changes in one place. Issue 36 asks that the collaborators (bulk, GPU, remote, the observers)
and the façade call the scheduler's declared API instead of reaching into it: today they read
and write underscore names of objects that other modules define, so a change inside the core
has to be checked against every module that pokes at it. This script counts that traffic, and
``nox -s lint`` runs it as a ratchet: the counts may only go down.

It reads the sources with :mod:`ast` (nothing is imported) and counts two things per module:

**outside writes**
    a store to a private attribute (one leading underscore, or a mangled ``__name``; not a
    dunder) of an object other than ``self``/``cls``, where no class of the writing module
    declares that name: ``op._state = x``, ``op._seq += 1``, ``del op._task``,
    ``core._failures[box] = None``, ``del core._hold[k]``, ``core._waiters.append(fut)`` (a
    call of a mutating method of a list, dict, set or deque), ``setattr(op, "_state", x)``.

**private reach**
    every read or write of ``x._name`` where ``x`` is not ``self``/``cls`` and no class of the
    current module declares ``_name``; ``getattr``/``hasattr``/``setattr``/``delattr`` with a
    literal private name; ``from .scheduler import _Foo`` (an underscore name imported from
    another module of the package; importing a private *submodule* such as ``._kernel`` is
    not counted); ``scheduler._name`` on an imported module of the package. Outside writes
    are counted among the reaches too.

**state writes** (counted as outside writes too)
    the scheduler's state is public, as distributed's ``WorkerState``'s is: the fields without
    an underscore of the classes in :data:`STATE` (the scheduler and its typed collaborators
    inside the core) are what the façade and the collaborators may read. Outside the core they
    may not change them: a write (any of the kinds above) of such a field through an object
    reached from a scheduler (an expression on a name ``core`` or through an attribute
    ``_core``: ``core.live[k] = op``, ``engine._core.wakeups.idle.append(f)``) is an outside
    write, kind ``state:<kind>``.

**record writes** (counted as outside writes too)
    an operation's record is public to read as well (the fields without an underscore in
    ``_OperationCore.__slots__``, :data:`RECORD`: ``op.seq``, ``op.ctx``, ``op.vars``...),
    and only the core changes it: outside the core, a write of such a field on any object but
    ``self`` or an imported library is an outside write, kind ``record:<kind>``. Names are
    matched by spelling, as ever: one that a class of the writing module, or of a module it
    imports from, declares too (``gpu_sync`` writes a ``Fence``'s ``seq``) is left out there.

Writes inside the core (the modules of :data:`CORE`: the scheduler, its operations, Vars,
bulk segments, loop queue, tasks, collector hooks, instruments and lock) to a name that a
core module declares are the core's own business: the issue asks that the core's state change
only inside the core, so they are listed (kind ``core``) and counted among the reaches, but
not as outside writes.

A module *declares* (owns) an attribute name when one of its classes has it in its body (a
method, a class attribute, an annotation), lists it in ``__slots__``, or when the module
assigns it as ``self._name``/``cls._name``. The names are matched by spelling, not by type
(the script does not know which class ``op`` is): a name declared by several modules is
internal to each of them, and outside for every other module.

Private names that no module of the package declares (Dask's ``client._graph_to_futures``,
asyncio's, ``namedtuple._replace``) are not state of another aioengine module: they are
counted apart as *foreign*, listed with ``--list`` and ``--json``, and not held to a ceiling.

Usage::

    python tools/reach.py                       # per-module counts and totals
    python tools/reach.py --list                # every occurrence, path:line: attr (kind)
    python tools/reach.py --json                # the same as JSON, for tooling
    python tools/reach.py --max-writes N --max-reach M   # exit 1 above either ceiling
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import pathlib
import sys
from collections.abc import Iterator, Sequence

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "aioengine"

# Methods that change the list, dict, set or deque they are called on.
MUTATORS = frozenset(
    {
        "add",
        "append",
        "appendleft",
        "clear",
        "discard",
        "extend",
        "extendleft",
        "insert",
        "pop",
        "popitem",
        "popleft",
        "remove",
        "reverse",
        "rotate",
        "setdefault",
        "sort",
        "update",
    }
)
# Kinds of occurrence that change the attribute (or what it holds).
WRITE_KINDS = frozenset(
    {"assign", "augassign", "del", "setitem", "delitem", "mutate", "setattr", "delattr"}
)
SELF_NAMES = frozenset({"self", "cls"})
# The compiled core (docs/design.md, "Layers"): writes among these modules are inside the core.
CORE = frozenset(
    f"aioengine.{name}"
    for name in (
        "scheduler",
        "corestate",
        "routing",
        "wakeups",
        "cancellation",
        "loopqueue",
        "bulk",
        "task",
        "var",
        "operation",
        "collector",
        "instrument",
        "failures",
        "lock",
    )
)

# The core's state classes whose public fields only the core may change: (module, class).
STATE = (
    ("scheduler", "Scheduler"),
    ("corestate", "CoreState"),
    ("routing", "Routes"),
    ("wakeups", "Wakeups"),
    ("failures", "Ledger"),
    ("bulk", "Segments"),
)

# The operation record, whose public fields (its ``__slots__``) only the core may change.
RECORD = ("operation", "_OperationCore")


def is_private(name: str) -> bool:
    """``_x`` and ``__x`` are private; ``__x__`` (a dunder) and ``_`` are not."""
    if len(name) < 2 or not name.startswith("_"):
        return False
    return not (name.startswith("__") and name.endswith("__"))


@dataclasses.dataclass(frozen=True)
class Hit:
    """One access of a private name that the module does not own."""

    path: str  # the module's file, relative to the package's parent
    line: int
    attr: str
    kind: str  # "read", "getattr", "import", "module", or one of WRITE_KINDS
    foreign: bool = False  # a name no module of the package declares
    core: bool = False  # a core module writing a name a core module declares

    @property
    def write(self) -> bool:
        """An outside write: it changes the attribute, and not from inside the core."""
        return (self.kind in WRITE_KINDS or self.kind.startswith(("state:", "record:"))) and (
            not self.core
        )


@dataclasses.dataclass
class ModuleCount:
    writes: int = 0
    reach: int = 0
    foreign: int = 0


@dataclasses.dataclass
class Report:
    hits: list[Hit]

    @property
    def counted(self) -> list[Hit]:
        return [hit for hit in self.hits if not hit.foreign]

    @property
    def writes(self) -> int:
        return sum(hit.write for hit in self.counted)

    @property
    def reach(self) -> int:
        return len(self.counted)

    @property
    def foreign(self) -> int:
        return len(self.hits) - self.reach

    def per_module(self) -> dict[str, ModuleCount]:
        counts: dict[str, ModuleCount] = {}
        for hit in self.hits:
            count = counts.setdefault(hit.path, ModuleCount())
            if hit.foreign:
                count.foreign += 1
            else:
                count.reach += 1
                count.writes += hit.write
        return dict(sorted(counts.items()))


@dataclasses.dataclass
class Module:
    name: str  # dotted: aioengine.observe.dump
    path: pathlib.Path
    display: str  # aioengine/observe/dump.py
    tree: ast.Module
    is_package: bool
    owned: set[str] = dataclasses.field(default_factory=set)  # private names it declares
    public: set[str] = dataclasses.field(default_factory=set)  # and its public ones


def module_name(package: pathlib.Path, path: pathlib.Path) -> str:
    parts = [package.name, *path.relative_to(package).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def load(package: pathlib.Path) -> dict[str, Module]:
    """Every module of ``package`` (a directory with ``__init__.py``), parsed, by dotted name."""
    modules: dict[str, Module] = {}
    for path in sorted(package.rglob("*.py")):
        name = module_name(package, path)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        display = path.relative_to(package.parent).as_posix()
        module = Module(name, path, display, tree, path.name == "__init__.py")
        names = declared_names(tree)
        module.owned = {name for name in names if is_private(name)}
        module.public = {name for name in names if not name.startswith("_")}
        modules[name] = module
    return modules


def _slot_names(value: ast.expr) -> Iterator[str]:
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        yield value.value
    elif isinstance(value, ast.Tuple | ast.List | ast.Set):
        for elt in value.elts:
            yield from _slot_names(elt)
    elif isinstance(value, ast.Dict):
        for key in value.keys:
            if key is not None:
                yield from _slot_names(key)


def _target_names(target: ast.expr) -> Iterator[str]:
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, ast.Tuple | ast.List):
        for elt in target.elts:
            yield from _target_names(elt)
    elif isinstance(target, ast.Starred):
        yield from _target_names(target.value)


def owned_names(tree: ast.Module) -> set[str]:
    """The private attribute names that the module's classes declare, or that it assigns as
    ``self._x``/``cls._x``."""
    return {name for name in declared_names(tree) if is_private(name)}


def declared_names(tree: ast.Module) -> set[str]:
    """Every attribute name that the module's classes declare, or that it assigns as
    ``self.x``/``cls.x``."""
    owned: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    owned.add(stmt.name)
                elif isinstance(stmt, ast.Assign):
                    for target in stmt.targets:
                        owned.update(_target_names(target))
                        if isinstance(target, ast.Name) and target.id == "__slots__":
                            owned.update(_slot_names(stmt.value))
                elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    owned.add(stmt.target.id)
                    if stmt.target.id == "__slots__" and stmt.value is not None:
                        owned.update(_slot_names(stmt.value))
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in SELF_NAMES
        ):
            owned.add(node.attr)
    return owned


def _resolve_from(module: Module, node: ast.ImportFrom) -> str | None:
    """The dotted module that ``from X import ...`` names (relative imports resolved)."""
    if not node.level:
        return node.module
    base = module.name.split(".")
    if not module.is_package:
        base.pop()
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    if not base:
        return None
    return ".".join([*base, node.module] if node.module else base)


class Scanner:
    """Finds the hits of one module; the ownership of names comes from every module."""

    def __init__(
        self,
        module: Module,
        modules: dict[str, Module],
        declared: set[str],
        state: frozenset[str] | set[str] = frozenset(),
        record: frozenset[str] | set[str] = frozenset(),
    ) -> None:
        self.module = module
        self.modules = modules
        self.declared = declared
        self.state = state  # the core's public state fields (STATE)
        self.record = record  # an operation's public fields (RECORD)
        self.libraries: set[str] = set()  # names bound by ``import`` to another library
        self.imported: set[str] = set()  # the package's modules it imports from
        self.nearby: set[str] = set()  # public names it or a module it imports declares
        self.in_core = module.name.split(".", 1)[-1] in {n.split(".", 1)[-1] for n in CORE}
        self.aliases: dict[str, str] = {}  # a local name bound to a module of the package
        self.hits: list[Hit] = []
        self.kinds: dict[int, str] = {}  # id(Attribute node) -> kind, for the written ones

    def hit(
        self, node: ast.AST, attr: str, kind: str, *, foreign: bool = False, core: bool = False
    ) -> None:
        line = getattr(node, "lineno", 0)
        self.hits.append(Hit(self.module.display, line, attr, kind, foreign, core))

    def scan(self) -> list[Hit]:
        tree = self.module.tree
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                self.imports(node)
        self.nearby = set(self.module.public).union(
            *(
                self.modules[name].public
                for name in self.imported
                if name.split(".", 1)[-1] != RECORD[0]
            )
        )
        for node in ast.walk(tree):
            self.mark_writes(node)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                self.attribute(node)
            elif isinstance(node, ast.Call):
                self.reflective(node)
        self.hits.sort(key=lambda hit: (hit.line, hit.attr, hit.kind))
        return self.hits

    def imports(self, node: ast.Import | ast.ImportFrom) -> None:
        root = self.module.name.split(".")[0]
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != root:  # another library: gc, asyncio, ...
                    self.libraries.add(alias.asname or alias.name.split(".")[0])
                if alias.name in self.modules:
                    self.imported.add(alias.name)
                if alias.asname and alias.name in self.modules:
                    self.aliases[alias.asname] = alias.name
                elif not alias.asname and alias.name.split(".")[0] == root:
                    self.aliases[root] = root
            return
        source = _resolve_from(self.module, node)
        if source is None or source.split(".")[0] != root:
            return
        if source in self.modules:
            self.imported.add(source)
        for alias in node.names:
            full = f"{source}.{alias.name}"
            if full in self.modules:  # a submodule, not a name inside a module
                self.aliases[alias.asname or alias.name] = full
            elif is_private(alias.name) and source != self.module.name:
                self.hit(node, alias.name, "import")

    def mark_writes(self, node: ast.AST) -> None:
        """Record which Attribute nodes are written, and how."""
        if isinstance(node, ast.AugAssign):
            self.mark(node.target, "augassign")
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.For | ast.AsyncFor):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                self.mark(target, "assign")
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            self.mark(node.optional_vars, "assign")
        elif isinstance(node, ast.comprehension):
            self.mark(node.target, "assign")
        elif isinstance(node, ast.Delete):
            for target in node.targets:
                self.mark(target, "del")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in MUTATORS
        ):
            inner = self.subscripted(node.func.value)
            if isinstance(inner, ast.Attribute):
                self.kinds.setdefault(id(inner), "mutate")

    @staticmethod
    def subscripted(node: ast.expr) -> ast.expr:
        while isinstance(node, ast.Subscript):
            node = node.value
        return node

    def mark(self, target: ast.expr, kind: str) -> None:
        if isinstance(target, ast.Tuple | ast.List):
            for elt in target.elts:
                self.mark(elt, kind)
        elif isinstance(target, ast.Starred):
            self.mark(target.value, kind)
        elif isinstance(target, ast.Attribute):
            self.kinds[id(target)] = kind
        elif isinstance(target, ast.Subscript):
            inner = self.subscripted(target)
            if isinstance(inner, ast.Attribute):
                item = {"assign": "setitem", "augassign": "setitem", "del": "delitem"}[kind]
                self.kinds[id(inner)] = item

    def is_self(self, node: ast.expr) -> bool:
        """``self``, ``cls``, ``super()`` and ``type(self)``: the object's own fields."""
        if isinstance(node, ast.Name):
            return node.id in SELF_NAMES
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "super":
                return True
            if node.func.id == "type" and len(node.args) == 1:
                return self.is_self(node.args[0])
        return False

    def module_of(self, node: ast.expr) -> str | None:
        """The dotted name of the package's module that ``node`` names, if it names one."""
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.module_of(node.value)
            if base is not None and f"{base}.{node.attr}" in self.modules:
                return f"{base}.{node.attr}"
        return None

    @staticmethod
    def from_core(node: ast.expr) -> bool:
        """Whether ``node`` is reached from a scheduler: a name ``core``, or an attribute
        ``_core`` on the way (``engine._core``, ``core.wakeups``, ``self._core.live``)."""
        while isinstance(node, ast.Attribute | ast.Subscript | ast.Call):
            if isinstance(node, ast.Attribute) and node.attr == "_core":
                return True
            node = node.func if isinstance(node, ast.Call) else node.value
        return isinstance(node, ast.Name) and node.id == "core"

    def attribute(self, node: ast.Attribute) -> None:
        if not is_private(node.attr):
            kind = self.kinds.get(id(node))
            if (
                kind is not None
                and node.attr in self.state
                and not self.in_core
                and self.from_core(node.value)
            ):
                self.hit(node, node.attr, f"state:{kind}")
            elif (
                kind is not None
                and node.attr in self.record
                and not self.in_core
                and node.attr not in self.nearby
                and not self.is_self(node.value)
                and not (isinstance(node.value, ast.Name) and node.value.id in self.libraries)
            ):
                self.hit(node, node.attr, f"record:{kind}")
            return
        if self.is_self(node.value):
            return
        kind = self.kinds.get(id(node), "read")
        target = self.module_of(node.value)
        if target is not None:
            if target != self.module.name:
                self.hit(node, node.attr, "module" if kind == "read" else kind)
            return
        self.account(node, node.attr, kind)

    def account(self, node: ast.AST, attr: str, kind: str) -> None:
        if attr in self.module.owned:
            return
        core = (
            kind in WRITE_KINDS
            and self.module.name in CORE
            and any(attr in self.modules[name].owned for name in CORE if name in self.modules)
        )
        self.hit(node, attr, kind, foreign=attr not in self.declared, core=core)

    def reflective(self, node: ast.Call) -> None:
        """``getattr(x, "_name")`` and its kin, with a literal private name."""
        func = node.func
        if isinstance(func, ast.Name):
            name, args = func.id, node.args
        elif (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id == "object"
            and func.attr in ("__setattr__", "__delattr__")
        ):
            name, args = func.attr.strip("_"), node.args
        else:
            return
        kind = {"getattr": "getattr", "hasattr": "getattr", "setattr": "setattr"}.get(name)
        kind = kind or ("delattr" if name == "delattr" else None)
        if kind is None or len(args) < 2 or self.is_self(args[0]):
            return
        attr = args[1]
        if (
            isinstance(attr, ast.Constant)
            and isinstance(attr.value, str)
            and is_private(attr.value)
        ):
            self.account(node, attr.value, kind)


def state_fields(modules: dict[str, Module]) -> set[str]:
    """The public fields (``self.name = ...``) of the classes of :data:`STATE`."""
    fields: set[str] = set()
    for module in modules.values():
        short = module.name.split(".", 1)[-1]
        for node in module.tree.body:
            if isinstance(node, ast.ClassDef) and (short, node.name) in STATE:
                for sub in ast.walk(node):
                    if (
                        isinstance(sub, ast.Attribute)
                        and isinstance(sub.ctx, ast.Store)
                        and isinstance(sub.value, ast.Name)
                        and sub.value.id == "self"
                        and not sub.attr.startswith("_")
                    ):
                        fields.add(sub.attr)
    return fields


def record_fields(modules: dict[str, Module]) -> set[str]:
    """The public names in the ``__slots__`` of the :data:`RECORD` class."""
    fields: set[str] = set()
    for module in modules.values():
        if module.name.split(".", 1)[-1] != RECORD[0]:
            continue
        for node in module.tree.body:
            if isinstance(node, ast.ClassDef) and node.name == RECORD[1]:
                for stmt in node.body:
                    if isinstance(stmt, ast.Assign) and any(
                        isinstance(t, ast.Name) and t.id == "__slots__" for t in stmt.targets
                    ):
                        fields.update(n for n in _slot_names(stmt.value) if not n.startswith("_"))
    return fields


def scan(package: pathlib.Path) -> Report:
    """Every hit in ``package``: the outside writes, the private reaches and the foreign ones."""
    modules = load(package)
    declared = set().union(*(module.owned for module in modules.values()))
    state = state_fields(modules)
    record = record_fields(modules)
    hits: list[Hit] = []
    for module in modules.values():
        hits.extend(Scanner(module, modules, declared, state, record).scan())
    return Report(hits)


def render(report: Report, *, listing: bool) -> str:
    lines = []
    if listing:
        for hit in report.hits:
            mark = ", foreign" if hit.foreign else ", core" if hit.core else ""
            lines.append(f"{hit.path}:{hit.line}: {hit.attr} ({hit.kind}{mark})")
        lines.append("")
    per_module = report.per_module()
    width = max([len("total"), *map(len, per_module)])
    lines.append(f"{'module':<{width}}  {'writes':>6}  {'reach':>6}  {'foreign':>7}")
    for path, count in per_module.items():
        if count.reach or count.foreign:
            lines.append(
                f"{path:<{width}}  {count.writes:>6}  {count.reach:>6}  {count.foreign:>7}"
            )
    lines.append(f"{'total':<{width}}  {report.writes:>6}  {report.reach:>6}  {report.foreign:>7}")
    return "\n".join(lines)


def as_json(report: Report) -> str:
    data = {
        "totals": {"writes": report.writes, "reach": report.reach, "foreign": report.foreign},
        "modules": {path: dataclasses.asdict(count) for path, count in report.per_module().items()},
        "hits": [{**dataclasses.asdict(hit), "write": hit.write} for hit in report.hits],
    }
    return json.dumps(data, indent=2)


def check(report: Report, max_writes: int | None, max_reach: int | None) -> list[str]:
    """A message for each ceiling that the report exceeds."""
    over = []
    if max_writes is not None and report.writes > max_writes:
        over.append(f"{report.writes} outside writes, over the ceiling of {max_writes}")
    if max_reach is not None and report.reach > max_reach:
        over.append(f"{report.reach} private reaches, over the ceiling of {max_reach}")
    return over


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python tools/reach.py",
        description="Count the writes to, and reads of, other modules' private names.",
    )
    parser.add_argument(
        "package", nargs="?", type=pathlib.Path, default=PACKAGE, help="(default: aioengine/)"
    )
    parser.add_argument("--list", action="store_true", help="every occurrence, path:line")
    parser.add_argument("--json", action="store_true", help="the counts and hits as JSON")
    parser.add_argument("--max-writes", type=int, metavar="N", help="ceiling: outside writes")
    parser.add_argument("--max-reach", type=int, metavar="M", help="ceiling: private reaches")
    args = parser.parse_args(argv)
    report = scan(args.package)
    print(as_json(report) if args.json else render(report, listing=args.list))
    over = check(report, args.max_writes, args.max_reach)
    for message in over:
        print(
            f"reach.py: {message}; see them with `python tools/reach.py --list`; "
            "call the owning module's declared API instead of reaching into its private state",
            file=sys.stderr,
        )
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
