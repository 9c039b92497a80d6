r"""Kernel sums for batches of tiny systems (the phase-diagram regime: thousands of systems of n <= 256).

For each system :math:`b` of a batch, with :math:`a = \beta Q x`, :math:`b = K y`, values
:math:`c = V y`:

.. math::

    L = a\, b^\top + \log w, \qquad c_i = \max_j L_{ij}, \qquad
    E_{ij} = e^{\max(L_{ij} - c_i,\ \text{floor})}, \qquad
    s^0_i = \sum_j E_{ij}, \qquad s^1 = E\, c,

i.e. what PyTorch's ``bmm`` + ``softmax`` + ``bmm`` computes, with the shift kept.
Two methods (:func:`choose_method`), both in worker threads that take chunks of systems:

* ``"fused"`` (low logit and value dimensions): one compiled pass per system, everything in
  L1 (:func:`wflow.kernels.dense.fused_sums`);
* ``"gemm"``: a batched GEMM for the logits, one compiled pass for the row maxima,
  exponentials and row sums, and a batched GEMM for the values, BLAS single-threaded.

:func:`bmm` exposes that batched GEMM for other callers (diagnostics).

float32: the logits are formed in float32 only when their rounding error is provably small
(:mod:`wflow.kernels.precision`), or below ``tol / 3`` when the caller asks for less
(``kernel_sums(..., tol=2e-4)``); otherwise in float64.  Exponentials and the value GEMM run in
float32 either way; row sums are accumulated in float64.
"""

from __future__ import annotations

import math

import numpy as np

from . import dense
from .precision import float32_logits_bound
from .threads import blas_threads, chunk_bounds, num_threads, parallel, run_chunks

__all__ = [
    "bmm",
    "small_sums",
    "span_coordinates",
    "choose_method",
    "SMALL_MAX",
    "CHUNK_PAIRS",
    "SERIAL_MAX_FLOPS",
    "FORCE_METHOD",
]

#: Largest n and m (per system) of the tiny-systems route.
SMALL_MAX = 256
#: Pairs (i, j) per chunk of systems handed to one worker (logits of a chunk stay in L2).
CHUNK_PAIRS = 1 << 15
#: Below this many multiply-adds a batched GEMM is not split over threads.
_SPLIT_MIN_FLOPS = 1 << 20
#: Kernel sums of fewer multiply-adds (B n m (p + q)) than this run in the calling thread.
SERIAL_MAX_FLOPS = 1 << 21


