r"""Compiled loops of the multiscale solver: sparse costs, soft-min, scaling, rounding.

A sparsity pattern is stored twice: by rows (CSR: ``ptr``, ``cols``, one entry per kept
pair :math:`(i, j)`) and by columns (CSC: ``cptr``, ``crows`` and ``perm``, the CSR
position of each CSC entry).  Costs are :math:`c_{ij} = \theta_{ij}^2` (geodesic,
:math:`\theta = 2\,\mathrm{atan2}(|x-y|, |x+y|)`, accurate at every angle) or
:math:`|x_i - y_j|^2` (chordal).  Exponentials are taken once per pair per
:math:`\varepsilon` (the Gibbs kernel); the Sinkhorn passes in between are multiply-adds.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

__all__ = [
    "pair_cost",
    "pattern_costs",
    "csc_order",
    "merge_pairs",
    "sparse_softmin",
    "gibbs",
    "gibbs_into",
    "scale_rows",
    "scale_cols",
    "absorb",
    "plan_cost",
    "rounded_plan_cost",
    "best_partner",
    "candidate_values",
    "cell_models",
    "cell_c_transform",
    "cell_within",
    "walk_support",
    "walk_fill",
    "expand_thresholds",
    "expand_count",
    "expand_fill",
]


@njit(cache=True, inline="always")
def pair_cost(x, y, i, j, geodesic):
    s = 0.0
    t = 0.0
    for k in range(x.shape[1]):
        dk = x[i, k] - y[j, k]
        sk = x[i, k] + y[j, k]
        s += dk * dk
        t += sk * sk
    if geodesic:
        th = 2.0 * math.atan2(math.sqrt(s), math.sqrt(t))
        return th * th
    return s


@njit(cache=True, parallel=True)
def pattern_costs(x, y, ptr, cols, geodesic):
    """Cost of every kept pair, in CSR order."""
    out = np.empty(cols.shape[0])
    for i in prange(x.shape[0]):
        for p in range(ptr[i], ptr[i + 1]):
            out[p] = pair_cost(x, y, i, cols[p], geodesic)
    return out


@njit(cache=True)
def csc_order(cols, m):
    """The pairs' stable order by column (a counting sort, O(pairs + m)): ``perm``, the CSR
    position of each CSC entry, and the CSC row pointers ``cptr``."""
    cptr = np.zeros(m + 1, dtype=np.int64)
    for p in range(cols.shape[0]):
        cptr[cols[p] + 1] += 1
    for j in range(m):
        cptr[j + 1] += cptr[j]
    pos = cptr[:-1].copy()
    perm = np.empty(cols.shape[0], dtype=np.int64)
    for p in range(cols.shape[0]):
        j = cols[p]
        perm[pos[j]] = p
        pos[j] += 1
    return perm, cptr


@njit(cache=True)
def merge_pairs(ptr, cols, c, add_ptr, add_cols, x, y, geodesic):
    """The CSR pattern ``ptr``, ``cols`` (costs ``c``) with the pairs of ``add_ptr``,
    ``add_cols`` merged in (each row's columns ascending and distinct on both sides; pairs
    already present are kept once): the new row pointers, columns (int32) and costs, the
    added pairs' costs computed, the others copied."""
    n = ptr.shape[0] - 1
    new_ptr = np.zeros(n + 1, dtype=np.int64)
    for i in range(n):
        p, b = ptr[i], ptr[i + 1]
        k = 0
        for q in range(add_ptr[i], add_ptr[i + 1]):
            j = add_cols[q]
            while p < b and cols[p] < j:
                p += 1
            if p < b and cols[p] == j:
                continue
            k += 1
        new_ptr[i + 1] = new_ptr[i] + (b - ptr[i]) + k
    out_cols = np.empty(new_ptr[n], dtype=np.int32)
    out_c = np.empty(new_ptr[n])
    for i in range(n):
        p, b = ptr[i], ptr[i + 1]
        q, e = add_ptr[i], add_ptr[i + 1]
        t = new_ptr[i]
        while p < b or q < e:
            if q == e or (p < b and cols[p] <= add_cols[q]):
                if q < e and cols[p] == add_cols[q]:
                    q += 1
                out_cols[t] = cols[p]
                out_c[t] = c[p]
                p += 1
            else:
                out_cols[t] = add_cols[q]
                out_c[t] = pair_cost(x, y, i, add_cols[q], geodesic)
                q += 1
            t += 1
    return new_ptr, out_cols, out_c


