"""Compiled engine of :mod:`wflow.kernels.spectral` (numba), imported when that engine first runs.

Each kernel does a range of chunks (or of row blocks) and releases the GIL; the caller runs the
ranges on :mod:`wflow.kernels.threads`' worker threads (not ``parallel=True``, which costs seconds
more of first-run compilation for the same loops).

On S^2 the harmonics are complex solid harmonics Z_l^m = rho^l P~_l^m e^{+-im phi}: the
sectoral start Z_m^m = sqrt((2m+1)/2m) (y1 +- i y2) Z_{m-1}^{m-1} needs no trigonometry and
the recurrence Z_l^m = a_lm y3 Z_{l-1}^m - b_lm rho^2 Z_{l-2}^m carries the radius.  Every
kernel runs its recurrences for a block of :data:`BLOCK` points at once, innermost loop over
the block, so that LLVM vectorizes them.
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: Points per vectorized block of the kernels (the block's work arrays stay in the L1/L2 caches).
BLOCK = 128
# FMAs and vectorized reductions (the block sums need "reassoc")
_FM = {"nnan", "ninf", "nsz", "contract", "reassoc"}


@njit(cache=True)
def coefficients(a, h0, K, P, extra, nu0, scale, out, h):  # pragma: no cover - compiled
    # out[k, p] = (a/2)^p/p! h_{k+p}(a) e^{-a} * scale  (backward ratio recurrence); h: work, size K+P+1
    n = K + P + 1
    q = 0.0
    for k in range(n - 1 + extra, 0, -1):
        q = a / (2.0 * (k + nu0) + a * q)
        if k < n:
            h[k] = q
    h[0] = h0 * scale
    for k in range(1, n):
        h[k] *= h[k - 1]
    f = 1.0
    for p in range(P + 1):
        if p > 0:
            f *= 0.5 * a / p
        for k in range(K + 1):
            out[k, p] = f * h[k + p]


@njit(cache=True, nogil=True, fastmath=_FM)
def circle_moments(y, W, K, nchunks, ch0, ch1, acc):  # pragma: no cover - compiled
    """acc[ch, k, c] = sum_j W[j, c] conj(z_j)^k over chunk ch of nchunks, for ch0 <= ch < ch1
    (acc: (nchunks, K+1, C, 2), zeroed; k, c, re/im); :data:`BLOCK` points at a time."""
    m, C = W.shape
    for ch in range(ch0, ch1):
        j_lo = ch * m // nchunks
        j_hi = (ch + 1) * m // nchunks
        ur = np.empty(BLOCK)
        ui = np.empty(BLOCK)
        zr = np.empty(BLOCK)
        zi = np.empty(BLOCK)
        Wb = np.zeros((C, BLOCK))
        for j0 in range(j_lo, j_hi, BLOCK):
            nb = min(BLOCK, j_hi - j0)
            for jj in range(BLOCK):  # padding lanes carry zero weight
                if jj < nb:
                    ur[jj] = y[j0 + jj, 0]
                    ui[jj] = -y[j0 + jj, 1]
                    for c in range(C):
                        Wb[c, jj] = W[j0 + jj, c]
                else:
                    ur[jj] = 0.0
                    ui[jj] = 0.0
                    for c in range(C):
                        Wb[c, jj] = 0.0
                zr[jj] = 1.0
                zi[jj] = 0.0
            for k in range(K + 1):
                for c in range(C):
                    wc = Wb[c]
                    s_r = 0.0
                    s_i = 0.0
                    for jj in range(BLOCK):
                        s_r += zr[jj] * wc[jj]
                        s_i += zi[jj] * wc[jj]
                    acc[ch, k, c, 0] += s_r
                    acc[ch, k, c, 1] += s_i
                for jj in range(BLOCK):
                    a_, b_ = zr[jj], zi[jj]
                    zr[jj] = a_ * ur[jj] - b_ * ui[jj]
                    zi[jj] = a_ * ui[jj] + b_ * ur[jj]


@njit(cache=True, nogil=True, fastmath=_FM)
def circle_eval(x, G, a, h0, per_row, extra, scale_exp, i0, i1, out):  # pragma: no cover  # noqa: C901, PLR0912 - one compiled kernel
    """out[i] for the query rows i0 <= i < i1 (out: (n, C)), :data:`BLOCK` rows at a time."""
    K1, P1, C = G.shape[0], G.shape[1], G.shape[2]
    coef = np.ones((K1, P1, BLOCK))
    one = np.empty((K1, P1))
    work = np.empty(K1 + P1)
    ur = np.empty(BLOCK)
    ui = np.empty(BLOCK)
    zr = np.empty(BLOCK)
    zi = np.empty(BLOCK)
    acc = np.empty((C, BLOCK))
    for b0 in range(i0, i1, BLOCK):
        nb = min(BLOCK, i1 - b0)
        for ii in range(BLOCK):
            ur[ii] = x[b0 + ii, 0] if ii < nb else 0.0
            ui[ii] = x[b0 + ii, 1] if ii < nb else 0.0
            zr[ii] = 1.0
            zi[ii] = 0.0
            for c in range(C):
                acc[c, ii] = 0.0
        if per_row:
            for ii in range(nb):
                i = b0 + ii
                coefficients(
                    a[i], h0[i], K1 - 1, P1 - 1, extra, 0.0, np.exp(a[i] * scale_exp), one, work
                )
                for k in range(K1):
                    for p in range(P1):
                        coef[k, p, ii] = one[k, p]
        for k in range(K1):
            for p in range(P1):
                cl = coef[k, p]
                for c in range(C):
                    gr, gi = G[k, p, c, 0], G[k, p, c, 1]
                    ac = acc[c]
                    if per_row:
                        for ii in range(BLOCK):
                            ac[ii] += cl[ii] * (zr[ii] * gr - zi[ii] * gi)
                    else:
                        for ii in range(BLOCK):
                            ac[ii] += zr[ii] * gr - zi[ii] * gi
            for ii in range(BLOCK):
                a_, b_ = zr[ii], zi[ii]
                zr[ii] = a_ * ur[ii] - b_ * ui[ii]
                zi[ii] = a_ * ui[ii] + b_ * ur[ii]
        for ii in range(nb):
            for c in range(C):
                out[b0 + ii, c] = acc[c, ii]


@njit(cache=True, nogil=True, fastmath=_FM)
def sphere_moments(y, W, L, A, Bc, nchunks, ch0, ch1, acc):  # pragma: no cover  # noqa: C901, PLR0912, PLR0915 - one compiled kernel
    """acc[ch, m, l, c] = sum_j W[j, c] conj(Z_l^m(y_j)) over chunk ch of nchunks, for ch0 <= ch < ch1
    and 0 <= m <= l <= L (acc: (nchunks, L+1, L+1, C, 2), zeroed; m, l, c, re/im)."""
    m, C = W.shape
    for ch in range(ch0, ch1):
        j_lo = ch * m // nchunks
        j_hi = (ch + 1) * m // nchunks
        ur = np.empty(BLOCK)
        ui = np.empty(BLOCK)
        t = np.empty(BLOCK)
        r2 = np.empty(BLOCK)
        Wb = np.zeros((C, BLOCK))
        sr = np.empty(BLOCK)
        si = np.empty(BLOCK)
        p1r = np.empty(BLOCK)
        p1i = np.empty(BLOCK)
        p2r = np.empty(BLOCK)
        p2i = np.empty(BLOCK)
        for j0 in range(j_lo, j_hi, BLOCK):
            nb = min(BLOCK, j_hi - j0)
            for jj in range(BLOCK):  # padding lanes carry zero weight
                if jj < nb:
                    j = j0 + jj
                    ur[jj] = y[j, 0]
                    ui[jj] = -y[j, 1]
                    t[jj] = y[j, 2]
                    r2[jj] = y[j, 0] ** 2 + y[j, 1] ** 2 + y[j, 2] ** 2
                    for c in range(C):
                        Wb[c, jj] = W[j, c]
                else:
                    ur[jj] = 0.0
                    ui[jj] = 0.0
                    t[jj] = 0.0
                    r2[jj] = 0.0
                    for c in range(C):
                        Wb[c, jj] = 0.0
                sr[jj] = 1.0
                si[jj] = 0.0
            for mm in range(L + 1):
                if mm > 0:
                    g = np.sqrt((2.0 * mm + 1.0) / (2.0 * mm))
                    for jj in range(BLOCK):
                        a_, b_ = sr[jj], si[jj]
                        sr[jj] = g * (a_ * ur[jj] - b_ * ui[jj])
                        si[jj] = g * (a_ * ui[jj] + b_ * ur[jj])
                for jj in range(BLOCK):
                    p2r[jj] = 0.0
                    p2i[jj] = 0.0
                    p1r[jj] = sr[jj]
                    p1i[jj] = si[jj]
                for l in range(mm, L + 1):
                    if l == mm + 1:
                        g = np.sqrt(2.0 * mm + 3.0)
                        for jj in range(BLOCK):
                            p2r[jj] = p1r[jj]
                            p2i[jj] = p1i[jj]
                            p1r[jj] = g * t[jj] * p1r[jj]
                            p1i[jj] = g * t[jj] * p1i[jj]
                    elif l > mm + 1:
                        al, bl = A[mm, l], Bc[mm, l]
                        for jj in range(BLOCK):
                            qr = al * t[jj] * p1r[jj] - bl * r2[jj] * p2r[jj]
                            qi = al * t[jj] * p1i[jj] - bl * r2[jj] * p2i[jj]
                            p2r[jj] = p1r[jj]
                            p2i[jj] = p1i[jj]
                            p1r[jj] = qr
                            p1i[jj] = qi
                    for c in range(C):
                        wc = Wb[c]
                        s_r = 0.0
                        s_i = 0.0
                        for jj in range(BLOCK):
                            s_r += p1r[jj] * wc[jj]
                            s_i += p1i[jj] * wc[jj]
                        acc[ch, mm, l, c, 0] += s_r
                        acc[ch, mm, l, c, 1] += s_i


@njit(cache=True, nogil=True, fastmath=_FM)
def sphere_eval(  # noqa: C901, PLR0912 - one compiled kernel
    x, G, a, h0, per_row, extra, scale_exp, A, Bc, blk0, blk1, out
):  # pragma: no cover - compiled
    """out[i, c] = Re sum_{m,l,p} coef_i[l, p] Z_l^m(x_i) G[m, l, p, c] for the query rows of the blocks
    blk0 <= blk < blk1 of :data:`BLOCK` rows (out: (n, C))."""
    n = x.shape[0]
    L1, P1, C = G.shape[1], G.shape[2], G.shape[3]
    for blk in range(blk0, blk1):
        i0 = blk * BLOCK
        nb = min(BLOCK, n - i0)
        coef = np.ones((L1, P1, BLOCK))
        one = np.empty((L1, P1))
        work = np.empty(L1 + P1)
        ur = np.zeros(BLOCK)
        ui = np.zeros(BLOCK)
        t = np.zeros(BLOCK)
        sr = np.ones(BLOCK)
        si = np.zeros(BLOCK)
        p1r = np.empty(BLOCK)
        p1i = np.empty(BLOCK)
        p2r = np.empty(BLOCK)
        p2i = np.empty(BLOCK)
        acc = np.zeros((C, BLOCK))
        for ii in range(nb):
            i = i0 + ii
            ur[ii] = x[i, 0]
            ui[ii] = x[i, 1]
            t[ii] = x[i, 2]
            if per_row:
                coefficients(
                    a[i], h0[i], L1 - 1, P1 - 1, extra, 0.5, np.exp(a[i] * scale_exp), one, work
                )
                for l in range(L1):
                    for p in range(P1):
                        coef[l, p, ii] = one[l, p]
        for mm in range(L1):
            if mm > 0:
                g = np.sqrt((2.0 * mm + 1.0) / (2.0 * mm))
                for ii in range(BLOCK):
                    a_, b_ = sr[ii], si[ii]
                    sr[ii] = g * (a_ * ur[ii] - b_ * ui[ii])
                    si[ii] = g * (a_ * ui[ii] + b_ * ur[ii])
            for ii in range(BLOCK):
                p2r[ii] = 0.0
                p2i[ii] = 0.0
                p1r[ii] = sr[ii]
                p1i[ii] = si[ii]
            for l in range(mm, L1):
                if l == mm + 1:
                    g = np.sqrt(2.0 * mm + 3.0)
                    for ii in range(BLOCK):
                        p2r[ii] = p1r[ii]
                        p2i[ii] = p1i[ii]
                        p1r[ii] = g * t[ii] * p1r[ii]
                        p1i[ii] = g * t[ii] * p1i[ii]
                elif l > mm + 1:
                    al, bl = A[mm, l], Bc[mm, l]
                    for ii in range(BLOCK):
                        qr = al * t[ii] * p1r[ii] - bl * p2r[ii]
                        qi = al * t[ii] * p1i[ii] - bl * p2i[ii]
                        p2r[ii] = p1r[ii]
                        p2i[ii] = p1i[ii]
                        p1r[ii] = qr
                        p1i[ii] = qi
                for p in range(P1):
                    cl = coef[l, p]
                    for c in range(C):
                        gr, gi = G[mm, l, p, c, 0], G[mm, l, p, c, 1]
                        ac = acc[c]
                        if per_row:
                            for ii in range(BLOCK):
                                ac[ii] += cl[ii] * (p1r[ii] * gr - p1i[ii] * gi)
                        else:
                            for ii in range(BLOCK):
                                ac[ii] += p1r[ii] * gr - p1i[ii] * gi
        for ii in range(nb):
            for c in range(C):
                out[i0 + ii, c] = acc[c, ii]
