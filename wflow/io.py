"""Results on disk: one Zarr store per run, written snapshot by snapshot, committed atomically.

A run's store (``trajectory.zarr``, ``density.zarr``, ...) is a Zarr v3 group created when
the run starts, with every per-snapshot array sized for all the run's save times and
chunked one snapshot per chunk.  A snapshot is written chunk by chunk and then
*committed* by atomically replacing a small record, ``wflow_commit.json``, that holds the
number of committed snapshots (write a temporary file, ``fsync``, ``rename``).  Readers
and :func:`wflow.resume` use the committed length and ignore anything beyond it, so a
process that dies at any instant leaves either the whole snapshot or none of it.
Every chunk carries a CRC32C checksum (Zarr's ``crc32c`` codec), and a chunk missing
inside the committed length is an error naming the store, the variable and the snapshot,
never a fill value.

Layout: the variables the problem saves (``points``, ``values``, diagnostics, ...) with a
leading ``time`` dimension; ``steps``, ``rejected``, ``evaluations`` and ``dt_next`` per
snapshot; the solver's resume variables (``checkpoint_*``); variables written once
(``weights``, mesh arrays) without ``time``; attributes ``wflow_format``, ``kind``,
``solver``, ``wflow_version`` and the configuration as JSON.

This module knows nothing about solvers: it stores what the driver hands to its
recorder (:class:`ZarrRecorder`) and reads it back as plain arrays (:func:`read_store`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import IO, Any

import numpy as np

from ._version import __version__
from .errors import StoreBusyError, WflowError

__all__ = [
    "FORMAT",
    "COMMIT",
    "DIGESTS",
    "ZarrRecorder",
    "FolderLock",
    "result_dataset",
    "read_store",
    "repair",
    "store_attrs",
    "write_result",
    "committed_length",
    "write_commit",
    "read_commit",
    "chunk_codecs",
]

log = logging.getLogger(__name__)

FORMAT = "wflow.result/2"
COMMIT = "wflow_commit.json"
#: one line per snapshot: the digest of each of its chunks, keyed by variable and snapshot
DIGESTS = "wflow_digests.jsonl"
_STATS = ("steps", "rejected", "evaluations")
_CHECKPOINT = "checkpoint_"


def _zarr():
    import zarr

    return zarr


def chunk_codecs() -> tuple:
    """The codecs of every chunk wflow writes: Zstandard (level 1), then a CRC32C checksum.

    A chunk that fails its checksum is an error when read, never silently wrong numbers.

    Examples
    --------
    >>> from wflow.io import chunk_codecs
    >>> [type(c).__name__ for c in chunk_codecs()]
    ['ZstdCodec', 'Crc32cCodec']
    """
    zarr = _zarr()
    return (zarr.codecs.ZstdCodec(level=1), zarr.codecs.Crc32cCodec())


def _codecs():
    return chunk_codecs()


#: CF-style attributes of the variables wflow writes (``long_name``, ``units``; times are depth, dimensionless)
VARIABLE_ATTRS: dict[str, dict[str, str]] = {
    "time": {"long_name": "time (depth)", "units": "1", "standard_name": "time"},
    "points": {"long_name": "token positions on the unit sphere", "units": "1"},
    "positions": {"long_name": "tokens x = r theta in R^d", "units": "1"},
    "radii": {"long_name": "token radii r", "units": "1"},
    "angles": {"long_name": "token angles on the circle", "units": "radian"},
    "tracers": {"long_name": "passive tracers carried by the flow", "units": "1"},
    "weights": {"long_name": "atom masses (sum 1 per system)", "units": "1"},
    "energy": {"long_name": "energy the flow ascends", "units": "1"},
    "log_energy": {"long_name": "log of the interaction energy E_beta", "units": "1"},
    "free_energy": {"long_name": "free energy -F + KL/kappa (JKO)", "units": "1"},
    "order_parameter": {"long_name": "order parameter |sum_i w_i x_i|", "units": "1"},
    "n_clusters": {"long_name": "number of clusters (single linkage)", "units": "1"},
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


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_commit(folder: str | os.PathLike, record: Any, *, name: str = COMMIT) -> None:
    """Commit a store: atomically replace its commit record ``folder / name`` with ``record`` (JSON).

    The record is written to a temporary file beside it, flushed and ``fsync``-ed, renamed over
    the old one and the folder is ``fsync``-ed: a process that dies at any instant leaves the
    old record or the new one, never a torn one.  A run's store records ``{"length": k}``
    (``wflow_commit.json``, :func:`committed_length`); a sweep's store the tasks it finished
    (``wflow_sweep.json``, :mod:`wflow.sweep`).

    Examples
    --------
    >>> import tempfile, pathlib
    >>> from wflow.io import read_commit, write_commit
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> write_commit(folder, {"length": 3})
    >>> read_commit(folder), sorted(p.name for p in folder.iterdir())
    ({'length': 3}, ['wflow_commit.json'])
    """
    folder = Path(folder)
    tmp = folder / (name + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(record, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, folder / name)
    _fsync_dir(folder)


def read_commit(
    folder: str | os.PathLike,
    decode: Callable[[Any], Any] | None = None,
    *,
    name: str = COMMIT,
    default: Any = None,
) -> Any:
    """A store's commit record ``folder / name`` (:func:`write_commit`), passed through ``decode``.

    Returns ``default`` when there is no record (nothing committed yet) and ``decode(record)``
    (the parsed JSON itself when ``decode`` is None) otherwise.  A record that is not JSON, or
    that ``decode`` rejects (``ValueError``, ``KeyError``, ``TypeError``), is a
    :class:`~wflow.errors.WflowError` naming the store and the record.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> from wflow.io import read_commit, write_commit
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> read_commit(folder, default=0)
    0
    >>> write_commit(folder, {"length": 3})
    >>> read_commit(folder, lambda record: int(record["length"]))
    3
    >>> try:
    ...     read_commit(folder, lambda record: record["done"])
    ... except Exception as exc:
    ...     print(type(exc).__name__, str(exc).endswith("unreadable commit record wflow_commit.json: 'done'"))
    WflowError True
    """
    folder = Path(folder)
    p = folder / name
    if not p.exists():
        return default
    try:
        record = json.loads(p.read_text())
        return record if decode is None else decode(record)
    except (ValueError, KeyError, TypeError) as exc:
        raise WflowError(f"{folder}: unreadable commit record {name}: {exc}") from None


#: what a damaged store's error says to do
_REPAIR = "`wflow repair {p}` (wflow.io.repair) keeps its sound snapshots, then --resume continues"


def _write_commit(path: Path, length: int, chain: str | None = None) -> None:
    record: dict[str, Any] = {"length": int(length)}
    if chain is not None:
        record["chain"] = chain
    write_commit(path, record)


# ------------------------------------------------------------------------------ snapshot digests
# Zarr's CRC32C codec checks that a chunk's bytes are intact, not that they are the chunk of this
# variable and snapshot: a chunk copied over another passes it.  So each committed snapshot also
# has a line in DIGESTS with a digest of every one of its chunk files, keyed by the variable's
# name and the snapshot's index, and the commit record holds a hash chain over those lines.  A
# reader checks the chain up to the committed length, then every chunk against its line.
def _chunk_digest(name: str, index: int, data: bytes) -> str:
    import hashlib

    h = hashlib.blake2b(f"{name}\0{index}\0".encode(), digest_size=12)
    h.update(data)
    return h.hexdigest()


def _chain_next(chain: str, line: str) -> str:
    import hashlib

    return hashlib.blake2b((chain + line).encode(), digest_size=16).hexdigest()


def _snapshot_digests(store: Path, index: int, ndims: dict[str, int]) -> dict[str, str]:
    """The digest of every chunk file of snapshot ``index`` (``ndims``: the time variables' ranks)."""
    return {
        name: _chunk_digest(name, index, _chunk_path(store, name, index, nd).read_bytes())
        for name, nd in sorted(ndims.items())
    }


def _read_digest_lines(store: Path, length: int, chain: str) -> list[dict[str, str]]:
    """The digests of the first ``length`` snapshots, checked against the committed hash ``chain``."""
    p = store / DIGESTS
    try:
        lines = p.read_text().splitlines()[:length] if p.is_file() else []
    except (OSError, UnicodeDecodeError) as exc:
        raise WflowError(f"{store}: the digests {DIGESTS} cannot be read ({exc})") from None
    h = ""
    for line in lines:
        h = _chain_next(h, line)
    if len(lines) < length or h != chain:
        raise WflowError(
            f"{store}: the snapshot digests {DIGESTS} do not match the commit record "
            f"({len(lines)} lines for {length} committed snapshots): the store is damaged"
        )
    try:
        return [json.loads(line)["d"] for line in lines]
    except (ValueError, KeyError, TypeError) as exc:
        raise WflowError(f"{store}: unreadable line in {DIGESTS}: {exc}") from None


def _append_digest(store: Path, index: int, digests: dict[str, str], chain: str) -> str:
    """Write snapshot ``index``'s line (after the ``index`` lines of the committed snapshots, dropping any
    line an interrupted snapshot left), flushed to disk; returns the chain to commit with it."""
    line = json.dumps({"i": int(index), "d": digests}, sort_keys=True)
    p = store / DIGESTS
    keep = b""
    if index and p.is_file():
        keep = b"".join(p.read_bytes().splitlines(keepends=True)[:index])
    with open(p, "wb") as fh:
        fh.write(keep + line.encode() + b"\n")
        fh.flush()
        os.fsync(fh.fileno())
    return _chain_next(chain, line)


class FolderLock:
    """An exclusive OS lock (``fcntl.flock``) on a lock file: one writer per store or output folder.

    The lock belongs to the open file, so the operating system releases it when the process
    dies, however it dies; the file itself (holding the owner's PID) is left in place.  A
    second holder gets :class:`~wflow.errors.StoreBusyError` naming the path and the PID.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> from wflow.errors import StoreBusyError
    >>> from wflow.io import FolderLock
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "run.lock"
    >>> with FolderLock(path, "demo folder"):
    ...     try:
    ...         FolderLock(path, "demo folder").acquire()  # a second writer
    ...     except StoreBusyError:
    ...         print("busy")
    busy
    >>> FolderLock(path).acquire().release()  # free again once the first one is released
    """

    def __init__(self, path: str | os.PathLike, what: str | None = None):
        self.path = Path(path)
        self.what = what or str(self.path)
        self.fh: IO[str] | None = None

    def acquire(self) -> FolderLock:
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            owner = fh.read().strip() or "another process"
            fh.close()
            raise StoreBusyError(
                f"{self.what} is in use by {owner} (one writer at a time); wait for it to finish or "
                f"choose another output"
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"process {os.getpid()}")
        fh.flush()
        self.fh = fh
        return self

    def release(self) -> None:
        if self.fh is not None:
            import fcntl

            fcntl.flock(self.fh.fileno(), fcntl.LOCK_UN)
            self.fh.close()
            self.fh = None

    def __enter__(self) -> FolderLock:
        return self if self.fh is not None else self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def committed_length(path: str | os.PathLike) -> int:
    """The number of committed snapshots of a store (0 when none was committed).

    Examples
    --------
    >>> import wflow, tempfile, pathlib
    >>> from wflow.io import committed_length
    >>> traj = wflow.simulate(wflow.SA(2.0), wflow.sphere.uniform(8, 3, seed=0), 0.5, dt=0.1, backend="numpy")
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = wflow.save(traj, folder / "t.zarr")
    >>> committed_length(folder / "t.zarr"), committed_length(folder / "missing.zarr")
    (6, 0)
    """
    p = Path(path)
    length = read_commit(p, lambda record: int(record["length"]), default=None)
    on_disk = _stored_snapshots(p)
    if length is None:
        # a run killed before its first commit leaves snapshot 0 at most; more means a lost record
        if on_disk > 1:
            raise WflowError(
                f"{p}: the commit record {COMMIT} is missing but {on_disk} snapshot(s) are on disk: the "
                f"store is damaged; {_REPAIR.format(p=str(p))}"
            )
        return 0
    if not 0 <= length <= on_disk:
        raise WflowError(
            f"{p}: the commit record {COMMIT} says {length} snapshots, but {on_disk} are on disk: the "
            f"record is damaged; {_REPAIR.format(p=str(p))}"
        )
    return length


def _stored_snapshots(store: Path) -> int:
    """How many consecutive snapshots from 0 have their ``time`` chunk on disk."""
    k = 0
    while (store / "time" / "c" / str(k)).is_file():
        k += 1
    return k


def _flat_config(config: Any, prefix: str = "config") -> dict[str, Any]:
    """The configuration as attributes ``config.model.beta = 2.0``: every scalar (and short list of scalars)
    under its dotted path, so tools that do not parse JSON can filter stores; ``config`` (JSON) stays the
    exact record."""
    out: dict[str, Any] = {}
    if isinstance(config, dict):
        for k, v in config.items():
            out.update(_flat_config(v, f"{prefix}.{k}"))
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


def _attrs(kind: str, solver: str, config: dict[str, Any]) -> dict[str, Any]:
    return {
        "wflow_format": FORMAT,
        "wflow_version": __version__,
        "kind": kind,
        "solver": solver,
        "config": json.dumps(config),
        **_flat_config(config),
    }


#: the attribute that marks the index coordinates wflow adds for dimensions without one
COORDINATE_ROLE = "wflow_role"


def _index_coordinates(dims: set[str]) -> dict[str, dict[str, str]]:
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


def _check_replaceable(path: Path) -> None:
    """Refuse to replace anything but a wflow result store or an empty folder (overwrite=True)."""
    if path.is_dir() and not any(path.iterdir()):
        return
    if (path / COMMIT).is_file():
        return
    try:
        meta = json.loads((path / "zarr.json").read_text())
        if meta.get("attributes", {}).get("wflow_format") == FORMAT:
            return
    except (OSError, ValueError, AttributeError):
        pass
    raise ValueError(
        f"{path} is not a wflow result store; overwrite=True replaces only wflow's own stores "
        f"(or an empty folder): choose another path"
    )


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
        Replace an existing store; otherwise an existing store is an error.
    attrs : dict, optional
        Further JSON-serializable attributes of the store (``wflow run`` records its flat
        configuration as ``run_config``).

    Examples
    --------
    >>> import wflow, tempfile, pathlib
    >>> from wflow.io import ZarrRecorder, committed_length
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "t.zarr"
    >>> traj = wflow.simulate(wflow.SA(2.0), wflow.sphere.uniform(8, 3, seed=0), 0.5, dt=0.1, backend="numpy",
    ...                       writer=ZarrRecorder(path))
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
        elif self.path.exists() and not overwrite:
            raise FileExistsError(
                f"{self.path} exists; pass overwrite=True (CLI: choose another --out, --resume "
                f"or --overwrite)"
            )
        elif self.path.exists():
            _check_replaceable(self.path)
        self.overwrite = overwrite
        self.count = 0
        self.group = None
        self._arrays: dict[str, Any] = {}
        self._chain: str | None = ""  # the hash chain of the snapshot digests committed so far

    # -- tracker protocol -----------------------------------------------------------
    def start(self, run) -> None:
        zarr = _zarr()
        self.lock = FolderLock(
            self.path.with_name(self.path.name + ".lock"), f"store {self.path}"
        ).acquire()
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
            group.attrs.update(_attrs(self.kind, self.solver, self.config))
            record = read_commit(self.path, default={})
            self._chain = record.get("chain")  # None: a store written before the digests
            if self._chain is not None:  # checked: the continuation extends a sound chain
                _read_digest_lines(self.path, committed_length(self.path), self._chain)
        else:
            # created at the first snapshot, when the shapes are known; a store it replaces is removed
            # then too, so that a run refused by the driver's checks (or failing before its first
            # save) leaves the old one in place
            self.group = None

    def save(self, snap) -> None:
        if self.group is None:
            self._create(snap)
        i = snap.index
        for name, (dims, value) in self._variables(snap).items():
            arr = self._arrays.get(name)
            if arr is None:
                raise WflowError(
                    f"{self.path}: variable {name!r} is not in the store; it was written by another "
                    f"configuration"
                )
            arr[i] = value
        if self._chain is not None:
            ndims = {name: arr.ndim for name, arr in self._arrays.items() if _is_snapshot(arr)}
            digests = _snapshot_digests(self.path, i, ndims)
            self._chain = _append_digest(self.path, i, digests, self._chain if i else "")
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
        for k in _STATS:
            out[k] = ((), np.int64(snap.stats[k]))
        out["dt_next"] = ((), np.float64(snap.control.get("dt_next", np.nan)))
        out.update(
            {_CHECKPOINT + k: (dims, np.asarray(v)) for k, (dims, v) in snap.checkpoint.items()}
        )
        return out

    def _create(self, snap) -> None:
        zarr = _zarr()
        if self.path.exists():  # (overwrite=True: checked when the recorder was made)
            shutil.rmtree(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        group = zarr.open_group(
            self.path,
            mode="w",
            zarr_format=3,
            attributes={**_attrs(self.kind, self.solver, self.config), **self.extra_attrs},
        )
        codecs = _codecs()
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
                attributes=VARIABLE_ATTRS.get(name, {}),
            )
        sizes: dict[str, int] = {}
        for name, (dims, value) in self.static.items():
            value = np.asarray(value)
            sizes.update(zip(dims, value.shape))
            arr = group.create_array(
                name,
                shape=value.shape,
                chunks=value.shape or None,
                dtype=value.dtype,
                compressors=codecs,
                dimension_names=tuple(dims),
                config={"write_empty_chunks": True},
                attributes=VARIABLE_ATTRS.get(name, {}),
            )
            arr[...] = value
        for name, (dims, value) in self._variables(snap).items():
            sizes.update(zip(dims, np.shape(value)))
        # every dimension gets a coordinate (xarray: ds.sel(particle=3)); marked so that reading skips them
        for dim, attrs in _index_coordinates(
            set(sizes) - set(self._arrays) - set(self.static)
        ).items():
            arr = group.create_array(
                dim,
                shape=(sizes[dim],),
                chunks=(max(sizes[dim], 1),),
                dtype=np.int64,
                compressors=codecs,
                dimension_names=(dim,),
                attributes=attrs,
                config={"write_empty_chunks": True},
            )
            arr[...] = np.arange(sizes[dim])
        with (
            warnings.catch_warnings()
        ):  # zarr notes that consolidated metadata is not in the v3 spec (yet)
            warnings.simplefilter("ignore", UserWarning)
            zarr.consolidate_metadata(self.path)
        self.group = group


# ------------------------------------------------------------------------------ reading
def _chunk_path(store: Path, name: str, index: int, ndim: int) -> Path:
    return store.joinpath(name, "c", str(index), *(["0"] * (ndim - 1)))


def _is_snapshot(arr) -> bool:
    """Whether a store's array has one chunk per snapshot (a leading ``time`` axis)."""
    return tuple(arr.metadata.dimension_names or ())[:1] == ("time",)


def _open_result(p: Path):
    """The root group of the wflow result store ``p`` and its attributes (checked: a wflow store)."""
    zarr = _zarr()
    if not p.exists():
        raise FileNotFoundError(f"no wflow result at {p}")
    if not (p / "zarr.json").is_file():
        raise WflowError(
            f"{p} is not a wflow result store: it has no zarr.json ("
            + (
                "a file, not a store folder)"
                if p.is_file()
                else "not a Zarr store, or its root metadata is lost)"
            )
        )
    try:
        group = zarr.open_group(p, mode="r")
        attrs = dict(group.attrs)
    except Exception as exc:  # noqa: BLE001 - any failure of the storage layer is reported with the path
        raise WflowError(
            f"cannot read {p} as a wflow result (Zarr store): {type(exc).__name__}: {exc}"
        ) from None
    if attrs.get("wflow_format") != FORMAT:
        raise WflowError(
            f"{p} is not a wflow result store (wflow_format={attrs.get('wflow_format')!r}, "
            f"expected {FORMAT!r})"
        )
    return group, attrs


def store_attrs(path: str | os.PathLike) -> dict[str, Any]:
    """The attributes of a wflow result store (its kind, solver, configuration, ``run_config``, ...).

    Raises ``FileNotFoundError`` without a store at ``path`` and :class:`~wflow.errors.WflowError`
    for one that is not a wflow store.

    Examples
    --------
    >>> import wflow, tempfile, pathlib
    >>> traj = wflow.simulate(wflow.SA(2.0), wflow.sphere.uniform(8, 3, seed=0), 0.5, dt=0.1, backend="numpy")
    >>> store_attrs(wflow.save(traj, pathlib.Path(tempfile.mkdtemp()) / "t.zarr"))["kind"]
    'particles'
    """
    return _open_result(Path(path))[1]


def read_store(path: str | os.PathLike, *, recover: bool = False) -> dict[str, Any]:
    """Read a store's committed snapshots as plain arrays, verifying every chunk.

    Returns a dict with ``kind``, ``solver``, ``config``, ``times``, ``data``
    (``name -> (dims, array)``, leading time axis), ``static``, ``stats`` (incl. ``dt_next``),
    ``checkpoint`` (the solver's resume variables, each with a time axis) and ``length``.

    Every chunk of a committed snapshot must be a file whose bytes are those committed for
    that variable and snapshot (a digest keyed by both, :data:`DIGESTS`) and pass its CRC32C
    checksum; the commit record's length must lie between 0 and the snapshots on disk.

    Parameters
    ----------
    path : str or Path
        The store.
    recover : bool
        Instead of raising on a damaged store, return the longest run of sound snapshots from
        the first one on; ``recovered`` then says how many were kept, how many the commit
        record claimed and why the next one was dropped (:func:`repair` makes that the
        committed length, so the run can be resumed).

    Raises
    ------
    FileNotFoundError
        No store at ``path``.
    WflowError
        Not a wflow store, no committed snapshot, or (unless ``recover``) a damaged one: a
        missing or inconsistent commit record, a chunk that is missing, not a file, not the one
        committed in its place, or that fails its checksum (the message names the store, the
        variable and the snapshot).

    Examples
    --------
    >>> import wflow, tempfile, pathlib
    >>> from wflow.io import read_store
    >>> traj = wflow.simulate(wflow.SA(2.0), wflow.sphere.uniform(8, 3, seed=0), 0.5, dt=0.1, backend="numpy")
    >>> stored = read_store(wflow.save(traj, pathlib.Path(tempfile.mkdtemp()) / "t.zarr"))
    >>> stored["kind"], stored["length"], stored["data"]["points"][1].shape
    ('particles', 6, (6, 8, 3))
    """
    p = Path(path)
    group, attrs = _open_result(p)
    try:
        config = json.loads(attrs["config"])
    except (KeyError, json.JSONDecodeError) as exc:
        raise WflowError(f"{p}: no readable 'config' attribute: {exc}") from None
    arrays = [(name, arr) for name, arr in group.arrays() if _is_snapshot(arr)]
    if recover:
        length, recovered = _sound_prefix(p, arrays)
    else:
        length, recovered = _checked_length(p, arrays), None
    if length == 0:
        raise WflowError(
            f"{p} holds no committed snapshot (the run stopped before its first save); start it afresh"
            if recovered is None
            else f"{p}: no snapshot can be recovered ({recovered['reason']})"
        )
    out: dict[str, Any] = {
        "kind": attrs["kind"],
        "solver": attrs["solver"],
        "config": config,
        "data": {},
        "static": {},
        "stats": {},
        "checkpoint": {},
        "length": length,
        "recovered": recovered,
    }
    for name, arr in group.arrays():
        dims = tuple(arr.metadata.dimension_names or ())
        if _is_snapshot(arr):
            try:
                value = arr[:length]
            except Exception:  # noqa: BLE001 - a checksum or decompression failure: find the snapshot
                i = next((i for i in range(length) if _unreadable(arr, i)), None)
                raise WflowError(
                    f"{p}: variable {name!r} snapshot {i}: the chunk fails its checksum or cannot be "
                    f"decompressed: the store is damaged; {_REPAIR.format(p=str(p))}"
                ) from None
            if name == "time":
                out["times"] = np.asarray(value, dtype=np.float64)
            elif name in _STATS or name == "dt_next":
                out["stats"][name] = np.asarray(value)
            elif name.startswith(_CHECKPOINT):
                out["checkpoint"][name[len(_CHECKPOINT) :]] = (dims[1:], np.asarray(value))
            else:
                out["data"][name] = (dims[1:], np.asarray(value))
        elif arr.attrs.get(COORDINATE_ROLE) == "index":
            continue
        else:
            try:
                out["static"][name] = (dims, np.asarray(arr[...]))
            except Exception as exc:  # noqa: BLE001
                raise WflowError(
                    f"{p}: variable {name!r} cannot be read ({type(exc).__name__}: {exc})"
                ) from None
    return out


def _unreadable(arr, i: int) -> bool:
    try:
        arr[i]
        return False
    except Exception:  # noqa: BLE001
        return True


def _snapshot_fault(p: Path, i: int, arrays, digests: dict[str, str] | None) -> str | None:
    """Why snapshot ``i`` is not sound (naming the variable), or None: each chunk a file, and the one
    committed in its place when its digest is known."""
    for name, arr in arrays:
        f = _chunk_path(p, name, i, arr.ndim)
        if not f.exists():
            return f"variable {name!r} has no data for snapshot {i}"
        if not f.is_file():
            return f"variable {name!r} snapshot {i}: its chunk {f} is not a file"
        if digests is not None and digests.get(name) != _chunk_digest(name, i, f.read_bytes()):
            return (
                f"variable {name!r} snapshot {i}: its chunk is not the one committed there "
                f"(damaged, or another chunk copied into its place)"
            )
    return None


def _checked_length(p: Path, arrays) -> int:
    """The committed length, every committed snapshot checked (:func:`_snapshot_fault`)."""
    length = committed_length(p)
    chain = read_commit(p, default={}).get("chain")
    lines = _read_digest_lines(p, length, chain) if chain is not None else None
    for i in range(length):
        why = _snapshot_fault(p, i, arrays, lines[i] if lines is not None else None)
        if why is not None:
            raise WflowError(f"{p}: {why}: the store is damaged; {_REPAIR.format(p=str(p))}")
    return length


def _sound_prefix(p: Path, arrays) -> tuple[int, dict[str, Any]]:
    """The longest run of sound snapshots from 0 (committed or not), and a report of what was kept."""
    try:
        record = read_commit(p, default=None)
        claimed = int(record["length"]) if record is not None else None
    except (WflowError, KeyError, TypeError, ValueError):
        record, claimed = None, None
    on_disk = _stored_snapshots(p)
    limit = claimed if claimed is not None and 0 <= claimed <= on_disk else on_disk
    lines: list[dict[str, str]] | None = None
    if record is not None and record.get("chain") is not None and claimed == limit:
        try:
            lines = _read_digest_lines(p, limit, record["chain"])
        except WflowError:
            lines = None  # the digests cannot be trusted: checksums alone decide
    k, reason = 0, ""
    while k < limit:
        why = _snapshot_fault(p, k, arrays, lines[k] if lines is not None else None)
        if why is None and any(_unreadable(arr, k) for _, arr in arrays):
            bad = next(name for name, arr in arrays if _unreadable(arr, k))
            why = f"variable {bad!r} snapshot {k}: the chunk fails its checksum"
        if why is not None:
            reason = why
            break
        k += 1
    if not reason:
        if claimed is None or limit != claimed:
            reason = f"the commit record is missing or damaged (it claims {claimed}); {k} sound snapshots on disk"
        else:
            reason = f"all {k} committed snapshots are sound" + (
                f" ({on_disk - k} later ones were never committed)" if on_disk > k else ""
            )
    return k, {"kept": k, "claimed": claimed, "on_disk": on_disk, "reason": reason}


def repair(path: str | os.PathLike) -> dict[str, Any]:
    """Make the sound snapshots of a damaged store its committed ones, so that it loads and resumes.

    The longest run of sound snapshots from the first one on (:func:`read_store` with
    ``recover=True``) becomes the committed length; their digests are written afresh and the
    commit record replaced atomically.  Nothing is deleted: chunks beyond the new length are
    overwritten when the run is resumed.  Returns the report (``kept``, ``claimed``,
    ``on_disk``, ``reason``).

    Examples
    --------
    >>> import wflow, tempfile, pathlib
    >>> from wflow.io import COMMIT, repair
    >>> traj = wflow.simulate(wflow.SA(2.0), wflow.sphere.uniform(8, 3, seed=0), 0.5, dt=0.1, backend="numpy")
    >>> path = wflow.save(traj, pathlib.Path(tempfile.mkdtemp()) / "t.zarr")
    >>> (path / COMMIT).unlink()             # the commit record is lost
    >>> repair(path)["kept"], len(wflow.load(path))
    (6, 6)
    """
    p = Path(path)
    group, _ = _open_result(p)
    arrays = [(name, arr) for name, arr in group.arrays() if _is_snapshot(arr)]
    lock = FolderLock(p.with_name(p.name + ".lock"), f"store {p}").acquire()
    try:
        length, report = _sound_prefix(p, arrays)
        chain = ""
        ndims = {name: arr.ndim for name, arr in arrays}
        for i in range(length):
            chain = _append_digest(p, i, _snapshot_digests(p, i, ndims), chain)
        if length == 0:
            (p / DIGESTS).unlink(missing_ok=True)
        _write_commit(p, length, chain)
    finally:
        lock.release()
    log.info("repaired %s: %s", p, report)
    return report


# ------------------------------------------------------------------------------ datasets
def result_dataset(result):
    """A :class:`~wflow.solvers.base.Result` as an :class:`xarray.Dataset` (the store's layout).

    Examples
    --------
    >>> import wflow
    >>> from wflow.io import result_dataset
    >>> traj = wflow.simulate(wflow.SA(2.0), wflow.sphere.uniform(8, 3, seed=0), 0.5, dt=0.1, backend="numpy")
    >>> ds = result_dataset(traj)
    >>> ds.points.dims, ds.points.shape, ds.attrs["kind"]
    (('time', 'particle', 'coord'), (6, 8, 3), 'particles')
    """
    import xarray as xr

    data = {name: (("time",) + tuple(dims), arr) for name, (dims, arr) in result.data.items()}
    for k, v in result.stats.items():
        data[k] = (("time",), np.asarray(v))
    data.update({name: (tuple(dims), arr) for name, (dims, arr) in result.static.items()})
    data = {k: (*v, VARIABLE_ATTRS.get(k, {})) for k, v in data.items()}
    sizes = {d: n for dims, arr, _ in data.values() for d, n in zip(dims, np.shape(arr))}
    coords = {"time": ("time", np.asarray(result.times, dtype=np.float64), VARIABLE_ATTRS["time"])}
    for dim, attrs in _index_coordinates(set(sizes) - set(data)).items():
        coords[dim] = (dim, np.arange(sizes[dim]), attrs)
    return xr.Dataset(data, coords=coords, attrs=_attrs(result.kind, result.solver, result.config))


def write_result(result, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Write a whole result to a store (the same layout and commit record as a recorded run).

    Examples
    --------
    >>> import wflow, tempfile, pathlib
    >>> from wflow.io import write_result
    >>> traj = wflow.simulate(wflow.SA(2.0), wflow.sphere.uniform(8, 3, seed=0), 0.5, dt=0.1, backend="numpy")
    >>> path = write_result(traj, pathlib.Path(tempfile.mkdtemp()) / "t.zarr")
    >>> back = wflow.load(path)
    >>> type(back).__name__, bool((back.points == traj.points).all())
    ('Trajectory', True)
    """
    p = Path(path)
    rec = ZarrRecorder(p, overwrite=overwrite)
    run = SimpleNamespace(
        save_times=result.times,
        problem=SimpleNamespace(kind=result.kind),
        solver=SimpleNamespace(name=result.solver),
        config=result.config,
        static=result.static,
    )
    rec.start(run)
    try:
        _write_all(rec, result)
    finally:
        rec.close()
    return p


def _write_all(rec: ZarrRecorder, result) -> None:
    k = len(result.times)
    dt_next = result.stats.get("dt_next", np.full(k, np.nan))
    for i in range(k):
        if i == k - 1:
            checkpoint = result.checkpoint
        else:  # only the last snapshot's solver state is known in memory
            checkpoint = {
                n: (d, np.full(np.shape(a), np.nan)) for n, (d, a) in result.checkpoint.items()
            }
        rec.save(
            SimpleNamespace(
                index=i,
                t=float(result.times[i]),
                data={n: (d, a[i]) for n, (d, a) in result.data.items()},
                stats={s: int(result.stats[s][i]) for s in _STATS},
                control={"dt_next": float(dt_next[i])},
                checkpoint=checkpoint,
            )
        )
