"""The MXNet motivation: an SGD loop that updates NumPy weights in place, with ``+=``.

MXNet built its dependency engine so that "the weight update function in DNN can use the +=
operator to update the weights in place, rather than generating a new weight array each
time". This example is that loop for a two-layer regression network, written with the plain
MXNet-style calls:

* ``load`` operations (the data loader) fill one of two batch buffers; each buffer has a
  Var, so batch ``k + 1`` loads while step ``k`` computes (double buffering), and a buffer
  is refilled only after the step that reads it has finished: the rule, not a queue;
* ``grad`` operations read the weights and a batch and write the gradient buffers;
* ``update`` mutates the weights in place (``w1 += -lr * g1``): every gradient pushed
  before it has finished reading them, and every gradient pushed after it waits for it;
* a coroutine operation reports the loss without stopping the loop.

The overlap is checked, not assumed: the gradient of step ``k`` and the load of batch
``k + 1`` meet. Each says when it begins and, before it finishes, waits for the other to have
begun, so both waits end only if the two run at the same time. Were the engine to run them one
after the other, the first would wait in vain, time out, and the example fail. No timing
threshold is involved: a loaded machine makes the run slower, not the check flaky.

At the end the same pushes are replayed on a serial engine: the weights are bit-identical.

Run: python examples/training.py   (AIOENGINE_EXAMPLE_SMALL=1 for a quick run)
"""

from __future__ import annotations

import asyncio
import os
import threading
import time

# The engine's workers are the parallelism: one BLAS thread per worker avoids oversubscribing
# the cores (MXNet does the same with its OpenMP threads). Set before NumPy loads BLAS.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

import aioengine as ae  # noqa: E402

SMALL = os.environ.get("AIOENGINE_EXAMPLE_SMALL") == "1"
STEPS = 20 if SMALL else 200
BATCH, FEATURES, HIDDEN = (64, 16, 32) if SMALL else (256, 64, 128)
LOAD_LATENCY = 0.002  # seconds: the disk / decode time of one batch
LR = 0.05
OVERLAP_TIMEOUT = 30.0  # seconds to wait for the partner to begin (reached only if broken)
# Loading overlaps computing only with a second worker thread (one for each).
WORKERS = max(2, os.cpu_count() or 1)


async def train(serial: bool) -> tuple[np.ndarray, np.ndarray, list[float], list[bool], float]:
    rng = np.random.default_rng(0)
    true_w = rng.standard_normal((FEATURES, 1))
    w1 = rng.standard_normal((FEATURES, HIDDEN)) * 0.1
    w2 = rng.standard_normal((HIDDEN, 1)) * 0.1
    g1, g2 = np.zeros_like(w1), np.zeros_like(w2)
    buffers = [(np.zeros((BATCH, FEATURES)), np.zeros((BATCH, 1))) for _ in range(2)]
    losses: list[float] = []
    load_began = [threading.Event() for _ in range(STEPS)]
    grad_began = [threading.Event() for _ in range(STEPS)]
    met: list[bool] = []  # one per wait: did the partner begin while this op was running?

    def meet(partner: threading.Event | None) -> None:
        """Before an operation finishes: wait for its partner to have begun (threaded run)."""
        if not serial and partner is not None:  # a serial engine runs one op at a time
            patience = OVERLAP_TIMEOUT if False not in met else 0.0  # fail fast once broken
            met.append(partner.wait(patience))

    async with ae.Engine(serial=serial, cpu_workers=WORKERS) as engine:
        weights = engine.new_var("weights")
        grads = engine.new_var("grads")
        batch_vars = [engine.new_var(f"batch{i}") for i in range(2)]

        def load(step: int) -> ae.Operation[None]:
            x, y = buffers[step % 2]

            def fn(rctx: ae.RunContext) -> None:
                load_began[step].set()
                time.sleep(LOAD_LATENCY)  # reading and decoding (releases the GIL)
                batch_rng = np.random.default_rng(step)
                x[:] = batch_rng.standard_normal(x.shape)
                y[:] = np.tanh(x @ true_w)
                meet(grad_began[step - 1] if step > 0 else None)

            return engine.push_sync(fn, mutate_vars=[batch_vars[step % 2]], name=f"load{step}")

        def gradient(step: int) -> ae.Operation[float]:
            x, y = buffers[step % 2]

            def fn(rctx: ae.RunContext) -> float:
                grad_began[step].set()
                h = np.tanh(x @ w1)
                err = h @ w2 - y
                g2[:] = h.T @ err / BATCH
                g1[:] = x.T @ ((err @ w2.T) * (1 - h**2)) / BATCH
                meet(load_began[step + 1] if step + 1 < STEPS else None)
                return float(np.mean(err**2))

            return engine.push_sync(
                fn, const_vars=[weights, batch_vars[step % 2]], mutate_vars=[grads], name="grad"
            )

        def update(rctx: ae.RunContext) -> None:
            w1[:] += -LR * g1  # in place: the engine gave this op the weights alone
            w2[:] += -LR * g2

        async def report(rctx: ae.RunContext, loss: ae.Operation[float]) -> None:
            losses.append(await loss)  # e.g. an HTTP call to a metrics service

        t0 = time.perf_counter()
        load(0)
        for step in range(STEPS):
            if step + 1 < STEPS:
                load(step + 1)  # the next batch loads while this step computes
            loss = gradient(step)
            engine.push_sync(update, const_vars=[grads], mutate_vars=[weights], name="update")
            engine.push_async(lambda rctx, op=loss: report(rctx, op), name="report")
        await engine.wait_for_all()
        wall = time.perf_counter() - t0
    return w1, w2, losses, met, wall


async def main() -> None:
    w1, w2, losses, met, wall = await train(serial=False)
    s1, s2, serial_losses, _, serial_wall = await train(serial=True)
    print(f"{STEPS} SGD steps: loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    print(
        f"threaded {wall:.3f} s, serial {serial_wall:.3f} s "
        f"(loading alone takes {STEPS * LOAD_LATENCY:.3f} s: it overlaps the compute)"
    )
    assert losses[-1] < losses[0]
    assert met == [True] * (2 * (STEPS - 1)), met
    print(f"verified: each of the {STEPS - 1} next-batch loads ran while a step computed")
    assert np.array_equal(w1, s1)
    assert np.array_equal(w2, s2)
    assert losses == serial_losses
    print("verified: weights bit-identical to the serial run")


if __name__ == "__main__":
    asyncio.run(main())
