"""The output folder of ``wflow run``: which store it holds, what the run needs of the machine, and
what a fresh run or a resumed one may replace.

A run folder holds one store (:data:`STORE_NAMES`), the run's ``config.toml``, its figure
``summary.png`` (and ``animation.gif``) and, for JKO, ``steps.csv``.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import io
from ._version import __version__
from .config import STEP_LOG, current_config, to_toml
from .errors import WflowError, available_memory
from .io.commit import remove_store, store_files
from .io.paths import create_new
from .solvers.base import Tracker

__all__ = [
    "STORE_NAMES",
    "MARKER",
    "REPORT_MARKER",
    "RunFolder",
    "claim_report_folder",
    "estimate_resources",
    "check_resources",
]

#: the store a run of each kind of problem writes in its folder
STORE_NAMES = {
    "particles": "trajectory.zarr",
    "lagrangian": "trajectory.zarr",
    "eulerian": "density.zarr",
    "jko": "density.zarr",
    "zonal": "density.zarr",
}
#: the files beside the store that a run writes (and a fresh run replaces)
RUN_FILES = ("config.toml", STEP_LOG, "summary.png", "animation.gif")
#: the file that marks a folder as a wflow run folder: wflow writes or deletes only in marked folders
MARKER = ".wflow-run"
#: what a run leaves beside its files: the folder's and the store's locks
_LOCKS = (".wflow.lock", *(name + ".lock" for name in STORE_NAMES.values()))


def _is_regular(path: Path) -> bool:
    """Whether ``path`` is a regular file itself (not a link to one)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _mark(marker: Path, what: str) -> None:
    """Write the folder's ``marker`` file unless it is there (created anew: never through a link)."""
    if not _is_regular(marker):
        create_new(marker, json.dumps({"wflow": what, "version": __version__}).encode())


