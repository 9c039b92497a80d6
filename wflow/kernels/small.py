r"""Kernel sums for batches of tiny systems (the phase-diagram regime: thousands of systems of n <= 256).

For each system :math:`b` of a batch, with :math:`a = \beta Q x`, :math:`b = K y`, values
:math:`c = V y`:

.. math::

    L = a\, b^\top + \log w, \qquad c_i = \max_j L_{ij}, \qquad
    E_{ij} = e^{\max(L_{ij} - c_i,\ \text{floor})}, \qquad
    s^0_i = \sum_j E_{ij}, \qquad s^1 = E\, c,

i.e. exactly what PyTorch's ``bmm`` + ``softmax`` + ``bmm`` computes, with the shift kept.
Three steps per chunk of systems, in worker threads (one per core) that each take whole
chunks: a batched GEMM for the logits, one compiled pass for the row maxima, the
exponentials (:func:`~wflow.kernels.numba_backend._exp64`/``_exp32``: polynomial, vectorized)
and the row sums, and a batched GEMM for the values.  BLAS runs single-threaded inside
the workers: OpenBLAS splitting each 32 x 32 GEMM over the cores of a small shared machine
was measured 10--70x slower than one thread per GEMM (d = 1024, 256 systems: 0.2--2 s
against 30 ms).  :func:`bmm` exposes that batched GEMM for other callers (diagnostics).

float32: the logits are formed in float32 (SGEMM) only when their rounding error is
provably small, :math:`2^{-24}\big((p+2)\max|a|\max|b| + 2\,\mathrm{span}\log w\big) \le 3\cdot
10^{-6}` (as the direct route of the numba backend decides); otherwise in float64 (DGEMM on
upcast operands).  Exponentials and the value GEMM run in float32 either way; row sums are
accumulated in float64.
"""
from __future__ import annotations

import math

import numpy as np

from . import numba_backend as _nb

__all__ = ["bmm", "small_sums", "SMALL_MAX", "CHUNK_PAIRS"]

#: Largest n and m (per system) of the tiny-systems route.
SMALL_MAX = 256
#: Pairs (i, j) per chunk of systems handed to one worker (logits of a chunk stay in L2).
CHUNK_PAIRS = 1 << 15
#: Below this many multiply-adds a batched GEMM is not split over threads.
_SPLIT_MIN_FLOPS = 1 << 20


