"""The commit protocol of wflow's stores: the commit record, the snapshot digests, the lock.

A store is committed by atomically replacing a small JSON record (:func:`write_commit`,
:func:`read_commit`); a run's store records its committed length (:func:`commit_length`,
:func:`committed_length`) and a hash chain over one line of chunk digests per snapshot
(:data:`DIGESTS`), so that a chunk copied over another is found.  One writer holds a store
at a time (:class:`FolderLock`).  :mod:`wflow.sweep` commits its own store with the same
functions.  Nothing here knows a store's variables: :mod:`wflow.io.recorder` writes them,
:mod:`wflow.io.read` reads them back.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from ..errors import StoreBusyError, WflowError

FORMAT = "wflow.result/2"
COMMIT = "wflow_commit.json"
#: one line per snapshot: the digest of each of its chunks, keyed by variable and snapshot
DIGESTS = "wflow_digests.jsonl"

#: what a damaged store's error says to do
REPAIR_HINT = (
    "`wflow repair {p}` (wflow.io.repair) keeps its sound snapshots, then --resume continues"
)


def import_zarr():
    """The ``zarr`` module, imported when a store is first opened (not when wflow is)."""
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
    zarr = import_zarr()
    return (zarr.codecs.ZstdCodec(level=1), zarr.codecs.Crc32cCodec())


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


def commit_length(path: Path, length: int, chain: str | None = None) -> None:
    """Commit the first ``length`` snapshots of a run's store (with the digests' hash ``chain``)."""
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
def chunk_digest(name: str, index: int, data: bytes) -> str:
    """The digest of a chunk file's bytes ``data``, keyed by its variable ``name`` and snapshot ``index``."""
    import hashlib

    h = hashlib.blake2b(f"{name}\0{index}\0".encode(), digest_size=12)
    h.update(data)
    return h.hexdigest()


def chain_next(chain: str, line: str) -> str:
    """The hash chain ``chain`` extended by one line of :data:`DIGESTS`."""
    import hashlib

    return hashlib.blake2b((chain + line).encode(), digest_size=16).hexdigest()


def snapshot_digests(store: Path, index: int, ndims: dict[str, int]) -> dict[str, str]:
    """The digest of every chunk file of snapshot ``index`` (``ndims``: the time variables' ranks)."""
    return {
        name: chunk_digest(name, index, chunk_path(store, name, index, nd).read_bytes())
        for name, nd in sorted(ndims.items())
    }


def read_digest_lines(store: Path, length: int, chain: str) -> list[dict[str, str]]:
    """The digests of the first ``length`` snapshots, checked against the committed hash ``chain``."""
    p = store / DIGESTS
    try:
        lines = p.read_text().splitlines()[:length] if p.is_file() else []
    except (OSError, UnicodeDecodeError) as exc:
        raise WflowError(f"{store}: the digests {DIGESTS} cannot be read ({exc})") from None
    h = ""
    for line in lines:
        h = chain_next(h, line)
    if len(lines) < length or h != chain:
        raise WflowError(
            f"{store}: the snapshot digests {DIGESTS} do not match the commit record "
            f"({len(lines)} lines for {length} committed snapshots): the store is damaged"
        )
    try:
        return [json.loads(line)["d"] for line in lines]
    except (ValueError, KeyError, TypeError) as exc:
        raise WflowError(f"{store}: unreadable line in {DIGESTS}: {exc}") from None


def digest_line(index: int, digests: dict[str, str]) -> str:
    """Snapshot ``index``'s line of :data:`DIGESTS` (without its newline)."""
    return json.dumps({"i": int(index), "d": digests}, sort_keys=True)


def digest_end(store: Path, length: int) -> int:
    """The byte offset where the lines of the first ``length`` snapshots end in :data:`DIGESTS`."""
    p = store / DIGESTS
    if not length or not p.is_file():
        return 0
    return sum(len(line) for line in p.read_bytes().splitlines(keepends=True)[:length])


def append_digest(store: Path, line: str, chain: str, end: int) -> tuple[str, int]:
    """Append one snapshot's digest ``line`` after the committed lines, which end at byte ``end``.

    Whatever an interrupted snapshot left after ``end`` is cut off first; the committed lines are
    never rewritten, so a process that dies here loses nothing committed.  The file is flushed to
    disk before this returns.  Returns the chain to commit with the line and the new end.
    """
    data = line.encode() + b"\n"
    fd = os.open(store / DIGESTS, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, end)
        os.lseek(fd, end, os.SEEK_SET)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    return chain_next(chain, line), end + len(data)


def write_digests(store: Path, lines: list[str]) -> str:
    """Replace :data:`DIGESTS` by ``lines`` at once (a temporary file renamed over it); their chain."""
    tmp = store / (DIGESTS + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(b"".join(line.encode() + b"\n" for line in lines))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, store / DIGESTS)
    chain = ""
    for line in lines:
        chain = chain_next(chain, line)
    return chain


class FolderLock:
    """An exclusive OS lock (``fcntl.flock``) on a lock file: one writer per store or output folder.

    The lock belongs to the open file, so the operating system releases it when the process
    dies, however it dies; the file (holding the owner's PID) is then left in place, and the
    next writer takes it over.  A clean release removes the file.  A second holder gets
    :class:`~wflow.errors.StoreBusyError` naming the path and the PID.  A writer that locked a
    file which a release removed meanwhile notices (the path no longer names its file) and
    locks afresh, so two writers never both hold the lock.

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
        while True:
            fh = open(self.path, "a+")
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                fh.seek(0)
                owner = fh.read().strip() or "another process"
                fh.close()
                raise StoreBusyError(
                    f"{self.what} is in use by {owner} (one writer at a time); wait for it to finish "
                    f"or choose another output"
                ) from None
            try:  # the file we locked must still be the one at the path (a release removes it)
                same = os.stat(self.path).st_ino == os.fstat(fh.fileno()).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            fh.close()
        fh.seek(0)
        fh.truncate()
        fh.write(f"process {os.getpid()}")
        fh.flush()
        self.fh = fh
        return self

    def release(self) -> None:
        """Remove the lock file (while still holding it), then unlock."""
        if self.fh is not None:
            import fcntl

            with contextlib.suppress(OSError):  # (a read-only folder keeps it: harmless)
                os.unlink(self.path)
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
    on_disk = stored_snapshots(p)
    if length is None:
        # a run killed before its first commit leaves snapshot 0 at most; more means a lost record
        if on_disk > 1:
            raise WflowError(
                f"{p}: the commit record {COMMIT} is missing but {on_disk} snapshot(s) are on disk: the "
                f"store is damaged; {REPAIR_HINT.format(p=str(p))}"
            )
        return 0
    if not 0 <= length <= on_disk:
        raise WflowError(
            f"{p}: the commit record {COMMIT} says {length} snapshots, but {on_disk} are on disk: the "
            f"record is damaged; {REPAIR_HINT.format(p=str(p))}"
        )
    return length


def stored_snapshots(store: Path) -> int:
    """How many consecutive snapshots from 0 have their ``time`` chunk on disk."""
    k = 0
    while (store / "time" / "c" / str(k)).is_file():
        k += 1
    return k


def chunk_path(store: Path, name: str, index: int, ndim: int) -> Path:
    """The file of variable ``name``'s chunk of snapshot ``index`` (``ndim``: the variable's rank)."""
    return store.joinpath(name, "c", str(index), *(["0"] * (ndim - 1)))


def is_snapshot(arr) -> bool:
    """Whether a store's array has one chunk per snapshot (a leading ``time`` axis)."""
    return tuple(arr.metadata.dimension_names or ())[:1] == ("time",)