class RunFolder:
    """The folder ``--out`` of ``wflow run``.

    Examples
    --------
    >>> import tempfile
    >>> folder = RunFolder(tempfile.mkdtemp())
    >>> folder.store is None, folder.store_for({"problem": "jko"}).name
    (True, 'density.zarr')
    """

    def __init__(self, path: str | os.PathLike):
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"--out must be a folder name, got {path!r}")
        if not str(path).strip():
            raise ValueError(f"--out must name a folder, got {str(path)!r}")
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    @property
    def config_file(self) -> Path:
        """The run's ``config.toml``."""
        return self.path / "config.toml"

    @property
    def store(self) -> Path | None:
        """The store the folder holds, or ``None``."""
        for name in dict.fromkeys(STORE_NAMES.values()):
            if (self.path / name).exists():
                return self.path / name
        return None

    def store_for(self, cfg: dict[str, Any]) -> Path:
        """Where a run of the configuration ``cfg`` writes its store."""
        return self.path / STORE_NAMES[cfg["problem"]]

    def check_ours(self) -> None:
        """Refuse a folder wflow did not make: wflow writes and deletes only in a new or empty folder,
        or in one that carries its marker (:data:`MARKER`).  Writes nothing.

        A folder from before the marker, holding a wflow store and nothing but the files a run
        writes, counts as wflow's.
        """
        p = self.path
        try:
            if p.is_symlink() and not p.exists():
                raise ValueError(
                    f"--out {p} is a symbolic link to nothing ({os.readlink(p)}); wflow does not "
                    f"create folders through links: choose another --out"
                )
            if not p.exists():
                return
            if not p.is_dir():
                raise ValueError(f"--out {p} is a file, not a folder; choose a folder")
            if _is_regular(p / MARKER):
                return
            entries = sorted(os.listdir(p))
        except OSError as exc:
            raise ValueError(f"--out {p}: cannot read the folder ({exc.strerror or exc})") from None
        if not entries:
            return
        if set(entries) <= set(_LOCKS):  # a run that died before its first save, or one running now
            return
        ours = set(RUN_FILES) | set(STORE_NAMES.values()) | set(_LOCKS)
        if set(entries) <= ours and self._holds_a_wflow_store():
            return
        raise ValueError(
            f"--out {p} holds files wflow did not write ({_listing(entries)}); wflow writes only into a new or "
            f"empty folder or one of its own run folders: choose another --out"
        )

    def _holds_a_wflow_store(self) -> bool:
        store = self.store
        if store is None:
            return False
        try:
            io.store_attrs(store)
            return True
        except (OSError, WflowError):
            return False

    def lock(self) -> io.FolderLock:
        """Claim the folder for a run: checked to be wflow's (:meth:`check_ours`), created and marked,
        then locked for the whole run (one writer at a time).

        Raises ``ValueError`` (one line) for a folder that is not wflow's or that cannot be
        created or written, and :class:`~wflow.errors.StoreBusyError` while another run holds it.
        """
        self.check_ours()
        try:
            # a link or the user's file at a lock path: refused, nothing written
            for name in _LOCKS:
                io.FolderLock(self.path / name).check()
            self.path.mkdir(parents=True, exist_ok=True)
            lock = io.FolderLock(self.path / ".wflow.lock", f"output folder {self.path}").acquire()
        except OSError as exc:
            raise ValueError(
                f"--out {self.path}: cannot create or write the folder ({exc.strerror or exc})"
            ) from None
        try:  # marked once it is ours to write: a busy folder is left as it was
            _mark(self.path / MARKER, "run folder")
        except OSError as exc:
            lock.release()
            raise ValueError(
                f"--out {self.path}: cannot write the folder ({exc.strerror or exc})"
            ) from None
        return lock

    def replacing(self, cfg: dict[str, Any], existing: Path | None) -> Tracker:
        """A tracker, first in a fresh run's list, that replaces what an earlier run wrote here once the driver
        starts the run (every argument checked): the earlier store ``existing`` when the new one has another
        name, and the run's files, ``config.toml`` written anew.  Only what wflow wrote in the earlier store
        goes: anything else in it is refused (``ValueError`` naming it) now, before the run."""
        folder, new = self, self.store_for(cfg)
        replaced = existing if existing is not None and existing != new else None
        if replaced is not None:  # only what wflow wrote goes: anything else there is refused now
            store_files(replaced)

        class _Replace(Tracker):
            name = "run folder"

            def start(
                self, run
            ):  # the driver has checked every argument before it starts a tracker
                if replaced is not None:
                    remove_store(replaced)
                for name in RUN_FILES:
                    (folder.path / name).unlink(missing_ok=True)
                create_new(folder.config_file, to_toml(cfg).encode())

        return _Replace()

    def committed(self) -> int:
        """The number of committed snapshots of the folder's store (0 without a store)."""
        store = self.store
        return io.committed_length(store) if store is not None else 0

    def stored_config(self) -> dict[str, Any]:
        """The configuration the folder's store was written with (its ``run_config`` attribute), keys
        under their names now (:func:`~wflow.config.current_config`: a store of an earlier release resumes).

        Raises :class:`~wflow.errors.WflowError` for a store not written by ``wflow run``.
        """
        store = self.store
        if store is None:
            raise FileNotFoundError(f"no store in {self.path}")
        rc = io.store_attrs(store).get("run_config")
        if rc is None:
            raise WflowError(
                f"{store} was not written by `wflow run` (no run_config); resume it with wflow.resume()"
            )
        return current_config(json.loads(rc) if isinstance(rc, str) else rc)


# ------------------------------------------------------------------------------ report folders
#: the marker of a folder of validation reports (``wflow validate --out``)
REPORT_MARKER = ".wflow-validation"
_REPORT_SUFFIXES = (".md", ".csv", ".png", ".gif", ".json")


def _listing(entries: list[str]) -> str:
    """The first four of a folder's ``entries`` and how many more there are."""
    return ", ".join(entries[:4]) + (f" and {len(entries) - 4} more" if len(entries) > 4 else "")


