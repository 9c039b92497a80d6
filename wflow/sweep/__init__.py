r"""Parameter sweeps: a configuration and a grid over its keys, run on Dask, recorded in one Zarr store.

A sweep is many driver runs (:func:`wflow.simulate`) scheduled by ``dask.distributed``; points
that differ only in ``init.seed`` run as one batched call of at most ``batch_size`` systems.
The store's dimensions are the grid's keys (by their last part: ``beta``, ``seed``) and ``time``;
each finished task is written by the client (the only writer) and committed atomically in
``wflow_sweep.json``, so a sweep run again skips every committed point.  docs/sweeps.md describes
the store's variables, the commit protocol and running on a cluster.

This module holds :func:`sweep` and re-exports the public names of its parts:
:mod:`~wflow.sweep.grid` (grid values, ``--grid`` arguments, TOML ``[sweep]`` tables),
:mod:`~wflow.sweep.plan` (axes, observables, tasks and the store's layout, checked before
anything is written), :mod:`~wflow.sweep.tasks` (one task on a worker),
:mod:`~wflow.sweep.store` (the Zarr store and its commits) and :mod:`~wflow.sweep.cluster`
(the Dask cluster and the loop that submits tasks and writes their results).
"""

from __future__ import annotations

import logging
import math
import os
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import short_repr
from ..io import FolderLock
from .cluster import SchedulerError, connect, cores, disconnect, run_tasks
from .grid import (
    coerce_value,
    load_sweep_config,
    parse_grid,
    parse_grid_arg,
    parse_grid_args,
    parse_values,
)
from .plan import DEFAULT_OBSERVABLES, KIND_OBSERVABLES, OBSERVABLES, make_plan
from .store import COMMIT, Store, open_sweep, point_config, store_is_complete
from .tasks import WORKER_ENV, run_task

log = logging.getLogger(__name__)

__all__ = [
    "sweep",
    "parse_grid",
    "parse_grid_arg",
    "parse_grid_args",
    "parse_values",
    "load_sweep_config",
    "coerce_value",
    "open_sweep",
    "point_config",
    "SchedulerError",
    "OBSERVABLES",
    "DEFAULT_OBSERVABLES",
    "KIND_OBSERVABLES",
    "WORKER_ENV",
    "COMMIT",
    "connect",
    "disconnect",
    "cores",
    "run_task",
]


