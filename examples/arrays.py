"""K-means clustering on aioengine arrays, checked against the same program on NumPy.

The clustering is written once, against the Python Array API standard (the functions that take
``xp``), and run twice: on ``xp = aioengine.array.namespace(engine)``, where every call is a
push that returns at once, and on ``numpy``, which computes each call before it returns.
With the engine:

* the data set is *loaded* in shards by ``xp.apply`` (a plain NumPy function on the CPU pool;
  here it draws synthetic Gaussian blobs after a simulated disk latency): the shards load in
  parallel, and the clustering is pushed before any of them has arrived;
* each Lloyd iteration is data-parallel: every shard computes its partial sums, counts and
  inertia on its own (the engine runs the shards' operations at once, on different workers),
  then the partials are added;
* several restarts (different k-means++ seeds) run at once, each a coroutine that awaits only
  what decides its control flow (the seeding distances, its convergence test ``await shift``):
  the restarts' operations interleave on the workers, none waits for a global barrier;
* the cluster sizes come from ``xp.unique_counts``, whose shape depends on the data
  (``(None,)`` until the value is known).

NumPy then runs the same restarts one after the other; centroids, inertias, iteration counts
and cluster sizes must match (the same NumPy kernels run on the same values, in the same order).

Run: python examples/arrays.py   (AIOENGINE_EXAMPLE_SMALL=1 for a quick run)
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import numpy as np

import aioengine as ae
import aioengine.array as aa

SMALL = os.environ.get("AIOENGINE_EXAMPLE_SMALL") == "1"
POINTS, FEATURES, CLUSTERS = (4_000, 8, 4) if SMALL else (200_000, 8, 8)
SHARDS = 4
RESTARTS = 3 if SMALL else 4
MAX_ITER = 50  # per restart; one stuck between two local minima stops here
TOL = 1e-9  # a restart has converged when no centroid moves more than this
LOAD_LATENCY = 0.01  # seconds: the disk / decode time of one shard

Result = tuple[np.ndarray, float, int]  # centroids, inertia, iterations


def true_centers() -> np.ndarray:
    """The centres of the synthetic blobs (what the clustering should find)."""
    return np.random.default_rng(0).uniform(-10.0, 10.0, (CLUSTERS, FEATURES))


def load_shard(shard: int) -> np.ndarray:
    """One shard of the data set: points drawn around the blob centres (a plain NumPy function,
    run on the engine's CPU pool by ``xp.apply``)."""
    time.sleep(LOAD_LATENCY)  # reading and decoding (releases the GIL)
    rng = np.random.default_rng(1 + shard)
    n = POINTS // SHARDS
    labels = rng.integers(0, CLUSTERS, n)
    return true_centers()[labels] + rng.standard_normal((n, FEATURES))


# -- the algorithm, in the Array API: ``xp`` is the engine's namespace or numpy ----------------


def sq_distances(xp: Any, X: Any, x2: Any, C: Any) -> Any:
    """Squared distances (N, K) of the points ``X`` (whose squared norms are ``x2``) to ``C``."""
    return x2 - 2.0 * (X @ xp.matrix_transpose(C)) + xp.sum(C * C, axis=1)


def nearest(xp: Any, X: Any, x2: Any, C: Any) -> Any:
    """Each point's squared distance to its nearest centroid (k-means++ seeding)."""
    return xp.maximum(xp.min(sq_distances(xp, X, x2, C), axis=1), 0.0)


def partials(xp: Any, X: Any, x2: Any, C: Any) -> tuple[Any, Any, Any]:
    """One shard's share of a Lloyd iteration: the sum and count of its points nearest each
    centroid, and its inertia (sum of squared distances to the nearest centroid)."""
    d2 = sq_distances(xp, X, x2, C)
    labels = xp.argmin(d2, axis=1)
    onehot = xp.astype(labels[:, None] == xp.arange(CLUSTERS)[None, :], X.dtype)
    sums = xp.matrix_transpose(onehot) @ X
    return sums, xp.sum(onehot, axis=0), xp.sum(xp.min(d2, axis=1))


def lloyd_step(xp: Any, shards: list[Any], x2s: list[Any], C: Any) -> tuple[Any, Any, Any]:
    """One iteration of Lloyd's algorithm over every shard: the new centroids, the inertia of
    ``C`` and the largest centroid move."""
    parts = [partials(xp, X, x2, C) for X, x2 in zip(shards, x2s, strict=True)]
    sums, counts, inertia = parts[0]
    for s, c, i in parts[1:]:
        sums, counts, inertia = sums + s, counts + c, inertia + i
    # An empty cluster keeps its centroid.
    new = xp.where(counts[:, None] > 0, sums / xp.maximum(counts, 1.0)[:, None], C)
    return new, inertia, xp.max(xp.abs(new - C))


def choose(rng: np.random.Generator, d2: np.ndarray) -> int:
    """k-means++: the next seed, drawn with probability proportional to ``d2``."""
    return int(rng.choice(d2.size, p=d2 / d2.sum()))


def gather_rows(xp: Any, shards: list[Any], rows: list[int]) -> Any:
    """The points at global indices ``rows`` (shards hold ``POINTS // SHARDS`` points each)."""
    n = POINTS // SHARDS
    return xp.stack([shards[r // n][r % n, :] for r in rows])


# -- the drivers: the engine's awaits the values that decide the control flow ------------------


async def restart_on_engine(xp: Any, shards: list[Any], x2s: list[Any], restart: int) -> Result:
    rng = np.random.default_rng(100 + restart)
    seeds = [int(rng.integers(POINTS))]
    while len(seeds) < CLUSTERS:  # k-means++: each choice needs the distances' values
        C = gather_rows(xp, shards, seeds)
        d2 = [nearest(xp, X, x2, C) for X, x2 in zip(shards, x2s, strict=True)]
        seeds.append(choose(rng, np.concatenate([await d for d in d2])))
    C = gather_rows(xp, shards, seeds)
    iterations = 0
    while iterations < MAX_ITER:
        iterations += 1
        C, inertia, shift = lloyd_step(xp, shards, x2s, C)
        if await shift <= TOL:  # this restart's own convergence test: the others go on
            break
    return np.asarray(await C), float(await inertia), iterations


def restart_on_numpy(shards: list[np.ndarray], x2s: list[np.ndarray], restart: int) -> Result:
    rng = np.random.default_rng(100 + restart)
    seeds = [int(rng.integers(POINTS))]
    while len(seeds) < CLUSTERS:
        C = gather_rows(np, shards, seeds)
        d2 = [nearest(np, X, x2, C) for X, x2 in zip(shards, x2s, strict=True)]
        seeds.append(choose(rng, np.concatenate(d2)))
    C = gather_rows(np, shards, seeds)
    iterations = 0
    while iterations < MAX_ITER:
        iterations += 1
        C, inertia, shift = lloyd_step(np, shards, x2s, C)
        if shift <= TOL:
            break
    return C, float(inertia), iterations


def cluster_sizes(xp: Any, shards: list[Any], x2s: list[Any], C: Any) -> Any:
    """How many points are nearest each centroid (``unique_counts``: a data-dependent shape)."""
    labels = xp.concat(
        [xp.argmin(sq_distances(xp, X, x2, C), axis=1) for X, x2 in zip(shards, x2s, strict=True)]
    )
    return xp.unique_counts(labels).counts


async def on_engine() -> tuple[list[Result], np.ndarray, float, int]:
    t0 = time.perf_counter()
    async with ae.Engine() as engine:
        xp = aa.namespace(engine)
        n = POINTS // SHARDS
        shards = [
            xp.apply(load_shard, s, shape=(n, FEATURES), dtype=xp.float64) for s in range(SHARDS)
        ]
        x2s = [xp.sum(X * X, axis=1, keepdims=True) for X in shards]  # pushed before any loads
        results = await asyncio.gather(
            *(restart_on_engine(xp, shards, x2s, r) for r in range(RESTARTS))
        )
        best = min(range(RESTARTS), key=lambda r: results[r][1])
        counts = cluster_sizes(xp, shards, x2s, xp.asarray(results[best][0]))
        assert counts.shape == (None,)  # data-dependent: unknown until computed
        sizes = np.asarray(await counts)
        assert counts.shape == (sizes.size,)
        pushed = engine.statistics().pushed
    return results, sizes, time.perf_counter() - t0, pushed


def on_numpy() -> tuple[list[Result], np.ndarray, float]:
    t0 = time.perf_counter()
    shards = [load_shard(s) for s in range(SHARDS)]
    x2s = [np.sum(X * X, axis=1, keepdims=True) for X in shards]
    results = [restart_on_numpy(shards, x2s, r) for r in range(RESTARTS)]
    best = min(range(RESTARTS), key=lambda r: results[r][1])
    sizes = cluster_sizes(np, shards, x2s, results[best][0])
    return results, sizes, time.perf_counter() - t0


def main() -> None:
    results, sizes, wall, pushed = asyncio.run(on_engine())
    expected, expected_sizes, numpy_wall = on_numpy()
    print(
        f"k-means: {POINTS:,} points in {FEATURES}-D ({SHARDS} shards), {CLUSTERS} clusters, "
        f"{RESTARTS} restarts at once on aioengine arrays ({pushed:,} operations pushed)"
    )
    for r, (_, inertia, iterations) in enumerate(results):
        limit = " (the limit)" if iterations == MAX_ITER else ""
        print(f"  restart {r}: {iterations:3d} iterations{limit}, inertia {inertia:,.1f}")
    best = min(range(RESTARTS), key=lambda r: results[r][1])
    print(f"best: restart {best}; cluster sizes {sizes.tolist()}")
    print(f"engine {wall:.3f} s; NumPy, one call after another, {numpy_wall:.3f} s")
    diff = 0.0
    for (c, inertia, iterations), (c_np, inertia_np, iterations_np) in zip(
        results, expected, strict=True
    ):
        assert iterations == iterations_np, (iterations, iterations_np)
        np.testing.assert_allclose(c, c_np, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(inertia, inertia_np, rtol=1e-9)
        diff = max(diff, float(np.max(np.abs(c - c_np))))
    assert sizes.tolist() == expected_sizes.tolist()
    # The best restart found the blobs: every true centre has a centroid close to it.
    found = results[best][0]
    gaps = np.linalg.norm(true_centers()[:, None, :] - found[None, :, :], axis=2).min(axis=1)
    assert gaps.max() < 0.5, gaps
    print(
        "verified: centroids, inertias, iteration counts and cluster sizes match NumPy "
        f"(largest centroid difference {diff:.1e}); each blob centre found within "
        f"{gaps.max():.2f}"
    )


if __name__ == "__main__":
    main()
