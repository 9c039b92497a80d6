r"""JKO scheme: implicit Wasserstein gradient-flow steps on a fixed support, solved with optimal transport.

For a gradient model (DESIGN.md §1: USA with :math:`Q = K = I`, :math:`V = \pm I`, conservative
perceptrons, their sums) the mean-field equation with noise,
:math:`\partial_t\mu + \mathrm{div}_S(\mu\nabla_S\delta F/\delta\mu) = \kappa^{-1}\Delta_S\mu`,
is the Wasserstein-2 gradient flow of the free energy :math:`\Phi = -F + \kappa^{-1}\int\mu\log\mu`
(:math:`F` = ``model.energy``, the functional the flow ascends).  The Jordan--Kinderlehrer--Otto
scheme (Jordan, Kinderlehrer & Otto 1998) takes implicit steps

.. math::

    \mu_{k+1} = \arg\min_\nu \frac{W_2^2(\mu_k, \nu)}{2\tau} - F(\nu) + \kappa^{-1}\int\nu\log\nu ,

here over the measures carried by a fixed support :math:`x_1..x_n` (a mesh's cell centres, or
any point cloud) with reference volumes :math:`r_j` (cell areas), :math:`\int\nu\log\nu \approx
\sum_j\nu_j\log(\nu_j/r_j)`, and ground cost :math:`C_{ij} = d(x_i, x_j)^2` (geodesic, or chordal).

Algorithm (``method="sinkhorn"``), one step.  The transport term is entropic,
:math:`T_\varepsilon(a,\nu) = \min_{\pi\in\Pi(a,\nu)}\langle C,\pi\rangle + \varepsilon\,\mathrm{KL}(\pi\,|\,a\otimes r)`
(Peyré 2015, *SIAM J. Imaging Sci.* 8), and the step minimizes over plans whose first marginal
is :math:`a = \mu_k`:

.. math::

    J(\pi) = \frac{T_\varepsilon}{2\tau} - F(\nu) + (\kappa^{-1} - c_\varepsilon)\,\mathrm{KL}(\nu\,|\,r),
    \qquad \nu = \pi^\top\mathbb 1 .

* **Outer loop (energy).**  :math:`-F` and a negative entropy coefficient are linearized at the
  current iterate :math:`\nu^m` (exact majorization for concave parts, e.g. attraction
  :math:`-E_\beta`: the convex--concave procedure); a convex remainder (repulsion :math:`+E_\beta`)
  gets a proximal term :math:`L\,\mathrm{KL}(\nu|\nu^m)` whose weight :math:`L` starts at 0 and
  doubles whenever :math:`J` fails to decrease.  So :math:`J` decreases at every outer iteration.
* **Inner loop (OT).**  The linearized problem (linear potential :math:`V`, entropy weight
  :math:`\lambda`) is solved in the stabilized log domain (potentials absorbed into a kernel
  truncated below :math:`e^{-50}` of each row's maximum, rebuilt when the scalings leave
  :math:`[e^{-10}, e^{10}]`).  The semi-relaxed Sinkhorn scaling iterations of Chizat, Peyré,
  Schmitzer & Vialard (2018, *Math. Comp.* 87),
  :math:`f_i = -\varepsilon\log\sum_j r_j e^{(g_j - C_{ij})/\varepsilon}`,
  :math:`g_j = -\frac{\varepsilon}{\varepsilon+\lambda}\big(\lambda\log\sum_i a_i e^{(f_i-C_{ij})/\varepsilon} + V_j\big)`,
  contract by :math:`\zeta = \lambda/(\lambda+\varepsilon)` per iteration on every smooth mode of
  :math:`g` (not only the translation mode that translation-invariant Sinkhorn removes): fast
  when :math:`\lambda \le \varepsilon` (with :math:`\lambda = 0`, no noise and no proximal term, one
  iteration is exact), hopeless when noise makes :math:`\lambda = 2\tau/\kappa \gg \varepsilon`
  (:math:`\lambda/\varepsilon \approx 1300` on a 2048-cell circle at :math:`\tau = 0.05`,
  :math:`\kappa = 4`).  For :math:`\zeta > 1/2` the step therefore runs damped Newton--CG on the
  semi-dual :math:`D(g) = \langle a, f(g)\rangle - \lambda\sum_j r_j e^{-(g_j+V_j)/\lambda}`
  (:meth:`_SemiRelaxed.newton`), whose Hessian has condition number :math:`\approx\lambda/\varepsilon`:
  :math:`O(\sqrt{\lambda/\varepsilon})` sparse kernel products per Newton step, a few Newton steps.
  Every step starts at the target :math:`\varepsilon` from the previous step's potentials (the
  first from :math:`g = -V - \lambda\log(\mu_k/r)`); :math:`\varepsilon`-scaling (``eps_scaling``,
  off by default) would start the first step at the squared displacement of one step,
  :math:`\tau^2\langle\mu_k, |\nabla_S\delta F/\delta\mu|^2\rangle + 2(d-1)\tau/\kappa`: neither
  solver's rate depends on :math:`\varepsilon` the way balanced Sinkhorn's does, so it is not needed.

Stopping rule.  The step's first-order condition is
:math:`g_j/(2\tau) + \delta\Phi_\varepsilon/\delta\nu_j = 0` for every support point, :math:`g` the
OT dual potential of :math:`\nu` (the row multipliers :math:`f` carry the mass constraint).  The
*residual* is its :math:`\nu`-weighted mean :math:`\sum_j\nu_j|g_j/(2\tau) + \delta\Phi_\varepsilon/\delta\nu_j|`,
in units of :math:`\delta F/\delta\mu`; the outer loop stops when it is below ``tol`` (or after
``max_iter`` iterations, flagged in the statistics).

What :math:`\varepsilon` does.  Entropic transport blurs each step's plan by a kernel
:math:`e^{-d^2/\varepsilon}`: a displacement spread of :math:`\sqrt{\varepsilon/2}` per direction
(the *entropic blur* :math:`\sim\sqrt\varepsilon`), which on its own is a spurious diffusion
:math:`\varepsilon/(4\tau)`.  With ``debias=True`` (default) it is removed to leading order by
the entropy correction :math:`c_\varepsilon = \sigma^2/(2\tau)`, :math:`\sigma^2` the blur's
per-direction variance measured on the discrete support (:math:`\to\varepsilon/2` when
:math:`\varepsilon \gg h^2`, :math:`\to 0` when :math:`\varepsilon \ll h^2`, ``h`` the spacing).
What remains is :math:`O(\tau)` from the implicit step, :math:`O(h)`--:math:`O(h^2)` from the
support, and an :math:`O(\varepsilon)` blur of sharp features (atoms are smeared over
:math:`\sim\sqrt\varepsilon`).  Without debiasing the error is :math:`O(\tau) + O(\varepsilon/\tau)`.
Keep :math:`\varepsilon \gtrsim h^2`: with :math:`\varepsilon \ll h^2` the transport becomes the
exact discrete one, which locks mass in its cell whenever :math:`\tau|v| < h/2`.  The default
:math:`\varepsilon = 2h^2` is the smallest that avoids locking; with noise it does not depend on
:math:`\kappa` (the Newton inner solve makes :math:`\lambda/\varepsilon` cost only
:math:`\sqrt{\lambda/\varepsilon}`), and a larger :math:`\varepsilon` only adds blur.

``method="emd"`` solves the same step with the exact transport of POT's ``ot.emd`` (no blur, small
supports only): mirror descent on the weights with Armijo backtracking, the gradient being
:math:`g/(2\tau) + \delta\Phi/\delta\nu`, :math:`g` the exact dual potential of :math:`W_2^2(a,\nu)`.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..density import Density
from ..errors import NotAGradientFlowError, SolverError, check_int, check_positive, short_repr
from ..measure import Atoms
from ..mesh import Mesh
from ..models import WASSERSTEIN, Model

__all__ = ["jko", "jko_step", "JKOResult", "StepStats", "WarmStart", "stationary", "StationaryResult", "cost_matrix",
           "cluster_atoms", "check_gradient_model"]

logger = logging.getLogger(__name__)

COSTS = ("geodesic", "chordal")
METHODS = ("sinkhorn", "emd")
_THETA = 50.0  # kernel truncation: entries below e^{-50} of their row's maximum are dropped
_ABSORB = 10.0  # rebuild the kernel when |log v| exceeds this
_TINY = 1e-300
OMEGA = 1.8  # over-relaxation of the scaling iterations (reset to 1 when the change grows)


# --------------------------------------------------------------------------- inputs
def check_gradient_model(model: Any, d: int) -> None:
    """Raise unless ``model`` is ``None`` or a gradient flow in the plain Wasserstein metric.

    Raises
    ------
    TypeError
        ``model`` is not a :class:`~wflow.models.Model`.
    NotAGradientFlowError
        The model has no energy (the message names the failing condition), or it ascends its
        energy in the SA-reweighted metric, which the :math:`W_2` JKO scheme does not solve.
    """
    if model is None:
        return
    if not isinstance(model, Model):
        raise TypeError(f"model must be a wflow Model or None, got {short_repr(model)}")
    model.check_dimension(d)
    why = model.gradient_obstruction()
    if why is not None:
        raise NotAGradientFlowError(f"the JKO scheme needs a gradient flow, but {model!r} is not one: {why}")
    if model.metric != WASSERSTEIN:
        raise NotAGradientFlowError(
            f"the JKO scheme solves Wasserstein-2 gradient flows, but {model!r} ascends its energy in the metric "
            f"reweighted by Z_mu (metric={model.metric!r}); use USA (plain W2) or the particle/Eulerian solvers for SA")


def cost_matrix(x: np.ndarray, cost: str = "geodesic") -> np.ndarray:
    r"""Dense ground cost :math:`C_{ij} = d(x_i, x_j)^2`, shape ``(n, n)``; geodesic or chordal distance.

    From the Gram matrix: chordal :math:`2 - 2\langle x_i, x_j\rangle`, geodesic
    :math:`\arccos^2\langle x_i, x_j\rangle`, except near antipodes (:math:`\langle x_i, x_j\rangle < -0.99`),
    where ``arccos`` loses half the digits and :math:`d = \pi - 2\arcsin(|x_i + x_j|/2)` is used.
    Agrees with :func:`wflow.sphere.geodesic_distance` squared to ~1e-14 (absolute).
    """
    if cost not in COSTS:
        raise ValueError(f"cost must be one of {COSTS}, got {cost!r}")
    n = x.shape[0]
    out = np.empty((n, n))
    rows = max(1, 2**22 // max(1, n))
    for i in range(0, n, rows):
        G = x[i:i + rows] @ x.T
        np.clip(G, -1.0, 1.0, out=G)
        if cost == "chordal":
            Ci = np.maximum(2.0 - 2.0 * G, 0.0)
        else:
            Ci = np.arccos(G)
            far = np.nonzero(G < -0.99)
            if far[0].size:
                s = np.linalg.norm(x[i + far[0]] + x[far[1]], axis=-1)
                Ci[far] = np.pi - 2.0 * np.arcsin(np.minimum(0.5 * s, 1.0))
            Ci *= Ci
        out[i:i + rows] = Ci
    np.fill_diagonal(out, 0.0)
    return out


def _support(rho0: Any, reference: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, Mesh | None]:
    """``(points, masses, reference volumes, mesh)`` from a Density or single Atoms."""
    if isinstance(rho0, Density):
        mesh = rho0.mesh
        x, a, r = mesh.centers.astype(np.float64), rho0.masses().astype(np.float64), mesh.areas.astype(np.float64)
    elif isinstance(rho0, Atoms):
        if rho0.batch_shape:
            raise ValueError(f"rho0 must be a single measure (no batch axes), got batch {rho0.batch_shape}")
        mesh = None
        x, a = rho0.points.astype(np.float64), rho0.weights.astype(np.float64)
        area = 2 * np.pi if rho0.d == 2 else (4 * np.pi if rho0.d == 3 else 1.0)
        r = np.full(rho0.n, area / rho0.n)
    else:
        raise TypeError(f"rho0 must be a wflow Density (mesh) or Atoms (point cloud), got {short_repr(rho0)}")
    if reference is not None:
        r = np.asarray(reference, dtype=float)
        if r.shape != a.shape or not np.all(np.isfinite(r)) or np.any(r <= 0):
            raise ValueError(f"reference must hold {a.shape[0]} positive volumes, got {short_repr(reference)}")
    a = a / a.sum()
    return x, a, r, mesh


def _spacing(x: np.ndarray, r: np.ndarray) -> float:
    return float(np.mean(r)) if x.shape[1] == 2 else float(np.sqrt(np.mean(r)))


# --------------------------------------------------------------------------- semi-relaxed Sinkhorn
class _SemiRelaxed:
    r"""Stabilized scaling iterations for :math:`\min_\pi\langle C,\pi\rangle + \varepsilon\mathrm{KL}(\pi|a\otimes r) + \lambda\mathrm{KL}(\nu|r) + \langle V,\nu\rangle`, :math:`\pi\mathbb 1 = a`.

    Plan :math:`\pi_{ij} = a_i u_i K_{ij} v_j`, :math:`K_{ij} = r_j e^{(\bar f_i + \bar g_j - C_{ij})/\varepsilon}`
    truncated; potentials :math:`f = \bar f + \varepsilon\log u`, :math:`g = \bar g + \varepsilon\log v`.
    """

    def __init__(self, C: np.ndarray, r: np.ndarray):
        self.C = C
        self.logr = np.log(r)
        self.n = C.shape[0]
        self.eps = None
        self.gbar = np.zeros(self.n)
        self.fbar = np.zeros(self.n)
        self.v = np.ones(self.n)
        self.u = np.ones(self.n)
        self.K = None
        self._KT2 = None
        self.builds = 0
        self.build_time = 0.0

    @property
    def g(self) -> np.ndarray:
        return self.gbar + self.eps * np.log(self.v)

    @property
    def f(self) -> np.ndarray:
        return self.fbar + self.eps * np.log(self.u)

    def build(self, g: np.ndarray | None = None) -> None:
        """Absorb the scalings and rebuild the truncated kernel (row maxima normalized to 1)."""
        t0 = time.perf_counter()
        self.gbar = self.g if g is None else np.array(g, dtype=float)
        n, eps = self.n, self.eps
        inv = 1.0 / eps
        rows_per = max(1, 2**21 // n)
        data, indices, indptr = [], [], [np.zeros(1, dtype=np.int64)]
        fbar = np.empty(n)
        h = self.gbar * inv + self.logr
        nnz = 0
        for i in range(0, n, rows_per):
            E = h[None, :] - self.C[i:i + rows_per] * inv
            m = E.max(axis=1)
            E -= m[:, None]
            fbar[i:i + rows_per] = -eps * m
            keep = E > -_THETA
            cnt = keep.sum(axis=1)
            data.append(np.exp(E[keep]))
            indices.append(np.nonzero(keep)[1])
            indptr.append(nnz + np.cumsum(cnt))
            nnz += int(cnt.sum())
        from scipy import sparse

        K = sparse.csr_matrix((np.concatenate(data), np.concatenate(indices), np.concatenate(indptr)), shape=(n, n))
        self.K = K.toarray() if nnz > 0.3 * n * n else K
        self.KT = self.K.T if isinstance(self.K, np.ndarray) else K.T.tocsr()
        self.fbar = fbar
        self.u = np.ones(n)
        self.v = np.ones(n)
        self._KT2 = None
        self.builds += 1
        self.build_time += time.perf_counter() - t0

    def set_eps(self, eps: float) -> None:
        if self.eps is None:
            self.eps = eps
            self.build(self.gbar)
        elif eps != self.eps:
            g = self.g
            self.eps = eps
            self.build(g)

    def row_update(self) -> None:
        Kv = self.K @ self.v
        self.u = 1.0 / Kv

    def column_log_sums(self, a: np.ndarray) -> np.ndarray:
        r""":math:`\log\sum_i a_i e^{(f_i - C_{ij})/\varepsilon}` (exact in the log domain where the kernel is empty)."""
        s = self.KT @ (a * self.u)
        with np.errstate(divide="ignore"):
            out = np.log(s) - self.logr - self.gbar / self.eps
        bad = ~(s > _TINY)
        if np.any(bad):
            f = self.f
            cols = np.flatnonzero(bad)
            E = (f[:, None] - self.C[:, cols]) / self.eps + np.log(np.maximum(a, _TINY))[:, None]
            m = E.max(axis=0)
            out[cols] = m + np.log(np.sum(np.exp(E - m[None, :]), axis=0))
        return out

    def nu(self, a: np.ndarray) -> np.ndarray:
        return self.v * (self.KT @ (a * self.u))

    def solve(self, a: np.ndarray, V: np.ndarray, lam: float, tol: float, max_iter: int,
              newton: bool = True) -> tuple[int, float]:
        """Iterate to a fixed point of the generalized Sinkhorn map; ``(iterations, change)``.

        When the scaling map contracts slowly (:math:`\\zeta > 1/2`) and ``newton``, hands over to
        :meth:`newton` instead.
        """
        eps = self.eps
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
            logv = (g_new - self.gbar) / eps
            if np.max(np.abs(logv)) > _ABSORB or not np.all(np.isfinite(logv)):
                self.build(g_new)
                self.row_update()
            else:
                self.v = np.exp(logv)
                self.row_update()
            nu = self.nu(a)
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
        logv = (g - self.gbar) / self.eps
        if np.max(np.abs(logv)) > _ABSORB or not np.all(np.isfinite(logv)):
            self.build(g)
        else:
            self.v = np.exp(logv)
        self.row_update()
        return self.nu(a)

    def newton(self, a: np.ndarray, V: np.ndarray, lam: float, tol: float, max_iter: int) -> tuple[int, float]:
        r"""Damped Newton--CG on the semi-dual; ``(Hessian products + Newton steps, residual)``.

        With the row potential eliminated (:math:`f = f(g)` exact), the dual of the linearized step is the
        smooth concave function
        :math:`D(g) = \langle a, f(g)\rangle - \lambda\sum_j r_j e^{-(g_j+V_j)/\lambda}`, gradient
        :math:`q - \nu`, :math:`q_j = r_j e^{-(g_j+V_j)/\lambda}`, and negative Hessian
        :math:`H = (\mathrm{diag}\,\nu - \pi^\top\mathrm{diag}(a)^{-1}\pi)/\varepsilon + \mathrm{diag}(q)/\lambda`
        (symmetric positive definite; two kernel products per application).  Its condition number is
        :math:`\approx 1 + \lambda/\varepsilon`, so Jacobi-preconditioned CG needs
        :math:`O(\sqrt{\lambda/\varepsilon})` products where the scaling iterations, which contract by
        :math:`\zeta = \lambda/(\lambda+\varepsilon)`, need :math:`O(\lambda/\varepsilon)`.  Steps are
        damped by Armijo backtracking on :math:`D`.  Stops when
        :math:`\sum_j\nu_j|g_j + V_j + \lambda\log(\nu_j/r_j)| \le` ``tol`` (the linearized optimality
        condition, units of ``g``) or after ``max_iter`` products.
        """
        eps = self.eps
        logr = self.logr

        def dual(nu: np.ndarray) -> tuple[float, np.ndarray | None]:
            z = -(self.g + V) / lam + logr
            if z.max() > 700.0:
                return -np.inf, None
            q = np.exp(z)
            return float(np.dot(a, self.f) - lam * q.sum()), q

        def residual(nu: np.ndarray, q: np.ndarray) -> float:
            pos = nu > 0
            return float(lam * np.dot(nu[pos], np.abs(np.log(nu[pos] / np.maximum(q[pos], _TINY)))))

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
            if self._KT2 is None:
                self._KT2 = self.KT * self.KT if isinstance(self.KT, np.ndarray) else self.KT.multiply(self.KT).tocsr()
            diag = (nu - v * v * (self._KT2 @ au2)) / eps + q / lam
            diag = np.maximum(diag, q / lam)

            def hess(x: np.ndarray) -> np.ndarray:
                return (nu * x - v * (self.KT @ (au2 * (self.K @ (v * x))))) / eps + q * x / lam

            # preconditioned CG for H d = grad, relative tolerance 1e-3 (inexact Newton)
            d = np.zeros_like(g)
            rcg = grad.copy()
            z = rcg / diag
            p = z.copy()
            rz = float(np.dot(rcg, z))
            stop = 1e-6 * rz
            for _ in range(max(1, max_iter - products)):
                Hp = hess(p)
                products += 1
                alpha = rz / float(np.dot(p, Hp))
                d += alpha * p
                rcg -= alpha * Hp
                z = rcg / diag
                rz_new = float(np.dot(rcg, z))
                if rz_new <= stop:
                    break
                p = z + (rz_new / rz) * p
                rz = rz_new
            slope = float(np.dot(grad, d))
            t = 1.0
            while True:
                nu_t = self._set_g(g + t * d, a)
                D_t, q_t = dual(nu_t)
                if q_t is not None and D_t >= D + 1e-4 * t * slope - 1e-14 * abs(D):
                    break
                t *= 0.5
                if t < 1e-8:
                    self._set_g(g, a)
                    logger.debug("Newton line search failed at residual %.3g", res)
                    return products, res
            products += 1
            g, nu, D, q = g + t * d, nu_t, D_t, q_t
            res = residual(nu, q)
        return products, res

    def transport(self, a: np.ndarray, nu: np.ndarray) -> float:
        r""":math:`T_\varepsilon(a,\nu) = \langle a, f\rangle + \langle\nu, g\rangle` for the current plan (exact marginals)."""
        return float(np.dot(a, self.f) + np.dot(nu, self.g))


def _blur_variance(C: np.ndarray, r: np.ndarray, eps: float, dim: int) -> float:
    r"""Per-direction variance of the blur kernel :math:`r_j e^{-C_{ij}/\varepsilon}`, averaged over rows."""
    n = C.shape[0]
    rows = max(1, 2**21 // n)
    acc = 0.0
    for i in range(0, n, rows):
        Ci = C[i:i + rows]
        W = np.where(Ci < _THETA * eps, np.exp(-np.minimum(Ci, _THETA * eps) / eps) * r[None, :], 0.0)
        acc += float(np.sum(np.sum(W * Ci, axis=1) / np.sum(W, axis=1)))
    return acc / n / dim


# --------------------------------------------------------------------------- the energy side
class _Energy:
    r"""The free energy :math:`\Phi(\nu) = -F(\nu) + \text{coef}\,\mathrm{KL}(\nu|r)` on the support."""

    def __init__(self, model: Model | None, x: np.ndarray, r: np.ndarray, backend: str):
        self.model, self.x, self.logr, self.backend = model, x, np.log(r), backend
        self.evaluations = 0
        self.time = 0.0

    def first_variation(self, nu: np.ndarray) -> np.ndarray:
        r""":math:`\delta F/\delta\nu` at the support points, shape ``(n,)``."""
        if self.model is None:
            return np.zeros_like(nu)
        t0 = time.perf_counter()
        out = self.model.first_variation(self.x, Atoms._trusted(self.x, nu), backend=self.backend)
        self.evaluations += 1
        self.time += time.perf_counter() - t0
        return np.asarray(out, dtype=float)

    def F(self, nu: np.ndarray) -> float:
        if self.model is None:
            return 0.0
        t0 = time.perf_counter()
        out = float(self.model.energy(Atoms._trusted(self.x, nu), backend=self.backend))
        self.evaluations += 1
        self.time += time.perf_counter() - t0
        return out

    def kl(self, nu: np.ndarray) -> float:
        pos = nu > 0
        return float(np.sum(nu[pos] * (np.log(nu[pos]) - self.logr[pos])))

    def logratio(self, nu: np.ndarray) -> np.ndarray:
        return np.log(np.maximum(nu, _TINY)) - self.logr


@dataclass(frozen=True, eq=False)
class WarmStart:
    r"""The inner solver's state after a JKO step: where the next step starts.

    The kernel is rebuilt at ``gbar`` exactly as the run built it, so a run continued from a
    warm start (``jko(..., warm_start=...)``, ``wflow run --resume``) repeats the uninterrupted
    run's iterations.

    Attributes
    ----------
    gbar : ndarray, shape (n,)
        Column potential absorbed into the stabilized kernel.
    v : ndarray, shape (n,)
        Column scaling; the OT potential is :math:`g = \bar g + \varepsilon\log v`.
    L : float
        Proximal weight of the outer loop.
    eps : float
        The regularization they belong to.
    """

    gbar: np.ndarray
    v: np.ndarray
    L: float
    eps: float


@dataclass
class StepStats:
    """Statistics of one JKO step."""

    iterations: int  #: outer (re-linearization) iterations
    sinkhorn: int  #: inner iterations: scaling iterations, Newton-CG kernel products and Newton steps
    residual: float  #: nu-weighted first-order residual, units of dF/dmu
    residual_max: float  #: max over support points with nu_j >= 1e-8 max(nu)
    eps: float  #: regularization at the end of the step (0 for emd)
    L: float  #: final proximal weight
    objective: float  #: J at the solution (transport/2tau + Phi_eps)
    converged: bool
    time_ot: float = 0.0
    time_energy: float = 0.0
    #: the inner solver's state after this step, kept at the saved steps (None elsewhere and for emd)
    warm_start: WarmStart | None = field(default=None, repr=False)


class _Stepper:
    """Holds the support, the cost, the OT state (warm starts) and the energy; takes JKO steps."""

    def __init__(self, model, x, r, *, tau, eps, cost, kappa, method, debias, eps_scaling, tol, max_iter,
                 max_sinkhorn, backend):
        self.x, self.r, self.dim = x, r, x.shape[1] - 1
        self.method = method
        self.tol, self.max_iter, self.max_sinkhorn = tol, max_iter, max_sinkhorn
        self.kappa_inv = 0.0 if kappa is None or np.isinf(kappa) else 1.0 / kappa
        self.energy = _Energy(model, x, r, backend)
        t0 = time.perf_counter()
        self.C = cost_matrix(x, cost)
        self.time_cost = time.perf_counter() - t0
        self.eps_target = eps if method == "sinkhorn" else 0.0
        self.eps_scaling = eps_scaling
        self.debias = debias and method == "sinkhorn"
        self.sigma2 = _blur_variance(self.C, r, eps, self.dim) if self.debias else 0.0
        self.ot = _SemiRelaxed(self.C, r) if method == "sinkhorn" else None
        self.first = True
        self.L = 0.0
        self.set_tau(tau)

    def warm_start(self) -> WarmStart | None:
        if self.ot is None or self.ot.eps is None:
            return None
        return WarmStart(gbar=self.ot.gbar.copy(), v=self.ot.v.copy(), L=float(self.L), eps=float(self.ot.eps))

    def restore(self, ws: WarmStart) -> None:
        """Start the next step from ``ws`` (a :meth:`warm_start` of a run on the same support and eps)."""
        if not isinstance(ws, WarmStart):
            raise TypeError(f"warm_start must be a WarmStart (JKOResult.warm_start) or None, got {short_repr(ws)}")
        if self.ot is None:
            raise ValueError("warm_start applies to method='sinkhorn'; method='emd' keeps no state between steps")
        n = self.x.shape[0]
        gbar, v = np.asarray(ws.gbar, dtype=float), np.asarray(ws.v, dtype=float)
        if gbar.shape != (n,) or v.shape != (n,) or not np.all(np.isfinite(gbar)) or not np.all(v > 0):
            raise ValueError(f"warm_start must hold finite gbar and positive v of shape ({n},), got shapes "
                             f"{gbar.shape}, {v.shape}")
        if not np.isclose(ws.eps, self.eps_target, rtol=1e-12, atol=0):
            raise ValueError(f"warm_start was taken at eps={ws.eps!r}, this run uses eps={self.eps_target!r}")
        self.ot.eps = self.eps_target
        self.ot.build(gbar)
        self.ot.v = v.copy()
        self.L = float(ws.L)
        self.first = False

    def set_tau(self, tau: float) -> None:
        self.tau = tau
        self.c_blur = self.sigma2 / (2 * tau)
        self.coef = self.kappa_inv - self.c_blur  # entropy weight of the debiased step

    def phi(self, nu: np.ndarray, F: float) -> float:
        return -F + self.coef * self.energy.kl(nu)

    # -- entropic step -------------------------------------------------------------
    def _linear_part(self, nu_m: np.ndarray, dF: np.ndarray, L: float) -> tuple[np.ndarray, float]:
        tau2 = 2 * self.tau
        V = -tau2 * dF
        lam = tau2 * L
        lr = self.energy.logratio(nu_m)
        if self.coef >= 0:
            lam += tau2 * self.coef
        else:
            V = V + tau2 * self.coef * lr
        if L > 0:
            V = V - tau2 * L * lr
        V = V - np.dot(nu_m, V)  # constants do not change the step (mass is fixed)
        return V, lam

    def _residual(self, nu: np.ndarray, g: np.ndarray, dF: np.ndarray) -> tuple[float, float]:
        grad = g / (2 * self.tau) - dF + self.coef * self.energy.logratio(nu)
        grad = grad - np.dot(nu, grad)
        keep = nu >= 1e-8 * nu.max()
        return float(np.dot(nu, np.abs(grad))), float(np.max(np.abs(grad[keep])))

    def _displacement_scale(self, a: np.ndarray, dF: np.ndarray) -> float:
        r"""Mean squared displacement of one step, :math:`\tau^2\sum_i a_i|\nabla_S\psi|^2 + 2(d-1)\tau/\kappa`, capped by the diameter."""
        s2 = 2 * self.dim * self.tau * self.kappa_inv
        model = self.energy.model
        if model is not None:
            v = model.velocity(self.x, Atoms._trusted(self.x, a), backend=self.energy.backend)
            s2 += self.tau**2 * float(np.dot(a, np.sum(v * v, axis=-1)))
        return min(float(self.C.max()), s2)

    def step(self, a: np.ndarray) -> tuple[np.ndarray, StepStats]:
        if self.method == "emd":
            return self._emd_step(a)
        ot, E = self.ot, self.energy
        t_ot = 0.0
        t0e = E.time
        nu_m = a.copy()
        dF = E.first_variation(nu_m)
        schedule = [self.eps_target]
        if self.first and self.eps_scaling is not None:
            # opt-in eps-scaling on the cold step, from the scale of one step's displacement
            e = self._displacement_scale(a, dF)
            while e > self.eps_target:
                schedule.insert(-1, e)
                e *= self.eps_scaling
        sink = 0
        L = 0.0 if self.L == 0 else self.L / 4
        for eps in schedule:
            t0 = time.perf_counter()
            V, lam = self._linear_part(nu_m, dF, L)
            if ot.eps is None and lam > 0:
                # cold start at the potential whose target marginal q = r e^{-(g+V)/lam} is mu_k
                ot.gbar = -V - lam * E.logratio(a)
            ot.set_eps(eps)
            it, _ = ot.solve(a, V, lam, tol=2 * self.tau * self.tol,
                             max_iter=20 if eps != self.eps_target else self.max_sinkhorn)
            sink += it
            t_ot += time.perf_counter() - t0
            if eps != self.eps_target:
                nu = ot.nu(a)
                nu_m = nu / nu.sum()
                dF = E.first_variation(nu_m)
        self.first = False
        nu = ot.nu(a)
        nu /= nu.sum()
        F_new = E.F(nu)
        J_m = ot.transport(a, nu) / (2 * self.tau) + self.phi(nu, F_new)
        nu_m = nu
        dF = E.first_variation(nu_m)
        res, res_max = self._residual(nu_m, ot.g, dF)
        outer = 1
        converged = res <= self.tol
        while not converged and outer < self.max_iter:
            outer += 1
            state = (ot.fbar.copy(), ot.gbar.copy(), ot.u.copy(), ot.v.copy(), ot.K, ot.KT)
            t0 = time.perf_counter()
            V, lam = self._linear_part(nu_m, dF, L)
            it, _ = ot.solve(a, V, lam, tol=2 * self.tau * max(0.1 * self.tol, 0.01 * res), max_iter=self.max_sinkhorn)
            sink += it
            nu = ot.nu(a)
            nu /= nu.sum()
            t_ot += time.perf_counter() - t0
            F_new = E.F(nu)
            J_new = ot.transport(a, nu) / (2 * self.tau) + self.phi(nu, F_new)
            if J_new > J_m + 1e-12 * max(1.0, abs(J_m)):
                # the linearization was not a majorizer here: restore and add (more) proximal weight
                ot.fbar, ot.gbar, ot.u, ot.v, ot.K, ot.KT = state
                L = max(2 * L, 0.25 * float(dF.max() - dF.min()) + 1e-12)
                continue
            J_m, nu_m = J_new, nu
            dF = E.first_variation(nu_m)
            res, res_max = self._residual(nu_m, ot.g, dF)
            converged = res <= self.tol
        self.L = L
        if not converged:
            logger.warning("JKO step: residual %.3g above tol=%.3g after %d iterations", res, self.tol, outer)
        return nu_m, StepStats(outer, sink, res, res_max, float(ot.eps), L, J_m, converged,
                               time_ot=t_ot, time_energy=E.time - t0e)

    # -- exact step (POT emd) ------------------------------------------------------
    def _emd_step(self, a: np.ndarray) -> tuple[np.ndarray, StepStats]:
        import ot as pot

        E = self.energy
        t_ot = 0.0
        t0e = E.time
        tau2 = 2 * self.tau
        support = a > 0

        def evaluate(nu):
            nonlocal t_ot
            t0 = time.perf_counter()
            w2, lg = pot.emd2(a, nu, self.C, numItermax=max(10**6, 50 * nu.size**2), log=True)
            t_ot += time.perf_counter() - t0
            if lg.get("result_code", 1) != 1:
                raise SolverError(f"ot.emd did not reach an optimal plan (result_code={lg.get('result_code')}); "
                                  f"use method='sinkhorn' for a support of {nu.size} points")
            F = E.F(nu)
            J = w2 / tau2 + self.phi(nu, F)
            dF = E.first_variation(nu)
            grad = np.asarray(lg["v"]) / tau2 - dF + self.coef * E.logratio(nu)
            return J, grad - np.dot(nu, grad)

        nu = np.where(support, a, 0.0) + 1e-12 * (self.kappa_inv > 0)
        nu /= nu.sum()
        J, grad = evaluate(nu)
        s = 1.0 / (float(np.dot(nu, np.abs(grad))) + 1e-300)
        it, res = 0, float(np.dot(nu, np.abs(grad)))
        while res > self.tol and it < self.max_iter:
            it += 1
            for _ in range(60):
                z = np.log(np.maximum(nu, _TINY)) - s * grad
                trial = np.exp(z - z.max())
                trial /= trial.sum()
                Jt, gt = evaluate(trial)
                if Jt <= J - 1e-4 * float(np.dot(grad, nu - trial)):
                    break
                s *= 0.5
            else:
                break
            nu, J, grad = trial, Jt, gt
            s *= 1.5
            res = float(np.dot(nu, np.abs(grad)))
        keep = nu >= 1e-8 * nu.max()
        return nu, StepStats(it, it, res, float(np.max(np.abs(grad[keep]))), 0.0, 0.0, float(J), res <= self.tol,
                             time_ot=t_ot, time_energy=E.time - t0e)


# --------------------------------------------------------------------------- driver
@dataclass
class JKOResult:
    """Result of :func:`jko`.

    Attributes
    ----------
    times : ndarray, shape (n_saves,)
        :math:`k\\tau` at the saved steps.
    weights : ndarray, shape (n_saves, n)
        Masses :math:`\\nu_j` on the support (sum 1, non-negative).
    points : ndarray, shape (n, d)
        The support.
    reference : ndarray, shape (n,)
        Reference volumes :math:`r_j` (cell areas) of the entropy.
    energy : ndarray, shape (n_saves,)
        :math:`F` (``model.energy``, ascended); zeros when ``model`` is None.
    free_energy : ndarray, shape (n_saves,)
        :math:`\\Phi = -F + \\kappa^{-1}\\sum_j\\nu_j\\log(\\nu_j/r_j)`, non-increasing for the exact scheme.
    stats : list of StepStats
        One per step taken.
    mesh : Mesh or None
    """

    times: np.ndarray
    weights: np.ndarray
    points: np.ndarray
    reference: np.ndarray
    energy: np.ndarray
    free_energy: np.ndarray
    stats: list[StepStats] = field(default_factory=list)
    mesh: Mesh | None = None
    tau: float = 0.0
    eps: float = 0.0
    method: str = "sinkhorn"
    status: int = 0
    message: str = ""
    timing: dict[str, float] = field(default_factory=dict)

    @property
    def warm_start(self) -> WarmStart | None:
        """The inner solver's state after the last step: ``jko(..., warm_start=r.warm_start)`` continues the run."""
        return self.stats[-1].warm_start if self.stats else None

    @property
    def values(self) -> np.ndarray:
        """Densities (weights / reference volumes), shape ``(n_saves, n)``."""
        return self.weights / self.reference

    def density(self, i: int = -1) -> Density:
        if self.mesh is None:
            raise ValueError("this JKO run was on a point cloud, not a mesh: use atoms(i)")
        return Density._trusted(self.mesh, self.weights[i] / self.mesh.areas)

    def atoms(self, i: int = -1) -> Atoms:
        return Atoms._trusted(self.points, self.weights[i])

    def stat(self, name: str) -> np.ndarray:
        """One statistic over the steps, e.g. ``stat("residual")``."""
        return np.array([getattr(s, name) for s in self.stats])

    def __len__(self) -> int:
        return int(self.times.shape[0])

    def __repr__(self) -> str:
        return (f"JKOResult(n_saves={len(self)}, tau={self.tau:g}, eps={self.eps:g}, n={self.points.shape[0]}, "
                f"method={self.method!r}, status={self.status})")


