r"""Compiled small-matrix primitives of the tiny-systems kernels: BLAS's gemm called from compiled code,
row-major small products, blocked Gram matrices, dot-product averages and softmax rows.

Shared by :mod:`wflow.kernels.small`, the fused SA step (:mod:`wflow.solvers.fused`) and
:func:`wflow.diagnostics.pair_counts`: inner loops run along contiguous rows so that LLVM
vectorizes them, and every product sums in a fixed order (:math:`TT^\top` is exactly symmetric).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir as _ir
from numba import njit
from numba.core import types as _types
from numba.extending import get_cython_function_address, intrinsic

from .jit import FM_SUM, exp_as

__all__ = [
    "GEMM",
    "gemm_call",
    "gemm",
    "softmax_row",
    "softmax_rows",
    "mm",
    "gram_blocked",
    "fused_sums",
    "count_off_diagonal",
    "GRAM_BLOCK",
    "BLOCKED_MAX_R",
]

#: coordinates per block of :func:`gram_blocked` (a compile-time constant: the block's sum is unrolled)
GRAM_BLOCK = 8
#: :func:`wflow.diagnostics.pair_counts` (up to its ``PAIR_COUNTS_FUSED_MAX_DIM``) forms the Gram matrix
#: blocked (:func:`gram_blocked`) for dimensions 4 < r <= this, by :func:`mm` beyond (equal at r = 32)
BLOCKED_MAX_R = 16


#: the addresses of BLAS's dgemm and sgemm (scipy's Cython wrappers, Fortran calling convention),
#: called from compiled passes by :func:`gemm`
GEMM = {
    np.dtype(np.float64): get_cython_function_address("scipy.linalg.cython_blas", "dgemm"),
    np.dtype(np.float32): get_cython_function_address("scipy.linalg.cython_blas", "sgemm"),
}


@intrinsic
def gemm_call(typingctx, fn, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
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
def gemm(fn, ta, tb, m, n, k, a, lda, b, ldb, c, ldc, ints, chars, scal):  # pragma: no cover
    """C = op(A) op(B) in BLAS's column-major terms (``ta``, ``tb`` 0 for 'N', 1 for 'T'); ``ints`` an
    int32 buffer of 6, ``chars`` the bytes 'N', 'T', ``scal`` (1, 0) in the arrays' dtype."""
    ints[0] = m
    ints[1] = n
    ints[2] = k
    ints[3] = lda
    ints[4] = ldb
    ints[5] = ldc
    gemm_call(
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


@njit(cache=True, fastmath=FM_SUM, inline="always")
def softmax_row(Li, Ei, scale, lwk, fl, zero):  # pragma: no cover - compiled
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
        v = exp_as(max(Li[j] - mx, fl), zero)
        Ei[j] = v
        t += v
    return mx, t


@njit(cache=True, nogil=True, fastmath=FM_SUM)
def softmax_rows(L, scale, lw, E, shift, mass, fl, zero):  # pragma: no cover - compiled
    """L (C, n, m) inner products (float64, or float32 when accurate enough), scale the factor
    beta, lw (C, m) log-weights and fl the exponent floor, both in L's dtype; writes
    E (C, n, m) = e^(scale L + lw - c) in the dtype of zero (E may be L itself), the shift
    c (C, n) float64 (the exact row maximum) and mass (C, n) in the dtype of zero
    (accumulated in float64)."""
    C, n, m = L.shape
    for k in range(C):
        for i in range(n):
            shift[k, i], mass[k, i] = softmax_row(L[k, i], E[k, i], scale, lw[k], fl, zero)


@njit(cache=True, fastmath=FM_SUM)
def mm(A, Bt, C):  # pragma: no cover - compiled
    """C = A Bt for small row-major A (n, K), Bt (K, m), two rows of C at a time: for each l,
    C[i] += A[i, l] Bt[l] and C[i + 1] += A[i + 1, l] Bt[l], loops over the contiguous rows that
    the compiler vectorizes (each load of Bt feeds two FMAs), sums in the order l = 0, 1, ...
    (so T T^T comes out exactly symmetric).  Unsigned row indices: no negative-index wraparound
    in the address arithmetic."""
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


@njit(cache=True, fastmath=FM_SUM)
def gram_blocked(T, TT, G):  # pragma: no cover - compiled
    """G = T T^T for T (n, rp) and TT = T^T (rp, n), rp a multiple of :data:`GRAM_BLOCK` (zero-padded
    columns): for each row i and each block of 8 coordinates, the loop over j (vectorized) sums the
    block's 8 products in registers (the block's trip count is a compile-time constant, so the
    compiler unrolls it) and touches G[i, j] once per block.  Same products summed in the same
    order for (i, j) and (j, i): G is exactly symmetric.  Faster than :func:`mm` for 4 < r <= 16."""
    n, rp = T.shape
    m = TT.shape[1]
    for i in range(n):
        a = T[i]
        Gi = G[i]
        for j in range(m):
            s = a[0] * TT[0, j]
            for ll in range(1, GRAM_BLOCK):
                s += a[ll] * TT[ll, j]
            Gi[j] = s
        for l0 in range(GRAM_BLOCK, rp, GRAM_BLOCK):
            for j in range(m):
                s = Gi[j]
                for ll in range(GRAM_BLOCK):
                    s += a[l0 + ll] * TT[l0 + ll, j]
                Gi[j] = s


@njit(cache=True, nogil=True, fastmath=FM_SUM)
def fused_sums(a, b, c, lw, scale, fl, zero, k0, k1, shift, mass, vec):  # pragma: no cover
    """Everything for each system k0 <= k < k1, serially and without the GIL: logits
    L = scale a b^T + lw by :func:`mm` (in the dtype of a and b), row maxima and exponentials
    (E in the dtype of zero, mass accumulated in float64), then the value sums vec = E c by
    :func:`mm`.  c may have q = 0 columns (no values)."""
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
        mm(a[k], bT, L)
        for i in range(n):
            shift[k, i], mass[k, i] = softmax_row(L[i], E[i], scale, lw[k], fl, zero)
        if q:
            mm(E, c[k], vec[k])


@njit(cache=True, inline="always")
def count_off_diagonal(G, c):  # pragma: no cover - compiled
    """#{(i, j): i != j, G[i, j] > c} for a square G: whole rows (vectorized) less the diagonal."""
    cnt = 0
    for i in range(G.shape[0]):
        Gi = G[i]
        for j in range(G.shape[1]):
            cnt += Gi[j] > c
        cnt -= Gi[i] > c
    return cnt
