"""One CuPy kernel per fused chain: a chain's program as a ``cupy.fuse`` function.

On a real GPU a fused chain (``_chain.py``: one kernel per chunk, and a GPU array is one chunk)
enqueues its program on the operation's stream. Each step as a CuPy call of its own would be one
kernel launch and one pass over device memory per step; ``cupy.fuse``, CuPy's decorator that
"fuses a function" into one elementwise kernel, makes the whole program one of each. The
function is built from the program's structure: each step calls the CuPy ufunc of the NumPy
ufunc's name on its operands (an input of the kernel, the result of an earlier step, or a
scalar), and each live result is written into its allocation through the ufunc's output
argument (CuPy casts to it with the ``same_kind`` rule, so the result has the dtype the
operation promised). Scalars are arguments of the function, not constants of its source, so
programs that differ only in them share one function; functions are cached by structure (CuPy's
documentation: "it is recommended to reuse the same decorated functions"), and CuPy compiles
each one once per argument dtypes.

A program with a step CuPy cannot fuse (a function that is not a ufunc, a ufunc CuPy lacks)
is not fused: the caller evaluates it step by step, each call enqueued on the stream.

CuPy is imported only when a GPU context on the CuPy backend runs a chain (this module imports
without it). Written against CuPy's documented API (``cupy.fuse``, ``cupy.ufunc``); only a GPU
machine runs it (``tests/test_gpu_cupy.py``).

State: ``_FUSED``, the fused functions by program structure (any worker thread reads and fills
it; a race makes the same function twice, and one of them is kept).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ("FUSED_MAX", "Operand", "cupy_module", "fused_call")

#: An operand of a step: ``("in", i)``, the kernel's ``i``-th input; ``("reg", k)``, the result
#: of step ``k``; ``("const", value)``, a Python scalar.
Operand = tuple[str, Any]

#: The most fused functions kept (a program of another structure beyond it clears the cache).
FUSED_MAX = 256

_FUSED: dict[tuple[Any, ...], Any] = {}
_lock = threading.Lock()


def cupy_module() -> Any:
    """The ``cupy`` module (imported on first use; a GPU on the CuPy backend has it)."""
    import cupy

    return cupy


def fused_call(
    program: Sequence[tuple[Callable[..., Any], tuple[Operand, ...]] | None],
    values: Sequence[Any],
    dests: Sequence[Any],
) -> bool:
    """Enqueue ``program`` on the current stream as one ``cupy.fuse`` kernel; False (nothing
    enqueued) if it cannot be fused.

    Args:
        program: per step, its NumPy ufunc and operands (None: a step that is no ufunc).
        values: the kernel's inputs (CuPy arrays of one size, flat).
        dests: per step, the allocation its result is written into (flat), or None for a
            result nobody holds (it stays a register of the kernel).
    """
    cupy = cupy_module()
    ufuncs = []
    steps: list[tuple[Operand, ...]] = []
    for step in program:
        if step is None:
            return False
        ufunc = getattr(cupy, getattr(step[0], "__name__", ""), None)
        if not isinstance(ufunc, cupy.ufunc) or ufunc.nout != 1 or ufunc.nin != len(step[1]):
            return False
        ufuncs.append(ufunc)
        steps.append(step[1])
    live = tuple(k for k, dest in enumerate(dests) if dest is not None)
    structure = tuple(
        (ufunc.__name__, tuple((kind, type(ref) if kind == "const" else ref) for kind, ref in ops))
        for ufunc, ops in zip(ufuncs, steps, strict=True)
    )
    key = (structure, live, len(values))
    fused = _FUSED.get(key)
    if fused is None:
        fused = cupy.fuse(kernel_name="aioengine_chain")(_program(ufuncs, steps, live, len(values)))
        with _lock:
            if len(_FUSED) >= FUSED_MAX:
                _FUSED.clear()
            _FUSED[key] = fused
    consts = [ref for ops in steps for kind, ref in ops if kind == "const"]
    fused(*values, *consts, *(dests[k] for k in live))
    return True


def _program(
    ufuncs: list[Any], steps: list[tuple[Operand, ...]], live: tuple[int, ...], n_in: int
) -> Callable[..., None]:
    """The function ``cupy.fuse`` traces: arguments the inputs, the scalars in order, then the
    live results' allocations; each step one ufunc call (the last argument its output when
    its result is live)."""
    n_const = sum(kind == "const" for ops in steps for kind, _ in ops)
    out_of = {k: i for i, k in enumerate(live)}

    def chain(*args: Any) -> None:
        inputs = args[:n_in]
        consts = args[n_in : n_in + n_const]
        outs = args[n_in + n_const :]
        regs: list[Any] = []
        c = 0
        for k, (ufunc, ops) in enumerate(zip(ufuncs, steps, strict=True)):
            xs = []
            for kind, ref in ops:
                if kind == "in":
                    xs.append(inputs[ref])
                elif kind == "reg":
                    xs.append(regs[ref])
                else:
                    xs.append(consts[c])
                    c += 1
            out = out_of.get(k)
            regs.append(ufunc(*xs) if out is None else ufunc(*xs, outs[out]))

    return chain
