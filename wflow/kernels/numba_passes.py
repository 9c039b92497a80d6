r"""The compiled passes of the numba backend (:mod:`wflow.kernels.numba_backend`, whose docstring
gives the algorithms): the direct route's tiles, in float64, float32 or mixed precision, and the
BLAS route's exponential pass.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .jit import FM_SUM, exp32, exp64, exp_as, round_as

__all__ = ["direct_sums", "direct_sums_mixed", "exp_rows"]

_FLOAT_MIN = float(np.finfo(np.float64).min)


@njit(inline="always", cache=True, fastmath=FM_SUM)
def _value_sums4(gTk, j0, j1, e, acc, r4, zero):
    """acc[r4 + s, 1 + l] += sum_j e[s, j] g_l(j) for the 4 rows s of one block (partial sums in
    the dtype of ``zero``)."""
    e0, e1, e2, e3 = e[0], e[1], e[2], e[3]
    for l in range(gTk.shape[0]):
        g = gTk[l, j0:j1]
        t0 = zero
        t1 = zero
        t2 = zero
        t3 = zero
        for jj in range(j1 - j0):
            gj = g[jj]
            t0 += e0[jj] * gj
            t1 += e1[jj] * gj
            t2 += e2[jj] * gj
            t3 += e3[jj] * gj
        acc[r4, l + 1] += t0
        acc[r4 + 1, l + 1] += t1
        acc[r4 + 2, l + 1] += t2
        acc[r4 + 3, l + 1] += t3


@njit(parallel=True, cache=True, fastmath=FM_SUM)
def direct_sums(a, bT, logw, gT, floor, zero, rows, cols, n_chunks, shift, acc_out):
    """a (B, n, p) with n a multiple of rows, rows and p multiples of 4, bT (B, p, m),
    logw (B, m) finite, all float64; gT (B, q, m) values in the working dtype (that of
    zero).  Writes shift (B, n) and acc_out (B, n, 1 + q) = (mass, vector), float64.
    The tiles are split into n_chunks contiguous runs, one parallel task (and one set of
    work buffers) each."""
    B, n, p = a.shape
    m = bT.shape[2]
    q = gT.shape[1]
    ntile = n // rows
    n_tasks = B * ntile
    for chunk in prange(n_chunks):
        buf = np.empty((4, cols), a.dtype)  # logits: float64, or float32 when accurate enough
        cf = np.empty(2, a.dtype)  # the row's shift and the floor in the logits' dtype
        e = np.empty((4, cols), gT.dtype)
        mx = np.empty(rows)
        acc = np.empty((rows, q + 1))
        for task in range(chunk * n_tasks // n_chunks, (chunk + 1) * n_tasks // n_chunks):
            k = task // ntile
            i0 = (task % ntile) * rows
            bTk = bT[k]
            mx[:] = _FLOAT_MIN
            acc[:] = 0.0
            for j0 in range(0, m, cols):
                j1 = min(j0 + cols, m)
                lw = logw[k, j0:j1]
                for r4 in range(0, rows, 4):
                    A = a[k, i0 + r4 : i0 + r4 + 4]
                    # logits <a_i, b_j> + log w_j for 4 rows at once: each b load feeds 4 FMAs
                    for l in range(0, p, 4):
                        _partial_logits4(buf, lw, A, bTk, l, j0, j1)
                    _exp_block4(buf, e, r4, mx, acc, cf, floor, zero, j1 - j0)
                    _value_sums4(gT[k], j0, j1, e, acc, r4, zero)
            for r in range(rows):
                # report the shift in the working dtype, and the sums consistent with it
                c = round_as(mx[r], zero)
                f = exp64(max(mx[r] - c, floor)) if c != mx[r] else 1.0
                shift[k, i0 + r] = c
                for l in range(q + 1):
                    acc_out[k, i0 + r, l] = acc[r, l] * f


@njit(inline="always", cache=True, fastmath=FM_SUM)
def _exp_block4(x, e, r4, mx, acc, cf, floor, zero, J):
    """One block of the 4 rows r4..r4+3 of :func:`direct_sums`: the online maximum, e[s, jj] =
    e^(x[s, jj] - max) in the dtype of zero, and their sums added to acc[:, 0]."""
    x0, x1, x2, x3 = x[0], x[1], x[2], x[3]
    # block maxima of the 4 rows in one pass
    m0 = x0[0]
    m1 = x1[0]
    m2 = x2[0]
    m3 = x3[0]
    for jj in range(J):
        m0 = max(m0, x0[jj])
        m1 = max(m1, x1[jj])
        m2 = max(m2, x2[jj])
        m3 = max(m3, x3[jj])
    for s in range(4):
        r = r4 + s
        bm = m0 if s == 0 else (m1 if s == 1 else (m2 if s == 2 else m3))
        if bm > mx[r]:  # online maximum: rescale what this row has summed so far
            sc = exp64(max(mx[r] - bm, floor))
            for l in range(acc.shape[1]):
                acc[r, l] *= sc
            mx[r] = bm
        cf[0] = mx[r]
        cf[1] = floor
        c = cf[0]
        fl = cf[1]
        xs = x[s]
        es = e[s]
        t = zero
        for jj in range(J):
            v = exp_as(max(xs[jj] - c, fl), zero)
            es[jj] = v
            t += v
        acc[r, 0] += t


@njit(cache=True, fastmath=FM_SUM)
def _block_max(ai, bTk, lw, j0, J):
    """max_j (<ai, b_j> + lw_j) over the block's J columns from j0, in float64."""
    mx = _FLOAT_MIN
    for jj in range(J):
        t = lw[jj]
        for l in range(ai.shape[0]):
            t += ai[l] * bTk[l, j0 + jj]
        mx = max(mx, t)
    return mx


