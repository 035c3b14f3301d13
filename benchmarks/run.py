# MXNet 1.9.1 needs ``numpy<1.24``, which has wheels for Python 3.8-3.11 only: run.py creates
# the MXNet venv (``.venv-mxnet/`` or ``--mxnet-venv``) with ``python -m venv`` + pip (uv where
# it is on PATH) on first use, from the session's interpreter when it is 3.8-3.11, else from
# python3.11/3.10/3.9 on PATH, and skips the MXNet peers with a printed note when none exists
# or the install fails.  psutil is optional (RSS is read from /proc on Linux).  ``nox -s bench``
# (noxfile.py) runs this file.
"""Benchmark orchestrator: aioengine side by side with its peers in one run.

Every measurement runs in a fresh subprocess (a runner from ``benchmarks/peers/`` that prints
JSON on stdout); peers are interleaved within each repetition, and the reported figure is the
median over repetitions.  Each run verifies its result against a serial replay (see
``workloads.py``), so a wrong order is reported as a failure, never as a fast time.

Output: a table per workload (ops/s, µs/op, spread, verification, and the ratio of every
aioengine configuration to that peer), the targets of the issue with their measured ratios
(informational, never asserted), memory figures, ``benchmarks/results/latest.json`` and
``benchmarks/results/latest.png``.

Exit status: 0, or 1 when a run failed verification or a runner crashed (timings never fail).

Usage::

    python benchmarks/run.py              # full matrix, 3 repetitions
    python benchmarks/run.py --quick      # smoke mode, under a minute once the venvs exist
    python benchmarks/run.py --only noop/,sleep --peers aio-,mxnet- --reps 5
    python benchmarks/run.py --list
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from shutil import which
from typing import Any

from workloads import WorkloadSpec, select, selftest, standard_workloads

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "results"
# Where --quick writes by default: an ignored folder (.gitignore), never the committed figures.
QUICK_RESULTS = RESULTS / "quick"
N_CPU = os.cpu_count() or 1
MXNET_REQS = ("mxnet==1.9.1", "numpy<1.24")


def _program(spec: WorkloadSpec) -> bool:
    return "program" in spec.tags


def _sync(spec: WorkloadSpec) -> bool:
    return not spec.is_coro and "memory" not in spec.tags and not _program(spec)


def _coro(spec: WorkloadSpec) -> bool:
    return spec.is_coro and not _program(spec)


# The program workloads (workloads.is_program) run on the peers that their targets compare.
def _sync_or_prog(spec: WorkloadSpec) -> bool:
    return _sync(spec) or (_program(spec) and not spec.is_coro)


def _coro_or_prog(spec: WorkloadSpec) -> bool:
    return spec.is_coro


def _coro_independent(spec: WorkloadSpec) -> bool:
    return spec.is_coro and spec.shape == "independent" and not _program(spec)


def _memory(spec: WorkloadSpec) -> bool:
    return "memory" in spec.tags


@dataclass(frozen=True)
class Peer:
    """One peer configuration: the runner module, its ``--config`` and where it applies."""

    name: str
    module: str
    family: str
    applies: Callable[[WorkloadSpec], bool]
    python: str = "main"  # "main" (this interpreter) or "mxnet" (the MXNet venv)
    config: str = ""

    @property
    def arg(self) -> str:
        """Value passed to the runner's ``--config``."""
        return self.config or self.name


