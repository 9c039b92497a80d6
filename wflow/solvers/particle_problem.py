r"""The particle problem: the finite-N system :math:`\dot x_i = v[\mu_N](x_i)`, :math:`\mu_N = \sum_j w_j\delta_{x_j}`,
as the *what* of the solver contract, in Cartesian coordinates (:class:`ParticleProblem`) or in the span
of the initial tokens (:class:`SpanProblem`); :func:`wflow.simulate` builds them.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..diagnostics import (
    count_clusters,
    effective_clusters,
    effective_clusters_from_log_sums,
    kernel_beta,
    order_parameter,
    pair_fraction,
)
from ..errors import WflowError, check_positive, short_repr
from ..measure import Atoms
from ..models import FusedAttention, Model
from . import fused
from .base import Problem, read_only
from .steppers import project_to_sphere

__all__ = [
    "ParticleProblem",
    "SpanProblem",
    "batch_dims",
    "DIAGNOSTICS",
    "KNOWN_DIAGNOSTICS",
    "PAIR_COSINE",
]

log = logging.getLogger(__name__)

#: the diagnostics :func:`simulate` saves by default (energies only for gradient models)
DIAGNOSTICS = ("energy", "log_energy", "order_parameter", "n_eff", "n_clusters")
#: every diagnostic :func:`simulate` knows: ``pair_fraction`` is the GLPR phase diagram's observable, the
#: fraction of token pairs with inner product above 0.999 (:func:`wflow.diagnostics.pair_fraction`)
KNOWN_DIAGNOSTICS = (*DIAGNOSTICS, "pair_fraction")
#: the cosine of ``pair_fraction``
PAIR_COSINE = 0.999


def batch_dims(batch_shape: Sequence[int]) -> tuple[str, ...]:
    """Dimension names of the batch axes: ``()``, ``("system",)`` or ``("system_0", "system_1", ...)``."""
    if len(batch_shape) == 0:
        return ()
    if len(batch_shape) == 1:
        return ("system",)
    return tuple(f"system_{i}" for i in range(len(batch_shape)))


class ParticleProblem(Problem):
    r"""Points on :math:`S^{d-1}` moved by ``model.velocity`` (with noise when ``kappa`` is given).

    The state is the array of points ``(..., n + m, d)``: the ``n`` atoms carrying the weights, then ``m``
    passive tracers.  The field is extended off the sphere by zero-homogeneity, :math:`v(x) = v(x/|x|)`,
    so Runge--Kutta plus projection keeps its order (Hairer--Lubich--Wanner, GNI IV.4).

    Parameters
    ----------
    model : Model
    weights : ndarray, shape (..., n)
    d : int
    kappa : float, optional
        Noise :math:`\sqrt{2/\kappa}\,dW` (tangent), diffusion :math:`\kappa^{-1}\Delta_S` in the limit.
    backend : str
        Kernel-sum backend.
    diagnostics : sequence of str
        Saved with each snapshot: ``energy`` and ``log_energy`` (gradient models only; beyond
        :math:`\beta \approx 709` ``energy`` overflows to NaN, ``log_energy`` stays finite),
        ``order_parameter`` :math:`|\sum_i w_i x_i|`, ``n_eff`` the effective number of clusters at the
        model's attention :math:`\beta` (:func:`wflow.diagnostics.effective_clusters`), ``n_clusters``
        (single linkage at ``cluster_threshold``); user functions ``name -> f(mu)`` in ``extra_diagnostics``.

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.solvers.particles import ParticleProblem
    >>> x = wflow.sphere.uniform(6, 3, seed=0)
    >>> problem = ParticleProblem(wflow.USA(1.0), np.full(6, 1 / 6), 3, backend="numpy")
    >>> v = problem.rhs(0.0, x)
    >>> v.shape, bool(np.allclose(v, wflow.USA(1.0).velocity(x, wflow.Atoms(x), backend="numpy")))
    ((6, 3), True)
    >>> sorted(problem.snapshot(0.0, x))
    ['energy', 'log_energy', 'n_clusters', 'n_eff', 'order_parameter', 'points']
    """

    kind = "particles"
    #: whether the state is the tokens (or their span coordinates), which the fused step takes
    _fusable = True

    def __init__(
        self,
        model: Model,
        weights: np.ndarray,
        d: int,
        *,
        kappa: float | None = None,
        backend: str = "auto",
        diagnostics: Sequence[str] = DIAGNOSTICS,
        cluster_threshold: float = 0.1,
        extra_diagnostics: dict[str, Callable[[Atoms], Any]] | None = None,
        n_tracers: int = 0,
    ):
        super().__init__()
        if not isinstance(model, Model):
            raise TypeError(
                f"model must be a wflow Model (SA, USA, Perceptron, ...), got {short_repr(model)}"
            )
        model.check_dimension(d)
        self.model = model
        self.weights = weights
        self.n = weights.shape[-1]
        self.d = d
        self.kappa = None if kappa is None else check_positive(kappa, "kappa")
        self.backend = backend
        if isinstance(diagnostics, str) or not all(isinstance(k, str) for k in diagnostics):
            raise TypeError(
                f"diagnostics must be a sequence of names from {KNOWN_DIAGNOSTICS}, got "
                f"{short_repr(diagnostics)}"
            )
        bad = [k for k in diagnostics if k not in KNOWN_DIAGNOSTICS]
        if bad:
            raise ValueError(
                f"diagnostics must be names from {KNOWN_DIAGNOSTICS}, got {bad} "
                f"(save functions of the measure with SaveAt(fn={{name: f}}))"
            )
        self.diagnostics = tuple(diagnostics)
        self.cluster_threshold = check_positive(cluster_threshold, "cluster_threshold")
        self.extra = dict(extra_diagnostics or {})
        for name, f in self.extra.items():
            if name in KNOWN_DIAGNOSTICS or name in self.state_variables:
                raise ValueError(
                    f"SaveAt: fn[{name!r}] would replace wflow's own variable {name!r}; choose another name"
                )
            if not callable(f):
                raise TypeError(
                    f"extra_diagnostics[{name!r}] must be callable f(mu), got {short_repr(f)}"
                )
        self.n_tracers = int(n_tracers)
        self._batch = batch_dims(weights.shape[:-1])
        #: free space: tokens x = r theta in R^d (normalization schemes with radii), no projection
        self.free = model.space == "free"
        #: the cosine of the ``pair_fraction`` diagnostic
        self.pair_cosine = PAIR_COSINE

    def model_at(self, t: float) -> Model:
        """The model acting at time ``t``; inside a step, the piece (layer) the step lies in (:meth:`piece_time`)."""
        if not self.model.time_dependent:
            return self.model
        return self.model.at(t, piece=self.piece_time(t))

    def breakpoints(self, t0: float, t_end: float) -> np.ndarray:
        return self.model.breakpoints(t0, t_end)

    @property
    def autonomous(self) -> bool:
        return not self.model.time_dependent

    # -- the field ---------------------------------------------------------------
    def rhs(self, t: float, y: np.ndarray) -> np.ndarray:
        # on the sphere the field is extended off it by zero-homogeneity (module docstring of steppers);
        # in free space the model sees the tokens with their radii and the measure of their directions
        theta = project_to_sphere(y)
        self.evaluations += 1
        mu = Atoms._trusted(theta[..., : self.n, :], self.weights)
        return self.model_at(t).velocity(y if self.free else theta, mu, backend=self.backend)

    def fused_spec(self, t: float, y: np.ndarray) -> FusedAttention | None:
        """What the model at ``t`` says of fusing its step (:meth:`~wflow.models.Model.fused_attention`) when the
        Euler step from ``y`` can be fused (:class:`~wflow.solvers.fused.FusedEuler`: on the sphere, no noise or
        tracers, tiny systems, the numba kernels), else ``None``."""
        if (
            not self._fusable
            or self.free
            or self.n_tracers
            or self.kappa is not None
            or self.backend not in ("auto", "numba")
            or self.n > fused.MAX_TOKENS
            or y.dtype not in (np.float32, np.float64)
        ):
            return None
        return self.model_at(t).fused_attention(self.n)

    def jacobian(self, t: float, y: np.ndarray) -> np.ndarray | None:
        r"""The exact Jacobian of :meth:`rhs`, shape ``(n r, n r)``, for one system on the sphere whose model
        offers one (``model.sphere_jacobian``); else ``None`` (implicit solvers then difference the field).
        Zero-homogeneity, :math:`v(y) = v(y/|y|)`, puts :math:`P_{\theta_k}/|y_k|` on the right of each block.
        """
        model = self.model_at(t)
        if (
            y.ndim != 2
            or self.free
            or self.n_tracers
            or self.kappa is not None
            or not hasattr(model, "sphere_jacobian")
        ):
            return None
        theta = project_to_sphere(y)
        try:
            _, dv = model.sphere_jacobian(theta, self.weights)
        except ValueError:  # Q, K, V not of the form the exact Jacobian covers
            return None
        P = (np.eye(y.shape[-1]) - theta[:, :, None] * theta[:, None, :]) / np.linalg.norm(
            y, axis=-1
        )[:, None, None]
        J = np.matmul(dv, P[None])  # (i, k, l, q) @ P_k: the chain rule through theta = y / |y|
        n, d = y.shape
        return J.transpose(0, 2, 1, 3).reshape(n * d, n * d)

    def average(self, t: float, y: np.ndarray) -> np.ndarray:
        r"""The attention output before projection, ``model.average`` (tokens on the sphere): what the
        published discrete scheme :math:`x \leftarrow (x + \eta A x)/|x + \eta A x|` adds."""
        if self.free or not hasattr(self.model_at(t), "average"):
            raise TypeError(f"{self.model!r} has no attention average on the sphere")
        theta = project_to_sphere(y)
        self.evaluations += 1
        mu = Atoms._trusted(theta[..., : self.n, :], self.weights)
        model: Any = self.model_at(t)  # (attention: checked above)
        return model.average(theta, mu, backend=self.backend)

    def retract(self, y: np.ndarray) -> np.ndarray:
        return y if self.free else project_to_sphere(y)

    @property
    def stochastic(self) -> bool:
        return self.kappa is not None

    def noise(self, t: float, y: np.ndarray, dt: float, rng: np.random.Generator) -> np.ndarray:
        r"""Tangent noise on the sphere; isotropic :math:`\sqrt{2/\kappa}\,dW` in free space."""
        xi = rng.standard_normal(y.shape)
        if not self.free:
            xi -= np.einsum("...i,...i->...", y, xi)[..., None] * y
        return math.sqrt(2 * dt / float(self.kappa or math.inf)) * xi  # (stochastic: kappa is set)

    # -- what is saved -----------------------------------------------------------
    def measure(self, y: np.ndarray) -> Atoms:
        """The measure of the directions (the atoms carrying the weights)."""
        x = y[..., : self.n, :]
        return Atoms._trusted(project_to_sphere(x) if self.free else x, self.weights)

    def compute_diagnostics(
        self,
        mu: Atoms,
        t: float = 0.0,
        mu_extra: Atoms | None = None,
        known: dict[str, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        """The built-in diagnostics of ``mu`` and the user's of ``mu_extra`` (default ``mu``); ``known``: what the
        caller has of ``mu`` already (``pair_fraction``, ``energy_sums``, ``n_clusters``, ``means``)."""
        known = known or {}
        out: dict[str, np.ndarray] = {}
        model = self.model_at(t)
        gradient = model.is_gradient
        log_e = None
        if gradient and ("energy" in self.diagnostics or "log_energy" in self.diagnostics):
            energies, log_e = self._energies(model, mu, known.get("energy_sums"))
            out.update(energies)
        for name in self.diagnostics:
            if name == "n_eff":
                n_eff = self._n_eff(model, mu, known.get("energy_sums"), log_e)
                if n_eff is not None:
                    out[name] = n_eff
            if name == "order_parameter":
                means = known.get("means")  # (the barycentre, from a fused step)
                value = order_parameter(mu) if means is None else np.linalg.norm(means, axis=-1)
                out[name] = np.asarray(value, dtype=np.float64)
            elif name == "n_clusters":
                value = known[name] if name in known else count_clusters(mu, self.cluster_threshold)
                out[name] = np.asarray(value, dtype=np.int64)
            elif name == "pair_fraction":
                value = known[name] if name in known else pair_fraction(mu.points, PAIR_COSINE)
                out[name] = np.asarray(value, dtype=np.float64)
        for name, f in self.extra.items():
            out[name] = np.asarray(f(mu if mu_extra is None else mu_extra))
        return out

    def _n_eff(
        self, model: Any, mu: Atoms, energy_sums: np.ndarray | None, log_energy: np.ndarray | None
    ) -> np.ndarray | None:
        r""":math:`N_{\mathrm{eff}}` at the model's attention beta (None without attention), from a fused step's
        double sums, from :math:`\log E_\beta` of plain attention, or from a kernel sum of its own."""
        beta = kernel_beta(model, self.n)
        if beta is None:
            return None
        if beta > 0 and energy_sums is not None:
            return effective_clusters_from_log_sums(energy_sums, beta)
        if (
            beta > 0
            and log_energy is not None
            and hasattr(model, "offset")
            and model.plain_attention()
            and np.all(np.isfinite(log_energy))
        ):
            log_sums = log_energy + math.log(2 * beta) + model.offset(beta)
            return effective_clusters_from_log_sums(log_sums, beta)
        return np.asarray(
            effective_clusters(mu.points, mu.weights, beta, backend=self.backend), dtype=np.float64
        )

    def _log_energy(
        self, model: Any, mu: Atoms, energy_sums: np.ndarray | None
    ) -> np.ndarray | None:
        """The log-scale energy, from a fused step's double sums or the model's ``log_energy`` (None without)."""
        if energy_sums is not None:  # SA.log_energy's formula on the step's sums
            return model.fused_attention(self.n).log_energy(
                np.asarray(energy_sums, dtype=np.float64)
            )
        log_e = getattr(model, "log_energy", None)
        return None if log_e is None else np.asarray(log_e(mu, backend=self.backend), np.float64)

    def _energies(
        self, model: Any, mu: Atoms, energy_sums: np.ndarray | None = None
    ) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
        """``energy`` and ``log_energy`` (from :meth:`_log_energy` where it is formed), and the log-scale energy
        itself (None where it is not formed)."""
        out = {}
        le = formed = self._log_energy(model, mu, energy_sums)
        if le is not None:
            with np.errstate(over="ignore"):
                e = model.sign * np.exp(le)
            e = np.where(np.isfinite(e), e, np.nan)  # beyond float64: see log_energy
        else:
            try:
                e = np.asarray(model.energy(mu, backend=self.backend), dtype=np.float64)
            except WflowError:  # e.g. USA energy beyond float range at very large beta
                e = np.full(mu.batch_shape, np.nan)
            with np.errstate(divide="ignore"):
                le = np.log(np.abs(e))
        if "energy" in self.diagnostics:
            out["energy"] = e
        if "log_energy" in self.diagnostics:
            out["log_energy"] = le
        return out, formed

    #: the snapshot variables that hold the state (:class:`~wflow.solvers.saveat.SaveAt` ``points=False``)
    state_variables = frozenset(
        {"points", "positions", "radii", "tracers", "span", "angles", "gaps"}
    )

    def points_shape(self, y: np.ndarray) -> tuple[int, ...] | None:
        # (a state of angles or gaps on the circle is not the points: _fusable says whether it is)
        return (*y.shape[:-2], self.n, self.d) if self._fusable and not self.free else None

    def saved_points(self, data: dict) -> tuple[tuple[str, ...], np.ndarray]:
        return data["points"]

    def snapshot(self, t: float, y: np.ndarray, known: dict[str, np.ndarray] | None = None) -> dict:
        """The saved variables of state ``y`` (read-only views) and the diagnostics; ``known``: those the step
        formed (:attr:`~wflow.solvers.contract.StepResult.diagnostics`)."""
        dims = self._batch + ("particle", "coord")
        y = read_only(y)
        x = y[..., : self.n, :]
        if self.free:  # the exact state (resume) and the radii; directions are positions / radii
            out = {
                "positions": (dims, x),
                "radii": (self._batch + ("particle",), np.sqrt(np.einsum("...i,...i->...", x, x))),
            }
        else:
            out = {"points": (dims, x)}
        if self.n_tracers:
            out["tracers"] = (self._batch + ("tracer", "coord"), y[..., self.n :, :])
        out.update(self.diagnostic_variables(self.measure(y), t, known=self._known(known)))
        return out

    def _known(self, known: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
        """``known`` and what needs no pass at all: the pair fraction of systems of one token (no pairs)."""
        known = dict(known or {})
        if "pair_fraction" in self.diagnostics and self.n < 2:
            known["pair_fraction"] = np.full(self.weights.shape[:-1], np.nan)
        return known

    def diagnostic_variables(
        self,
        mu: Atoms,
        t: float,
        mu_extra: Atoms | None = None,
        known: dict[str, np.ndarray] | None = None,
    ) -> dict:
        """:meth:`compute_diagnostics` as saved variables: ``name -> (dims, value)``, the batch axes first."""
        nb = len(self._batch)
        return {
            name: (self._batch + tuple(f"{name}_{i}" for i in range(v.ndim - nb)), v)
            for name, v in self.compute_diagnostics(mu, t, mu_extra, known).items()
        }

    def static(self) -> dict:
        return {"weights": (self._batch + ("particle",), self.weights)}

    def config(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "model": self.model.to_dict(),
            "kappa": self.kappa,
            "backend": self.backend,
            "n": self.n,
            "d": self.d,
            "batch_shape": list(self.weights.shape[:-1]),
            "n_tracers": self.n_tracers,
            "diagnostics": list(self.diagnostics),
            "cluster_threshold": self.cluster_threshold,
            "n_eff_beta": kernel_beta(self.model, self.n) if "n_eff" in self.diagnostics else None,
            "space": self.model.space,
        }


class SpanProblem(ParticleProblem):
    r"""SA/USA with :math:`Q = K = V = I` in the span of the initial tokens: the state is ``y`` of shape
    ``(..., n, n)``, the tokens :math:`x = yU` for an orthonormal basis ``U`` (``(..., n, d)``) of the span of
    the initial tokens (:func:`wflow.kernels.small.span_coordinates`).

    Exact: every velocity is a combination of the tokens and the flow commutes with orthogonal maps, so
    the coordinates evolve by the same model in dimension ``n``, at :math:`n^3` instead of :math:`n^2 d`
    a step.  Built-in diagnostics are computed from ``y``, user diagnostics see :math:`x = yU`.  Saved:
    ``span`` ``(..., n, n)`` (the state) and, once, ``span_basis`` ``(..., n, d)``.

    Examples
    --------
    Six tokens in d = 40 evolve in 6 numbers each, and equal the full-dimensional run:

    >>> import numpy as np, wflow
    >>> x0 = wflow.sphere.uniform(6, 40, seed=0)
    >>> kw = dict(method="rk4", dt=0.05, save_at=[0.0, 1.0], backend="numpy")
    >>> span = wflow.simulate(wflow.SA(3.0), x0, 1.0, coordinates="span", **kw)
    >>> full = wflow.simulate(wflow.SA(3.0), x0, 1.0, **kw)
    >>> span.data["span"][1].shape, bool(np.allclose(span.points, full.points, atol=1e-12))
    ((2, 6, 6), True)
    """

    def __init__(self, model: Model, weights: np.ndarray, basis: np.ndarray, **kw: Any):
        if (
            kw.get("n_tracers")
            or model.space != "sphere"
            or not (hasattr(model, "plain_attention") and model.plain_attention())
        ):
            raise ValueError(
                f"coordinates='span' needs SA or USA with Q = K = V = I on the sphere and no tracers, "
                f"got {model!r}"
            )
        super().__init__(model, weights, basis.shape[-2], **kw)
        self.basis = basis
        self.d_full = basis.shape[-1]

    def full(self, y: np.ndarray) -> np.ndarray:
        """The tokens :math:`x = yU`, shape ``(..., n, d)``."""
        return np.matmul(y, self.basis)

    def measure(self, y: np.ndarray) -> Atoms:
        """The measure of the tokens :math:`x = yU` (in dimension d)."""
        return Atoms._trusted(self.full(y), self.weights)

    def points_shape(self, y: np.ndarray) -> tuple[int, ...] | None:
        return (*y.shape[:-2], self.n, self.d_full)

    def saved_points(self, data: dict) -> tuple[tuple[str, ...], np.ndarray]:
        return self._batch + ("particle", "coord"), self.full(data["span"][1])

    def snapshot(self, t: float, y: np.ndarray, known: dict[str, np.ndarray] | None = None) -> dict:
        y = read_only(y)
        mu_y = Atoms._trusted(y, self.weights)
        out = {"span": (self._batch + ("particle", "span_coord"), y)}
        mu_x = Atoms._trusted(self.full(y), self.weights) if self.extra else None
        out.update(self.diagnostic_variables(mu_y, t, mu_x, self._known(known)))
        return out

    def static(self) -> dict:
        return {
            **super().static(),
            "span_basis": (self._batch + ("span_coord", "coord"), self.basis),
        }

    def config(self) -> dict[str, Any]:
        return {**super().config(), "d": self.d_full, "coordinates": "span"}
