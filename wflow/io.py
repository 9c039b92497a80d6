"""Results on disk: trajectories as :class:`xarray.Dataset`, written snapshot by snapshot.

A run writes a Zarr store (``trajectory.zarr``) and appends one snapshot along the
``time`` dimension as soon as it is computed, so an interrupted run keeps every
snapshot already written and :func:`resume` continues it from the last one.  The store
is self-describing: its attributes carry the format tag, the wflow version, the full
run configuration (model, parameters, solver, seed) as JSON.

Layout::

    points          (time, [system,] particle, coord)   positions
    weights         ([system,] particle)                  atom masses
    energy, order_parameter, n_clusters  (time, [system])  diagnostics
    steps, rejected, evaluations, dt_next (time)           solver statistics
    attrs: wflow_format, wflow_version, solver, config (JSON)

Several batch axes are flattened into ``system``; ``config["batch_shape"]`` restores them.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from ._version import __version__
from .errors import WflowError

__all__ = ["FORMAT", "ZarrWriter", "trajectory_to_dataset", "dataset_to_trajectory", "load", "resume"]

log = logging.getLogger(__name__)

FORMAT = "wflow.trajectory/1"
_STAT_VARS = ("steps", "rejected", "evaluations")
#: config keys that simulate() writes itself; others (e.g. a lagrangian run's) are carried over on resume
_SIMULATE_CONFIG = {"model", "method", "dt", "rtol", "atol", "kappa", "seed", "backend", "t0", "t_end",
                    "save_at", "cluster_threshold", "n", "d", "batch_shape", "wflow_version", "n_tracers"}
_DIAG_VARS = ("energy", "order_parameter", "n_clusters")


def _xr():
    import xarray as xr

    return xr


def _point_dims(batch_shape: tuple[int, ...]) -> tuple[str, ...]:
    return (("system",) if batch_shape else ()) + ("particle", "coord")


def _snapshot_dataset(snap: dict[str, Any], *, first: bool):
    xr = _xr()
    cfg = snap["config"]
    batch = tuple(cfg["batch_shape"])
    n, d = cfg["n"], cfg["d"]
    pts = np.asarray(snap["points"]).reshape(((int(np.prod(batch)),) if batch else ()) + (n, d))
    sys_dims = ("system",) if batch else ()
    data = {
        "points": (("time",) + _point_dims(batch), pts[None]),
        "dt_next": (("time",), np.array([snap.get("dt_next", np.nan)], dtype=np.float64)),
    }
    if snap.get("tracers") is not None:
        tr = np.asarray(snap["tracers"]).reshape(pts.shape[:-2] + (-1, d))
        data["tracers"] = (("time",) + sys_dims + ("tracer", "coord"), tr[None])
    for k in _DIAG_VARS:
        v = np.asarray(snap["diagnostics"][k]).reshape(pts.shape[:-2])
        data[k] = (("time",) + sys_dims, v[None])
    for k in _STAT_VARS:
        data[k] = (("time",), np.array([snap["stats"][k]], dtype=np.int64))
    if first:
        data["weights"] = (sys_dims + ("particle",), np.asarray(snap["weights"]).reshape(pts.shape[:-1]))
    # attributes go with every append: xarray replaces the store's attributes each time
    attrs = {"wflow_format": FORMAT, "wflow_version": __version__, "solver": cfg.get("solver", "particles"),
             "config": json.dumps(cfg)}
    return xr.Dataset(data, coords={"time": np.array([snap["time"]], dtype=np.float64)}, attrs=attrs)


def _append(path: Path, ds, *, first: bool) -> None:
    """Create the store with ``ds`` (first snapshot) or append ``ds`` along ``time``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=UserWarning)  # zarr v3 consolidated-metadata notes
        warnings.simplefilter("ignore", category=RuntimeWarning)
        if first:
            ds.to_zarr(path, mode="w", consolidated=False)
        else:
            ds.to_zarr(path, mode="a", append_dim="time", consolidated=False)


class ZarrWriter:
    """Append snapshots to a Zarr store as they arrive (:class:`~wflow.solvers.particles.SnapshotWriter`).

    Parameters
    ----------
    path : str or Path
        The store (a folder, conventionally ``*.zarr``).
    append : bool
        Continue an existing store (used by :func:`resume`); otherwise an existing store
        is an error unless ``overwrite=True``.
    """

    def __init__(self, path: str | os.PathLike, *, append: bool = False, overwrite: bool = False):
        self.path = Path(path)
        self._first = not append
        if append:
            if not self.path.exists():
                raise FileNotFoundError(f"cannot append: no store at {self.path}")
        elif self.path.exists():
            if not overwrite:
                raise FileExistsError(f"{self.path} exists; pass overwrite=True (CLI: choose another --out or --resume)")
            shutil.rmtree(self.path)
        self.count = 0

    def write(self, snapshot: dict[str, Any]) -> None:
        _append(self.path, _snapshot_dataset(snapshot, first=self._first), first=self._first)
        self._first = False
        self.count += 1
        log.debug("wrote snapshot t=%g to %s", snapshot["time"], self.path)


