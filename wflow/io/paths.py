"""The files wflow reads and writes beside and inside its stores: never special files, never through links.

wflow reads only regular files: a FIFO, socket or device in place of one
(:func:`refuse_special_file`, :func:`read_regular`) is refused in one line, never opened in a
way that waits.  It creates files only where nothing is (:func:`create_new`, without following
a symbolic link), and a figure beside a store only where none is or where the one there carries
wflow's mark (:func:`write_figure`).  :func:`wflow.io.remove_store` removes only what a store's
own record lists.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

#: what a path that is not a regular file is, in words
_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFLNK: "a symbolic link",
    stat.S_IFDIR: "a folder",
}
_SPECIAL = (stat.S_IFIFO, stat.S_IFSOCK, stat.S_IFCHR, stat.S_IFBLK)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def kind_of(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, in words (``"a FIFO"``, ``"a regular file"``, ...)."""
    return _KINDS.get(stat.S_IFMT(mode), "a regular file")


def special_file_error(path: str | os.PathLike, mode: int) -> ValueError:
    """The one-line refusal of a path that is ``mode`` (a FIFO, socket, device or link), not a regular file."""
    return ValueError(
        f"{path} is {kind_of(mode)}, not a regular file; wflow neither reads nor replaces it: "
        f"remove it or choose another path"
    )


def refuse_special_file(path: str | os.PathLike) -> None:
    """Refuse (``ValueError``) a FIFO, socket or device at ``path`` (a link is followed); else nothing.

    Nothing is opened: a FIFO is never waited on.

    Examples
    --------
    >>> import os, tempfile, pathlib
    >>> fifo = pathlib.Path(tempfile.mkdtemp()) / "config.toml"
    >>> os.mkfifo(fifo)
    >>> refuse_special_file(fifo)
    Traceback (most recent call last):
    ...
    ValueError: .../config.toml is a FIFO, not a regular file; wflow neither reads nor replaces it: ...
    >>> refuse_special_file(fifo.with_name("absent.toml"))   # nothing there: nothing to refuse
    """
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # nothing there (or unreachable): the caller's own open says so
    if stat.S_IFMT(mode) in _SPECIAL:
        raise special_file_error(path, mode)


def read_regular(path: str | os.PathLike) -> bytes | None:
    """The bytes of the regular file at ``path`` (a link is followed), ``None`` when nothing is there.

    A FIFO, socket or device is refused (``ValueError``) without waiting: it is checked before it
    is opened and opened without blocking, so one swapped in meanwhile is refused too.
    """
    refuse_special_file(path)
    try:
        fd = os.open(path, os.O_RDONLY | _NONBLOCK | _CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(mode):
            raise special_file_error(path, mode)
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def create_new(path: str | os.PathLike, data: bytes) -> None:
    """Create the file ``path`` holding ``data``: never over anything there, never through a link.

    Raises ``FileExistsError`` when anything (a file, a folder, a link, even a dangling one) is
    at ``path``.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o644)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes, offset: int | None = None) -> None:
    """Write all of ``data`` to ``fd`` (at ``offset`` when given, else where the file stands)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view) if offset is None else os.pwrite(fd, view, offset)
        view = view[n:]
        offset = None if offset is None else offset + n


def open_regular(path: str | os.PathLike, flags: int) -> int:
    """``os.open`` of a regular file with ``flags``, never through a link nor waiting on a special file.

    A link or a special file at ``path`` is refused (``ValueError``); a folder is
    ``IsADirectoryError``; nothing there is ``FileNotFoundError`` unless ``flags`` create it.
    """
    try:
        fd = os.open(path, flags | _NOFOLLOW | _NONBLOCK | _CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EMLINK):
            raise special_file_error(path, os.lstat(path).st_mode) from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        raise special_file_error(path, mode)
    return fd


# ------------------------------------------------------------------------------ figures
_PNG = b"\x89PNG\r\n\x1a\n"
#: the text key of the PNG chunk that marks a figure as written by wflow
FIGURE_MARK = b"wflow"


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    import zlib

    crc = zlib.crc32(kind + data).to_bytes(4, "big")
    return len(data).to_bytes(4, "big") + kind + data + crc


def mark_png(data: bytes, what: str) -> bytes:
    """The PNG ``data`` with a text chunk ``wflow = what`` right after its header, which marks it as
    wflow's (near the start: a figure torn while it was written over still carries it)."""
    end = len(_PNG) + 25  # the signature, then the IHDR chunk (13 bytes of data)
    if not data.startswith(_PNG) or data[len(_PNG) + 4 : len(_PNG) + 8] != b"IHDR":
        raise ValueError("mark_png expects a PNG file")
    return data[:end] + _png_chunk(b"tEXt", FIGURE_MARK + b"\0" + what.encode()) + data[end:]


def png_is_wflows(data: bytes) -> bool:
    """Whether the PNG ``data`` carries wflow's mark (:func:`mark_png`).

    Examples
    --------
    >>> png = _PNG + _png_chunk(b"IHDR", bytes(13)) + _png_chunk(b"IEND", b"")
    >>> png_is_wflows(png), png_is_wflows(mark_png(png, "sweep figure"))
    (False, True)
    """
    if not data.startswith(_PNG):
        return False
    i = len(_PNG)
    while i + 8 <= len(data):
        n, kind = int.from_bytes(data[i : i + 4], "big"), data[i + 4 : i + 8]
        if kind == b"tEXt" and data[i + 8 : i + 8 + n].partition(b"\0")[0] == FIGURE_MARK:
            return True
        i += 12 + n
    return False


def write_figure(path: str | os.PathLike, png: bytes, what: str) -> None:
    """Write the PNG ``png`` at ``path``, marked as wflow's ``what``: only where nothing is, or over a
    figure that carries wflow's mark; anything else there (the user's figure, a link, a special file)
    is refused (``ValueError`` naming the path) and left as it is."""
    p = Path(path)
    try:
        mode = os.lstat(p).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        raise ValueError(f"{p} is {kind_of(mode)}; wflow writes its figure only over its own")
    data = mark_png(png, what)
    if mode is None:
        create_new(p, data)
        return
    fd = open_regular(p, os.O_RDWR)
    try:
        old = b"".join(iter(lambda: os.read(fd, 1 << 20), b""))
        if not png_is_wflows(old):
            raise ValueError(f"{p} exists and was not written by wflow; it is left as it is")
        write_all(fd, data, 0)  # over the old figure, then cut: its start always carries the mark
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)
