"""The commit protocol of wflow's stores: the commit record, the snapshot digests, the lock.

A store is committed by atomically replacing a small JSON record (:func:`write_commit`); a
run's store records its committed length and a hash chain over one line of chunk digests per
snapshot (:data:`DIGESTS`), so that a chunk copied over another is found.  One writer holds a
store at a time (:class:`FolderLock`).  Nothing here knows a store's variables.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import os
import re
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ..errors import StoreBusyError, WflowError
from .paths import create_new, kind_of, open_regular, read_regular, special_file_error, write_all

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

    Written to a temporary file, ``fsync``-ed, renamed over the old one, the folder ``fsync``-ed: a
    process that dies at any instant leaves the old record or the new one, never a torn one.

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
    _replace_with(tmp, folder / name, json.dumps(record).encode())
    _fsync_dir(folder)


def _replace_with(tmp: Path, path: Path, data: bytes) -> None:
    """Replace ``path`` by a file holding ``data``, written whole to ``tmp`` first (never through a link)."""
    if os.path.lexists(tmp):  # what an interrupted commit left (a name of the store's own)
        os.unlink(tmp)
    create_new(tmp, data)
    os.replace(tmp, path)


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
    :class:`~wflow.errors.WflowError` naming the store and the record; a FIFO, socket or device
    in its place is refused (``ValueError`` naming it) without being waited on.

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
    data = read_regular(folder / name)  # (a FIFO there is refused, never waited on)
    if data is None:
        return default
    try:
        record = json.loads(data)
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
    h = hashlib.blake2b(f"{name}\0{index}\0".encode(), digest_size=12)
    h.update(data)
    return h.hexdigest()


def chain_next(chain: str, line: str) -> str:
    """The hash chain ``chain`` extended by one line of :data:`DIGESTS`."""
    return hashlib.blake2b((chain + line).encode(), digest_size=16).hexdigest()


def snapshot_digests(store: Path, index: int, ndims: dict[str, int]) -> dict[str, str]:
    """The digest of every chunk file of snapshot ``index`` (``ndims``: the time variables' ranks)."""
    return {
        name: chunk_digest(name, index, chunk_path(store, name, index, nd).read_bytes())
        for name, nd in sorted(ndims.items())
    }


def read_digest_lines(store: Path, length: int, chain: str) -> list[dict[str, str]]:
    """The digests of the first ``length`` snapshots, checked against the committed hash ``chain``."""
    try:
        data = read_regular(store / DIGESTS)
        lines = data.decode().splitlines()[:length] if data is not None else []
    except (OSError, UnicodeDecodeError) as exc:
        raise WflowError(f"{store}: the digests {DIGESTS} cannot be read ({exc})") from None
    if len(lines) < length or functools.reduce(chain_next, lines, "") != chain:
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
    data = read_regular(store / DIGESTS) if length else None
    if not data:
        return 0
    return sum(len(line) for line in data.splitlines(keepends=True)[:length])


def append_digest(store: Path, line: str, chain: str, end: int) -> tuple[str, int]:
    """Append one snapshot's digest ``line`` after the committed lines, which end at byte ``end``.

    Whatever an interrupted snapshot left after ``end`` is cut off first; the committed lines are
    never rewritten, so a process that dies here loses nothing committed.  The file is flushed to
    disk before this returns.  Returns the chain to commit with the line and the new end.
    """
    data = line.encode() + b"\n"
    fd = open_regular(store / DIGESTS, os.O_RDWR | os.O_CREAT)
    try:
        os.ftruncate(fd, end)
        write_all(fd, data, end)
        os.fsync(fd)
    finally:
        os.close(fd)
    return chain_next(chain, line), end + len(data)


def write_digests(store: Path, lines: list[str]) -> str:
    """Replace :data:`DIGESTS` by ``lines`` at once (a temporary file renamed over it); their chain."""
    data = b"".join(line.encode() + b"\n" for line in lines)
    _replace_with(store / (DIGESTS + ".tmp"), store / DIGESTS, data)
    return functools.reduce(chain_next, lines, "")


#: what wflow writes in a lock file: its owner's PID (nothing yet for the instant after creating it)
_LOCK_TEXT = re.compile(r"(process \d+)?")


def _make_folder(folder: Path) -> None:
    """``folder`` and its parents, made where missing; one that is a file (``/dev/null/x``) is refused,
    naming it, instead of "[Errno 17] File exists"."""
    for p in (folder, *folder.parents):
        if os.path.lexists(p):
            if not p.is_dir():
                raise ValueError(f"{p} is not a folder: nothing can be written under it")
            break
    folder.mkdir(parents=True, exist_ok=True)


class FolderLock:
    """An exclusive OS lock (``fcntl.flock``) on a lock file: one writer per store or output folder.

    The operating system releases the lock when its process dies; the file (the owner's PID) is
    left and the next writer takes it over.  A clean release removes the file while the path
    still names it.  A second holder gets :class:`~wflow.errors.StoreBusyError` naming the path
    and the PID.  A link, a special file, or a file that is not a wflow lock (anything but
    ``process N``) at the path is refused (``ValueError`` naming the path) and left as it is.

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
    >>> _ = path.write_text("my own notes")
    >>> FolderLock(path).acquire()
    Traceback (most recent call last):
    ...
    ValueError: .../run.lock is not a lock wflow wrote (it holds 'my own notes'); ...
    """

    def __init__(self, path: str | os.PathLike, what: str | None = None):
        self.path = Path(path)
        self.what = what or str(self.path)
        self.fd: int | None = None

    def check(self) -> FolderLock:
        """Refuse now (``ValueError``), without writing anything, a lock path :meth:`acquire` would refuse:
        a link, a special file, or a file that is not a wflow lock."""
        try:
            mode = os.lstat(self.path).st_mode
        except FileNotFoundError:
            return self
        if stat.S_ISLNK(mode) or not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            os.close(self._open())  # (raises: the same message as acquire)
        if stat.S_ISREG(mode):
            text = (read_regular(self.path) or b"")[:256].decode(errors="replace").strip()
            self._check_text(text)
        return self

    def _check_text(self, text: str) -> None:
        if not _LOCK_TEXT.fullmatch(text):
            raise ValueError(
                f"{self.path} is not a lock wflow wrote (it holds {text[:40]!r}); wflow neither "
                f"overwrites nor removes it: move it away or choose another path"
            )

    def _open(self) -> int:
        """A descriptor of the lock file, created if absent; never through a link, never a special file."""
        while True:
            try:
                mode = os.lstat(self.path).st_mode
            except FileNotFoundError:
                try:
                    return open_regular(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL)
                except FileExistsError:
                    continue  # created meanwhile by another writer: open theirs
            if stat.S_ISDIR(mode):
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(self.path))
            if stat.S_ISLNK(mode):
                raise ValueError(
                    f"{self.path} is a symbolic link; wflow does not follow links at its lock paths "
                    f"(nor writes where they point): remove the link or choose another path"
                )
            if not stat.S_ISREG(mode):
                raise special_file_error(self.path, mode)
            try:
                return open_regular(self.path, os.O_RDWR)
            except FileNotFoundError:
                continue  # released (removed) meanwhile: create it afresh

    def acquire(self) -> FolderLock:
        import fcntl

        _make_folder(self.path.parent)
        while True:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = _read_text(fd).strip() or "another process"
                os.close(fd)
                raise StoreBusyError(
                    f"{self.what} is in use by {owner} (one writer at a time); wait for it to finish "
                    f"or choose another output"
                ) from None
            if _names(self.path, fd):  # the file we locked must still be the one at the path
                break
            os.close(fd)
        text = _read_text(fd).strip()
        try:
            self._check_text(text)
        except ValueError:
            os.close(fd)  # (unlocks it)
            raise
        if text:  # a lock whose process died: its PID goes
            os.ftruncate(fd, 0)
        os.pwrite(fd, f"process {os.getpid()}".encode(), 0)
        self.fd = fd
        return self

    def release(self) -> None:
        """Remove the lock file (while still holding it, and only if the path still names it), then unlock."""
        if self.fd is not None:
            import fcntl

            if _names(self.path, self.fd):
                with contextlib.suppress(OSError):  # (a read-only folder keeps it: harmless)
                    os.unlink(self.path)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> FolderLock:
        return self if self.fd is not None else self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _read_text(fd: int) -> str:
    """The start of the file ``fd`` as text (a lock holds one short line)."""
    return os.pread(fd, 256, 0).decode(errors="replace")


