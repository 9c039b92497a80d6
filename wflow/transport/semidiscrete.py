r"""Semi-discrete :math:`W_2` on :math:`S^{d-1}`: N atoms against a fine quadrature of a continuum.

For atoms :math:`\mu_N = \sum_i a_i\delta_{x_i}` and a much finer measure
:math:`\nu = \sum_j w_j\delta_{y_j}` (:math:`M \gg N`) with the squared chordal cost
:math:`|x - y|^2 = 2 - 2\langle x, y\rangle`, the Kantorovich dual is a concave function of
one potential :math:`\psi \in \mathbb R^N`,

.. math::
    F_0(\psi) = \sum_i a_i\psi_i + \sum_j w_j \min_i\big(|y_j - x_i|^2 - \psi_i\big)
    \le W_2^2(\mu_N, \nu) \quad\text{for every } \psi,

and :math:`\max_\psi F_0 = W_2^2`; the inner minimum is computed exactly by a search over
cells of atoms (:class:`wflow.transport.certify.Cells`).  :math:`\psi` comes from damped
Newton steps (Kitagawa, Mérigot & Thibert, JEMS 2019) on the entropic semi-dual, with one
:math:`\varepsilon_j` per fine atom,

.. math::
    F_\varepsilon(\psi) = \sum_i a_i\psi_i - \sum_j w_j\varepsilon_j
    \log\sum_{i \in K_j} a_i\, e^{(\psi_i - |y_j - x_i|^2)/\varepsilon_j},

concave, with gradient :math:`a - m` (:math:`m` the :math:`\mu_N`-marginal of the plan
:math:`\pi_{ij} = w_j P_{ji}`, :math:`P_j` the softmax over the support :math:`K_j`) and a
graph Laplacian for Hessian (:meth:`_Solver.hessian`).  The schedule of
:math:`\varepsilon_j`, the supports and the line search: docs/transport.md.

Certified bracket.  :math:`\mathrm{lo} = F_0(\psi)` is a lower bound, and the plan
:math:`\pi` (exact :math:`\nu`-marginal) gives :math:`\mathrm{hi} = \sum_{ij}\pi_{ij}|x_i -
y_j|^2 + 2\|m - a\|_1` (re-routing the mass mismatch costs at most :math:`\mathrm{diam}^2 =
4` per unit, half of it moves), so :math:`\mathrm{lo} \le W_2^2 \le \mathrm{hi}` whatever the
solver did.  Geodesic cost: with :math:`c_\max` the longest chord the plan uses,
:math:`W_2^{\mathrm{chord}} \le W_2^{\mathrm{geo}} \le \frac{2\arcsin(c_\max/2)}{c_\max}
\sqrt{\mathrm{hi}}`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import available_memory, real_float_dtype

__all__ = ["semidiscrete_w2"]

log = logging.getLogger(__name__)

#: marginal error ``|m - a|_1`` at which a stage before the last gives way to the next ``eps``
STAGE_TOL = 1e-4

#: nearest atoms (itself included) of each atom in the graph the supports' walks follow
NEIGHBOURS = 32


def _graph(x: np.ndarray, knn: np.ndarray) -> np.ndarray:
    """Each atom's neighbours (itself first): its nearest atoms (``knn``, a k-d query of ``x``
    against itself) and its neighbours in the spherical Delaunay triangulation (the convex hull's
    edges), which join clusters the nearest atoms do not; rows padded with -1."""
    from scipy.spatial import ConvexHull, QhullError

    n = x.shape[0]
    knn = knn.reshape(n, -1)
    try:
        tri = ConvexHull(x).simplices if n > x.shape[1] else np.empty((0, 3), int)
    except (QhullError, ValueError):  # degenerate (all atoms on a great circle): nearest only
        tri = np.empty((0, 3), int)
    src = np.concatenate([np.repeat(np.arange(n), knn.shape[1]), tri.ravel(), tri.ravel()])
    dst = np.concatenate(
        [knn.ravel(), np.roll(tri, 1, axis=1).ravel(), np.roll(tri, -1, axis=1).ravel()]
    )
    key = np.unique(src.astype(np.int64) * n + dst)  # sorted by src
    src, dst = np.divmod(key, n)
    src, dst = src[src != dst], dst[src != dst]
    deg = np.bincount(src, minlength=n)
    out = np.full((n, int(deg.max()) + 1), -1, np.intp)
    out[:, 0] = np.arange(n)
    out[src, np.arange(len(src)) - np.repeat(np.cumsum(deg) - deg, deg) + 1] = dst
    return out


def _real(values: Any, name: str) -> np.ndarray:
    """``values`` as float64, refused (TypeError) when complex or object."""
    arr = np.asarray(values)
    real_float_dtype(arr.dtype, name, integers=True)
    return arr.astype(np.float64, copy=False)


#: bytes per fine atom a solve holds at its peak, and per atom (supports, Hessian, multigrid)
BYTES_PER_FINE_ATOM, BYTES_PER_ATOM = 800, 2000


def _first_bad(values: np.ndarray, bad: np.ndarray) -> str:
    k = int(np.argmax(bad))
    return f"{int(bad.sum())} entries, e.g. [{k}] = {float(values[k])!r}"


def _checked(
    x: Any, a: Any, y: Any, w: Any, psi0: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The inputs as float64 arrays, or a one-line ValueError (TypeError for a complex or object
    dtype) naming the argument and the value received; also refuses a problem whose estimated
    memory exceeds what is available."""
    x, a, y, w = (_real(v, name) for v, name in ((x, "x"), (a, "a"), (y, "y"), (w, "w")))
    for arr, name in ((x, "x"), (y, "y")):
        if arr.ndim != 2 or arr.shape[1] < 2:
            raise ValueError(
                f"{name}: points on a sphere, shape (n, d), d >= 2; got shape {arr.shape}"
            )
    if x.shape[1] != y.shape[1]:
        raise ValueError(
            f"y: points on S^{y.shape[1] - 1} (d={y.shape[1]}), but x is on S^{x.shape[1] - 1} "
            f"(d={x.shape[1]}): the measures must live on one sphere"
        )
    for pts, wts, name, pname in ((x, a, "a", "x"), (y, w, "w", "y")):
        if wts.shape != (pts.shape[0],):
            raise ValueError(f"{name}: shape ({pts.shape[0]},) to match {pname}, got {wts.shape}")
    bad = ~np.isfinite(w) | ~(w >= 0)
    if bad.any():
        raise ValueError(f"w: weights must be finite and >= 0, got {_first_bad(w, bad)}")
    bad = ~np.isfinite(a) | ~(a > 0)
    if bad.any():
        raise ValueError(f"a: weights must be finite and > 0, got {_first_bad(a, bad)}")
    ma, mw = float(a.sum()), float(w.sum())
    if abs(ma - mw) > 1e-9 * max(ma, mw):
        raise ValueError(
            f"a: the atoms' weights sum to {ma:.12g}, but the fine measure's w to {mw:.12g}"
        )
    N, M = x.shape[0], y.shape[0]
    need, avail = BYTES_PER_FINE_ATOM * M + BYTES_PER_ATOM * N, available_memory()
    if need > 0.8 * avail:
        raise ValueError(
            f"y: N={N} atoms against M={M} fine atoms need about {need / 2**30:.3g} GiB of memory; "
            f"{avail / 2**30:.3g} GiB is available"
        )
    if psi0 is None:
        return x, a, y, w, np.zeros(N)
    psi = _real(psi0, "psi0")
    if psi.shape != (N,) or not np.isfinite(psi).all():
        raise ValueError(f"psi0: a finite potential of shape ({N},), got shape {psi.shape}")
    return x, a, y, w, psi.copy()


