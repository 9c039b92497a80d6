"""Worker threads for the compiled kernels: one persistent pool, BLAS limited inside the workers,
and the split of a batch of systems into chunks and shares.

The kernels that run many small systems release the GIL and run in Python worker threads, one per
core, each taking whole chunks of systems, with BLAS limited to one thread inside them (OpenBLAS
splitting each small GEMM over the cores is far slower).
"""

from __future__ import annotations

import threading

import numba

__all__ = [
    "executor",
    "parallel",
    "blas_threads",
    "num_threads",
    "chunk_bounds",
    "shares",
    "run_chunks",
]

_EXECUTOR = None
_EXECUTOR_SIZE = 0
_EXECUTOR_LOCK = threading.Lock()
_BLAS_CONTROLLER = None


def executor(threads: int):
    """A persistent pool of at least ``threads`` threads; it only grows (a replaced pool finishes the
    tasks it holds)."""
    global _EXECUTOR, _EXECUTOR_SIZE
    with _EXECUTOR_LOCK:
        if _EXECUTOR is None or _EXECUTOR_SIZE < threads:
            from concurrent.futures import ThreadPoolExecutor

            old = _EXECUTOR
            _EXECUTOR = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="wflow-blas")
            _EXECUTOR_SIZE = threads
            if old is not None:
                old.shutdown(wait=False)
        return _EXECUTOR


def parallel(work, workers: int) -> None:
    """``work(t)`` for t = 0..workers-1 at once: t = 0 in the calling thread, the others on :func:`executor`'s
    pool.  Returns when every share has finished; raises the first error, the caller's own first."""
    if workers <= 1:
        if workers == 1:
            work(0)
        return
    from concurrent.futures import wait

    pool = executor(workers)
    futures = []
    try:
        for t in range(1, workers):
            futures.append(pool.submit(work, t))
        work(0)
    finally:
        wait(futures)
    for f in futures:
        f.result()


def blas_threads(n: int):
    """Limit BLAS to ``n`` threads inside a ``with`` block (threadpoolctl; no-op without it)."""
    global _BLAS_CONTROLLER
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # pragma: no cover - threadpoolctl is a dependency
        import contextlib

        return contextlib.nullcontext()
    if _BLAS_CONTROLLER is None:
        _BLAS_CONTROLLER = ThreadpoolController()
    return _BLAS_CONTROLLER.limit(limits=n, user_api="blas")


def chunk_bounds(B: int, per_system: int, threads: int, target: int) -> list[tuple[int, int]]:
    """Contiguous chunks of systems of about ``target`` work each, at least ``2 * threads`` of them."""
    size = max(1, min(target // max(1, per_system), -(-B // (2 * threads))))
    return [(b0, min(B, b0 + size)) for b0 in range(0, B, size)]


def shares(B: int, workers: int) -> list[tuple[int, int]]:
    """At most ``workers`` contiguous shares of B systems, of equal size but the last (one call of a
    compiled pass per worker)."""
    per = -(-B // max(1, workers)) if B else 1
    return [(b0, min(B, b0 + per)) for b0 in range(0, B, per)]


def num_threads() -> int:
    """The worker threads to use: numba's thread count."""
    return max(1, numba.get_num_threads())


def run_chunks(work, threads: int, n_chunks: int) -> None:
    """``work(t)`` for t = 0..threads-1 (worker t takes chunks t, t + threads, ...), in the calling
    thread when there is one worker or one chunk."""
    if threads == 1 or n_chunks == 1:
        for t in range(threads):  # (with one chunk, workers t > 0 have nothing to do)
            work(t)
    else:
        parallel(work, min(threads, n_chunks))
