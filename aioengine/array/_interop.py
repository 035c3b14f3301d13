"""NumPy's protocols: ``np.sin(x)``, ``np.add(a, x, out=...)``, ``np.mean(x)`` on arrays.

* ``__array_ufunc__`` (NEP 13): every elementwise ufunc call on an array becomes a push, with
  the ufunc itself as the function (metadata by broadcasting and sampling, as the namespace's
  elementwise functions); ``out=`` an array of the namespace is an in-place write on it;
  ``reduce``, ``accumulate`` and ``outer`` are pushes too. A generalized ufunc (``matmul``,
  ``vecdot``: not elementwise) with a namespace equivalent calls it (``out=`` an array: the
  result written into it); any other one is a sync point, as below. Anything else (``at``,
  ``reduceat``, an elementwise ufunc's ``out=`` a NumPy array) returns NotImplemented, and
  NumPy raises ``TypeError``.
* ``__array_function__`` (NEP 18): a NumPy function with a namespace equivalent (the same name
  in ``numpy``, ``numpy.linalg`` or ``numpy.fft``, or an alias such as ``concatenate`` for
  ``concat``) calls it, its arguments bound by NumPy's signature (NumPy's keywords mapped to
  the namespace's, NumPy's defaults kept where they differ: ``np.cumsum`` of a 2-D array
  flattens it, ``np.squeeze`` drops every axis of size 1); a keyword the namespace does not
  take raises ``TypeError`` naming it. The result is an array: a push.
* Any other NumPy function (``np.median``, ``np.histogram``, ``np.allclose``, ...) is a **sync
  point**: NumPy's own function on the values of its array arguments (anywhere in its
  arguments, inside lists and tuples too), which it gets as ``np.asarray(x)`` does: blocking
  off the event loop's thread; on it, a pending argument raises
  :class:`~aioengine.array.PendingArrayError` naming the function. Its result is NumPy's (a
  NumPy array, a scalar, a tuple ...), not an array of the namespace. ``np.ndim``,
  ``np.shape``, ``np.size``, ``np.iscomplexobj`` and ``np.isrealobj`` answer from the
  metadata, without the value.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _meta
from ._array import (
    Array,
    check_writable,
    concrete_shape,
    host_value,
    known_shape,
    operand_ok,
)
from ._fft import FFT
from ._linalg import Linalg
from ._meta import broadcast
from ._push import check_same, elementwise, operand, push, push1, reduction
from ._sync import PendingArrayError

if TYPE_CHECKING:
    from ._push import Pusher

__all__ = ("array_function", "array_ufunc", "sync_call")

# NumPy's name -> the namespace's, where they differ.
_ALIASES = {
    "concatenate": "concat",
    "transpose": "permute_dims",
    "power": "pow",
    "absolute": "abs",
    "cumsum": "cumulative_sum",
    "cumprod": "cumulative_prod",
    "amax": "max",
    "amin": "min",
}
# NumPy's keyword -> the namespace's.
_KEYWORDS = {"ddof": "correction", "a_min": "min", "a_max": "max"}
# The generalized ufuncs with a namespace equivalent, and the keywords it takes.
_GUFUNCS = {"matmul": frozenset(), "vecdot": frozenset({"axis"})}


def _values(what: str, value: Any) -> Any:
    """``value`` with every array in it (inside lists and tuples too) replaced by its value
    (a sync point)."""
    if isinstance(value, Array):
        try:
            return host_value(value, what)
        except PendingArrayError as exc:
            raise PendingArrayError(
                f"{exc}; or run the NumPy function in an operation that reads the array "
                "when its turn comes: xp.apply(fn, x, shape=..., dtype=...)"
            ) from None
    if (type(value) is list or type(value) is tuple) and any(
        isinstance(v, Array | list | tuple) for v in value
    ):
        return type(value)(_values(what, v) for v in value)
    return value


def _writes_into_array(value: Any) -> bool:
    if isinstance(value, tuple):
        return any(isinstance(v, Array) for v in value)
    return isinstance(value, Array)


def sync_call(
    fn: Callable[..., Any], what: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``fn(*args, **kwargs)`` on the values of the arrays in the arguments: a sync point
    (``what`` names it in a :class:`PendingArrayError`)."""
    if _writes_into_array(kwargs.get("out")):
        raise TypeError(
            f"{what} with out= an aioengine array is not supported: {what} is a sync point, "
            "computed by NumPy on the values; assign its result instead (x[...] = result)"
        )
    values = tuple(_values(what, a) for a in args)
    kwvalues = {k: _values(what, v) for k, v in kwargs.items()}
    return fn(*values, **kwvalues)