@njit(cache=True, parallel=True)
def sparse_softmin(ptr, idx, c, h, logw, eps, out):
    r""":math:`out_i = -\varepsilon\log\sum_{p} w_{j_p} e^{(h_{j_p} - c_p)/\varepsilon}` over row i's pairs.

    A row without pairs keeps ``out_i`` (the soft-min over nothing is :math:`+\infty`, whose
    kernel values would turn every pass into NaN).
    """
    n = ptr.shape[0] - 1
    for i in prange(n):
        m = -np.inf
        for p in range(ptr[i], ptr[i + 1]):
            j = idx[p]
            v = (h[j] - c[p]) / eps + logw[j]
            if v > m:
                m = v
        if m == -np.inf:
            continue
        s = 0.0
        for p in range(ptr[i], ptr[i + 1]):
            j = idx[p]
            s += math.exp((h[j] - c[p]) / eps + logw[j] - m)
        out[i] = -eps * (m + math.log(s))


@njit(cache=True, parallel=True)
def gibbs_into(ptr, cols, c, f, g, eps, out):
    r"""Kernel :math:`K_p = e^{(f_i + g_j - c_p)/\varepsilon}` in CSR order, into ``out`` (any float
    type: the exponent is taken in float64)."""
    for i in prange(ptr.shape[0] - 1):
        for p in range(ptr[i], ptr[i + 1]):
            out[p] = math.exp((f[i] + g[cols[p]] - c[p]) / eps)
    return out


@njit(cache=True)
def gibbs(ptr, cols, c, f, g, eps):
    r"""Kernel :math:`K_p = e^{(f_i + g_j - c_p)/\varepsilon}` in CSR order (float64)."""
    return gibbs_into(ptr, cols, c, f, g, eps, np.empty(c.shape[0]))


@njit(cache=True, parallel=True)
def scale_rows(ptr, cols, kv, v, a, u, omega):
    r"""Over-relaxed ``u_i <- u_i (a_i / (u_i sum_j K_ij v_j))^omega``; returns the old row marginal's L1 error.

    ``omega = 1`` is Sinkhorn's step, ``1 < omega < 2`` over-relaxes it (Thibault et al.
    2017).  A row whose pairs carry no mass, or whose new scaling would over- or underflow,
    keeps its scaling (an infinite or zero one would spread NaN); its error stays.
    """
    n = ptr.shape[0] - 1
    err = np.empty(n)
    for i in prange(n):
        s = 0.0
        for p in range(ptr[i], ptr[i + 1]):
            s += kv[p] * v[cols[p]]
        r = u[i] * s
        err[i] = abs(r - a[i])
        if not s > 0.0:  # no kept pair carries mass (kernel underflow): left to the stall check
            continue
        new = a[i] / s if omega == 1.0 or not r > 0.0 else u[i] * (a[i] / r) ** omega
        if 0.0 < new < np.inf:  # a scaling that over- or underflows is left as it is
            u[i] = new
    return err.sum()


@njit(cache=True, parallel=True)
def scale_cols(cptr, crows, kv_csc, u, b, v, omega):
    """The same step on the columns (CSC order)."""
    m = cptr.shape[0] - 1
    for j in prange(m):
        s = 0.0
        for q in range(cptr[j], cptr[j + 1]):
            s += kv_csc[q] * u[crows[q]]
        if not s > 0.0:
            continue
        new = b[j] / s if omega == 1.0 or not v[j] > 0.0 else v[j] * (b[j] / (v[j] * s)) ** omega
        if 0.0 < new < np.inf:
            v[j] = new


@njit(cache=True)
def absorb(f, u, a, eps):
    """``f += eps log(u / a)``: moves a scaling into its potential."""
    for i in range(f.shape[0]):
        f[i] += eps * math.log(u[i] / a[i])


@njit(cache=True, parallel=True)
def plan_cost(ptr, cols, kv, c, u, v):
    r""":math:`\sum_{ij} u_i K_{ij} v_j c_{ij}` over the kept pairs."""
    tot = 0.0
    for i in prange(ptr.shape[0] - 1):
        s = 0.0
        for p in range(ptr[i], ptr[i + 1]):
            s += kv[p] * v[cols[p]] * c[p]
        tot += u[i] * s
    return tot