def _names(path: Path, fd: int) -> bool:
    """Whether ``path`` names the open file ``fd`` (not a link, not another file put there)."""
    try:
        st, mine = os.lstat(path), os.fstat(fd)
    except OSError:
        return False
    return (st.st_ino, st.st_dev) == (mine.st_ino, mine.st_dev)


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


# ------------------------------------------------------------------------------ what a store holds
#: a temporary file Zarr was writing when its process died (``<name>.<uuid hex>.partial``)
_PARTIAL = re.compile(r".+\.[0-9a-f]{32}\.partial")
#: the records of a run's store (the commit record and the snapshot digests)
RUN_RECORDS = (COMMIT, DIGESTS)


def refuse_special_metadata(store: Path, records: Iterable[str] = RUN_RECORDS) -> None:
    """Refuse (``ValueError`` naming the path) a FIFO, socket or device in place of a store's metadata:
    its ``zarr.json``, its ``records`` and every array's ``zarr.json``.  Nothing is opened."""
    from .paths import refuse_special_file

    for name in ("zarr.json", *records):
        refuse_special_file(store / name)
    with os.scandir(store) as entries:
        for entry in entries:
            if entry.is_dir():  # (follows a link, as Zarr would)
                refuse_special_file(Path(entry.path) / "zarr.json")


