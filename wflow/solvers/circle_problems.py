r"""Particles on the circle :math:`S^1` in angles (:class:`CircleAngleProblem`, the Kuramoto form) and in the
gaps between sorted tokens (:class:`CircleGapProblem`): the coordinates for merged tokens and
metastable staircases at large beta.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..measure import Atoms
from ..models import Model
from ..models.attention import Attention
from .particle_problem import ParticleProblem

__all__ = ["CircleAngleProblem", "CircleGapProblem"]


class CircleAngleProblem(ParticleProblem):
    r"""Particles on :math:`S^1` in angles: the state is :math:`\theta` of shape ``(..., n)`` and the velocity the
    model's :meth:`~wflow.models.SA.angular_velocity` (Kuramoto form).

    For attention with :math:`Q = K = I`, :math:`V = \pm I`: coincident tokens contribute exactly zero, so
    slow inter-cluster forces at large beta are not drowned in rounding.  Saved: ``angles`` and ``points``.

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.solvers.particles import CircleAngleProblem
    >>> from wflow.theory import kuramoto_velocity
    >>> theta = np.array([0.0, 0.5, 2.0])
    >>> problem = CircleAngleProblem(wflow.USA(1.0), np.full(3, 1 / 3), backend="numpy")
    >>> bool(np.allclose(problem.rhs(0.0, theta), kuramoto_velocity(theta, 1.0)))
    True
    >>> traj = wflow.simulate(wflow.USA(1.0), wflow.sphere.angles_to_points(theta), 1.0, dt=0.1,
    ...                       coordinates="angles", backend="numpy")
    >>> traj.config["coordinates"], traj["angles"].shape
    ('angles', (11, 3))
    """

    _fusable = False  # angles, not points

    def __init__(self, model: Model, weights: np.ndarray, **kw: Any):
        super().__init__(model, weights, 2, **kw)
        if self.n_tracers:
            raise ValueError("tracers are not supported with coordinates='angles'")
        if not isinstance(model, Attention) or model.gradient_obstruction() is not None:
            raise ValueError(
                f"coordinates='angles' needs attention with Q = K = I and V = +-I on S^1, got {model!r}"
            )

    def attention_at(self, t: float) -> Attention:
        """The attention acting at time ``t`` (the constructor admits attention only)."""
        model = self.model_at(t)
        if not isinstance(model, Attention):
            raise TypeError(f"coordinates='angles' needs attention, got {model!r} at t={t}")
        return model

    def noise_scale(self, dt: float) -> float:
        r""":math:`\sqrt{2\,dt/\kappa}`, the size of one step's noise."""
        if self.kappa is None:
            raise ValueError("noise needs kappa: this problem has none")
        return math.sqrt(2 * dt / self.kappa)

    def rhs(self, t: float, y: np.ndarray) -> np.ndarray:
        self.evaluations += 1
        return self.attention_at(t).angular_velocity(y, self.weights)

    def retract(self, y: np.ndarray) -> np.ndarray:
        return y

    def jacobian(self, t: float, y: np.ndarray) -> np.ndarray | None:
        """The exact Jacobian of the angle velocity (one system; implicit solvers use it)."""
        if y.ndim != 1:
            return None
        return self.attention_at(t).angular_jacobian(y, self.weights)

    def noise(self, t: float, y: np.ndarray, dt: float, rng: np.random.Generator) -> np.ndarray:
        return self.noise_scale(dt) * rng.standard_normal(y.shape)

    def measure(self, y: np.ndarray) -> Atoms:
        return Atoms._trusted(np.stack([np.cos(y), np.sin(y)], axis=-1), self.weights)

    def snapshot(self, t: float, y: np.ndarray, known: dict[str, np.ndarray] | None = None) -> dict:
        mu = self.measure(y)
        out = {
            "angles": (self._batch + ("particle",), np.array(y, copy=True)),
            "points": (self._batch + ("particle", "coord"), mu.points),
        }
        out.update(self.diagnostic_variables(mu, t, known=known))
        return out

    def _log_energy(
        self, model: Any, mu: Atoms, energy_sums: np.ndarray | None
    ) -> np.ndarray | None:
        r""":math:`\log E` from the angle differences (accurate when tokens have merged), :math:`E = \frac1{2\beta}
        \sum_{ij} w_iw_j e^{\beta - 2\beta\sin^2(\Delta_{ij}/2) - o}`."""
        beta = model.beta_for(mu.n) if isinstance(model, Attention) else 0.0  # (attention only)
        if beta == 0:
            return super()._log_energy(model, mu, energy_sums)
        th = np.arctan2(mu.points[..., 1], mu.points[..., 0])
        D = th[..., None, :] - th[..., :, None]
        w = mu.weights
        terms = (
            -2.0 * beta * np.sin(0.5 * D) ** 2 + np.log(w)[..., :, None] + np.log(w)[..., None, :]
        )
        top = terms.max(axis=(-1, -2), keepdims=True)
        return (
            top[..., 0, 0]
            + np.log(np.exp(terms - top).sum(axis=(-1, -2)))
            + beta
            - model.offset(beta)
            - np.log(2 * beta)
        )

    def config(self) -> dict[str, Any]:
        return {**super().config(), "coordinates": "angles"}


