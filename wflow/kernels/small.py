r"""Kernel sums for batches of tiny systems (the phase-diagram regime: thousands of systems of n <= 256).

For each system :math:`b` of a batch, with :math:`a = \beta Q x`, :math:`b = K y`, values
:math:`c = V y`:

.. math::

    L = a\, b^\top + \log w, \qquad c_i = \max_j L_{ij}, \qquad
    E_{ij} = e^{\max(L_{ij} - c_i,\ \text{floor})}, \qquad
    s^0_i = \sum_j E_{ij}, \qquad s^1 = E\, c,

i.e. exactly what PyTorch's ``bmm`` + ``softmax`` + ``bmm`` computes, with the shift kept.
Two methods (:func:`choose_method`):

* ``"fused"`` (low logit and value dimensions): one compiled
  pass per system (worker threads take chunks of systems), everything in L1: the logits by
  small matrix products whose inner loops run along contiguous rows (``_mm``), the row
  maxima and exponentials, the values by the same products;
* ``"gemm"``: three steps per chunk of systems, in worker threads (one per core) that each
  take whole chunks: a batched GEMM for the logits, one compiled pass for the row maxima,
  the exponentials (:func:`~wflow.kernels.numba_backend._exp64`/``_exp32``: polynomial,
  vectorized) and the row sums, and a batched GEMM for the values.  BLAS runs single-threaded inside
the workers: OpenBLAS splitting each 32 x 32 GEMM over the cores of a small shared machine
was measured 10--70x slower than one thread per GEMM (d = 1024, 256 systems: 0.2--2 s
against 30 ms).  :func:`bmm` exposes that batched GEMM for other callers (diagnostics).

float32: the logits are formed in float32 (SGEMM) only when their rounding error is
provably small, :math:`2^{-24}\big((p+2)\max|a|\max|b| + 2\,\mathrm{span}\log w\big) \le 3\cdot
10^{-6}` (as the direct route of the numba backend decides); otherwise in float64 (DGEMM on
upcast operands).  A caller that asks for less, ``kernel_sums(..., tol=2e-4)``, gets float32
logits whenever that bound is below ``tol / 3`` (at beta = 5, d = 128 the bound is 4e-5, so
any tol >= 1.2e-4), which is what PyTorch computes in float32.  Exponentials and the value
GEMM run in float32 either way; row sums are accumulated in float64.
"""

from __future__ import annotations

import contextlib
import math
from typing import NamedTuple

import numpy as np

from . import numba_backend as _nb
from .numba_backend import _float32_logits_bound

__all__ = [
    "bmm",
    "small_sums",
    "sa_euler_step",
    "step_log_weights",
    "pair_counts",
    "span_coordinates",
    "choose_method",
    "SMALL_MAX",
    "CHUNK_PAIRS",
    "SA_STEP_FUSED_MAX_DIM",
    "PAIR_COUNTS_FUSED_MAX_DIM",
]

#: Largest n and m (per system) of the tiny-systems route.
SMALL_MAX = 256
#: Pairs (i, j) per chunk of systems handed to one worker (logits of a chunk stay in L2).
CHUNK_PAIRS = 1 << 15
#: Below this many multiply-adds a batched GEMM is not split over threads.
_SPLIT_MIN_FLOPS = 1 << 20
#: Kernel sums of fewer multiply-adds (B n m (p + q)) than this run in the calling thread.
SERIAL_MAX_FLOPS = 1 << 21


