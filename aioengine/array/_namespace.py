"""The Array API namespace bound to one engine: every function a push.

``namespace(engine)`` returns the :class:`Namespace` of ``engine`` (one per engine). Its
functions are the Python Array API standard's (revision 2024.12, with the ``linalg`` and
``fft`` extensions) with NumPy's semantics, each an operation pushed to the engine
(``_push.py`` says how). The standard's groups are mixins, one module each (``_creation.py``,
``_dtypes.py``, ``_indexing.py``, ``_manipulation.py``, ``_searching.py``, ``_statistics.py``,
``_products.py``); the elementwise functions are built here from one table
(``_special.ELEMENTWISE``), with aioengine's own ``apply`` and the NumPy protocols.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import BlockingEngine, Context, Engine, FnProperty
from . import _meta
from ._array import Array, known_shape
from ._creation import Creation
from ._dtypes import DataTypes
from ._fft import FFT
from ._info import DTYPE_NAMES, Info
from ._interop import array_function, array_ufunc
from ._kernel import Applied, Const
from ._linalg import Linalg
from ._manipulation import Manipulation
from ._meta import as_dtype, broadcast
from ._products import Products
from ._push import (
    CPU,
    NORMAL,
    check_same,
    chunk_bytes_setting,
    copy_value,
    elementwise,
    operand,
    push1,
)
from ._remote import call as remote_call
from ._remote import involves_remote, is_remote
from ._remote_store import REMOTE_CHUNK_BYTES
from ._remote_zarr import read_all, zarr_meta
from ._searching import Searching
from ._special import ELEMENTWISE, elementwise_function
from ._statistics import Statistics

__all__ = ("NOT_FOR_BOOL", "Namespace")


def _numeric_from_bool(name: str) -> bool:
    """Whether NumPy's ``name`` makes a number of a bool array (``expm1`` a float16,
    ``square`` an int8): arithmetic on bools, which the standard refuses."""
    try:
        with np.errstate(all="ignore"):
            return bool(getattr(np, name)(np.ones((), dtype=bool)).dtype != np.bool_)
    except TypeError:
        return False  # NumPy refuses it itself (negative, sign, ...)


#: The unary elementwise functions that refuse a bool array (TypeError at the call, as
#: array_api_strict does): those whose NumPy result from bools is a number.
NOT_FOR_BOOL = frozenset(
    name for name, arity in ELEMENTWISE.items() if arity == 1 and _numeric_from_bool(name)
)


def _clip(names: tuple[str, ...], x: Any, *bounds: Any) -> Any:
    return np.clip(x, **dict(zip(names, bounds, strict=True)))


def _upload(xp: Any, value: Any) -> Any:
    return xp.array(value, copy=True)


def _download(value: Any) -> Any:
    get = getattr(value, "get", None)
    return (
        get()
        if get is not None and not isinstance(value, np.ndarray)
        else np.array(value, copy=True)
    )


class Namespace(Creation, DataTypes, Manipulation, Searching, Statistics, Products):
    """The Array API namespace of one engine (revision 2024.12); see the module docstring.

    Get it with :func:`aioengine.array.namespace`; ``x.__array_namespace__()`` returns it too.
    """

    __array_api_version__ = "2024.12"

    e = math.e
    inf = math.inf
    nan = math.nan
    pi = math.pi
    newaxis = None

    def __init__(self, engine: Engine | BlockingEngine, chunk_bytes: int | None = None) -> None:
        super().__init__(engine, chunk_bytes_setting(chunk_bytes))
        #: The chunk size of remote arrays (``device=ae.remote()``), in bytes of float64: the
        #: chunk size chosen for this namespace (argument or environment), else
        #: :data:`~aioengine.array._remote_store.REMOTE_CHUNK_BYTES` (an aioengine extension).
        given = chunk_bytes is not None or bool(
            os.environ.get("AIOENGINE_ARRAY_CHUNK_BYTES", "").strip()
        )
        self.remote_chunk_bytes = self.chunk_bytes if given else REMOTE_CHUNK_BYTES
        #: The module-like name that Array-API-generic libraries read to tell namespaces
        #: apart (array-api-compat, scikit-learn, SciPy): the package's name, or
        #: ``"aioengine.array_api"`` for that module's namespace.
        self.__name__ = "aioengine.array"
        for name in DTYPE_NAMES:
            setattr(self, name, np.dtype(name))
        self.linalg = Linalg(self)
        self.fft = FFT(self)

    def __repr__(self) -> str:
        return f"<aioengine.array namespace of {self._engine!r}>"

    def __array_namespace_info__(self) -> Info:
        """The namespace's inspection utilities."""
        return Info(self)

    def clip(self, x: Array, /, min: Any = None, max: Any = None) -> Array:
        """Clamp each element of ``x`` to ``[min, max]`` (arrays or scalars; None: unbounded).

        The result has ``x``'s dtype, which the bounds must fit (TypeError at the call), and the
        shape of ``x`` and the bounds broadcast together (ValueError at the call if they do
        not), as NumPy's ``clip``: ``x``'s own but for bounds of more dimensions, or empty ones.
        """
        if not isinstance(x, Array):
            raise TypeError("clip() needs an array")
        names = tuple(kw for bound, kw in ((min, "min"), (max, "max")) if bound is not None)
        operands = tuple(operand(self, a) for a in (x, *(b for b in (min, max) if b is not None)))
        arrays = [a for a in operands if isinstance(a, Array)]
        device = check_same(self, arrays)
        xshape = known_shape(x)
        try:
            shape = broadcast(*(known_shape(a) for a in arrays))
        except ValueError:
            raise ValueError(f"clip: the bounds do not broadcast with x's shape {xshape}") from None
        for a in operands[1:]:
            bound = a.dtype if isinstance(a, Array) else a.value
            if _meta.sample_dtype(np.maximum, [x.dtype, bound]) != x.dtype:
                raise TypeError(f"clip: a bound {bound!r} does not fit x's dtype {x.dtype}")
        return push1(self, partial(_clip, names), operands, shape, x.dtype, device, "clip")

    def apply(
        self, fn: Callable[..., Any], /, *args: Any, shape: Any, dtype: Any, device: Any = None
    ) -> Any:
        """Run ``fn(*values)`` on the CPU pool as one operation reading the array arguments
        (other arguments are passed as they are) and return an array of ``shape`` and
        ``dtype``. ``fn`` must return a NumPy array of exactly that shape and dtype: anything
        else is the result's failure, not a silent cast (an ``ndarray`` subclass, such as
        ``np.matrix``, is stored as a plain NumPy array). An aioengine extension.

        On the cluster (remote array arguments, or ``device=ae.remote()``) ``fn`` runs once
        per chunk of rows, on the worker holding it: it gets the arrays' rows ``lo:hi`` and
        returns the result's, of shape ``(hi - lo, *shape[1:])``; with no array argument (a
        loader) it is called as ``fn(*args, rows=slice(lo, hi))``. See the cluster how-to."""
        if device is not None and getattr(device, "device_type", None) is not CPU:
            raise ValueError(f"apply runs on the CPU pool or the cluster, not on {device}")
        if not callable(fn):
            raise TypeError(f"apply: fn must be callable, got {fn!r}")
        shape = self._shape_arg(shape)
        dtype = as_dtype(dtype)
        operands = tuple(a if isinstance(a, Array) else Const(a) for a in args)
        arrays = [a for a in operands if isinstance(a, Array)]
        device = check_same(self, arrays)
        if device.device_type is not CPU:
            raise ValueError(
                f"apply runs on the CPU pool: move GPU arrays with to_device (got {device})"
            )
        name = getattr(fn, "__name__", "apply")
        return push1(
            self,
            Applied(fn, shape, dtype),
            operands,
            shape,
            dtype,
            device,
            f"apply({name})",
            prop=NORMAL,
        )

    def from_zarr(self, store: Any, /, *, device: Any = None) -> Any:
        """The Zarr array at ``store`` (a path, URL or store object ``zarr.open_array``
        takes): with ``device=ae.remote()``, a remote array whose chunks are read by remote
        tasks on the workers (``store`` must name the same data there; the data never passes
        through this process); else an array read by one operation on the CPU pool (then
        moved to ``device``). An aioengine extension; needs ``zarr`` (the extra)."""
        shape, dtype, _ = zarr_meta(store)
        x = self.apply(read_all, store, shape=shape, dtype=dtype)
        return x if device is None else x.to_device(device)

    def _to_device(self, x: Array, device: Context) -> Any:
        if is_remote(device):
            return remote_call(self, "asarray", (x,), {"device": device})
        if type(device) is not Context:
            raise ValueError(
                f"device must be an aioengine Context (ae.cpu(i) or ae.gpu(i)), got {device!r}"
            )
        if device == x.device:
            return x
        src_gpu = x.device.device_type is not CPU
        dst_gpu = device.device_type is not CPU
        if dst_gpu and not src_gpu:
            xp = self._xp(device)
            fn: Callable[..., Any] = partial(_upload, xp)
            return push1(
                self,
                fn,
                (x,),
                known_shape(x),
                x.dtype,
                device,
                "to_device",
                prop=FnProperty.COPY_TO_GPU,
            )
        if src_gpu and not dst_gpu:
            # On the GPU's copy stream; the CPU array's first reader waits for its fence.
            return push1(
                self,
                _download,
                (x,),
                known_shape(x),
                x.dtype,
                device,
                "to_device",
                prop=FnProperty.COPY_FROM_GPU,
                run_on=x.device,
            )
        if src_gpu and dst_gpu:
            return push1(self, copy_value, (x,), known_shape(x), x.dtype, device, "to_device")
        return push1(self, copy_value, (x,), known_shape(x), x.dtype, device, "to_device")

    def _array_ufunc(
        self, ufunc: np.ufunc, method: str, inputs: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        return array_ufunc(self, ufunc, method, inputs, kwargs)

    def _array_function(
        self, func: Callable[..., Any], types: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        return array_function(self, func, types, args, kwargs)


def _make_elementwise(name: str, arity: int) -> Callable[..., Array]:
    fn = elementwise_function(name)

    if arity == 1:
        no_bool = name in NOT_FOR_BOOL

        def unary(self: Namespace, x: Array, /) -> Array:
            if not isinstance(x, Array):
                raise TypeError(f"{name}() needs an array, got {type(x).__name__}")
            if no_bool and x.dtype == np.bool_:
                raise TypeError(
                    f"{name}() needs a numeric array, not bool (the standard refuses "
                    "arithmetic on bools; NumPy's would give a float16 or int8): cast it "
                    "first, e.g. xp.astype(x, xp.float64)"
                )
            return elementwise(self, fn, name, (x,))

        func: Callable[..., Array] = unary
    else:

        def binary(self: Namespace, x1: Any, x2: Any, /) -> Array:
            return self._binop(fn, name, x1, x2)

        func = binary
    func.__name__ = func.__qualname__ = name
    func.__doc__ = f"Elementwise ``{name}`` (NumPy's ``{name}``), a push."
    return func


for _name, _arity in ELEMENTWISE.items():
    setattr(Namespace, _name, _make_elementwise(_name, _arity))


def _routed(name: str, local: Callable[..., Any]) -> Callable[..., Any]:
    """``local`` (a function of the namespace), or its remote form when the call names a
    remote array or ``device=ae.remote()`` (``_remote.py``): one cheap test per call."""

    @functools.wraps(local)
    def routed(self: Namespace, *args: Any, **kwargs: Any) -> Any:
        if involves_remote(args, kwargs):
            return remote_call(self, name, args, kwargs)
        try:
            return local(self, *args, **kwargs)
        except AttributeError as exc:  # an array's state read off a NumPy array
            foreign = _numpy_argument(name, args, kwargs)
            if foreign is None:
                raise
            raise foreign from exc

    return routed


def _numpy_argument(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> TypeError | None:
    """The error for a call of ``xp.name`` given a NumPy array where it reads an engine
    array (None if no argument is one): a clear TypeError, not an AttributeError of ours."""
    for value in (*args, *kwargs.values()):
        items = value if type(value) in (list, tuple) else (value,)
        if any(isinstance(v, np.ndarray) for v in items):
            return TypeError(
                f"xp.{name} takes arrays of this namespace, got a NumPy array: convert it "
                "with xp.asarray(value) first (or call NumPy's own function on NumPy arrays)"
            )
    return None


for _name in dir(Namespace):
    _fn = getattr(Namespace, _name)
    if not _name.startswith("_") and callable(_fn) and not isinstance(_fn, type | np.dtype):
        setattr(Namespace, _name, _routed(_name, _fn))

if TYPE_CHECKING:
    from ._array import ArrayNamespace

    # What an Array calls of its namespace (``_array.ArrayNamespace``) is this class's, with
    # these signatures: mypy checks it here (nothing runs).
    _AS_ARRAYS_SEE_IT: type[ArrayNamespace] = Namespace
