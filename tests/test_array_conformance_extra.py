"""Array API conformance (issue 44): the classes of the Array API test suite's failures, each
checked against ``array_api_strict`` (the standard's reference namespace) where it has an
answer: sizes of data-dependent results known at the call, ``finfo``/``iinfo`` as Python
numbers, ``can_cast``, DLPack, ``linalg.pinv``/``matrix_rank`` with an array ``rtol``, and
``clip`` with bounds that broadcast.

They run on ``aioengine.array_api`` (synchronous: shapes are read at once, as the suite does).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import array_api_strict as xs
import numpy as np
import pytest

import aioengine.array_api as xp

DTYPES = (
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float32",
    "float64",
    "complex64",
    "complex128",
)


def _both(make: Callable[[Any], Any]) -> tuple[Any, Any]:
    """``make`` on this namespace and on array_api_strict."""
    return make(xp), make(xs)


# -- data-dependent results whose size is known at the call ----------------------------------------


def _shapes(result: Any) -> list[tuple[Any, ...]]:
    items = result if isinstance(result, tuple) else (result,)
    return [tuple(r.shape) for r in items]


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda m: m.unique_values(m.asarray([])), id="unique_values-empty"),
        pytest.param(lambda m: m.unique_values(m.asarray([2.0])), id="unique_values-one"),
        pytest.param(lambda m: m.unique_counts(m.asarray([])), id="unique_counts-empty"),
        pytest.param(lambda m: m.unique_counts(m.asarray([[3]])), id="unique_counts-one"),
        pytest.param(lambda m: m.unique_inverse(m.zeros((0, 2))), id="unique_inverse-empty"),
        pytest.param(lambda m: m.unique_inverse(m.asarray([7])), id="unique_inverse-one"),
        pytest.param(lambda m: m.unique_all(m.asarray([])), id="unique_all-empty"),
        pytest.param(lambda m: m.unique_all(m.asarray([1.0])), id="unique_all-one"),
        pytest.param(lambda m: m.nonzero(m.asarray([])), id="nonzero-empty"),
        pytest.param(lambda m: m.nonzero(m.zeros((3, 0))), id="nonzero-empty-2d"),
        pytest.param(lambda m: m.repeat(m.asarray([]), 3), id="repeat-empty"),
        pytest.param(
            lambda m: m.repeat(m.zeros((0, 2)), m.asarray([], dtype=m.int64), axis=0),
            id="repeat-empty-array-repeats",
        ),
        pytest.param(
            lambda m: m.zeros((0, 3))[m.zeros((0,), dtype=m.bool)], id="mask-without-elements"
        ),
        pytest.param(lambda m: m.zeros((2, 0))[m.zeros((2, 0), dtype=m.bool)], id="mask-2d-empty"),
    ],
)
def test_data_dependent_sizes_known_at_the_call(make: Callable[[Any], Any]) -> None:
    ours, reference = _both(make)
    assert _shapes(ours) == _shapes(reference)
    for got, want in zip(
        ours if isinstance(ours, tuple) else (ours,),
        reference if isinstance(reference, tuple) else (reference,),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda m: m.asarray(3.0)[m.asarray(False)], id="0d-false"),
        pytest.param(lambda m: m.asarray(3.0)[m.asarray(True)], id="0d-true"),
        pytest.param(lambda m: m.asarray([1.0, 2.0, 3.0])[m.asarray([True, False, True])], id="1d"),
        pytest.param(lambda m: m.reshape(m.arange(6), (2, 3))[m.asarray([False, True])], id="rows"),
    ],
)
def test_a_ready_mask_gives_its_count_at_the_call(make: Callable[[Any], Any]) -> None:
    ours, reference = _both(make)
    assert tuple(ours.shape) == tuple(reference.shape)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(reference))


def test_a_ready_mask_is_taken_as_it_is_at_the_call() -> None:
    x = xp.asarray([1.0, 2.0, 3.0])
    mask = xp.asarray([True, True, False])
    picked = x[mask]
    mask[0] = False  # after the index: not seen by it, as for a read pushed at the call
    assert picked.shape == (2,)
    np.testing.assert_array_equal(np.asarray(picked), [1.0, 2.0])
    np.testing.assert_array_equal(np.asarray(x[mask]), [2.0])


# -- finfo, iinfo, can_cast --------------------------------------------------------------------


@pytest.mark.parametrize("name", ["float32", "float64", "complex64", "complex128"])
def test_finfo_fields_are_python_numbers(name: str) -> None:
    ours, reference = xp.finfo(getattr(xp, name)), xs.finfo(getattr(xs, name))
    for field in ("eps", "max", "min", "smallest_normal"):
        assert type(getattr(ours, field)) is float, field
        assert getattr(ours, field) == getattr(reference, field), field
    assert type(ours.bits) is int
    assert ours.bits == reference.bits
    real = {"complex64": "float32", "complex128": "float64"}.get(name, name)
    assert ours.dtype == np.dtype(real)
    assert xp.finfo(xp.asarray([1.0], dtype=getattr(xp, name))) == ours


@pytest.mark.parametrize("name", [n for n in DTYPES if n[0] in "iu"])
def test_iinfo_fields_are_python_ints(name: str) -> None:
    ours, reference = xp.iinfo(getattr(xp, name)), xs.iinfo(getattr(xs, name))
    for field in ("bits", "max", "min"):
        assert type(getattr(ours, field)) is int, field
        assert getattr(ours, field) == getattr(reference, field), field
    assert ours.dtype == np.dtype(name)


def test_can_cast_follows_the_standard_for_every_pair() -> None:
    wrong = [
        (a, b)
        for a in DTYPES
        for b in DTYPES
        if xp.can_cast(getattr(xp, a), getattr(xp, b))
        != xs.can_cast(getattr(xs, a), getattr(xs, b))
    ]
    assert wrong == []
    assert xp.can_cast(xp.complex64, xp.float64) is False
    assert xp.can_cast(xp.int8, xp.float32) is False
    assert xp.can_cast(xp.asarray([1], dtype=xp.uint8), xp.int16) is True


# -- DLPack ------------------------------------------------------------------------------------


def test_dlpack_signature_is_the_standards() -> None:
    params = inspect.signature(xp.asarray([1.0]).__dlpack__).parameters
    assert list(params) == ["stream", "max_version", "dl_device", "copy"]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params.values())
    assert all(p.default is None for p in params.values())


def test_dlpack_without_arguments_exports_a_legacy_capsule_of_a_copy() -> None:
    x = xp.asarray([1.0, 2.0, 3.0])
    capsule = x.__dlpack__()
    assert "dltensor" in repr(capsule)
    with pytest.raises(BufferError):
        x.__dlpack__(copy=False)  # read-only: a legacy capsule cannot say so
    np.testing.assert_array_equal(np.asarray(x), [1.0, 2.0, 3.0])


def test_from_dlpack_of_numpy_and_array_api_strict() -> None:
    x = xp.reshape(xp.arange(6, dtype=xp.float64), (2, 3))
    got = np.from_dlpack(x)
    np.testing.assert_array_equal(got, np.arange(6.0).reshape(2, 3))
    assert not got.flags.writeable  # a versioned capsule says read-only: never changes
    assert np.from_dlpack(x, copy=True).flags.writeable
    strict = xs.from_dlpack(x)
    np.testing.assert_array_equal(np.asarray(strict), np.arange(6.0).reshape(2, 3))
    back = xp.from_dlpack(xs.asarray([1.0, 2.0]))
    np.testing.assert_array_equal(np.asarray(back), [1.0, 2.0])


# -- pinv / matrix_rank with an array rtol, clip with bounds that broadcast ---------------------


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(
            lambda m: m.linalg.pinv(m.zeros((0, 2, 2)), rtol=m.zeros((0,))), id="pinv-empty"
        ),
        pytest.param(
            lambda m: m.linalg.pinv(
                m.reshape(m.arange(12, dtype=m.float64), (3, 2, 2)),
                rtol=m.asarray([0.1, 0.2, 0.3]),
            ),
            id="pinv-stack",
        ),
        pytest.param(
            lambda m: m.linalg.matrix_rank(
                m.reshape(m.arange(12, dtype=m.float64), (3, 2, 2)), rtol=m.asarray([0.5])
            ),
            id="matrix_rank-stack",
        ),
        pytest.param(lambda m: m.clip(m.zeros((0, 1)), max=m.zeros((0,))), id="clip-empty-max"),
        pytest.param(
            lambda m: m.clip(m.asarray([1.0, 5.0, 9.0]), min=2.0, max=m.asarray([[3.0], [8.0]])),
            id="clip-broadcast",
        ),
    ],
)
def test_against_array_api_strict(make: Callable[[Any], Any]) -> None:
    ours, reference = _both(make)
    assert tuple(ours.shape) == tuple(reference.shape)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(reference))


def test_pinv_rtol_that_does_not_broadcast_raises_at_the_call() -> None:
    with pytest.raises(ValueError, match="does not broadcast"):
        xp.linalg.pinv(xp.zeros((3, 2, 2)), rtol=xp.zeros((2,)))


def test_clip_bounds_that_do_not_broadcast_raise_at_the_call() -> None:
    with pytest.raises(ValueError, match="do not broadcast"):
        xp.clip(xp.zeros((3,)), max=xp.zeros((2,)))


def test_expand_dims_takes_axis_by_position_or_keyword() -> None:
    params = inspect.signature(xp.expand_dims).parameters
    assert params["x"].kind is inspect.Parameter.POSITIONAL_ONLY
    assert params["axis"].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    x = xp.asarray([1.0, 2.0])
    assert xp.expand_dims(x, 1).shape == xs.expand_dims(xs.asarray([1.0, 2.0]), 1).shape == (2, 1)
    assert xp.expand_dims(x, axis=-1).shape == (2, 1)
    assert xp.expand_dims(x).shape == (1, 2)


# -- the standard's special cases where NumPy's differ ----------------------------------------

INF, NAN = float("inf"), float("nan")

# (x1, x2, the standard's floor_divide(x1, x2)): -0.0 and 0.0 differ (their sign is checked).
FLOOR_DIVIDE = [
    (INF, 2.0, INF),
    (INF, -2.0, -INF),
    (-INF, 2.0, -INF),
    (-INF, -2.0, INF),
    (INF, 0.0, INF),
    (-INF, 0.0, -INF),
    (1.0, INF, 0.0),
    (1.0, -INF, -0.0),
    (-1.0, INF, -0.0),
    (-1.0, -INF, 0.0),
    (INF, INF, NAN),
    (NAN, 1.0, NAN),
    (7.0, 2.0, 3.0),
    (-7.0, 2.0, -4.0),
    (5.0, 0.0, INF),
    (-5.0, -0.0, INF),
]


def _same(got: Any, want: Any) -> bool:
    """Equal, NaN equal to NaN, and the sign of a zero (or an infinity) the same."""
    got, want = complex(got), complex(want)
    for g, w in ((got.real, want.real), (got.imag, want.imag)):
        if np.isnan(w):
            if not np.isnan(g):
                return False
        elif g != w or np.signbit(g) != np.signbit(w):
            return False
    return True


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_floor_divide_special_cases(dtype: str) -> None:
    x1 = xp.asarray([c[0] for c in FLOOR_DIVIDE], dtype=getattr(xp, dtype))
    x2 = xp.asarray([c[1] for c in FLOOR_DIVIDE], dtype=getattr(xp, dtype))
    inplace = xp.asarray(x1, copy=True)
    inplace //= x2
    for got in (xp.floor_divide(x1, x2), x1 // x2, inplace):
        assert got.dtype == getattr(xp, dtype)
        values = np.asarray(got).tolist()
        wrong = [
            (a, b, v, w)
            for (a, b, w), v in zip(FLOOR_DIVIDE, values, strict=True)
            if not _same(v, w)
        ]
        assert wrong == []
    # A Python scalar operand, on either side.
    assert _same(float(xp.asarray([INF], dtype=getattr(xp, dtype)) // 2.0), INF)
    assert _same(float(-1.0 // xp.asarray([INF], dtype=getattr(xp, dtype))), -0.0)


def test_floor_divide_of_integers_is_numpys() -> None:
    x = xp.asarray([7, -7, 0])
    np.testing.assert_array_equal(np.asarray(x // 2), [3, -4, 0])
    np.testing.assert_array_equal(np.asarray(xp.floor_divide(x, xp.asarray([2, 2, 3]))), [3, -4, 0])


EXPM1 = [
    (complex(INF, 0.0), complex(INF, 0.0)),
    (complex(INF, -0.0), complex(INF, -0.0)),
    (complex(-INF, 0.0), complex(-1.0, 0.0)),
    (complex(-INF, 1.0), complex(-1.0, 0.0)),
    (complex(-INF, -1.0), complex(-1.0, -0.0)),
    (complex(INF, 1.0), complex(INF, INF)),
    (complex(INF, 2.0), complex(-INF, INF)),
    (complex(INF, INF), complex(INF, NAN)),
    (complex(INF, NAN), complex(INF, NAN)),
    (complex(-INF, INF), complex(-1.0, 0.0)),
    (complex(-INF, NAN), complex(-1.0, 0.0)),
    (complex(NAN, 0.0), complex(NAN, 0.0)),
    (complex(NAN, -0.0), complex(NAN, -0.0)),
    (complex(NAN, 1.0), complex(NAN, NAN)),
    (complex(0.0, INF), complex(NAN, NAN)),
    (complex(0.0, 0.0), complex(0.0, 0.0)),
]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_expm1_complex_special_cases(dtype: str) -> None:
    x = xp.asarray([c[0] for c in EXPM1], dtype=getattr(xp, dtype))
    got = xp.expm1(x)
    assert got.dtype == getattr(xp, dtype)
    values = np.asarray(got).tolist()
    wrong = [(z, v, w) for (z, w), v in zip(EXPM1, values, strict=True) if not _same(v, w)]
    assert wrong == []
    finite = xp.asarray([complex(1.0, 1.0), complex(-0.5, 2.0)], dtype=getattr(xp, dtype))
    np.testing.assert_allclose(
        np.asarray(xp.expm1(finite)), np.expm1(np.asarray(finite)), rtol=1e-6
    )
    assert _same(complex(xp.expm1(xp.asarray(complex(INF, 0.0)))), complex(INF, 0.0))