@njit(inline="always", cache=True, fastmath=FM_SUM)
def _partial_logits4(x, lw, A, bTk, l, j0, j1):
    """x[s, jj] (+)= sum_{t < 4} A[s, l + t] bTk[l + t, j0 + jj] for the 4 rows of one block
    (l = 0 starts from the log-weights lw)."""
    J = j1 - j0
    x0, x1, x2, x3 = x[0], x[1], x[2], x[3]
    b0 = bTk[l, j0:j1]
    b1 = bTk[l + 1, j0:j1]
    b2 = bTk[l + 2, j0:j1]
    b3 = bTk[l + 3, j0:j1]
    a00, a01, a02, a03 = A[0, l], A[0, l + 1], A[0, l + 2], A[0, l + 3]
    a10, a11, a12, a13 = A[1, l], A[1, l + 1], A[1, l + 2], A[1, l + 3]
    a20, a21, a22, a23 = A[2, l], A[2, l + 1], A[2, l + 2], A[2, l + 3]
    a30, a31, a32, a33 = A[3, l], A[3, l + 1], A[3, l + 2], A[3, l + 3]
    if l == 0:
        for jj in range(J):
            x0[jj] = lw[jj] + a00 * b0[jj] + a01 * b1[jj] + a02 * b2[jj] + a03 * b3[jj]
            x1[jj] = lw[jj] + a10 * b0[jj] + a11 * b1[jj] + a12 * b2[jj] + a13 * b3[jj]
            x2[jj] = lw[jj] + a20 * b0[jj] + a21 * b1[jj] + a22 * b2[jj] + a23 * b3[jj]
            x3[jj] = lw[jj] + a30 * b0[jj] + a31 * b1[jj] + a32 * b2[jj] + a33 * b3[jj]
    else:
        for jj in range(J):
            x0[jj] += a00 * b0[jj] + a01 * b1[jj] + a02 * b2[jj] + a03 * b3[jj]
            x1[jj] += a10 * b0[jj] + a11 * b1[jj] + a12 * b2[jj] + a13 * b3[jj]
            x2[jj] += a20 * b0[jj] + a21 * b1[jj] + a22 * b2[jj] + a23 * b3[jj]
            x3[jj] += a30 * b0[jj] + a31 * b1[jj] + a32 * b2[jj] + a33 * b3[jj]


