"""Array: an engine-backed n-dimensional array whose value is awaitable.

An :class:`Array` is a view (``_steps``, applied to the value in order; empty for a whole
buffer) of a :class:`~aioengine.array._buffer.Buffer`, plus the metadata computed at push time:
``shape``, ``dtype`` and ``device``. Operators and methods push operations through the
array's namespace (``_namespace.py``) and return at once; the namespace is built above this
module, so an Array names it by :class:`ArrayNamespace`, a Protocol of what it calls.
:class:`Bound`, the base of the namespace's machinery, is the engine the namespace is bound to
and its event loop: what ``await`` and the sync points wait on.

The other modules of the package reach an array's state through the functions at the end of
this module (its internal API: :func:`known_shape`, :func:`buffer_of`, :func:`view`,
:func:`concrete_shape`, :func:`layout_of`, ...) or its properties, not through its fields
(but for the kernels, ``_kernel.py``, a layer below this module, which read an argument's
``_buf``, a ``Const``'s being None, and an array's ``_steps`` when its operation runs). Users
see the properties (``shape``, ``dtype``, ``device``, ...), which give the same values where
there is one (``shape`` also learns a data-dependent dimension: once the value is ready, or
waiting for it in synchronous code).

Reading the value:

* ``await x`` pushes a read of ``x``'s Buffer, run inline on the loop when its turn comes (after
  every operation pushed on the Buffer before it), and returns the value as a read-only NumPy
  array (or the GPU backend's array); the Buffer is marked exported, so a later in-place write
  copies first and what ``await`` returned never changes.
* Sync points (``__bool__``, ``__int__``, ``__float__``, ``__complex__``, ``__index__``,
  ``__array__``, ``__dlpack__``, ``tolist``, ``to_numpy``, ``item``, pickling) need the value
  now (``_sync.py``): off the engine's loop thread they block until it is ready; on it, or while
  that loop is not running, a pending array raises :class:`~aioengine.array.PendingArrayError`.
* ``await`` after the engine closed (it takes no push) reads a ready value as a sync point does.
* ``shape`` (a data-dependent dimension) and ``__str__`` wait as sync points do off the loop
  thread; on it they show what is known (None, the pending state) instead of raising.
  ``__repr__`` never waits.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Coroutine, Generator, Iterator
from threading import get_ident
from typing import Any, Protocol, TypeVar, overload

import numpy as np

from .. import (
    BlockingEngine,
    Context,
    DependencyError,
    DeviceType,
    Engine,
    EngineClosedError,
    FnProperty,
    Operation,
    Var,
    cpu,
)
from ._buffer import Buffer
from ._kernel import Const, failure_of
from ._meta import Shape, flat_span, layout
from ._special import elementwise_function
from ._sync import PendingArrayError, in_operation, on_loop_thread, running_loop

__all__ = (
    "COMPARISONS",
    "OPERATORS",
    "SCALARS",
    "UNARY_OPERATORS",
    "Array",
    "ArrayNamespace",
    "Bound",
    "block_on",
    "blocking_of",
    "buffer_of",
    "check_writable",
    "chunks_of",
    "concrete_shape",
    "engine_of",
    "is_view",
    "known_shape",
    "layout_of",
    "learnt_shape",
    "namespace_of",
    "operand_ok",
    "ready_value",
    "unpack",
    "value_in_operation",
    "vars_of",
    "view",
)

T = TypeVar("T")

_ASYNC = FnProperty.ASYNC
_CPU = DeviceType.CPU


class _Failed:
    """What the read pushed by ``await`` returns instead of a value: the array's failure."""

    __slots__ = ("failure",)

    def __init__(self, failure: BaseException) -> None:
        self.failure = failure