def bmm(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    r"""Batched matrix product ``a @ b`` of shapes ``(B, n, k) @ (B, k, m) -> (B, n, m)``, fast for many small matrices.

    The batch is split into contiguous chunks, one worker thread per core, each calling
    NumPy's ``matmul`` with BLAS limited to one thread: the same numbers as ``np.matmul``.

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
    threads = num_threads()
    if threads == 1 or B < 2 or B * n * m * k < _SPLIT_MIN_FLOPS:
        with blas_threads(1):
            return np.matmul(a, b, out=out)
    chunks = chunk_bounds(B, n * m * k, threads, 1 << 22)

    def work(t: int) -> None:
        for b0, b1 in chunks[t::threads]:
            np.matmul(a[b0:b1], b[b0:b1], out=out[b0:b1])

    with blas_threads(1):
        parallel(work, min(threads, len(chunks)))
    return out


def _logits_in_float32(
    a: np.ndarray,
    b: np.ndarray,
    logw: np.ndarray,
    floor: float,
    tol: float | None = None,
    scale: float = 1.0,
) -> tuple[bool, np.ndarray, np.ndarray]:
    """Whether float32 logits ``scale <a_i, b_j> + log w_j`` are accurate enough (module docstring),
    with log-weights relative to each system's maximum."""
    sq = lambda z: float(np.max(np.einsum("...i,...i->...", z, z, dtype=np.float64), initial=0.0))  # noqa: E731
    size = abs(scale) * math.sqrt(sq(a) * sq(b)) * (1.0 + 1e-6)
    return float32_logits_bound(a.shape[-1], size, logw, floor, tol)


#: Force the method of :func:`small_sums` ("fused" or "gemm"; None: :func:`choose_method`).
FORCE_METHOD: str | None = None


def choose_method(n: int, m: int, p: int, q: int, B: int = 1, dtype=np.float64) -> str:
    """``"fused"`` (one compiled pass per system: small matrix products, exponentials, value
    products) or ``"gemm"`` (batched BLAS GEMMs around one exponential pass, in worker threads) for
    ``B`` systems of ``n`` x ``m`` pairs, logit dimension ``p`` and value dimension ``q`` in ``dtype``:
    the one with the least time predicted by the cost model of :mod:`wflow.kernels.cost`.

    Examples
    --------
    >>> from wflow.kernels import small
    >>> small.choose_method(32, 32, 128, 128, B=256)  # high dimension: BLAS GEMMs
    'gemm'
    >>> small.choose_method(32, 32, 3, 3, B=256)  # low dimension: one compiled pass per system
    'fused'
    """
    if FORCE_METHOD is not None:
        return FORCE_METHOD
    from . import cost

    return cost.cheapest(B, n, m, p, q, dtype, ("fused", "gemm"))


def small_sums(
    a: np.ndarray,
    b: np.ndarray,
    logw: np.ndarray,
    c: np.ndarray | None,
    floor: float,
    dtype,
    *,
    scale: float = 1.0,
    tol: float | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    r"""The tiny-systems route: ``(shift (B, n), mass (B, n), vector (B, n, q) or None)`` in ``dtype``.

    Logits are :math:`\ell_{ij} = \text{scale}\,\langle a_i, b_j\rangle + \log w_j`: ``a``
    (B, n, p) and ``b`` (B, m, p) in the input dtype or float64 (for :math:`Q x` and :math:`K y`),
    ``logw`` (B, m) float64 and finite, ``c`` (B, m, q) values or None, ``dtype`` the working
    (output) dtype, ``tol`` the caller's requested relative accuracy (float32 logits when it
    allows them).  The shift is the exact row maximum, rounded to ``dtype`` (mass and vector
    consistent with the rounded shift).

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.kernels import exp_floor
    >>> from wflow.kernels.small import small_sums
    >>> rng = np.random.default_rng(0)
    >>> a, b = rng.standard_normal((2, 3, 2)), rng.standard_normal((2, 4, 2))  # 2 systems, n = 3, m = 4
    >>> logw = np.log(np.full((2, 4), 0.25))
    >>> shift, mass, vector = small_sums(a, b, logw, b, exp_floor(np.float64), np.float64)
    >>> shift.shape, mass.shape, vector.shape
    ((2, 3), (2, 3), (2, 3, 2))
    >>> bool(np.allclose(np.exp(shift) * mass, np.exp(a @ b.swapaxes(1, 2)).mean(axis=-1)))
    True
    """
    B, n, p = a.shape
    m = b.shape[1]
    wdt = np.dtype(dtype).type
    zero = wdt(0)
    lw_max = None
    ldt: type[np.float32] | type[np.float64] = np.float64
    if wdt is np.float32:
        ok, lw_rel, lw_max = _logits_in_float32(a, b, logw, floor, tol, scale)
        if ok:
            ldt = np.float32
            logw = lw_rel
    bT = np.swapaxes(b, 1, 2)
    lw_l = np.ascontiguousarray(logw, dtype=ldt)
    fl = ldt(floor)
    cw = None if c is None else c.astype(wdt, copy=False)
    q = 0 if cw is None else cw.shape[-1]
    shift = np.empty((B, n))
    mass = np.empty((B, n), dtype=wdt)
    vec = np.empty((B, n, q), dtype=wdt) if q else None
    # small problems run in the calling thread: waking worker threads costs more than the sum
    threads = num_threads() if B * n * m * (p + q) >= SERIAL_MAX_FLOPS else 1
    chunks = chunk_bounds(B, n * m, threads, CHUNK_PAIRS)
    if choose_method(n, m, p, q, B, np.dtype(dtype)) == "fused":
        c_w = cw if cw is not None else np.empty((B, m, 0), dtype=wdt)
        v_w = vec if vec is not None else np.empty((B, n, 0), dtype=wdt)
        a_l, b_l, sc = a.astype(ldt, copy=False), b.astype(ldt, copy=False), ldt(scale)

        def fused(t: int) -> None:
            for b0, b1 in chunks[t::threads]:
                dense.fused_sums(a_l, b_l, c_w, lw_l, sc, fl, zero, b0, b1, shift, mass, v_w)

        run_chunks(fused, threads, len(chunks))
        return _finish(shift, mass, vec, lw_max, ldt, wdt)

    def work(t: int) -> None:
        L = np.empty((chunks[0][1] - chunks[0][0], n, m), dtype=ldt)
        E = np.empty(L.shape, dtype=wdt) if wdt is not ldt else None
        for b0, b1 in chunks[t::threads]:
            C = b1 - b0
            Lc = L[:C]
            # (float32 input with float64 logits: upcast chunk by chunk, in the workers)
            np.matmul(a[b0:b1].astype(ldt, copy=False), bT[b0:b1].astype(ldt, copy=False), out=Lc)
            Ec = Lc if E is None else E[:C]
            dense.softmax_rows(Lc, ldt(scale), lw_l[b0:b1], Ec, shift[b0:b1], mass[b0:b1], fl, zero)
            if vec is not None and cw is not None:  # (q > 0)
                np.matmul(Ec, cw[b0:b1], out=vec[b0:b1])

    with blas_threads(1):
        run_chunks(work, threads, len(chunks))
    return _finish(shift, mass, vec, lw_max, ldt, wdt)


def _finish(shift, mass, vec, lw_max, ldt, wdt):
    if lw_max is not None and ldt is np.float32:
        shift += lw_max[:, None]
    if wdt is not np.float64:
        # the shift in the output dtype, mass and vector consistent with it
        c32 = shift.astype(wdt)
        f = np.exp(shift - c32.astype(np.float64)).astype(wdt)
        mass *= f
        if vec is not None:
            vec *= f[..., None]
        shift = c32
    return shift, mass, vec


def span_coordinates(x: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    r"""Coordinates of points in an orthonormal basis of their span: ``x = y @ basis``.

    With :math:`Q = K = V = I` every token of SA/USA moves in the span of the initial tokens and
    the flow commutes with orthogonal maps: ``n`` tokens in dimension ``d > n`` evolve exactly as
    their ``n`` coordinates :math:`y = x U^\top` (thin QR :math:`x^\top = U^\top R`,
    :math:`y = R^\top`), at ``n / d`` of the cost, with the same inner products (to rounding).

    Parameters
    ----------
    x : ndarray, shape (..., n, d)

    Returns
    -------
    y : ndarray, shape (..., n, n), or ``x`` itself when ``d <= n``
    basis : ndarray, shape (..., n, d), orthonormal rows, or None when ``d <= n``

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.kernels.small import span_coordinates
    >>> x = wflow.sphere.uniform(3, 10, seed=0)  # 3 tokens in dimension 10
    >>> y, basis = span_coordinates(x)
    >>> y.shape, basis.shape, bool(np.allclose(y @ basis, x)), bool(np.allclose(basis @ basis.T, np.eye(3)))
    ((3, 3), (3, 10), True, True)
    >>> span_coordinates(wflow.sphere.uniform(5, 3, seed=0))[1] is None  # d <= n: nothing to gain
    True
    """
    x = np.asarray(x)
    n, d = x.shape[-2:]
    if d <= n:
        return x, None
    with blas_threads(1):
        q, rr = np.linalg.qr(np.swapaxes(x, -1, -2))  # x^T = q rr, q orthonormal columns
    return np.ascontiguousarray(np.swapaxes(rr, -1, -2)), np.ascontiguousarray(
        np.swapaxes(q, -1, -2)
    )
