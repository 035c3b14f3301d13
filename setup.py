"""Build aioengine's optional compiled core.

aioengine is pure Python. A wheel built here also compiles ``scheduler.py``, ``engine.py``,
``corestate.py``, ``operation.py``, ``var.py``, ``bulk.py``, ``loopqueue.py`` and
``wakeups.py`` with Cython, typed by the ``.pxd`` files beside them (and ``functions.py`` and
``gpu_sync.py``, untyped): the same source, with the hot path's attribute accesses made C
struct reads. It halves the engine's own cost per operation (docs/performance.md). It also
compiles ``aioengine/array/_numpy_loops.pyx``, which has no Python twin: it runs a fused
array chain through NumPy's own inner loops without the GIL (without it, NumPy calls do the
same work). The compiled modules are skipped, and the pure-Python modules used, when:

- ``AIOENGINE_NO_EXTENSIONS`` is set to a non-empty value other than ``0``;
- the interpreter is not CPython;
- the install is editable (``pip install -e .``): the sources in the tree must be what
  runs, never a stale build of them;
- compiling fails (no C compiler, say): a message says so, and the install goes on with
  none of them compiled (where only ``_numpy_loops.pyx`` fails, the install goes on without
  it alone: nothing else needs it).

``AIOENGINE_REQUIRE_EXTENSIONS=1`` turns that last case into an error (``nox -s
tests_compiled`` sets it).
"""

from __future__ import annotations

import os
import platform
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

COMPILED = (
    "aioengine.lock",
    "aioengine.var",
    "aioengine.operation",
    "aioengine.tracelog",
    "aioengine.bulk",
    "aioengine.loopqueue",
    "aioengine.wakeups",
    "aioengine.corestate",
    "aioengine.scheduler",
    "aioengine.engine",
    # Without declarations of their own: a push classifies its function (functions.py), and a
    # GPU worker launches each operation (gpu_sync.py), compiled as they were inside engine.py.
    "aioengine.functions",
    "aioengine.gpu_sync",
)

# Compiled from a .pyx of their own, with no Python twin: a module that has no pure-Python
# form (calling NumPy's inner loops without the GIL). The package works without them: the
# arrays evaluate fused chains with NumPy calls instead (aioengine/array/_numpy_fuse.py).
NATIVE = ("aioengine.array._numpy_loops",)


def _flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


class OptionalBuildExt(build_ext):
    """``build_ext`` that leaves the package pure Python when it cannot or should not compile."""

    def run(self) -> None:
        if self.inplace or self.editable_mode:
            self._skip("an editable install runs the Python sources")
            return
        try:
            super().run()
        except Exception as exc:
            self._failed(exc)

    def build_extension(self, ext: Extension) -> None:
        # Cythonized here, when a module is about to be compiled (never for an editable
        # install, nor for egg_info or an sdist), and into the Extension that setuptools has
        # already prepared: only its sources change, from the .py to the generated C.
        if ext.name not in NATIVE or _flag("AIOENGINE_REQUIRE_EXTENSIONS"):
            self._compile(ext)
            return
        try:  # a native module is optional on its own: the rest of the core does not need it
            self._compile(ext)
        except Exception as exc:
            print(
                f"aioengine: not compiling {ext.name} ({type(exc).__name__}: {exc}); the "
                "arrays evaluate fused chains with NumPy calls",
                file=sys.stderr,
            )

    def _compile(self, ext: Extension) -> None:
        (generated,) = _cythonize([Extension(ext.name, list(ext.sources))])
        ext.sources = generated.sources
        super().build_extension(ext)

    def _failed(self, exc: Exception) -> None:
        if _flag("AIOENGINE_REQUIRE_EXTENSIONS"):
            raise exc
        # All or none: the compiled engine imports the compiled Var and _OperationCore types,
        # so a module built before the failure must not be installed on its own.
        for ext in self.extensions or ():
            path = self.get_ext_fullpath(ext.name)
            if os.path.exists(path):
                os.remove(path)
        self._skip(f"compiling failed ({type(exc).__name__}: {exc})")

    def _skip(self, why: str) -> None:
        self.extensions = []
        print(
            f"aioengine: not compiling the core, {why}; using the pure-Python modules",
            file=sys.stderr,
        )


def _cythonize(extensions: list[Extension]) -> list[Extension]:
    from Cython.Build import cythonize

    return cythonize(
        extensions,
        build_dir="build/cython",
        compiler_directives={
            "language_level": 3,
            # Functions stay introspectable (inspect.signature, the API docs).
            "binding": True,
            # Only the .pxd files type the code: an annotation such as ``int`` must not
            # become a C type or an exact-type check that the Python modules lack.
            "annotation_typing": False,
        },
    )


def _extensions() -> list[Extension]:
    if _flag("AIOENGINE_NO_EXTENSIONS") or platform.python_implementation() != "CPython":
        return []
    return [Extension(name, [name.replace(".", "/") + ".py"]) for name in COMPILED] + [
        Extension(name, [name.replace(".", "/") + ".pyx"]) for name in NATIVE
    ]


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