def _chunk_bounds(B: int, per_system: int, threads: int, target: int) -> list[tuple[int, int]]:
    """Contiguous chunks of systems of about ``target`` work each, at least ``2 * threads`` of them."""
    size = max(1, min(target // max(1, per_system), -(-B // (2 * threads))))
    return [(b0, min(B, b0 + size)) for b0 in range(0, B, size)]


def _shares(B: int, workers: int) -> list[tuple[int, int]]:
    """At most ``workers`` contiguous shares of B systems, of equal size but the last: for compiled passes
    that loop over the systems themselves, one call per worker (one call per chunk of 32 systems cost 3 %
    of a step at 2048 systems)."""
    per = -(-B // max(1, workers)) if B else 1
    return [(b0, min(B, b0 + per)) for b0 in range(0, B, per)]


def _threads() -> int:
    if _nb.numba is not None:
        return max(1, _nb.numba.get_num_threads())
    import os

    return max(
        1,
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1),
    )


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
        _nb._parallel(work, min(threads, len(chunks)))
    return out


#: coordinates per block of :func:`_gram_blocked` (a compile-time constant: the block's sum is unrolled)
_GRAM_BLOCK = 8
#: the fused SA step and the pair counts use the blocked Gram matrix and the dot-product averages for
#: dimensions 4 < r <= this (and the dot-product averages for r <= 4); :func:`_mm` beyond (measured equal at r = 32),
#: which :func:`pair_counts` takes up to :data:`PAIR_COUNTS_FUSED_MAX_DIM` and :func:`sa_euler_step` only when
#: :data:`SA_STEP_FUSED_MAX_DIM` is raised
_BLOCKED_MAX_R = 16


#: :func:`sa_euler_step`'s BLAS pass keeps the directions and averages of systems of at most this many
#: coordinates as columns (r, n), so that norms, projections and retractions run across the n tokens;
#: beyond, as rows (n, r).  Step times, n = 32, one thread, min of 80 round-robin calls, rows against
#: columns: 2048 systems r = 3 3.77 against 3.22 ms, r = 4 3.63/2.92, r = 8 6.10/5.66, r = 12 8.02/7.23;
#: 256 systems r = 16 0.95/0.89, r = 32 1.13/1.36
SA_STEP_TRANSPOSED_MAX_DIM = 16

#: the fused SA step shifts every logit by |beta| + max log-weight when the log-weights of a system span at
#: most this much, less 2|beta| for beta < 0 (uniform weights, beta >= 0: 0), else by each row's maximum
#: (zero weights, weights beyond e^600 apart): the diagonal term e^(beta - |beta| + lw_i - max lw) stays normal
_FIXED_SHIFT_SPREAD = 600.0
#: the same in float32 (exponent floor -80)
_FIXED_SHIFT_SPREAD_32 = 60.0

if _nb.numba is not None:
    from llvmlite import ir as _ir
    from numba import njit
    from numba.core import types as _types
    from numba.cpython.unsafe.numbers import trailing_zeros as _trailing_zeros
    from numba.extending import get_cython_function_address, intrinsic

    #: the addresses of BLAS's dgemm and sgemm (scipy's Cython wrappers of its OpenBLAS, Fortran calling
    #: convention: every argument a pointer), which the fused SA step calls on each system's 32 x 32
    #: products from inside its compiled pass (:func:`_gemm`)
    _GEMM = {
        np.dtype(np.float64): get_cython_function_address("scipy.linalg.cython_blas", "dgemm"),
        np.dtype(np.float32): get_cython_function_address("scipy.linalg.cython_blas", "sgemm"),
    }

    @intrinsic
    def _gemm_call(typingctx, fn, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        """Call the ?gemm at address ``fn`` with the 13 addresses of its arguments (an address taken as an
        argument, not a constant, keeps the compiled kernels cacheable)."""
        args = (fn, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)

        def codegen(context, builder, signature, llargs):
            p = _ir.IntType(8).as_pointer()
            fnty = _ir.FunctionType(_ir.VoidType(), [p] * 13)
            f = builder.inttoptr(llargs[0], fnty.as_pointer())
            builder.call(f, [builder.inttoptr(v, p) for v in llargs[1:]])
            return context.get_dummy_value()

        return _types.void(*[_types.uintp] * len(args)), codegen

    @njit(cache=True, inline="always")
    def _gemm(
        fn, ta, tb, m, n, k, a, lda, b, ldb, c, ldc, ints, chars, scal
    ):  # pragma: no cover - compiled
        """C = op(A) op(B) in BLAS's column-major terms (``ta``, ``tb`` 0 for 'N', 1 for 'T'); ``ints`` an
        int32 buffer of 6, ``chars`` the bytes 'N', 'T', ``scal`` (1, 0) in the arrays' dtype."""
        ints[0] = m
        ints[1] = n
        ints[2] = k
        ints[3] = lda
        ints[4] = ldb
        ints[5] = ldc
        _gemm_call(
            fn,
            chars[ta:].ctypes.data,
            chars[tb:].ctypes.data,
            ints[0:].ctypes.data,
            ints[1:].ctypes.data,
            ints[2:].ctypes.data,
            scal[0:].ctypes.data,
            a.ctypes.data,
            ints[3:].ctypes.data,
            b.ctypes.data,
            ints[4:].ctypes.data,
            scal[1:].ctypes.data,
            c.ctypes.data,
            ints[5:].ctypes.data,
        )

    @njit(cache=True, fastmath=_nb._FM_SUM, inline="always")
    def _softmax_row(Li, Ei, scale, lwk, fl, zero):  # pragma: no cover - compiled
        """Li <- scale Li + lwk; Ei = e^(Li - max Li) (exponents clamped at fl, in the dtype of zero; Ei may
        be Li); returns (the row maximum, the row sum accumulated in float64)."""
        m = Li.shape[0]
        for j in range(m):
            Li[j] = Li[j] * scale + lwk[j]
        mx = Li[0]
        for j in range(1, m):
            mx = max(mx, Li[j])
        t = 0.0
        for j in range(m):
            v = _nb._exp_as(max(Li[j] - mx, fl), zero)
            Ei[j] = v
            t += v
        return mx, t

    @njit(cache=True, nogil=True, fastmath=_nb._FM_SUM)
    def _softmax_rows(L, scale, lw, E, shift, mass, fl, zero):  # pragma: no cover - compiled
        """L (C, n, m) inner products (float64, or float32 when accurate enough), scale the factor
        beta, lw (C, m) log-weights and fl the exponent floor, both in L's dtype; writes
        E (C, n, m) = e^(scale L + lw - c) in the dtype of zero (E may be L itself), the shift
        c (C, n) float64 (the exact row maximum) and mass (C, n) in the dtype of zero
        (accumulated in float64)."""
        C, n, m = L.shape
        for k in range(C):
            for i in range(n):
                shift[k, i], mass[k, i] = _softmax_row(L[k, i], E[k, i], scale, lw[k], fl, zero)

    @njit(cache=True, fastmath=_nb._FM_SUM)
    def _mm(A, Bt, C):  # pragma: no cover - compiled
        """C = A Bt for small row-major A (n, K), Bt (K, m), two rows of C at a time: for each l,
        C[i] += A[i, l] Bt[l] and C[i + 1] += A[i + 1, l] Bt[l], loops over the contiguous rows that
        the compiler vectorizes (each load of Bt feeds two FMAs), sums in the order l = 0, 1, ...
        (so T T^T comes out exactly symmetric).  Unsigned row indices: no negative-index wraparound
        in the address arithmetic.  Measured 2.3x (Gram matrices, n = 32, r = 8) and 1.6x (the whole
        SA step) faster than 4 x 2 register-blocked dot products on one AVX-512 core."""
        n, K = A.shape
        m = Bt.shape[1]
        n2 = n - n % 2
        z = C.dtype.type(0)
        for i0 in range(0, n2, 2):
            i = np.uint64(i0)
            i1 = i + np.uint64(1)
            for j in range(m):
                C[i, j] = z
                C[i1, j] = z
            for l0 in range(K):
                l = np.uint64(l0)
                t = A[i, l]
                u = A[i1, l]
                for j0 in range(m):
                    j = np.uint64(j0)
                    y = Bt[l, j]
                    C[i, j] += t * y
                    C[i1, j] += u * y
        for i in range(n2, n):
            for j in range(m):
                C[i, j] = z
            for l in range(K):
                t = A[i, l]
                for j in range(m):
                    C[i, j] += t * Bt[l, j]

    @njit(cache=True, fastmath=_nb._FM_SUM)
    def _gram_blocked(T, TT, G):  # pragma: no cover - compiled
        """G = T T^T for T (n, rp) and TT = T^T (rp, n), rp a multiple of :data:`_GRAM_BLOCK` (zero-padded
        columns): for each row i and each block of 8 coordinates, the loop over j (vectorized) sums the
        block's 8 products in registers (the block's trip count is a compile-time constant, so the
        compiler unrolls it) and touches G[i, j] once per block.  Same products summed in the same
        order for (i, j) and (j, i): G is exactly symmetric.  Measured at n = 32 (one AVX-512 core,
        2048 Gram matrices): r = 8 1.2 ms against 3.0 ms for :func:`_mm`, r = 16 3.1 against 5.9 ms;
        r = 3 (padded to 8) 1.4 against 0.9 ms, r = 32 equal -- hence only for 4 < r <= 16."""
        n, rp = T.shape
        m = TT.shape[1]
        for i in range(n):
            a = T[i]
            Gi = G[i]
            for j in range(m):
                s = a[0] * TT[0, j]
                for ll in range(1, _GRAM_BLOCK):
                    s += a[ll] * TT[ll, j]
                Gi[j] = s
            for l0 in range(_GRAM_BLOCK, rp, _GRAM_BLOCK):
                for j in range(m):
                    s = Gi[j]
                    for ll in range(_GRAM_BLOCK):
                        s += a[l0 + ll] * TT[l0 + ll, j]
                    Gi[j] = s

    @njit(cache=True, fastmath=_nb._FM_SUM)
    def _avg_dots(E, TT, r, A):  # pragma: no cover - compiled
        """A[:, :r] = E T for E (n, m) and TT = T^T (>= r, m): each A[i, l] a dot product of the
        contiguous rows E[i] and TT[l] (vectorized reductions over j), two coordinates l at a time
        sharing the loads of E[i].  Measured at n = m = 32, 2048 systems on one AVX-512 core: r = 8
        1.7 ms against 4.3 ms for :func:`_mm`, r = 16 3.1 against 6.3 ms, r = 32 equal."""
        n, m = E.shape
        r2 = r - r % 2
        for l in range(0, r2, 2):
            t = TT[l]
            u = TT[l + 1]
            for i in range(n):
                g = E[i]
                s = g[0] * t[0]
                s2 = g[0] * u[0]
                for j in range(1, m):
                    s += g[j] * t[j]
                    s2 += g[j] * u[j]
                A[i, l] = s
                A[i, l + 1] = s2
        if r2 < r:
            t = TT[r2]
            for i in range(n):
                g = E[i]
                s = g[0] * t[0]
                for j in range(1, m):
                    s += g[j] * t[j]
                A[i, r2] = s

    @njit(cache=True, nogil=True, fastmath=_nb._FM_SUM)
    def _fused_sums(
        a, b, c, lw, scale, fl, zero, k0, k1, shift, mass, vec
    ):  # pragma: no cover - compiled
        """Everything for each system k0 <= k < k1, serially and without the GIL (the worker
        threads take chunks of systems; each system's numbers stay in L1/L2): logits
        L = scale a b^T + lw by :func:`_mm` (in the dtype of a and b; b transposed per system into a
        buffer), row maxima and exponentials (E in the dtype of zero, mass accumulated in float64),
        then the value sums vec = E c by :func:`_mm`.  c may have q = 0 columns (no values)."""
        B, n, p = a.shape
        m = b.shape[1]
        q = c.shape[2]
        L = np.empty((n, m), a.dtype)
        E = np.empty((n, m), c.dtype)
        bT = np.empty((p, m), b.dtype)
        for k in range(k0, k1):
            for j in range(m):
                for l in range(p):
                    bT[l, j] = b[k, j, l]
            _mm(a[k], bT, L)
            for i in range(n):
                shift[k, i], mass[k, i] = _softmax_row(L[i], E[i], scale, lw[k], fl, zero)
            if q:
                _mm(E, c[k], vec[k])

    @njit(cache=True, inline="always")
    def _count_off_diagonal(G, c):  # pragma: no cover - compiled
        """#{(i, j): i != j, G[i, j] > c} for a square G: whole rows (vectorized) less the diagonal."""
        cnt = 0
        for i in range(G.shape[0]):
            Gi = G[i]
            for j in range(G.shape[1]):
                cnt += Gi[j] > c
            cnt -= Gi[i] > c
        return cnt

    @njit(cache=True, fastmath=_nb._FM_SUM, inline="always")
    def _sa_directions(xk, T):  # pragma: no cover - compiled
        """T[:, :r] = the rows of xk (n, r) over their norms (formed in float64), in T's dtype; returns
        :func:`_off_sphere` of the squared norms."""
        n, r = xk.shape
        dl = 0.0
        for i in range(n):
            s = 0.0
            for l in range(r):
                v = np.float64(xk[i, l])
                s += v * v
            dl = max(dl, _off_sphere(s, r))
            inv = 1.0 / np.sqrt(s)
            for l in range(r):
                T[i, l] = np.float64(xk[i, l]) * inv
        return dl

    @njit(cache=True, inline="always")
    def _off_sphere(s, r):  # pragma: no cover - compiled
        """A bound of ||x| - 1| <= ||x|^2 - 1| from s, |x|^2 summed in float64 over the r coordinates (in any
        order): |s - 1| plus the sum's rounding.  Its maximum over the rows is the delta of
        :func:`_gram_clusters`."""
        return abs(s - 1.0) + (r + 2) * 1.2e-16 * s

    @njit(cache=True, inline="always")
    def _pair_band(pb, dl, r):  # pragma: no cover - compiled
        """0.0 when pb is 0.0 (no band: dl is not used, and may be infinite or NaN), else, for float32 points
        x (n, r), a bound of |P_ij - G_ij|, P_ij the float64 inner product
        :func:`pair_counts` forms of the points (exact products, summed in any order) and G_ij the step's
        of their directions theta (formed in float64), dl the maximum of :func:`_off_sphere` over the rows
        (>= ||x_i|^2 - 1|): exactly, P - G = <theta_i, theta_j> (|x_i||x_j| - 1), and |ab - 1| <=
        max(|a^2 - 1|, |b^2 - 1|) for a, b >= 0, so at most dl; plus the rounding of the directions and of
        both sums, under (3r + 4) u (1 + dl)^2 with u = 2^-53, plus a margin.  Valid at any norm (far from
        the sphere every pair is near: the system is counted by pair_counts)."""
        if pb == 0.0:
            return 0.0
        return dl + (4.0 * r + 8.0) * 1.2e-16 * (1.0 + dl) * (1.0 + dl) + 1e-15

    @njit(cache=True, fastmath=_nb._FM_SUM, inline="always")
    def _near_pairs(G, c, eb):  # pragma: no cover - compiled
        """Whether some G_ij, i != j, lies within eb of c."""
        n = G.shape[0]
        m = 0
        for i in range(n):
            Gi = G[i]
            for j in range(n):
                m += abs(Gi[j] - c) <= eb
            m -= abs(Gi[i] - c) <= eb
        return m > 0

    @njit(cache=True, fastmath=_nb._FM_SUM, inline="always")
    def _sa_exps(G, lwk, bw, fw, spread, zero, inv_s, c, want_e):  # pragma: no cover - compiled
        """G (n, n) inner products of directions -> the exponentials e^(bw G_ij + lw_j - shift) in place,
        inv_s = 1 / row sums (float64): one shift |bw| + max lw for the system when the log-weights span
        at most ``spread`` (less 2|bw| when bw < 0), else each row's maximum.  Returns ``(count, lse, sym)``:
        #{(i, j): i != j, G_ij > c} counted on the way (the pair count of :func:`sa_euler_step`; c = 2
        when not wanted); when ``want_e``, log sum_i w_i sum_j w_j e^(bw G_ij) from the row sums and
        their shifts (the energy's double sum, :meth:`wflow.models.SA.log_energy`; 0.0 otherwise); and
        whether the exponentials are symmetric whenever G is (one shift and equal log-weights: E_ij a
        function of G_ij alone), so that E^T may stand for E in the average."""
        n = G.shape[0]
        cnt = 0
        lse = 0.0
        hi = lwk[0]
        lo = lwk[0]
        for j in range(1, n):
            hi = max(hi, lwk[j])
            lo = min(lo, lwk[j])
        sym = False
        if hi - lo + max(-2.0 * bw, 0.0) <= spread:
            # one shift for every row, |beta| + max log-weight >= every logit (|<theta_i, theta_j>| <= 1):
            # the diagonal term e^(beta + lw_i - |beta| - hi) >= e^-spread keeps every row sum normal, so
            # no row maximum is needed and the normalization folds into the average
            sh = abs(bw) + hi
            sym = hi == lo
            acc = 0.0  # sum_i w_i e^sh t_i = e^(sh + hi) sum_i e^(lw_i - hi) t_i, each e^(lw_i - hi) >= e^-spread
            for i in range(n):
                Gi = G[i]
                cnt -= Gi[i] > c
                t = 0.0
                for j in range(n):
                    g = Gi[j]
                    cnt += g > c
                    e = _nb._exp_as(max(bw * g + lwk[j] - sh, fw), zero)
                    Gi[j] = e
                    t += e
                inv_s[i] = 1.0 / t
                if want_e:
                    acc += t if sym else np.exp(np.float64(lwk[i] - hi)) * t
            if want_e:
                lse = np.float64(sh) + np.float64(hi) + np.log(acc)
        else:
            cnt = _count_off_diagonal(G, c)
            top = -1e308  # the running log-sum-exp of lw_i + m_i + log t_i (m_i the row's shift)
            acc = 0.0
            for i in range(n):
                mx, t = _softmax_row(G[i], G[i], bw, lwk, fw, zero)
                inv_s[i] = 1.0 / t
                if want_e:
                    a = np.float64(lwk[i]) + np.float64(mx) + np.log(t)
                    if a > top:
                        acc = acc * np.exp(top - a) + 1.0
                        top = a
                    else:
                        acc += np.exp(a - top)
            if want_e:
                lse = top + np.log(acc)
        return cnt, lse, sym

    def _compare8(op):
        @intrinsic
        def compare(typingctx, row, j, c):
            """Bit k of the result (k = 0..7): row[j + k] op c (op '>' or '>='), for a C-contiguous float
            row and j + 8 <= len(row) (c rounded to the row's dtype): one vector compare of eight numbers,
            its mask read as a byte (what LLVM's loop vectorizer does not make of
            ``m |= (row[j] > c) << j``: 1.6x faster, 2x in the loop of :func:`_gram_clusters`)."""
            if not (
                isinstance(row, _types.Array)
                and row.ndim == 1
                and row.layout == "C"
                and row.dtype in (_types.float32, _types.float64)
            ):
                return None

            def codegen(context, builder, signature, args):
                ary = context.make_array(signature.args[0])(context, builder, args[0])
                ety = signature.args[0].dtype
                vty = _ir.VectorType(context.get_data_type(ety), 8)
                v = builder.load(
                    builder.bitcast(builder.gep(ary.data, [args[1]]), vty.as_pointer()),
                    align=ety.bitwidth // 8,
                )
                c = context.cast(builder, args[2], _types.float64, ety)
                cv = builder.insert_element(
                    _ir.Constant(vty, _ir.Undefined), c, _ir.Constant(_ir.IntType(32), 0)
                )
                cv = builder.shuffle_vector(
                    cv,
                    _ir.Constant(vty, _ir.Undefined),
                    _ir.Constant(_ir.VectorType(_ir.IntType(32), 8), [0] * 8),
                )
                bits = builder.bitcast(builder.fcmp_ordered(op, v, cv), _ir.IntType(8))
                return builder.zext(bits, _ir.IntType(64))

            return _types.uint64(row, _types.intp, _types.float64), codegen

        return compare

    _above8 = _compare8(">")
    _from8 = _compare8(">=")

    @njit(cache=True, inline="always")
    def _cluster_buffers(n):  # pragma: no cover - compiled
        """The work arrays of :func:`_gram_clusters` for n points."""
        W = (n + 63) // 64
        return np.empty((n, W), np.uint64), np.empty(W, np.uint64), np.empty(n, np.int64)

    @njit(cache=True, inline="always")
    def _linked(d2, chord, lo, hi):  # pragma: no cover - compiled
        """Whether a pair at squared distance d2 is linked, |x_i - x_j| < chord: below lo, yes; from lo to hi
        (:func:`wflow.diagnostics._link`: within rounding of chord^2), as the square root says; above, no."""
        return d2 < lo or (d2 < hi and np.sqrt(d2) < chord)

    @njit(cache=True, fastmath={"nnan", "ninf", "nsz"})
    def _dist2(xk, i, j):  # pragma: no cover - compiled
        """|x_i - x_j|^2 of the rows of xk, summed over the coordinates in order, in float64 without fused
        multiply-adds: the number :func:`wflow.diagnostics._cluster_roots` forms for the pair (not inlined,
        so that the caller's fast-math flags do not reach it)."""
        s = 0.0
        for a in range(xk.shape[1]):
            t = np.float64(xk[i, a]) - np.float64(xk[j, a])
            s += t * t
        return s

    @njit(cache=True, fastmath=_nb._FM_SUM)
    def _gram_clusters(G, xk, dl, cl, adj, U, stack):  # pragma: no cover - compiled
        """The number of single-linkage clusters of the points xk (n, r) -- i and j linked when
        |x_i - x_j| < chord -- read off the Gram matrix G (n, n, float64) of their directions, with
        cl = (chord, 1 - chord^2 / 2, lo, hi) (lo, hi of :func:`wflow.diagnostics._link`) and dl >= max_i ||x_i| - 1|
        (the maximum of :func:`_off_sphere` over the rows, which the directions return); buffers adj (n, W) and U
        (W) uint64, W = ceil(n / 64), stack (n) int64.  Exactly :func:`wflow.diagnostics.count_clusters`'
        count: a pair is decided by G_ij when 2 - 2 G_ij is further from chord^2 than a bound e of
        |2 - 2 G_ij - d_ij| (d_ij the squared distance _cluster_roots forms: the rounding of G, of the
        directions and of d_ij, and delta = dl, for |x_i - x_j|^2 = (1 + delta_i)(1 + delta_j)
        (2 - 2 <theta_i, theta_j>) + (delta_i - delta_j)^2), and otherwise by d_ij itself, as _cluster_roots
        decides it (:func:`_dist2`).  The links of each point are a bit mask (a compare per entry of G, no
        branch), the components a search over the masks, each point taken once: about 0.5 us per system
        at n = 32 (a union-find over the pairs: 1-1.6 us)."""
        n, r = xk.shape
        chord, cth, lo, hi = cl[0], cl[1], cl[2], cl[3]
        e = 0.5 * (
            (16.0 * r + 64.0) * 1.2e-16 + 16.0 * dl * (1.0 + dl) + 1e-13
        )  # (in units of G: half of e)
        up = cth + e
        dn = cth - e
        W = U.shape[0]
        one = np.uint64(1)
        band = np.uint64(0)  # nonzero when some entry is within the bound of the threshold
        for i in range(n):
            Gi = G[i]
            for w in range(W):
                j0 = 64 * w
                j1 = min(j0 + 64, n)
                j8 = j1 - (j1 - j0) % 8
                m = np.uint64(0)
                for j in range(j0, j8, 8):  # eight compares, eight bits
                    gt = _above8(Gi, j, up)
                    m |= gt << np.uint64(j - j0)
                    band |= _from8(Gi, j, dn) ^ gt
                for j in range(j8, j1):
                    g = Gi[j]
                    m |= np.uint64(g > up) << np.uint64(j - j0)
                    band |= np.uint64((g >= dn) & (g <= up))
                adj[i, w] = m
        if band:  # pairs within rounding of the threshold (rare): both bits as _cluster_roots decides the pair
            for i in range(n):
                for j in range(n):
                    g = G[i, j]
                    if i != j and dn <= g <= up:
                        bi = one << np.uint64(i & 63)
                        bj = one << np.uint64(j & 63)
                        if _linked(_dist2(xk, i, j), chord, lo, hi):
                            adj[i, j >> 6] |= bj
                            adj[j, i >> 6] |= bi
                        else:
                            adj[i, j >> 6] &= ~bj
                            adj[j, i >> 6] &= ~bi
        for w in range(W):
            m = n - 64 * w
            U[w] = ~np.uint64(0) if m >= 64 else (one << np.uint64(m)) - one
        count = 0
        left = n
        for i in range(n):
            if left == 0:
                break
            bi = one << np.uint64(i & 63)
            if U[i >> 6] & bi == 0:
                continue
            U[i >> 6] &= ~bi  # a new component from i: take every point reachable from it
            left -= 1
            count += 1
            stack[0] = i
            top = 1
            while top:
                top -= 1
                u = stack[top]
                for w in range(W):
                    new = adj[u, w] & U[w]
                    U[w] &= ~new
                    while new:
                        stack[top] = 64 * w + np.int64(_trailing_zeros(new))
                        top += 1
                        left -= 1
                        new &= new - one
        return count

    @njit(cache=True, fastmath=_nb._FM_SUM, inline="always")
    def _sa_stats_at(G, x, k, dl, cl, bufs, nclust, w, means):  # pragma: no cover - compiled
        """What a save of system k's input needs from its Gram matrix G before the step overwrites it:
        nclust[k] its cluster count (:func:`_gram_clusters`, dl what the directions returned) when nclust is
        not empty, means[k] = sum_i w[k, i] x[k, i] (the order parameter's barycentre) when means is not
        empty."""
        if nclust.shape[0]:
            nclust[k] = _gram_clusters(G, x[k], dl, cl, bufs[0], bufs[1], bufs[2])
        if means.shape[0]:
            xk = x[k]
            mk = means[k]
            for a in range(mk.shape[0]):
                mk[a] = 0.0
            for i in range(xk.shape[0]):
                wi = w[k, i]
                for a in range(mk.shape[0]):
                    mk[a] += wi * np.float64(xk[i, a])

    @njit(cache=True, fastmath=_nb._FM_SUM, inline="always")
    def _sa_exps_at(
        G, lw, k, bw, fw, spread, zero, inv_s, c, eb, counts, lses
    ):  # pragma: no cover - compiled
        """:func:`_sa_exps` for system k: its pair count into counts[k] and its energy sum into lses[k] when
        those arrays are not empty; returns whether the exponentials are symmetric when G is.  With eb > 0
        (float32 points, :func:`_pair_band`), counts[k] = -1 instead when some pair i != j has |G_ij - c| <= eb:
        one the count on G might decide otherwise than :func:`pair_counts` does."""
        near = False
        if eb > 0.0 and counts.shape[0]:
            near = _near_pairs(G, c, eb)
        cnt, lse, sym = _sa_exps(G, lw[k], bw, fw, spread, zero, inv_s, c, lses.shape[0] > 0)
        if counts.shape[0]:
            counts[k] = -1 if near else cnt
        if lses.shape[0]:
            lses[k] = lse
        return sym

    @njit(cache=True, fastmath=_nb._FM_SUM, inline="always")
    def _sa_move(xk, T, A, inv_s, dt, proj, y, outk):  # pragma: no cover - compiled
        """outk = (xk + dt P (A / s)) / |xk + dt P (A / s)| in float64, with P the tangent projection at the
        directions T when proj is 1.0 and the identity when it is 0.0; y a float64 buffer of r numbers.
        Returns the sum over rows of |y|^2 + 1/|y| (y the stepped row before normalization): finite
        exactly when every row of outk is (a row |y| = 0, infinite or NaN makes it infinite or NaN), so
        that the caller need not scan the output for non-finite numbers."""
        n, r = xk.shape
        health = 0.0
        for i in range(n):
            w = inv_s[i]
            xa = 0.0
            for l in range(r):
                a = np.float64(A[i, l]) * w
                y[l] = a
                xa += np.float64(T[i, l]) * a
            xa *= proj
            s = 0.0
            for l in range(r):
                v = np.float64(xk[i, l]) + dt * (y[l] - xa * np.float64(T[i, l]))
                y[l] = v
                s += v * v
            inv = 1.0 / np.sqrt(s)
            health += s + inv
            for l in range(r):
                outk[i, l] = y[l] * inv
        return health

    @njit(cache=True, fastmath=_nb._FM_SUM, inline="always")
    def _sa_directions_t(xk, X, TT, nrm):  # pragma: no cover - compiled
        """The transposed layout of :func:`_sa_euler_blas` (r <= :data:`SA_STEP_TRANSPOSED_MAX_DIM`): X (r, n)
        = xk^T in float64, TT (r, n) the directions x_i / |x_i| as columns, nrm (n) a float64 buffer.  The
        norms and the scaling run across the n tokens (vectors of tokens, not of r < 16 coordinates).  Returns
        :func:`_off_sphere` of the squared norms, as :func:`_sa_directions` does."""
        n, r = xk.shape
        for i in range(n):
            for l in range(r):
                X[l, i] = np.float64(xk[i, l])
        for i in range(n):
            nrm[i] = 0.0
        for l in range(r):
            for i in range(n):
                nrm[i] += X[l, i] * X[l, i]
        dl = 0.0
        for i in range(n):
            dl = max(dl, _off_sphere(nrm[i], r))
            nrm[i] = 1.0 / np.sqrt(nrm[i])
        for l in range(r):
            for i in range(n):
                TT[l, i] = X[l, i] * nrm[i]
        return dl

    @njit(cache=True, fastmath=_nb._FM_SUM, inline="always")
    def _sa_move_t(X, TT, AT, inv_s, dt, proj, Y, nrm, xa, outk):  # pragma: no cover - compiled
        """:func:`_sa_move` in the transposed layout: the averages AT (r, n) as columns, X and TT from
        :func:`_sa_directions_t`; Y (r, n), nrm and xa (n) float64 buffers.  Returns the same finiteness
        measure as :func:`_sa_move`."""
        r, n = X.shape
        for i in range(n):
            xa[i] = 0.0
        for l in range(r):
            for i in range(n):
                a = np.float64(AT[l, i]) * inv_s[i]
                Y[l, i] = a
                xa[i] += np.float64(TT[l, i]) * a
        for i in range(n):
            xa[i] *= proj
            nrm[i] = 0.0
        for l in range(r):
            for i in range(n):
                v = X[l, i] + dt * (Y[l, i] - xa[i] * np.float64(TT[l, i]))
                Y[l, i] = v
                nrm[i] += v * v
        health = 0.0
        for i in range(n):
            s = nrm[i]
            inv = 1.0 / np.sqrt(s)
            health += s + inv
            nrm[i] = inv
        for i in range(n):
            for l in range(r):
                outk[i, l] = Y[l, i] * nrm[i]
        return health

    @njit(cache=True, nogil=True, fastmath=_nb._FM_SUM, error_model="numpy")
    def _sa_euler(
        x,
        lw,
        beta,
        dt,
        floor,
        spread,
        proj,
        c,
        pb,
        k0,
        k1,
        out,
        counts,
        health,
        lses,
        cl,
        nclust,
        w,
        means,
    ):  # pragma: no cover - compiled
        """One Euler step of SA (Q = K = V = I) for each system k0 <= k < k1, serially and
        without the GIL, in L1/L2 (see :func:`sa_euler_step`): the directions theta = x/|x| (norms in
        float64), the Gram matrix (:func:`_gram_blocked` for 4 < r <= 16, else :func:`_mm`), the
        exponentials (:func:`_sa_exps`), the averages A = E theta / s (:func:`_avg_dots` for r <= 16,
        else :func:`_mm`), then out = (x + dt P A) / |x + dt P A| in float64 (:func:`_sa_move`), written
        in out's dtype, with P the tangent projection at theta when proj is 1.0 and the identity when
        proj is 0.0 (GLPR's scheme).  The directions, the Gram matrix, the exponentials and the
        averages are in the dtype of lw (float64, or float32 when the caller has checked that float32
        logits are accurate enough); row sums in float64.  counts[k] (when counts is not empty) = the
        ordered pairs i != j of the input's directions with <theta_i, theta_j> > c, from the same Gram
        matrix; health[k] finite exactly when out[k] is (:func:`_sa_move`); lses[k] (when lses is not empty)
        log sum_i w_i sum_j w_j e^(beta <theta_i, theta_j>) of the input (:func:`_sa_exps`); nclust[k] and
        means[k] the input's cluster count and barycentre when those arrays are not empty (:func:`_sa_stats_at`)."""
        B, n, r = x.shape
        wdt = lw.dtype
        zero = wdt.type(0)
        bw = wdt.type(beta)
        fw = wdt.type(floor)
        blocked = 4 < r <= _BLOCKED_MAX_R
        rp = -(-r // _GRAM_BLOCK) * _GRAM_BLOCK if blocked else r
        T = np.zeros((n, rp), wdt)  # (zero padding beyond r)
        TT = np.zeros((rp, n), wdt)
        G = np.empty((n, n), wdt)
        A = np.empty((n, r), wdt)
        y = np.empty(r)
        inv_s = np.empty(n)
        bufs = _cluster_buffers(n)
        for k in range(k0, k1):
            xk = x[k]
            dl = _sa_directions(xk, T)
            for i in range(n):
                for l in range(r):
                    TT[l, i] = T[i, l]
            if blocked:
                _gram_blocked(T, TT, G)
            else:
                _mm(T, TT, G)
            _sa_stats_at(G, x, k, dl, cl, bufs, nclust, w, means)
            _sa_exps_at(
                G, lw, k, bw, fw, spread, zero, inv_s, c, _pair_band(pb, dl, r), counts, lses
            )
            if r <= _BLOCKED_MAX_R:
                _avg_dots(G, TT, r, A)
            else:
                _mm(G, T, A)
            health[k] = _sa_move(xk, T, A, inv_s, dt, proj, y, out[k])

    @njit(cache=True, nogil=True, fastmath=_nb._FM_SUM, error_model="numpy")
    def _sa_euler_blas(
        x,
        lw,
        beta,
        dt,
        floor,
        spread,
        proj,
        c,
        pb,
        k0,
        k1,
        out,
        counts,
        health,
        lses,
        cl,
        nclust,
        w,
        means,
        fn,
    ):  # pragma: no cover - compiled
        """:func:`_sa_euler` with the two products of each system by BLAS (``fn`` the address of dgemm, or
        sgemm for float32 logits): the row-major directions T (n, r) are T^T in BLAS's column-major terms,
        so G = T T^T is gemm('T', 'N', n, n, r) of T with itself (exactly symmetric: the same products in the
        same order for G_ij and G_ji) and the averages A = E T, row-major (n, r), are
        A^T = T^T E^T = gemm('N', 'N', r, n, n) of T and E.  OpenBLAS's small-matrix kernels do these
        products 1.3-1.5x faster than :func:`_gram_blocked` / :func:`_avg_dots` (r = 8) or batched NumPy
        matmuls (r = 16...64), n = 32, one AVX-512 core.  Up to r = :data:`SA_STEP_TRANSPOSED_MAX_DIM` the
        directions and averages are kept as columns (:func:`_sa_directions_t`, :func:`_sa_move_t`).  Its loops are vectorized 512 bits wide where the
        core has AVX-512 (:func:`~wflow.kernels.numba_backend._prefer_wide_vectors`)."""
        _nb._prefer_wide_vectors()
        B, n, r = x.shape
        wdt = lw.dtype
        zero = wdt.type(0)
        bw = wdt.type(beta)
        fw = wdt.type(floor)
        G = np.empty((n, n), wdt)
        inv_s = np.empty(n)
        bufs = _cluster_buffers(n)
        ints = np.empty(6, np.int32)
        chars = np.empty(2, np.uint8)
        chars[0] = 78  # 'N'
        chars[1] = 84  # 'T'
        scal = np.empty(2, wdt)
        scal[0] = 1
        scal[1] = 0
        if r <= SA_STEP_TRANSPOSED_MAX_DIM:
            # the transposed layout: the directions and averages as columns TT, AT (r, n), which BLAS reads
            # as the n x r matrices T and A; G = T T^T = gemm('N', 'T', n, n, r) (exactly symmetric, as
            # below), A = E T = gemm('T', 'N', n, r, n) of the row-major E and T
            X = np.empty((r, n))
            TT = np.empty((r, n), wdt)
            AT = np.empty((r, n), wdt)
            Y = np.empty((r, n))
            nrm = np.empty(n)
            xa = np.empty(n)
            for k in range(k0, k1):
                dl = _sa_directions_t(x[k], X, TT, nrm)
                _gemm(fn, 0, 1, n, n, r, TT, n, TT, n, G, n, ints, chars, scal)
                _sa_stats_at(G, x, k, dl, cl, bufs, nclust, w, means)
                sym = _sa_exps_at(
                    G, lw, k, bw, fw, spread, zero, inv_s, c, _pair_band(pb, dl, r), counts, lses
                )
                # A = E T; when E is symmetric (G is: see above) E^T T, gemm('N', 'N'), which OpenBLAS does
                # 1.7x faster than its 'T', 'N' for n = 32, r = 8
                _gemm(fn, 0 if sym else 1, 0, n, r, n, G, n, TT, n, AT, n, ints, chars, scal)
                health[k] = _sa_move_t(X, TT, AT, inv_s, dt, proj, Y, nrm, xa, out[k])
            return
        T = np.empty((n, r), wdt)
        A = np.empty((n, r), wdt)
        y = np.empty(r)
        for k in range(k0, k1):
            xk = x[k]
            dl = _sa_directions(xk, T)
            _gemm(fn, 1, 0, n, n, r, T, r, T, r, G, n, ints, chars, scal)
            _sa_stats_at(G, x, k, dl, cl, bufs, nclust, w, means)
            _sa_exps_at(
                G, lw, k, bw, fw, spread, zero, inv_s, c, _pair_band(pb, dl, r), counts, lses
            )
            _gemm(fn, 0, 0, r, n, n, T, r, G, n, A, r, ints, chars, scal)
            health[k] = _sa_move(xk, T, A, inv_s, dt, proj, y, out[k])

    @njit(cache=True, nogil=True, fastmath=_nb._FM_SUM, error_model="numpy")
    def _sa_directions_chunk(x, k0, T, dls):  # pragma: no cover - compiled
        """T[k] = the directions of the system k0 + k and dls[k] what :func:`_sa_directions` returns of it, for
        the GEMM route of :func:`sa_euler_step`."""
        for k in range(T.shape[0]):
            dls[k] = _sa_directions(x[k0 + k], T[k])

    @njit(cache=True, nogil=True, fastmath=_nb._FM_SUM, error_model="numpy")
    def _sa_exps_chunk(
        G, lw, k0, beta, floor, spread, inv_s, c, pb, counts, lses, x, dls, cl, nclust, w, means
    ):  # pragma: no cover - compiled
        """:func:`_sa_exps` for each Gram matrix G[k] of the systems k0 + k (GEMM route); their pair counts
        in counts[k0 + k] when counts is not empty, their energy sums in lses[k0 + k] when lses is not, their
        inputs' cluster counts and barycentres (:func:`_sa_stats_at`, dls from :func:`_sa_directions_chunk`)
        when nclust and means are not."""
        wdt = G.dtype
        zero = wdt.type(0)
        bw = wdt.type(beta)
        fw = wdt.type(floor)
        bufs = _cluster_buffers(G.shape[1])
        for k in range(G.shape[0]):
            _sa_stats_at(G[k], x, k0 + k, dls[k], cl, bufs, nclust, w, means)
            _sa_exps_at(
                G[k],
                lw,
                k0 + k,
                bw,
                fw,
                spread,
                zero,
                inv_s[k],
                c,
                _pair_band(pb, dls[k], x.shape[2]),
                counts,
                lses,
            )

    @njit(cache=True, nogil=True, fastmath=_nb._FM_SUM, error_model="numpy")
    def _sa_move_chunk(x, T, A, inv_s, dt, proj, k0, out, health):  # pragma: no cover - compiled
        """:func:`_sa_move` for the systems k0 + k (GEMM route)."""
        y = np.empty(x.shape[2])
        for k in range(T.shape[0]):
            health[k0 + k] = _sa_move(x[k0 + k], T[k], A[k], inv_s[k], dt, proj, y, out[k0 + k])

    @njit(cache=True, nogil=True)
    def _count_above(G, c, out):  # pragma: no cover - compiled
        """out[k] = #{(i, j): i != j, G[k, i, j] > c} (ordered pairs; GEMM route of :func:`pair_counts`)."""
        for k in range(G.shape[0]):
            out[k] = _count_off_diagonal(G[k], c)

    @njit(cache=True, nogil=True, fastmath=_nb._FM_SUM)
    def _pair_counts(x, c, k0, k1, out):  # pragma: no cover - compiled
        """out[k] = #{(i, j): i != j, <x_i, x_j> > c} for k0 <= k < k1 (the Gram matrix in float64 by
        :func:`_gram_blocked` or :func:`_mm`, as in :func:`_sa_euler`, then :func:`_count_off_diagonal`)."""
        B, n, r = x.shape
        blocked = 4 < r <= _BLOCKED_MAX_R
        rp = -(-r // _GRAM_BLOCK) * _GRAM_BLOCK if blocked else r
        T = np.zeros((n, rp))
        TT = np.zeros((rp, n))
        G = np.empty((n, n))
        for k in range(k0, k1):
            for i in range(n):
                for l in range(r):
                    v = np.float64(x[k, i, l])
                    T[i, l] = v
                    TT[l, i] = v
            if blocked:
                _gram_blocked(T, TT, G)
            else:
                _mm(T, TT, G)
            out[k] = _count_off_diagonal(G, c)

else:  # pragma: no cover
    _softmax_rows = None
    _fused_sums = None
    _pair_counts = None
    _sa_euler = None
    _sa_directions_chunk = _sa_exps_chunk = _sa_move_chunk = _count_above = None


def _logits_in_float32(
    a: np.ndarray,
    b: np.ndarray,
    logw: np.ndarray,
    floor: float,
    tol: float | None = None,
    scale: float = 1.0,
) -> tuple[bool, np.ndarray, np.ndarray]:
    """Whether float32 logits ``scale <a_i, b_j> + log w_j`` are accurate enough (module docstring),
    with log-weights relative to each system's maximum.

    The bound on a term's relative error must stay below :data:`LOWP_LOGIT_ERROR`, or below
    ``tol / 3`` when the caller asked for that looser relative accuracy."""
    sq = lambda z: float(np.max(np.einsum("...i,...i->...", z, z, dtype=np.float64), initial=0.0))  # noqa: E731
    size = abs(scale) * math.sqrt(sq(a) * sq(b)) * (1.0 + 1e-6)
    return _float32_logits_bound(a.shape[-1], size, logw, floor, tol)


#: Force the method of :func:`small_sums` ("fused" or "gemm"; None: :func:`choose_method`).
FORCE_METHOD: str | None = None
#: :func:`sa_euler_step` takes each system's two products by BLAS from inside one compiled pass
#: (:func:`_sa_euler_blas`); ``False`` selects the two routes below, numba's own products or batched NumPy
#: GEMMs (kept to check against).  At n = 32, one thread, round-robin medians of 15: 256 systems
#: r = 8 0.61 against 0.92 ms (one pass), r = 16 1.29 against 1.78 ms, r = 32 2.01 against 2.51 ms,
#: r = 64 3.25 against 4.20 ms (GEMM route); 2048 systems r = 2 3.7 against 4.3 ms, r = 8 5.3 against 7.8 ms.
SA_STEP_BLAS = True
#: With :data:`SA_STEP_BLAS` off, the largest dimension r for which :func:`sa_euler_step` forms each system's
#: products in numba's own loops in one compiled pass; beyond it batched GEMMs per chunk of systems.  Measured at n = 32 (two threads, 256 and 2048 systems,
#: round-robin medians): the one pass 0.80-0.92x of the GEMM route's time at r = 8, 1.0-1.25x at r = 9...16.
SA_STEP_FUSED_MAX_DIM = 8
#: The same for :func:`pair_counts` (one product per system instead of two): the one pass 0.66-0.88x of the
#: GEMM route's time at r = 16...20, 0.95-1.02x at r = 24, 1.01-1.19x at r = 28...32, 1.3x at r = 48.
PAIR_COUNTS_FUSED_MAX_DIM = 24


def choose_method(n: int, m: int, p: int, q: int, B: int = 1, dtype=np.float64) -> str:
    """``"fused"`` (one compiled pass per system: small matrix products, exponentials, value
    products) or ``"gemm"`` (batched BLAS GEMMs around one exponential pass, in worker threads) for
    ``B`` systems of ``n`` x ``m`` pairs, logit dimension ``p`` and value dimension ``q`` in ``dtype``:
    the one with the least time predicted by the cost model of :mod:`wflow.kernels.cost`.

    Measured side by side (``python -m benchmarks.small_systems --costs``): the fused pass is the
    faster at low dimension (1.4--2x at d = 3 and 8, n = 32), the GEMMs from d = 32--64 on (OpenBLAS
    beats the compiled dots), with the crossing depending on the batch and the sizes too (at
    d = 48, one system of 40 tokens, the fused pass is 1.3--1.4x faster).  Between these two methods
    the model, fitted on one grid of shapes, picks the faster in 23 of 28 other shapes (within 10 %
    in 24), as does the dimension rule it replaced (fused up to d = 16): no better on average, but it
    prices the batch and the sizes too, and ``python -m benchmarks.small_systems --costs`` prints
    coefficients for another machine, to paste into :data:`wflow.kernels.cost.COSTS`.

    Examples
    --------
    >>> from wflow.kernels import small
    >>> small.choose_method(32, 32, 128, 128, B=256)  # high dimension: BLAS GEMMs
    'gemm'
    >>> small.choose_method(32, 32, 3, 3, B=256) == ("gemm" if small._fused_sums is None else "fused")
    True
    """
    if FORCE_METHOD is not None:
        return FORCE_METHOD
    if _fused_sums is None:
        return "gemm"
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
    ldt = np.float64
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
    # small problems run in the calling thread: waking worker threads on a loaded 2-core
    # machine was measured to cost milliseconds, more than the whole sum
    threads = _threads() if B * n * m * (p + q) >= SERIAL_MAX_FLOPS else 1
    chunks = _chunk_bounds(B, n * m, threads, CHUNK_PAIRS)
    if choose_method(n, m, p, q, B, np.dtype(dtype)) == "fused":
        c_w = cw if cw is not None else np.empty((B, m, 0), dtype=wdt)
        v_w = vec if vec is not None else np.empty((B, n, 0), dtype=wdt)
        a_l, b_l, sc = a.astype(ldt, copy=False), b.astype(ldt, copy=False), ldt(scale)

        def fused(t: int) -> None:
            for b0, b1 in chunks[t::threads]:
                _fused_sums(a_l, b_l, c_w, lw_l, sc, fl, zero, b0, b1, shift, mass, v_w)

        _run(fused, threads, len(chunks))
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
            _softmax_rows(Lc, ldt(scale), lw_l[b0:b1], Ec, shift[b0:b1], mass[b0:b1], fl, zero)
            if q:
                np.matmul(Ec, cw[b0:b1], out=vec[b0:b1])

    with _nb._blas_threads(1):
        _run(work, threads, len(chunks))
    return _finish(shift, mass, vec, lw_max, ldt, wdt)


def _run(work, threads: int, n_chunks: int) -> None:
    """``work(t)`` for t = 0..threads-1 (worker t takes chunks t, t + threads, ...), in the calling
    thread when there is one worker or one chunk."""
    if threads == 1 or n_chunks == 1:
        for t in range(threads):  # (with one chunk, workers t > 0 have nothing to do)
            work(t)
    else:
        _nb._parallel(work, min(threads, n_chunks))


def _finish(shift, mass, vec, lw_max, ldt, wdt):
    if lw_max is not None and ldt is np.float32:
        shift += lw_max[:, None]
    if wdt is not np.float64:
        # report the shift in the output dtype and make mass and vector consistent with it
        c32 = shift.astype(wdt)
        f = np.exp(shift - c32.astype(np.float64)).astype(wdt)
        mass *= f
        if vec is not None:
            vec *= f[..., None]
        shift = c32
    return shift, mass, vec


def sa_euler_step(
    x: np.ndarray,
    weights: np.ndarray,
    beta: float,
    dt: float,
    out: np.ndarray | None = None,
    projected: bool = True,
    log_weights: np.ndarray | None = None,
    count_pairs_above: float | None = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    r"""One explicit Euler step of SA with :math:`Q = K = V = I`, fused, for a batch of tiny systems.

    .. math::

        \theta_i = \frac{x_i}{|x_i|}, \qquad
        A_i = \frac{\sum_j w_j e^{\beta\langle\theta_i, \theta_j\rangle}\,\theta_j}{\sum_j w_j e^{\beta\langle\theta_i, \theta_j\rangle}},
        \qquad
        x_i \leftarrow \frac{x_i + h\,(A_i - \langle\theta_i, A_i\rangle\theta_i)}{|x_i + h\,(A_i - \langle\theta_i, A_i\rangle\theta_i)|}

    -- what :class:`wflow.solvers.steppers.Euler` computes through the particle problem's
    ``rhs`` (velocity at :math:`\theta`, the SA average projected on the tangent plane) and
    ``retract``, but in one compiled pass per system (worker threads take chunks of systems)
    with no array of the batch's size in between: the Gram matrix and the averages by BLAS's gemm
    called from the compiled pass (OpenBLAS's small-matrix kernels; :data:`SA_STEP_BLAS`), the
    softmax (shifted by :math:`|\beta|` + the largest log-weight, a bound of every logit, or by each
    row's maximum when the log-weights span more than :math:`600 - 2\max(-\beta, 0)`, 60 in place of
    600 in float32), the projection and the retraction, in float64 (1.2-1.5x faster steps than
    numba's own products or batched NumPy GEMMs, the two earlier routes, which ``SA_STEP_BLAS =
    False`` selects: products in the pass up to :data:`SA_STEP_FUSED_MAX_DIM`, batched GEMMs per
    chunk of systems beyond).  float32 input: the directions, logits, exponentials and averages in
    float32 when the logits' rounding is provably small,
    :math:`2^{-24}\big((r+4)|\beta| + 2\,\mathrm{span}\log w\big) \le 3\cdot 10^{-6}` (the rule
    of the kernel sums, :math:`|\theta| = 1` bounding every logit by :math:`|\beta|`, with
    :math:`2|\beta|` more for the directions' rounding to float32; as there, the shift's subtraction
    adds at most :math:`2^{-24}(\mathrm{span}\log w + \log n)` to the sums' relative error), with row
    sums, projection and retraction in float64 and a float32 result; float64 logits otherwise.
    Measured against the float64 step at :math:`\beta = 4.15`, :math:`r = 8`, :math:`h = 0.1`: 3.6e-8, of
    which the result's own rounding is 3.0e-8.
    With ``projected=False`` the average is not projected on the tangent plane:
    :math:`x_i \leftarrow (x_i + hA_i)/|x_i + hA_i|`, the published scheme of the GLPR phase
    diagram (what :class:`wflow.solvers.steppers.EulerAverage` computes).

    Parameters
    ----------
    x : ndarray, shape (..., n, r)
        Points (on the sphere up to rounding); leading axes are independent systems,
        ``n <=`` :data:`SMALL_MAX`.  ``r`` may be the dimension ``d`` or the number of
        coordinates in an orthonormal basis of the points' span (:func:`span_coordinates`):
        the step commutes with orthogonal maps.
    weights : ndarray, shape (..., n)
        Non-negative token weights.
    beta : float
    dt : float
        The step :math:`h`.
    out : ndarray, shape (..., n, r), optional
        Where to write the new points (may be ``x`` itself).
    projected : bool
        Project the average on the tangent plane (projected Euler, the default) or not (GLPR's scheme).
    log_weights : ndarray, shape (..., n), optional
        ``max(log(weights), -1e300)`` as float64 when the caller keeps it between steps (a run's weights do
        not change); formed here otherwise.
    count_pairs_above : float, optional
        Also count, per system, the ordered pairs :math:`i \ne j` of the *input* with
        :math:`\langle\theta_i, \theta_j\rangle` above this cosine (the phase diagram's observable),
        from the Gram matrix of the directions the step forms anyway: a compare per entry instead of a
        second pass.  For float64 points on the sphere (to rounding) that is :func:`pair_counts`' count
        of :math:`\langle x_i, x_j\rangle > c` but for a pair within :math:`10^{-15}` of the threshold.
        float32 points get :func:`pair_counts`' count exactly: when their logits are float64 it is read
        off the step's float64 Gram matrix but in the systems with a pair within a proven bound of the
        threshold (about 1e-7: the points lie off the sphere by float32 rounding), which
        :func:`pair_counts` counts after the step; otherwise, and in place, :func:`pair_counts` counts
        them all before the step (so ``out`` may be ``x``).

    Returns
    -------
    ndarray, shape (..., n, r)
        The new points, in ``x``'s dtype (float32 or float64); with ``count_pairs_above``, the pair
        ``(points, counts)``, counts int64 of shape ``(...)``.

    Examples
    --------
    >>> from wflow import sphere
    >>> x = sphere.uniform(8, 3, seed=0, batch=(2,))
    >>> y = sa_euler_step(x, np.full((2, 8), 1 / 8), 5.0, 0.1)
    >>> bool(np.allclose(np.linalg.norm(y, axis=-1), 1.0))
    True
    >>> z = sa_euler_step(x, np.full((2, 8), 1 / 8), 5.0, 0.1, projected=False)  # GLPR's scheme
    >>> bool(np.allclose(np.linalg.norm(z, axis=-1), 1.0)), bool(np.abs(z - y).max() < 1e-2)
    (True, True)
    >>> y2, counts = sa_euler_step(x, np.full((2, 8), 1 / 8), 5.0, 0.1, count_pairs_above=0.5)  # the input's pairs
    >>> bool((y2 == y).all()), bool((counts == pair_counts(x, 0.5)).all())
    (True, True)
    """
    st = _sa_euler_step(x, weights, beta, dt, out, projected, log_weights, count_pairs_above)
    return st.points if st.counts is None else (st.points, st.counts)


class _Step(NamedTuple):
    """What :func:`_sa_euler_step` returns: the new points, whether they are all finite, and what was asked of
    the input (``None`` otherwise), each of shape ``x.shape[:-2]`` but ``means``, ``x.shape[:-2] + (r,)``."""

    points: np.ndarray
    finite: bool
    counts: np.ndarray | None = None
    energy_sums: np.ndarray | None = None
    n_clusters: np.ndarray | None = None
    means: np.ndarray | None = None


def _sa_euler_step(
    x,
    weights,
    beta,
    dt,
    out=None,
    projected=True,
    log_weights=None,
    count_pairs_above=None,
    energy_sums=False,
    cluster_threshold=None,
    means=False,
    strict=True,
) -> _Step:
    """:func:`sa_euler_step` as a :class:`_Step`: ``finite`` says whether every new point is finite, known
    from the compiled pass's row norms (no scan of the output).  Of the input, from the Gram matrix and row
    sums the step forms anyway, when they are float64 (float64 points, and float32 points whose logits the
    float32 rule keeps in float64, as at beta = 5 for r >= 7; otherwise a ValueError, or with ``strict=False``
    None for each): with ``energy_sums``, per system
    log sum_i w_i sum_j w_j e^(beta <theta_i, theta_j>) (:meth:`wflow.models.SA.log_energy` less log 2 beta);
    with ``cluster_threshold`` (radians), :func:`wflow.diagnostics.count_clusters`' count, exactly
    (:func:`_gram_clusters`; count_clusters clusters systems of up to BATCHED_MAX_N = 512 >= SMALL_MAX
    points by :func:`wflow.diagnostics._cluster_roots`, whose decisions it reproduces); with ``means``,
    sum_i w_i x_i (:meth:`wflow.Atoms.mean`, to rounding)."""
    if _sa_euler is None:
        from ..errors import WflowError

        raise WflowError(f"sa_euler_step needs numba: {_nb._NUMBA_ERROR}")
    x = np.asarray(x)
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float64)
    if x.ndim < 2 or x.shape[-2] == 0 or x.shape[-2] > SMALL_MAX or x.shape[-1] == 0:
        raise ValueError(
            f"x must have shape (..., n, r) with 1 <= n <= {SMALL_MAX} and r >= 1, got shape {x.shape}"
        )
    n, r = x.shape[-2:]
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != x.shape[:-1]:
        raise ValueError(f"weights must have shape {x.shape[:-1]}, got {w.shape}")
    xf = np.ascontiguousarray(x).reshape(-1, n, r)
    if log_weights is None:
        log_weights = step_log_weights(w)
    lw = np.asarray(log_weights, dtype=np.float64).reshape(-1, n)
    if out is None:
        out = np.empty(x.shape, dtype=x.dtype)
    of = out.reshape(-1, n, r)  # (a view: out must be contiguous)
    B = xf.shape[0]
    threads = _threads() if B * n * n * 2 * r >= SERIAL_MAX_FLOPS else 1
    chunks = _chunk_bounds(B, n * n, threads, CHUNK_PAIRS)
    be, h = float(beta), float(dt)
    proj = 1.0 if projected else 0.0
    fl, spread = _nb.exp_floor(np.dtype(np.float64)), _FIXED_SHIFT_SPREAD
    if x.dtype == np.float32:
        # float32 directions, logits, exponentials and averages when the logits' rounding is provably
        # small: the rule of the kernel sums for dimension r + 2 (|theta| = 1, so every logit is at most
        # |beta| in size; the directions, formed in float64, are rounded to float32: 2 |beta| 2^-24 more)
        fl32 = _nb.exp_floor(np.dtype(np.float32))
        ok, lw_rel, _ = _float32_logits_bound(r + 2, abs(be) * (1.0 + 1e-6), lw, fl32)
        if ok:
            lw = lw_rel
            fl, spread = fl32, _FIXED_SHIFT_SPREAD_32

    count = count_pairs_above is not None
    c = 2.0  # the kernels' threshold when they do not count: above every cosine (finite: no infinities there)
    counts = kcounts = np.zeros(
        0, dtype=np.int64
    )  # kcounts: what the kernels count into (nothing if empty)
    pb = 0.0  # 1.0: the kernels flag the systems with a pair near c (float32 points, see below)
    if count:
        cp = float(count_pairs_above)
        if not math.isfinite(cp):
            raise ValueError(
                f"count_pairs_above must be a finite cosine, got {count_pairs_above!r}"
            )
        if x.dtype == np.float64:
            c = cp
            counts = kcounts = np.zeros(B, dtype=np.int64)
        elif lw.dtype == np.float64 and not np.may_share_memory(out, xf):
            # float32 points, float64 Gram matrix of their directions: pair_counts' count (float64 products of
            # the points) wherever no pair lies within _pair_band of c; the systems with one (about 1e-3 of
            # them at a save near c = 0.999) are counted by pair_counts after the step, from the input (not
            # overwritten: out is elsewhere)
            c, pb = cp, 1.0
            counts = kcounts = np.zeros(B, dtype=np.int64)
        else:  # float32 logits (a float32 Gram matrix), or in place: pair_counts' products, before out is written
            counts = pair_counts(xf, cp)
    health = np.zeros(B)
    if lw.dtype != np.float64:  # float32 logits: the Gram matrix is float32, too coarse for these
        for name, asked in (
            ("energy_sums", energy_sums),
            ("cluster_threshold", cluster_threshold is not None),
            ("means", means),
        ):
            if asked and strict:
                raise ValueError(
                    f"{name} needs a float64 Gram matrix: float64 points, or float32 points whose "
                    f"logits the float32 rule keeps in float64; got float32 logits (beta={be:g}, r={r})"
                )
        energy_sums, cluster_threshold, means = False, None, False
    lses = np.zeros(B if energy_sums else 0)
    cl = np.zeros(4)
    nclust = np.zeros(0, dtype=np.int64)
    if cluster_threshold is not None:
        from ..diagnostics import _link

        chord, lo, hi = _link(cluster_threshold)
        cl[:] = chord, 1.0 - 0.5 * chord * chord, lo, hi
        nclust = np.zeros(B, dtype=np.int64)
    wm = w.reshape(-1, n) if means else np.zeros((0, n))
    mf = np.zeros((B if means else 0, r))
    if B == 0:
        pass
    elif SA_STEP_BLAS or r <= SA_STEP_FUSED_MAX_DIM:
        shares = _shares(B, min(threads, len(chunks)))
        # BLAS inside the compiled pass (dgemm or sgemm at the address passed last), one thread each; or
        # numba's own products
        kernel, blas = (_sa_euler_blas, (_GEMM[lw.dtype],)) if SA_STEP_BLAS else (_sa_euler, ())

        def work(t: int) -> None:
            kernel(
                xf,
                lw,
                be,
                h,
                fl,
                spread,
                proj,
                c,
                pb,
                *shares[t],
                of,
                kcounts,
                health,
                lses,
                cl,
                nclust,
                wm,
                mf,
                *blas,
            )

        with _nb._blas_threads(1) if blas else contextlib.nullcontext():
            _nb._parallel(work, len(shares))
    else:
        _sa_step_gemm(
            xf,
            lw,
            be,
            h,
            fl,
            spread,
            proj,
            c,
            pb,
            chunks,
            threads,
            of,
            kcounts,
            health,
            lses,
            (cl, nclust, wm, mf),
        )
    finite = np.isfinite(health)
    all_finite = bool(finite.all())
    if pb:
        near = counts < 0
        if (
            not all_finite
        ):  # systems with zero, infinite or NaN rows: no decision from their Gram matrix (the
            near |= ~finite  # kernels' fast-math compares promise nothing about NaN)
        if near.any():
            counts[near] = pair_counts(xf[near], cp)
    batch = x.shape[:-2]
    return _Step(
        out,
        all_finite,
        counts.reshape(batch) if count else None,
        lses.reshape(batch) if energy_sums else None,
        nclust.reshape(batch) if cluster_threshold is not None else None,
        mf.reshape(batch + (r,)) if means else None,
    )


def _sa_step_gemm(
    xf, lw, be, h, fl, spread, proj, c, pb, chunks, threads, of, counts, health, lses, stats
) -> None:
    """The GEMM route of :func:`sa_euler_step` (``r >`` :data:`SA_STEP_FUSED_MAX_DIM`); ``stats`` = (cl, nclust,
    w, means), the arguments of :func:`_sa_stats_at` (what a save asks of the input)."""

    # the Gram matrices and the averages of a chunk of systems by batched GEMMs (BLAS on one thread
    # inside each worker), the directions, exponentials and the move in compiled passes
    n, r = xf.shape[1:]
    size = chunks[0][1] - chunks[0][0]

    def gemm_work(t: int) -> None:
        T = np.empty((size, n, r), lw.dtype)
        G = np.empty((size, n, n), lw.dtype)
        A = np.empty((size, n, r), lw.dtype)
        inv_s = np.empty((size, n))
        dls = np.empty(size)
        for b0, b1 in chunks[t::threads]:
            C = b1 - b0
            Tc, Gc, Ac, ic = T[:C], G[:C], A[:C], inv_s[:C]
            _sa_directions_chunk(xf, b0, Tc, dls)
            np.matmul(Tc, Tc.swapaxes(1, 2), out=Gc)
            _sa_exps_chunk(Gc, lw, b0, be, fl, spread, ic, c, pb, counts, lses, xf, dls, *stats)
            np.matmul(Gc, Tc, out=Ac)
            _sa_move_chunk(xf, Tc, Ac, ic, h, proj, b0, of, health)

    with _nb._blas_threads(1):
        _run(gemm_work, threads, len(chunks))


def step_log_weights(weights: np.ndarray) -> np.ndarray:
    """The log-weights :func:`sa_euler_step` takes: ``max(log w, -1e300)`` in float64 (zero weights finite).

    Examples
    --------
    >>> step_log_weights(np.array([1.0, 0.0])).tolist()
    [0.0, -1e+300]
    """
    with np.errstate(divide="ignore"):
        return np.maximum(np.log(np.asarray(weights, dtype=np.float64)), _nb._LOG_ZERO)


def pair_counts(x: np.ndarray, c: float) -> np.ndarray:
    r"""Ordered pairs :math:`i \ne j` with :math:`\langle x_i, x_j\rangle > c`, per system, for batches of tiny systems.

    One compiled pass per system (the Gram matrix in float64, then the count off its diagonal), or for
    ``r >`` :data:`PAIR_COUNTS_FUSED_MAX_DIM` a batched GEMM per chunk of systems and a compiled count
    (1.2-1.7x faster at r = 32...128, n = 32), worker threads over chunks of systems;
    :func:`wflow.diagnostics.pair_fraction` takes it for ``n <=`` :data:`SMALL_MAX` when numba is present.

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
    if _pair_counts is None:
        from ..errors import WflowError

        raise WflowError(f"pair_counts needs numba: {_nb._NUMBA_ERROR}")
    x = np.asarray(x)
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float64)
    if x.ndim < 2 or x.shape[-2] > SMALL_MAX:
        raise ValueError(
            f"x must have shape (..., n, r) with n <= {SMALL_MAX}, got shape {x.shape}"
        )
    batch, (n, r) = x.shape[:-2], x.shape[-2:]
    xf = np.ascontiguousarray(x).reshape(-1, n, r)
    B = xf.shape[0]
    out = np.zeros(B, dtype=np.int64)
    threads = _threads() if B * n * n * r >= SERIAL_MAX_FLOPS else 1
    chunks = _chunk_bounds(B, n * n, threads, CHUNK_PAIRS)
    cf = float(c)

    shares = _shares(B, min(threads, len(chunks)))

    def work(t: int) -> None:  # the compiled pass loops over its share's systems
        _pair_counts(xf, cf, *shares[t], out)

    def gemm_work(t: int) -> None:  # larger r: the Gram matrices of a chunk by a batched GEMM
        G = np.empty((chunks[0][1] - chunks[0][0], n, n))
        for b0, b1 in chunks[t::threads]:
            xc = xf[b0:b1].astype(np.float64, copy=False)
            np.matmul(xc, xc.swapaxes(1, 2), out=G[: b1 - b0])
            _count_above(G[: b1 - b0], cf, out[b0:b1])

    if B and n:
        if r <= PAIR_COUNTS_FUSED_MAX_DIM:
            _nb._parallel(work, len(shares))
        else:
            with _nb._blas_threads(1):
                _run(gemm_work, threads, len(chunks))
    return out.reshape(batch)


def span_coordinates(x: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    r"""Coordinates of points in an orthonormal basis of their span: ``x = y @ basis``.

    With :math:`Q = K = V = I` every token of SA/USA moves in the span of the initial tokens
    (:math:`\dot x_i` is a combination of the :math:`x_j`), and the flow commutes with
    orthogonal maps: ``n`` tokens in dimension ``d > n`` evolve exactly as their ``n``
    coordinates :math:`y = x U^\top` in an orthonormal basis :math:`U` of that span (a
    thin QR factorization :math:`x^\top = U^\top R`, :math:`y = R^\top`), at ``n / d`` of the
    cost.  Inner products, hence every pair or cluster diagnostic, are the same in ``y``
    (to rounding).

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
    with _nb._blas_threads(
        1
    ):  # (OpenBLAS splitting each small factorization over a loaded machine's cores:
        # measured 30 s for 256 systems at d = 1024)
        q, rr = np.linalg.qr(
            np.swapaxes(x, -1, -2)
        )  # x^T = q rr, q (..., d, n) orthonormal columns
    return np.ascontiguousarray(np.swapaxes(rr, -1, -2)), np.ascontiguousarray(
        np.swapaxes(q, -1, -2)
    )