def _readonly(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        view = value.view()
        view.flags.writeable = False
        return view
    return value


def _capture(array: Array, rctx: object) -> Any:
    """The read behind ``await``: the value at this point in push order, handed out
    read-only (the Buffer is marked exported: a later write copies first)."""
    buf = array._buf
    failure = failure_of(buf)
    if failure is not None:
        return _Failed(failure)
    value = buf.value
    for step in array._steps:
        value = step(value)
    buf.exported = True
    return _readonly(value)


class Array:
    """An n-dimensional array of the engine: operations on it are pushes, its value awaitable.

    Made by the functions of a namespace (``xp = aioengine.array.namespace(engine)``;
    ``xp.asarray``, ``xp.zeros``, ...), never directly. ``shape``, ``dtype`` and ``device`` are
    known at once; ``await x`` gives the value; :attr:`ready` tells whether it can be read
    without waiting; :attr:`var` is the engine Var of its buffer, which raw pushes may name.
    """

    __slots__ = ("__weakref__", "_buf", "_device", "_dtype", "_layout", "_ns", "_shape", "_steps")

    __array_priority__ = 1000  # NumPy defers binary operators to ours

    def __init__(
        self,
        ns: ArrayNamespace,
        buf: Buffer,
        shape: Shape,
        dtype: np.dtype[Any],
        device: Context,
        steps: tuple[Callable[[Any], Any], ...] = (),
        layout_: np.ndarray[Any, Any] | None = None,
    ) -> None:
        self._ns = ns
        self._buf = buf
        self._shape = shape
        self._dtype = dtype
        self._device = device
        self._steps = steps
        self._layout = layout_

    # -- metadata (known at push time) --------------------------------------------------

    @property
    def shape(self) -> Shape:
        """The shape. A dimension that depends on data (boolean indexing, ``unique_*``, ...)
        is learnt from the value: in synchronous code (off the engine's loop thread, outside
        an operation) asking waits for it, as a sync point does (and raises the array's
        failure, if it failed); on the loop thread it is None until the value is ready."""
        shape = learnt_shape(self)
        if None in shape:
            if self.ready:
                pass  # failed: its dimensions stay unknown
            elif self._may_block():
                shape = self._shape = tuple(self._value_now("x.shape").shape)
        return shape

    @property
    def dtype(self) -> np.dtype[Any]:
        """The data type (a NumPy dtype, equal to the namespace's ``xp.float64`` etc.)."""
        return self._dtype

    @property
    def device(self) -> Context:
        """Where the data lives and operations on it run: ``cpu(i)`` or ``gpu(i)``."""
        return self._device

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return len(self._shape)

    @property
    def size(self) -> int | None:
        """The number of elements (None while a dimension is unknown)."""
        n = 1
        for d in self.shape:
            if d is None:
                return None
            n *= d
        return n

    @property
    def var(self) -> Var:
        """The engine Var of this array's buffer (shared by its views): raw pushes naming it
        are ordered with the array's own operations. Once handed out, it is deleted
        (``delete_var``) when the last array of its buffer is collected."""
        return self._buf.expose()

    @property
    def T(self) -> Array:
        """The transpose of a 2-D array."""
        if self.ndim != 2:
            raise ValueError(f"x.T requires a 2-D array (got {self.ndim}-D); use x.mT")
        return self._ns.permute_dims(self, (1, 0))

    @property
    def mT(self) -> Array:
        """The transpose of the last two axes (a view)."""
        return self._ns.matrix_transpose(self)

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d array")
        d = self.shape[0]
        if d is None:
            raise TypeError("len() of an array whose first dimension depends on its data")
        return d

    def __iter__(self) -> Iterator[Array]:
        # Raised by iter() itself, as NumPy's is: libraries tell scalars from sequences by
        # whether iter(x) raises (matplotlib's hist does).
        if not self._shape:
            raise TypeError("iteration over a 0-d array")
        return map(self.__getitem__, range(len(self)))

    # -- the value ------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """Whether the value can be read now without waiting: no write on its buffer
        (through the arrays or raw pushes; of a chunked one, on the chunks it touches) is
        pending or running."""
        buf = self._buf
        writers = None if buf.chunked is None else buf.chunked.writers
        if len(buf.vars) > 1:  # a chunked Buffer: the latest writes on the chunks it touches
            chunks = chunks_of(self)
            if writers is not None and not all(
                w.done() for w in writers[chunks.start : chunks.stop]
            ):
                return False
        else:
            writer = buf.writer
            if writer is not None and not writer.done():
                return False
            if writers is not None and not all(w.done() for w in writers):
                return False
        if not buf.handed_out() and self._device.device_type is _CPU:
            # Only the arrays' pushes name its Vars (their writers, looked at above); on a GPU,
            # the engine may hold a Var for device work after its writer is done.
            return True
        for var in vars_of(self):
            stats = var.statistics()
            if stats.mode not in (None, "read") or not all(
                mode == "read" for mode in stats.waiting_modes
            ):
                return False
        return True

    def __await__(self) -> Generator[Any, None, Any]:
        ns = self._ns
        ns._claim()
        loop = ns._loop
        if ns._blocking is not None and running_loop() is not loop:
            # A BlockingEngine's array awaited on another loop (a notebook's): read it on the
            # engine's loop and wait here without blocking this one.
            future = asyncio.run_coroutine_threadsafe(self._get(), loop)  # type: ignore[arg-type]
            return asyncio.wrap_future(future).__await__()
        return self._get().__await__()

    async def _get(self) -> Any:
        ns = self._ns
        engine = ns._engine
        buf = self._buf
        host = self._device if self._device.device_type is _CPU else cpu()
        chunks = chunks_of(self)
        reads = buf.vars[chunks.start : chunks.stop]
        # Reading on the loop, in push order; a GPU buffer is read once its fences completed
        # (the engine holds a host consumer back until then).
        op: Operation[Any] | None = None
        # (A reduction's kernel run here leaves its combine to run on the loop: not ready.)
        if buf.run_writer_here() and self.ready and failure_of(buf) is None:
            # A chain of one chunk (or a small array's fused operations), computed here (not
            # handed to a worker or left to the loop's next turn; no "await" operation is
            # pushed), and nothing pending on it now: read it as a sync point reads a ready
            # value (exported: a later write copies first), then let the loop iterate as an
            # await of a push would (its other tasks, and the end of this burst, run).
            buf.lend(chunks)
            got = _capture(self, None)
            await asyncio.sleep(0)
            return got
        try:
            buf.lend(chunks)  # a write on them pushed from now on may have to copy first
            op = engine.push_sync(
                functools.partial(_capture, self), host, reads, (), prop=_ASYNC, name="await"
            )
        except EngineClosedError:
            if not self.ready:
                raise
        if op is None:
            # A closing or closed engine takes no push, but a ready value stays readable (as
            # the sync points read it): nothing can write it any more.
            got = _capture(self, None)
            if type(got) is _Failed:
                raise got.failure
            return got
        ns._bind(op)
        try:
            # The read is pushed (in order). A small array's pending operations run on the
            # loop, in the run of its queue scheduled before this: one turn usually ends them
            # and the read, and `await op` then returns at once, without the turn that
            # resolving a future and waking this task would cost (1e3 elements: 75-83 -> 65-68
            # µs). Otherwise it waits as before.
            await asyncio.sleep(0)
            got = await op
        except DependencyError as exc:
            got = _Failed(exc)
            # The Var carries the engine's record of a failure: throw it (once, engine-wide,
            # so wait_for_all() and aclose() do not raise it again) and raise it as the
            # array's own.
            for var in reads:
                try:
                    await engine.wait_for_var(var)
                except asyncio.CancelledError:
                    raise
                except BaseException:
                    pass
            failure = failure_of(buf)
            if failure is None:
                root = exc.__cause__ if exc.__cause__ is not None else exc
                failure = DependencyError(f"this array was not computed: an input failed: {root!r}")
                failure.__cause__ = root
                buf.failure = failure
            got.failure = failure
        if type(got) is _Failed:
            # Its failure is sticky on the Buffer; the engine's record of it (if any) was
            # thrown already, or the read would have been skipped; a fused step's is carried
            # by an operation of its own: thrown here, once.
            carrier = buf.carrier
            if carrier is not None:
                buf.carrier = None
                try:
                    await engine.wait_for_var(carrier)
                except asyncio.CancelledError:
                    raise
                except BaseException:
                    pass
            raise got.failure
        return got

    def _may_block(self) -> bool:
        """Whether a sync point may block the calling thread until the value is ready: off
        the engine's loop thread and outside an operation on its workers (see ``_sync.py``)."""
        if in_operation():
            return False
        ns = self._ns
        loop = ns._learn_loop() if running_loop() is None else ns._loop
        return loop is not None and not on_loop_thread(loop)

    def _value_now(self, what: str) -> Any:
        """The value for a sync point (``what``): at once if ready, else blocking off the
        loop thread, :class:`PendingArrayError` on it or while the loop is not running."""
        ns = self._ns
        ns._claim()
        if self.ready:
            buf = self._buf
            failure = failure_of(buf)
            if failure is None:
                value = buf.value
                for step in self._steps:
                    value = step(value)
                buf.lend(chunks_of(self))
                buf.exported = True
                return _readonly(value)
            loop = ns._loop
            if loop is not None and loop.is_running() and not on_loop_thread(loop):
                return ns._wait(self._get())  # throws the engine's record once, then raises
            raise failure
        if in_operation():
            raise PendingArrayError(
                f"{what} needs the value of {self._describe()}, which is not computed yet, "
                "inside an operation on one of the engine's threads: waiting there could "
                "deadlock (the value may be queued behind this very operation); pass the "
                "array to the operation instead (xp.apply)"
            )
        loop = ns._learn_loop() if running_loop() is None else ns._loop
        if loop is None or on_loop_thread(loop):
            raise PendingArrayError(
                f"{what} needs the value of {self._describe()}, which is not computed yet: "
                "`await` the array on the event loop's thread (blocking that thread could "
                "only deadlock: the loop itself completes the operations)"
            )
        if not loop.is_running():
            raise PendingArrayError(
                f"{what} needs the value of {self._describe()}, which is not computed yet, "
                "and the engine's event loop is not running (between two runs of it, or "
                "after it stopped): waiting could only deadlock; `await` the array while "
                "the loop runs"
            )
        # This thread waits anyway: a chain of one chunk is computed on it, and then read
        # here, without a trip through the loop (the burst ends first, as waiting ends it).
        ns._end_burst()
        if self._buf.run_writer_here() and _is_ready(self):
            return self._value_now(what)  # (ready: a read at once, which ends no burst)
        return ns._wait(self._get(), ended=True)

    def _host_value(self, what: str) -> np.ndarray[Any, Any]:
        value = self._value_now(what)
        if not isinstance(value, np.ndarray):
            get = getattr(value, "get", None)  # CuPy: a copy to the host
            value = get() if get is not None else np.asarray(value)
        return value  # type: ignore[no-any-return]

    def _scalar(self, what: str, kinds: str) -> Any:
        if self._shape != () and self.size != 1:
            raise TypeError(f"only 0-d (or size-1) arrays can be converted by {what}")
        value = self._host_value(what)
        if self._dtype.kind not in kinds:
            raise TypeError(f"{what} of an array of dtype {self._dtype} is not allowed")
        return value.reshape(()).item()

    def __bool__(self) -> bool:
        if self.size != 1:
            raise ValueError(
                "The truth value of an array with more than one element is ambiguous. "
                "Use xp.any(x) or xp.all(x)"
            )
        return bool(self._host_value("bool()").reshape(()).item())

    def __int__(self) -> int:
        if self._dtype.kind == "c":
            raise TypeError("int() of a complex array")
        return int(self._scalar("int()", "biuf"))

    def __float__(self) -> float:
        if self._dtype.kind == "c":
            raise TypeError("float() of a complex array")
        return float(self._scalar("float()", "biuf"))

    def __complex__(self) -> complex:
        return complex(self._scalar("complex()", "biufc"))

    def __index__(self) -> int:
        if self._dtype.kind not in "iu":
            raise TypeError(f"only integer arrays can be used as an index, not {self._dtype}")
        return int(self._scalar("__index__()", "iu"))

    def item(self) -> Any:
        """The single element as a Python scalar (a sync point)."""
        return self._scalar("item()", "biufc")

    def tolist(self) -> Any:
        """The value as nested Python lists (a sync point)."""
        return self._host_value("tolist()").tolist()

    def to_numpy(self) -> np.ndarray[Any, Any]:
        """The value as a (read-only) NumPy array on the host: ``np.asarray(x)`` (a sync
        point). pandas' and xarray's name for it, through which libraries such as matplotlib
        unpack array-likes (and then draw a 2-D array by columns, as they do NumPy's)."""
        return self._host_value("to_numpy()")

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray[Any, Any]:
        # NumPy 2's rules: copy=True always copies; copy=False never does, and raises
        # ValueError where a copy is needed (a dtype change, a GPU value copied to the host).
        value = self._value_now("__array__()")
        if not isinstance(value, np.ndarray):
            if copy is False:
                raise ValueError(
                    f"Unable to avoid copy while creating an array as requested: the value on "
                    f"{self._device} is copied to the host (copy=False)"
                )
            value, copy = self._host_value("__array__()"), None  # already a copy
        if dtype is not None and np.dtype(dtype) != value.dtype:
            if copy is False:
                raise ValueError(
                    f"Unable to avoid copy while creating an array as requested: {value.dtype} "
                    f"to {np.dtype(dtype)} needs one (copy=False)"
                )
            return value.astype(dtype)
        if copy:
            return value.copy()
        return value

    def __dlpack__(
        self,
        /,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[Any, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        """A DLPack capsule of the value (a sync point). The value is read-only (what
        ``await`` gives never changes), which only a versioned capsule (``max_version``
        1.0 and later) can say: a legacy one (no ``max_version``) is of a copy, unless
        ``copy=False`` (BufferError then)."""
        value = self._value_now("__dlpack__()")
        kwargs: dict[str, Any] = {}
        if stream is not None:
            kwargs["stream"] = stream
        if dl_device is not None:
            kwargs["dl_device"] = dl_device
        if copy is not None:
            kwargs["copy"] = copy
        if max_version is not None:
            kwargs["max_version"] = max_version
        legacy = max_version is None or max_version[0] < 1
        if legacy and not getattr(getattr(value, "flags", None), "writeable", True):
            if copy is False:
                raise BufferError(
                    "__dlpack__(copy=False): the value is read-only, which a legacy DLPack "
                    "capsule cannot say; ask for max_version=(1, 0) or allow a copy"
                )
            value = value.copy()
            kwargs.pop("copy", None)
        return value.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        if self._device.device_type is _CPU:
            return (1, 0)  # kDLCPU
        return (2, self._device.device_id)  # kDLCUDA

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickling is a sync point; an Array unpickles to its value, a NumPy array (an engine
        # does not travel with it).
        return (np.array, (np.array(self._host_value("pickle")),))

    def __format__(self, spec: str) -> str:
        if not spec:
            return str(self)
        return format(self._host_value("format()").reshape(()).item(), spec)

    def to_device(self, device: Context, /, *, stream: object = None) -> Array:
        """A copy of this array on ``device`` (the same array if it is already there); a copy
        operation on the copy streams for a GPU. On ``ae.remote()`` a remote array, whose
        chunks live on the engine's cluster (``docs/howto/arrays-cluster.md``)."""
        return self._ns._to_device(self, device)  # type: ignore[no-any-return]

    def __array_namespace__(self, *, api_version: str | None = None) -> ArrayNamespace:
        if api_version is not None and api_version not in (
            "2021.12",
            "2022.12",
            "2023.12",
            "2024.12",
        ):
            raise ValueError(f"unsupported Array API version {api_version!r}")
        return self._ns

    # -- display --------------------------------------------------------------------------

    def _describe(self) -> str:
        writer = self._buf.writer
        what = f" ({writer.name})" if writer is not None else ""
        return f"the array{what} of shape {self._shape} and dtype {self._dtype}"

    def __repr__(self) -> str:
        device = "" if self._device == cpu() else f", device={self._device}"
        buf = self._buf
        if self.ready:
            failure = failure_of(buf)
            if failure is not None:
                writer = buf.writer
                where = f" in {writer.name}" if writer is not None else ""
                return (
                    f"Array(shape={self._shape}, dtype={self._dtype}{device}, "
                    f"failed: {_root_repr(failure)}{where})"
                )
            value = buf.value
            for step in self._steps:
                value = step(value)
            if not isinstance(value, np.ndarray):
                return f"Array({value!r}{device})"
            text = np.array_repr(value)
            body = text[len("array(") : -1]
            if "dtype=" not in body:
                body = f"{body}, dtype={self._dtype}"
            return f"Array({body}{device})"
        writer = buf.writer
        producing = writer.name if writer is not None else "raw push"
        return f"Array(shape={self._shape}, dtype={self._dtype}{device}, pending: {producing})"

    def __str__(self) -> str:
        """The value as NumPy prints it (``print(x)``, ``f"{x}"``): a sync point in
        synchronous code, which waits for a pending value and raises the array's failure,
        as ``float(x)`` does. Where a sync point cannot wait (on the engine's loop thread,
        inside an operation) a pending or failed array shows its :func:`repr` (its state)
        instead of raising. ``repr(x)`` never waits."""
        if (not self.ready or failure_of(self._buf) is not None) and not self._may_block():
            return repr(self)
        return str(self._host_value("str()"))

    # -- operators: pushes through the namespace ----------------------------------------

    def __getitem__(self, key: Any) -> Array:
        return self._ns._getitem(self, key)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._ns._setitem(self, key, value)

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        return self._ns._array_ufunc(ufunc, method, inputs, kwargs)

    def __array_function__(
        self, func: Callable[..., Any], types: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        return self._ns._array_function(func, types, args, kwargs)

    def __copy__(self) -> Array:
        """``copy.copy(x)``: a new array of the same namespace with ``x``'s value, pushed as a
        copy operation (not a sync point)."""
        return self._ns.asarray(self, copy=True)

    def __deepcopy__(self, memo: dict[int, Any]) -> Array:
        """``copy.deepcopy(x)``: as ``copy.copy(x)`` (the elements are numbers)."""
        return self._ns.asarray(self, copy=True)

    # By identity (the comparison operators are elementwise pushes): an array is an awaitable,
    # which asyncio.gather and asyncio.wait keep in sets and dicts.
    __hash__ = object.__hash__


def _root_repr(failure: BaseException) -> str:
    if isinstance(failure, DependencyError) and failure.__cause__ is not None:
        return f"DependencyError from {failure.__cause__!r}"
    return repr(failure)


def _binary(name: str, reflected: bool = False) -> Callable[[Array, Any], Any]:
    if name != "matmul":  # an elementwise function: straight to the namespace's hot path
        ufunc = elementwise_function(name)

        def method(self: Array, other: Any) -> Any:
            ns = self._ns
            if (
                type(other) is Array
                and not reflected
                and other._ns is ns
                and other._device is self._device
            ):  # the hot path
                dtype = other._dtype
                return ns._fast(
                    ufunc,
                    name,
                    self,
                    self._buf,
                    self._shape,
                    self._dtype,
                    self._device,
                    other,
                    other._buf,
                    other._shape,
                    dtype,
                    dtype,
                )
            if not operand_ok(other):
                return NotImplemented
            if reflected:
                return ns._binop(ufunc, name, other, self)
            return ns._binop(ufunc, name, self, other)

    else:

        def method(self: Array, other: Any) -> Any:
            ns = self._ns
            if not operand_ok(other):
                return NotImplemented
            return ns.matmul(other, self) if reflected else ns.matmul(self, other)

    method.__name__ = f"__r{name}__" if reflected else f"__{name}__"
    return method


def _inplace(name: str) -> Callable[[Array, Any], Any]:
    def method(self: Array, other: Any) -> Any:
        ns = self._ns
        if not operand_ok(other):
            return NotImplemented
        ns._inplace(name, self, other)
        return self

    return method


def _unary(name: str) -> Callable[[Array], Array]:
    def method(self: Array) -> Array:
        result: Array = getattr(self._ns, name)(self)
        return result

    return method


#: The binary operators (with reflected and in-place forms), by dunder name: the namespace
#: function each calls (shared with ``_remote.RemoteArray``).
OPERATORS = {
    "add": "add",
    "sub": "subtract",
    "mul": "multiply",
    "truediv": "divide",
    "floordiv": "floor_divide",
    "mod": "remainder",
    "pow": "pow",
    "matmul": "matmul",
    "and": "bitwise_and",
    "or": "bitwise_or",
    "xor": "bitwise_xor",
    "lshift": "bitwise_left_shift",
    "rshift": "bitwise_right_shift",
}
#: The comparison operators (no reflected or in-place form) and the unary ones, by dunder
#: name: the namespace function each calls (shared with ``_remote.RemoteArray``).
COMPARISONS = {
    "eq": "equal",
    "ne": "not_equal",
    "lt": "less",
    "le": "less_equal",
    "gt": "greater",
    "ge": "greater_equal",
}
UNARY_OPERATORS = {"neg": "negative", "pos": "positive", "abs": "abs", "invert": "bitwise_invert"}
for _dunder, _fname in OPERATORS.items():
    setattr(Array, f"__{_dunder}__", _binary(_fname))
    setattr(Array, f"__r{_dunder}__", _binary(_fname, reflected=True))
    setattr(Array, f"__i{_dunder}__", _inplace(_fname))
for _dunder, _fname in COMPARISONS.items():
    setattr(Array, f"__{_dunder}__", _binary(_fname))
for _dunder, _fname in UNARY_OPERATORS.items():
    setattr(Array, f"__{_dunder}__", _unary(_fname))


# -- the namespace's binding to its engine --------------------------------------------------


def _nothing(rctx: object) -> None:
    """Pushed once by a namespace whose engine's loop is not known yet, to learn it."""


def _running(rctx: object) -> asyncio.AbstractEventLoop:
    """Pushed once by a BlockingEngine's namespace: run on the engine's loop, it returns it."""
    return asyncio.get_running_loop()


class Bound:
    """The engine a namespace is bound to, and that engine's event loop: what ``await`` and
    the sync points of the namespace's arrays wait on. The base of the namespace's machinery
    (:class:`~aioengine.array._push.Pusher`), kept beside the code that waits.

    ``_engine`` (and ``_blocking`` for a BlockingEngine); ``_loop``, the engine's loop once
    known (set once, read from any thread); ``_user`` and ``_users``, which threads use the
    namespace's arrays (:meth:`_claim`).
    """

    def __init__(self, engine: Engine | BlockingEngine) -> None:
        if isinstance(engine, BlockingEngine):
            self._blocking: BlockingEngine | None = engine
            self._engine: Engine = engine.engine
        elif isinstance(engine, Engine):
            self._blocking = None
            self._engine = engine
        else:
            raise TypeError(f"expected an aioengine Engine or BlockingEngine, got {engine!r}")
        #: The engine's event loop, learnt from the first operation pushed (sync points off
        #: the loop thread wait on it); a BlockingEngine's is known at once.
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Per calling thread off the loop: ``burst``, its :class:`~._burst.Burst` of chunk
        #: kernels, which :meth:`_wait` ends (the kernels start as the thread waits).
        self._threads = threading.local()
        #: The one thread that has used the namespace's arrays (pushed, waited for or read
        #: them), None before any, or :data:`SHARED` once two have: a synchronous caller
        #: computes small operations at the call only while it is the one (``_push.py``).
        #: Changed only under ``_users``, which such a computation holds: a second thread's
        #: first use waits for the one in progress, and none starts after it.
        self._user: int | None = None
        self._users = threading.Lock()
        if self._blocking is not None:
            probe = self._blocking.push_sync(_running, prop=_ASYNC, name="namespace")
            try:
                self._loop = probe.operation.get_loop()  # type: ignore[attr-defined]
            except RuntimeError:
                # This thread runs another loop (a notebook's, asyncio.run()'s), to which
                # the operation would have to be bound to tell: the probe, run on the
                # engine's loop, answers instead (a short wait).
                self._loop = probe.result()

    def _bind(self, op: Operation[Any]) -> None:
        if self._loop is None:
            try:
                self._loop = op.get_loop()
            except RuntimeError:  # the engine is not bound to a loop yet
                pass

    def _learn_loop(self) -> asyncio.AbstractEventLoop | None:
        """The engine's loop, asking the engine (with a no-op push) if no array operation has
        told it yet; None if the engine is not bound to a loop."""
        if self._loop is None:
            try:
                self._bind(self._engine.push_sync(_nothing, prop=_ASYNC, name="namespace"))
            except RuntimeError:  # not bound to a loop yet
                pass
        return self._loop

    def _claim(self) -> None:
        """Record the calling thread as a user of the namespace's arrays (before it pushes,
        waits for or reads one): the first is *the* user; a second makes them
        :data:`SHARED`, for good."""
        me = get_ident()
        user = self._user
        if user in (me, SHARED):
            return
        with self._users:
            if self._user is None:
                self._user = me
            elif self._user != me:
                self._user = SHARED

    def _end_burst(self) -> None:
        """This (non-loop) thread is about to wait on the engine: the chunk kernels it pushed
        since it last waited start now (``_burst.py``)."""
        burst = getattr(self._threads, "burst", None)
        if burst is not None:
            burst.end()

    def _wait(self, coro: Coroutine[Any, Any, T], ended: bool = False) -> T:
        """Run ``coro`` on the engine's loop and block this (non-loop) thread for its result
        (ending this thread's burst first, unless the caller did: ``ended``)."""
        self._claim()
        if not ended:
            self._end_burst()
        loop = self._loop
        if loop is None or loop.is_closed():
            coro.close()
            raise RuntimeError(f"{self._engine!r} has no running event loop to wait on")
        return asyncio.run_coroutine_threadsafe(coro, loop).result()


#: ``Bound._user`` once two threads have used the namespace's arrays (no thread's ident).
SHARED = -1


class ArrayNamespace(Protocol):
    """The namespace as its arrays see it: what :class:`Array` calls of it. The namespace
    (:class:`~aioengine.array.Namespace`, the one kind; ``_namespace.py`` has mypy check it)
    is built above this module, on :class:`Bound`: a Protocol names it here without an import.

    :class:`Bound`'s engine and loop, which ``await`` and the sync points wait on; the push
    of a binary elementwise function and of an in-place operator (``_push.Pusher``'s);
    indexing (``_indexing.py``); and the functions of the standard and of NumPy's protocols
    that the array's methods stand for. (The unary operators call the namespace's function
    of their name, looked up when called.)
    """

    _engine: Engine
    _blocking: BlockingEngine | None
    _loop: asyncio.AbstractEventLoop | None

    def _bind(self, op: Operation[Any]) -> None:
        """Learn the engine's loop from ``op`` (:meth:`Bound._bind`)."""

    def _learn_loop(self) -> asyncio.AbstractEventLoop | None:
        """The engine's loop, asking the engine if need be (:meth:`Bound._learn_loop`)."""

    def _claim(self) -> None:
        """Record the calling thread as a user of the arrays (:meth:`Bound._claim`)."""

    def _end_burst(self) -> None:
        """This thread is about to wait on the engine (:meth:`Bound._end_burst`)."""

    def _wait(self, coro: Coroutine[Any, Any, T], ended: bool = False) -> T:
        """Run ``coro`` on the engine's loop, blocking this thread (:meth:`Bound._wait`)."""

    def _fast(
        self,
        fn: Callable[..., Any],
        name: str,
        a: Array,
        abuf: Buffer,
        ashape: Shape,
        adtype: np.dtype[Any],
        device: Context,
        b: Any,
        bbuf: Buffer | None,
        bshape: Shape,
        bsample: Any,
        bkey: Any,
    ) -> Array:
        """``a <op> b`` for two arrays of the namespace on one device: the hot path."""

    def _binop(self, fn: Callable[..., Any], name: str, a: Any, b: Any) -> Array:
        """A binary elementwise function of any operands."""

    def _inplace(self, name: str, target: Array, other: Any) -> None:
        """``target <op>= other``."""

    def _getitem(self, x: Array, key: Any) -> Array:
        """``x[key]``."""

    def _setitem(self, x: Array, key: Any, value: Any) -> None:
        """``x[key] = value``."""

    def _to_device(self, x: Array, device: Context) -> Any:
        """``x.to_device(device)``."""

    def _array_ufunc(
        self, ufunc: np.ufunc, method: str, inputs: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """NumPy's ``__array_ufunc__`` protocol."""

    def _array_function(
        self, func: Callable[..., Any], types: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """NumPy's ``__array_function__`` protocol."""

    def asarray(
        self,
        obj: Any,
        /,
        *,
        dtype: Any = None,
        device: Context | None = None,
        copy: bool | None = None,
    ) -> Array:
        """The standard's ``asarray`` (``copy.copy(x)``)."""

    def permute_dims(self, x: Array, /, axes: tuple[int, ...]) -> Array:
        """The standard's ``permute_dims`` (``x.T``)."""

    def matrix_transpose(self, x: Array, /) -> Array:
        """The standard's ``matrix_transpose`` (``x.mT``)."""

    def matmul(self, x1: Any, x2: Any, /) -> Array:
        """The standard's ``matmul`` (``x @ y``)."""


# -- the package's internal API on arrays and namespaces --------------------------------------
# Functions, not methods: users see the methods and properties of Array and of the namespace;
# these serve the other modules of aioengine.array, which read an array's state through them
# (and change it only through them: a learnt shape, a cached layout).

#: The Python scalars an array operation takes as operands (as they are: NEP 50's weak scalars).
SCALARS = (bool, int, float, complex)


def operand_ok(x: object) -> bool:
    """Whether ``x`` can be an operand of an array operation: an array, a NumPy array or
    scalar, or a Python scalar (an operator returns NotImplemented for anything else)."""
    return isinstance(x, Array | np.ndarray | np.generic) or type(x) in SCALARS


def known_shape(x: Array) -> Shape:
    """``x``'s shape as known without its value: a data-dependent dimension is None until it
    is learnt (``x.shape`` learns it once the value is ready, :func:`concrete_shape` waits
    for it); the metadata of the operations on ``x`` follows this one."""
    return x._shape


def host_value(x: Array, what: str) -> np.ndarray[Any, Any]:
    """``x``'s value on the host for the sync point ``what`` (waiting off the loop thread,
    :class:`PendingArrayError` on it while pending)."""
    return x._host_value(what)


def learnt_shape(x: Array) -> Shape:
    """``x``'s shape as far as it is known without waiting: a data-dependent dimension is
    learnt (and kept) once the value is ready, and stays None before (``x.shape`` waits for
    it in synchronous code; pushes, which never wait, read this)."""
    shape = x._shape
    if None in shape and x.ready and failure_of(x._buf) is None:
        value = x._buf.value
        for step in x._steps:
            value = step(value)
        shape = x._shape = tuple(value.shape)
    return shape


@overload
def buffer_of(x: Array) -> Buffer: ...


@overload
def buffer_of(x: Const) -> None: ...


def buffer_of(x: Array | Const) -> Buffer | None:
    """The Buffer an operand reads: an array's (shared by its views); None for a
    :class:`~aioengine.array._kernel.Const` (both keep it as ``_buf``, which the kernels read)."""
    return x._buf


def unpack(x: Array) -> tuple[ArrayNamespace, Buffer, Shape, np.dtype[Any], Context]:
    """``x``'s namespace, Buffer, known shape, dtype and device, in one call (for the hot
    path of the binary functions, ``_push.Pusher._binop``)."""
    return x._ns, x._buf, x._shape, x._dtype, x._device


def is_view(x: Array) -> bool:
    """Whether ``x`` sees its Buffer through steps (a view), not as a whole."""
    return bool(x._steps)


def steps_of(x: Array) -> tuple[Callable[[Any], Any], ...]:
    """The steps through which ``x`` sees its Buffer's value (none: the whole of it)."""
    return x._steps


def namespace_of(x: Array) -> ArrayNamespace:
    """The namespace ``x`` belongs to (``x.__array_namespace__()``, without its version check)."""
    return x._ns


def engine_of(ns: Bound | ArrayNamespace) -> Engine:
    """The Engine ``ns`` pushes to (a BlockingEngine's own engine)."""
    return ns._engine


def blocking_of(ns: Bound) -> BlockingEngine | None:
    """The BlockingEngine ``ns`` was made for, or None (made for an Engine)."""
    return ns._blocking


def chunks_of(x: Array) -> range:
    """The chunks of its Buffer that ``x`` touches (``_buffer.py`` has the rule): every chunk
    for a whole array or an unchunked Buffer; those its flat span falls in for a view."""
    buf = x._buf
    lay = x._layout
    if not x._steps or len(buf.vars) == 1 or lay is None:
        return range(len(buf.vars))
    return buf.chunks(*flat_span(lay))


def vars_of(x: Array) -> tuple[Var, ...]:
    """The Vars of the chunks ``x`` touches (:func:`chunks_of`): what an operation reading
    ``x`` holds a read on."""
    vars_ = x._buf.vars
    if len(vars_) == 1 or not x._steps:
        return vars_
    chunks = chunks_of(x)
    return vars_[chunks.start : chunks.stop]


def view(
    ns: ArrayNamespace, x: Array, step: Callable[[Any], Any], lay: np.ndarray[Any, Any]
) -> Array:
    """An array of ``ns`` sharing ``x``'s Buffer, seen through ``step`` after ``x``'s own steps;
    ``lay`` is its layout (:func:`~aioengine.array._meta.layout`), whose shape is its shape."""
    return Array(ns, x._buf, tuple(lay.shape), x._dtype, x._device, (*x._steps, step), lay)


def value_in_operation(x: Array) -> Any:
    """``x``'s value inside an operation that holds a read on its Buffer's Vars (what
    ``await`` would give at that point in push order); raises its failure."""
    got = _capture(x, None)
    if type(got) is _Failed:
        raise got.failure
    return got


def block_on(ns: Bound, coro: Coroutine[Any, Any, T], what: str) -> T:
    """Run ``coro`` on the engine's loop and block this thread for its result: a sync point
    (``what``) of a value that must be fetched. Where blocking could deadlock (on the loop's
    thread, inside an operation, while the loop is not running) it raises
    :class:`PendingArrayError` instead, saying to ``await``."""
    loop = ns._learn_loop() if running_loop() is None else ns._loop
    if in_operation() or loop is None or on_loop_thread(loop) or not loop.is_running():
        coro.close()
        raise PendingArrayError(
            f"{what} needs a value that must be fetched: `await` the array (or call this off "
            "the event loop's thread, where it waits)"
        )
    return ns._wait(coro)


def _is_ready(x: Array) -> bool:
    return x.ready


def ready_value(x: Array) -> Any | None:
    """``x``'s value now, read-only, if it is ready and healthy (no wait, no push); else None.
    Its Buffer is marked exported first, so a write that starts later copies before writing
    and the value handed out never changes."""
    buf = x._buf
    if not _is_ready(x) or failure_of(buf) is not None:
        return None
    buf.lend(chunks_of(x))
    buf.exported = True
    if not _is_ready(x):  # a write pushed meanwhile has started: it may not have seen the mark
        return None
    value = buf.value
    for step in x._steps:
        value = step(value)
    return _readonly(value)


def concrete_shape(ns: Bound, x: Array, what: str) -> tuple[int, ...]:
    """``x.shape`` with every dimension known, for ``what`` (a function of ``ns``): an unknown
    (data-dependent) one is learnt from the value, and kept (a sync point: blocking off the
    loop thread, PendingArrayError on it)."""
    shape = x.shape
    if None in shape:
        if not x.ready and (ns._loop is None or on_loop_thread(ns._loop)):
            raise PendingArrayError(
                f"{what} needs the shape of an array whose shape depends on its data "
                f"{x._shape}; `await` it first (blocking the loop thread could only "
                "deadlock)"
            )
        value = x._value_now(what)
        shape = x._shape = tuple(value.shape)
    return shape  # type: ignore[return-value]


def layout_of(ns: Bound, x: Array) -> np.ndarray[Any, Any]:
    """``x``'s layout dummy (:func:`~aioengine.array._meta.layout`), made once and kept (its
    shape learnt first if it depends on data: :func:`concrete_shape`)."""
    lay = x._layout
    if lay is None:
        lay = x._layout = layout(concrete_shape(ns, x, "a view"), x._dtype)
    return lay


def check_writable(ns: Bound, x: Array) -> None:
    """ValueError if ``x`` is a view that cannot be written through (a broadcast one)."""
    if x._steps and not layout_of(ns, x).flags.writeable:
        raise ValueError("assignment destination is read-only (a broadcast view)")