@njit(inline="always", cache=True, fastmath=FM_SUM)
def _shifted_logits4(x, lw, A, bTk, l, j0, j1, cs, floor, xv, bmax):
    """The last 4 components of the 4 rows' logits: xv[s, jj] = max(l - cs[s], floor) rounded to
    float32 (``l`` from the partial logits x, or from lw when p = 4), and bmax[s] the block's
    maximum of xv[s] (float32)."""
    J = j1 - j0
    x0, x1, x2, x3 = x[0], x[1], x[2], x[3]
    v0, v1, v2, v3 = xv[0], xv[1], xv[2], xv[3]
    c0, c1, c2, c3 = cs[0], cs[1], cs[2], cs[3]
    b0 = bTk[l, j0:j1]
    b1 = bTk[l + 1, j0:j1]
    b2 = bTk[l + 2, j0:j1]
    b3 = bTk[l + 3, j0:j1]
    a00, a01, a02, a03 = A[0, l], A[0, l + 1], A[0, l + 2], A[0, l + 3]
    a10, a11, a12, a13 = A[1, l], A[1, l + 1], A[1, l + 2], A[1, l + 3]
    a20, a21, a22, a23 = A[2, l], A[2, l + 1], A[2, l + 2], A[2, l + 3]
    a30, a31, a32, a33 = A[3, l], A[3, l + 1], A[3, l + 2], A[3, l + 3]
    # p = 4: the logits start from the log-weights
    s0, s1, s2, s3 = (lw, lw, lw, lw) if l == 0 else (x0, x1, x2, x3)
    for jj in range(J):
        v0[jj] = np.float32(
            max(s0[jj] + a00 * b0[jj] + a01 * b1[jj] + a02 * b2[jj] + a03 * b3[jj] - c0, floor)
        )
        v1[jj] = np.float32(
            max(s1[jj] + a10 * b0[jj] + a11 * b1[jj] + a12 * b2[jj] + a13 * b3[jj] - c1, floor)
        )
        v2[jj] = np.float32(
            max(s2[jj] + a20 * b0[jj] + a21 * b1[jj] + a22 * b2[jj] + a23 * b3[jj] - c2, floor)
        )
        v3[jj] = np.float32(
            max(s3[jj] + a30 * b0[jj] + a31 * b1[jj] + a32 * b2[jj] + a33 * b3[jj] - c3, floor)
        )
    # the block's maxima relative to the shifts (float32, 8 lanes)
    m0 = v0[0]
    m1 = v1[0]
    m2 = v2[0]
    m3 = v3[0]
    for jj in range(J):
        m0 = max(m0, v0[jj])
        m1 = max(m1, v1[jj])
        m2 = max(m2, v2[jj])
        m3 = max(m3, v3[jj])
    bmax[0] = m0
    bmax[1] = m1
    bmax[2] = m2
    bmax[3] = m3


@njit(inline="always", cache=True, fastmath=FM_SUM)
def _reshift4(cs, bmax, first, jump, floor, A, bTk, lw, j0, J):
    """Move the shift of each of the 4 rows whose block maximum lies more than ``jump`` above it (in
    a row's first block, also below it) to that maximum; True when a row moved."""
    again = False
    for s in range(4):
        if bmax[s] > jump or (first and bmax[s] < -jump):
            # the values must be formed again against the block's maximum
            if bmax[s] > floor:
                cs[s] += bmax[s]
            else:  # all clamped: that maximum is not in the float32 values
                cs[s] = _block_max(A[s], bTk, lw, j0, J)
            again = True
    return again


@njit(inline="always", cache=True, fastmath=FM_SUM)
def _absorb4(r4, cs, bmax, first, floor, mx, best, acc, xv, J):
    """Fold one block into the running shifts and masses of its 4 rows, turning xv into the
    exponentials e^(l - shift) (float32), their sums added to acc[:, 0]."""
    for s in range(4):
        r = r4 + s
        if bmax[s] > floor:
            best[r] = max(best[r], cs[s] + bmax[s])
        up = max(bmax[s], 0.0)
        cnew = cs[s] + up
        if first:  # nothing summed yet: the shift may also move down
            mx[r] = cnew
        elif cnew > mx[r]:
            sc = exp64(max(mx[r] - cnew, floor))
            for l in range(acc.shape[1]):
                acc[r, l] *= sc
            mx[r] = cnew
        d = np.float32(up)
        fl = np.float32(floor)
        vs = xv[s]
        t = np.float32(0.0)
        for jj in range(J):
            e = exp32(max(vs[jj] - d, fl))
            vs[jj] = e
            t += e
        acc[r, 0] += t