@njit(cache=True)
def rounded_plan_cost(ptr, cols, kv, c, u, v, a, b, x, y, geodesic, cmax):
    r"""An upper bound on the cost of the plan :math:`u_i K_{ij} v_j` rounded into :math:`\Pi(a, b)`.

    The rounding is Altschuler et al. (2017): rows are scaled down to at most ``a``, then
    columns to at most ``b``; the missing mass, :math:`e_a = a - q\mathbf 1` and
    :math:`e_b = b - q^\top\mathbf 1` with :math:`\delta = \sum e_a`, is moved by the
    rank-one plan :math:`e_a e_b^\top/\delta`.  That plan's chordal cost is exact in O(n + m),

    .. math::
        \frac1\delta\sum_{ij} e_{a,i} e_{b,j} |x_i - y_j|^2
        = 2\delta - \frac2\delta \Big(\sum_i e_{a,i} x_i\Big)\cdot\Big(\sum_j e_{b,j} y_j\Big),

    and bounds the geodesic one through :math:`\theta \le \tfrac\pi2 |x - y|`.  Returns
    ``(cost, delta)``: the feasible plan costs at most ``cost``, of which the rank-one part
    is at most :math:`\delta\,c_{\max}` (``cmax``, :func:`wflow.transport.certify.cmax`).
    """
    n = ptr.shape[0] - 1
    m = b.shape[0]
    row = np.zeros(n)
    for i in range(n):
        s = 0.0
        for p in range(ptr[i], ptr[i + 1]):
            s += u[i] * kv[p] * v[cols[p]]
        row[i] = min(1.0, a[i] / s) if s > 0 else 0.0
    col = np.zeros(m)
    for i in range(n):
        for p in range(ptr[i], ptr[i + 1]):
            col[cols[p]] += row[i] * u[i] * kv[p] * v[cols[p]]
    for j in range(m):
        col[j] = min(1.0, b[j] / col[j]) if col[j] > 0 else 0.0
    cost = 0.0
    ea = a.copy()
    eb = b.copy()
    for i in range(n):
        for p in range(ptr[i], ptr[i + 1]):
            j = cols[p]
            q = row[i] * u[i] * kv[p] * v[j] * col[j]
            cost += q * c[p]
            ea[i] -= q
            eb[j] -= q
    ea = np.maximum(ea, 0.0)  # q <= a and q <= b entrywise in sums: round-off only
    eb = np.maximum(eb, 0.0)
    delta = ea.sum()
    if delta <= 0.0:
        return cost, 0.0
    sa = ea @ x
    sb = eb @ y
    chordal = max(2.0 * delta - 2.0 * (sa @ sb) / eb.sum(), 0.0) if eb.sum() > 0 else 4.0 * delta
    rank_one = min(cmax * delta, (0.25 * math.pi**2 if geodesic else 1.0) * chordal)
    return cost + rank_one, delta


@njit(cache=True, parallel=True)
def best_partner(ptr, idx, c, h):
    r"""For each row, :math:`\min_p (c_p - h_{j_p})` over its pairs (the c-transform on the
    pattern, an upper estimate of the exact one) and the cost of that pair."""
    n = ptr.shape[0] - 1
    best_c = np.empty(n)
    best_v = np.empty(n)
    for i in prange(n):
        m = np.inf
        bc = 0.0
        for p in range(ptr[i], ptr[i + 1]):
            v = c[p] - h[idx[p]]
            if v < m:
                m = v
                bc = c[p]
        best_c[i] = bc
        best_v[i] = m
    return best_v, best_c


#: subtracted from chord lengths in the cells' bounds: far above their rounding, far below any cell
_SLACK = 1e-9


@njit(cache=True, inline="always")
def _chord_cost(chord, geodesic):
    """The cost at chord length ``chord`` (``min(chord, 2)`` on the unit sphere)."""
    ch = min(chord, 2.0)
    if geodesic:
        th = 2.0 * math.asin(0.5 * ch)
        return th * th
    return ch * ch


@njit(cache=True)
def _cell_candidates(D, qcen, qrad, pts, pcen, prad, ptop, parg, geodesic, extra):
    """Bounds of query cell ``D`` against every point cell: each one's lower bound ``lb`` (for
    any query of ``D``), and the cells whose bound is within ``extra`` of a value every query of
    ``D`` can reach (its top point seen from afar), sorted by bound."""
    nc, d = pcen.shape[0], pcen.shape[1]
    lb = np.empty(nc)
    up = np.inf
    for C in range(nc):
        dc = 0.0
        dt = 0.0
        for k in range(d):
            e = qcen[D, k] - pcen[C, k]
            dc += e * e
            e = qcen[D, k] - pts[parg[C], k]
            dt += e * e
        lb[C] = (
            _chord_cost(max(math.sqrt(dc) - qrad[D] - prad[C] - _SLACK, 0.0), geodesic) - ptop[C]
        )
        u = _chord_cost(math.sqrt(dt) + qrad[D] + _SLACK, geodesic) - ptop[C]
        if u < up:
            up = u
    cand = np.flatnonzero(lb <= up + extra)
    return lb, cand[np.argsort(lb[cand])]


