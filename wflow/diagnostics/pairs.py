r"""Pair counts: the fraction of token pairs above a cosine, the observable of the GLPR phase diagram."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ..kernels import small
from ..kernels.dense import BLOCKED_MAX_R, GRAM_BLOCK, count_off_diagonal, gram_blocked, mm
from ..kernels.jit import FM_SUM, scratch
from ..kernels.small import bmm
from ..kernels.threads import blas_threads, chunk_bounds, num_threads, parallel, run_chunks, shares
from .batch import as_batch, batch_chunks

__all__ = ["pair_fraction", "pair_counts", "PAIR_COUNTS_FUSED_MAX_DIM"]

#: The largest dimension r for which :func:`pair_counts` forms each Gram matrix in one compiled pass.
PAIR_COUNTS_FUSED_MAX_DIM = 24


def pair_fraction(points, cos_threshold: float = 0.999) -> np.ndarray:
    r"""Fraction of token pairs whose inner product exceeds ``cos_threshold``, per system.

    .. math::

        f = \frac{1}{n(n-1)} \#\{(i, j) : i \ne j,\ \langle x_i, x_j\rangle > c\}

    the observable of the phase diagram of Geshkovski, Letrouit, Polyanskiy and Rigollet
    (2024) (:math:`c = 0.999`): 1 once the tokens have collapsed to one point.

    Parameters
    ----------
    points : array_like, shape (..., n, d)
        Leading axes are independent systems.
    cos_threshold : float
        The cosine :math:`c`.

    Returns
    -------
    ndarray, shape (...)
        float64; NaN for a system of one token (it has no pairs).

    Examples
    --------
    >>> x = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    >>> float(pair_fraction(x))  # 2 ordered pairs out of 6
    0.3333333333333333
    """
    x = as_batch(points)
    c = float(cos_threshold)
    if not math.isfinite(c):
        raise ValueError(f"cos_threshold must be finite, got {cos_threshold!r}")
    batch, (n, d) = x.shape[:-2], x.shape[-2:]
    xf = x.reshape(-1, n, d)
    if n <= small.SMALL_MAX:
        count = pair_counts(xf, c)
    else:
        count = np.empty(xf.shape[0])
        for s in batch_chunks(xf.shape[0], n):
            xs = xf[s]
            G = bmm(xs, np.swapaxes(xs, -1, -2))
            diag = np.einsum("bii->bi", G) > c
            count[s] = np.count_nonzero(G > c, axis=(-1, -2)) - np.count_nonzero(diag, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (count / (n * (n - 1))).reshape(batch) if n > 1 else np.full(batch, np.nan)


def pair_counts(x: np.ndarray, c: float) -> np.ndarray:
    r"""Ordered pairs :math:`i \ne j` with :math:`\langle x_i, x_j\rangle > c`, per system, for batches of tiny systems.

    One compiled pass per system (float64 Gram matrix), or for ``r >`` :data:`PAIR_COUNTS_FUSED_MAX_DIM`
    a batched GEMM per chunk of systems; :func:`pair_fraction` takes it for ``n <=`` ``SMALL_MAX``.

    Parameters
    ----------
    x : ndarray, shape (..., n, r)
        Points (float32 or float64); leading axes are independent systems.
    c : float
        The threshold.

    Returns
    -------
    ndarray, shape (...)
        int64 counts.

    Examples
    --------
    >>> x = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    >>> int(pair_counts(x, 0.999))  # (0, 1) and (1, 0)
    2
    """
    x = np.asarray(x)
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float64)
    if x.ndim < 2 or x.shape[-2] > small.SMALL_MAX:
        raise ValueError(
            f"x must have shape (..., n, r) with n <= {small.SMALL_MAX}, got shape {x.shape}"
        )
    batch, (n, r) = x.shape[:-2], x.shape[-2:]
    xf = np.ascontiguousarray(x).reshape(-1, n, r)
    B = xf.shape[0]
    out = np.zeros(B, dtype=np.int64)
    threads = num_threads() if B * n * n * r >= small.SERIAL_MAX_FLOPS else 1
    chunks = chunk_bounds(B, n * n, threads, small.CHUNK_PAIRS)
    cf = float(c)

    share = shares(B, min(threads, len(chunks)))

    def work(t: int) -> None:  # the compiled pass loops over its share's systems
        _pair_counts(xf, cf, *share[t], out)

    def gemm_work(t: int) -> None:  # larger r: the Gram matrices of a chunk by a batched GEMM
        G = scratch((chunks[0][1] - chunks[0][0], n, n), np.float64)
        for b0, b1 in chunks[t::threads]:
            xc = xf[b0:b1].astype(np.float64, copy=False)
            np.matmul(xc, xc.swapaxes(1, 2), out=G[: b1 - b0])
            _count_above(G[: b1 - b0], cf, out[b0:b1])

    if B and n:
        if r <= PAIR_COUNTS_FUSED_MAX_DIM:
            parallel(work, len(share))
        else:
            with blas_threads(1):
                run_chunks(gemm_work, threads, len(chunks))
    return out.reshape(batch)


@njit(cache=True, nogil=True)
def _count_above(G, c, out):  # pragma: no cover - compiled
    """out[k] = #{(i, j): i != j, G[k, i, j] > c} (ordered pairs; GEMM route of :func:`pair_counts`)."""
    for k in range(G.shape[0]):
        out[k] = count_off_diagonal(G[k], c)


@njit(cache=True, nogil=True, fastmath=FM_SUM)
def _pair_counts(x, c, k0, k1, out):  # pragma: no cover - compiled
    """out[k] = #{(i, j): i != j, <x_i, x_j> > c} for k0 <= k < k1 (float64 Gram, as the fused step)."""
    B, n, r = x.shape
    blocked = 4 < r <= BLOCKED_MAX_R
    rp = -(-r // GRAM_BLOCK) * GRAM_BLOCK if blocked else r
    # scratch arrays: the vectorized loops never depend on where malloc put them
    T = scratch((n, rp), np.float64)
    T.fill(0.0)
    TT = scratch((rp, n), np.float64)
    TT.fill(0.0)
    G = scratch((n, n), np.float64)
    for k in range(k0, k1):
        for i in range(n):
            for l in range(r):
                v = np.float64(x[k, i, l])
                T[i, l] = v
                TT[l, i] = v
        if blocked:
            gram_blocked(T, TT, G)
        else:
            mm(T, TT, G)
        out[k] = count_off_diagonal(G, c)