def _check_eps_scaling(eps_scaling: Any) -> float | None:
    if eps_scaling is None:
        return None
    eps_scaling = check_positive(eps_scaling, "eps_scaling")
    if eps_scaling >= 1:
        raise ValueError(f"eps_scaling must be None or in (0, 1), got {eps_scaling}")
    return eps_scaling


def _default_eps(x: np.ndarray, r: np.ndarray) -> float:
    return 2.0 * _spacing(x, r) ** 2


def jko(
    model: Model | None,
    rho0: Density | Atoms,
    tau: float,
    n_steps: int,
    *,
    eps: float | None = None,
    cost: str = "geodesic",
    kappa: float | None = None,
    method: str = "sinkhorn",
    debias: bool = True,
    eps_scaling: float | None = None,
    tol: float = 1e-6,
    max_iter: int = 200,
    max_sinkhorn: int = 5000,
    reference: Any = None,
    save_every: int = 1,
    backend: str = "auto",
    callback: Callable[[float, np.ndarray, StepStats], Any] | None = None,
    progress: bool = False,
    warm_start: WarmStart | None = None,
    _stepper: _Stepper | None = None,
) -> JKOResult:
    r"""Run ``n_steps`` JKO steps :math:`\mu_{k+1} = \arg\min_\nu W_2^2(\mu_k,\nu)/(2\tau) - F(\nu) + \kappa^{-1}\int\nu\log\nu`.

    Algorithm, stopping rule and the role of :math:`\varepsilon`: module docstring.

    Parameters
    ----------
    model : Model or None
        A gradient flow in the plain Wasserstein metric (USA with ``Q = K = I``, ``V = ±I``,
        conservative perceptrons, sums of them); ``None`` for pure diffusion (needs ``kappa``).
    rho0 : Density or Atoms
        Initial measure.  A Density runs on its mesh's cell centres (reference volumes = cell
        areas); Atoms run on their points (reference volumes ``|S^{d-1}|/n`` unless ``reference``).
    tau : float
        Time step.
    n_steps : int
        Number of steps; the result holds times ``0, tau, ..., n_steps tau`` (every ``save_every``).
    eps : float, optional
        Entropic regularization (units of squared distance); default ``2 h^2``, ``h`` the spacing of
        the support.  It blurs each step's plan over ~sqrt(eps) (debiased to leading order, module
        docstring); smaller than ``h^2`` locks mass in its cell.  With noise the inner solve costs
        ~sqrt(2 tau / (kappa eps)) kernel products per Newton step.
    cost : {"geodesic", "chordal"}
        :math:`C = d^2` with the great-circle or the chordal distance.
    kappa : float, optional
        Inverse diffusivity; ``None`` or ``inf``: no noise.
    method : {"sinkhorn", "emd"}
        Entropic semi-relaxed Sinkhorn (any size) or exact ``ot.emd`` mirror descent (small supports).
    debias : bool
        Remove the blur's spurious diffusion to leading order (module docstring).
    eps_scaling : float, optional
        ``None`` (default): every step is solved at ``eps`` directly.  A factor in ``(0, 1)``: the
        first step runs an eps-scaling schedule from the squared displacement of one step down to ``eps``.
    tol : float
        Stopping tolerance on the step's first-order residual (units of ``dF/dmu``).
    max_iter, max_sinkhorn : int
        Caps on outer iterations per step and on scaling iterations per outer iteration.
    reference : array_like, shape (n,), optional
        Reference volumes of the entropy.
    backend : str
        Kernel-sum backend of ``model.first_variation`` / ``model.energy``.
    callback : callable, optional
        ``callback(t, weights, stats)`` after each step (``stats`` a :class:`StepStats`); a true
        value stops the run.
    progress : bool
        A tqdm progress bar over steps.
    warm_start : WarmStart, optional
        Continue a run: the inner solver starts from this state (``JKOResult.warm_start``, or
        ``stats[k].warm_start`` of a saved step ``k``) instead of cold.  With ``rho0`` the
        measure saved at that step, the continued run repeats the uninterrupted one's iterations
        (equal to round-off in the starting weights).

    Returns
    -------
    JKOResult

    Raises
    ------
    NotAGradientFlowError
        ``model`` is not a Wasserstein gradient flow (SA, general Q/K/V, non-conservative perceptron).

    Examples
    --------
    >>> from wflow.mesh import CircleMesh
    >>> from wflow.density import Density
    >>> rho0 = Density.from_function(CircleMesh(64), lambda x: 1 + 0.5 * x[:, 0])
    >>> r = jko(None, rho0, 0.05, 4, kappa=1.0)
    >>> bool(abs(r.weights.sum(axis=1) - 1).max() < 1e-12)
    True
    """
    x, a, r, mesh = _support(rho0, reference)
    check_gradient_model(model, x.shape[1])
    tau = check_positive(tau, "tau")
    n_steps = check_int(n_steps, "n_steps", minimum=0)
    save_every = check_int(save_every, "save_every")
    if kappa is not None:
        kappa = check_positive(kappa, "kappa", allow_inf=True)
    if model is None and (kappa is None or np.isinf(kappa)):
        raise ValueError("model=None (pure diffusion) needs a finite kappa")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if cost not in COSTS:
        raise ValueError(f"cost must be one of {COSTS}, got {cost!r}")
    eps = _default_eps(x, r) if eps is None else check_positive(eps, "eps")
    eps_scaling = _check_eps_scaling(eps_scaling)
    tol = check_positive(tol, "tol")
    max_iter = check_int(max_iter, "max_iter")
    max_sinkhorn = check_int(max_sinkhorn, "max_sinkhorn")
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable, got {short_repr(callback)}")

    st = _stepper or _Stepper(model, x, r, tau=tau, eps=eps, cost=cost, kappa=kappa, method=method, debias=debias,
                              eps_scaling=eps_scaling, tol=tol, max_iter=max_iter, max_sinkhorn=max_sinkhorn,
                              backend=backend)
    if warm_start is not None:
        st.restore(warm_start)
    st.set_tau(tau)
    E = st.energy
    out_t, out_w, out_F, out_P = [], [], [], []

    def record(t, w):
        F = E.F(w)
        out_t.append(t)
        out_w.append(w.copy())
        out_F.append(F)
        out_P.append(-F + st.kappa_inv * E.kl(w))

    record(0.0, a)
    stats: list[StepStats] = []
    status, message = 0, f"took {n_steps} steps"
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=n_steps, desc="jko", unit="step")
    w = a
    t_start = time.perf_counter()
    for k in range(1, n_steps + 1):
        w, s = st.step(w)
        if not np.all(np.isfinite(w)):
            raise SolverError(f"non-finite weights at step {k}; try a larger eps or a smaller tau")
        stats.append(s)
        t = k * tau
        save = k % save_every == 0 or k == n_steps
        if save:
            s.warm_start = st.warm_start()
        stop = callback is not None and callback(t, w, s)
        if save or stop:
            record(t, w)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(res=f"{s.residual:.1e}", it=s.iterations)
        if stop:
            status, message = 1, f"stopped by callback at step {k}"
            break
    if bar is not None:
        bar.close()
    weights = np.array(out_w)
    return JKOResult(
        times=np.array(out_t), weights=weights, points=x, reference=r, energy=np.array(out_F),
        free_energy=np.array(out_P), stats=stats, mesh=mesh, tau=tau, eps=st.eps_target, method=method,
        status=status, message=message,
        timing={"cost_matrix": st.time_cost, "total": time.perf_counter() - t_start,
                "ot": sum(s.time_ot for s in stats), "energy": sum(s.time_energy for s in stats),
                "kernel_builds": st.ot.build_time if st.ot is not None else 0.0},
    )