@njit(cache=True, inline="always")
def _query_bound(q, r, C, pcen, prad, ptop, geodesic):
    """A lower bound of ``c(q_r, p) - pot_p`` over the points ``p`` of cell ``C``."""
    dc = 0.0
    for k in range(q.shape[1]):
        e = q[r, k] - pcen[C, k]
        dc += e * e
    return _chord_cost(max(math.sqrt(dc) - prad[C] - _SLACK, 0.0), geodesic) - ptop[C]


#: the model bound's values are lowered by this much: far above their rounding (values are O(10))
_MSLACK = 1e-9


@njit(cache=True, inline="always")
def _tangent(q, r, C, pcen, geodesic):
    r"""``(b, k)``: :math:`c(q_r, p) \ge b + k\,|q_r - p|^2` for every point ``p`` (a tangent
    of the cost, convex in the squared chord, at the chord to cell ``C``'s centre, capped at
    3 rad); ``(0, 1)`` for the chordal cost (exact).  One dot product then bounds a point's
    cost from below, before the geodesic's arctangent is taken."""
    if not geodesic:
        return 0.0, 1.0
    qo = 0.0
    for k in range(q.shape[1]):
        qo += q[r, k] * pcen[C, k]
    s0 = max(2.0 - 2.0 * qo, 0.0)
    th = min(2.0 * math.asin(min(0.5 * math.sqrt(s0), 1.0)), 3.0)
    if th < 1e-6:
        return 0.0, 1.0
    kk = th / math.sin(th)
    return th * th - kk * (2.0 - 2.0 * math.cos(th)), kk


@njit(cache=True, inline="always")
def _sq_chord(q, pts, r, p):
    s = 0.0
    for k in range(q.shape[1]):
        e = q[r, k] - pts[p, k]
        s += e * e
    return s


@njit(cache=True, inline="always")
def _offset(pts, p, cen, C, t):
    r"""Point ``p``'s tangent offset from unit centre ``C`` into ``t``; returns its normal part
    :math:`\delta = (p - o)\cdot o`."""
    dot = 0.0
    for k in range(t.shape[0]):
        dot += (pts[p, k] - cen[C, k]) * cen[C, k]
    for k in range(t.shape[0]):
        t[k] = pts[p, k] - cen[C, k] - dot * cen[C, k]
    return dot


@njit(cache=True, parallel=True)
def cell_models(pts, pot, ptr, cen):  # noqa: C901, PLR0912, PLR0915 - one compiled kernel
    r"""Each cell's linear model of the potential, for the bound of :func:`_model_bound`.

    A point of cell C is :math:`p = o + t + \delta o` (:math:`o` the unit centre, :math:`t
    \perp o` its tangent offset, :math:`\delta = (p - o)\cdot o \le 0`).  The least-squares
    fit :math:`pot_p \approx \alpha + \beta\cdot t` (:math:`\beta \perp o`) and the exact
    excess :math:`\rho = \max_p (pot_p - \alpha - \beta\cdot t_p)` make
    :math:`pot_p \le \alpha + \beta\cdot t_p + \rho` hold for every point of the cell,
    whatever the fit.  Returns ``mod``, shape ``(cells, d + 5)``: :math:`\alpha, \rho`, the
    largest :math:`|t|`, the range of :math:`\delta`, then :math:`\beta`; an empty cell has
    :math:`\rho = -\infty` (never scanned).
    """
    nc, d = cen.shape
    mod = np.zeros((nc, d + 5))
    for C in prange(nc):
        s, e = ptr[C], ptr[C + 1]
        if e == s:
            mod[C, 1] = -np.inf
            continue
        m = d + 1
        A = np.zeros((m, m + 1))  # the normal equations of the fit, augmented
        t = np.empty(d)
        for p in range(s, e):
            _offset(pts, p, cen, C, t)
            for i in range(m):
                ri = 1.0 if i == 0 else t[i - 1]
                for j in range(m):
                    A[i, j] += ri * (1.0 if j == 0 else t[j - 1])
                A[i, m] += ri * pot[p]
        # a small ridge: the offsets span the tangent plane only (and one point spans nothing)
        for i in range(1, m):
            A[i, i] += 1e-12 * A[0, 0]
        for i in range(m):  # Gaussian elimination with partial pivoting
            piv = i
            for j in range(i + 1, m):
                if abs(A[j, i]) > abs(A[piv, i]):
                    piv = j
            for j in range(m + 1):
                A[i, j], A[piv, j] = A[piv, j], A[i, j]
            for j in range(i + 1, m):
                fac = A[j, i] / A[i, i]
                for k in range(i, m + 1):
                    A[j, k] -= fac * A[i, k]
        sol = np.zeros(m)
        for i in range(m - 1, -1, -1):
            acc = A[i, m]
            for j in range(i + 1, m):
                acc -= A[i, j] * sol[j]
            sol[i] = acc / A[i, i]
        bn = 0.0
        for k in range(d):
            bn += sol[1 + k] * cen[C, k]
        for k in range(d):
            mod[C, 5 + k] = sol[1 + k] - bn * cen[C, k]  # beta, tangent
        alpha = sol[0]
        rho, rt, lo, hi = -np.inf, 0.0, np.inf, -np.inf
        for p in range(s, e):
            dot = _offset(pts, p, cen, C, t)
            lin, tt = 0.0, 0.0
            for k in range(d):
                lin += mod[C, 5 + k] * t[k]
                tt += t[k] * t[k]
            rho = max(rho, pot[p] - alpha - lin)
            rt = max(rt, math.sqrt(tt))
            lo = min(lo, dot)
            hi = max(hi, dot)
        mod[C, 0], mod[C, 1], mod[C, 2], mod[C, 3], mod[C, 4] = alpha, rho, rt, lo, hi
    return mod