def _inplace_call(ufunc: np.ufunc, kwargs: dict[str, Any], target: Any, *values: Any) -> None:
    ufunc(*values, out=target, **kwargs)


def _outer(ufunc: np.ufunc, x: Any, y: Any) -> Any:
    return ufunc.outer(x, y)


def array_ufunc(
    ns: Pusher, ufunc: np.ufunc, method: str, inputs: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``__array_ufunc__`` of the arrays of ``ns``."""
    for x in inputs:
        if not operand_ok(x):
            return NotImplemented
    if ufunc.signature is not None:
        return _gufunc(ns, ufunc, method, inputs, kwargs)
    out = kwargs.pop("out", None)
    extra = set(kwargs) - {"dtype", "axis", "keepdims"}
    if extra:
        raise TypeError(
            f"numpy.{ufunc.__name__}.{method} with {', '.join(sorted(extra))}= is not supported "
            "on aioengine arrays"
        )
    name = ufunc.__name__
    if method == "__call__":
        if ufunc.nout != 1:
            return _multi(ns, ufunc, inputs)
        if out is not None:
            (target,) = out
            if not isinstance(target, Array):
                return NotImplemented  # writing into a NumPy array asynchronously: no
            return _into(ns, ufunc, inputs, target, kwargs)
        return elementwise(ns, ufunc, name, inputs, **kwargs)
    if out is not None:
        return NotImplemented
    (x, *rest) = inputs
    x = operand(ns, x)
    if not isinstance(x, Array):
        return NotImplemented
    if method == "reduce" and not rest:
        axis = kwargs.pop("axis", 0)
        keepdims = kwargs.pop("keepdims", False)
        return reduction(ns, ufunc.reduce, f"{name}.reduce", x, axis, keepdims, **kwargs)
    if method == "accumulate" and not rest:
        axis = _meta.axis_index(kwargs.pop("axis", 0), x.ndim)
        fn = functools.partial(ufunc.accumulate, axis=axis, **kwargs)
        dtype = _meta.sample_dtype(
            ufunc.accumulate, [(x.dtype, (1,) * x.ndim)], axis=axis, **kwargs
        )
        return push1(ns, fn, (x,), known_shape(x), dtype, check_same(ns, [x]), f"{name}.accumulate")
    if method == "outer" and len(rest) == 1:
        y = operand(ns, rest[0])
        arrays = [a for a in (x, y) if isinstance(a, Array)]
        device = check_same(ns, arrays)
        dtype = _meta.sample_dtype(ufunc, [x.dtype, y.dtype if isinstance(y, Array) else y.value])
        shape = (*known_shape(x), *y.shape)
        return push1(
            ns, functools.partial(_outer, ufunc), (x, y), shape, dtype, device, f"{name}.outer"
        )
    return NotImplemented


def _gufunc(
    ns: Pusher, ufunc: np.ufunc, method: str, inputs: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """A generalized ufunc (core dimensions: not elementwise): the namespace's function of
    the same name where it has one and takes the keywords, else a sync point."""
    name = ufunc.__name__
    keywords = _GUFUNCS.get(name)
    out = kwargs.get("out")
    target: Any = out[0] if isinstance(out, tuple) and len(out) == 1 else out
    if (
        method == "__call__"
        and keywords is not None
        and set(kwargs) - {"out"} <= keywords
        and (out is None or isinstance(target, Array))
    ):
        kwargs = {k: v for k, v in kwargs.items() if k != "out"}
        result: Array = getattr(ns, name)(*(_convert(ns, a) for a in inputs), **kwargs)
        if not isinstance(target, Array):
            return result
        # out= an array: the result written into it (an in-place write after the push).
        if (known_shape(result), result.dtype) != (known_shape(target), target.dtype):
            raise ValueError(
                f"{name}(..., out=): the result's shape and dtype {known_shape(result)} "
                f"{result.dtype} are not out's {known_shape(target)} {target.dtype}"
            )
        target[...] = result
        return target
    fn = ufunc if method == "__call__" else getattr(ufunc, method)
    what = f"numpy.{name}" if method == "__call__" else f"numpy.{name}.{method}"
    return sync_call(fn, f"{what}()", inputs, kwargs)


def _into(
    ns: Pusher, ufunc: np.ufunc, inputs: tuple[Any, ...], target: Array, kwargs: dict[str, Any]
) -> Array:
    operands = tuple(operand(ns, a) for a in inputs)
    arrays = [a for a in operands if isinstance(a, Array)]
    device = check_same(ns, [target, *arrays])
    check_writable(ns, target)
    shape = broadcast(*(known_shape(a) for a in arrays))
    dtype = _meta.sample_dtype(
        ufunc, [a.dtype if isinstance(a, Array) else a.value for a in operands], **kwargs
    )
    if dtype != target.dtype:
        raise TypeError(
            f"{ufunc.__name__}(..., out=): the result dtype {dtype} is not out's dtype "
            f"{target.dtype}"
        )
    tshape = known_shape(target)
    if broadcast(shape, tshape) != tshape:
        raise ValueError(
            f"{ufunc.__name__}(..., out=): the result shape {shape} does not fit out's shape "
            f"{tshape}"
        )
    fn = functools.partial(_inplace_call, ufunc, kwargs)
    push(
        ns,
        fn,
        (target, *operands),
        (),
        device,
        ufunc.__name__,
        _meta.prod(tshape),
        target=target,
    )
    return target


def _multi(ns: Pusher, ufunc: np.ufunc, inputs: tuple[Any, ...]) -> tuple[Array, ...]:
    operands = tuple(operand(ns, a) for a in inputs)
    arrays = [a for a in operands if isinstance(a, Array)]
    device = check_same(ns, arrays)
    shape = broadcast(*(known_shape(a) for a in arrays))
    dtypes = _meta.sample_dtype(
        ufunc, [a.dtype if isinstance(a, Array) else a.value for a in operands]
    )
    outs = tuple((shape, d) for d in dtypes)
    return push(ns, ufunc, operands, outs, device, ufunc.__name__, _meta.prod(shape))


_TABLES: dict[type, dict[Callable[..., Any], tuple[str, str]]] = {}


def _table(ns: Pusher) -> dict[Callable[..., Any], tuple[str, str]]:
    """NumPy function -> (namespace path, name): built once per namespace class, from the
    names both have (the namespace's class comes from ``ns``: this module is imported by the
    namespace's, not the reverse; its extensions' are ``xp.linalg``'s and ``xp.fft``'s)."""
    table = _TABLES.get(type(ns))
    if table is None:
        table = _TABLES[type(ns)] = _build_table(type(ns), Linalg, FFT)
    return table


def _build_table(
    namespace: type, linalg: type, fft: type
) -> dict[Callable[..., Any], tuple[str, str]]:
    table: dict[Callable[..., Any], tuple[str, str]] = {}
    for module, cls, path in (
        (np, namespace, ""),
        (np.linalg, linalg, "linalg"),
        (np.fft, fft, "fft"),
    ):
        for name in dir(cls):
            if name.startswith("_"):
                continue
            fn = getattr(module, name, None)
            if callable(fn) and not isinstance(fn, np.ufunc | type):
                table[fn] = (path, name)
    for np_name, ns_name in _ALIASES.items():
        fn = getattr(np, np_name, None)
        if callable(fn) and not isinstance(fn, np.ufunc):
            table.setdefault(fn, ("", ns_name))
    return table


def _convert(ns: Pusher, value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return ns.asarray(value)
    if isinstance(value, list | tuple) and any(isinstance(v, Array | np.ndarray) for v in value):
        return type(value)(_convert(ns, v) for v in value)
    return value


def array_function(
    ns: Pusher,
    func: Callable[..., Any],
    types: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """``__array_function__`` of the arrays of ``ns``."""
    entry = _table(ns).get(func)
    if entry is None:
        if func in _METADATA and len(args) == 1 and not kwargs and isinstance(args[0], Array):
            known = _METADATA[func](args[0])
            if known is not None:
                return known
        return sync_call(func, f"numpy.{func.__name__}()", args, kwargs)
    path, name = entry
    target = getattr(getattr(ns, path) if path else ns, name)
    try:
        np_sig = inspect.signature(func)
        bound = np_sig.bind(*args, **kwargs)
    except (TypeError, ValueError):
        return target(*(_convert(ns, a) for a in args), **kwargs)
    _numpy_defaults(ns, func.__name__, bound.arguments)
    ns_sig = inspect.signature(target)
    params = list(ns_sig.parameters.values())
    npos = sum(p.kind is inspect.Parameter.POSITIONAL_ONLY for p in params)
    var = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
    given = list(bound.arguments.items())
    positional: list[Any] = []
    keywords: dict[str, Any] = {}
    sources: dict[str, str] = {}  # the namespace's keyword -> NumPy's, as given
    for i, (key, value) in enumerate(given):
        kind = np_sig.parameters[key].kind
        if kind is inspect.Parameter.VAR_POSITIONAL and var:
            positional.extend(value)
            continue
        if kind is inspect.Parameter.VAR_KEYWORD:
            keywords.update(value)
            continue
        if i < npos:
            positional.append(value)
            continue
        np_key, key = key, _KEYWORDS.get(key, key)
        if key in keywords:  # np.clip(x, a_min=0, min=0)
            raise TypeError(
                f"numpy.{func.__name__}: {sources[key]}= and {np_key}= give one argument twice"
            )
        if key in ns_sig.parameters:
            keywords[key] = value
            sources[key] = np_key
        elif value is not None and value is not np._NoValue:
            raise TypeError(
                f"numpy.{func.__name__}(..., {key}=) is not supported on aioengine arrays "
                f"(the namespace's {name} takes {', '.join(ns_sig.parameters)})"
            )
    if name == "permute_dims" and keywords.get("axes") is None and positional:
        keywords["axes"] = tuple(reversed(range(positional[0].ndim)))  # np.transpose(x)
    try:
        return target(
            *(_convert(ns, a) for a in positional),
            **{k: _convert(ns, v) for k, v in keywords.items()},
        )
    except (TypeError, ValueError, IndexError) as exc:
        exc.add_note(f"in numpy.{func.__name__}, computed by the namespace's {name}")
        raise


def _shape(x: Array) -> tuple[int, ...] | None:
    shape = x.shape
    return None if None in shape else shape  # type: ignore[return-value]


# NumPy functions answered from the metadata (None: unknown yet, the value is needed).
_METADATA: dict[Callable[..., Any], Callable[[Array], Any]] = {
    np.ndim: lambda x: x.ndim,
    np.shape: _shape,
    np.size: lambda x: x.size,
    np.iscomplexobj: lambda x: x.dtype.kind == "c",
    np.isrealobj: lambda x: x.dtype.kind != "c",
}


def _numpy_defaults(ns: Pusher, np_name: str, arguments: dict[str, Any]) -> None:
    """Where NumPy's function and the namespace's differ in a default or an argument's form,
    rewrite NumPy's bound ``arguments`` (in place) to the namespace's form of NumPy's meaning."""
    x = arguments.get("a")
    if not isinstance(x, Array):
        return
    if np_name in ("cumsum", "cumprod") and arguments.get("axis") is None and x.ndim != 1:
        arguments["a"] = ns.reshape(x, (-1,))  # NumPy's axis=None: over the flattened array
    elif np_name == "squeeze" and arguments.get("axis") is None:
        shape = concrete_shape(ns, x, "numpy.squeeze()")
        arguments["axis"] = tuple(i for i, d in enumerate(shape) if d == 1)
    elif np_name == "reshape" and isinstance(arguments.get("shape"), int):
        arguments["shape"] = (arguments["shape"],)