PEERS: tuple[Peer, ...] = (
    Peer("mxnet-perdevice-1", "peers.mxnet_engine", "mxnet", _sync_or_prog, "mxnet", "perdevice-1"),
    Peer("mxnet-perdevice-N", "peers.mxnet_engine", "mxnet", _sync_or_prog, "mxnet", "perdevice-N"),
    Peer("mxnet-threaded", "peers.mxnet_engine", "mxnet", _sync_or_prog, "mxnet", "threaded"),
    Peer("mxnet-naive", "peers.mxnet_engine", "mxnet", _sync_or_prog, "mxnet", "naive"),
    Peer("dask-N", "peers.dask_threaded", "dask", _sync),
    Peer("floor-inline", "peers.asyncio_floor", "floor", _sync_or_prog),
    Peer("floor-inline-uvloop", "peers.asyncio_floor", "floor", _sync_or_prog),
    Peer("floor-pool", "peers.asyncio_floor", "floor", _sync),
    Peer("floor-cb", "peers.asyncio_floor", "floor", _coro),
    Peer("floor-task", "peers.asyncio_floor", "floor", _coro_or_prog),
    Peer("floor-task-uvloop", "peers.asyncio_floor", "floor", _coro_or_prog),
    Peer("gather", "peers.asyncio_floor", "floor", _coro_independent),
    Peer("gather-uvloop", "peers.asyncio_floor", "floor", _coro_independent),
    Peer("aio-threaded", "peers.aioengine_runner", "aio", _sync_or_prog),
    Peer("aio-threaded-uvloop", "peers.aioengine_runner", "aio", _sync_or_prog),
    Peer("aio-inline", "peers.aioengine_runner", "aio", _sync_or_prog),
    Peer("aio-inline-uvloop", "peers.aioengine_runner", "aio", _sync_or_prog),
    Peer("aio-serial", "peers.aioengine_runner", "aio", _sync_or_prog),
    Peer("aio-traced", "peers.aioengine_runner", "aio", _sync),
    Peer("aio-serial-uvloop", "peers.aioengine_runner", "aio", _sync_or_prog),
    Peer("aio-inline-bulk", "peers.aioengine_runner", "aio", _sync),
    Peer("aio-inline-bulk-uvloop", "peers.aioengine_runner", "aio", _sync),
    Peer("aio-serial-bulk", "peers.aioengine_runner", "aio", _sync),
    Peer("aio-serial-bulk-uvloop", "peers.aioengine_runner", "aio", _sync),
    Peer("aio-async", "peers.aioengine_runner", "aio", _coro_or_prog),
    Peer("aio-async-uvloop", "peers.aioengine_runner", "aio", _coro_or_prog),
    Peer("aio-mem", "peers.aioengine_runner", "aio", _memory),
)

#: Short column labels for the aioengine configurations in the per-workload tables.
AIO_LABELS = {
    "aio-threaded": "thr",
    "aio-threaded-uvloop": "thr/uv",
    "aio-inline": "inl",
    "aio-inline-uvloop": "inl/uv",
    "aio-serial": "ser",
    "aio-traced": "trace",
    "aio-serial-uvloop": "ser/uv",
    "aio-inline-bulk": "inl+b",
    "aio-inline-bulk-uvloop": "inl+b/uv",
    "aio-serial-bulk": "ser+b",
    "aio-serial-bulk-uvloop": "ser+b/uv",
    "aio-async": "async",
    "aio-async-uvloop": "async/uv",
}


@dataclass(frozen=True)
class Target:
    """A throughput target of the issue: aioengine config / best of peers >= ``min_ratio``."""

    label: str
    prefix: str  # workload name prefix
    aio: str
    peers: tuple[str, ...]
    min_ratio: float
    loop_variants: bool = True  # also check "<aio>-uvloop" against "<peer>-uvloop" if present
    informational: bool = False  # a ratio worth showing that no issue sets a target for


MX_N = "mxnet-perdevice-N"
TARGETS: tuple[Target, ...] = (
    Target(
        "sync no-op, CPU pool >= 1.5x MXNet best threaded",
        "noop/",
        "aio-threaded",
        ("mxnet-perdevice-1", "mxnet-perdevice-N", "mxnet-threaded"),
        1.5,
    ),
    Target("inline >= 0.6x asyncio inline floor", "noop/", "aio-inline", ("floor-inline",), 0.6),
    Target("serial >= 0.6x asyncio inline floor", "noop/", "aio-serial", ("floor-inline",), 0.6),
    Target("inline >= NaiveEngine", "noop/", "aio-inline", ("mxnet-naive",), 1.0),
    Target("serial >= NaiveEngine", "noop/", "aio-serial", ("mxnet-naive",), 1.0),
    # The same targets with the push loop inside engine.bulk(64) (MXNet's bulk execution).
    Target(
        "inline, bulk(64) >= 0.6x asyncio inline floor",
        "noop/",
        "aio-inline-bulk",
        ("floor-inline",),
        0.6,
    ),
    Target(
        "serial, bulk(64) >= 0.6x asyncio inline floor",
        "noop/",
        "aio-serial-bulk",
        ("floor-inline",),
        0.6,
    ),
    Target("inline, bulk(64) >= NaiveEngine", "noop/", "aio-inline-bulk", ("mxnet-naive",), 1.0),
    Target("serial, bulk(64) >= NaiveEngine", "noop/", "aio-serial-bulk", ("mxnet-naive",), 1.0),
    Target("coro ops >= 0.6x task-per-op floor", "coro-yield/", "aio-async", ("floor-task",), 0.6),
    Target("10 ms I/O within 1.5x of gather", "coro-io/", "aio-async", ("gather",), 1 / 1.5),
    Target("sleep >= 0.95x MXNet N workers", "sleep/", "aio-threaded", (MX_N,), 0.95),
    Target("numpy >= 0.95x MXNet N workers", "numpy/", "aio-threaded", (MX_N,), 0.95),
    Target("no-op >= 5x dask threaded", "noop/", "aio-threaded", ("dask-N",), 5.0),
    # What a user's program pays (workloads.is_program): the collector on, a heap of 200,000
    # objects, closures, no collection before the clock.
    Target("program: inline >= NaiveEngine", "program/noop/", "aio-inline", ("mxnet-naive",), 1.0),
    Target("program: serial >= NaiveEngine", "program/noop/", "aio-serial", ("mxnet-naive",), 1.0),
    Target(
        "program: sync no-op, CPU pool vs MXNet best threaded",
        "program/noop/",
        "aio-threaded",
        ("mxnet-perdevice-1", "mxnet-perdevice-N", "mxnet-threaded"),
        0.0,
        informational=True,
    ),
    Target(
        "program: coro ops vs task-per-op floor",
        "program/coro-yield/",
        "aio-async",
        ("floor-task",),
        0.0,
        informational=True,
    ),
    # The cost of tracing (issue 5: "measured in the benchmark"): a ratio, with no target.
    Target(
        "traced no-op vs untraced (cost of tracing)",
        "noop/",
        "aio-traced",
        ("aio-threaded",),
        0.0,
        loop_variants=False,
        informational=True,
    ),
)