@njit(cache=True, inline="always")
def _model_bound(q, r, C, pcen, mod, b0, kk):
    r"""A lower bound of ``c(q_r, p) - pot_p`` over the points of cell ``C`` from its linear
    model (:func:`cell_models`): tight to second order in the cell's size near the query's
    best partner, where the cost's and the potential's gradients cancel.

    With the tangent :math:`c \ge b_0 + k s` of the cost in the squared chord
    :math:`s = 2 - 2 q\cdot p` (:func:`_tangent`, at the centre's chord),
    :math:`c - pot \ge b_0 + 2k - (2k\,q\cdot p + pot_p)` and
    :math:`2k\,q\cdot p + pot_p \le 2k\,q\cdot o + \alpha + \rho + |P_o^\perp(2kq + \beta)|
    \max|t| + 2k \max_\delta (q\cdot o)\,\delta`.
    """
    d = q.shape[1]
    qo = 0.0
    for k in range(d):
        qo += q[r, k] * pcen[C, k]
    vv, vn = 0.0, 0.0
    for k in range(d):
        v = 2.0 * kk * q[r, k] + mod[C, 5 + k]
        vv += v * v
        vn += v * pcen[C, k]
    nt = math.sqrt(max(vv - vn * vn, 0.0))
    up = (
        2.0 * kk * qo
        + mod[C, 0]
        + mod[C, 1]
        + nt * mod[C, 2]
        + 2.0 * kk * max(qo * mod[C, 3], qo * mod[C, 4])
    )
    return b0 + 2.0 * kk - up - _MSLACK


@njit(cache=True)
def _cell_best(q, r, cand, lb, pts, pot, pptr, pcen, prad, ptop, mod, geodesic):
    """``min_p (c(q_r, p) - pot_p)`` over the candidate cells, and the points scanned."""
    best = np.inf
    cnt = 0
    for C in cand:
        if lb[C] > best:
            break  # sorted: no later cell can hold a better point
        if _query_bound(q, r, C, pcen, prad, ptop, geodesic) > best:
            continue
        b0, kk = _tangent(q, r, C, pcen, geodesic)
        if _model_bound(q, r, C, pcen, mod, b0, kk) > best:
            continue
        for p in range(pptr[C], pptr[C + 1]):
            if geodesic and b0 + kk * _sq_chord(q, pts, r, p) - pot[p] - _MSLACK > best:
                continue  # the tangent's bound already exceeds the best: no arctangent
            v = pair_cost(q, pts, r, p, geodesic) - pot[p]
            if v < best:
                best = v
        cnt += pptr[C + 1] - pptr[C]
    return best, cnt


@njit(cache=True, parallel=True)
def cell_c_transform(q, qptr, qcen, qrad, pts, pot, pptr, pcen, prad, ptop, parg, mod, geodesic):
    r""":math:`\min_k (c(q_r, p_k) - pot_k)` over ALL points, by bounds on cells of points.

    ``q`` and ``pts`` are sorted by cell: cell ``D`` of the queries holds rows
    ``qptr[D]:qptr[D + 1]``, within ``qrad[D]`` of ``qcen[D]``; cell ``C`` of the points rows
    ``pptr[C]:pptr[C + 1]``, within ``prad[C]`` of ``pcen[C]``, largest potential ``ptop[C]``, at
    row ``parg[C]``, linear model ``mod[C]`` (:func:`cell_models`).  Cells whose bounds exceed
    the best value found are skipped.  Returns the values (query order) and the points scanned.
    """
    nd = qptr.shape[0] - 1
    out = np.empty(q.shape[0])
    scanned = np.zeros(nd, dtype=np.int64)
    for D in prange(nd):
        lb, cand = _cell_candidates(D, qcen, qrad, pts, pcen, prad, ptop, parg, geodesic, 0.0)
        for r in range(qptr[D], qptr[D + 1]):
            out[r], cnt = _cell_best(
                q, r, cand, lb, pts, pot, pptr, pcen, prad, ptop, mod, geodesic
            )
            scanned[D] += cnt
    return out, scanned.sum()


