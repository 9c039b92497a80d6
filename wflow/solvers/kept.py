"""Memory for the saves a run keeps (``keep=True``): one array per large variable, preallocated for
every save time, so that a save is one copy into place.

Fresh memory costs a page fault per 4 KiB page on first write, and on a virtual machine these
are slow: 839 MB of kept points (d = 8, 2048 systems of 32 tokens, 200 saves) took 0.3-1.2 s to
write into fresh memory on the 2-core development VM, against 0.05 s into memory already faulted
in -- as long as the 300 steps that produce them.  Three things bring that cost down:

* from 32 MB on, a buffer is an anonymous private memory map of its own, whose pages a thread
  faults in ahead of the saves (:func:`prefault`), beside the steps instead of between them;
* once the buffer's last view is dropped, the map goes to a thread of its own
  (:func:`release`), so that the caller does not wait for its pages to be returned;
* that thread keeps the map for :data:`RETAIN_S` seconds, its pages marked free for the kernel to
  take back whenever it needs memory (``MADV_FREE``), and a later run that needs a buffer of the
  same size takes it back (:func:`kept_buffer`): a loop of runs that drops each result faults its
  buffers in once.  A general-purpose allocator does the same with freed memory (jemalloc keeps
  its dirty pages for 10 s); the memory a process reports may include the maps waiting there.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import threading
import time
import weakref

import numpy as np

__all__ = ["kept_buffer", "prefault", "release", "MAPPED_BYTES", "RETAIN_S"]


#: kept buffers of at least this many bytes are anonymous memory maps rather than ``np.empty``
MAPPED_BYTES = 1 << 25

#: how long a dropped buffer's map waits for a run that needs one of its size before it is unmapped
RETAIN_S = 10.0

#: at most this many dropped maps wait; the oldest is unmapped first
RETAIN_MAX = 4

#: Linux's madvise advice: free the pages lazily (4.5 on), fault pages in writable (5.14 on)
_MADV_FREE, _MADV_POPULATE_WRITE = 8, 23

#: the pages :func:`prefault` faults in per call, front to back
_PREFAULT_CHUNK = 1 << 24


def _madvise(region: mmap.mmap, advice: int) -> bool:
    """``madvise(advice)`` over the whole map, ``_PREFAULT_CHUNK`` bytes per call, front to back,
    without the GIL (a foreign call releases it; ``mmap.madvise`` does not): whether the kernel took
    the advice.  Not on Linux: False."""
    if not sys.platform.startswith("linux"):
        return False
    try:  # (the view holds the map while it works)
        buf = (ctypes.c_char * len(region)).from_buffer(region)
    except (ValueError, TypeError):  # closed meanwhile
        return False
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        addr, size = ctypes.addressof(buf), len(buf)
        for start in range(0, size, _PREFAULT_CHUNK):
            if madvise(addr + start, min(_PREFAULT_CHUNK, size - start), advice):
                return False
        return True
    finally:
        del buf


def prefault(region: mmap.mmap) -> threading.Thread | None:
    """Fault the pages of an anonymous map in on a thread of their own, front to back, and return
    the thread (``None`` where the kernel cannot: not Linux).

    ``MADV_POPULATE_WRITE`` faults a range in with one call, without touching what is already
    written, so it may run while the saves are written, beside the steps.  The default call on the
    workload above went from 2.0-2.2 s to 1.5-1.6 s on the 2-core development VM.  A kernel that
    does not know the advice (before 5.14) refuses the first call and the pages are faulted on first
    write, as before.
    """
    if not sys.platform.startswith("linux"):
        return None
    thread = threading.Thread(
        target=_madvise, args=(region, _MADV_POPULATE_WRITE), name="wflow-prefault", daemon=True
    )
    thread.start()
    return thread


class _Maps:
    """The dropped maps of this process and the thread that tends them: each is marked free, waits
    for reuse, then is unmapped."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.dropped: list[mmap.mmap] = []  # not yet marked free
        self.waiting: list[tuple[float, mmap.mmap]] = []  # (unmap after, map), oldest first
        threading.Thread(target=self.tend, name="wflow-unmap", daemon=True).start()

    def drop(self, region: mmap.mmap) -> None:
        with self.cond:
            self.dropped.append(region)
            self.cond.notify()

    def take(self, nbytes: int) -> mmap.mmap | None:
        """A dropped map of ``nbytes`` bytes (the most recent), no longer the thread's; else None
        (always when :data:`RETAIN_S` is 0).  One the thread is marking free is neither dropped nor
        waiting: a run takes a map only before or after the kernel's advice, so what it writes
        stays."""
        if RETAIN_S <= 0:
            return None
        with self.cond:
            for i in range(len(self.dropped) - 1, -1, -1):
                if len(self.dropped[i]) == nbytes:
                    return self.dropped.pop(i)
            for i in range(len(self.waiting) - 1, -1, -1):
                if len(self.waiting[i][1]) == nbytes:
                    return self.waiting.pop(i)[1]
        return None

    def tend(self) -> None:
        while True:
            with self.cond:
                while not self.dropped:
                    due = min((w[0] for w in self.waiting), default=None)
                    if due is not None and due <= time.monotonic():
                        break
                    self.cond.wait(None if due is None else due - time.monotonic())
                region = self.dropped.pop(0) if self.dropped else None
            done = []
            if region is not None and RETAIN_S > 0 and _madvise(region, _MADV_FREE):
                with self.cond:
                    self.waiting.append((time.monotonic() + RETAIN_S, region))
            elif region is not None:
                done.append(region)
            with self.cond:
                now = time.monotonic()
                done += [r for t, r in self.waiting if t <= now]
                self.waiting = [w for w in self.waiting if w[0] > now]
                while len(self.waiting) > RETAIN_MAX:
                    done.append(self.waiting.pop(0)[1])
            for region in done:
                _unmap(region)
            del region, done