def trajectory_to_dataset(traj):
    """A :class:`~wflow.solvers.particles.Trajectory` as an :class:`xarray.Dataset` (layout in the module docstring)."""
    xr = _xr()
    cfg = traj.config
    batch = tuple(cfg["batch_shape"])
    k = len(traj.times)
    nb = (int(np.prod(batch)),) if batch else ()
    sys_dims = ("system",) if batch else ()
    data = {
        "points": (("time",) + _point_dims(batch), traj.points.reshape((k,) + nb + traj.points.shape[-2:])),
        "weights": (sys_dims + ("particle",), traj.weights.reshape(nb + traj.weights.shape[-1:])),
        "dt_next": (("time",), np.asarray(traj.dt_next, dtype=np.float64)),
    }
    if traj.tracers is not None:
        data["tracers"] = (("time",) + sys_dims + ("tracer", "coord"),
                           traj.tracers.reshape((k,) + nb + traj.tracers.shape[-2:]))
    for name in _DIAG_VARS:
        data[name] = (("time",) + sys_dims, traj.diagnostics[name].reshape((k,) + nb))
    for name in _STAT_VARS:
        data[name] = (("time",), np.asarray(traj.stats[name], dtype=np.int64))
    attrs = {"wflow_format": FORMAT, "wflow_version": __version__, "solver": cfg.get("solver", "particles"),
             "config": json.dumps(cfg)}
    return xr.Dataset(data, coords={"time": traj.times}, attrs=attrs)


def dataset_to_trajectory(ds):
    """Inverse of :func:`trajectory_to_dataset`; rejects datasets it cannot interpret."""
    from .solvers.particles import Trajectory

    fmt = ds.attrs.get("wflow_format")
    if fmt != FORMAT:
        raise WflowError(f"not a wflow trajectory (wflow_format={fmt!r}, expected {FORMAT!r})")
    try:
        cfg = json.loads(ds.attrs["config"])
    except (KeyError, json.JSONDecodeError) as exc:
        raise WflowError(f"wflow trajectory has no readable 'config' attribute: {exc}") from None
    missing = [v for v in ("points", "weights", *_DIAG_VARS, *_STAT_VARS) if v not in ds.variables]
    if missing:
        raise WflowError(f"wflow trajectory is missing variables {missing}")
    batch = tuple(cfg["batch_shape"])
    times = np.asarray(ds["time"].values, dtype=np.float64)
    k = len(times)
    pts = np.asarray(ds["points"].values).reshape((k,) + batch + (cfg["n"], cfg["d"]))
    w = np.asarray(ds["weights"].values).reshape(batch + (cfg["n"],))
    diag = {name: np.asarray(ds[name].values).reshape((k,) + batch) for name in _DIAG_VARS}
    stats = {name: np.asarray(ds[name].values) for name in _STAT_VARS}
    dtn = np.asarray(ds["dt_next"].values) if "dt_next" in ds.variables else np.full(k, np.nan)
    tracers = None
    if "tracers" in ds.variables:
        tracers = np.asarray(ds["tracers"].values).reshape((k,) + batch + (-1, cfg["d"]))
    return Trajectory(times=times, points=pts, weights=w, diagnostics=diag, stats=stats, config=cfg, dt_next=dtn,
                      tracers=tracers)


def _open(path: str | os.PathLike):
    xr = _xr()
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no wflow result at {p}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return xr.open_zarr(p, consolidated=False)
    except Exception as exc:
        raise WflowError(f"cannot read {p} as a wflow result (Zarr store): {type(exc).__name__}: {exc}") from None


def load(path: str | os.PathLike):
    """Load a trajectory written by :class:`ZarrWriter` or :func:`save`."""
    ds = _open(path)
    try:
        return dataset_to_trajectory(ds.load())
    finally:
        ds.close()