@njit(cache=True, parallel=True)
def cell_within(
    q, qptr, qcen, qrad, pts, pot, pptr, pcen, prad, ptop, parg, mod, gap, ref, geodesic, out_ptr
):
    r"""Every point within ``gap[r]`` of query ``r``'s reference: ``c(q_r, p) - pot_p \le
    t_r + gap_r``, :math:`t_r = \max(m_r, \min(ref_r, m_r + gap_r))`, :math:`m_r = \min_k
    (c(q_r, p_k) - pot_k)` the best (:math:`t_r = m_r` for ``ref[r] = -inf``), by the bounds of
    :func:`cell_c_transform`.

    With ``out_ptr`` empty: returns the count per query (query order).  With ``out_ptr`` the
    counts' row pointers (length ``nq + 1``): returns the points (rows of ``pts``) and their costs
    ``c(q_r, p)``, grouped by query.
    """
    nd, nq = qptr.shape[0] - 1, q.shape[0]
    fill = out_ptr.shape[0] == nq + 1
    count = np.zeros(nq, dtype=np.int64)
    pts_out = np.empty(out_ptr[-1] if fill else 0, dtype=np.int64)
    cost_out = np.empty(out_ptr[-1] if fill else 0)
    for D in prange(nd):
        reach = 0.0  # the widest window of the cell's queries above their best
        for r in range(qptr[D], qptr[D + 1]):
            reach = max(reach, (2.0 if ref[r] > -np.inf else 1.0) * gap[r])
        lb, cand = _cell_candidates(D, qcen, qrad, pts, pcen, prad, ptop, parg, geodesic, reach)
        for r in range(qptr[D], qptr[D + 1]):
            best, _ = _cell_best(q, r, cand, lb, pts, pot, pptr, pcen, prad, ptop, mod, geodesic)
            top = max(best, min(ref[r], best + gap[r])) + gap[r]
            t = out_ptr[r] if fill else 0
            for C in cand:
                if lb[C] > top:
                    break
                if _query_bound(q, r, C, pcen, prad, ptop, geodesic) > top:
                    continue
                b0, kk = _tangent(q, r, C, pcen, geodesic)
                if _model_bound(q, r, C, pcen, mod, b0, kk) > top:
                    continue
                for p in range(pptr[C], pptr[C + 1]):
                    if geodesic and b0 + kk * _sq_chord(q, pts, r, p) - pot[p] - _MSLACK > top:
                        continue
                    c = pair_cost(q, pts, r, p, geodesic)
                    if c - pot[p] <= top:
                        if fill:
                            pts_out[t] = p
                            cost_out[t] = c
                        t += 1
            count[r] = t - (out_ptr[r] if fill else 0)
    return count, pts_out, cost_out


@njit(cache=True, parallel=True)
def candidate_values(q, pts, pot, idx, geodesic):
    r""":math:`c(q_r, p_{idx[r, t]}) - pot_{idx[r, t]}`, shape ``idx.shape``."""
    out = np.empty(idx.shape)
    for r in prange(idx.shape[0]):
        for t in range(idx.shape[1]):
            k = idx[r, t]
            out[r, t] = pair_cost(q, pts, r, k, geodesic) - pot[k]
    return out


#: fine atoms per block of :func:`walk_support` (one scratch row of reduced costs per block)
WALK_BLOCK = 4096
#: positions of a neighbour row a fine atom's support records as bits (int64, sign bit unused)
MASK_BITS = 63


@njit(cache=True, inline="always")
def _beyond(dist, top, b, q, d_yb, lim):
    """Whether every neighbour ``nbr[b, q:]`` of atom ``b`` (rows sorted by their chord ``dist``
    to ``b``) has a reduced cost above ``lim`` for a fine atom at chord ``d_yb`` from ``b``:
    ``|y - x_i| >= dist - d_yb`` and ``psi_i <= top[b]``, the row's largest potential."""
    e = dist[b, q] - d_yb
    return e >= 0.0 and e * e - top[b] > lim


