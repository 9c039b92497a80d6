"""The store of a sweep: one Zarr group, pre-sized, written task by task and committed with :mod:`wflow.io`
into ``wflow_sweep.json`` (the sweep's fingerprint and its finished tasks); read back by :func:`open_sweep`.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .._version import __version__
from ..config import current_config
from ..errors import WflowError
from ..io import chunk_codecs, read_commit, remove_store, write_commit
from ..io.commit import store_files
from .plan import BATCH_KEY, FAILED, FORMAT, OBSERVABLES, OK, PENDING, Axis, Plan, grid_difference

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

__all__ = ["COMMIT", "Store", "open_sweep", "point_config", "store_is_complete"]

#: the commit record of a sweep store: ``{"fingerprint": ..., "done": [finished tasks, sorted]}``
COMMIT = "wflow_sweep.json"
_TIME = "save times (nominal; save_time holds the solver's step times)"
_CONFIG = f"flat configuration (JSON); a point's own has {BATCH_KEY} = its seed coordinate"


def _per_point(value: Any, shape: tuple[int, ...], dtype) -> np.ndarray:
    """A task's status or message over its region: one value for all its points, or one per system (a
    batch run again in parts, :func:`wflow.sweep.tasks.run_task`), laid along the region's seed axis."""
    v = np.asarray(value, dtype=dtype)
    return np.full(shape, v, dtype=dtype) if v.ndim == 0 else v.reshape(shape)


def _decode(record: Any) -> tuple[str | None, set[int]]:
    return record["fingerprint"], set(int(i) for i in record["done"])


def _committed(path: Path) -> tuple[str | None, set[int]]:
    """``(fingerprint, finished tasks)`` of the store's commit record; ``(None, set())`` when there is none."""
    return read_commit(path, _decode, name=COMMIT, default=(None, set()))


def _commit(path: Path, fingerprint: str, done: set[int]) -> None:
    """Commit the finished tasks ``done`` (atomically: :func:`wflow.io.write_commit`)."""
    write_commit(path, {"fingerprint": fingerprint, "done": sorted(done)}, name=COMMIT)


def _attrs(path: Path) -> dict[str, Any]:
    """The attributes of the Zarr group at ``path``; ``{}`` where there is none."""
    import zarr

    try:
        return dict(zarr.open_group(path, mode="r").attrs)
    except Exception:  # noqa: BLE001 - not a Zarr group: the caller says so
        return {}


def _difference(attrs: dict[str, Any], plan: Plan) -> str | None:
    """How ``plan``'s sweep differs from the one whose store has ``attrs``, in one phrase (None: the
    same grid points, configuration, observables and batch size)."""
    diff = grid_difference(json.loads(attrs["grid"]), plan.axes)
    if diff is not None:
        return diff
    # a store of an earlier release compares under its keys' names now
    base = current_config(json.loads(attrs["base_config"]))
    for key in sorted(set(base) | set(plan.base)):
        if base.get(key) != plan.base.get(key):
            return f"config {key}: the store has {base.get(key)!r}, given {plan.base.get(key)!r}"
    if set(attrs["observables"]) != set(plan.observables):
        return f"observables: the store has {attrs['observables']}, given {list(plan.observables)}"
    if attrs.get("batch_size") != plan.batch_size:
        return f"batch size: the store has {attrs.get('batch_size')}, given {plan.batch_size}"
    return None


