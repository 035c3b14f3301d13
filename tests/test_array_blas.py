"""BLAS threads (``aioengine/array/_blas.py``): while two or more matmul-class operations run
at once, NumPy's BLAS runs on one thread (each worker is a core's worth); alone, one gets its
threads back. What a user relies on: no oversubscription with default settings, the user's own
BLAS setting restored, and the same results."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
from threadpoolctl import ThreadpoolController

import aioengine as ae
import aioengine.array as aa
from aioengine.array import _blas


def _blas_threads() -> list[int]:
    return [
        lib.num_threads for lib in ThreadpoolController().select(user_api="blas").lib_controllers
    ]


def test_two_products_at_once_run_blas_on_one_thread_and_restore_it() -> None:
    before = _blas_threads()
    first_in, second_done = threading.Event(), threading.Event()
    seen: dict[str, Any] = {}

    def first() -> None:
        first_in.set()
        second_done.wait(10)
        seen["first, while the second ran"] = _blas_threads()

    def second() -> None:
        seen["second"] = _blas_threads()
        seen["running"] = _blas.blas_running()

    t = threading.Thread(target=_blas.blas_call(first))
    t.start()
    assert first_in.wait(10)
    seen["first alone"] = _blas_threads()
    _blas.blas_call(second)()
    second_done.set()
    t.join(10)
    assert seen["first alone"] == before  # one product: BLAS keeps its threads
    assert seen["running"] == 2
    assert all(n == 1 for n in seen["second"])  # two at once: one thread each
    assert _blas_threads() == before  # restored once they are done
    assert _blas.blas_running() == 0


def test_a_failing_product_still_gives_its_share_back() -> None:
    def boom() -> None:
        raise ValueError("no")

    try:
        _blas.blas_call(boom)()
    except ValueError:
        pass
    assert _blas.blas_running() == 0


async def test_concurrent_matmuls_on_the_pool_equal_numpy_and_leave_blas_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = _blas_threads()
    entered: list[int] = []
    enter = _blas._enter

    def counting_enter() -> None:
        entered.append(1)
        enter()

    monkeypatch.setattr(_blas, "_enter", counting_enter)
    rng = np.random.default_rng(0)
    an, bn = rng.standard_normal((300, 200)), rng.standard_normal((200, 250))
    async with ae.Engine(cpu_workers=2) as engine:
        xp = aa.namespace(engine)
        a, b = xp.asarray(an), xp.asarray(bn)
        products = [a @ b for _ in range(6)] + [xp.tensordot(a, b, axes=1)]
        products.append(xp.linalg.inv(xp.asarray(an[:200] @ an[:200].T + 200 * np.eye(200))))
        values = [await p for p in products]
    for v in values[:-1]:
        np.testing.assert_allclose(v, an @ bn, rtol=1e-12)
    assert len(entered) == len(products)  # every product on the pool was counted
    assert _blas_threads() == before
    assert _blas.blas_running() == 0
