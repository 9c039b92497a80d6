"""The recorder: the tracker that writes a run to its Zarr store, one atomic commit per snapshot.

:class:`ZarrRecorder` creates the store at the first snapshot, one snapshot per chunk, and
commits each snapshot with its digests (:mod:`wflow.io.commit`).  :func:`store_attributes` and
:func:`index_coordinates` also serve :func:`wflow.io.read.result_dataset`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from .._version import __version__
from ..errors import WflowError
from .commit import (
    COMMIT,
    FORMAT,
    FolderLock,
    append_digest,
    chunk_codecs,
    commit_length,
    committed_length,
    digest_end,
    digest_line,
    import_zarr,
    is_snapshot,
    read_commit,
    read_digest_lines,
    remove_store,
    snapshot_digests,
    store_files,
)

log = logging.getLogger("wflow.io")

#: the counters stored per snapshot
STATS = ("steps", "rejected", "evaluations")
#: the prefix of the solver's resume variables in a store
CHECKPOINT_PREFIX = "checkpoint_"


# Ctrl-C during a snapshot's writes: a SIGINT handler that sees writing_snapshot() true calls
# defer_interrupt(), and the write raises KeyboardInterrupt once the snapshot is committed (an
# interrupt inside Zarr's asynchronous writes would leave coroutines behind).
_WRITES = {"depth": 0, "deferred": False}


def writing_snapshot() -> bool:
    """Whether a recorder is writing a snapshot now (in this process)."""
    return _WRITES["depth"] > 0


def defer_interrupt() -> None:
    """Raise KeyboardInterrupt when the snapshot being written is committed, not now."""
    _WRITES["deferred"] = True


@contextlib.contextmanager
def _one_write():
    _WRITES["depth"] += 1
    raise_after = False
    try:
        yield
    finally:
        _WRITES["depth"] -= 1
        if _WRITES["depth"] == 0:
            raise_after, _WRITES["deferred"] = bool(_WRITES["deferred"]), False
    if raise_after:
        raise KeyboardInterrupt


# The recorder's two writes, looked up here at each call so that a test or a benchmark can
# replace them (tests/test_reliability.py counts the commits, benchmarks/store.py drops them).
def _identity(path: Path) -> tuple[int, int] | None:
    """``(device, inode)`` of the folder at ``path`` (``None`` if nothing is there): a folder moved
    away, or replaced, is no longer the one a recorder writes into."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _write_commit(path: Path, length: int, chain: str | None = None) -> None:
    commit_length(path, length, chain)


