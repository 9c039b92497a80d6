"""Saving, loading and resuming results of every kind: the same three functions for all solvers.

:func:`save` writes a :class:`~wflow.solvers.base.Result` to a Zarr store, :func:`load`
reads any wflow store back into the result class of its kind, and :func:`resume`
continues an interrupted run from its last committed snapshot through the same driver,
bit for bit equal to the uninterrupted run.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .. import io
from ..errors import WflowError
from .base import KINDS, Result, ResumeState, Tracker, integrate
from .trackers import ProgressBar

__all__ = ["save", "load", "resume"]

log = logging.getLogger(__name__)


def _result(stored: dict[str, Any]) -> Result:
    kind = stored["kind"]
    if kind not in KINDS:
        raise WflowError(f"unknown result kind {kind!r} (known: {sorted(KINDS)})")
    cfg = stored["config"]
    ckpt = {k: (d, a[-1]) for k, (d, a) in stored["checkpoint"].items()}
    return KINDS[kind].result_class(
        kind=kind,
        times=stored["times"],
        data=stored["data"],
        static=stored["static"],
        stats=stored["stats"],
        status=0,
        message=f"loaded {stored['length']} snapshots",
        config=cfg,
        solver=stored["solver"],
        order=cfg.get("order", 0),
        checkpoint=ckpt,
    )


def load(path: str | os.PathLike, *, recover: bool = False) -> Result:
    """Load a result of any kind written by a run or by :func:`save` (committed snapshots only, verified).

    A damaged store raises :class:`~wflow.errors.WflowError` naming the variable and the snapshot; with
    ``recover=True`` the sound snapshots before the first damaged one are returned instead, with a
    warning (:func:`wflow.io.repair` makes them the store's committed snapshots).

    Examples
    --------
    >>> import wflow, tempfile, pathlib
    >>> traj = wflow.simulate(wflow.SA(2.0), wflow.sphere.uniform(8, 3, seed=0), 0.5, dt=0.1)
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "t.zarr"
    >>> _ = wflow.save(traj, path)
    >>> back = wflow.load(path)
    >>> bool((back.points == traj.points).all()), type(back).__name__
    (True, 'Trajectory')
    """
    stored = io.read_store(path, recover=recover)
    res = _result(stored)
    report = stored.get("recovered")
    if report is not None and report["claimed"] != report["kept"]:
        res.message = (
            f"recovered {report['kept']} snapshots (the commit record claims {report['claimed']}, "
            f"{report['on_disk']} on disk): {report['reason']}"
        )
        warnings.warn(f"{path}: {res.message}", stacklevel=2)
    return res


def save(result: Result, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Write a result of any kind to a Zarr store that :func:`load` reads back exactly.

    Examples
    --------
    >>> import wflow, tempfile, pathlib
    >>> traj = wflow.simulate(wflow.SA(2.0), wflow.sphere.uniform(8, 3, seed=0), 0.5, dt=0.1, backend="numpy")
    >>> path = wflow.save(traj, pathlib.Path(tempfile.mkdtemp()) / "t.zarr")
    >>> path.name, bool((wflow.load(path).points == traj.points).all())
    ('t.zarr', True)
    """
    if not isinstance(result, Result):
        raise TypeError(
            f"save expects a wflow result (Trajectory, DensityTrajectory, ...), got {type(result).__name__}"
        )
    return io.write_result(result, path, overwrite=overwrite)


def resume(
    path: str | os.PathLike,
    *,
    progress: bool = False,
    backend: str | None = None,
    trackers: Sequence[Tracker] = (),
    keep: bool = True,
) -> Result:
    """Continue an interrupted run of any kind from its last committed snapshot.

    The run repeats exactly what the uninterrupted run would have done.  Returns the whole result, old
    and new snapshots; a complete store is returned as loaded.

    Parameters
    ----------
    path : str or Path
        The store.
    progress : bool
        Show a progress bar.
    backend : str, optional
        Kernel-sum backend for the continuation (default the stored one, the only one bit for bit).
    trackers : sequence of Tracker
        Further trackers for the continuation.
    keep : bool
        Hold the continued snapshots in memory.

    Examples
    --------
    >>> import wflow, tempfile, pathlib
    >>> from wflow.io import ZarrRecorder
    >>> x0, path = wflow.sphere.uniform(8, 3, seed=0), pathlib.Path(tempfile.mkdtemp()) / "t.zarr"
    >>> stop = lambda t, mu: t >= 0.4  # stops the run after the save at t = 0.4
    >>> cut = wflow.simulate(wflow.SA(2.0), x0, 1.0, dt=0.1, backend="numpy", trackers=[ZarrRecorder(path), stop])
    >>> cut.status, len(cut)
    (1, 5)
    >>> back = wflow.resume(path)
    >>> full = wflow.simulate(wflow.SA(2.0), x0, 1.0, dt=0.1, backend="numpy")
    >>> len(back), bool((back.points == full.points).all())  # as if never interrupted
    (11, True)
    """
    stored = io.read_store(path)
    cfg = dict(stored["config"])
    if backend is not None:
        cfg["backend"] = backend
    all_times = np.asarray(cfg["save_at"], dtype=np.float64)
    done = stored["length"]
    prev = _result(stored)
    if done >= len(all_times):
        log.info("%s is complete (%d snapshots)", path, done)
        return prev
    if not np.array_equal(prev.times, all_times[:done]):
        raise WflowError(f"{path}: saved times do not match the configured save_at; cannot resume")
    kind = KINDS[stored["kind"]]

    problem, solver, y = kind.rebuild(cfg, stored)
    state = ResumeState(
        index=done - 1,
        t=float(prev.times[-1]),
        y=y,
        stats={k: int(prev.stats[k][-1]) for k in ("steps", "rejected", "evaluations")},
        dt_next=float(np.nan_to_num(prev.stats["dt_next"][-1])),
        checkpoint={k: a for k, (_, a) in prev.checkpoint.items()},
    )
    # ZarrRecorder is a Tracker by duck type: wflow.io sits below wflow.solvers
    trs: list[Any] = [io.ZarrRecorder(path, append=True), *trackers]
    if progress:
        trs.append(ProgressBar(f"{solver.name} (resumed)"))
    extra = {k: v for k, v in cfg.items() if k not in _DRIVER_KEYS}
    new = integrate(
        problem,
        solver,
        y,
        cfg["t0"],
        cfg["t_end"],
        save_at=all_times,
        dt=cfg["dt"],
        rtol=cfg["rtol"],
        atol=cfg["atol"],
        adaptive=cfg["adaptive"],
        max_steps=cfg["max_steps"],
        seed=cfg["seed"],
        trackers=trs,
        keep=keep,
        resume=state,
        config=extra,
        result_class=kind.result_class,
    )
    return _concat(prev, new) if keep else new


#: the configuration keys the driver writes itself (:func:`wflow.solvers.driver.integrate`)
_DRIVER_KEYS = set(
    "solver solver_options order adaptive dt rtol atol seed t0 t_end save_at save_mode max_steps "
    "wflow_version".split()
)


def _concat(a: Result, b: Result) -> Result:
    """The stored snapshots followed by those of the continuation (which starts after a's last one)."""
    return dataclasses.replace(
        b,
        times=np.concatenate([a.times, b.times]),
        data={k: (d, np.concatenate([a.data[k][1], v])) for k, (d, v) in b.data.items()},
        stats={k: np.concatenate([a.stats[k], v]) for k, v in b.stats.items()},
    )
