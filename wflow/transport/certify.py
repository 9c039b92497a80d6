r"""Certified bounds on :math:`W_2^2` on the sphere: an exact c-transform and a feasible plan.

Lower bound.  Any :math:`(f, g)` with :math:`f_i + g_j \le c_{ij}` for **all** pairs gives
:math:`\sum_i a_i f_i + \sum_j b_j g_j \le W_2^2`; :func:`c_transform` computes
:math:`g = f^c`, :math:`g_j = \min_i (c_{ij} - f_i)`, exactly without the :math:`N^2` pairs,
by bounds on cells of points (:class:`Cells`), lowered by ``ROUNDOFF`` so that round-off
cannot make the pair infeasible.

Kernel truncation (:func:`threshold_pairs`): pairs within a threshold are found by a k-d tree
in a lifted space.  With :math:`s = |x - y|^2`, the cost :math:`c = h(s)` (:math:`h(s) = s`
chordal, :math:`(2\arcsin(\sqrt s/2))^2` geodesic) is convex and increasing, so its tangent
at :math:`s_b` (slope :math:`k_b = \theta_b/\sin\theta_b`) bounds it from below and, for the
lifted points :math:`\tilde x_i = (x_i, \sqrt{F - f_i/k_b})`, :math:`F = \max_i f_i/k_b`,
:math:`\tilde y = (y, 0)`,

.. math::
    c_{ij} - f_i \;\ge\; h(s_b) - k_b s_b + k_b\,(|\tilde x_i - \tilde y_j|^2 - F).

The queries are grouped by the angle :math:`\theta_b` of their expected partner (``BIN``).

Upper bound: the cost of any plan with the exact marginals
(:func:`wflow.transport.sparse_kernels.rounded_plan_cost`).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.spatial import cKDTree

from ..kernels import jit  # noqa: F401  (registers the notices of what numba compiles)
from .sparse_kernels import candidate_values, cell_c_transform, cell_models, cell_within

__all__ = [
    "BIN",
    "ROUNDOFF",
    "MIN_TOL",
    "tangent",
    "lifted_knn",
    "c_transform",
    "Cells",
    "cmax",
    "threshold_pairs",
]

#: width (radians) of the bins of expected transport angle that share one tangent
BIN = 0.15
#: subtracted from every certified c-transform value: dual feasibility despite round-off
ROUNDOFF = 1e-12
#: the smallest relative bracket width on W_2 accepted (float64 certifies no less)
MIN_TOL = 1e-9
#: the most cells of points (or of queries) a search makes: its bounds cost cells² operations
MAX_CELLS = 20_000


def cmax(geodesic: bool) -> float:
    """The largest cost: :math:`\\pi^2` (geodesic) or 4 (chordal, squared diameter)."""
    return math.pi**2 if geodesic else 4.0


def tangent(b: int, geodesic: bool) -> tuple[float, float, float]:
    """``(h(s_b), k_b, s_b)`` of the tangent used for angle bin ``b``."""
    if not geodesic:
        return 0.0, 1.0, 0.0
    tb = min((b + 0.5) * BIN, 3.0)
    return tb * tb, tb / math.sin(tb), 2.0 - 2.0 * math.cos(tb)


def _bins(theta0: np.ndarray | None, n: int, geodesic: bool) -> np.ndarray:
    if not geodesic or theta0 is None:
        return np.zeros(n, dtype=np.int64)
    return np.minimum((theta0 / BIN).astype(np.int64), int(3.0 / BIN))


def lifted_knn(
    q: np.ndarray,
    pts: np.ndarray,
    pot: np.ndarray,
    theta0: np.ndarray | None,
    k: int,
    geodesic: bool,
    workers: int = 2,
) -> tuple[np.ndarray, np.ndarray]:
    r"""For each query, the ``k`` points with smallest tangent bound of :math:`c(q, p) - pot_p`.

    Parameters
    ----------
    q : ndarray, shape (nq, d)
        Queries on the sphere.
    pts : ndarray, shape (n, d)
        Points on the sphere with potential ``pot``, shape ``(n,)``.
    theta0 : ndarray, shape (nq,), or None
        Expected angle to each query's partner (chooses the tangent; geodesic only).
    k : int
        Number of candidates (at most ``n``).

    Returns
    -------
    idx : ndarray of int, shape (nq, k)
        Candidate indices into ``pts``.
    lb : ndarray, shape (nq,)
        A lower bound of :math:`c(q, p) - pot_p` for every ``p`` NOT in ``idx``
        (``inf`` when ``k = n``).
    """
    nq, n = q.shape[0], pts.shape[0]
    k = min(k, n)
    idx = np.empty((nq, k), dtype=np.int64)
    lb = np.full(nq, np.inf)
    bins = _bins(theta0, nq, geodesic)
    zq = np.zeros((nq, 1))
    for b in np.unique(bins):
        sel = np.flatnonzero(bins == b)
        hb, kb, sb = tangent(int(b), geodesic)
        w = pot / kb
        top = float(w.max())
        tree = cKDTree(np.hstack([pts, np.sqrt(np.maximum(top - w, 0.0))[:, None]]))
        dist, ii = tree.query(np.hstack([q[sel], zq[sel]]), k=k, workers=workers)
        ii = ii.reshape(sel.size, k)
        idx[sel] = ii
        if k < n:
            dk = dist.reshape(sel.size, k)[:, -1]
            lb[sel] = hb - kb * sb + kb * (dk * dk - top)
    return idx, lb


def _group(pts: np.ndarray, centres: np.ndarray, workers: int) -> tuple[np.ndarray, ...]:
    """``pts`` grouped by nearest centre: the order, the cells' row pointers and radii."""
    _, lab = cKDTree(centres).query(pts, workers=workers)
    order = np.argsort(lab, kind="stable")
    ptr = np.zeros(centres.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.bincount(lab, minlength=centres.shape[0]), out=ptr[1:])
    rad = np.zeros(centres.shape[0])
    dist = np.linalg.norm(pts[order] - centres[lab[order]], axis=1)
    full = ptr[1:] > ptr[:-1]
    rad[full] = np.maximum.reduceat(dist, ptr[:-1][full])
    return order, ptr, rad