#: CF-style attributes of the variables wflow writes (``long_name``, ``units``; times are depth, dimensionless)
VARIABLE_ATTRS: dict[str, dict[str, str]] = {
    "time": {"long_name": "time (depth)", "units": "1", "standard_name": "time"},
    "points": {"long_name": "token positions on the unit sphere", "units": "1"},
    "positions": {"long_name": "tokens x = r theta in R^d", "units": "1"},
    "radii": {"long_name": "token radii r", "units": "1"},
    "angles": {"long_name": "token angles on the circle", "units": "radian"},
    "tracers": {"long_name": "passive tracers carried by the flow", "units": "1"},
    "weights": {"long_name": "atom masses (sum 1 per system)", "units": "1"},
    "energy": {
        "long_name": "interaction energy E_beta the flow ascends (non-decreasing along the flow)",
        "units": "1",
        "definition": "E_beta(mu) = (1 / (2 beta)) sum_i sum_j w_i w_j exp(beta <x_i, x_j>)",
    },
    "log_energy": {
        "long_name": "log of the interaction energy E_beta (finite where energy overflows)",
        "units": "1",
        "definition": "log E_beta(mu), E_beta(mu) = (1 / (2 beta)) sum_i sum_j w_i w_j exp(beta <x_i, x_j>)",
    },
    "n_eff": {
        "long_name": "effective number of clusters N_eff",
        "units": "1",
        "definition": (
            "N_eff = 1 / sum_i sum_j w_i w_j exp(beta (<x_i, x_j> - 1)) = e^beta / (2 beta E_beta): "
            "k for k well separated clusters of equal mass, 2 beta / (1 - exp(-2 beta)) for the "
            "uniform measure on S^2, exp(beta) / I_0(beta) on S^1"
        ),
    },
    "free_energy": {"long_name": "free energy -F + KL/kappa (JKO)", "units": "1"},
    "order_parameter": {"long_name": "order parameter |sum_i w_i x_i|", "units": "1"},
    "n_clusters": {
        "long_name": "number of clusters (single linkage)",
        "units": "1",
        "definition": (
            "connected components of the graph joining points at geodesic distance < threshold_rad "
            "(from a uniform start it counts percolation components first; n_eff is the cluster measure)"
        ),
    },
    "density": {
        "long_name": "density: cell averages w.r.t. the surface measure",
        "units": "1",
        "definition": "rho_i = (mass of cell i) / (area of cell i); sum_i rho_i area_i = 1",
    },
    "values": {"long_name": "density: cell averages w.r.t. the surface measure", "units": "1"},
    "masses": {"long_name": "cell masses", "units": "1"},
    "mass": {"long_name": "total mass", "units": "1"},
    "centers": {"long_name": "cell centres on the sphere", "units": "1"},
    "areas": {"long_name": "cell areas (plain surface measure)", "units": "1"},
    "reference": {"long_name": "reference volumes of the entropy", "units": "1"},
    "cell_pairs": {
        "long_name": "the two cells each mesh edge separates (neighbours)",
        "units": "1",
    },
    "edge_length": {"long_name": "length of each mesh edge (1 on the circle)", "units": "1"},
    "gaps": {
        "long_name": "state in gap coordinates (theta_0, gaps between sorted tokens)",
        "units": "radian",
    },
    "order": {"long_name": "token index at each sorted position", "units": "1"},
    "span": {
        "long_name": "token coordinates in the orthonormal basis span_basis (points = span @ span_basis)",
        "units": "1",
    },
    "span_basis": {"long_name": "orthonormal basis of the initial tokens' span", "units": "1"},
    "pair_fraction": {
        "long_name": "fraction of token pairs with inner product > 0.999",
        "units": "1",
    },
    "steps": {"long_name": "accepted steps so far", "units": "1"},
    "rejected": {"long_name": "rejected steps so far", "units": "1"},
    "evaluations": {"long_name": "right-hand-side evaluations so far", "units": "1"},
    "dt_next": {"long_name": "next step of the adaptive controller", "units": "1"},
}


#: the attribute that marks the coordinates wflow adds: ``index`` for dimensions without one,
#: ``cell-coordinate`` for a mesh's angles or longitudes and latitudes (:func:`cell_coordinates`)
COORDINATE_ROLE = "wflow_role"


def model_spec(config: Any) -> Any:
    """The model description of a run's configuration (a zonal run's from its ``attention``, ``beta``, ``kernel``)."""
    if not isinstance(config, dict):
        return None
    if isinstance(config.get("model"), dict):
        return config["model"]
    if config.get("attention") in ("SA", "USA"):
        spec = {"type": config["attention"], "beta": config.get("beta", 0.0)}
        if config.get("kernel", "plain") != "plain":
            spec["kernel"] = config["kernel"]
        return spec
    return None


def _model_beta(spec: Any) -> tuple[float | None, str]:
    """The attention's ``beta`` in a model description and its kernel (``plain`` or ``rescaled``)."""
    if not isinstance(spec, dict):
        return None, "plain"
    if spec.get("type") in ("SA", "USA"):
        beta = spec.get("beta")
        return (float(beta) if isinstance(beta, (int, float)) else None), spec.get(
            "kernel", "plain"
        )
    for inner in [spec.get("attention")] + list(spec.get("parts", []) or []):
        beta, kernel = _model_beta(inner)
        if beta is not None:
            return beta, kernel
    return None, "plain"