def save(traj, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Write a whole trajectory to a Zarr store."""
    p = Path(path)
    if p.exists():
        if not overwrite:
            raise FileExistsError(f"{p} exists; pass overwrite=True")
        shutil.rmtree(p)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=UserWarning)
        trajectory_to_dataset(traj).to_zarr(p, mode="w", consolidated=False)
    return p


def resume(path: str | os.PathLike, *, progress: bool = False, backend: str | None = None):
    """Continue an interrupted particle run from its last written snapshot.

    The run repeats exactly what the uninterrupted run would have done (see
    :mod:`wflow.solvers.particles`): same steps, same noise, same step-size control.
    Returns the whole trajectory (old and new snapshots).
    """
    from .models import model_from_dict
    from .measure import Atoms
    from .solvers.particles import simulate

    prev = load(path)
    cfg = prev.config
    if cfg.get("solver", "particles") not in ("particles", "lagrangian"):
        raise WflowError(f"resume supports particle and lagrangian runs; {path} holds solver={cfg.get('solver')!r}")
    all_times = np.asarray(cfg["save_at"], dtype=np.float64)
    done = len(prev.times)
    if done >= len(all_times):
        log.info("%s is complete (%d snapshots)", path, done)
        return prev
    if not np.allclose(prev.times, all_times[:done], rtol=0, atol=1e-12 * max(1.0, abs(all_times[-1]))):
        raise WflowError(f"{path}: saved times do not match the configured save_at; cannot resume")
    mu = Atoms._trusted(prev.points[-1], prev.weights)
    stats = {k: int(prev.stats[k][-1]) for k in _STAT_VARS}
    dtn = float(prev.dt_next[-1]) if np.isfinite(prev.dt_next[-1]) else 0.0
    return simulate(
        model_from_dict(cfg["model"]), mu, cfg["t_end"], save_at=all_times, method=cfg["method"],
        dt=cfg["dt"], rtol=cfg["rtol"], atol=cfg["atol"], kappa=cfg["kappa"], backend=backend or cfg["backend"],
        t0=cfg["t0"], cluster_threshold=cfg["cluster_threshold"],
        writer=ZarrWriter(path, append=True), progress=progress,
        tracers=None if prev.tracers is None else prev.tracers[-1],
        _config_update={k: v for k, v in cfg.items() if k not in _SIMULATE_CONFIG},
        _resume={"seed": cfg["seed"], "first_interval": done - 1, "stats": stats, "dt_next": dtn,
                 "previous": prev},
    )


# ------------------------------------------------------------------------------ densities
DENSITY_FORMAT = "wflow.density/1"


class DensityZarrWriter:
    """Append saved densities of a continuum run (``values`` on mesh cells) to a Zarr store.

    Layout: ``values (time, cell)`` cell averages (plain surface measure), ``energy
    (time)``, ``mass (time)``; ``centers (cell, coord)`` and ``areas (cell)`` describe the
    mesh; attributes ``wflow_format = "wflow.density/1"``, ``config`` (JSON, with the
    mesh specification that rebuilds the mesh exactly).
    """

    def __init__(self, path: str | os.PathLike, mesh, config: dict[str, Any], *, append: bool = False,
                 overwrite: bool = False):
        self.path = Path(path)
        self.mesh = mesh
        self.config = config
        self._first = not append
        if not append and self.path.exists():
            if not overwrite:
                raise FileExistsError(f"{self.path} exists; pass overwrite=True")
            shutil.rmtree(self.path)
        self.count = 0

    def write(self, t: float, values: np.ndarray, energy: float, extra: dict[str, Any] | None = None) -> None:
        """Append one density; ``extra`` maps further per-snapshot variables (a JKO run's warm start:
        ``jko_gbar``, ``jko_v`` per cell, ``jko_L`` a scalar) to their values."""
        xr = _xr()
        data = {
            "values": (("time", "cell"), np.asarray(values, dtype=np.float64)[None]),
            "energy": (("time",), np.array([energy], dtype=np.float64)),
            "mass": (("time",), np.array([float(np.asarray(values) @ self.mesh.areas)])),
        }
        for name, val in (extra or {}).items():
            val = np.asarray(val, dtype=np.float64)
            data[name] = ((("time", "cell") if val.ndim else ("time",)), val[None])
        if self._first:
            data["centers"] = (("cell", "coord"), self.mesh.centers)
            data["areas"] = (("cell",), self.mesh.areas)
        attrs = {"wflow_format": DENSITY_FORMAT, "wflow_version": __version__,
                 "solver": self.config.get("solver", "eulerian"), "config": json.dumps(self.config)}
        ds = xr.Dataset(data, coords={"time": np.array([t], dtype=np.float64)}, attrs=attrs)
        _append(self.path, ds, first=self._first)
        self._first = False
        self.count += 1


def load_density(path: str | os.PathLike) -> dict[str, Any]:
    """Load a continuum run written by :class:`DensityZarrWriter`: times, values, energy, mass, centers, areas, config
    (and a JKO run's warm starts ``jko_gbar``, ``jko_v``, ``jko_L`` where written)."""
    ds = _open(path)
    try:
        if ds.attrs.get("wflow_format") != DENSITY_FORMAT:
            raise WflowError(f"not a wflow density result (wflow_format={ds.attrs.get('wflow_format')!r}, "
                             f"expected {DENSITY_FORMAT!r})")
        try:
            cfg = json.loads(ds.attrs["config"])
        except (KeyError, json.JSONDecodeError) as exc:
            raise WflowError(f"wflow density result has no readable 'config' attribute: {exc}") from None
        out = {k: np.asarray(ds[k].values) for k in ("values", "energy", "mass", "centers", "areas")}
        for k in ds.data_vars:  # per-snapshot solver state (a JKO run's warm start)
            if k.startswith("jko_"):
                out[k] = np.asarray(ds[k].values)
        out["times"] = np.asarray(ds["time"].values)
        out["config"] = cfg
        return out
    finally:
        ds.close()