def jko_step(model: Model | None, rho0: Density | Atoms, tau: float, **kwargs: Any) -> JKOResult:
    """One JKO step (:func:`jko` with ``n_steps=1``)."""
    return jko(model, rho0, tau, 1, **kwargs)


# --------------------------------------------------------------------------- stationary states
def cluster_atoms(points: np.ndarray, weights: np.ndarray, *, mesh: Mesh | None = None,
                  threshold: float = 1e-3, radius: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Group the support points carrying mass into atoms.

    Points with ``weight >= threshold * max(weight)`` are linked to their mesh neighbours (or to
    points within ``radius``, default 2.5 x the spacing, on a point cloud); each connected
    component becomes one atom at its normalized barycentre with the component's mass.

    Returns
    -------
    atoms : ndarray, shape (k, d)
    masses : ndarray, shape (k,)
        Sorted by decreasing mass; they sum to the mass above the threshold.
    """
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    w = np.asarray(weights, dtype=float)
    keep = np.flatnonzero(w >= threshold * w.max())
    idx = -np.ones(w.size, dtype=np.intp)
    idx[keep] = np.arange(keep.size)
    if mesh is not None:
        nb = mesh.cell_neighbors[keep]
        rows = np.repeat(np.arange(keep.size), nb.shape[1])
        cols = idx[nb.reshape(-1)]
    else:
        from scipy.spatial import cKDTree

        if radius is None:
            n, d = points.shape
            radius = 2.5 * (2 * np.pi / n if d == 2 else np.sqrt(4 * np.pi / n))
        pairs = cKDTree(points[keep]).query_pairs(radius, output_type="ndarray")
        rows, cols = pairs[:, 0], pairs[:, 1]
    ok = cols >= 0
    G = coo_matrix((np.ones(int(ok.sum())), (rows[ok], cols[ok])), shape=(keep.size, keep.size))
    k, label = connected_components(G, directed=False)
    masses = np.bincount(label, weights=w[keep], minlength=k)
    bary = np.stack([np.bincount(label, weights=w[keep] * points[keep, c], minlength=k)
                     for c in range(points.shape[1])], axis=1)
    atoms = bary / np.linalg.norm(bary, axis=1, keepdims=True)
    order = np.argsort(-masses)
    return atoms[order], masses[order]


@dataclass
class StationaryResult:
    """Result of :func:`stationary`.

    Attributes
    ----------
    weights : ndarray, shape (n,)
        The final measure on the support.
    atoms, masses : ndarray, shapes (k, d), (k,)
        Its atoms (:func:`cluster_atoms`) and their masses.
    residual : float
        First-order residual of the atomic measure: :math:`\\max_k|\\nabla_S\\,\\delta F/\\delta\\mu(a_k)|`
        (= the velocity at the atoms), 0 at a critical point.
    residual_support : float
        :math:`\\sum_j\\nu_j|\\nabla_S\\,\\delta F/\\delta\\mu(x_j)|` on the (blurred) support measure.
    hessian : ndarray, shape (k, d-1)
        Eigenvalues of the tangential Hessian of :math:`\\delta F/\\delta\\mu[\\text{atoms}]` at each atom
        (finite differences); all :math:`< 0` for a stable critical point of the ascent flow.
    residual_grid : float or None
        The residual of the atoms before polishing (at the support's resolution, ``O(h |Hess|)``).
    potential_gap : float
        :math:`\\max_j \\psi(x_j) - \\min_k \\psi(a_k)` over the support, :math:`\\psi = \\delta F/\\delta\\mu`; :math:`\\le 0`
        (up to the resolution) when no support point would attract mass away from the atoms.
    """

    weights: np.ndarray
    points: np.ndarray
    atoms: np.ndarray
    masses: np.ndarray
    residual: float
    residual_support: float
    hessian: np.ndarray
    potential_gap: float
    energy: float
    steps: int
    tau: float
    converged: bool
    history: dict[str, list] = field(default_factory=dict)
    mesh: Mesh | None = None
    message: str = ""
    residual_grid: float | None = None

    def __repr__(self) -> str:
        return (f"StationaryResult(atoms={self.atoms.shape[0]}, residual={self.residual:.3g}, "
                f"steps={self.steps}, converged={self.converged})")


def _tangent_basis(x: np.ndarray) -> np.ndarray:
    """Orthonormal tangent basis at each point, shape ``(k, d-1, d)``."""
    k, d = x.shape
    out = np.empty((k, d - 1, d))
    for i in range(k):
        q, _ = np.linalg.qr(np.concatenate([x[i:i + 1].T, np.eye(d)], axis=1))
        out[i] = q[:, 1:d].T
    return out


def _second_order(model: Model | None, atoms: np.ndarray, masses: np.ndarray, backend: str,
                  h: float = 1e-3) -> np.ndarray:
    k, d = atoms.shape
    if model is None:
        return np.zeros((k, d - 1))
    mu = Atoms._trusted(atoms, masses / masses.sum())
    B = _tangent_basis(atoms)
    psi0 = model.first_variation(atoms, mu, backend=backend)
    H = np.zeros((k, d - 1, d - 1))
    for p in range(d - 1):
        for q in range(p, d - 1):
            vals = []
            for sp, sq in ((1, 1), (1, -1), (-1, 1), (-1, -1)):
                v = h * (sp * B[:, p] + sq * B[:, q]) / (1.0 if p == q else 1.0)
                y = np.cos(np.linalg.norm(v, axis=1))[:, None] * atoms + np.sinc(np.linalg.norm(v, axis=1) / np.pi)[:, None] * v
                vals.append(model.first_variation(y, mu, backend=backend))
            if p == q:
                # psi(exp(2h e)) etc. -> use the (1,1) and (-1,-1) points at distance 2h
                H[:, p, p] = (vals[0] + vals[3] - 2 * psi0) / (4 * h * h)
            else:
                H[:, p, q] = H[:, q, p] = (vals[0] - vals[1] - vals[2] + vals[3]) / (4 * h * h)
    return np.linalg.eigvalsh(H)


def stationary(
    model: Model | None,
    rho0: Density | Atoms,
    *,
    tau0: float = 0.1,
    growth: float = 1.5,
    tau_max: float = 1.0,
    kappa: float | None = None,
    eps: float | None = None,
    cost: str = "geodesic",
    method: str = "sinkhorn",
    tol: float = 1e-3,
    max_steps: int = 200,
    threshold: float = 1e-3,
    step_tol: float = 1e-5,
    polish: bool = True,
    backend: str = "auto",
    **kwargs: Any,
) -> StationaryResult:
    r"""A critical point of the free energy by iterated JKO steps with growing :math:`\tau`.

    Steps :math:`\tau_{k+1} = \min(\tau_{\max}, \text{growth}\cdot\tau_k)` from ``tau0`` until the
    measure stops moving, :math:`\|\nu_{k+1}-\nu_k\|_1 \le \text{tol}\cdot\min(1, \tau_k)` (a
    Wasserstein speed below ``tol``), or ``max_steps``.  Large steps keep the descent property of
    JKO (every step decreases the free energy), so the limit is a critical point reached by the
    Wasserstein flow, not an arbitrary one.

    Returns the measure, its atoms (:func:`cluster_atoms`), the first-order residual
    :math:`\max_k|\nabla_S\,\delta F/\delta\mu(a_k)|` of the atomic measure, the tangential
    Hessian eigenvalues of :math:`\delta F/\delta\mu` at the atoms (second order: all negative at a
    stable state of the ascent flow) and the potential gap (module :class:`StationaryResult`).
    With ``polish=True`` the atoms (masses fixed) are then moved off the support's grid to the
    nearby critical point of the finite-atom flow (damped Newton-like steps), so that
    ``residual`` measures criticality, not the mesh resolution (``residual_grid`` keeps the
    unpolished value).  Other keywords go to the JKO stepper (``tol`` there is ``step_tol``).
    """
    x, a, r, mesh = _support(rho0, kwargs.pop("reference", None))
    check_gradient_model(model, x.shape[1])
    tau = check_positive(tau0, "tau0")
    tau_max = check_positive(tau_max, "tau_max")
    growth = check_positive(growth, "growth")
    if growth < 1:
        raise ValueError(f"growth must be >= 1, got {growth}")
    if model is None and (kappa is None or np.isinf(kappa)):
        raise ValueError("model=None (pure diffusion) needs a finite kappa")
    if kappa is not None:
        kappa = check_positive(kappa, "kappa", allow_inf=True)
    max_steps = check_int(max_steps, "max_steps")
    eps = _default_eps(x, r) if eps is None else check_positive(eps, "eps")
    st = _Stepper(model, x, r, tau=tau, eps=eps, cost=cost, kappa=kappa, method=method,
                  debias=kwargs.pop("debias", True), eps_scaling=_check_eps_scaling(kwargs.pop("eps_scaling", None)), tol=step_tol,
                  max_iter=kwargs.pop("max_iter", 200), max_sinkhorn=kwargs.pop("max_sinkhorn", 5000),
                  backend=backend)
    if kwargs:
        raise TypeError(f"stationary() got unexpected keyword arguments {sorted(kwargs)}")
    w = a
    hist: dict[str, list] = {"tau": [], "change": [], "free_energy": [], "residual": []}
    converged = False
    k = 0
    for k in range(1, max_steps + 1):
        st.set_tau(tau)
        w_new, s = st.step(w)
        change = float(np.abs(w_new - w).sum())
        w = w_new
        F = st.energy.F(w)
        hist["tau"].append(tau)
        hist["change"].append(change)
        hist["free_energy"].append(-F + st.kappa_inv * st.energy.kl(w))
        hist["residual"].append(s.residual)
        if change <= tol * min(1.0, tau) and tau >= tau_max:
            converged = True
            break
        # grow tau while steps stay cheap; a step that needed many re-linearizations (repulsion:
        # proximal weight) is prox-dominated, so a larger tau would only cost more
        if s.iterations >= 30 or not s.converged:
            tau = max(tau0, tau / growth)
            tau_max = min(tau_max, tau)
        else:
            tau = min(tau_max, growth * tau)
    atoms, masses = cluster_atoms(x, w, mesh=mesh, threshold=threshold)
    mu_atoms = Atoms._trusted(atoms, masses / masses.sum())
    residual_grid = None
    if model is not None and polish and masses.size < x.shape[0] // 4:
        # the atoms sit at the support's resolution; move them (masses fixed) by damped Newton-like
        # ascent steps x <- exp_x(v / |Hess|) of the finite-atom flow to the nearby critical point
        residual_grid = float(np.max(np.linalg.norm(model.velocity(atoms, mu_atoms, backend=backend), axis=-1)))
        for _ in range(200):
            v = model.velocity(atoms, mu_atoms, backend=backend)
            if np.max(np.linalg.norm(v, axis=-1)) < 1e-12:
                break
            curv = np.max(np.abs(_second_order(model, atoms, masses, backend)), axis=1) + 1e-12
            step = v / curv[:, None]
            nv = np.linalg.norm(step, axis=-1, keepdims=True)
            atoms = np.cos(nv) * atoms + np.sinc(nv / np.pi) * step
            atoms /= np.linalg.norm(atoms, axis=-1, keepdims=True)
            mu_atoms = Atoms._trusted(atoms, masses / masses.sum())
        # atoms that met while polishing are one atom
        keep_a, keep_m = [], []
        for xa, ma in zip(atoms, masses):
            for j, xb in enumerate(keep_a):
                if np.linalg.norm(xa - xb) < 1e-6:
                    keep_m[j] += ma
                    break
            else:
                keep_a.append(xa)
                keep_m.append(ma)
        atoms, masses = np.array(keep_a), np.array(keep_m)
        mu_atoms = Atoms._trusted(atoms, masses / masses.sum())
    if model is None:
        residual, res_support, gap = 0.0, 0.0, 0.0
    else:
        v_atoms = model.velocity(atoms, mu_atoms, backend=backend)
        residual = float(np.max(np.linalg.norm(v_atoms, axis=-1)))
        v = model.velocity(x, Atoms._trusted(x, w), backend=backend)
        res_support = float(np.dot(w, np.linalg.norm(v, axis=-1)))
        psi_x = model.first_variation(x, mu_atoms, backend=backend)
        psi_a = model.first_variation(atoms, mu_atoms, backend=backend)
        gap = float(psi_x.max() - psi_a.min())
    hess = _second_order(model, atoms, masses, backend)
    msg = (f"stopped moving after {k} steps (tau={tau:g})" if converged
           else f"max_steps={max_steps} reached; last change {hist['change'][-1]:.3g}")
    return StationaryResult(weights=w, points=x, atoms=atoms, masses=masses, residual=residual,
                            residual_support=res_support, hessian=hess, potential_gap=gap,
                            energy=st.energy.F(w), steps=k, tau=tau, converged=converged, history=hist, mesh=mesh,
                            message=msg, residual_grid=residual_grid)