def sweep(
    config: Mapping[str, Any] | str | os.PathLike,
    grid: Mapping[str, Any] | None = None,
    *,
    out: str | os.PathLike,
    scheduler: Any = None,
    workers: int | None = None,
    observables: Sequence[str] | Mapping[str, Callable | None] | None = None,
    resume: bool = True,
    overwrite: bool = False,
    batch_size: int | None = None,
    threads_per_task: int = 1,
    retries: int = 1,
    progress: bool = True,
    timeout: float = 10.0,
):
    r"""Run a configuration over a grid of its keys on Dask and record the observables in one Zarr store.

    Parameters
    ----------
    config : dict or path
        The base configuration: a flat dict of :data:`wflow.config.KEYS` (missing keys take
        their defaults), or a TOML file, whose ``[sweep]`` table may hold the grid.
    grid : dict, optional
        ``key -> values`` over configuration keys: a list, or ``"linspace(a, b, n)"``,
        ``"logspace(a, b, n)"``, ``"range(n)"``, ``"range(a, b)"`` (:func:`parse_values`);
        added to (and overriding) the TOML's ``[sweep]`` table.  Values of ``init.seed`` run
        as one batched call per ``batch_size`` seeds.
    out : path
        The store (a folder, conventionally ``*.zarr``).
    scheduler : str, distributed.Client or cluster, optional
        ``None``: a ``LocalCluster`` of ``workers`` processes with one thread each (numba,
        BLAS and OpenMP limited to one thread, :data:`~wflow.sweep.tasks.WORKER_ENV`);
        ``"tcp://host:port"``: a running scheduler (docs: sweeps); a ``Client`` or a cluster
        object (dask-jobqueue).
    workers : int, optional
        Worker processes of the LocalCluster (default: the usable cores over ``threads_per_task``).
    observables : sequence of str or dict, optional
        Recorded at every save time, one number per system: names from
        :data:`~wflow.sweep.plan.OBSERVABLES` and/or ``name -> f(mu)`` (an
        :class:`~wflow.measure.Atoms` with a batch axis -> array, shape ``(systems,)``); default
        :data:`~wflow.sweep.plan.DEFAULT_OBSERVABLES`.  For the continuum problems (``problem`` =
        ``eulerian``, ``lagrangian``, ``zonal``, ``jko``: one run per point) the names of
        :data:`~wflow.sweep.plan.KIND_OBSERVABLES` (the scalars their snapshots hold; all of them
        by default) and/or ``name -> f(snapshot)`` (the save's
        :class:`~wflow.solvers.base.Snapshot`: ``snapshot.data[name] = (dims, array)``, e.g. the
        cell densities ``snapshot.data["density"][1]`` of ``eulerian``) -> one number.  States are
        not stored.
    resume : bool
        Continue a store of the same sweep, skipping its committed points (default).  Points are
        matched by their coordinates: the grid's axes and values may come in any order.  A grid
        with other values or axes is refused, naming the difference.
    overwrite : bool
        Replace an existing sweep store: what wflow wrote in it is removed; a file or folder of
        anyone else's in it is refused, naming it, and nothing is touched.
    batch_size : int, optional
        Seeds per task (default: as many as keep a task's state near 64 MB).
    threads_per_task : int
        numba/BLAS threads of a task (1: parallelism comes from workers).
    retries : int
        Dask retries of a task whose worker raised (a killed worker's task is always rerun).
    progress : bool
        A progress bar over points (and the dashboard's address when there is one).
    timeout : float
        Seconds to wait for a scheduler at ``scheduler``.

    Returns
    -------
    xarray.Dataset
        The store, opened lazily (:func:`open_sweep`).

    Raises
    ------
    ValueError
        Before anything is written: an unknown key, an empty grid, a value of the wrong type,
        an invalid combination (naming the point), a store holding a different sweep, a
        scheduler that does not answer (:class:`SchedulerError`).

    Examples
    --------
    >>> import tempfile, pathlib
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "s.zarr"
    >>> cfg = {"init.n": 8, "init.d": 3, "run.t_end": 1.0, "save.n": 3, "run.method": "euler",
    ...        "run.dt": 0.1}
    >>> ds = sweep(cfg, {"model.beta": [1, 4]}, out=out, workers=1, progress=False,
    ...            observables=["order_parameter"])  # doctest: +SKIP
    >>> ds.order_parameter.sel(beta=4.0).shape  # doctest: +SKIP
    (3,)
    """
    plan = make_plan(config, grid, observables, batch_size)
    if (
        isinstance(threads_per_task, bool)
        or not isinstance(threads_per_task, int)
        or threads_per_task < 1
    ):
        raise ValueError(
            f"threads_per_task must be an integer >= 1, got {short_repr(threads_per_task)}"
        )
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries must be an integer >= 0, got {short_repr(retries)}")
    out = Path(out)
    checked = Store(out, plan)
    what = checked.check(resume, overwrite)  # another sweep's store: before any cluster
    # resuming: the store's order of axes and values (points are matched by their coordinates)
    plan = checked.plan
    if what == "resume" and store_is_complete(out, plan):  # nothing to do: no cluster to start
        log.info("%s: every point is committed", out)
        return open_sweep(out)
    _check_disk(plan, out)
    # before anything is written
    client, cluster, owned = connect(scheduler, workers, timeout, threads_per_task)
    lock = None
    try:
        lock = FolderLock(out.with_name(out.name + ".lock"), f"sweep store {out}").acquire()
        store = Store(out, plan)
        store.open(resume, overwrite)
        todo = [t for t in range(plan.n_tasks) if t not in store.done]
        run_tasks(client, plan, store, todo, threads_per_task, retries, progress)
    finally:
        disconnect(client, cluster, owned)
        if lock is not None:
            lock.release()
    return open_sweep(out)


def _check_disk(plan, out: Path) -> None:
    """Refuse a grid whose store would not fit on the disk (estimated before anything starts)."""
    import shutil

    need = plan.store_bytes()
    probe = out if out.exists() else out.parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        usage = shutil.disk_usage(probe)
    except OSError:
        return  # the store's creation reports what fails
    if usage.total and need > usage.free:
        points = math.prod(plan.shape)
        raise ValueError(
            f"the grid has {points:.3g} points x {plan.n_time} saves x {len(plan.observables)} "
            f"observables: its store needs about {need / 2**30:.3g} GiB, and {usage.free / 2**30:.3g} "
            f"GiB is free under {probe}; sweep fewer points or saves (save.n), or fewer observables"
        )


class _CallableModule(types.ModuleType):
    """``wflow.sweep(...)`` calls :func:`sweep` while ``wflow.sweep.parse_grid`` and the rest stay reachable."""

    def __call__(self, *args, **kwargs):
        return sweep(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