class Store:
    """The sweep's Zarr group: created pre-sized, written task by task, each task committed atomically."""

    def __init__(self, path: Path, plan: Plan):
        self.path, self.plan = path, plan
        self.done: set[int] = set()
        self.arrays: dict[str, Any] = {}
        self._pool: ThreadPoolExecutor | None = None

    def check(self, resume: bool, overwrite: bool) -> str:
        """What opening the store will do (``"create"``, ``"replace"`` or ``"resume"``); errors change nothing.

        Resuming, the plan takes the store's layout (:meth:`~wflow.sweep.plan.Plan.in_layout`): points are
        matched by their coordinates, whatever the order in which the grid's axes and values were given.
        """
        p = self.path
        if not p.exists() and not p.is_symlink():
            return "create"
        if p.is_symlink():
            raise ValueError(
                f"{p} is a symbolic link; give the sweep store's own path (or another out)"
            )
        attrs = _attrs(p)
        ours = attrs.get("wflow_format") == FORMAT
        if overwrite:
            # only an empty folder or our own store
            if not ours and not (p.is_dir() and not any(p.iterdir())):
                raise ValueError(
                    f"{p} exists and is not a wflow sweep store; refusing to overwrite it"
                )
            if ours:
                store_files(p, (COMMIT,))  # anything else in it: refused, nothing touched
            return "replace"
        if not ours:
            raise ValueError(f"{p} exists and is not a wflow sweep store; choose another out")
        diff = _difference(attrs, self.plan)
        if diff is None:
            self.plan = self.plan.in_layout(json.loads(attrs["grid"]))
        if diff is not None or attrs.get("fingerprint") != self.plan.fingerprint:
            raise ValueError(
                f"{p} holds a different sweep: {diff or 'other observable functions'}; choose another "
                f"out, or pass overwrite=True (--overwrite) to replace it"
            )
        if not resume:
            raise FileExistsError(
                f"{p} holds this sweep already; pass resume=True to finish it or overwrite=True "
                f"(--overwrite) to start afresh"
            )
        fp, _ = _committed(p)
        if fp not in (None, self.plan.fingerprint):
            raise ValueError(
                f"{p}: its commit record belongs to a different sweep; the store is damaged"
            )
        return "resume"

    def open(self, resume: bool, overwrite: bool) -> None:
        import zarr

        what = self.check(resume, overwrite)
        if what == "resume":
            _, self.done = _committed(self.path)
            group = zarr.open_group(self.path, mode="r+")
            self.arrays = {
                k: a.with_config({"write_empty_chunks": True}) for k, a in group.arrays()
            }
            return
        if what == "replace":
            remove_store(self.path, (COMMIT,))  # only what wflow wrote
        self._create()

    def _create(self) -> None:
        import zarr

        plan = self.plan
        codecs = chunk_codecs()
        attrs: dict[str, Any] = {  # (JSON values: the group's attributes)
            "wflow_format": FORMAT,
            "wflow_version": __version__,
            "fingerprint": plan.fingerprint,
            "base_config": json.dumps(plan.base),
            "grid": json.dumps({a.key: a.values for a in plan.axes}),
            "dims": json.dumps({a.key: a.dim for a in plan.axes}),
            "observables": list(plan.observables),
            "batch_key": BATCH_KEY,
            "batch_size": plan.batch_size,
            "status_codes": "0 reached t_end, 1 stopped, -1 failed, -2 not run yet",
        }
        group = zarr.open_group(self.path, mode="w", zarr_format=3, attributes=attrs)
        from ..config import KEYS

        def array(name, dims, shape, chunks=None, dtype=np.float64, fill=np.nan, **attrs):
            """A pre-sized array of the store, one chunk unless ``chunks`` says otherwise."""
            self.arrays[name] = group.create_array(
                name,
                shape=shape,
                chunks=shape if chunks is None else chunks,
                dtype=dtype,
                fill_value=fill,
                compressors=codecs,
                dimension_names=dims,
                config={"write_empty_chunks": True},
                attributes=attrs,
            )
            return self.arrays[name]

        for ax in plan.axes:
            vals = np.array(ax.values, dtype=str if isinstance(ax.values[0], str) else None)
            dtype, fill = (str, "") if vals.dtype.kind == "U" else (vals.dtype, 0)
            desc = KEYS[ax.key].help
            a = array(
                ax.dim, (ax.dim,), vals.shape, dtype=dtype, fill=fill, key=ax.key, description=desc
            )
            a[:] = vals
        a = array("time", ("time",), (plan.n_time,), description=_TIME)
        a[:] = plan.times
        dims = tuple(a.dim for a in plan.axes)
        shape, chunks = plan.shape, plan.chunks()
        problem, t = plan.base["problem"], (plan.n_time,)
        for name, f in plan.observables.items():
            if f is not None:
                desc = f"user observable {getattr(f, '__qualname__', name)}"
            elif problem == "particles":
                desc = OBSERVABLES[name]
            else:
                desc = f"the {problem} run's {name} at each save"
            array(name, dims + ("time",), shape + t, chunks + t, description=desc)
        per_point = {
            "status": (np.int8, PENDING, attrs["status_codes"]),
            "message": (str, "", "the solver's message, or the error"),
            "seconds": (np.float64, np.nan, "wall time of the task (batch) that ran the point"),
            "cpu_seconds": (
                np.float64,
                np.nan,
                "CPU time of the worker process during the task (wall time well above it: the "
                "cores were shared)",
            ),
            "worker": (str, "", "the Dask worker that ran the point"),
        }
        for name, (kind, empty, desc) in per_point.items():
            array(name, dims, shape, chunks, kind, empty, description=desc)
        task_dims = tuple(a.dim for i, a in enumerate(plan.axes) if i != plan.batch_axis)
        task_shape = tuple(len(a.values) for i, a in enumerate(plan.axes) if i != plan.batch_axis)
        ones = tuple(1 for _ in task_dims)
        array("config", task_dims, task_shape, ones, str, "", description=_CONFIG)
        desc = "times the solver saved"
        array("save_time", task_dims + ("time",), task_shape + t, ones + t, description=desc)
        with warnings.catch_warnings():  # consolidated metadata is not in the Zarr v3 spec (yet)
            warnings.simplefilter("ignore")
            zarr.consolidate_metadata(self.path)
        _commit(self.path, plan.fingerprint, set())

    def write(self, results: Sequence[dict[str, Any]], commit: Sequence[bool]) -> None:
        """Write finished tasks' regions (in parallel), then their status, then commit them in one record."""
        plan = self.plan
        b = plan.batch_axis
        data, status = [], []
        for r in results:
            task = int(r["task"])
            reg = plan.region(task)
            shape = tuple(s.stop - s.start for s in reg)
            every, t = (slice(None),), (plan.n_time,)
            # (systems, n_time): the systems run along the batch axis
            data += [(k, reg + every, r["values"][k].reshape(shape + t)) for k in plan.observables]
            task_reg = tuple(s for i, s in enumerate(reg) if i != b)
            ones = tuple(1 for _ in task_reg)
            cfg, _ = plan.task_config(task)
            data += [
                ("config", task_reg, np.full(ones, json.dumps(cfg), dtype=object)),
                ("save_time", task_reg + every, r["times"].reshape(ones + t)),
                ("message", reg, _per_point(r["message"], shape, object)),
                ("seconds", reg, np.full(shape, r["seconds"])),
                ("cpu_seconds", reg, np.full(shape, r["cpu_seconds"])),
                ("worker", reg, np.full(shape, r["worker"], dtype=object)),
            ]
            status.append(("status", reg, _per_point(r["status"], shape, np.int8)))
        self._put(data)
        self._put(status)  # a point is complete once its status is written: after all its data
        new = [int(r["task"]) for r, c in zip(results, commit) if c]
        if new:
            self.done.update(new)
            _commit(self.path, plan.fingerprint, self.done)

    def _put(self, items: list[tuple[str, tuple, np.ndarray]]) -> None:
        if len(items) <= 1:  # (the status of one task: no threads)
            for name, sel, value in items:
                self.arrays[name][sel] = value
            return
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(4, thread_name_prefix="wflow-sweep-write")

        def put(name: str, sel: tuple, value: np.ndarray) -> None:
            self.arrays[name][sel] = value

        for f in [self._pool.submit(put, *item) for item in items]:
            f.result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