def _chunk_bounds(B: int, per_system: int, threads: int, target: int) -> list[tuple[int, int]]:
    """Contiguous chunks of systems of about ``target`` work each, at least ``2 * threads`` of them."""
    size = max(1, min(target // max(1, per_system), -(-B // (2 * threads))))
    return [(b0, min(B, b0 + size)) for b0 in range(0, B, size)]


def _threads() -> int:
    if _nb.numba is not None:
        return max(1, _nb.numba.get_num_threads())
    import os

    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def bmm(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    r"""Batched matrix product ``a @ b`` of shapes ``(B, n, k) @ (B, k, m) -> (B, n, m)``, fast for many small matrices.

    The batch is split into contiguous chunks, one worker thread per core, each calling
    NumPy's ``matmul`` with BLAS limited to one thread.  Same numbers as ``np.matmul``
    (each matrix is one GEMM call either way).

    Examples
    --------
    >>> a = np.arange(8.0).reshape(2, 2, 2)
    >>> bmm(a, a).tolist()
    [[[2.0, 3.0], [6.0, 11.0]], [[46.0, 55.0], [66.0, 79.0]]]
    """
    B, n, k = a.shape
    m = b.shape[-1]
    if out is None:
        out = np.empty((B, n, m), dtype=np.result_type(a, b))
    threads = _threads()
    if threads == 1 or B < 2 or B * n * m * k < _SPLIT_MIN_FLOPS:
        with _nb._blas_threads(1):
            return np.matmul(a, b, out=out)
    chunks = _chunk_bounds(B, n * m * k, threads, 1 << 22)

    def work(t: int) -> None:
        for b0, b1 in chunks[t::threads]:
            np.matmul(a[b0:b1], b[b0:b1], out=out[b0:b1])

    with _nb._blas_threads(1):
        list(_nb._executor(threads).map(work, range(min(threads, len(chunks)))))
    return out


if _nb.numba is not None:
    from numba import njit

    @njit(cache=True, nogil=True, fastmath=_nb._FM_SUM)
    def _softmax_rows(L, lw, E, shift, mass, fl, zero):  # pragma: no cover - compiled
        """L (C, n, m) logits (float64, or float32 when accurate enough), lw (C, m) log-weights
        in L's dtype, fl the exponent floor in L's dtype; writes E (C, n, m) = e^(L + lw - c) in
        the dtype of zero, shift c (C, n) float64 (the exact row maximum) and mass (C, n) float64."""
        C, n, m = L.shape
        for k in range(C):
            lwk = lw[k]
            for i in range(n):
                Li = L[k, i]
                Ei = E[k, i]
                mx = Li[0] + lwk[0]
                for j in range(1, m):
                    mx = max(mx, Li[j] + lwk[j])
                t = 0.0
                for j in range(m):
                    v = _nb._exp_as(max(Li[j] + lwk[j] - mx, fl), zero)
                    Ei[j] = v
                    t += v
                shift[k, i] = mx
                mass[k, i] = t
else:  # pragma: no cover
    _softmax_rows = None


def _logits_in_float32(a: np.ndarray, b: np.ndarray, logw: np.ndarray, floor: float) -> tuple[bool, np.ndarray, np.ndarray]:
    """Whether float32 logits are accurate enough (module docstring), with log-weights relative to each system's maximum."""
    lw_max = np.max(logw, axis=1)
    lw_rel = logw - lw_max[:, None]
    sq = lambda z: float(np.max(np.einsum("...i,...i->...", z, z), initial=0.0))  # noqa: E731
    size = math.sqrt(sq(a) * sq(b)) * (1.0 + 1e-6)
    lw_span = float(np.max(-lw_rel[lw_rel > _nb._LOG_ZERO / 2], initial=0.0))
    p = a.shape[-1]
    ok = 2.0**-24 * ((p + 2) * size + 2.0 * min(lw_span, -floor)) <= _nb.LOWP_LOGIT_ERROR
    return ok, lw_rel, lw_max


def small_sums(a: np.ndarray, b: np.ndarray, logw: np.ndarray, c: np.ndarray | None, floor: float,
               zero) -> tuple[np.ndarray, np.ndarray]:
    r"""The tiny-systems route: ``(shift (B, n), acc (B, n, 1 + q))`` as the numba backend's other routes return.

    ``a`` (B, n, p) float64 (:math:`\beta Q x`), ``b`` (B, m, p) keys in the input dtype,
    ``logw`` (B, m) float64 finite, ``c`` (B, m, q) values or None, ``zero`` a scalar of the
    working dtype.
    """
    B, n, p = a.shape
    m = b.shape[1]
    wdt = type(zero)
    lw_max = None
    ldt = np.float64
    if wdt is np.float32:
        ok, lw_rel, lw_max = _logits_in_float32(a, b, logw, floor)
        if ok:
            ldt = np.float32
            logw = np.maximum(lw_rel, -3e38)
    a_l = a.astype(ldt, copy=False)
    bT = np.swapaxes(b, 1, 2)
    if bT.dtype != ldt:
        bT = bT.astype(ldt)
    lw_l = np.ascontiguousarray(logw, dtype=ldt)
    fl = ldt(floor)
    cw = None if c is None else c.astype(wdt, copy=False)
    q = 0 if cw is None else cw.shape[-1]
    shift = np.empty((B, n))
    acc = np.empty((B, n, q + 1))
    threads = _threads()
    chunks = _chunk_bounds(B, n * m, threads, CHUNK_PAIRS)

    def work(t: int) -> None:
        L = np.empty((chunks[0][1] - chunks[0][0], n, m), dtype=ldt)
        E = np.empty(L.shape, dtype=wdt) if wdt is not ldt else None
        mass = np.empty((L.shape[0], n))
        for b0, b1 in chunks[t::threads]:
            C = b1 - b0
            Lc = L[:C]
            np.matmul(a_l[b0:b1], bT[b0:b1], out=Lc)
            Ec = Lc if E is None else E[:C]
            _softmax_rows(Lc, lw_l[b0:b1], Ec, shift[b0:b1], mass[:C], fl, zero)
            acc[b0:b1, :, 0] = mass[:C]
            if q:
                acc[b0:b1, :, 1:] = np.matmul(Ec, cw[b0:b1])

    with _nb._blas_threads(1):
        if threads == 1 or len(chunks) == 1:
            for t in range(threads if len(chunks) > 1 else 1):
                work(t)
        else:
            list(_nb._executor(threads).map(work, range(min(threads, len(chunks)))))
    if lw_max is not None and ldt is np.float32:
        shift += lw_max[:, None]
    return shift, acc
