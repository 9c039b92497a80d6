r"""The inner optimal-transport solver of a JKO step: stabilized semi-relaxed Sinkhorn and Newton--CG
(``docs/jko.md``, "Algorithm")."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np
from scipy import sparse

from .sparse import SparseCost

__all__ = ["SemiRelaxed", "blur_variance", "THETA", "TINY"]

logger = logging.getLogger(__name__)

THETA = 50.0  # kernel truncation: entries below e^{-50} of their row's maximum are dropped
_ABSORB = 10.0  # rebuild the kernel when |log v| exceeds this
TINY = 1e-300
OMEGA = 1.8  # over-relaxation of the scaling iterations (reset to 1 when the change grows)


class SemiRelaxed:
    r"""Stabilized scaling iterations for :math:`\min_\pi\langle C,\pi\rangle + \varepsilon\mathrm{KL}(\pi|a\otimes r) + \lambda\mathrm{KL}(\nu|r) + \langle V,\nu\rangle`, :math:`\pi\mathbb 1 = a`.

    Plan :math:`\pi_{ij} = a_i u_i K_{ij} v_j`, :math:`K_{ij} = r_j e^{(\bar f_i + \bar g_j - C_{ij})/\varepsilon}`
    truncated; potentials :math:`f = \bar f + \varepsilon\log u`, :math:`g = \bar g + \varepsilon\log v`.

    Examples
    --------
    >>> import numpy as np
    >>> from wflow import CircleMesh
    >>> th = CircleMesh(32).center_angles
    >>> st = SemiRelaxed(np.angle(np.exp(1j * (th[:, None] - th[None, :]))) ** 2, np.full(32, 1 / 32))
    >>> st.n, st.builds, np.allclose(st.u, 1)   # scalings start at one; kernels are built on demand
    (32, 0, True)
    """

    def __init__(self, C: np.ndarray | SparseCost, r: np.ndarray):
        self.C = C
        self.sparse = isinstance(C, SparseCost)
        self.logr = np.log(r)
        self.n = C.n if isinstance(C, SparseCost) else C.shape[0]
        self.eps: float | None = None
        self.gbar = np.zeros(self.n)
        self.fbar = np.zeros(self.n)
        self.v = np.ones(self.n)
        self.u = np.ones(self.n)
        # the truncated kernel, its transpose and its squared entries transposed, built by build()
        self.K: np.ndarray | sparse.csr_matrix | None = None
        self.KT: np.ndarray | sparse.csr_matrix | None = None
        self._KT2: np.ndarray | sparse.csr_matrix | None = None
        self.builds = 0
        self.build_time = 0.0
        #: inner-loop breakdowns handled so far: zero curvature in CG, non-finite iterates
        self.breakdowns = {"curvature": 0, "nonfinite": 0}

    @property
    def _eps(self) -> float:
        """The regularization in force (``set_eps`` fixes it before any kernel is built)."""
        if self.eps is None:
            raise RuntimeError("SemiRelaxed: call set_eps before using the kernel")
        return self.eps

    def _kernels(self) -> tuple[np.ndarray | sparse.csr_matrix, np.ndarray | sparse.csr_matrix]:
        """The kernel and its transpose, ``(K, K^T)``, built by :meth:`build`."""
        if self.K is None or self.KT is None:
            raise RuntimeError("SemiRelaxed: call set_eps before using the kernel")
        return self.K, self.KT

    @property
    def g(self) -> np.ndarray:
        return self.gbar + self._eps * np.log(self.v)

    @property
    def f(self) -> np.ndarray:
        return self.fbar + self._eps * np.log(self.u)

    def build(self, g: np.ndarray | None = None) -> None:
        """Absorb the scalings and rebuild the truncated kernel (row maxima normalized to 1)."""
        t0 = time.perf_counter()
        self.gbar = self.g if g is None else np.array(g, dtype=float)
        n, eps = self.n, self._eps
        if isinstance(self.C, SparseCost):
            self.K = self.KT = self._KT2 = None  # free the old kernel before the new one is built
            self.K, self.fbar = self.C.kernel(self.gbar, self.logr, eps)
            self.KT = self.K.T  # a CSC view: no second copy
        else:
            inv = 1.0 / eps
            rows_per = max(1, 2**21 // n)
            data, indices, indptr = [], [], [np.zeros(1, dtype=np.int64)]
            fbar = np.empty(n)
            h = self.gbar * inv + self.logr
            nnz = 0
            for i in range(0, n, rows_per):
                E = h[None, :] - self.C[i : i + rows_per] * inv
                m = E.max(axis=1)
                E -= m[:, None]
                fbar[i : i + rows_per] = -eps * m
                keep = E > -THETA
                cnt = keep.sum(axis=1)
                data.append(np.exp(E[keep]))
                indices.append(np.nonzero(keep)[1])
                indptr.append(nnz + np.cumsum(cnt))
                nnz += int(cnt.sum())
            K = sparse.csr_matrix(
                (np.concatenate(data), np.concatenate(indices), np.concatenate(indptr)),
                shape=(n, n),
            )
            self.K = K.toarray() if nnz > 0.3 * n * n else K
            self.KT = self.K.T if isinstance(self.K, np.ndarray) else K.T.tocsr()
            self.fbar = fbar
        self.u = np.ones(n)
        self.v = np.ones(n)
        self._KT2 = None
        self.builds += 1
        self.build_time += time.perf_counter() - t0

    def save(self) -> tuple:
        """The state for :meth:`restore` (a dense kernel by reference; a truncated one is rebuilt)."""
        K = None if self.sparse else (self.K, self.KT)
        return (self.fbar.copy(), self.gbar.copy(), self.u.copy(), self.v.copy(), self.builds, K)

    def restore(self, state: tuple) -> None:
        fbar, gbar, u, v, builds, K = state
        if K is not None:
            self.K, self.KT = K
            self._KT2 = None
        elif builds != self.builds:
            self.build(gbar)
        self.fbar, self.gbar, self.u, self.v = fbar, gbar, u, v

    def set_eps(self, eps: float) -> None:
        if self.eps is None:
            self.eps = eps
            self.build(self.gbar)
        elif eps != self.eps:
            g = self.g
            self.eps = eps
            self.build(g)

    def row_update(self) -> None:
        K, _ = self._kernels()
        Kv = K @ self.v
        self.u = 1.0 / Kv

    def column_log_sums(self, a: np.ndarray) -> np.ndarray:
        r""":math:`\log\sum_i a_i e^{(f_i - C_{ij})/\varepsilon}` (exact in the log domain where the kernel is empty)."""
        eps = self._eps
        s = self._kernels()[1] @ (a * self.u)
        with np.errstate(divide="ignore"):
            out = np.log(s) - self.logr - self.gbar / eps
        bad = ~(s > TINY)
        if np.any(bad):
            f = self.f
            cols = np.flatnonzero(bad)
            if isinstance(self.C, SparseCost):
                out[cols] = self.C.column_logsumexp(f, np.log(np.maximum(a, TINY)), eps, cols)
                return out
            E = (f[:, None] - self.C[:, cols]) / eps + np.log(np.maximum(a, TINY))[:, None]
            m = E.max(axis=0)
            out[cols] = m + np.log(np.sum(np.exp(E - m[None, :]), axis=0))
        return out

    def nu(self, a: np.ndarray) -> np.ndarray:
        return self.v * (self._kernels()[1] @ (a * self.u))

    def solve(
        self,
        a: np.ndarray,
        V: np.ndarray,
        lam: float,
        tol: float,
        max_iter: int,
        newton: bool = True,
    ) -> tuple[int, float]:
        """Iterate to a fixed point of the generalized Sinkhorn map; ``(iterations, change)``.
        For :math:`\\zeta > 1/2` and ``newton``, :meth:`newton` instead."""
        eps = self._eps
        zeta = lam / (eps + lam)
        if newton and zeta > 0.5:
            return self.newton(a, V, lam, tol, max_iter)
        it, change, prev = 0, np.inf, np.inf
        self.omega = OMEGA
        while it < max_iter:
            it += 1
            self.row_update()
            if zeta == 0.0:
                g_new = -V
            else:
                g_new = -(zeta * eps) * self.column_log_sums(a) - (1 - zeta) * V
            g_old = self.g
            if zeta > 0.5 and it > 1:
                # over-relaxation (Thibault, Chizat, Dossal & Papadakis 2021): g <- g + w (T(g) - g)
                g_new = g_old + self.omega * (g_new - g_old)
            nu = self._set_g(g_new, a)
            # a-posteriori bound change/(1-zeta), capped: the outer loop checks the true residual anyway
            change = float(np.dot(nu, np.abs(g_new - g_old))) / max(1.0 - zeta, 0.02)
            if change > prev:
                self.omega = 1.0
            prev = change
            if zeta == 0.0 or change <= tol:
                break
        return it, change

    def _set_g(self, g: np.ndarray, a: np.ndarray) -> np.ndarray:
        """Move to the potential ``g`` (exact row update; rebuild if the scaling leaves its range); returns nu."""
        logv = (g - self.gbar) / self._eps
        if np.max(np.abs(logv)) > _ABSORB or not np.all(np.isfinite(logv)):
            self.build(g)
        else:
            self.v = np.exp(logv)
        self.row_update()
        return self.nu(a)

    def newton(
        self, a: np.ndarray, V: np.ndarray, lam: float, tol: float, max_iter: int
    ) -> tuple[int, float]:
        r"""Damped Newton--CG on the semi-dual; ``(Hessian products + Newton steps, residual)``.

        :math:`D(g) = \langle a, f(g)\rangle - \lambda\sum_j q_j`, :math:`q_j = r_j e^{-(g_j+V_j)/\lambda}`,
        gradient :math:`q - \nu`, negative Hessian
        :math:`(\mathrm{diag}\,\nu - \pi^\top\mathrm{diag}(a)^{-1}\pi)/\varepsilon + \mathrm{diag}(q)/\lambda`;
        Jacobi-preconditioned CG, Armijo backtracking on :math:`D`.  Stops when
        :math:`\sum_j\nu_j|g_j + V_j + \lambda\log(\nu_j/r_j)| \le` ``tol`` or after ``max_iter`` products.
        """
        eps = self._eps
        logr = self.logr

        def dual(nu: np.ndarray) -> tuple[float, np.ndarray | None]:
            z = -(self.g + V) / lam + logr
            if z.max() > 700.0:
                return -np.inf, None
            q = np.exp(z)
            with np.errstate(over="ignore", invalid="ignore"):
                D = float(np.dot(a, self.f) - lam * q.sum())
            if not np.isfinite(D):  # overflow: as far out as z > 700
                return -np.inf, None
            return D, q

        def residual(nu: np.ndarray, q: np.ndarray) -> float:
            pos = nu > 0
            return float(lam * np.dot(nu[pos], np.abs(np.log(nu[pos] / np.maximum(q[pos], TINY)))))

        g = self.g
        self.row_update()
        nu = self.nu(a)
        D, q = dual(nu)
        if q is None:  # start far out: take one scaling iteration first
            return self.solve(a, V, lam, tol, 1, newton=False)
        products = 0
        res = residual(nu, q)
        while res > tol and products < max_iter:
            grad = q - nu
            u, v = self.u, self.v
            au2 = a * u * u
            K, KT = self._kernels()
            diag = (nu - v * v * (self._squared_kernel_t() @ au2)) / eps + q / lam
            diag = np.maximum(diag, q / lam)
            # floored: rows whose mass and q underflow must not blow the CG iterates up
            diag = np.maximum(diag, 1e-12 * float(np.max(diag, initial=0.0)))

            def hess(x: np.ndarray) -> np.ndarray:
                return (nu * x - v * (KT @ (au2 * (K @ (v * x))))) / eps + q * x / lam

            if not (np.all(np.isfinite(grad)) and np.all(np.isfinite(diag)) and np.all(diag > 0)):
                self.breakdowns["nonfinite"] += 1
                logger.debug("Newton-CG: non-finite gradient or preconditioner; stopped")
                return products, res
            d, used = self._cg(hess, grad, diag, max(1, max_iter - products))
            products += used
            if not (np.any(d) and np.all(np.isfinite(d))):
                logger.debug("Newton-CG: no finite descent direction at residual %.3g", res)
                return products, res
            step = self._line_search(a, g, d, float(np.dot(grad, d)), D, dual)
            if step is None:
                logger.debug("Newton line search failed at residual %.3g", res)
                return products, res
            products += 1
            t, nu, D, q = step
            g = g + t * d
            res = residual(nu, q)
        return products, res

    def _squared_kernel_t(self) -> np.ndarray | sparse.csr_matrix:
        r"""The squared kernel entries, transposed (:math:`(K\circ K)^\top`, the Hessian's diagonal)."""
        if self._KT2 is None:
            K, KT = self._kernels()
            if isinstance(KT, np.ndarray):
                self._KT2 = KT * KT
            elif self.sparse and not isinstance(K, np.ndarray):
                # the squared entries on K's own pattern, read transposed
                self._KT2 = sparse.csr_matrix(
                    (K.data * K.data, K.indices, K.indptr), shape=K.shape, copy=False
                ).T
            else:
                self._KT2 = KT.multiply(KT).tocsr()
        return self._KT2

    def _cg(
        self,
        hess: Callable[[np.ndarray], np.ndarray],
        grad: np.ndarray,
        diag: np.ndarray,
        max_products: int,
    ) -> tuple[np.ndarray, int]:
        """Jacobi-preconditioned CG for ``H d = grad`` to relative tolerance 1e-3: ``(d, products)``.

        On zero curvature or an overflow, keeps the direction found so far and counts the breakdown.
        """
        d = np.zeros_like(grad)
        rcg = grad.copy()
        z = rcg / diag
        p = z.copy()
        rz = float(np.dot(rcg, z))
        stop = 1e-6 * rz
        products = 0
        for _ in range(max_products):
            with np.errstate(over="ignore", invalid="ignore"):
                Hp = hess(p)
                pHp = float(np.dot(p, Hp))
                pp = float(np.dot(p, p))
            products += 1
            if not (np.isfinite(pHp) and np.isfinite(pp) and pHp > 1e-300 * max(1.0, pp)):
                # zero (or negative) curvature along p, or an overflow
                self.breakdowns["curvature" if np.isfinite(pHp) else "nonfinite"] += 1
                if not np.any(d):
                    d = z if np.all(np.isfinite(z)) else np.zeros_like(grad)
                break
            alpha = rz / pHp
            with np.errstate(over="ignore", invalid="ignore"):
                d += alpha * p
                rcg -= alpha * Hp
                z = rcg / diag
                rz_new = float(np.dot(rcg, z))
            if not np.isfinite(rz_new):
                self.breakdowns["nonfinite"] += 1
                d -= alpha * p
                break
            if rz_new <= stop:
                break
            p = z + (rz_new / rz) * p
            rz = rz_new
        return d, products

    def _line_search(
        self,
        a: np.ndarray,
        g: np.ndarray,
        d: np.ndarray,
        slope: float,
        D: float,
        dual: Callable[[np.ndarray], tuple[float, np.ndarray | None]],
    ) -> tuple[float, np.ndarray, float, np.ndarray] | None:
        """Armijo backtracking on the dual from ``g`` along ``d``: ``(t, nu, D, q)``, or None (back at
        ``g``) below ``t = 1e-8``."""
        t = 1.0
        while True:
            nu_t = self._set_g(g + t * d, a)
            D_t, q_t = dual(nu_t)
            if q_t is not None and D_t >= D + 1e-4 * t * slope - 1e-14 * abs(D):
                return t, nu_t, D_t, q_t
            t *= 0.5
            if t < 1e-8:
                self._set_g(g, a)
                return None

    def kept(self, a: np.ndarray) -> float:
        r"""Mass the plan keeps in place, :math:`\sum_i \pi_{ii} = \sum_i a_i u_i K_{ii} v_i` (source and
        target share the support)."""
        K = self._kernels()[0]
        return float(np.dot(a * self.u * self.v, K.diagonal()))

    def transport(self, a: np.ndarray, nu: np.ndarray) -> float:
        r""":math:`T_\varepsilon(a,\nu) = \langle a, f\rangle + \langle\nu, g\rangle` for the current plan (exact marginals)."""
        return float(np.dot(a, self.f) + np.dot(nu, self.g))


def blur_variance(C: np.ndarray, r: np.ndarray, eps: float, dim: int) -> float:
    r"""Per-direction variance of the blur kernel :math:`r_j e^{-C_{ij}/\varepsilon}`, averaged over rows.

    Examples
    --------
    The kernel :math:`e^{-\theta^2/\varepsilon}` on a fine circle is a Gaussian of variance
    :math:`\varepsilon/2`:

    >>> import numpy as np
    >>> from wflow import CircleMesh
    >>> th = CircleMesh(64).center_angles
    >>> C = np.angle(np.exp(1j * (th[:, None] - th[None, :]))) ** 2
    >>> round(blur_variance(C, np.ones(64), 0.01, 1), 4)
    0.005
    """
    n = C.shape[0]
    rows = max(1, 2**21 // n)
    acc = 0.0
    for i in range(0, n, rows):
        Ci = C[i : i + rows]
        W = np.where(Ci < THETA * eps, np.exp(-np.minimum(Ci, THETA * eps) / eps) * r[None, :], 0.0)
        acc += float(np.sum(np.sum(W * Ci, axis=1) / np.sum(W, axis=1)))
    return acc / n / dim
