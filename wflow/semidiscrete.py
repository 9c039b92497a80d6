r"""Semi-discrete :math:`W_2` on :math:`S^{d-1}`: N atoms against a fine quadrature of a continuum.

For atoms :math:`\mu_N = \sum_i a_i\delta_{x_i}` and a much finer measure
:math:`\nu = \sum_j w_j\delta_{y_j}` (:math:`M \gg N` atoms, e.g. the push-forward of a
quadrature of a smooth density) with the squared chordal cost
:math:`c(x, y) = |x - y|^2 = 2 - 2\langle x, y\rangle`, the Kantorovich dual is a concave
function of one potential :math:`\psi \in \mathbb R^N`,

.. math::
    F_0(\psi) = \sum_i a_i\psi_i + \sum_j w_j \min_i\big(|y_j - x_i|^2 - \psi_i\big)
    \le W_2^2(\mu_N, \nu) \quad\text{for every } \psi,

and :math:`\max_\psi F_0 = W_2^2`.  The inner minimum is a nearest-neighbour query in
:math:`\mathbb R^{d+1}` after lifting :math:`x_i \mapsto (x_i, \sqrt{H - \psi_i})`,
:math:`y_j \mapsto (y_j, 0)`, :math:`H \ge \max\psi` (``scipy.spatial.cKDTree``), so
:math:`F_0(\psi)` is evaluated exactly.

:math:`\psi` is found by damped Newton steps (Kitagawa, Mérigot & Thibert, JEMS 2019) on
the entropic semi-dual

.. math::
    F_\varepsilon(\psi) = \sum_i a_i\psi_i - \varepsilon\sum_j w_j
    \log\sum_{i \in K_j} a_i\, e^{(\psi_i - |y_j - x_i|^2)/\varepsilon},

with :math:`K_j` the ``k`` best atoms of :math:`y_j` for the current :math:`\psi` (the same
lifted query), :math:`\varepsilon` decreased geometrically from :math:`\ell^2/20`
(:math:`\ell^2 = 4\pi/N`, the area per atom) down to :math:`0.02\,\ell h`
(:math:`h = \sqrt{4\pi/M}`): small enough that the entropic plan barely blurs the
Laguerre-cell boundaries, large enough that each cell's mass is a smooth function of
:math:`\psi` despite the quadrature being discrete.  The Hessian is the sparse weighted
graph Laplacian :math:`\varepsilon^{-1}(\operatorname{diag} m - \sum_j w_j P_j P_j^\top)`
plus a Levenberg--Marquardt floor :math:`\min(10^{-3}, \|a - m\|_1)\,\bar L\,a_i/\bar a`
(an empty cell has an empty row), solved by Jacobi-preconditioned conjugate gradients;
steps are capped by an adaptive trust radius on :math:`\max_i|\delta\psi_i|`, then
backtracked (Armijo, and no cell may lose 80 % of its smallest mass).

Certified bracket.  At the end, :math:`\mathrm{lo} = F_0(\psi)` is a lower bound, and the
entropic plan :math:`\pi_{ij} = w_j P_{ji}` (exact :math:`\nu`-marginal, :math:`\mu_N`-marginal
:math:`m` with :math:`\|m - a\|_1` below ``tol``) gives the upper bound
:math:`\mathrm{hi} = \sum_{ij}\pi_{ij}|x_i - y_j|^2 + 2\|m - a\|_1` (re-routing the mass
mismatch costs at most :math:`\mathrm{diam}^2 = 4` per unit, half of it moves).  So
:math:`\mathrm{lo} \le W_2^2(\mu_N,\nu) \le \mathrm{hi}`, whatever the solver did.
Measured: relative gap :math:`(\mathrm{hi}-\mathrm{lo})/\mathrm{lo} \approx 1\text{--}3\cdot10^{-4}`
with 16--32 quadrature atoms per cell.

Scope.  Designed for atoms of (nearly) equal weight against a quasi-uniform fine
quadrature with a smooth density (Fibonacci nodes pushed forward by a smooth flow), as
in the mean-field study.  With very uneven atom weights or an i.i.d. fine sample the
Newton iteration can stop early (a ``UserWarning`` from :func:`wflow.transport.wasserstein`);
the bracket is then still valid, only wide.

Geodesic cost.  With :math:`\theta = 2\arcsin(c/2)` and :math:`c_\max` the longest chord
used by the plan, :math:`W_2^{\mathrm{chord}} \le W_2^{\mathrm{geo}} \le
\frac{2\arcsin(c_\max/2)}{c_\max}\sqrt{\mathrm{hi}}`: at the :math:`N^{-1/2}` scales of
the mean-field study the factor is :math:`1 + c_\max^2/24 \approx 1 + 10^{-4}`.

Cost: one k-nearest-neighbour query of the M fine atoms per Newton trial, about 25--40
Newton steps in all; about 1 µs per fine atom per query on the 2-core reference machine
(N = 10^4, M = 1.6·10^5: 30--40 s).
"""
from __future__ import annotations