class _Solver:
    """State of one semi-discrete solve: the data, and the support of the current entropic plan."""

    def __init__(self, x: np.ndarray, a: np.ndarray, y: np.ndarray, w: np.ndarray, workers: int):
        self.x, self.a, self.y, self.w = x, a, y, w
        self.N, self.M = x.shape[0], y.shape[0]
        self.workers = workers
        self.log_a = np.log(a)
        self.log_a_range = float(np.log(a.max() / a.min()))
        self.queries = 0  # exact searches of every fine atom (:meth:`support`, :meth:`lower`)
        self.partial_queries = 0  # ... of the fine atoms the walk cannot take (:meth:`walk`)
        from scipy.spatial import cKDTree

        from .certify import Cells

        # the atoms in cells, for exact searches (:meth:`_queried`), and the fine atoms by cell
        self.cells = Cells(x, workers=workers)
        self.y_cells = self.cells.group(y)
        # the atoms' neighbour graph, each row by increasing chord (the atom first, padding last),
        # and every fine atom's nearest atom, where the walks of :meth:`walk` start
        tree = cKDTree(x)
        nbr = _graph(x, tree.query(x, k=min(NEIGHBOURS, self.N), workers=workers)[1])
        dist = np.where(nbr >= 0, np.linalg.norm(x[nbr] - x[:, None, :], axis=2), np.inf)
        order = np.argsort(dist, axis=1, kind="stable")
        self.nbr = np.take_along_axis(nbr, order, axis=1)
        self.dist = np.take_along_axis(dist, order, axis=1)
        self.best = tree.query(y, k=1, workers=workers)[1].astype(np.intp)
        # fine atoms whose walk once missed part of their support: queried from then on
        self.forced = np.zeros(self.M, bool)
        # a support that holds all of an atom's neighbours may hold more (:meth:`walk`), unless
        # they are all the atoms
        degree = (self.nbr >= 0).sum(axis=1)
        self.degree = np.where(degree < self.N, degree, self.N + 1)

    def lower(self, psi: np.ndarray) -> float:
        """The dual value ``F_0(psi)`` with the exact c-transform: a lower bound of ``W_2^2``."""
        from .certify import ROUNDOFF

        self.queries += 1
        g, _ = self.cells.c_transform(self.y_cells, psi, False)
        return float(self.a @ psi + self.w @ (g - ROUNDOFF))

    def _queried(self, psi: np.ndarray, gap: np.ndarray, rows: np.ndarray | None = None):
        """Rows ``j``, atoms ``i`` and costs ``|y_j - x_i|^2`` of the exact supports of the fine
        atoms ``rows`` (all when ``None``): every atom whose reduced cost is within ``gap_j`` of the
        best (:meth:`wflow.transport.certify.Cells.within`)."""
        if rows is None:
            self.queries += 1
            return self.cells.within(self.y_cells, psi, gap, False)
        self.partial_queries += 1
        j, i, C = self.cells.within(self.y[rows], psi, gap[rows], False)
        return rows[j], i, C

    def _csr(self, j: np.ndarray, i: np.ndarray, C: np.ndarray) -> tuple[np.ndarray, ...]:
        order = np.argsort(j, kind="stable")
        j = j[order]
        return np.searchsorted(j, np.arange(self.M + 1)), j, i[order], C[order]

    def support(self, psi: np.ndarray, gap: np.ndarray) -> tuple[np.ndarray, ...]:
        """For every ``j``, every atom whose reduced cost ``|y_j - x_i|^2 - psi_i`` is within ``gap_j``
        of the best: ``indptr`` (M + 1) and each entry's ``j``, ``i``, ``C = |y_j - x_i|^2``."""
        return self._csr(*self._queried(psi, gap))

    def walk(self, psi: np.ndarray, gap: np.ndarray) -> tuple[np.ndarray, ...]:
        """:meth:`support` by a walk on the neighbour graph
        (:func:`~wflow.transport.sparse_kernels.walk_support`); a fine atom whose every neighbour
        is within the gap, or ``forced``, is queried exactly (:meth:`_queried`)."""
        from .sparse_kernels import walk_fill, walk_support

        count, mask = np.empty(self.M, np.intp), np.empty(self.M, np.int64)
        top = np.where(self.nbr >= 0, psi[self.nbr], -np.inf).max(axis=1)
        graph = (self.nbr, self.dist, top)
        walk_support(self.y, self.x, psi, *graph, self.best, gap, count, mask)
        full = np.nonzero((count >= self.degree[self.best]) | self.forced)[0]
        count[full] = 0
        indptr = np.zeros(self.M + 1, np.intp)
        np.cumsum(count, out=indptr[1:])
        n = int(indptr[-1])
        j, i, C = np.empty(n, np.intp), np.empty(n, np.intp), np.empty(n)
        walk_fill(self.y, self.x, psi, *graph, self.best, gap, mask, indptr, j, i, C)
        if not full.size:
            return indptr, j, i, C
        jq, iq, Cq = self._queried(psi, gap, full)
        return self._csr(np.concatenate([j, jq]), np.concatenate([i, iq]), np.concatenate([C, Cq]))

    def check(self, psi: np.ndarray, gap: np.ndarray, sup: tuple[np.ndarray, ...]) -> int:
        """Compare the walk's support ``sup`` at ``psi`` with the exact one; the fine atoms where
        they differ are queried from now on (``forced``).  Returns how many differ."""
        _, j, i, _ = self.support(psi, gap)
        diff = np.setxor1d(j * self.N + i, sup[1] * self.N + sup[2], assume_unique=True)
        rows = np.unique(diff // self.N)
        self.forced[rows] = True
        return rows.size

    def evaluate(self, psi: np.ndarray, eps: np.ndarray, sup: tuple[np.ndarray, ...]):
        """``F_eps(psi)``, the softmax weights ``P`` (one per support entry) and the mu_N-marginal ``m``."""
        indptr, j, i, C = sup
        Z = psi[i]
        Z -= C
        Z /= eps[j]
        Z += self.log_a[i]  # the weights a_i of the sum, outside the exponent's 1/eps
        zmax = np.maximum.reduceat(Z, indptr[:-1])
        Z -= zmax[j]
        np.exp(Z, out=Z)
        s = np.add.reduceat(Z, indptr[:-1])
        Z /= s[j]
        F = float(self.a @ psi - (self.w * eps) @ (zmax + np.log(s)))
        m = np.bincount(i, weights=Z * self.w[j], minlength=self.N)
        return F, Z, m

    def hessian(self, P: np.ndarray, sup: tuple[np.ndarray, ...], eps: np.ndarray):
        """``-D^2 F_eps = sum_j (w_j / eps_j) (diag P_j - P_j P_j^T)`` (rows sum to zero), from the
        split rows (:func:`~wflow.transport.sparse_kernels.split_pairs`)."""
        from scipy import sparse

        from .sparse_kernels import split_pairs

        indptr, _, i, _ = sup
        r, c, v = split_pairs(indptr, i, P, self.w / eps, 1e-15, 1.0 - 1e-13)
        G = sparse.csr_matrix((v, (r, c)), shape=(self.N, self.N))
        diag = np.asarray(G.sum(axis=1)).ravel()
        return sparse.diags(diag) - G, diag


def semidiscrete_w2(
    x: np.ndarray,
    a: np.ndarray,
    y: np.ndarray,
    w: np.ndarray,
    *,
    tol: float = 1e-8,
    eps_start: float = 0.05,
    eps_final: float = 0.02,
    factor: float = 6.0,
    local: float = 0.3,
    margin: float = 6.0,
    max_steps: int = 300,
    max_failed: int = 5,
    workers: int = 2,
    walk: bool = True,
    psi0: np.ndarray | None = None,
) -> dict:
    r"""Bracket :math:`\mathrm{lo} \le W_2^2(\mu_N, \nu) \le \mathrm{hi}` for the squared chordal cost.

    Parameters
    ----------
    x : ndarray, shape (N, d)
        Atoms of :math:`\mu_N` (unit vectors).
    a : ndarray, shape (N,)
        Their weights (positive, sum 1).
    y : ndarray, shape (M, d)
        Atoms of the fine measure :math:`\nu`, :math:`M \gg N` (16 or more per atom of
        :math:`\mu_N` for a tight bracket).
    w : ndarray, shape (M,)
        Their weights (non-negative, sum 1).
    tol : float
        Target :math:`\|m - a\|_1` of the plan's marginal at the final :math:`\varepsilon`.
    eps_start, eps_final : float
        :math:`\varepsilon_j` runs from ``eps_start * 4 pi / N * lam_j`` down to
        ``eps_final * sqrt(4 pi / N * lam_j) * sqrt(4 pi / M * kappa_j)`` by factors ``factor``.
    local : float
        Floor of the local scale factors ``lam_j`` and ``kappa_j`` (in ``(0, 1]``; 1: one global
        :math:`\varepsilon`).
    margin : float
        A support is kept while :math:`\max_i|\psi_i - \psi_i^{q}| \le` ``margin / 2`` times the
        smallest :math:`\varepsilon_j` (:math:`\psi^q`: where it was queried), and it holds every
        atom within ``(log(10 / stage tol) + margin) * eps_j`` of the best.
    max_steps : int
        Newton steps in all (every stage).
    max_failed : int
        Failed line searches (a step damped below 1/16, or no acceptable step at all) after
        which the solve stops and returns the bracket of the current plan (``stalled``).
    workers : int
        Threads of the exact searches and of the nearest-neighbour queries.
    walk : bool
        Take the supports from a walk on the atoms' neighbour graph, checked against exact
        searches (docs/transport.md); ``False``: every support from an exact search (the same
        bracket).
    psi0 : ndarray, shape (N,), optional
        A warm start: the potential ``psi`` of a nearby problem (the same atoms a little
        earlier in a study).  The stages of ``eps`` run as from zero; the bracket is certified
        whatever ``psi0`` is.

    Returns
    -------
    dict
        ``lo``, ``hi`` (bounds on :math:`W_2^2`, chordal), ``chord_max`` (longest chord the
        plan uses), ``eps`` (median final :math:`\varepsilon_j`), ``marginal_error``
        (:math:`\|m-a\|_1`), ``newton_steps``, ``queries`` (exact searches of every fine
        atom), ``partial_queries`` (of the fine atoms the walk does not take), ``support`` (mean
        entries per fine atom of the final plan), ``converged`` (the final marginal error is
        within ``100 * tol``; if not, the bracket is still valid, only wider),
        ``failed_line_searches``, ``stalled`` (stopped after ``max_failed`` of them), ``seconds``,
        ``psi`` (the potential).

    Examples
    --------
    20 Fibonacci points against a fine quasi-uniform measure (2000 points) on :math:`S^2`:

    >>> import numpy as np
    >>> from wflow import sphere
    >>> r = semidiscrete_w2(sphere.fibonacci_nodes(20), np.full(20, 0.05), sphere.fibonacci_nodes(2000),
    ...                     np.full(2000, 5e-4))
    >>> r["converged"], bool(r["lo"] <= r["hi"] < r["lo"] + 1e-3), round(r["lo"], 3)
    (True, True, 0.106)
    """
    t0 = time.perf_counter()
    x, a, y, w, psi_start = _checked(x, a, y, w, psi0)
    s = _Solver(x, a, y, w, workers)
    N, M = s.N, s.M
    ell2, h2 = 4.0 * math.pi / N, 4.0 * math.pi / M
    lam, kap = _local_scales(x, y, N, M, ell2, h2, local, workers)
    eps_end = eps_final * np.sqrt(ell2 * lam * h2 * kap)
    e_rel = max(eps_start, eps_final * math.sqrt(h2 / ell2))
    final = e_rel <= eps_final * math.sqrt(h2 / ell2)
    st = _Newton(psi=psi_start, radius=ell2, ell2=ell2, max_steps=max_steps, max_failed=max_failed)

    walking = walk

    def at(p: np.ndarray, cur: tuple):
        """F, P, m at ``p``: on the walk's support, or (exact) on the current queried support while
        it is valid there, else on a fresh one."""
        if walking:
            sup = s.walk(p, gap)
            return s.evaluate(p, eps, sup), (sup, None)
        sup, p_q = cur
        if (
            sup is None
            or p_q is None
            or float(np.abs(p - p_q).max()) > 0.5 * margin * float(eps.min())
        ):
            sup, p_q = s.support(p, gap), p.copy()
        return s.evaluate(p, eps, sup), (sup, p_q)

    while True:
        eps = eps_end if final else np.maximum(e_rel * ell2 * lam, eps_end)
        stage_tol = tol if final else STAGE_TOL
        st.radius = min(st.radius, ell2)  # a new eps: the cells' boundaries move on its scale
        gap = eps * (math.log(10.0 / stage_tol) + margin + s.log_a_range)
        (st.F, st.P, st.m), st.cur = at(st.psi, (None, None))
        if walking and final and s.check(st.psi, gap, st.cur[0]):  # queried during its steps
            (st.F, st.P, st.m), st.cur = at(st.psi, st.cur)
        _stage(st, s, at, a, eps, stage_tol, final, walking, gap, e_rel)
        if final or st.stalled:
            break
        e_rel /= factor
        final = e_rel <= eps_final * math.sqrt(h2 / ell2)
    _, j, i, C = st.cur[0]
    P, m, psi = st.P, st.m, st.psi
    marginal_error = float(np.abs(m - a).sum())
    hi = float(np.sum(w[j] * P * C)) + 2.0 * marginal_error
    used = P > 1e-12
    chord_max = float(np.sqrt(C[used].max())) if used.any() else 0.0
    lo = s.lower(psi)
    return {
        "lo": lo,
        "hi": max(hi, lo),
        "chord_max": chord_max,
        "eps": float(np.median(eps)),
        "marginal_error": marginal_error,
        "newton_steps": st.steps,
        "queries": s.queries,
        "partial_queries": s.partial_queries,
        "support": j.size / M,
        "converged": bool(marginal_error <= max(100 * tol, 1e-6)),
        "failed_line_searches": st.failed,
        "stalled": st.stalled,
        "seconds": time.perf_counter() - t0,
        "psi": psi,
    }


@dataclass
class _Newton:
    """The damped Newton iterations of :func:`semidiscrete_w2` across its stages: the potential,
    the plan there (``F``, ``P``, ``m`` and its support ``cur``), the trust radius and the counts."""

    psi: np.ndarray
    radius: float
    ell2: float
    max_steps: int
    max_failed: int
    F: float = 0.0
    P: Any = None
    m: Any = None
    cur: tuple = (None, None)
    steps: int = 0
    failed: int = 0
    stalled: bool = False


def _stage(
    st: _Newton,
    s: _Solver,
    at: Callable[[np.ndarray, tuple], tuple],
    a: np.ndarray,
    eps: np.ndarray,
    stage_tol: float,
    final: bool,
    walking: bool,
    gap: np.ndarray,
    e_rel: float,
) -> None:
    """Newton steps at one stage's ``eps`` until the marginal error is below ``stage_tol`` (or the
    steps run out, or the line search stops); the walk's supports are checked against the exact
    ones at the end of the last stage and after a failed line search."""
    N = s.N

    def missed() -> bool:
        """Whether the walk's support at psi misses part of the exact one (then re-evaluated)."""
        n = s.check(st.psi, gap, st.cur[0])
        if n:
            log.debug("N=%d: the walk missed %d fine atoms at step %d", N, n, st.steps)
            (st.F, st.P, st.m), st.cur = at(st.psi, st.cur)
        return bool(n)

    while True:
        g = a - st.m
        L, diag = s.hessian(st.P, st.cur[0], eps)
        done = np.abs(g).sum() < stage_tol or st.steps >= st.max_steps
        # at the end, or without a split row, or after a failed line search: check the walk
        if walking and ((done and final) or diag.max() == 0.0) and missed():
            continue
        if done:
            return
        if diag.max() == 0.0:  # no fine atom split between two atoms: no Newton direction
            st.failed, st.stalled = st.max_failed, True
            return
        delta = _newton_direction(L, diag, g, a, st.radius, s.x)
        t, gave_up, (Fn, Pn, mn), cur_n = _line_search(
            lambda p: at(p, st.cur), st.psi, delta, st.F, g, st.m, a, N, st.steps
        )
        st.failed += gave_up
        if walking and t < 1.0 / 16.0 and missed():
            continue
        if 0.0 < t < 1.0 / 16.0:
            st.failed += 1
        if st.failed >= st.max_failed:  # stalled: more steps would cost much and gain little
            st.stalled = True
        if t > 0.0:
            st.psi = st.psi + t * delta
            st.F, st.P, st.m, st.cur = Fn, Pn, mn, cur_n
            st.radius = (
                2.0 * st.radius if t == 1.0 else max(t * float(np.abs(delta).max()), 1e-3 * st.ell2)
            )
            st.steps += 1
            err = np.abs(a - st.m).sum()
            log.debug("N=%d eps=%.3g step %d t=%g |m-a|_1=%.3g", N, e_rel, st.steps, t, err)
        if t == 0.0 or st.stalled:
            return


def _local_scales(
    x: np.ndarray, y: np.ndarray, N: int, M: int, ell2: float, h2: float, local: float, workers: int
) -> tuple[np.ndarray, np.ndarray]:
    """Local squared scales ``(lam, kappa)`` around each fine atom, shape ``(M,)`` each, relative to
    the quasi-uniform values and floored at ``local`` (Fibonacci sets: 0.8 ell^2 to the 3rd nearest
    atom, 1.19 h^2 to the 3rd nearest other fine atom)."""
    from scipy.spatial import cKDTree

    lam = np.clip(
        cKDTree(x).query(y, k=min(3, N), workers=workers)[0][:, -1] ** 2 / (0.8 * ell2), local, 1.0
    )
    kap = np.clip(
        cKDTree(y).query(y, k=min(4, M), workers=workers)[0][:, -1] ** 2 / (1.19 * h2), local, 1.0
    )
    return lam, kap


def _newton_direction(
    L: Any, diag: np.ndarray, g: np.ndarray, a: np.ndarray, radius: float, x: np.ndarray
) -> np.ndarray:
    """The damped Newton step ``L delta = g``, shape ``(N,)``, by preconditioned CG
    (:func:`_multigrid`, or Jacobi up to ``JACOBI_MAX`` atoms), with a Levenberg--Marquardt
    floor and a trust region ``max|delta| <= radius``."""
    from scipy import sparse

    # Levenberg-Marquardt floor: a cell with (almost) no mass has an (almost) empty row; the
    # floor vanishes near the solution, where Newton's quadratic rate returns
    mu_lm = min(1e-5, 1e-2 * float(np.abs(g).sum()))
    L = (L + sparse.diags(mu_lm * (diag.mean() / a.mean()) * a + 1e-12 * diag.max())).tocsr()
    if L.shape[0] > JACOBI_MAX:
        delta = _pcg(L, g, _multigrid(L, x), rtol=CG_RTOL, maxiter=200)
    else:  # few atoms: Jacobi's 100-300 iterations cost less than a factorization
        dinv = 1.0 / np.maximum(L.diagonal(), 1e-300)
        delta = _pcg(L, g, lambda r: dinv * r, rtol=1e-3, maxiter=1000)
    big = float(np.abs(delta).max())
    if big > radius:  # trust region on max|delta|: a (nearly) empty cell asks for a huge step
        delta *= radius / big
    return delta


#: smoothed aggregation: atoms per aggregate, and the size solved directly (sparse LU)
COARSENING, COARSEST = 8, 300
#: Newton systems of this many atoms or fewer: Jacobi-preconditioned CG (cheaper than the
#: multigrid's set-up at that size)
JACOBI_MAX = 20_000
CG_RTOL = 1e-3


def _multigrid(A: Any, x: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """One symmetric V-cycle of smoothed-aggregation multigrid for the graph Laplacian ``A``
    (Vaněk, Mandel & Brezina 1996): aggregates are the atoms nearest to every ``COARSENING``-th
    atom of ``x`` (shape (N, d)), the tentative prolongation is smoothed by one damped Jacobi
    step, two damped Jacobi sweeps before and after the coarse correction, and the coarsest
    level (``COARSEST`` unknowns or fewer) is solved by sparse LU: CG then takes 10--20
    iterations whatever N."""
    from scipy import sparse
    from scipy.sparse.linalg import splu
    from scipy.spatial import cKDTree

    levels = []
    pts = x
    while A.shape[0] > COARSEST:
        n = A.shape[0]
        dinv = 1.0 / np.maximum(A.diagonal(), 1e-300)
        seeds = pts[::COARSENING]
        agg = cKDTree(seeds).query(pts, k=1)[1]
        T = sparse.csr_matrix((np.ones(n), (np.arange(n), agg)), shape=(n, seeds.shape[0]))
        P = (T - sparse.diags((2.0 / 3.0) * dinv) @ (A @ T)).tocsr()
        R = P.T.tocsr()
        levels.append((A, dinv, P, R))
        A = (R @ A @ P).tocsr()
        pts = seeds
    coarse = splu(A.tocsc()).solve
    omega = 0.6

    def cycle(b: np.ndarray, k: int = 0) -> np.ndarray:
        if k == len(levels):
            return coarse(b)
        A, dinv, P, R = levels[k]
        u = omega * dinv * b
        u += omega * dinv * (b - A @ u)
        u += P @ cycle(R @ (b - A @ u), k + 1)
        u += omega * dinv * (b - A @ u)
        u += omega * dinv * (b - A @ u)
        return u

    return cycle


def _dot(u: np.ndarray, v: np.ndarray) -> float:
    """``u . v`` without BLAS: a threaded BLAS dot on a loaded machine spins for milliseconds."""
    return float(np.add.reduce(u * v))


def _pcg(
    A: Any, b: np.ndarray, prec: Callable[[np.ndarray], np.ndarray], rtol: float, maxiter: int
) -> np.ndarray:
    """Preconditioned conjugate gradients for ``A u = b`` to ``|r| <= rtol |b|``."""
    u = np.zeros_like(b)
    r = b.copy()
    z = prec(r)
    p = z.copy()
    rz = _dot(r, z)
    stop = rtol * math.sqrt(_dot(b, b))
    for _ in range(maxiter):
        Ap = A @ p
        pAp = _dot(p, Ap)
        if pAp <= 0.0:
            break
        alpha = rz / pAp
        u += alpha * p
        r -= alpha * Ap
        if math.sqrt(_dot(r, r)) <= stop:
            break
        z = prec(r)
        rz, rz_old = _dot(r, z), rz
        p = z + (rz / rz_old) * p
    return u


def _line_search(
    at: Callable[[np.ndarray], tuple],
    psi: np.ndarray,
    delta: np.ndarray,
    F: float,
    g: np.ndarray,
    m: np.ndarray,
    a: np.ndarray,
    N: int,
    steps: int,
) -> tuple[float, bool, tuple, tuple]:
    """Armijo on F_eps from ``psi`` along ``delta``, and no cell may lose most of its mass (KMT's
    damping), backtracking by the secant of the slope (halving when the slope is still positive):
    ``(t, gave_up, (F, P, m), support)`` at the last point tried.

    ``t = 0`` when the search stops (the slope at round-off level, or no progress); ``gave_up``
    when it stopped with the step below 1e-4."""
    gd = float(g @ delta)
    t = 1.0
    while True:
        (Fn, Pn, mn), cur_n = at(psi + t * delta)
        if Fn >= F + 0.01 * t * gd and mn.min() > 0.2 * min(m.min(), a.min()):
            return t, False, (Fn, Pn, mn), cur_n
        # F_eps is concave along the line: where its slope at t is negative (an overshoot), its
        # maximum is near the secant root of the slope between 0 and t (within [t/10, t/2])
        slope = float((a - mn) @ delta)
        t *= min(0.5, max(0.1, gd / (gd - slope))) if slope < 0.0 else 0.5
        if gd < 1e-13 * abs(F) or t < 1e-4:  # round-off level, or no progress: stop this stage
            log.debug(
                "N=%d: line search stops at step %d: t=%g, g.delta=%.3g, F=%.6g", N, steps, t, gd, F
            )
            return 0.0, t < 1e-4, (Fn, Pn, mn), cur_n
