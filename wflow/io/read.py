"""Reading a store back: its attributes, its committed snapshots (every chunk verified), repair.

:func:`result_dataset` and :func:`write_result` give an in-memory result the store's layout.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from ..errors import WflowError
from .commit import (
    FORMAT,
    REPAIR_HINT,
    FolderLock,
    chunk_digest,
    chunk_path,
    commit_length,
    committed_length,
    digest_line,
    import_zarr,
    is_snapshot,
    read_commit,
    read_digest_lines,
    refuse_special_metadata,
    snapshot_digests,
    stored_snapshots,
    write_digests,
)
from .paths import refuse_special_file
from .recorder import (
    CHECKPOINT_PREFIX,
    COORDINATE_ROLE,
    STATS,
    VARIABLE_ATTRS,
    ZarrRecorder,
    cell_coordinates,
    index_coordinates,
    store_attributes,
    variable_attributes,
)

log = logging.getLogger("wflow.io")


def _open_result(p: Path):
    """The root group of the wflow result store ``p`` and its attributes (checked: a wflow store)."""
    zarr = import_zarr()
    if not p.exists():
        raise FileNotFoundError(f"no wflow result at {p}")
    if p.is_dir():  # a FIFO in place of its metadata is refused, never waited on
        refuse_special_metadata(p)
    if not (p / "zarr.json").is_file():
        why = (
            "a file, not a store folder"
            if p.is_file()
            else "not a Zarr store, or its root metadata is lost"
        )
        raise WflowError(f"{p} is not a wflow result store: it has no zarr.json ({why})")
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

    Parameters
    ----------
    path : str or Path
        The store.
    recover : bool
        Instead of raising on a damaged store, return the longest run of sound snapshots from the
        first one on; ``recovered`` then says how many were kept, how many the commit record
        claimed and why the next one was dropped (:func:`repair`).

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
    arrays = [(name, arr) for name, arr in group.arrays() if is_snapshot(arr)]
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
        if is_snapshot(arr):
            try:
                value = arr[:length]
            except Exception:  # noqa: BLE001 - a checksum or decompression failure: find the snapshot
                i = next((i for i in range(length) if _unreadable(arr, i)), None)
                raise WflowError(
                    f"{p}: variable {name!r} snapshot {i}: the chunk fails its checksum or cannot be "
                    f"decompressed: the store is damaged; {REPAIR_HINT.format(p=str(p))}"
                ) from None
            if name == "time":
                out["times"] = np.asarray(value, dtype=np.float64)
            elif name in STATS or name == "dt_next":
                out["stats"][name] = np.asarray(value)
            elif name.startswith(CHECKPOINT_PREFIX):
                out["checkpoint"][name[len(CHECKPOINT_PREFIX) :]] = (dims[1:], np.asarray(value))
            else:
                out["data"][name] = (dims[1:], np.asarray(value))
        elif arr.attrs.get(COORDINATE_ROLE) in ("index", "cell-coordinate"):
            continue
        else:
            _refuse_special_chunks(p / name)  # (a FIFO there would block Zarr's read)
            try:
                out["static"][name] = (dims, np.asarray(arr[...]))
            except Exception as exc:  # noqa: BLE001
                raise WflowError(
                    f"{p}: variable {name!r} cannot be read ({type(exc).__name__}: {exc})"
                ) from None
    return out


def _refuse_special_chunks(folder: Path) -> None:
    """Refuse (``ValueError``) a FIFO, socket or device among the chunk files of the array ``folder``."""
    for root, _, names in os.walk(folder / "c"):
        for name in names:
            refuse_special_file(Path(root) / name)


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
        f = chunk_path(p, name, i, arr.ndim)
        if not f.exists():
            return f"variable {name!r} has no data for snapshot {i}"
        if not f.is_file():
            return f"variable {name!r} snapshot {i}: its chunk {f} is not a file"
        if digests is not None and digests.get(name) != chunk_digest(name, i, f.read_bytes()):
            return (
                f"variable {name!r} snapshot {i}: its chunk is not the one committed there "
                f"(damaged, or another chunk copied into its place)"
            )
    return None


def _checked_length(p: Path, arrays) -> int:
    """The committed length, every committed snapshot checked (:func:`_snapshot_fault`)."""
    length = committed_length(p)
    chain = read_commit(p, default={}).get("chain")
    lines = read_digest_lines(p, length, chain) if chain is not None else None
    for i in range(length):
        why = _snapshot_fault(p, i, arrays, lines[i] if lines is not None else None)
        if why is not None:
            raise WflowError(f"{p}: {why}: the store is damaged; {REPAIR_HINT.format(p=str(p))}")
    return length


def _sound_prefix(p: Path, arrays) -> tuple[int, dict[str, Any]]:
    """The longest run of sound snapshots from 0 (committed or not), and a report of what was kept."""
    try:
        record = read_commit(p, default=None)
        claimed = int(record["length"]) if record is not None else None
    except (WflowError, KeyError, TypeError, ValueError):
        record, claimed = None, None
    on_disk = stored_snapshots(p)
    limit = claimed if claimed is not None and 0 <= claimed <= on_disk else on_disk
    lines: list[dict[str, str]] | None = None
    if record is not None and record.get("chain") is not None and claimed == limit:
        try:
            lines = read_digest_lines(p, limit, record["chain"])
        except WflowError:
            lines = None  # the digests cannot be trusted: checksums alone decide
    k, reason = 0, ""
    while k < limit:
        why = _snapshot_fault(p, k, arrays, lines[k] if lines is not None else None)
        bad = None if why else next((n for n, arr in arrays if _unreadable(arr, k)), None)
        if bad is not None:
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

    The longest run of sound snapshots from the first one on becomes the committed length, their
    digests written afresh.  Nothing is deleted (a resumed run overwrites the chunks beyond).
    Returns the report (``kept``, ``claimed``, ``on_disk``, ``reason``).

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
    arrays = [(name, arr) for name, arr in group.arrays() if is_snapshot(arr)]
    with FolderLock(p.with_name(p.name + ".lock"), f"store {p}"):
        length, report = _sound_prefix(p, arrays)
        ndims = {name: arr.ndim for name, arr in arrays}
        lines = [digest_line(i, snapshot_digests(p, i, ndims)) for i in range(length)]
        chain = write_digests(p, lines)  # (the old file stays until the new one is complete)
        commit_length(p, length, chain)
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
    data = {k: (*v, variable_attributes(k, result.config)) for k, v in data.items()}
    sizes = {d: n for dims, arr, _ in data.values() for d, n in zip(dims, np.shape(arr))}
    coords = {"time": ("time", np.asarray(result.times, dtype=np.float64), VARIABLE_ATTRS["time"])}
    for dim, attrs in index_coordinates(set(sizes) - set(data)).items():
        coords[dim] = (dim, np.arange(sizes[dim]), attrs)
    coords.update(cell_coordinates(result.static))
    return xr.Dataset(
        data, coords=coords, attrs=store_attributes(result.kind, result.solver, result.config)
    )


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
    # a run stopped early (by a tracker, or failed) is stored with room for every save time it was
    # configured with, as its recorder would have: wflow.resume continues it into the same store
    times = np.asarray(result.times, dtype=np.float64)
    planned = np.asarray(result.config.get("save_at", times), dtype=np.float64).reshape(-1)
    if not (len(planned) >= len(times) and np.array_equal(planned[: len(times)], times)):
        planned = times
    run = SimpleNamespace(
        save_times=planned,
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
                stats={s: int(result.stats[s][i]) for s in STATS},
                control={"dt_next": float(dt_next[i])},
                checkpoint=checkpoint,
            )
        )