def _json(path: Path) -> Any:
    """The JSON in ``path``, ``None`` when absent, a folder or not JSON (a special file: refused)."""
    try:
        data = read_regular(path)
    except IsADirectoryError:
        return None
    try:
        return json.loads(data) if data is not None else None
    except ValueError:  # (UnicodeDecodeError and JSONDecodeError are ValueErrors)
        return None


def store_files(path: str | os.PathLike, records: Iterable[str] = RUN_RECORDS) -> list[Path]:
    """Everything in the store ``path`` that wflow wrote, folders after their contents; refuse anything else.

    What wflow wrote is what the store's own record lists: its ``zarr.json``, the arrays its
    consolidated metadata names (their ``zarr.json``, chunk files and Zarr's half-written ones)
    and ``records`` (with their temporaries).  Anything else in the folder is refused with
    ``ValueError`` naming its path, before anything is touched; so is a ``path`` that is a link
    or not a wflow store.  An empty folder is one to remove; nothing at ``path`` gives ``[]``.
    """
    p = Path(path)
    try:
        mode = os.lstat(p).st_mode
    except FileNotFoundError:
        return []
    if stat.S_ISLNK(mode):
        raise ValueError(
            f"{p} is a symbolic link; wflow replaces only a store folder of its own, not what a "
            f"link points to: remove the link or choose another path"
        )
    if not stat.S_ISDIR(mode):
        raise ValueError(f"{p} is {kind_of(mode)}, not a store folder: choose another path")
    records = tuple(records)
    meta = _json(p / "zarr.json")
    attrs = meta.get("attributes") if isinstance(meta, dict) else None
    ours = isinstance(attrs, dict) and attrs.get("wflow_format") == FORMAT
    if not ours and any(os.path.lexists(p / r) for r in records):
        ours = True  # (a store whose root metadata is lost, with its commit record)
    if not ours:
        if not os.listdir(p):
            return [p]
        raise ValueError(
            f"{p} is not a wflow result store; overwrite=True replaces only wflow's own stores "
            f"(or an empty folder): choose another path"
        )
    listed = (meta or {}).get("consolidated_metadata") or {}
    arrays = {n for n in (listed.get("metadata") or {}) if "/" not in n} if listed else None
    files = ["zarr.json", *records, *(r + ".tmp" for r in records)]
    out: list[Path] = []
    for entry in sorted(os.listdir(p)):
        q = p / entry
        mode = _own_mode(q)
        if stat.S_ISREG(mode) and (entry in files or _PARTIAL.fullmatch(entry)):
            out.append(q)
        elif stat.S_ISDIR(mode) and (entry in arrays if arrays is not None else _is_array(q)):
            out += _array_files(q)
        else:
            raise _foreign(q, p)
    return [*out, p]


