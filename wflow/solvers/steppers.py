r"""One step of an ODE/SDE on the sphere: the *how* of the particle solver.

Every stepper follows one small contract (STYLE.md §2):

* ``order`` -- the (strong, for SDEs) order of accuracy;
* ``adaptive`` -- whether it gives an error estimate for step-size control;
* ``stochastic`` -- whether it needs a noise level and a random generator;
* ``step(f, t, x, dt, ...)`` -- returns a :class:`Step`.

Steps are taken in the ambient space :math:`\mathbb{R}^d` for a smooth extension of
the field off the sphere that leaves the sphere invariant (the particle driver uses
the zero-homogeneous one, :math:`v(x) = v(x/|x|)`, tangent at :math:`x/|x|`) and then
projected back, :math:`x \mapsto x/|x|`.  A projection method keeps the order of the underlying
Runge--Kutta method (Hairer, Lubich & Wanner, *Geometric Numerical Integration*,
§IV.4), and points stay on the sphere to round-off.

Steppers are looked up by name in :data:`STEPPERS`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

__all__ = ["Step", "Euler", "RK4", "DormandPrince", "EulerMaruyama", "STEPPERS", "project_to_sphere"]

VectorField = Callable[[float, np.ndarray], np.ndarray]


def project_to_sphere(x: np.ndarray) -> np.ndarray:
    """Radial projection ``x / |x|`` (the retraction applied after every step)."""
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


@dataclass
class Step:
    """Outcome of one attempted step."""

    x: np.ndarray
    evaluations: int
    error: float = 0.0  # scaled error norm (adaptive steppers); <= 1 means accept


class Euler:
    """Explicit Euler with projection (order 1); a baseline."""

    name = "euler"
    order = 1
    adaptive = False
    stochastic = False

    def step(self, f: VectorField, t: float, x: np.ndarray, dt: float, **_) -> Step:
        return Step(project_to_sphere(x + dt * f(t, x)), 1)


class RK4:
    """Classical fourth-order Runge--Kutta with projection (order 4)."""

    name = "rk4"
    order = 4
    adaptive = False
    stochastic = False

    def step(self, f: VectorField, t: float, x: np.ndarray, dt: float, **_) -> Step:
        k1 = f(t, x)
        k2 = f(t + dt / 2, x + (dt / 2) * k1)
        k3 = f(t + dt / 2, x + (dt / 2) * k2)
        k4 = f(t + dt, x + dt * k3)
        return Step(project_to_sphere(x + (dt / 6) * (k1 + 2 * k2 + 2 * k3 + k4)), 4)


class DormandPrince:
    """Dormand--Prince 5(4) embedded pair with projection (order 5, error estimate of order 4).

    The error estimate is the difference of the two solutions before projection,
    measured as in :func:`scipy.integrate.solve_ivp`:
    :math:`\\|e_i / (atol + rtol\\max(|x_i|, |\\tilde x_i|))\\|_{\\mathrm{RMS}}`.
    """

    name = "dopri5"
    order = 5
    error_order = 4
    adaptive = True
    stochastic = False

    C = np.array([0, 1 / 5, 3 / 10, 4 / 5, 8 / 9, 1, 1])
    A = [
        [],
        [1 / 5],
        [3 / 40, 9 / 40],
        [44 / 45, -56 / 15, 32 / 9],
        [19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729],
        [9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656],
        [35 / 384, 0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84],
    ]
    B5 = np.array([35 / 384, 0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84, 0])
    B4 = np.array([5179 / 57600, 0, 7571 / 16695, 393 / 640, -92097 / 339200, 187 / 2100, 1 / 40])

    def step(self, f: VectorField, t: float, x: np.ndarray, dt: float, *, rtol: float, atol: float, **_) -> Step:
        ks: list[np.ndarray] = []
        for i in range(7):
            xi = x
            for a, k in zip(self.A[i], ks):
                if a != 0:
                    xi = xi + (dt * a) * k
            ks.append(f(t + self.C[i] * dt, xi))
        x5 = x + dt * sum(b * k for b, k in zip(self.B5, ks) if b != 0)
        err = dt * sum((b5 - b4) * k for b5, b4, k in zip(self.B5, self.B4, ks) if b5 != b4)
        scale = atol + rtol * np.maximum(np.abs(x), np.abs(x5))
        enorm = float(np.sqrt(np.mean((err / scale) ** 2)))
        return Step(project_to_sphere(x5), 7, enorm)


class EulerMaruyama:
    r"""Euler--Maruyama on the sphere for :math:`dX = v\,dt + \sqrt{2/\kappa}\,P_X\circ dW`.

    :math:`x \mapsto (x + h\,v(x) + \sqrt{2h/\kappa}\,P_x\xi)/|\cdot|` with
    :math:`\xi \sim N(0, I_d)`.  The projection supplies the Itô drift
    :math:`-(d-1)\kappa^{-1}x` of Brownian motion on :math:`S^{d-1}` (whose generator is
    :math:`\kappa^{-1}\Delta_S`), so the scheme has weak order 1 and strong order 1/2.
    """

    name = "euler-maruyama"
    order = 0.5
    adaptive = False
    stochastic = True

    def step(self, f: VectorField, t: float, x: np.ndarray, dt: float, *, kappa: float,
             rng: np.random.Generator, **_) -> Step:
        xi = rng.standard_normal(x.shape)
        xi = xi - np.sum(x * xi, axis=-1, keepdims=True) * x
        return Step(project_to_sphere(x + dt * f(t, x) + np.sqrt(2 * dt / kappa) * xi), 1)


STEPPERS: dict[str, object] = {s.name: s for s in (Euler(), RK4(), DormandPrince(), EulerMaruyama())}