@njit(cache=True, parallel=True)
def walk_support(y, x, psi, nbr, dist, top, best, gap, count, mask):
    """Each fine atom's best atom and how many atoms lie near it, by a walk on the atoms' graph.

    For fine atom ``j``: from ``best[j]`` (updated in place), move to the neighbour
    (``nbr[b]``: the atom ``b`` itself, then its neighbours by increasing chord ``dist``, padded
    with -1) of least reduced cost ``|y_j - x_i|^2 - psi_i`` until none is lower; ``count[j]`` =
    the atoms of ``nbr[best[j]]`` within ``gap[j]`` of that least cost, ``mask[j]`` the bits of
    their positions ``q < MASK_BITS`` in that row (:func:`walk_fill` lists them).  A scan stops where the rest cannot come within the gap (:func:`_beyond`; ``top``:
    each row's largest ``psi``).  A local search: the caller checks it with exact queries.
    """
    M, K = y.shape[0], nbr.shape[1]
    for blk in prange((M + WALK_BLOCK - 1) // WALK_BLOCK):
        red = np.empty(K)
        for j in range(blk * WALK_BLOCK, min(M, (blk + 1) * WALK_BLOCK)):
            b = best[j]
            c_b = _sq_chord(x, y, b, j)
            rb = c_b - psi[b]
            while True:
                nb, c_nb = b, c_b
                d_yb = math.sqrt(c_b)  # as walk_fill computes it: the same rows
                red[0] = rb  # nbr[b, 0] is b itself
                n = K
                for q in range(1, K):
                    i = nbr[b, q]
                    if i < 0 or _beyond(dist, top, b, q, d_yb, rb + gap[j]):
                        n = q
                        break
                    c = _sq_chord(x, y, i, j)
                    r = c - psi[i]
                    red[q] = r
                    if r < rb:
                        rb, nb, c_nb = r, i, c
                if nb == b:
                    break
                b, c_b = nb, c_nb
            best[j] = b
            c = 0
            bits = 0
            lim = rb + gap[j]
            for q in range(n):
                if red[q] <= lim:
                    c += 1
                    if q < MASK_BITS:
                        bits |= 1 << q
            count[j] = c
            mask[j] = bits


@njit(cache=True, parallel=True)
def walk_fill(y, x, psi, nbr, dist, top, best, gap, mask, ptr, rows, atoms, costs):
    """The supports :func:`walk_support` counted, flat in ``ptr`` order: each entry's fine atom
    ``rows``, atom ``atoms`` and cost ``|y_j - x_i|^2`` ``costs`` (rows with no entries skipped).
    The positions below ``MASK_BITS`` come from ``mask``; a row longer than that is scanned on
    from there as :func:`walk_support` scanned it (:func:`_beyond` only grows along a row)."""
    K = nbr.shape[1]
    for j in prange(y.shape[0]):
        if ptr[j + 1] == ptr[j]:  # a row the caller takes elsewhere
            continue
        b = best[j]
        p = ptr[j]
        bits, q = mask[j], 0
        while bits:
            if bits & 1 and p < ptr[j + 1]:
                i = nbr[b, q]
                rows[p] = j
                atoms[p] = i
                costs[p] = _sq_chord(x, y, i, j)
                p += 1
            bits >>= 1
            q += 1
        if K <= MASK_BITS:
            continue
        c_b = _sq_chord(x, y, b, j)
        d_yb = math.sqrt(c_b)
        lim = c_b - psi[b] + gap[j]
        for q in range(MASK_BITS, K):
            i = nbr[b, q]
            if i < 0 or _beyond(dist, top, b, q, d_yb, lim):
                break
            c = _sq_chord(x, y, i, j)
            if c - psi[i] <= lim and p < ptr[j + 1]:
                rows[p] = j
                atoms[p] = i
                costs[p] = c
                p += 1


@njit(cache=True)
def split_pairs(indptr, atoms, P, coef, lo, hi):
    """The off-diagonal terms ``coef_j P_p P_q`` of ``sum_j coef_j P_j P_j^T`` over the entries
    ``p != q`` of each row ``j`` (CSR ``indptr``, atoms ``atoms``) whose weights lie in
    ``(lo, hi)``: flat arrays ``(row atom, column atom, value)``, duplicates not summed."""
    M = indptr.size - 1
    n = 0
    for j in range(M):
        s = 0
        for p in range(indptr[j], indptr[j + 1]):
            if lo < P[p] < hi:
                s += 1
        n += s * (s - 1)
    r = np.empty(n, np.int64)
    c = np.empty(n, np.int64)
    v = np.empty(n)
    t = 0
    for j in range(M):
        for p in range(indptr[j], indptr[j + 1]):
            if not lo < P[p] < hi:
                continue
            for q in range(indptr[j], indptr[j + 1]):
                if q != p and lo < P[q] < hi:
                    r[t] = atoms[p]
                    c[t] = atoms[q]
                    v[t] = coef[j] * P[p] * P[q]
                    t += 1
    return r, c, v


# -- the hand-over: a fine row's candidates are the children j (``ch`` in CSR ``ch_ptr``) of every
# coarse column of its cell's row in the coarse pattern (``ptr_c``, ``cols_c``) ---------------


@njit(cache=True)
def _gather(big, ptr_c, cols_c, ch_ptr, ch, y, g):
    """The candidates of coarse cell ``big``: the fine children of its kept coarse partners,
    ascending, with their points and potentials in contiguous arrays."""
    cnt = 0
    for p in range(ptr_c[big], ptr_c[big + 1]):
        jc = cols_c[p]
        cnt += ch_ptr[jc + 1] - ch_ptr[jc]
    js = np.empty(cnt, dtype=np.int64)
    t = 0
    for p in range(ptr_c[big], ptr_c[big + 1]):
        jc = cols_c[p]
        for q in range(ch_ptr[jc], ch_ptr[jc + 1]):
            js[t] = ch[q]
            t += 1
    js.sort()
    yy = np.empty((cnt, y.shape[1]))
    gg = np.empty(cnt)
    for t in range(cnt):
        j = js[t]
        for k in range(y.shape[1]):
            yy[t, k] = y[j, k]
        gg[t] = g[j]
    return js, yy, gg


@njit(cache=True, parallel=True)
def expand_thresholds(ptr_c, cols_c, ch_ptr, ch, own_ptr, own, x, y, f, g, slack, k_min, geodesic):
    r"""Each fine row's cut on :math:`c_{ij} - g_j` over its candidates.

    :math:`\max(\max(f_i, \min_j (c_{ij} - g_j)) + slack,\ v_{(k_{min})})`, with
    :math:`v_{(k)}` the row's k-th smallest :math:`c_{ij} - g_j`; ``inf`` for a row with at
    most ``k_min`` candidates.  The rows are taken by coarse cell (``own``, CSR ``own_ptr``),
    whose candidates they share (:func:`_gather`).
    """
    out = np.empty(x.shape[0])
    for big in prange(own_ptr.shape[0] - 1):
        js, yy, gg = _gather(big, ptr_c, cols_c, ch_ptr, ch, y, g)
        cnt = js.shape[0]
        buf = np.empty(cnt)
        for r in range(own_ptr[big], own_ptr[big + 1]):
            i = own[r]
            if cnt <= k_min:
                out[i] = np.inf
                continue
            lo = np.inf
            for t in range(cnt):
                v = pair_cost(x, yy, i, t, geodesic) - gg[t]
                buf[t] = v
                if v < lo:
                    lo = v
            kth = np.partition(buf, k_min - 1)[k_min - 1]
            out[i] = max(max(f[i], lo) + slack, kth)
    return out


@njit(cache=True, parallel=True)
def expand_count(ptr_c, cols_c, ch_ptr, ch, own_ptr, own, x, y, f, g, thr_r, thr_c, geodesic):
    r"""Number of kept candidates of each fine row: :math:`c_{ij} - g_j \le thr_r[i]` or
    :math:`c_{ij} - f_i \le thr_c[j]` (rows by coarse cell, as :func:`expand_thresholds`)."""
    out = np.zeros(x.shape[0], dtype=np.int64)
    for big in prange(own_ptr.shape[0] - 1):
        js, yy, gg = _gather(big, ptr_c, cols_c, ch_ptr, ch, y, g)
        tt = thr_c[js]
        for r in range(own_ptr[big], own_ptr[big + 1]):
            i = own[r]
            cnt = 0
            for t in range(js.shape[0]):
                c = pair_cost(x, yy, i, t, geodesic)
                if c - gg[t] <= thr_r[i] or c - f[i] <= tt[t]:
                    cnt += 1
            out[i] = cnt
    return out


@njit(cache=True, parallel=True)
def expand_fill(ptr_c, cols_c, ch_ptr, ch, own_ptr, own, x, y, f, g, thr_r, thr_c, geodesic, ptr):
    r"""The kept candidates counted by :func:`expand_count`: columns and costs, CSR order
    (``ptr`` from the counts), each row's columns ascending."""
    n = x.shape[0]
    cols = np.empty(ptr[n], dtype=np.int64)
    cost = np.empty(ptr[n])
    for big in prange(own_ptr.shape[0] - 1):
        js, yy, gg = _gather(big, ptr_c, cols_c, ch_ptr, ch, y, g)
        tt = thr_c[js]
        for r in range(own_ptr[big], own_ptr[big + 1]):
            i = own[r]
            t = ptr[i]
            for s in range(js.shape[0]):
                c = pair_cost(x, yy, i, s, geodesic)
                if c - gg[s] <= thr_r[i] or c - f[i] <= tt[s]:
                    cols[t] = js[s]
                    cost[t] = c
                    t += 1
    return cols, cost