PENDING_LIMIT_BYTES = 1024
RSS_LIMIT_MIB = 50.0


def memory_workloads(quick: bool) -> list[WorkloadSpec]:
    """Memory benchmarks: pending ops (tracemalloc) and RSS after many ops."""
    n_pending = 10_000 if quick else 100_000
    n_rss = 100_000 if quick else 1_000_000
    return [
        WorkloadSpec("memory/pending", "chain", "noop", n_pending, tags=("memory",)),
        WorkloadSpec("memory/rss", "random", "noop", n_rss, tags=("memory",)),
    ]


# --------------------------------------------------------------------------------------------
# environment: interpreters, the MXNet venv, availability probes


@dataclass
class Env:
    """Interpreters and availability of optional peers for this run."""

    main_python: str = sys.executable
    mxnet_python: str | None = None
    notes: list[str] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    skipped: set[str] = field(default_factory=set)  # families or peer names to skip


def child_env() -> dict[str, str]:
    """Environment of every runner: BLAS/OpenMP pinned to one thread, runners importable."""
    env = dict(os.environ)
    path = [str(BENCH)]
    # The installed aioengine is what a user runs (nox installs a wheel, with the compiled
    # core): the sources in the tree only when none is installed, as they would shadow it.
    if importlib.util.find_spec("aioengine") is None:
        path.append(str(ROOT))
    if env.get("PYTHONPATH"):
        path.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(path)
    for var in (
        "OMP_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "MKL_NUM_THREADS",
        "NUMEXPR_NUM_THREADS",
    ):
        env[var] = "1"
    env.pop("MXNET_ENGINE_TYPE", None)
    env.pop("MXNET_CPU_WORKER_NTHREADS", None)
    return env