def claim_report_folder(path: str | os.PathLike, studies: Sequence[str] = ()) -> Path:
    """Check that ``path`` may receive validation reports, then create and mark it; returns it.

    A report folder is new, empty, marked by :data:`REPORT_MARKER`, or (from before the marker)
    holds only reports (``.md``, ``.csv``, ``.png`` files) and ``parts/``, one of them the report
    of a study in ``studies``.  Anything else is refused (``ValueError``) with nothing written.
    """
    if not str(path).strip():
        raise ValueError(f"--out must name a folder, got {str(path)!r}")
    p = Path(path)
    try:
        if p.exists() and not p.is_dir():
            raise ValueError(f"--out {p} is a file, not a folder; choose a folder")
        entries = sorted(os.listdir(p)) if p.exists() else []
    except OSError as exc:
        raise ValueError(f"--out {p}: cannot read the folder ({exc.strerror or exc})") from None
    if entries and not _is_regular(p / REPORT_MARKER):
        reports = all(e == "parts" or e.endswith(_REPORT_SUFFIXES) for e in entries)
        if not (reports and any(f"{name}.md" in entries for name in studies)):
            raise ValueError(
                f"--out {p} holds files wflow did not write ({_listing(entries)}); reports go into a new or empty "
                f"folder or an earlier report folder: choose another --out"
            )
    try:
        p.mkdir(parents=True, exist_ok=True)
        _mark(p / REPORT_MARKER, "report folder")
    except OSError as exc:
        raise ValueError(
            f"--out {p}: cannot create or write the folder ({exc.strerror or exc})"
        ) from None
    return p


# ------------------------------------------------------------------------------ resources
def _gb(b: float) -> str:
    return f"{b / 2**30:.3g} GiB"


def estimate_resources(cfg: dict[str, Any]) -> tuple[float, float]:
    """``(memory, disk)`` in bytes a run of this configuration needs, roughly.

    Memory: the state with the solver's stages (about 12 copies for dopri5), the kernel sums'
    blocks (about 100 MB) and the save times; disk: every saved snapshot of the state.

    Examples
    --------
    >>> from wflow.config import default_config
    >>> mem, disk = estimate_resources(default_config())   # 2000 tokens on S^2, 31 saves
    >>> round(mem / 1e6), round(disk / 1e6, 2)
    (101, 2.49)
    """
    problem, d, saves = cfg["problem"], cfg["init.d"], cfg["save.n"]
    if problem == "particles":
        state = cfg["init.n"] * d * 8.0
    elif problem == "zonal":
        # bands, their geometry and the kernel's panel factors
        state = cfg["mesh.resolution"] * 8.0 * 64
    elif problem == "lagrangian":
        nodes = cfg["mesh.resolution"] * (1 if d == 2 else 2 * cfg["mesh.resolution"])
        state = nodes * (1 + 2 * (d - 1)) * d * 8.0
    else:
        cells = cfg["mesh.resolution"] if d == 2 else 10 * cfg["mesh.resolution"] ** 2 + 2
        state = cells * 8.0 * (50 if d == 3 else 4)  # mesh connectivity and geometry arrays
        if problem == "jko":
            state += 3 * cells * cells * 8.0  # dense cost matrix and kernel
    stored = state / 12 if problem == "jko" else state
    return 12 * state + 1e8 + 32.0 * saves, saves * stored + 1e6


def check_resources(cfg: dict[str, Any], out: str | os.PathLike) -> None:
    """Refuse a run whose estimated memory or disk (:func:`estimate_resources`) exceeds what the machine has.

    Examples
    --------
    >>> import tempfile
    >>> from wflow.config import apply_overrides, default_config
    >>> check_resources(default_config(), tempfile.mkdtemp())   # 2000 tokens: fine
    >>> check_resources(apply_overrides(default_config(), ["init.n=10000000000"]), tempfile.mkdtemp())
    Traceback (most recent call last):
    ...
    ValueError: config keys init.n = 10000000000, ...
    """
    mem, disk = estimate_resources(cfg)
    avail = available_memory()
    key = "init.n" if cfg["problem"] == "particles" else "mesh.resolution"
    if mem > 0.8 * avail:
        raise ValueError(
            f"config keys {key} = {cfg[key]}, save.n = {cfg['save.n']} need about "
            f"{_gb(mem)} of memory; {_gb(avail)} is available"
        )
    probe = Path(out)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        usage = shutil.disk_usage(probe)
    except OSError as exc:
        raise ValueError(f"--out {out}: cannot reach {probe} ({exc.strerror or exc})") from None
    free = usage.free
    if usage.total == 0:  # a pseudo file system (/proc, /sys): no disk to judge
        return
    if disk > free:
        raise ValueError(
            f"config keys {key} = {cfg[key]}, save.n = {cfg['save.n']} write about "
            f"{_gb(disk)} of snapshots; {_gb(free)} is free under {probe}"
        )