class Cells:
    r"""Points on the sphere grouped in cells, for exact searches of :math:`c(q, p) - pot_p`.

    About ``per_cell`` points per cell, around centres drawn from the points (reproducibly);
    built once, searched with any potential.  A cell is scanned only when one of two lower
    bounds of its values beats the best found: the cost at the query's distance to the
    centre less the cell's radius, minus its largest potential; and a linear fit of the
    potential plus the fit's largest excess
    (:func:`~wflow.transport.sparse_kernels.cell_models`).  Exact whatever the potential;
    O(cells² + queries · scanned) per search.
    """

    def __init__(self, pts: np.ndarray, per_cell: int = 32, workers: int = 2):
        n = pts.shape[0]
        nc = int(np.clip(n // per_cell, 1, MAX_CELLS))
        self.n, self.per_cell, self.workers = n, per_cell, workers
        self.centres = np.ascontiguousarray(pts[np.random.default_rng(0).choice(n, nc, False)])
        self.order, self.ptr, self.radius = _group(pts, self.centres, workers)
        self.pts = np.ascontiguousarray(pts[self.order])
        self.size = np.diff(self.ptr)
        self.cell_of = np.repeat(np.arange(nc), self.size)

    def group(self, q: np.ndarray) -> tuple[np.ndarray, ...]:
        """The queries in cells of their own, about ``per_cell`` each (at least 64 cells, or one
        per query; small cells keep the bounds tight): ``(order, ptr, radius, sorted queries,
        centres)``; pass it instead of ``q`` to search the same queries again."""
        nq = q.shape[0]
        nd = int(np.clip(nq // self.per_cell, min(nq, 64), MAX_CELLS))
        centres = np.ascontiguousarray(q[np.random.default_rng(1).choice(nq, nd, False)])
        if nq == 0:
            return (
                np.zeros(0, np.int64),
                np.zeros(1, np.int64),
                np.zeros(0),
                np.ascontiguousarray(q),
                centres,
            )
        order, ptr, rad = _group(q, centres, self.workers)
        return order, ptr, rad, np.ascontiguousarray(q[order]), centres

    def _top(self, pot: np.ndarray) -> tuple[np.ndarray, ...]:
        """The potential in cell order, each cell's largest value, the row holding it and the
        cell's linear model of the potential (:func:`~wflow.transport.sparse_kernels.cell_models`)."""
        pv = np.ascontiguousarray(pot[self.order], dtype=np.float64)
        full = self.size > 0
        top = np.full(self.size.shape[0], -np.inf)  # an empty cell: never scanned
        top[full] = np.maximum.reduceat(pv, self.ptr[:-1][full])
        # the row of each cell's largest potential (the first of equal ones)
        arg = np.minimum(self.ptr[:-1], self.n - 1)
        first = np.flatnonzero(pv == top[self.cell_of])
        arg[self.cell_of[first][::-1]] = first[::-1]
        return pv, top, arg, cell_models(self.pts, pv, self.ptr, self.centres)

    def c_transform(self, q, pot: np.ndarray, geodesic: bool) -> tuple[np.ndarray, float]:
        r""":math:`\min_p (c(q_r, p) - pot_p)` for every query (exact; not lowered), and the
        points scanned per query."""
        qo, qptr, qrad, qs, qcen = q if isinstance(q, tuple) else self.group(q)
        pv, top, arg, mod = self._top(pot)
        cells = (self.pts, pv, self.ptr, self.centres, self.radius, top, arg, mod)
        vals, scanned = cell_c_transform(qs, qptr, qcen, qrad, *cells, geodesic)
        out = np.empty(qo.shape[0])
        out[qo] = vals
        return out, float(scanned) / max(qo.shape[0], 1)

    def within(
        self, q, pot: np.ndarray, gap: np.ndarray, geodesic: bool, ref: np.ndarray | None = None
    ) -> tuple[np.ndarray, ...]:
        r"""Every pair with :math:`c(q_r, p) - pot_p \le t_r + gap_r`, :math:`t_r` the query's
        best :math:`m_r = \min_k (c(q_r, p_k) - pot_k)`, or with ``ref`` the reference
        :math:`\max(m_r, \min(ref_r, m_r + gap_r))`: the query rows, the points (indices into the
        points given) and the costs, grouped by query."""
        qo, qptr, qrad, qs, qcen = q if isinstance(q, tuple) else self.group(q)
        pv, top, arg, mod = self._top(pot)
        cells = (self.pts, pv, self.ptr, self.centres, self.radius, top, arg, mod)
        gs = np.ascontiguousarray(gap[qo], dtype=np.float64)
        rs = (
            np.full(qo.shape[0], -np.inf)
            if ref is None
            else np.ascontiguousarray(ref[qo], dtype=np.float64)
        )
        args = (qs, qptr, qcen, qrad, *cells, gs, rs, geodesic)
        count, _, _ = cell_within(*args, np.empty(0, np.int64))
        ptr = np.zeros(count.shape[0] + 1, dtype=np.int64)
        np.cumsum(count, out=ptr[1:])
        _, p, c = cell_within(*args, ptr)
        return np.repeat(qo, count), self.order[p], c


def c_transform(
    q: np.ndarray,
    pts: np.ndarray,
    pot: np.ndarray,
    geodesic: bool,
    per_cell: int = 32,
    workers: int = 2,
) -> tuple[np.ndarray, dict]:
    r"""Certified :math:`\min_p (c(q, p) - pot_p)` over ALL points ``pts``, lowered by ``ROUNDOFF``.

    Exact by the cells' bounds of :class:`Cells` (about ``per_cell`` points each): no point
    that could be the minimum is skipped, whatever the potential.  Returns the values, shape
    ``(nq,)``, and statistics (``cells``; ``scanned``: points scanned per query, on average).

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.transport.certify import c_transform
    >>> from wflow.sphere import cost_matrix
    >>> x, y = wflow.sphere.uniform(300, 3, seed=0), wflow.sphere.uniform(200, 3, seed=1)
    >>> f = np.random.default_rng(0).uniform(0, 1, 300)
    >>> g, _ = c_transform(y, x, f, geodesic=True)
    >>> exact = (cost_matrix(y, x) - f[None, :]).min(axis=1)
    >>> bool(np.all(g <= exact) and np.allclose(g, exact, atol=1e-11))
    True
    """
    cells = Cells(pts, per_cell, workers)
    vals, scanned = cells.c_transform(q, pot, geodesic)
    return vals - ROUNDOFF, {"cells": cells.size.shape[0], "scanned": scanned}


def threshold_pairs(
    q: np.ndarray,
    pts: np.ndarray,
    pot: np.ndarray,
    theta0: np.ndarray | None,
    geodesic: bool,
    slack: float,
    k: int = 32,
    k_max: int = 512,
    k_min: int = 16,
    ref: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    r"""All pairs with :math:`c(q_i, p_j) - pot_j \le t_i + slack`, :math:`t_i = \max(ref_i, \min_j (c(q_i, p_j) - pot_j))`.

    With ``ref`` the query's own potential :math:`f_i`, the kept pairs are those with
    :math:`f_i + pot_j - c_{ij} \ge -slack`: the dropped entries of the plan carry at most
    :math:`e^{-slack/\varepsilon}` of row i's mass (the kernel truncation of Schmitzer 2019).
    The k-d tree candidates grow (4x) until the tangent bound of every other point exceeds
    the threshold, up to ``k_max`` per query (beyond, the ``k_max`` best by the bound), and
    at least the ``k_min`` best are kept.  Returns ``(rows, cols)`` of the kept pairs.
    """
    nq, n = q.shape[0], pts.shape[0]
    rows_out, cols_out = [], []
    todo = np.arange(nq)
    while todo.size:
        kk = min(k, n)
        th = None if theta0 is None else theta0[todo]
        idx, lb = lifted_knn(q[todo], pts, pot, th, kk, geodesic)
        vals = candidate_values(q[todo], pts, pot, idx, geodesic)
        best = vals.min(axis=1)
        if ref is not None:
            best = np.maximum(best, ref[todo])
        done = (lb >= best + slack) | (kk >= min(n, k_max))
        # the threshold set, and at least the k_min best (a margin for unconverged potentials)
        kth = np.partition(vals, min(k_min, kk) - 1, axis=1)[:, min(k_min, kk) - 1]
        keep = ((vals <= (best + slack)[:, None]) | (vals <= kth[:, None])) & done[:, None]
        r, t = np.nonzero(keep)
        rows_out.append(todo[r])
        cols_out.append(idx[r, t])
        todo = todo[~done]
        k *= 4
    return np.concatenate(rows_out), np.concatenate(cols_out)