def venv_python(venv: Path) -> Path:
    """Return the interpreter path of a virtual environment."""
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def mxnet_base_python() -> str | None:
    """Return an interpreter that can host ``numpy<1.24`` (3.8 to 3.11), preferring this one."""
    cands = [sys.executable] + [p for v in ("3.11", "3.10", "3.9") if (p := which(f"python{v}"))]
    for cand in cands:
        try:
            out = subprocess.run(
                [cand, "-c", "import sys; print(sys.version_info[0] * 100 + sys.version_info[1])"],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        if 308 <= int(out.strip() or 0) <= 311:
            return cand
    return None


def _probe_mxnet(py: Path) -> dict[str, Any] | str:
    try:
        proc = subprocess.run(
            [str(py), "-m", "peers.mxnet_engine", "--probe"],
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"probe failed: {exc}"
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["?"]
        return f"probe failed (rc={proc.returncode}): {tail[0]}"
    try:
        data: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return "probe printed no JSON"
    return data


def ensure_mxnet(venv: Path, allow_install: bool, retry: bool) -> tuple[str | None, str]:
    """Return ``(python, note)`` for the MXNet venv, creating/installing it when needed.

    ``python`` is ``None`` when MXNet is unusable; the note says why.  A failed installation
    leaves a marker so later runs do not retry the slow install unless ``retry`` is set.
    """
    py = venv_python(venv)
    marker = venv / ".bench-install-failed"
    if py.exists():
        probe = _probe_mxnet(py)
        if isinstance(probe, dict):
            return str(py), f"MXNet {probe['version']} from {venv}"
        if marker.exists() and not retry:
            return None, f"MXNet skipped: earlier install into {venv} failed ({marker.read_text()})"
    if not allow_install:
        return None, f"MXNet skipped: no usable venv at {venv} and --no-install given"
    print(f"[setup] installing {' '.join(MXNET_REQS)} into {venv} (one-time, 1-3 min) ...")
    sys.stdout.flush()
    t0 = time.perf_counter()
    base = mxnet_base_python()
    if base is None:
        return None, (
            "MXNet skipped: numpy<1.24 needs Python <= 3.11 and no such interpreter was found"
            " (this one, python3.11, python3.10, python3.9)"
        )
    try:
        # uv where it is on PATH (CI's .ci/run installs it): the same venv and wheels, in
        # seconds instead of a minute or two.
        uv = which("uv")
        if not py.exists():
            make = [uv, "venv", "-q", "--python", base] if uv else [base, "-m", "venv"]
            subprocess.run([*make, str(venv)], check=True, timeout=300)
        if uv:
            pip = [uv, "pip", "install", "-q", "--python", str(py)]
        else:
            pip = [str(py), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
        subprocess.run([*pip, "--only-binary=:all:", *MXNET_REQS], check=True, timeout=1200)
    except (OSError, subprocess.SubprocessError) as exc:
        reason = f"{type(exc).__name__}: {exc}"
        if venv.exists():
            marker.write_text(reason)
        return None, f"MXNet skipped: installing {' '.join(MXNET_REQS)} failed ({reason})"
    probe = _probe_mxnet(py)
    if isinstance(probe, str):
        marker.write_text(probe)
        return None, f"MXNet skipped: installed but unusable ({probe})"
    marker.unlink(missing_ok=True)
    took = time.perf_counter() - t0
    # Paths relative to the checkout: the report is committed, and a home directory is no
    # reader's business.
    shown = os.path.relpath(venv, ROOT)
    return str(py), f"MXNet {probe['version']} installed into {shown} in {took:.0f} s"


def probe_main(env: Env) -> None:
    """Check which optional modules this interpreter has; record versions and notes."""
    code = (
        "import importlib, json, sys\n"
        "out = {}\n"
        "for m in ('aioengine', 'dask', 'uvloop', 'numpy'):\n"
        "    try:\n"
        "        mod = importlib.import_module(m)\n"
        "        out[m] = str(getattr(mod, '__version__', '?'))\n"
        "    except Exception as exc:\n"
        "        out[m] = 'ERROR ' + type(exc).__name__ + ': ' + str(exc)\n"
        "if not out['aioengine'].startswith('ERROR'):\n"
        "    from aioengine.engine import _COMPILED\n"
        "    out['aioengine core'] = 'compiled' if _COMPILED else 'pure Python'\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run(
        [env.main_python, "-c", code],
        # ``-c`` puts the working directory first on sys.path: from the repository root the
        # sources would shadow the installed aioengine that the runners import.
        cwd=BENCH,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    found: dict[str, str] = json.loads(proc.stdout.strip().splitlines()[-1])
    env.versions.update({k: v for k, v in found.items() if not v.startswith("ERROR")})
    for mod, ver in found.items():
        if not ver.startswith("ERROR"):
            continue
        env.notes.append(f"{mod} unavailable ({ver[6:]}): its peers are skipped")
        if mod == "aioengine":
            env.skipped.add("aio")
        elif mod == "dask":
            env.skipped.add("dask")
        elif mod == "uvloop":
            env.skipped.update(p.name for p in PEERS if p.name.endswith("-uvloop"))


# --------------------------------------------------------------------------------------------
# running


@dataclass
class Job:
    """One subprocess: a peer running one or more workloads."""

    peer: Peer
    specs: list[WorkloadSpec]


def run_job(job: Job, env: Env, timeout: float) -> list[dict[str, Any]]:
    """Run *job* in a fresh process; return its result records (errors as records)."""
    py = env.mxnet_python if job.peer.python == "mxnet" else env.main_python
    assert py is not None
    cmd = [
        py,
        "-m",
        job.peer.module,
        "--config",
        job.peer.arg,
        "--workloads",
        json.dumps([s.to_json() for s in job.specs]),
    ]
    err = ""
    try:
        proc = subprocess.run(
            cmd,
            env=child_env(),
            cwd=BENCH,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        lines = proc.stdout.strip().splitlines()
        if lines and lines[-1].startswith("{"):
            results: list[dict[str, Any]] = json.loads(lines[-1])["results"]
            for r in results:
                r["config"] = job.peer.name
            return results
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        err = f"rc={proc.returncode}: {tail}"
    except subprocess.TimeoutExpired:
        err = f"timeout after {timeout:.0f} s"
    return [{"workload": s.name, "config": job.peer.name, "error": err} for s in job.specs]


def plan(
    specs: Sequence[WorkloadSpec], peers: Sequence[Peer], rep: int, grouped: bool
) -> list[Job]:
    """Jobs of one repetition, interleaved; the peer order rotates with *rep*."""
    jobs: list[Job] = []
    if grouped:
        order = list(peers)
        k = rep % len(order) if order else 0
        for peer in order[k:] + order[:k]:
            mine = [s for s in specs if peer.applies(s)]
            if mine:
                jobs.append(Job(peer, mine))
        return jobs
    for spec in specs:
        order = [p for p in peers if p.applies(spec)]
        if not order:
            continue
        k = rep % len(order)
        jobs.extend(Job(p, [spec]) for p in order[k:] + order[:k])
    return jobs


# --------------------------------------------------------------------------------------------
# summarising


def summarise(
    specs: Sequence[WorkloadSpec], raw: list[dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Medians per (workload, peer) plus verification and errors."""
    out: dict[str, dict[str, Any]] = {}
    for spec in specs:
        peers: dict[str, Any] = {}
        for rec in raw:
            if rec["workload"] != spec.name:
                continue
            peers.setdefault(rec["config"], []).append(rec)
        summary: dict[str, Any] = {}
        for name, recs in peers.items():
            ok = [r for r in recs if "error" not in r]
            s: dict[str, Any] = {
                "runs": len(recs),
                "errors": [r["error"] for r in recs if "error" in r],
            }
            if ok and "ops_per_s" in ok[0]:
                ops = [r["ops_per_s"] for r in ok]
                med = statistics.median(ops)
                s.update(
                    ops_per_s=med,
                    us_per_op=1e6 / med,
                    ops_per_s_all=ops,
                    spread=(max(ops) - min(ops)) / med if med else 0.0,
                    verified=all(r.get("verified") for r in ok),
                    digests=sorted({r.get("digest", "") for r in ok}),
                    body_us=statistics.median(r.get("body_us", 0.0) for r in ok),
                )
            elif ok:
                keys = [k for k, v in ok[0].items() if isinstance(v, int | float)]
                s.update({k: statistics.median(r[k] for r in ok if k in r) for k in keys})
            summary[name] = s
        out[spec.name] = {"spec": spec.to_json(), "peers": summary}
    return out


def ratios(summary: dict[str, dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """``ratios[workload][aio_config][peer]`` = aioengine ops/s divided by the peer's ops/s."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for wname, w in summary.items():
        peers = {k: v["ops_per_s"] for k, v in w["peers"].items() if "ops_per_s" in v}
        table: dict[str, dict[str, float]] = {}
        for aio, aio_ops in peers.items():
            if not aio.startswith("aio-"):
                continue
            table[aio] = {p: aio_ops / ops for p, ops in peers.items() if p != aio and ops > 0}
        if table:
            out[wname] = table
    return out


def evaluate_targets(summary: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Measured ratio (worst workload) for each target and loop variant; informational."""
    rows: list[dict[str, Any]] = []
    for t in TARGETS:
        for suffix in ("", "-uvloop") if t.loop_variants else ("",):
            aio = t.aio + suffix
            per_workload: dict[str, float] = {}
            used: dict[str, str] = {}
            for wname, w in summary.items():
                if not wname.startswith(t.prefix):
                    continue
                peers = w["peers"]
                if "ops_per_s" not in peers.get(aio, {}):
                    continue
                cands = []
                for p in t.peers:
                    name = p + suffix if (p + suffix) in peers else p
                    if "ops_per_s" in peers.get(name, {}):
                        cands.append((peers[name]["ops_per_s"], name))
                if not cands:
                    continue
                best_ops, best_name = max(cands)
                per_workload[wname] = peers[aio]["ops_per_s"] / best_ops
                used[wname] = best_name
            if not per_workload:
                continue
            worst = min(per_workload, key=per_workload.__getitem__)
            ratio = per_workload[worst]
            rows.append(
                {
                    "target": t.label,
                    "aio": aio,
                    "min_ratio": t.min_ratio,
                    "ratio": ratio,
                    "worst_workload": worst,
                    "vs": used[worst],
                    "per_workload": per_workload,
                    "met": None if t.informational else ratio >= t.min_ratio,
                }
            )
    mem = summary.get("memory/pending", {}).get("peers", {}).get("aio-mem", {})
    if "pending_bytes_per_op" in mem:
        v = mem["pending_bytes_per_op"]
        rows.append(
            {
                "target": f"pending op <= {PENDING_LIMIT_BYTES} B",
                "aio": "aio-mem",
                "value": v,
                "limit": PENDING_LIMIT_BYTES,
                "met": v <= PENDING_LIMIT_BYTES,
            }
        )
    mem = summary.get("memory/rss", {}).get("peers", {}).get("aio-mem", {})
    if "rss_growth_mib" in mem:
        v = mem["rss_growth_mib"]
        n_ops = int(mem.get("rss_ops", 0))
        rows.append(
            {
                "target": f"RSS growth after {n_ops:,} ops <= {RSS_LIMIT_MIB:g} MiB",
                "aio": "aio-mem",
                "value": v,
                "limit": RSS_LIMIT_MIB,
                "met": v <= RSS_LIMIT_MIB,
            }
        )
    return rows


def _fmt_ops(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def print_report(
    specs: Sequence[WorkloadSpec],
    summary: dict[str, dict[str, Any]],
    rat: dict[str, dict[str, dict[str, float]]],
    targets: list[dict[str, Any]],
) -> None:
    """Print the per-workload tables, the memory figures and the targets."""
    print()
    print(
        "ratio columns = aioengine config ops/s / row peer ops/s (>1: aioengine faster); "
        + ", ".join(f"{v}={k}" for k, v in AIO_LABELS.items())
    )
    for spec in specs:
        w = summary.get(spec.name)
        if not w or "memory" in spec.tags:
            continue
        peers = w["peers"]
        aios = [a for a in AIO_LABELS if a in rat.get(spec.name, {})]
        n_vars = f", {spec.n_vars} vars" if spec.n_vars else ""
        print(
            f"\n== {spec.name}  ({spec.n_ops:,} ops, shape {spec.shape}, body {spec.body}{n_vars})"
        )
        if spec.body in ("sleep", "cpu", "numpy"):
            own = [v["body_us"] for k, v in peers.items() if "body_us" in v and "mxnet" not in k]
            mx = [v["body_us"] for k, v in peers.items() if "body_us" in v and "mxnet" in k]
            text = f"   body alone, serially: {statistics.median(own):.0f} us" if own else ""
            if mx:
                text += f" (MXNet venv: {statistics.median(mx):.0f} us)"
            if text:
                print(text)
        head = f"  {'peer':<22}{'ops/s':>11}{'us/op':>10}{'spread':>8}  ok "
        print(head + "".join(f"{AIO_LABELS[a]:>9}" for a in aios))
        for name, s in sorted(peers.items(), key=lambda kv: -kv[1].get("ops_per_s", -1.0)):
            if "ops_per_s" not in s:
                print(f"  {name:<22}  ERROR {'; '.join(s['errors'])[:90]}")
                continue
            ok = "yes" if s["verified"] else "NO!"
            line = (
                f"  {name:<22}{_fmt_ops(s['ops_per_s']):>11}{s['us_per_op']:>10.2f}"
                f"{s['spread'] * 100:>7.0f}%  {ok}"
            )
            for a in aios:
                r = rat[spec.name][a].get(name)
                line += f"{'-':>9}" if r is None else f"{r:>8.2f}x"
            if s["errors"]:
                line += f"  ({len(s['errors'])} failed runs)"
            print(line)
    mems = [summary[s.name]["peers"].get("aio-mem") for s in specs if "memory" in s.tags]
    mems = [m for m in mems if m]
    if mems:
        print("\n== memory (aioengine)")
        for m in mems:
            if m.get("errors"):
                print("  ERROR", "; ".join(m["errors"])[:100])
            if "pending_bytes_per_op" in m:
                chain, fan = m["pending_bytes_per_op_chain"], m["pending_bytes_per_op_fanout"]
                print(
                    f"  pending ops: {chain:.0f} B/op (all write one var), "
                    f"{fan:.0f} B/op (read a gate var, write 1 of 100)"
                )
            if "rss_growth_mib" in m:
                print(
                    f"  RSS over {int(m['rss_ops']):,} ops: start {m['rss_start_mib']:.1f} MiB, "
                    f"peak {m['rss_peak_mib']:.1f}, end {m['rss_end_mib']:.1f} "
                    f"(growth {m['rss_growth_mib']:+.1f} MiB, {m['rss_us_per_op']:.2f} us/op)"
                )
    if targets:
        print("\n== targets (ratios of medians; informational, never asserted)")
        for t in targets:
            mark = "info" if t["met"] is None else "met " if t["met"] else "MISS"
            if "ratio" in t:
                need = "" if t["met"] is None else f"need {t['min_ratio']:.2f}; "
                print(
                    f"  [{mark}] {t['target']:<48} {t['aio']:<20} {t['ratio']:>6.2f}x "
                    f"({need}worst {t['worst_workload']} vs {t['vs']})"
                )
            else:
                print(f"  [{mark}] {t['target']:<48} {t['aio']:<20} {t['value']:>8.1f}")


def plot(summary: dict[str, dict[str, Any]], path: Path, title: str) -> str | None:
    """Write a PNG with one panel per workload (µs/op per peer, log scale); return an error."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
        from matplotlib.ticker import FuncFormatter, NullFormatter
    except ImportError as exc:
        return f"chart skipped: {exc}"
    panels = [
        (name, w)
        for name, w in summary.items()
        if any("us_per_op" in s for s in w["peers"].values())
    ]
    if not panels:
        return "chart skipped: no throughput results"
    colors = {"aio": "#d62728", "mxnet": "#1f77b4", "dask": "#2ca02c", "floor": "#7f7f7f"}
    cols = 4
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.4 * rows), squeeze=False)
    for ax, (name, w) in zip(axes.flat, panels, strict=False):
        items = sorted(
            ((p, s["us_per_op"]) for p, s in w["peers"].items() if "us_per_op" in s),
            key=lambda kv: kv[1],
        )
        labels = [p for p, _ in items]
        vals = [v for _, v in items]
        fam = [next((q.family for q in PEERS if q.name == p), "floor") for p in labels]
        ax.barh(labels, vals, color=[colors.get(f, "#999999") for f in fam])
        ax.set_xscale("log")
        ax.set_xlim(min(vals) / 1.6, max(vals) * 2.2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        for y, v in enumerate(vals):
            ax.text(v * 1.05, y, f"{v:.3g}", va="center", fontsize=6)
        ax.invert_yaxis()
        ax.set_title(f"{name} ({w['spec']['n_ops']:,} ops)", fontsize=9)
        ax.set_xlabel("µs per op (median, lower is better)", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    names = {"aio": "aioengine", "mxnet": "MXNet 1.9.1", "dask": "dask", "floor": "asyncio floor"}
    handles = [Patch(color=c, label=names[f]) for f, c in colors.items()]
    fig.legend(handles=handles, loc="upper right", ncols=4, fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=10, x=0.02, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return None


# --------------------------------------------------------------------------------------------
# main


def _loadavg() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line options."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke mode: small sizes, 1 repetition")
    ap.add_argument("--reps", type=int, help="repetitions (default 3, quick 1)")
    ap.add_argument("--only", help="comma-separated workload name substrings (e.g. noop/,coro)")
    ap.add_argument("--peers", help="comma-separated peer name prefixes (e.g. aio-,mxnet-naive)")
    ap.add_argument("--no-memory", action="store_true", help="skip the memory benchmarks")
    ap.add_argument("--no-mxnet", action="store_true", help="skip the MXNet peers")
    ap.add_argument("--no-install", action="store_true", help="never create the MXNet venv")
    ap.add_argument("--retry-install", action="store_true", help="retry a failed MXNet install")
    ap.add_argument("--mxnet-venv", type=Path, default=ROOT / ".venv-mxnet")
    ap.add_argument(
        "--grouped",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="one process per peer for all its workloads (default in --quick) instead of one per"
        " measurement",
    )
    ap.add_argument("--timeout", type=float, help="seconds per runner process")
    ap.add_argument(
        "--out", type=Path, help="JSON output path (results/latest.json; --quick: results/quick/)"
    )
    ap.add_argument(
        "--png", type=Path, help="chart output path (results/latest.png; --quick: results/quick/)"
    )
    ap.add_argument("--list", action="store_true", help="list workloads and peers, then exit")
    args = ap.parse_args(argv)
    folder = QUICK_RESULTS if args.quick else RESULTS
    args.out = args.out or folder / "latest.json"
    args.png = args.png or folder / "latest.png"
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; return the process exit status."""
    args = parse_args(argv)
    quick: bool = args.quick
    reps: int = args.reps or (1 if quick else 3)
    grouped: bool = quick if args.grouped is None else args.grouped
    timeout: float = args.timeout or (120.0 if quick else 900.0)
    specs = select(standard_workloads(quick), args.only)
    mem_specs = [] if args.no_memory else select(memory_workloads(quick), args.only)
    peers = [
        p
        for p in PEERS
        if not args.peers or any(p.name.startswith(x) for x in args.peers.split(","))
    ]

    if args.list:
        for s in specs + mem_specs:
            names = [p.name for p in peers if p.applies(s)]
            head = f"{s.name:<22} {s.n_ops:>9,} ops  shape={s.shape:<11} body={s.body:<6}"
            print(head, " ".join(names))
        return 0

    t_start = time.perf_counter()
    load_start = _loadavg()
    env = Env()
    problems = selftest()
    if problems:
        print("[error] the verification self-test failed:", *problems, sep="\n  ")
        return 1
    probe_main(env)
    if args.no_mxnet:
        env.skipped.add("mxnet")
        env.notes.append("MXNet skipped (--no-mxnet)")
    elif any(p.family == "mxnet" for p in peers):
        env.mxnet_python, note = ensure_mxnet(
            args.mxnet_venv, not args.no_install, args.retry_install
        )
        env.notes.append(note)
        if env.mxnet_python is None:
            env.skipped.add("mxnet")
    peers = [p for p in peers if p.family not in env.skipped and p.name not in env.skipped]
    if load_start > 0.5 * N_CPU:
        env.notes.append(
            f"machine busy before the run (1-min load average {load_start:.1f} on {N_CPU} CPUs):"
            " timings are unreliable"
        )
    for note in env.notes:
        print(f"[note] {note}")
    setup_s = time.perf_counter() - t_start

    raw: list[dict[str, Any]] = []
    t_run = time.perf_counter()
    for rep in range(reps):
        jobs = plan(specs, peers, rep, grouped)
        for j, job in enumerate(jobs):
            what = (
                ",".join(s.name for s in job.specs)
                if len(job.specs) < 3
                else f"{len(job.specs)} workloads"
            )
            print(
                f"[rep {rep + 1}/{reps} {j + 1:>3}/{len(jobs)}] {job.peer.name:<22} {what}",
                flush=True,
            )
            raw.extend(run_job(job, env, timeout))
    for job in plan(mem_specs, peers, 0, grouped):
        print(f"[memory] {job.peer.name} {','.join(s.name for s in job.specs)}", flush=True)
        raw.extend(run_job(job, env, timeout))
    run_s = time.perf_counter() - t_run
    load_end = _loadavg()
    # Our own runners keep about one CPU busy (two for the threaded peers); much more than that
    # means something else competed for the CPUs.
    if load_end > N_CPU + 1:
        env.notes.append(
            f"1-min load average {load_end:.1f} at the end of the run on {N_CPU} CPUs: other"
            " processes probably competed for the CPUs; compare spreads before trusting ratios"
        )

    all_specs = specs + mem_specs
    summary = summarise(all_specs, raw)
    rat = ratios(summary)
    targets = evaluate_targets(summary)
    print_report(all_specs, summary, rat, targets)

    bad_verify = [
        (w, p)
        for w, s in summary.items()
        for p, v in s["peers"].items()
        if v.get("verified") is False
    ]
    errors = [(r["workload"], r["config"], r["error"]) for r in raw if "error" in r]
    digests = {
        w: {d for v in s["peers"].values() for d in v.get("digests", [])}
        for w, s in summary.items()
    }
    mismatched = [w for w, d in digests.items() if len(d) > 1]

    meta = {
        "mode": "quick" if quick else "full",
        "reps": reps,
        "grouped": grouped,
        "cpu_count": N_CPU,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "versions": env.versions,
        "mxnet_python": env.mxnet_python,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "setup_s": setup_s,
        "run_s": run_s,
        "loadavg_start": load_start,
        "loadavg_end": load_end,
    }
    doc = {
        "meta": meta,
        "notes": env.notes,
        "workloads": summary,
        "ratios": rat,
        "targets": targets,
        "raw": raw,
        "errors": errors,
        "verification_failures": bad_verify,
        "digest_mismatches": mismatched,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1, sort_keys=False))
    title = f"aioengine benchmarks ({meta['mode']}, {reps} reps, {N_CPU} CPUs, {meta['date']})"
    chart_err = plot(summary, args.png, title)
    print()
    for note in env.notes:
        print(f"[note] {note}")
    if chart_err:
        print(f"[note] {chart_err}")
    print(f"wrote {args.out}" + ("" if chart_err else f" and {args.png}"))
    print(f"setup {setup_s:.1f} s, measurements {run_s:.1f} s")
    status = 0
    if errors:
        print(f"[error] {len(errors)} failed runs, e.g. {errors[0]}")
        status = 1
    if bad_verify:
        print(f"[error] verification failed (wrong order) for {bad_verify}")
        status = 1
    if mismatched:
        print(f"[error] peers ran different programs for {mismatched}")
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