def store_is_complete(path: str | os.PathLike, plan: Plan) -> bool:
    """Whether the store at ``path`` (of ``plan``'s sweep) has committed every task of the plan."""
    fp, done = _committed(Path(path))
    return fp == plan.fingerprint and len(done) >= plan.n_tasks and done >= set(range(plan.n_tasks))


def open_sweep(path: str | os.PathLike):
    """The store of a sweep as a lazy :class:`xarray.Dataset` (``ds.sel(beta=4.0)``).

    ``attrs`` count, as committed in the store, the ``points``, those ``done`` (committed, whatever
    their status), ``ok`` (reached ``t_end``), ``failed`` (their task failed, or the cluster could not
    run it: such a task is not committed and the next run of the sweep retries it) and ``not_run``.
    A point whose task is not committed has ``status`` -2 (not run yet) or -1 (failed), whatever a
    chunk written before the commit says.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> import wflow
    >>> from wflow.sweep import open_sweep
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "s.zarr"
    >>> cfg = {"init.n": 8, "init.d": 3, "run.t_end": 1.0, "save.n": 3, "run.method": "euler", "run.dt": 0.1}
    >>> _ = wflow.sweep(cfg, {"model.beta": [1, 4]}, out=out, workers=1, progress=False)  # doctest: +SKIP
    >>> ds = open_sweep(out)  # doctest: +SKIP
    >>> ds.attrs["points"], ds.attrs["ok"], ds.order_parameter.sel(beta=4.0).shape  # doctest: +SKIP
    (2, 2, (3,))

    Not run as a doctest: a sweep starts a Dask cluster (seconds).
    """
    import xarray as xr
    import zarr

    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no sweep store at {p}")
    attrs = dict(zarr.open_group(p, mode="r").attrs)
    if attrs.get("wflow_format") != FORMAT:
        raise WflowError(
            f"{p} is not a wflow sweep store (wflow_format={attrs.get('wflow_format')!r})"
        )
    ds = xr.open_zarr(p, consolidated=True)
    status = np.asarray(zarr.open_array(p / "status", mode="r")[...])  # here, not on a Dask cluster
    fp, done = _committed(p)
    committed = _layout(attrs).point_mask(done if fp == attrs["fingerprint"] else ())
    # a point counts once its task is committed; one the cluster could not run is failed, not committed
    status = np.where(committed | (status == FAILED), status, PENDING).astype(np.int8)
    ds["status"] = ds["status"].copy(data=status)
    ds.attrs["points"] = int(status.size)
    ds.attrs["done"] = int(np.count_nonzero(committed))
    ds.attrs["ok"] = int(np.count_nonzero(status == OK))
    ds.attrs["failed"] = int(np.count_nonzero(status == FAILED))
    ds.attrs["not_run"] = int(np.count_nonzero(status == PENDING))
    return ds