def _own_mode(q: Path) -> int:
    """``st_mode`` of ``q``, refusing a link or a special file in a store (``ValueError``)."""
    mode = os.lstat(q).st_mode
    if stat.S_ISLNK(mode) or not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise ValueError(
            f"{q} is {kind_of(mode)}; an overwrite removes only the files wflow wrote in a store "
            f"(none of them is a link or a special file): remove it or choose another path"
        )
    return mode


def _foreign(q: Path, store: Path) -> ValueError:
    return ValueError(
        f"{q}: wflow did not write it, and an overwrite removes only what wflow wrote in {store}: "
        f"move it out of the store, or choose another path"
    )


def _is_array(folder: Path) -> bool:
    meta = _json(folder / "zarr.json")
    return isinstance(meta, dict) and meta.get("node_type") == "array"


def _array_files(folder: Path) -> list[Path]:
    """An array's ``zarr.json`` and chunk files (``c/<i>/<j>...``), folders after their contents."""
    out: list[Path] = []
    for entry in sorted(os.listdir(folder)):
        q = folder / entry
        mode = _own_mode(q)
        if stat.S_ISREG(mode) and (entry == "zarr.json" or _PARTIAL.fullmatch(entry)):
            out.append(q)
        elif stat.S_ISDIR(mode) and entry == "c":
            out += _chunk_files(q, folder)
        else:
            raise _foreign(q, folder.parent)
    return [*out, folder]


def _chunk_files(folder: Path, array: Path) -> list[Path]:
    out: list[Path] = []
    for entry in sorted(os.listdir(folder)):
        q = folder / entry
        mode = _own_mode(q)
        if not (entry.isdigit() or (stat.S_ISREG(mode) and _PARTIAL.fullmatch(entry))):
            raise _foreign(q, array.parent)
        out += _chunk_files(q, array) if stat.S_ISDIR(mode) else [q]
    return [*out, folder]


def remove_store(path: str | os.PathLike, records: Iterable[str] = RUN_RECORDS) -> None:
    """Remove the store ``path``: only what wflow wrote there (:func:`store_files`, with the store's
    own ``records``), checked before anything is removed; nothing at ``path``: nothing to do.

    Examples
    --------
    >>> import wflow, tempfile, pathlib
    >>> from wflow.io import remove_store
    >>> traj = wflow.simulate(wflow.SA(2.0), wflow.sphere.uniform(8, 3, seed=0), 0.5, dt=0.1, backend="numpy")
    >>> path = wflow.save(traj, pathlib.Path(tempfile.mkdtemp()) / "t.zarr")
    >>> _ = (path / "notes.txt").write_text("mine")
    >>> remove_store(path)
    Traceback (most recent call last):
    ...
    ValueError: .../t.zarr/notes.txt: wflow did not write it, and an overwrite removes only what wflow wrote in ...
    >>> (path / "notes.txt").unlink()
    >>> remove_store(path); path.exists()
    False
    """
    for q in store_files(path, records):
        if q.is_dir() and not q.is_symlink():
            os.rmdir(q)
        else:
            os.unlink(q)