@njit(parallel=True, cache=True, fastmath=FM_SUM)
def direct_sums_mixed(a, bT, logw, gT, upper, floor, jump, rows, cols, n_chunks, shift, acc_out):
    """float32 input whose logits need float64: as :func:`direct_sums` (``upper`` (B, n) a bound
    on each row's logits), but each logit leaves the float64 loop already shifted, ``l - c``
    rounded to float32, and the rest runs in float32.  The shift ``c`` starts at ``upper``;
    when a block's maximum lies more than ``jump`` above it (in a row's first block, also
    below), it moves there and the block is formed again (numba_backend's module docstring)."""
    B, n, p = a.shape
    m = bT.shape[2]
    q = gT.shape[1]
    ntile = n // rows
    n_tasks = B * ntile
    lastl = p - 4
    for chunk in prange(n_chunks):
        buf = np.empty((4, cols))  # float64 partial logits (p > 4)
        xv = np.empty((4, cols), np.float32)  # l - c, then e^(l - c')
        mx = np.empty(rows)  # the rows' shifts (float64)
        acc = np.empty((rows, q + 1))
        cs = np.empty(4)
        bmax = np.empty(4, np.float32)
        best = np.empty(rows)  # the rows' maxima (to float32 accuracy): the reported shifts
        for task in range(chunk * n_tasks // n_chunks, (chunk + 1) * n_tasks // n_chunks):
            k = task // ntile
            i0 = (task % ntile) * rows
            bTk = bT[k]
            for r in range(rows):
                mx[r] = upper[k, i0 + r]
            best[:] = _FLOAT_MIN
            acc[:] = 0.0
            first = True
            for j0 in range(0, m, cols):
                j1 = min(j0 + cols, m)
                lw = logw[k, j0:j1]
                for r4 in range(0, rows, 4):
                    A = a[k, i0 + r4 : i0 + r4 + 4]
                    for s in range(4):
                        cs[s] = mx[r4 + s]
                    for attempt in range(2):
                        for l in range(0, lastl, 4):
                            _partial_logits4(buf, lw, A, bTk, l, j0, j1)
                        _shifted_logits4(buf, lw, A, bTk, lastl, j0, j1, cs, floor, xv, bmax)
                        if not _reshift4(cs, bmax, first, jump, floor, A, bTk, lw, j0, j1 - j0):
                            break
                    _absorb4(r4, cs, bmax, first, floor, mx, best, acc, xv, j1 - j0)
                    _value_sums4(gT[k], j0, j1, xv, acc, r4, np.float32(0.0))
                first = False
            for r in range(rows):
                # report the row's maximum (as the other routes do), rounded to float32
                c = np.float64(np.float32(best[r] if best[r] > _FLOAT_MIN else mx[r]))
                f = math.exp(mx[r] - c) if c != mx[r] else 1.0  # mx >= the maximum, by at most jump
                shift[k, i0 + r] = c
                for l in range(q + 1):
                    acc_out[k, i0 + r, l] = acc[r, l] * f


@njit(cache=True, nogil=True, fastmath=FM_SUM)
def exp_rows(L, lw, E, mx, mass, scale, floor, zero):
    """BLAS route, one block, serially and without the GIL.  L (R, J) float64 logits, lw (J,)
    log-weights; E (R, J) working dtype.  Updates the running maxima mx and masses (R,) in
    place, writes the exponentials e^(L + lw - mx) to E and the factor by which each row's
    earlier value sums must be rescaled to scale."""
    R, J = L.shape
    for r in range(R):
        Lr = L[r]
        Er = E[r]
        bm = _FLOAT_MIN
        for jj in range(J):
            bm = max(bm, Lr[jj] + lw[jj])
        sc = 1.0
        if bm > mx[r]:
            sc = exp64(max(mx[r] - bm, floor))
            mx[r] = bm
        c = mx[r]
        t = zero
        for jj in range(J):
            v = exp_as(max(Lr[jj] + lw[jj] - c, floor), zero)
            Er[jj] = v
            t += v
        mass[r] = mass[r] * sc + t
        scale[r] = sc