def variable_attributes(name: str, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The attributes of a stored variable: :data:`VARIABLE_ATTRS` and the run's parameters of its definition
    (``beta`` of ``n_eff``, ``threshold_rad`` of ``n_clusters``, ``beta`` and the normalisation of ``energy``).

    Examples
    --------
    >>> a = variable_attributes("n_clusters", {"cluster_threshold": 0.1, "model": {"type": "SA", "beta": 9.0}})
    >>> a["threshold_rad"], a["long_name"]
    (0.1, 'number of clusters (single linkage)')
    >>> variable_attributes("n_eff", {"n_eff_beta": 9.0})["beta"]
    9.0
    """
    out: dict[str, Any] = dict(VARIABLE_ATTRS.get(name, {}))
    cfg = config if isinstance(config, dict) else {}
    beta, kernel = _model_beta(model_spec(cfg))
    if name == "n_clusters" and isinstance(cfg.get("cluster_threshold"), (int, float)):
        out["threshold_rad"] = float(cfg["cluster_threshold"])
    elif name == "n_eff":
        b = cfg.get("n_eff_beta", beta)
        if isinstance(b, (int, float)):
            out["beta"] = float(b)
    elif name in ("energy", "log_energy"):
        if beta is not None:
            out["beta"] = beta
        out["kernel"] = kernel
        out["normalization"] = (
            "mu = sum_i w_i delta_{x_i} (or the density's cell masses), weights summing to 1"
            + ("; rescaled kernel: E_beta times exp(-beta)" if kernel == "rescaled" else "")
            + "; energy = sign(V) E_beta, plus (1/2) int v_omega dmu with a conservative perceptron"
        )
    return out


#: the equation each kind of run solves (a store's ``equation`` attribute)
EQUATIONS = {
    "particles": "dx_i/dt = v[mu_N](x_i) on the unit sphere S^(d-1), mu_N = sum_j w_j delta_(x_j)",
    "density": "d_t rho + div_S(rho v[rho]) = 0 on S^(d-1) (finite volume, cell averages)",
    "lagrangian": "d_t rho + div_S(rho v[rho]) = 0, nodes moved by v[rho] carrying rho",
    "jko": "JKO scheme: rho_(k+1) = argmin W_2^2(rho, rho_k) / (2 tau) - E(rho) + KL(rho) / kappa",
    "zonal": "d_t rho + div_S(rho v[rho]) = 0 for zonal rho(z), z = <x, e>",
}


def model_equation(spec: Any) -> str:
    """The velocity field of a model description (the store's ``velocity`` attribute).

    Examples
    --------
    >>> model_equation({"type": "SA", "beta": 9.0})
    'SA: v[mu](x) = P_x( int e^(beta <x,y>) y dmu(y) / int e^(beta <x,y>) dmu(y) ), beta = 9'
    """
    if not isinstance(spec, dict):
        return ""
    kind = spec.get("type", "")
    if kind in ("SA", "USA"):
        qk = "<Qx,Ky>" if ("Q" in spec or "K" in spec) else "<x,y>"
        vy = "V y" if "V" in spec else "y"
        ell = f"beta ({qk} - 1)" if spec.get("kernel") == "rescaled" else f"beta {qk}"
        field = (
            f"P_x( int e^({ell}) {vy} dmu(y) / int e^({ell}) dmu(y) )"
            if kind == "SA"
            else f"P_x( int e^({ell}) {vy} dmu(y) )"
        )
        temp = (
            f"beta = gamma log n, gamma = {spec['gamma']:g}"
            if isinstance(spec.get("gamma"), (int, float))
            else f"beta = {float(spec.get('beta', 0.0)):g}"
        )
        return f"{kind}: v[mu](x) = {field}, {temp}"
    if kind == "Perceptron":
        return f"Perceptron: u(x) = P_x( W sigma(A x + b) ), sigma = {spec.get('activation', '')}"
    parts = [model_equation(p) for p in spec.get("parts", []) or []]
    if parts:
        return " + ".join(parts)
    if isinstance(spec.get("attention"), dict):
        return f"{model_equation(spec['attention'])}, normalization scheme {spec.get('scheme', '')}"
    return str(kind)


def cell_coordinates(static: dict[str, Any]) -> dict[str, tuple[tuple[str, ...], np.ndarray, dict]]:
    """Coordinates of the cells of a mesh from its ``centers`` ``(cell, coord)``: ``angle`` (radians in
    [0, 2 pi)) on S^1, ``longitude`` and ``latitude`` (degrees) on S^2; ``{}`` otherwise.

    Examples
    --------
    >>> c = cell_coordinates({"centers": (("cell", "coord"), np.array([[0.0, 1.0], [-1.0, 0.0]]))})
    >>> np.round(c["angle"][1] / np.pi, 12).tolist()
    [0.5, 1.0]
    """
    entry = static.get("centers")
    if entry is None:
        return {}
    dims, value = entry[0], np.asarray(entry[1], dtype=np.float64)
    if tuple(dims) != ("cell", "coord") or value.ndim != 2:
        return {}
    role = {COORDINATE_ROLE: "cell-coordinate"}
    if value.shape[1] == 2:
        angle = np.mod(np.arctan2(value[:, 1], value[:, 0]), 2 * np.pi)
        attrs = {"long_name": "angle of the cell centre on the circle", "units": "radian", **role}
        return {"angle": (("cell",), angle, attrs)}
    if value.shape[1] == 3:
        r = np.linalg.norm(value, axis=1)
        lon = np.degrees(np.arctan2(value[:, 1], value[:, 0]))
        lat = np.degrees(np.arcsin(np.clip(value[:, 2] / r, -1.0, 1.0)))
        of = lambda name, units: {"long_name": f"{name} of the cell centre", "units": units, **role}
        return {
            "longitude": (("cell",), lon, of("longitude", "degrees_east")),
            "latitude": (("cell",), lat, of("latitude", "degrees_north")),
        }
    return {}


def flat_config(config: Any, prefix: str = "config") -> dict[str, Any]:
    """The configuration as attributes ``config.model.beta = 2.0``: every scalar (and short list of scalars)
    under its dotted path, so tools that do not parse JSON can filter stores; ``config`` (JSON) stays the
    exact record."""
    out: dict[str, Any] = {}
    if isinstance(config, dict):
        for k, v in config.items():
            out.update(flat_config(v, f"{prefix}.{k}"))
    elif isinstance(config, (bool, int, float, str)) and not isinstance(config, np.generic):
        if not (isinstance(config, float) and not np.isfinite(config)):
            out[prefix] = config
    elif (
        isinstance(config, (list, tuple))
        and 0 < len(config) <= 16
        and all(isinstance(v, (bool, int, float, str)) for v in config)
    ):
        if all(np.isfinite(v) for v in config if isinstance(v, float)):
            out[prefix] = list(config)
    return out


def store_attributes(kind: str, solver: str, config: dict[str, Any]) -> dict[str, Any]:
    """A store's attributes: the format, wflow's version, the kind, the solver, the configuration, and in
    words the ``equation`` solved and the model's ``velocity`` field."""
    out = {
        "wflow_format": FORMAT,
        "wflow_version": __version__,
        "kind": kind,
        "solver": solver,
        "config": json.dumps(config),
        **flat_config(config),
    }
    if kind in EQUATIONS:
        out["equation"] = EQUATIONS[kind]
    velocity = model_equation(model_spec(config))
    if velocity:
        out["velocity"] = velocity
    return out


def index_coordinates(dims: set[str]) -> dict[str, dict[str, str]]:
    """``dim -> attributes`` of the integer index coordinate (0, 1, ...) of every dimension but time."""
    names = {
        "particle": "token index",
        "coord": "Cartesian coordinate index (0: x, 1: y, 2: z, ...)",
        "cell": "cell index of the mesh",
        "edge": "edge index of the mesh",
        "side": "0: left cell, 1: right cell",
        "tracer": "tracer index",
        "system": "index of the independent system",
        "face": "face index (zonal bands)",
    }
    return {
        d: {"long_name": names.get(d, f"index along {d}"), "units": "1", COORDINATE_ROLE: "index"}
        for d in sorted(dims)
        if d != "time"
    }


class ZarrRecorder:
    """The tracker that writes a run to a Zarr store, one atomic commit per snapshot.

    Parameters
    ----------
    path : str or Path
        The store (a folder, conventionally ``*.zarr``).
    append : bool
        Continue an existing store (:func:`wflow.resume`): snapshots from the resumed one on
        are written over the uncommitted tail.
    overwrite : bool
        Replace an existing store; otherwise an existing store is an error.  Only what wflow
        wrote there is removed (:func:`wflow.io.remove_store`): anything else in the store
        folder, or a store that is a link, is refused when the recorder is made.
    attrs : dict, optional
        Further JSON-serializable attributes of the store (``wflow run`` records its flat
        configuration as ``run_config``).

    Examples
    --------
    >>> import wflow, tempfile, pathlib
    >>> from wflow.io import ZarrRecorder, committed_length
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "t.zarr"
    >>> traj = wflow.simulate(wflow.SA(2.0), wflow.sphere.uniform(8, 3, seed=0), 0.5, dt=0.1, backend="numpy",
    ...                       trackers=[ZarrRecorder(path)])
    >>> committed_length(path), bool((wflow.load(path).points == traj.points).all())
    (6, True)
    """

    name = "recorder"

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        append: bool = False,
        overwrite: bool = False,
        attrs: dict[str, Any] | None = None,
    ):
        self.path = Path(path)
        self.append = append
        self.extra_attrs = {k: json.dumps(v) for k, v in (attrs or {}).items()}
        if append:
            if not (self.path / COMMIT).exists() and not self.path.exists():
                raise FileNotFoundError(f"cannot append: no store at {self.path}")
        elif os.path.lexists(self.path) and not overwrite:
            raise FileExistsError(
                f"{self.path} exists; pass overwrite=True (CLI: choose another --out, --resume "
                f"or --overwrite)"
            )
        else:  # what an overwrite would remove is checked now, before the run: only what wflow wrote
            store_files(self.path)
        self._lock_path().check()  # (a link or the user's file there: refused now, nothing written)
        self.overwrite = overwrite
        self.count = 0
        self.group = None
        self._arrays: dict[str, Any] = {}
        self._chain: str | None = ""  # the hash chain of the snapshot digests committed so far
        self._digest_end = 0  # where their lines end in the digests file
        self._folder: tuple[int, int] | None = None  # the store's (device, inode) once written
        self._parent = _identity(self.path.parent)  # the folder it goes into, if it exists yet

    def _lock_path(self) -> FolderLock:
        return FolderLock(self.path.with_name(self.path.name + ".lock"), f"store {self.path}")

    # -- tracker protocol -----------------------------------------------------------
    def start(self, run) -> None:
        zarr = import_zarr()
        self.lock = self._lock_path().acquire()
        self.n_saves = len(run.save_times)
        self.kind = run.problem.kind
        self.solver = run.solver.name
        self.config = run.config
        self.static = run.static
        if self.append:
            self.group = group = zarr.open_group(self.path, mode="r+")
            # every chunk is written, even one equal to the fill value (a missing chunk means damage)
            self._arrays = {
                name: arr.with_config({"write_empty_chunks": True}) for name, arr in group.arrays()
            }
            group.attrs.update(store_attributes(self.kind, self.solver, self.config))
            self._folder = _identity(self.path)
            record = read_commit(self.path, default={})
            self._chain = record.get("chain")  # None: a store written before the digests
            if self._chain is not None:  # checked: the continuation extends a sound chain
                length = committed_length(self.path)
                read_digest_lines(self.path, length, self._chain)
                self._digest_end = digest_end(self.path, length)
        else:  # created at the first snapshot (the shapes known): a run failing before leaves the old one
            self.group = None

    def save(self, snap) -> None:
        with _one_write():  # a Ctrl-C meanwhile is delivered once the snapshot is committed
            self._save(snap)

    def _save(self, snap) -> None:
        if self.group is None:
            if self._parent is not None and _identity(self.path.parent) != self._parent:
                raise WflowError(
                    f"{self.path.parent}: the folder was moved or removed before the run's first "
                    f"snapshot; nothing was written (run again where it is now)"
                )
            self._create(snap)
            self._folder = _identity(self.path)
        elif _identity(self.path) != self._folder:
            # writing on would create a new store at the old path (stray chunks, no metadata)
            raise WflowError(
                f"{self.path}: the store was moved or removed during the run; the "
                f"{self.count} snapshot(s) committed before are wherever it went (continue there with --resume or "
                f"wflow.resume); nothing was written at {self.path}"
            )
        i = snap.index
        for name, (dims, value) in self._variables(snap).items():
            arr = self._arrays.get(name)
            if arr is None:
                raise WflowError(
                    f"{self.path}: variable {name!r} is not in the store; it was written by another "
                    f"configuration"
                )
            kind = np.asarray(value).dtype
            # a cast would store other bits than the run computed
            if kind.kind == "f" and kind != arr.dtype:
                raise WflowError(
                    f"{self.path}: snapshot {i} of {name!r} has dtype {kind}, the store holds "
                    f"{arr.dtype}; a run resumed or written into it must compute in {arr.dtype}"
                )
            arr[i] = value
        if self._chain is not None:
            ndims = {name: arr.ndim for name, arr in self._arrays.items() if is_snapshot(arr)}
            line = digest_line(i, snapshot_digests(self.path, i, ndims))
            if i == 0:
                self._chain, self._digest_end = "", 0
            self._chain, self._digest_end = append_digest(
                self.path, line, self._chain, self._digest_end
            )
        _write_commit(self.path, i + 1, self._chain)
        self.count += 1
        log.debug("committed snapshot %d (t=%g) to %s", i, snap.t, self.path)

    def step(self, t, dt, step) -> None:
        return None

    def finish(self, result) -> None:
        return None

    def close(self) -> None:
        """Release the store's lock (the driver calls this whatever ended the run)."""
        lock = getattr(self, "lock", None)
        if lock is not None:
            lock.release()

    # -- layout -------------------------------------------------------------------------
    @staticmethod
    def _variables(snap) -> dict[str, tuple[tuple[str, ...], Any]]:
        out: dict[str, tuple[tuple[str, ...], Any]] = {"time": ((), np.float64(snap.t))}
        out.update({k: (dims, np.asarray(v)) for k, (dims, v) in snap.data.items()})
        for k in STATS:
            out[k] = ((), np.int64(snap.stats[k]))
        out["dt_next"] = ((), np.float64(snap.control.get("dt_next", np.nan)))
        for k, (dims, v) in snap.checkpoint.items():
            out[CHECKPOINT_PREFIX + k] = (dims, np.asarray(v))
        return out

    def _create(self, snap) -> None:
        zarr = import_zarr()
        remove_store(self.path)  # (overwrite=True: only what wflow wrote, checked again)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        attrs = {**store_attributes(self.kind, self.solver, self.config), **self.extra_attrs}
        group = zarr.open_group(self.path, mode="w", zarr_format=3, attributes=attrs)
        codecs = chunk_codecs()
        cells = cell_coordinates(self.static)
        on_cells = " ".join(cells)

        def attributes(name: str, dims: tuple[str, ...]) -> dict[str, Any]:
            out = variable_attributes(name, self.config)
            if on_cells and "cell" in dims:
                out["coordinates"] = on_cells  # (CF: xarray opens them as coordinates)
            return out

        for name, (dims, value) in self._variables(snap).items():
            value = np.asarray(value)
            fill = np.nan if value.dtype.kind == "f" else 0
            self._arrays[name] = group.create_array(
                name,
                shape=(self.n_saves,) + value.shape,
                chunks=(1,) + value.shape,
                dtype=value.dtype,
                fill_value=fill,
                compressors=codecs,
                dimension_names=("time",) + tuple(dims),
                config={"write_empty_chunks": True},
                attributes=attributes(name, tuple(dims)),
            )

        def whole(name: str, dims: tuple[str, ...], value: np.ndarray, attrs: dict, chunks=None):
            arr = group.create_array(
                name,
                shape=value.shape,
                chunks=chunks or value.shape or None,
                dtype=value.dtype,
                compressors=codecs,
                dimension_names=tuple(dims),
                config={"write_empty_chunks": True},
                attributes=attrs,
            )
            arr[...] = value

        sizes: dict[str, int] = {}
        for name, (dims, value) in self.static.items():
            value = np.asarray(value)
            sizes.update(zip(dims, value.shape))
            whole(name, dims, value, attributes(name, tuple(dims)))
        for name, (dims, value, attrs) in cells.items():
            whole(name, dims, value, attrs)
        for name, (dims, value) in self._variables(snap).items():
            sizes.update(zip(dims, np.shape(value)))
        # every dimension gets a coordinate (xarray: ds.sel(particle=3)); marked so that reading skips them
        for dim, attrs in index_coordinates(
            set(sizes) - set(self._arrays) - set(self.static) - set(cells)
        ).items():
            n = sizes[dim]
            whole(dim, (dim,), np.arange(n, dtype=np.int64), attrs, chunks=(max(n, 1),))
        # zarr notes that consolidated metadata is not in the v3 spec (yet)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            zarr.consolidate_metadata(self.path)
        self.group = group
