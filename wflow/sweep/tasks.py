"""One task of a sweep, run on a Dask worker: a batched run, its observables, its threads.

:func:`run_task` never raises for a failure of the computation: a failed batch is split to find
the failing systems, and the result carries their status and message.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .plan import BATCH_KEY, DRIVER_DIAGNOSTICS, FAILED

if TYPE_CHECKING:  # (a base for the checker only: importing the solvers takes a second)
    from ..solvers.trackers import Tracker as _TrackerBase
else:
    _TrackerBase = object

__all__ = ["WORKER_ENV", "run_task"]

#: environment of LocalCluster worker processes: one thread each for numba, BLAS and OpenMP (``threads_per_task``)
WORKER_ENV = {
    "NUMBA_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


class _Collect(_TrackerBase):
    """The tracker of a sweep task: keeps the observables of every save, one value per system (no states).

    ``functions``: user observables computed here from the snapshot (continuum solvers; a particle
    run's user functions are the driver's ``extra_diagnostics``)."""

    name = "sweep"

    def __init__(
        self,
        names: Sequence[str],
        systems: int,
        n_time: int,
        functions: Mapping[str, Callable] | None = None,
    ):
        self.values = {k: np.full((systems, n_time), np.nan) for k in names}
        self.times = np.full(n_time, np.nan)
        self.steps = 0
        self.functions = dict(functions or {})

    def start(self, run) -> None:
        return None

    def save(self, snap) -> None:
        self.times[snap.index] = snap.t
        self.steps = int(snap.stats["steps"])
        for name, out in self.values.items():
            if name in self.functions:
                v = np.asarray(self.functions[name](snap), dtype=np.float64).reshape(-1)
            elif name not in snap.data:
                continue  # e.g. the energy of a model that is not a gradient flow
            else:  # a continuum run's scalars: (1,)
                v = np.asarray(snap.data[name][1], dtype=np.float64).reshape(-1)
            if v.shape != out.shape[:1]:
                raise ValueError(
                    f"observable {name!r} must give one number per system, shape ({out.shape[0]},), "
                    f"got shape {v.shape}"
                )
            out[:, snap.index] = v

    def step(self, t, dt, step) -> None:
        return None

    def finish(self, result) -> None:
        return None


_CONTROLLER = None


def _blas_limit(threads: int):
    """BLAS and OpenMP limited to ``threads`` inside a ``with`` block (one library scan per process)."""
    global _CONTROLLER
    from threadpoolctl import ThreadpoolController

    if _CONTROLLER is None:
        _CONTROLLER = ThreadpoolController()
    return _CONTROLLER.limit(limits=threads)


def _limit_threads(threads: int) -> None:
    """numba's threads limited to ``threads`` in this process (a worker).

    A worker may import numba before the nanny sets :data:`WORKER_ENV`, and numba refuses a changed
    ``NUMBA_NUM_THREADS`` once its threads run: before they start its configuration is re-read,
    after, the environment is made to agree with the count they started with."""
    import numba  # here, not at the top: importing wflow.sweep does not import numba

    try:
        from numba.np.ufunc import parallel

        started = getattr(parallel, "_is_initialized", True)  # (unknown: assume started)
    except ImportError:  # pragma: no cover - a numba without that module
        started = True
    # numba.config sets its options as module attributes at run time (reload_config): none in its stubs
    config: Any = numba.config
    if not started:
        config.reload_config()
    elif os.environ.get("NUMBA_NUM_THREADS") != str(config.NUMBA_NUM_THREADS):
        os.environ["NUMBA_NUM_THREADS"] = str(config.NUMBA_NUM_THREADS)
    numba.set_num_threads(max(1, min(threads, config.NUMBA_NUM_THREADS)))


def _worker_name() -> str:
    try:
        from distributed import get_worker

        return str(get_worker().address)
    except Exception:  # noqa: BLE001 - not on a Dask worker
        return f"pid {os.getpid()}"


def run_task(task: dict[str, Any]) -> dict[str, Any]:
    """Run one task of a sweep (on a Dask worker): a batched :func:`wflow.simulate` call, observables only.

    Never raises for a failure of the computation: the result carries ``status`` -1 and the
    message; a failed batch is split to find the failing systems (:func:`_split_failed`).
    """
    t_start, c_start = time.perf_counter(), time.process_time()
    cfg, seeds, names = task["config"], task["seeds"], list(task["observables"])
    systems = 1 if seeds is None else len(seeds)
    particles = cfg["problem"] == "particles"
    coll = _Collect(
        names,
        systems,
        task["n_time"],
        None if particles else {k: f for k, f in task["observables"].items() if f is not None},
    )
    status, message = FAILED, ""
    try:
        _limit_threads(task["threads"])
        with _blas_limit(task["threads"]):
            if not particles:  # a continuum problem: one run, its snapshots' scalars
                from ..config import start_run

                res = start_run(cfg).execute([coll], progress=False)
                return _task_result(task, coll, int(res.status), str(res.message), t_start, c_start)
            obs, n_time = task["observables"], task["n_time"]
            status, message, coll = _simulate_batch(cfg, seeds, obs, n_time)
            if status == FAILED and seeds is not None and len(seeds) > 1:
                status, message, coll = _split_failed(cfg, seeds, obs, n_time)
    except Exception as exc:  # noqa: BLE001 - recorded with the point, the sweep goes on
        message = f"{type(exc).__name__}: {exc}"
    return _task_result(task, coll, status, message, t_start, c_start)


def _split_failed(
    cfg: dict[str, Any], seeds: list[int], observables: Mapping[str, Callable | None], n_time: int
) -> tuple[Any, Any, _Collect]:
    """Seeds whose batched run failed (one system can end the run of all), run again in two halves; a
    failing half beside a sound one is split again, down to single seeds; when both fail, both are
    recorded as failed.  Status and message are arrays, one entry per system."""
    half = len(seeds) // 2
    parts = [
        _simulate_batch(cfg, seeds[:half], observables, n_time),
        _simulate_batch(cfg, seeds[half:], observables, n_time),
    ]
    failed = [p[0] == FAILED for p in parts]
    for k, part in enumerate((seeds[:half], seeds[half:])):
        if failed[k] and not failed[1 - k] and len(part) > 1:
            parts[k] = _split_failed(cfg, part, observables, n_time)
    names = list(observables)
    out = _Collect(names, len(seeds), n_time)
    out.values = {k: np.concatenate([c.values[k] for _, _, c in parts]) for k in names}
    out.times = np.where(np.isnan(parts[0][2].times), parts[1][2].times, parts[0][2].times)
    out.steps = max(c.steps for _, _, c in parts)
    sizes = (half, len(seeds) - half)
    status = np.concatenate([np.broadcast_to(st, (m,)) for (st, _, _), m in zip(parts, sizes)])
    message = np.concatenate(
        [np.broadcast_to(np.array(msg, dtype=object), (m,)) for (_, msg, _), m in zip(parts, sizes)]
    )
    return status, message, out


def _simulate_batch(
    cfg: dict[str, Any],
    seeds: list[int] | None,
    observables: Mapping[str, Callable | None],
    n_time: int,
) -> tuple[int, str, _Collect]:
    """The systems of ``seeds`` stacked into one :func:`wflow.simulate` call (keep=False, the observables only)."""
    from ..config import build_run
    from ..measure import Atoms
    from ..solvers.particles import simulate

    names = list(observables)
    systems = 1 if seeds is None else len(seeds)
    coll = _Collect(names, systems, n_time)
    if seeds is None:
        model, mu0, kwargs = build_run(cfg)
        x = mu0.points[None]
    else:
        x = None
        for i, s in enumerate(seeds):
            model, mu0, kwargs = build_run({**cfg, BATCH_KEY: s})
            if x is None:
                x = np.empty((systems,) + mu0.points.shape, dtype=mu0.points.dtype)
            x[i] = mu0.points
    extra = {k: f for k, f in observables.items() if f is not None}
    diagnostics = tuple(k for k in names if k in DRIVER_DIAGNOSTICS and observables[k] is None)
    # the tracker collects every save's observables; in memory, the last points only
    kwargs["save_at"] = dataclasses.replace(
        kwargs["save_at"], points=False, diagnostics=diagnostics, fn=extra
    )
    res = simulate(model, Atoms(x), cfg["run.t_end"], throw=False, trackers=[coll], **kwargs)
    return int(res.status), str(res.message), coll


def _task_result(
    task, coll: _Collect, status: int, message: str, t_start: float, c_start: float
) -> dict[str, Any]:
    return {
        "task": task["task"],
        "values": coll.values,
        "times": coll.times,
        "steps": coll.steps,
        "status": status,
        "message": message,
        "seconds": time.perf_counter() - t_start,
        "cpu_seconds": time.process_time() - c_start,
        "worker": _worker_name(),
    }
