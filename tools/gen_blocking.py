"""Generate ``aioengine/_blocking_generated.py``: BlockingEngine's methods, from Engine's.

:class:`aioengine.BlockingEngine` has the methods of :class:`aioengine.Engine` (the pushes, the
waits, ``new_var``, ``op``...), with the same parameters, defaults and overloads, so that mypy
and an IDE see the full typed signatures. Kept by hand, each copy drifts from the Engine's;
this script writes them instead. It reads the ``Engine`` class of ``aioengine/engine.py`` as
source (with :mod:`ast`; the module is never imported) and writes the mixin class
``BlockingMethods``, which BlockingEngine derives from: each method has the Engine method's
signature and overloads, a docstring made from the Engine method's, and a one-line body that
delegates to a helper of BlockingEngine (``blocking.py``). :data:`MIRRORED` lists the
methods and how each is mirrored; :data:`KINDS` says what each way of mirroring changes.

Regenerate after changing a mirrored Engine method, or this script::

    python tools/gen_blocking.py

``--check`` exits with status 1, writing nothing, if the file is stale;
``tests/test_blocking_generated.py`` fails then too. The output is formatted as ``ruff
format`` would (line length 100), so the file needs no formatting pass.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import dataclasses
import pathlib
import re
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCE = ROOT / "aioengine" / "engine.py"
TARGET = ROOT / "aioengine" / "_blocking_generated.py"
COMMAND = "python tools/gen_blocking.py"
LINE = 100  # pyproject's line length
INDENT = "    "


@dataclasses.dataclass(frozen=True)
class Kind:
    """One way BlockingEngine mirrors an Engine method.

    Attributes:
        futures: whether ``Operation[X]`` in its return annotations becomes
            ``concurrent.futures.Future[X]`` (and the Engine's decorator type BlockingEngine's).
        note: the paragraph its docstring adds after the Engine method's summary.
        raises: entries its docstring adds to the Engine method's ``Raises:`` section.
    """

    futures: bool
    note: str
    raises: tuple[str, ...] = ()


# The ways of mirroring. Each method's body is one statement (written by _body), which passes
# the parameters on as the Engine method takes them, to the Engine or to a helper of
# BlockingEngine (blocking.py).
KINDS: dict[str, Kind] = {
    # ``return self._engine.NAME(...)``: on the calling thread, same signature, same result.
    "call": Kind(
        futures=False,
        note="As :meth:`aioengine.Engine.{name}`, on the calling thread.",
    ),
    # ``return self._bridge(lambda: self._engine.NAME(...))``: a push, made on the calling
    # thread (on the loop thread if the caller runs an event loop of its own); the Operation
    # becomes a concurrent.futures.Future.
    "push": Kind(
        futures=True,
        note=(
            "As :meth:`aioengine.Engine.{name}`, on the calling thread, but the result is a "
            ":class:`concurrent.futures.Future` of the operation's result; its ``operation`` "
            "attribute is the :class:`~aioengine.Operation`."
        ),
    ),
    # ``self._wait("NAME()", lambda: self._engine.NAME(...))``: a coroutine method run on the
    # engine's loop thread while the caller blocks; ``async def`` becomes ``def``.
    "wait": Kind(
        futures=False,
        note=(
            "As :meth:`aioengine.Engine.{name}`, run on the engine's loop thread while the "
            "calling thread blocks."
        ),
        raises=(
            "RuntimeError: if called on the engine's loop thread or inside one of its "
            "operations (it would deadlock), or before the ``with`` block.",
            "EngineClosedError: if this BlockingEngine is closed, or closes meanwhile.",
        ),
    ),
    # ``return self._decorator(fn, self._engine.NAME(...))``: the Engine's decorator (the
    # method called with options only) wrapped so that calls of what it decorates push
    # through _bridge; ``fn`` is decorated at once if given.
    "decorator": Kind(
        futures=True,
        note=(
            "As :meth:`aioengine.Engine.{name}`, but calls of the decorated function return "
            ":class:`concurrent.futures.Future` objects."
        ),
    ),
}


@dataclasses.dataclass(frozen=True)
class Mirror:
    """How BlockingEngine mirrors one Engine method: a :data:`KINDS` key and an extra note."""

    kind: str
    note: str = ""


# The Engine methods BlockingEngine has, in its order. The other public methods of Engine
# (bulk, trace, dump, aclose...) are reached through BlockingEngine.engine.
MIRRORED: dict[str, Mirror] = {
    "new_var": Mirror("call"),
    "new_operator": Mirror("call"),
    "delete_operator": Mirror("call"),
    "push_sync": Mirror("push"),
    "push_async": Mirror("push", "Coroutine functions run on the engine's loop thread."),
    "push": Mirror("push"),
    "delete_var": Mirror("push"),
    "submit": Mirror(
        "push",
        "The keywords above are submit's own and are not passed to ``fn``; a Var inside a "
        "list, tuple, set or dict argument raises ``TypeError``. To pass ``fn`` a keyword of "
        "the same name, bind it with :func:`functools.partial` or use :meth:`op`, whose calls "
        "pass every keyword through.",
    ),
    "op": Mirror(
        "decorator",
        "Every argument of a call goes to the function, keywords such as ``name=`` included: "
        "the options are the decorator's.",
    ),
    "wait_for_var": Mirror("wait"),
    "wait_for_all": Mirror("wait"),
}

# The result types a "push" or "decorator" method returns instead of the Engine's: an
# ``Operation[X]`` becomes a ``concurrent.futures.Future[X]`` (with the decorator type's
# parameter). engine.py's own name for its decorator type is read as the protocol it stands
# for, defined once in aioengine/ergonomic.py.
FUTURE = "concurrent.futures.Future"
ALIASES = {"_OpDecorator": "OpDecorator[Operation[Any]]"}

# Names the generated code uses that engine.py may not import: (module, level).
OWN_IMPORTS = {
    "TYPE_CHECKING": ("typing", 0),
    "OpDecorator": ("ergonomic", 1),
    "Operation": ("operation", 1),
    "Any": ("typing", 0),
    "Callable": ("collections.abc", 0),
    "Coroutine": ("collections.abc", 0),
    "TypeVar": ("typing", 0),
}

# The helpers of BlockingEngine (blocking.py) that the bodies call, for the type checker.
HELPERS = '''\
if TYPE_CHECKING:
    _engine: Engine

    def _bridge(self, push: Callable[[], Operation[T]]) -> concurrent.futures.Future[T]:
        """Make ``push()``'s operation and return a future of it (blocking.py)."""
        ...

    def _wait(self, what: str, wait: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run ``wait()`` on the loop thread and block until it returns (blocking.py)."""
        ...

    def _decorator(
        self, fn: Callable[..., Any] | None, decorator: OpDecorator[Operation[Any]]
    ) -> Any:
        """Wrap ``decorator``'s pushes in futures; decorate ``fn`` if given (blocking.py)."""
        ...
'''


class GenerateError(Exception):
    """engine.py does not have what the generator needs (a mirrored method is missing...)."""


# -- reading engine.py -------------------------------------------------------------------


def _segment(lines: list[bytes], node: ast.expr | ast.stmt) -> str:
    """The source text of ``node`` as engine.py writes it (already formatted); ``lines`` are
    engine.py's lines, encoded (the offsets are in bytes). A node written over several
    lines is unparsed instead."""
    end = node.end_lineno
    if end != node.lineno or node.end_col_offset is None:
        return ast.unparse(node)
    return lines[end - 1][node.col_offset : node.end_col_offset].decode()


class _Futures(ast.NodeTransformer):
    """Rewrites a return annotation: Operation[X] -> concurrent.futures.Future[X]."""

    def visit_Name(self, node: ast.Name) -> ast.expr:
        alias = ALIASES.get(node.id)
        if alias is not None:
            return self.visit(ast.parse(alias, mode="eval").body)  # type: ignore[no-any-return]
        return node

    def visit_Subscript(self, node: ast.Subscript) -> ast.expr:
        self.generic_visit(node)
        if isinstance(node.value, ast.Name) and node.value.id == "Operation":
            node.value = ast.parse(FUTURE, mode="eval").body
        return node


def _names(node: ast.AST) -> set[str]:
    """The names code reads (for an attribute chain: its root)."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and type(n.ctx) is ast.Load}


@dataclasses.dataclass
class _Method:
    name: str
    mirror: Mirror
    defs: list[ast.FunctionDef | ast.AsyncFunctionDef]  # overloads first, then the body's


def _engine_methods(tree: ast.Module) -> list[_Method]:
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Engine"]
    if len(classes) != 1:
        raise GenerateError(f"{SOURCE.name} must define one class Engine")
    found: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = {}
    for node in classes[0].body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in MIRRORED:
            found.setdefault(node.name, []).append(node)
    missing = [name for name in MIRRORED if name not in found]
    if missing:
        raise GenerateError(f"Engine has no method {', '.join(missing)}: update MIRRORED")
    methods = []
    for name, mirror in MIRRORED.items():
        defs = found[name]
        if any(_is_overload(d) for d in defs[-1:]) or not all(map(_is_overload, defs[:-1])):
            raise GenerateError(f"Engine.{name}: overloads must come first, then one body")
        if mirror.kind == "wait" and not isinstance(defs[-1], ast.AsyncFunctionDef):
            raise GenerateError(f"Engine.{name} is not a coroutine method: it cannot be 'wait'")
        methods.append(_Method(name, mirror, defs))
    return methods


def _is_overload(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "overload" for d in node.decorator_list)


# -- writing -----------------------------------------------------------------------------


def _bracketed(head: str, items: list[str], tail: str, indent: str) -> list[str]:
    """``head + items + tail`` (a def: ``tail`` starts with its ``)``) as ruff formats it: on
    one line, with the items on one line of their own, or one item per line."""
    flat = f"{indent}{head}{', '.join(items)}{tail}"
    if len(flat) <= LINE:
        return [flat]
    inner = f"{indent}{INDENT}{', '.join(items)}"
    if len(inner) <= LINE:
        return [f"{indent}{head}", inner, f"{indent}{tail}"]
    return [f"{indent}{head}", *(f"{indent}{INDENT}{item}," for item in items), f"{indent}{tail}"]


def _parameters(source: list[bytes], args: ast.arguments) -> list[str]:
    """The parameter list of a def, each as engine.py writes it."""

    def one(arg: ast.arg, default: ast.expr | None, prefix: str = "") -> str:
        text = prefix + arg.arg
        if arg.annotation is not None:
            text += f": {_segment(source, arg.annotation)}"
            if default is not None:
                text += f" = {_segment(source, default)}"
        elif default is not None:
            text += f"={_segment(source, default)}"
        return text

    positional = [*args.posonlyargs, *args.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults))
    defaults += args.defaults
    items = [one(a, d) for a, d in zip(positional, defaults, strict=True)]
    if args.posonlyargs:
        items.insert(len(args.posonlyargs), "/")
    if args.vararg is not None:
        items.append(one(args.vararg, None, "*"))
    elif args.kwonlyargs:
        items.append("*")
    items += [one(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)]
    if args.kwarg is not None:
        items.append(one(args.kwarg, None, "**"))
    return items


def _passed(args: ast.arguments, skip: int = 0) -> list[str]:
    """The arguments that pass a def's parameters (but ``self``) on, as it takes them."""
    positional = [a.arg for a in [*args.posonlyargs, *args.args][1 + skip :]]
    keywords = [f"{a.arg}={a.arg}" for a in args.kwonlyargs]
    star = [f"*{args.vararg.arg}"] if args.vararg is not None else []
    double = [f"**{args.kwarg.arg}"] if args.kwarg is not None else []
    return [*positional, *star, *keywords, *double]


def _docstring(method: _Method, engine_doc: str) -> list[str]:
    """The method's docstring: the Engine's summary, how it is mirrored, and the Engine's
    sections (``Args:``, ``Raises:``), with what the mirroring adds to ``Raises:``."""
    kind = KINDS[method.mirror.kind]
    paragraphs = engine_doc.split("\n\n")
    sections: list[str] = []
    for paragraph in paragraphs[1:]:
        if re.match(r"(Args|Raises|Returns):\n", paragraph):
            sections.append(paragraph)
        elif sections and paragraph.startswith(INDENT):
            sections[-1] += "\n\n" + paragraph
    if kind.raises:
        extra = "\n".join(
            textwrap.fill(entry, LINE - 3 * len(INDENT), subsequent_indent=INDENT)
            for entry in kind.raises
        )
        extra = textwrap.indent(extra, INDENT)
        for i, section in enumerate(sections):
            if section.startswith("Raises:\n"):
                sections[i] = f"{section}\n{extra}"
                break
        else:
            sections.append(f"Raises:\n{extra}")
    notes = [kind.note.format(name=method.name), method.mirror.note]
    body = [paragraphs[0]]
    body += [textwrap.fill(n, LINE - 2 * len(INDENT)) for n in notes if n]
    text = "\n\n".join([*body, *sections])
    lines = text.splitlines()
    lines[0] = '"""' + lines[0]
    lines.append('"""')
    return [textwrap.indent(line, 2 * INDENT) if line else "" for line in lines]


def _method(source: list[bytes], method: _Method, used: set[str]) -> list[str]:
    kind = KINDS[method.mirror.kind]
    out: list[str] = []
    for node in method.defs:
        overload = _is_overload(node)
        returns = node.returns
        if returns is None:
            raise GenerateError(f"Engine.{method.name} has no return annotation")
        if kind.futures:
            returns = _Futures().visit(ast.parse(ast.unparse(returns), mode="eval").body)
            annotation = ast.unparse(returns)
        else:
            annotation = _segment(source, returns)
        used |= _names(returns) | _names(node.args)
        params = _parameters(source, node.args)
        if overload:
            used.add("overload")
            out += ["", f"{INDENT}@overload"]
            out += _bracketed(f"def {method.name}(", params, f") -> {annotation}: ...", INDENT)
            continue
        out.append("")
        out += _bracketed(f"def {method.name}(", params, f") -> {annotation}:", INDENT)
        doc = ast.get_docstring(node)
        if doc is None:
            raise GenerateError(f"Engine.{method.name} has no docstring")
        out += _docstring(method, doc)
        out += _body(method, node)
    return out


@dataclasses.dataclass
class _Call:
    """A call to write: ``func(args)``, where an argument may be a call itself."""

    func: str
    args: list[str | _Call]

    def flat(self) -> str:
        return f"{self.func}({', '.join(_flat(a) for a in self.args)})"


def _flat(expr: str | _Call) -> str:
    return expr if isinstance(expr, str) else expr.flat()


def _format(expr: str | _Call, indent: str, prefix: str = "", suffix: str = "") -> list[str]:
    """``prefix + expr + suffix`` as ruff formats it: on one line if it fits, else the call's
    arguments on one line of their own, else its one argument split further, else one
    argument per line with a trailing comma."""
    line = f"{indent}{prefix}{_flat(expr)}{suffix}"
    if len(line) <= LINE or isinstance(expr, str):
        return [line]
    head, close, inner = f"{indent}{prefix}{expr.func}(", f"{indent}){suffix}", indent + INDENT
    joined = inner + ", ".join(_flat(a) for a in expr.args)
    if len(joined) <= LINE:
        return [head, joined, close]
    if len(expr.args) == 1:
        return [head, *_format(expr.args[0], inner), close]
    return [head, *(line for a in expr.args for line in _format(a, inner, suffix=",")), close]


def _body(method: _Method, node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """The one statement of a mirrored method (see :data:`KINDS`)."""
    name, kind = method.name, method.mirror.kind
    # A method that returns None calls without ``return`` (mypy: func-returns-value).
    returns_none = isinstance(node.returns, ast.Constant) and node.returns.value is None
    prefix = "" if returns_none else "return "
    if kind == "decorator":  # the Engine method called without its function
        fn = [*node.args.posonlyargs, *node.args.args][1].arg
        engine = _Call(f"self._engine.{name}", list(_passed(node.args, skip=1)))
        call = _Call("self._decorator", [fn, engine])
    elif kind == "call":
        call = _Call(f"self._engine.{name}", list(_passed(node.args)))
    else:
        engine = _Call(f"lambda: self._engine.{name}", list(_passed(node.args)))
        if kind == "push":
            call = _Call("self._bridge", [engine])
        else:
            call = _Call("self._wait", [f'"{name}()"', engine])
    return _format(call, 2 * INDENT, prefix)


def _sorted_names(names: set[str]) -> list[str]:
    """Names as ruff's isort orders them: CONSTANTS, then Classes, then the rest."""

    def key(name: str) -> tuple[int, str]:
        bare = name.lstrip("_")
        if bare.isupper() and len(bare) > 1:
            return 0, name
        return (1 if bare[:1].isupper() else 2), name.lower()

    return sorted(names, key=key)


def _imports_and_definitions(tree: ast.Module, source: list[bytes], used: set[str]) -> list[str]:
    """The imports and engine.py's module-level definitions (``T``, ``_CPU0``...) that the
    generated code uses, found by following engine.py's own bindings."""
    bindings: dict[str, tuple[str, int] | ast.Assign] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                bindings[alias.asname or alias.name] = (node.module, node.level)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                bindings[target.id] = node
    froms: dict[tuple[int, str], set[str]] = {}
    definitions: list[ast.Assign] = []
    todo = sorted(used)
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or name in vars(builtins) or name in ("self", "concurrent", "Engine"):
            continue
        seen.add(name)
        binding = bindings.get(name) or OWN_IMPORTS.get(name)
        if binding is None:
            raise GenerateError(f"{name!r} is not imported or defined in {SOURCE.name}")
        if isinstance(binding, tuple):
            module, level = binding
            froms.setdefault((level, module), set()).add(name)
        else:
            definitions.append(binding)
            todo += sorted(_names(binding.value))
    lines = ["from __future__ import annotations", "", "import concurrent.futures"]
    for (level, module), names in sorted(froms.items()):
        if level and not lines[-1].startswith("from ."):
            lines.append("")  # the package's own modules: isort's last section
        head = f"from {'.' * level}{module} import "
        line = head + ", ".join(_sorted_names(names))
        if len(line) <= LINE:
            lines.append(line)
        else:
            lines += [head + "(", *(f"{INDENT}{n}," for n in _sorted_names(names)), ")"]
    lines += ["", "if TYPE_CHECKING:", f"{INDENT}from .engine import Engine", ""]
    for node in sorted(definitions, key=lambda n: n.lineno):
        lines.append(_segment(source, node))
    return lines


HEADER = f"""\
# Generated by tools/gen_blocking.py from aioengine/engine.py; do not edit.
# Regenerate with: {COMMAND}
"""

MODULE_DOC = '''\
"""BlockingEngine's methods that mirror :class:`~aioengine.Engine`'s, generated from them.

``BlockingMethods`` is a base class of :class:`~aioengine.BlockingEngine` (``blocking.py``):
each method has the signature and overloads of the Engine method of the same name, with
:class:`concurrent.futures.Future` for :class:`~aioengine.Operation` where BlockingEngine
returns futures, and delegates in one line to a helper of BlockingEngine (``_bridge``,
``_wait``, ``_decorator``) or to the Engine. See tools/gen_blocking.py for which methods are
mirrored and how.
"""
'''

CLASS_DOC = '''\
class BlockingMethods:
    """The Engine's methods, for synchronous code: the base of :class:`~aioengine.BlockingEngine`.

    Pushes return :class:`concurrent.futures.Future` objects and waits block the calling
    thread; see :class:`~aioengine.BlockingEngine`.
    """

    __slots__ = ()
'''


def generate(source: str | None = None) -> str:
    """The text of ``aioengine/_blocking_generated.py`` for engine.py's ``source``.

    Raises:
        GenerateError: if engine.py lacks a mirrored method, a docstring or an annotation.
    """
    if source is None:
        source = SOURCE.read_text()
    tree = ast.parse(source)
    lines = source.encode().splitlines()
    used = _names(ast.parse(HELPERS))
    body: list[str] = []
    for method in _engine_methods(tree):
        body += _method(lines, method, used)
    parts = [
        HEADER + MODULE_DOC,
        "\n".join(_imports_and_definitions(tree, lines, used)),
        "",
        "",
        CLASS_DOC + "\n" + textwrap.indent(HELPERS, INDENT) + "\n".join(body),
    ]
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write the generated module, or with ``--check`` say whether it is stale."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    args = parser.parse_args(argv)
    text = generate()
    current = TARGET.read_text() if TARGET.exists() else ""
    if args.check:
        if text != current:
            print(f"{TARGET.relative_to(ROOT)} is stale; run: {COMMAND}", file=sys.stderr)
            return 1
        return 0
    if text != current:
        TARGET.write_text(text)
        print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