import logging
import math
import time

import numpy as np

__all__ = ["semidiscrete_w2"]

log = logging.getLogger(__name__)


class _Solver:
    """State of one semi-discrete solve (kept small: arrays of the current candidates and plan)."""

    def __init__(self, x: np.ndarray, a: np.ndarray, y: np.ndarray, w: np.ndarray, k: int, workers: int):
        self.x, self.a, self.y, self.w = x, a, y, w
        self.N, self.M = x.shape[0], y.shape[0]
        self.k = min(k, self.N)
        self.workers = workers
        self.y_lift = np.hstack([y, np.zeros((self.M, 1))])
        self.log_a = np.log(a)
        self.queries = 0

    def candidates(self, psi: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` atoms minimizing ``|y_j - x_i|^2 - psi_i`` for every ``j``, and ``|y_j - x_i|^2``."""
        from scipy.spatial import cKDTree

        self.queries += 1
        H = float(psi.max()) + 1e-9
        tree = cKDTree(np.hstack([self.x, np.sqrt(H - psi)[:, None]]))
        dist, idx = tree.query(self.y_lift, k=k, workers=self.workers)
        if k == 1:
            dist, idx = dist[:, None], idx[:, None]
        # lifted squared distance = |y - x_i|^2 + H - psi_i
        return idx, np.maximum(dist**2 - H + psi[idx], 0.0)

    def evaluate(self, psi: np.ndarray, eps: float, cand: np.ndarray, C: np.ndarray):
        """``F_eps(psi)``, the softmax weights ``P`` (M, k) and the mu_N-marginal ``m`` of the plan."""
        Z = (psi + self.log_a)[cand]
        Z -= C
        Z /= eps
        zmax = Z.max(axis=1)
        Z -= zmax[:, None]
        np.exp(Z, out=Z)
        s = Z.sum(axis=1)
        Z /= s[:, None]
        F = float(self.a @ psi - eps * (self.w @ (zmax + np.log(s))))
        m = np.bincount(cand.ravel(), weights=(Z * self.w[:, None]).ravel(), minlength=self.N)
        return F, Z, m

    def laplacian(self, P: np.ndarray, cand: np.ndarray):
        """``diag(m) - sum_j w_j P_j P_j^T`` (rows sum to zero), from the rows that are split."""
        from scipy import sparse

        rows = np.nonzero(P.max(axis=1) < 1.0 - 1e-13)[0]
        Pb, cb, wb = P[rows], cand[rows], self.w[rows]
        r, c, v = [], [], []
        for p in range(P.shape[1]):
            for q in range(p + 1, P.shape[1]):
                val = wb * Pb[:, p] * Pb[:, q]
                sel = val > 1e-15 * wb
                r.append(cb[sel, p])
                c.append(cb[sel, q])
                v.append(val[sel])
        r, c, v = np.concatenate(r), np.concatenate(c), np.concatenate(v)
        off = sparse.coo_matrix((np.concatenate([v, v]), (np.concatenate([r, c]), np.concatenate([c, r]))),
                                shape=(self.N, self.N)).tocsr()
        diag = np.asarray(off.sum(axis=1)).ravel()
        return sparse.diags(diag) - off, diag


def semidiscrete_w2(
    x: np.ndarray,
    a: np.ndarray,
    y: np.ndarray,
    w: np.ndarray,
    *,
    k: int = 5,
    tol: float = 1e-8,
    eps_start: float = 0.05,
    eps_final: float = 0.02,
    factor: float = 6.0,
    max_steps: int = 300,
    max_failed: int = 5,
    workers: int = 2,
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
    k : int
        Candidate atoms per fine atom in the entropic plan.
    tol : float
        Target :math:`\|m - a\|_1` of the plan's marginal at the final :math:`\varepsilon`.
    eps_start, eps_final : float
        :math:`\varepsilon` runs from ``eps_start * 4 pi / N`` down to
        ``eps_final * sqrt(4 pi / N) * sqrt(4 pi / M)`` by factors ``factor``.
    max_steps : int
        Newton steps in all (every stage).
    max_failed : int
        Failed line searches (a step damped below 1/16, or no acceptable step at all) after
        which the solve stops and returns the bracket of the current plan (``stalled``).
        Within the design this does not happen (at most one such step has been seen); outside
        it (uneven weights, i.i.d. fine atoms) Newton can otherwise crawl for hundreds of
        heavily damped steps, each costing up to 14 nearest-neighbour queries.
    workers : int
        Threads of the nearest-neighbour queries.

    Returns
    -------
    dict
        ``lo``, ``hi`` (bounds on :math:`W_2^2`, chordal), ``chord_max`` (longest chord the
        plan uses), ``eps``, ``marginal_error`` (:math:`\|m-a\|_1`), ``newton_steps``,
        ``queries``, ``converged`` (the final marginal error is within ``100 * tol``; if not,
        the bracket is still valid, only wider), ``failed_line_searches``, ``stalled`` (stopped
        after ``max_failed`` of them), ``seconds``.
    """
    from scipy import sparse
    from scipy.sparse.linalg import LinearOperator, cg

    t0 = time.perf_counter()
    s = _Solver(x, a, y, w, k, workers)
    N, M = s.N, s.M
    ell2 = 4.0 * math.pi / N
    eps_end = eps_final * math.sqrt(ell2) * math.sqrt(4.0 * math.pi / M)
    eps = max(eps_start * ell2, eps_end)
    psi = np.zeros(N)
    radius = ell2
    steps, final = 0, eps <= eps_end
    failed, stalled = 0, False
    while True:
        cand, C = s.candidates(psi, s.k)
        F, P, m = s.evaluate(psi, eps, cand, C)
        stage_tol = tol if final else 1e-4
        while True:
            g = a - m
            if np.abs(g).sum() < stage_tol:
                break
            if steps >= max_steps:
                break
            L, diag = s.laplacian(P, cand)
            # Levenberg-Marquardt floor: a cell with (almost) no mass has an (almost) empty row
            mu_lm = min(1e-3, float(np.abs(g).sum()))  # vanishes near the solution: Newton's quadratic rate returns
            L = L + sparse.diags(mu_lm * (diag.mean() / a.mean()) * a + 1e-12 * diag.max())
            dinv = 1.0 / np.maximum(L.diagonal(), 1e-300)
            delta, _ = cg(L, eps * g, rtol=1e-3, maxiter=1000, M=LinearOperator((N, N), matvec=lambda u: dinv * u))
            big = float(np.abs(delta).max())
            if big > radius:  # trust region on max|delta|: a (nearly) empty cell asks for a huge step
                delta *= radius / big
            gd = float(g @ delta)
            t = 1.0
            while True:  # Armijo on F_eps, and no cell may lose most of its mass (KMT's damping)
                cn, Cn = s.candidates(psi + t * delta, s.k)
                Fn, Pn, mn = s.evaluate(psi + t * delta, eps, cn, Cn)
                if Fn >= F + 0.01 * t * gd and mn.min() > 0.2 * min(m.min(), a.min()):
                    break
                t *= 0.5
                if gd < 1e-13 * abs(F) or t < 1e-4:  # round-off level, or no progress: stop this stage
                    failed += t < 1e-4
                    t = 0.0
                    break
            if 0.0 < t < 1.0 / 16.0:
                failed += 1
            if failed >= max_failed:  # stalled: more steps would cost much and gain little
                stalled = True
            if t == 0.0 or stalled:
                if t > 0.0:
                    psi = psi + t * delta
                    F, P, m, cand, C = Fn, Pn, mn, cn, Cn
                    steps += 1
                break
            psi = psi + t * delta
            F, P, m, cand, C = Fn, Pn, mn, cn, Cn
            radius = 2.0 * radius if t == 1.0 else max(t * float(np.abs(delta).max()), 1e-3 * ell2)
            steps += 1
            log.debug("eps=%.3g step %d t=%g |m-a|_1=%.3g", eps, steps, t, np.abs(a - m).sum())
        if final or stalled:
            break
        eps = eps / factor
        if eps <= eps_end:
            eps, final = eps_end, True
    marginal_error = float(np.abs(m - a).sum())
    hi = float(np.sum(w[:, None] * P * C)) + 2.0 * marginal_error
    used = P > 1e-12
    chord_max = float(np.sqrt(C[used].max())) if used.any() else 0.0
    idx1, C1 = s.candidates(psi, 1)
    lo = float(a @ psi + w @ (C1[:, 0] - psi[idx1[:, 0]]))
    return {"lo": lo, "hi": max(hi, lo), "chord_max": chord_max, "eps": eps, "marginal_error": marginal_error,
            "newton_steps": steps, "queries": s.queries, "converged": bool(marginal_error <= max(100 * tol, 1e-6)),
            "failed_line_searches": failed, "stalled": stalled, "seconds": time.perf_counter() - t0}