def _unmap(region: mmap.mmap) -> None:
    """Close ``region`` (``mmap.close`` releases the GIL): at once, or once the dropped array's
    hold on it ends, which its deallocation finishes shortly after the finalizer runs; a map still
    held after a second is unmapped when its last holder goes."""
    for _ in range(100):
        try:
            region.close()
            return
        except BufferError:
            time.sleep(0.01)


_MAPS: _Maps | None = None
_MAPS_LOCK = threading.Lock()


def _maps() -> _Maps:
    """This process's :class:`_Maps`, started on first use (in a forked child, anew:
    :func:`_forget_after_fork`)."""
    global _MAPS
    with _MAPS_LOCK:
        if _MAPS is None:
            _MAPS = _Maps()
        return _MAPS


def _forget_after_fork() -> None:
    """A forked child has no thread of its parent's and may have inherited a held lock: it starts
    its own :class:`_Maps` (the parent's waiting maps, copies in the child, go with the old one)."""
    global _MAPS, _MAPS_LOCK
    _MAPS, _MAPS_LOCK = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def release(region: mmap.mmap) -> None:
    """Hand a kept buffer's map to the thread that keeps it for reuse, then unmaps it (its array
    has just been dropped).  Unmapping returns every page to the kernel: 0.18-0.21 s for 855 MB on
    the development VM, which the caller that drops a trajectory would otherwise wait for."""
    _maps().drop(region)


def kept_buffer(name: str, capacity: int, arr: np.ndarray) -> np.ndarray:
    """An empty array for ``capacity`` saves of ``arr``; a size the machine cannot hold is a
    ``MemoryError`` that says what to pass instead.

    From :data:`MAPPED_BYTES` on the array lives in an anonymous private map of its own (a waiting
    one of the same size where there is one), freed to the thread of :func:`release` when its last
    view goes.  ``np.empty`` asks the kernel for transparent huge pages on large arrays, and where
    the kernel compacts memory to find them on first touch (``defrag = madvise``, the common
    default) writing the saves stalls: on the development VM 839 MB of kept points took 1.6-1.9 s
    to fill through ``np.empty`` in four of twelve fresh processes and 0.36-0.47 s through a plain
    map in all twelve.  A private map faults in faster than a shared one (0.35-0.37 s against
    0.55-0.58 s there).
    """
    shape, need = (capacity, *arr.shape), capacity * arr.nbytes
    try:
        if need < MAPPED_BYTES:
            return np.empty(shape, arr.dtype)
        region = _maps().take(need)
        if region is None:
            private = getattr(mmap, "MAP_PRIVATE", None)
            region = mmap.mmap(-1, need) if private is None else mmap.mmap(-1, need, flags=private)
        prefault(region)  # (pages the kernel took back from a waiting map are faulted in again)
        buf = np.frombuffer(region, arr.dtype)
        weakref.finalize(buf, release, region).atexit = False
        return buf.reshape(shape)
    except (MemoryError, OSError, OverflowError):
        raise MemoryError(
            f"keeping {capacity} saves of {name!r} (shape {arr.shape}, {arr.dtype}) needs "
            f"{need / 2**30:.3g} GiB, more than this machine can allocate: pass keep=False with a "
            "writer (wflow.io.ZarrRecorder) to hold the saves on disk, or fewer save times"
        ) from None