def _layout(attrs: dict[str, Any]) -> Plan:
    """The layout of a sweep store (its axes and tasks) from its attributes."""
    dims = json.loads(attrs["dims"])
    axes = [Axis(k, dims[k], v) for k, v in json.loads(attrs["grid"]).items()]
    base = current_config(json.loads(attrs["base_config"]))
    return Plan(base, axes, {}, int(attrs["batch_size"]), 0, np.zeros(0), attrs["fingerprint"])


def point_config(ds, **coords) -> dict[str, Any]:
    """The full flat configuration of one point of a sweep: ``point_config(ds, beta=4.0, seed=3)``.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> import wflow
    >>> from wflow.sweep import point_config
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "s.zarr"
    >>> cfg = {"init.n": 8, "init.d": 3, "run.t_end": 1.0, "save.n": 3, "run.method": "euler", "run.dt": 0.1}
    >>> ds = wflow.sweep(cfg, {"model.beta": [1, 4]}, out=out, workers=1, progress=False)  # doctest: +SKIP
    >>> c = point_config(ds, beta=4.0)  # doctest: +SKIP
    >>> c["model.beta"], c["init.n"]  # doctest: +SKIP
    (4.0, 8)

    Not run as a doctest: a sweep starts a Dask cluster (seconds).
    """
    dims = json.loads(ds.attrs["dims"])
    key_of = {v: k for k, v in dims.items()}
    unknown = set(coords) - set(key_of)
    if unknown:
        raise ValueError(
            f"point_config: {sorted(unknown)} are not dimensions of this sweep ({sorted(key_of)})"
        )
    missing = set(key_of) - set(coords)
    if missing:
        raise ValueError(
            f"point_config: give a value for every dimension; missing {sorted(missing)}"
        )
    task = {k: v for k, v in coords.items() if k in ds["config"].dims}  # (not a batched seed axis)
    cfg = current_config(json.loads(str(ds["config"].sel(task).values)))
    for dim, v in coords.items():
        cfg[key_of[dim]] = v.item() if isinstance(v, np.generic) else v
    return cfg