class CircleGapProblem(CircleAngleProblem):
    r"""Particles on :math:`S^1` in gap coordinates: the state is :math:`y = (\theta_0, g_1, \dots, g_{n-1})`,
    :math:`\theta_i = \theta_0 + g_1 + \dots + g_i`, with the tokens sorted along the circle and the cut
    placed in the largest initial gap.

    Angle differences are sums of gaps, so a gap of 1e-200 between merged tokens keeps its relative
    accuracy, and the Jacobian :math:`T^{-1}J_\theta T` (``T`` the cumulative sum) comes from one-sided
    partial sums: the slow inter-cluster eigenvalues are not swamped, and ``ros2`` steps through every
    merge of a metastable staircase (``docs/schemes.md``).  Saved: ``gaps`` (the state, in sorted order),
    ``angles`` and ``points`` in the caller's order.

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.solvers.particles import CircleGapProblem
    >>> from wflow.theory import kuramoto_velocity
    >>> theta = np.array([0.0, 0.5, 2.0])
    >>> order, y = CircleGapProblem.from_angles(theta)  # the cut is in the largest gap, 2 pi - 2
    >>> order.tolist(), y.tolist()
    ([0, 1, 2], [0.0, 0.5, 1.5])
    >>> problem = CircleGapProblem(wflow.USA(1.0), np.full(3, 1 / 3), order, backend="numpy")
    >>> v = kuramoto_velocity(theta, 1.0)
    >>> bool(np.allclose(problem.rhs(0.0, y), [v[0], v[1] - v[0], v[2] - v[1]]))  # gaps move by differences
    True
    """

    def __init__(self, model: Model, weights: np.ndarray, order: np.ndarray, **kw: Any):
        super().__init__(model, np.take_along_axis(weights, order, axis=-1), **kw)
        self.order = order
        self.inverse = np.argsort(order, axis=-1)
        self.user_weights = weights

    @staticmethod
    def from_angles(theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(order, y)``: the sorting permutation and the gap state of angles ``theta`` of shape ``(..., n)``."""
        theta = np.mod(theta, 2 * np.pi)
        order = np.argsort(theta, axis=-1, kind="stable")
        th = np.take_along_axis(theta, order, axis=-1)
        wrap = 2 * np.pi - (th[..., -1] - th[..., 0])
        gaps = np.diff(th, axis=-1)
        # start after the largest gap (the wrap-around one included): merges across the cut lose accuracy
        allg = np.concatenate([gaps, wrap[..., None]], axis=-1)
        start = (np.argmax(allg, axis=-1) + 1) % th.shape[-1]
        n = th.shape[-1]
        roll = (np.arange(n) + start[..., None]) % n
        order = np.take_along_axis(order, roll, axis=-1)
        th = np.take_along_axis(th, roll, axis=-1)
        gaps = np.mod(np.diff(th, axis=-1), 2 * np.pi)
        return order, np.concatenate([th[..., :1], gaps], axis=-1)

    def differences(self, y: np.ndarray) -> np.ndarray:
        r""":math:`D_{ij} = \theta_j - \theta_i` as sums of gaps, shape ``(..., n, n)``."""
        n = y.shape[-1]
        D = np.zeros(y.shape + (n,))
        for i in range(n - 1):
            D[..., i, i + 1 :] = np.cumsum(y[..., i + 1 :], axis=-1)
        return D - np.swapaxes(D, -1, -2)

    def angles(self, y: np.ndarray) -> np.ndarray:
        """Angles in the sorted order, shape ``(..., n)``."""
        return y[..., :1] + np.concatenate(
            [np.zeros(y.shape[:-1] + (1,)), np.cumsum(y[..., 1:], axis=-1)], axis=-1
        )

    def rhs(self, t: float, y: np.ndarray) -> np.ndarray:
        self.evaluations += 1
        f = self.attention_at(t).angular_velocity_from_differences(
            self.differences(y), self.weights
        )
        return np.concatenate([f[..., :1], np.diff(f, axis=-1)], axis=-1)

    def jacobian(self, t: float, y: np.ndarray) -> np.ndarray | None:
        """:math:`T^{-1}J_\theta T` by one-sided partial sums (no cancellation of the O(1) entries)."""
        if y.ndim != 1:
            return None
        J = self.attention_at(t).angular_jacobian_from_differences(
            self.differences(y), self.weights
        )
        np.fill_diagonal(J, 0.0)
        n = y.size
        right = np.cumsum(J[:, ::-1], axis=1)[:, ::-1]  # sum_{j >= m} J_ij
        # sum_{j < m} J_ij
        left = np.concatenate([np.zeros((n, 1)), np.cumsum(J, axis=1)[:, :-1]], axis=1)
        below = np.arange(n)[:, None] < np.arange(n)[None, :]  # i < m
        JT = np.where(below, right, -left)
        JT[:, 0] = 0.0  # rotations: exactly no force
        return np.concatenate([JT[:1], np.diff(JT, axis=0)], axis=0)

    def noise(self, t: float, y: np.ndarray, dt: float, rng: np.random.Generator) -> np.ndarray:
        xi = self.noise_scale(dt) * rng.standard_normal(y.shape)
        return np.concatenate([xi[..., :1], np.diff(xi, axis=-1)], axis=-1)

    def measure(self, y: np.ndarray) -> Atoms:
        th = np.take_along_axis(self.angles(y), self.inverse, axis=-1)
        return Atoms._trusted(np.stack([np.cos(th), np.sin(th)], axis=-1), self.user_weights)

    def snapshot(self, t: float, y: np.ndarray, known: dict[str, np.ndarray] | None = None) -> dict:
        mu = self.measure(y)
        out = {
            "gaps": (self._batch + ("particle",), np.array(y, copy=True)),
            "angles": (
                self._batch + ("particle",),
                np.arctan2(mu.points[..., 1], mu.points[..., 0]),
            ),
            "points": (self._batch + ("particle", "coord"), mu.points),
        }
        out.update(self.diagnostic_variables(mu, t, known=known))
        return out

    def static(self) -> dict:
        return {
            "weights": (self._batch + ("particle",), self.user_weights),
            "order": (self._batch + ("particle",), self.order),
        }

    def config(self) -> dict[str, Any]:
        return {**super().config(), "coordinates": "gaps"}
