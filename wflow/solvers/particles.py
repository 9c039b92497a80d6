r"""Particle solver: the finite-N system :math:`\dot x_i = v[\mu_N](x_i)`, :math:`\mu_N = \sum_j w_j\delta_{x_j}`.

:class:`ParticleProblem` is the *what* of the solver contract (:mod:`wflow.solvers.base`):
points on the sphere, the model's velocity, the projection after each step, the noise
:math:`\sqrt{2/\kappa}\,P_x\,dW` when ``kappa`` is given (mean-field limit: diffusion
:math:`\kappa^{-1}\Delta_S\mu`), passive tracers, and the diagnostics saved with each
snapshot.  :func:`simulate` is the front door: it builds the problem and calls the one
driver, :func:`wflow.solvers.base.integrate`.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..diagnostics import count_clusters, order_parameter, pair_fraction
from ..errors import WflowError, check_positive, short_repr
from ..measure import Atoms, as_atoms
from ..models import FusedAttention, Model
from . import fused
from .base import (
    Problem,
    Result,
    Tracker,
    check_save_at,
    get_solver,
    integrate,
    read_only,
    register_kind,
)
from .steppers import project_to_sphere
from .trackers import Callback, ProgressBar

__all__ = [
    "simulate",
    "Trajectory",
    "ParticleProblem",
    "CircleAngleProblem",
    "CircleGapProblem",
    "SpanProblem",
    "default_dt",
    "DIAGNOSTICS",
]

log = logging.getLogger(__name__)

#: the diagnostics :func:`simulate` saves by default (energies only for gradient models)
DIAGNOSTICS = ("energy", "log_energy", "order_parameter", "n_clusters")
#: every diagnostic :func:`simulate` knows: ``pair_fraction`` is the GLPR phase diagram's observable, the
#: fraction of token pairs with inner product above 0.999 (:func:`wflow.diagnostics.pair_fraction`)
_KNOWN_DIAGNOSTICS = ("energy", "log_energy", "order_parameter", "n_clusters", "pair_fraction")
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

    The state is the array of points ``(..., n + m, d)``: the ``n`` atoms carrying the
    weights, then ``m`` passive tracers moved by the same field.  The field is extended off
    the sphere by zero-homogeneity, :math:`v(x) = v(x/|x|)`: every point is normalized before
    the velocity is evaluated, so Runge--Kutta plus projection keeps its order
    (Hairer--Lubich--Wanner, GNI IV.4) and kernel sums always see points on the sphere.

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
        Saved with each snapshot: ``energy`` and ``log_energy`` (gradient models only: not
        recorded for a model that is not a gradient flow; ``log_energy`` is
        :math:`\log E_\beta`, finite at any beta, where ``energy`` overflows float64 beyond
        :math:`\beta \approx 709` and is then NaN), ``order_parameter`` :math:`|\sum_i w_i x_i|`,
        ``n_clusters`` (single linkage at ``cluster_threshold``); user functions
        ``name -> f(mu) -> array (batch)`` in ``extra_diagnostics``.

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
    ['energy', 'log_energy', 'n_clusters', 'order_parameter', 'points']
    """

    kind = "particles"
    #: whether the state is the tokens themselves (or their span coordinates), which the fused step takes
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
                f"diagnostics must be a sequence of names from {_KNOWN_DIAGNOSTICS}, got "
                f"{short_repr(diagnostics)}"
            )
        bad = [k for k in diagnostics if k not in _KNOWN_DIAGNOSTICS]
        if bad:
            raise ValueError(
                f"diagnostics must be names from {_KNOWN_DIAGNOSTICS}, got {bad} "
                f"(pass functions in extra_diagnostics)"
            )
        self.diagnostics = tuple(diagnostics)
        self.cluster_threshold = check_positive(cluster_threshold, "cluster_threshold")
        self.extra = dict(extra_diagnostics or {})
        for name, f in self.extra.items():
            if not callable(f):
                raise TypeError(
                    f"extra_diagnostics[{name!r}] must be callable f(mu), got {short_repr(f)}"
                )
        self.n_tracers = int(n_tracers)
        self._batch = batch_dims(weights.shape[:-1])
        #: free space: tokens x = r theta in R^d (normalization schemes with radii), no projection
        self.free = model.space == "free"
        #: (dt, projected) of the last fused Euler step, and the step from a saved state taken ahead
        #: (:meth:`_step_ahead`): (y, t, dt, projected, the new state, whether it is finite)
        self._last_fused: tuple[float, bool] | None = None
        self._ahead: tuple | None = None
        #: the last state a fused step returned (a new array nothing else holds or writes: a snapshot
        #: takes a read-only view of it, not a copy), and whether the step found it finite
        self._fused_out: np.ndarray | None = None
        self._fused_out_finite = False

    def model_at(self, t: float) -> Model:
        return self.model.at(t) if self.model.time_dependent else self.model

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
        self._last_fused = (
            None  # the solver does not take fused steps: no step from a save is taken ahead
        )
        mu = Atoms._trusted(theta[..., : self.n, :], self.weights)
        return self.model_at(t).velocity(y if self.free else theta, mu, backend=self.backend)

    def euler_step(
        self, t: float, y: np.ndarray, dt: float, projected: bool = True
    ) -> np.ndarray | None:
        r"""The whole Euler step fused (:func:`wflow.solvers.fused.sa_euler_step`), or ``None``: projected
        Euler, or with ``projected=False`` GLPR's scheme (``method="euler-average"``).

        Offered when the model says its step can be fused (:meth:`~wflow.models.Model.fused_attention`: SA
        with :math:`Q = K = V = I`), on the sphere without noise or tracers, for systems of at most
        :data:`~wflow.solvers.fused.MAX_TOKENS` tokens and the ``auto`` or ``numba`` backend: one
        compiled pass per system (Gram matrix, softmax, average, projection, retraction) instead of
        eight passes over the batch; equal to ``retract(y + dt * rhs(t, y))`` (or to
        ``retract(y + dt * average(t, y))``) to rounding (tested to 1e-14).  When the step from ``y``
        was taken ahead for the diagnostics of a saved state (:meth:`_step_ahead`), it is that
        step, bit for bit.
        """
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] is y and ahead[1:4] == (t, dt, projected):
            self.evaluations += 1
            self._fused_out, self._fused_out_finite = ahead[4:6]
            return ahead[4]
        spec = self._fused_spec(t, y)
        if spec is None:
            return None
        self._last_fused = (dt, projected)
        self.evaluations += 1
        st = fused.fused_step(
            y,
            self.weights,
            spec.beta,
            dt,
            projected=projected,
            log_weights=self._step_log_weights,
        )
        self._fused_out, self._fused_out_finite = st.points, st.finite
        return st.points

    def known_finite(self, y: np.ndarray) -> bool:
        """Whether ``y`` is the state the last fused step returned and that step found it finite (its
        compiled pass sees every row's norm), so that the driver need not scan it."""
        return y is self._fused_out and self._fused_out_finite

    def _fused_spec(self, t: float, y: np.ndarray) -> FusedAttention | None:
        """What the model at ``t`` says of fusing its step (:meth:`~wflow.models.Model.fused_attention`) when
        :meth:`euler_step` can fuse the step from ``y`` (on the sphere, no noise or tracers, tiny systems, the
        numba kernels), else ``None``."""
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

    def _step_ahead(self, t: float, y: np.ndarray, want: set[str]) -> dict[str, np.ndarray]:
        r"""What a saved state ``y`` needs of the diagnostics ``want`` (``pair_fraction``, ``energy``,
        ``n_clusters``, ``order_parameter``) read off the step from it.

        In a run of fused Euler steps (:meth:`euler_step`) the save-time pair count, energy and cluster
        count each need a second Gram matrix per system (or the distances), each as costly as a third of
        a step (n = 32, r = 32).  Instead the step from ``y`` is taken now, with the last step's size and
        scheme, counting the pairs and the clusters on the inner products it forms, summing the
        energy's double sum from its row sums and the barycentre from the points it reads
        (:func:`wflow.solvers.fused.fused_step`); :meth:`euler_step` returns it when the driver asks
        for that same step (same ``y``, ``t``, ``dt`` and scheme), and takes the step afresh otherwise
        (after the last save: one step wasted).  The energy at beta != 0; for float32 states everything is
        read off the step only when its logits are float64 (the float32 rule of
        :func:`wflow.solvers.fused.sa_euler_step`: at beta = 5 from r = 7 on; they are then the float64
        numbers of the float32 points, and the pairs are :func:`wflow.diagnostics.pair_fraction`'s
        exactly), else the pairs are counted on their own float64 products;
        ``{}`` when the step is not fused, or when only the order parameter is asked (the step from the
        last save is not used: a step would cost more than the barycentre).  Returns ``pair_fraction``,
        ``energy_sums``, ``n_clusters``, ``means`` for those asked.
        """
        if self._last_fused is None:
            return {}
        spec = self._fused_spec(t, y)
        if spec is None:
            return {}
        beta = spec.beta
        pairs = "pair_fraction" in want
        energy = "energy" in want and beta != 0  # (fused attention is a gradient flow)
        clusters = "n_clusters" in want
        if not (
            pairs or energy or clusters
        ):  # (the barycentre alone costs less than a step taken in vain)
            return {}
        means = "order_parameter" in want
        dt, projected = self._last_fused
        st = fused.fused_step(
            y,
            self.weights,
            beta,
            dt,
            projected=projected,
            log_weights=self._step_log_weights,
            count_pairs_above=PAIR_COSINE if pairs else None,
            energy_sums=energy,
            cluster_threshold=self.cluster_threshold if clusters else None,
            means=means,
            strict=False,
        )
        self._ahead = (y, t, dt, projected, st.points, st.finite)
        out = {}
        if pairs:
            out["pair_fraction"] = st.counts / (self.n * (self.n - 1))
        for key, value in (
            ("energy_sums", st.energy_sums),
            ("n_clusters", st.n_clusters),
            ("means", st.means),
        ):
            if (
                value is not None
            ):  # (None: float32 logits, too coarse; the save computes it on its own)
                out[key] = value
        return out

    @functools.cached_property
    def _step_log_weights(self) -> np.ndarray:
        """The fused step's log-weights, formed once (the weights of a run do not change)."""
        return fused.step_log_weights(self.weights)

    def jacobian(self, t: float, y: np.ndarray) -> np.ndarray | None:
        r"""The exact Jacobian of :meth:`rhs` for one system on the sphere whose model offers one
        (``model.sphere_jacobian``: SA/USA with :math:`Q = K = I`, :math:`V = \pm I`, and the sphere schemes of
        :class:`~wflow.schemes.Normalized`), shape ``(n r, n r)``; else ``None`` (implicit solvers then
        difference the field).  The field is extended off the sphere by zero-homogeneity,
        :math:`v(y) = v(y/|y|)`, hence the factor :math:`P_{\theta_k}/|y_k|` on the right of each block.

        The matrix is dense, :math:`(nr)^2` numbers: for ``method="ros2"`` on small systems, such as
        tokens in span coordinates (``coordinates="span"``, r = n).
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
        self._last_fused = None
        mu = Atoms._trusted(theta[..., : self.n, :], self.weights)
        return self.model_at(t).average(theta, mu, backend=self.backend)

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
        return math.sqrt(2 * dt / self.kappa) * xi

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
        caller has of ``mu`` already (:meth:`_step_ahead`: ``pair_fraction``, ``energy_sums``, ``n_clusters``,
        ``means``)."""
        known = known or {}
        out: dict[str, np.ndarray] = {}
        model = self.model_at(t)
        gradient = model.is_gradient
        if gradient and ("energy" in self.diagnostics or "log_energy" in self.diagnostics):
            out.update(self._energies(model, mu, known.get("energy_sums")))
        for name in self.diagnostics:
            if name == "order_parameter":
                out[name] = np.asarray(
                    np.linalg.norm(known["means"], axis=-1)
                    if "means" in known
                    else order_parameter(mu),
                    dtype=np.float64,
                )
            elif name == "n_clusters":
                out[name] = np.asarray(
                    known["n_clusters"]
                    if "n_clusters" in known
                    else count_clusters(mu, self.cluster_threshold),
                    dtype=np.int64,
                )
            elif name == "pair_fraction":
                out[name] = np.asarray(
                    known["pair_fraction"]
                    if "pair_fraction" in known
                    else pair_fraction(mu.points, PAIR_COSINE),
                    dtype=np.float64,
                )
        for name, f in self.extra.items():
            out[name] = np.asarray(f(mu if mu_extra is None else mu_extra))
        return out

    def _energies(
        self, model: Model, mu: Atoms, energy_sums: np.ndarray | None = None
    ) -> dict[str, np.ndarray]:
        """``energy`` and ``log_energy`` from one kernel sum where the model has a log-scale energy, or from the
        double sums ``log sum_i w_i sum_j w_j e^(beta <x_i, x_j>)`` of a fused step (:meth:`_step_ahead`)."""
        out = {}
        log_e = getattr(model, "log_energy", None)
        le = None
        if energy_sums is not None:  # SA.log_energy's formula on the step's sums
            le = model.fused_attention(self.n).log_energy(np.asarray(energy_sums, dtype=np.float64))
        elif log_e is not None:
            le = np.asarray(log_e(mu, backend=self.backend), dtype=np.float64)
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
        return out

    def snapshot(self, t: float, y: np.ndarray) -> dict:
        dims = self._batch + ("particle", "coord")
        if self.free:  # the exact state (resume) and the radii; directions are positions / radii
            out = {
                "positions": (dims, np.array(y[..., : self.n, :], copy=True)),
                "radii": (
                    self._batch + ("particle",),
                    np.sqrt(np.einsum("...i,...i->...", y[..., : self.n, :], y[..., : self.n, :])),
                ),
            }
        elif (
            y is self._fused_out
        ):  # a fused step's output: no one writes it, a read-only view will do
            out = {"points": (dims, read_only(y))}
        else:
            out = {"points": (dims, np.array(y[..., : self.n, :], copy=True))}
        if self.n_tracers:
            out["tracers"] = (
                self._batch + ("tracer", "coord"),
                np.array(y[..., self.n :, :], copy=True),
            )
        # the diagnostics (the user's among them) see the state read-only: it may be the saved points themselves
        out.update(
            self.diagnostic_variables(
                self.measure(read_only(y)), t, known=self._known_at_save(t, y)
            )
        )
        return out

    def _known_at_save(self, t: float, y: np.ndarray) -> dict[str, np.ndarray]:
        """The diagnostics of a saved state known without a pass of their own (:meth:`_step_ahead`)."""
        want = {"energy" if name == "log_energy" else name for name in self.diagnostics}
        known = {}
        if (
            "pair_fraction" in want and self.n < 2
        ):  # no pairs (and span coordinates of one token have one coordinate)
            known["pair_fraction"] = np.full(self.weights.shape[:-1], np.nan)
            want.discard("pair_fraction")
        known.update(self._step_ahead(t, y, want))
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
            "space": self.model.space,
        }


class SpanProblem(ParticleProblem):
    r"""SA/USA with :math:`Q = K = V = I` in the span of the initial tokens: the state is ``y`` of shape
    ``(..., n, n)``, the tokens :math:`x = yU` for an orthonormal basis ``U`` (``(..., n, d)``) of the span of
    the initial tokens (:func:`wflow.kernels.small.span_coordinates`).

    Exact, not an approximation: every velocity :math:`\dot x_i` is a combination of the :math:`x_j`, so
    tokens never leave the span, and the flow commutes with orthogonal maps, so the coordinates evolve by
    the same model in dimension ``n``.  For ``n`` tokens in dimension ``d > n`` a step costs
    :math:`n^3` instead of :math:`n^2 d` per system (4x less at n = 32, d = 128; 32x at d = 1024).
    Built-in diagnostics (energies, order parameter, clusters) depend only on inner products and are
    computed from ``y``; user diagnostics (``extra_diagnostics``) see :math:`x = yU`.  Saved: ``span``
    ``(..., n, n)`` (the state) and, once, ``span_basis`` ``(..., n, d)``: ``n/d`` of the points' size;
    :attr:`Trajectory.points` forms :math:`x = yU` when asked (``span @ span_basis`` in a store).

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

    def snapshot(self, t: float, y: np.ndarray) -> dict:
        mu_y = Atoms._trusted(read_only(y), self.weights)
        out = {
            "span": (
                self._batch + ("particle", "span_coord"),
                read_only(y) if y is self._fused_out else np.array(y, copy=True),
            )
        }
        mu_x = Atoms._trusted(self.full(y), self.weights) if self.extra else None
        out.update(self.diagnostic_variables(mu_y, t, mu_x, self._known_at_save(t, y)))
        return out

    def static(self) -> dict:
        return {
            **super().static(),
            "span_basis": (self._batch + ("span_coord", "coord"), self.basis),
        }

    def config(self) -> dict[str, Any]:
        return {**super().config(), "d": self.d_full, "coordinates": "span"}


class CircleAngleProblem(ParticleProblem):
    r"""Particles on :math:`S^1` in angles: the state is :math:`\theta` of shape ``(..., n)`` and the velocity the
    model's :meth:`~wflow.models.SA.angular_velocity` (Kuramoto form).

    For attention with :math:`Q = K = I`, :math:`V = \pm I`.  Coincident tokens contribute exactly
    zero and forces far below rounding are resolved: the choice for metastable dynamics at large
    beta, where Cartesian coordinates drown the slow inter-cluster forces (:math:`e^{-40}`) in the
    rounding noise of tokens that have merged.  Saved: ``angles`` (the state) and ``points``.

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
        if not hasattr(model, "angular_velocity") or model.gradient_obstruction() is not None:
            raise ValueError(
                f"coordinates='angles' needs attention with Q = K = I and V = +-I on S^1, got {model!r}"
            )

    def rhs(self, t: float, y: np.ndarray) -> np.ndarray:
        self.evaluations += 1
        return self.model_at(t).angular_velocity(y, self.weights)

    def retract(self, y: np.ndarray) -> np.ndarray:
        return y

    def jacobian(self, t: float, y: np.ndarray) -> np.ndarray | None:
        """The exact Jacobian of the angle velocity (one system; implicit solvers use it)."""
        if y.ndim != 1:
            return None
        return self.model_at(t).angular_jacobian(y, self.weights)

    def noise(self, t: float, y: np.ndarray, dt: float, rng: np.random.Generator) -> np.ndarray:
        return math.sqrt(2 * dt / self.kappa) * rng.standard_normal(y.shape)

    def measure(self, y: np.ndarray) -> Atoms:
        return Atoms._trusted(np.stack([np.cos(y), np.sin(y)], axis=-1), self.weights)

    def snapshot(self, t: float, y: np.ndarray) -> dict:
        mu = self.measure(y)
        out = {
            "angles": (self._batch + ("particle",), np.array(y, copy=True)),
            "points": (self._batch + ("particle", "coord"), mu.points),
        }
        out.update(self.diagnostic_variables(mu, t))
        return out

    def _energies(
        self, model: Model, mu: Atoms, energy_sums: np.ndarray | None = None
    ) -> dict[str, np.ndarray]:
        r"""Energies from the angle differences (accurate when tokens have merged): :math:`E = \frac1{2\beta}
        \sum_{ij} w_iw_j e^{\beta - 2\beta\sin^2(\Delta_{ij}/2) - o}`."""
        th = np.arctan2(mu.points[..., 1], mu.points[..., 0])
        beta = model.beta_for(mu.n)
        if beta == 0:
            return super()._energies(model, mu)
        D = th[..., None, :] - th[..., :, None]
        w = mu.weights
        terms = (
            -2.0 * beta * np.sin(0.5 * D) ** 2 + np.log(w)[..., :, None] + np.log(w)[..., None, :]
        )
        top = terms.max(axis=(-1, -2), keepdims=True)
        le = (
            top[..., 0, 0]
            + np.log(np.exp(terms - top).sum(axis=(-1, -2)))
            + beta
            - model.offset(beta)
            - np.log(2 * beta)
        )
        out = {}
        if "energy" in self.diagnostics:
            with np.errstate(over="ignore"):
                e = model.sign * np.exp(le)
            out["energy"] = np.where(np.isfinite(e), e, np.nan)
        if "log_energy" in self.diagnostics:
            out["log_energy"] = le
        return out

    def config(self) -> dict[str, Any]:
        return {**super().config(), "coordinates": "angles"}


class CircleGapProblem(CircleAngleProblem):
    r"""Particles on :math:`S^1` in gap coordinates: the state is :math:`y = (\theta_0, g_1, \dots, g_{n-1})`,
    :math:`\theta_i = \theta_0 + g_1 + \dots + g_i`, with the tokens sorted along the circle and the cut
    placed in the largest initial gap.

    Angle differences are formed as sums of gaps, :math:`\theta_j - \theta_i = g_{i+1} + \dots + g_j`, so a
    gap of 1e-200 between merged tokens keeps its relative accuracy (in angles it is lost below
    :math:`\epsilon|\theta|`).  The Jacobian :math:`T^{-1}J_\theta T` (``T`` the cumulative sum) is formed from
    one-sided partial sums of :math:`J_\theta`'s off-diagonal entries: rotations are not a mode of the gaps,
    and the slow inter-cluster eigenvalues (:math:`e^{-\beta\delta^2/2}`, far below rounding of the
    :math:`O(1)` intra-cluster entries) are not swamped.  This is what lets the implicit ``ros2`` take steps
    of length :math:`t \sim 10^{30}` through every merge of a metastable staircase; in angles the
    rounding of the zero mode stops it near :math:`t \sim 1/\epsilon`.  Saved: ``gaps`` (the state, in
    sorted order), ``angles`` and ``points`` in the caller's order.

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
        f = self.model_at(t).angular_velocity_from_differences(self.differences(y), self.weights)
        return np.concatenate([f[..., :1], np.diff(f, axis=-1)], axis=-1)

    def jacobian(self, t: float, y: np.ndarray) -> np.ndarray | None:
        """:math:`T^{-1}J_\theta T` by one-sided partial sums (no cancellation of the O(1) entries)."""
        if y.ndim != 1:
            return None
        J = self.model_at(t).angular_jacobian_from_differences(self.differences(y), self.weights)
        np.fill_diagonal(J, 0.0)
        n = y.size
        right = np.cumsum(J[:, ::-1], axis=1)[:, ::-1]  # sum_{j >= m} J_ij
        left = np.concatenate(
            [np.zeros((n, 1)), np.cumsum(J, axis=1)[:, :-1]], axis=1
        )  # sum_{j < m} J_ij
        below = np.arange(n)[:, None] < np.arange(n)[None, :]  # i < m
        JT = np.where(below, right, -left)
        JT[:, 0] = 0.0  # rotations: exactly no force
        return np.concatenate([JT[:1], np.diff(JT, axis=0)], axis=0)

    def noise(self, t: float, y: np.ndarray, dt: float, rng: np.random.Generator) -> np.ndarray:
        xi = math.sqrt(2 * dt / self.kappa) * rng.standard_normal(y.shape)
        return np.concatenate([xi[..., :1], np.diff(xi, axis=-1)], axis=-1)

    def measure(self, y: np.ndarray) -> Atoms:
        th = np.take_along_axis(self.angles(y), self.inverse, axis=-1)
        return Atoms._trusted(np.stack([np.cos(th), np.sin(th)], axis=-1), self.user_weights)

    def snapshot(self, t: float, y: np.ndarray) -> dict:
        mu = self.measure(y)
        out = {
            "gaps": (self._batch + ("particle",), np.array(y, copy=True)),
            "angles": (
                self._batch + ("particle",),
                np.arctan2(mu.points[..., 1], mu.points[..., 0]),
            ),
            "points": (self._batch + ("particle", "coord"), mu.points),
        }
        out.update(self.diagnostic_variables(mu, t))
        return out

    def static(self) -> dict:
        return {
            "weights": (self._batch + ("particle",), self.user_weights),
            "order": (self._batch + ("particle",), self.order),
        }

    def config(self) -> dict[str, Any]:
        return {**super().config(), "coordinates": "gaps"}


class Trajectory(Result):
    """Result of :func:`simulate` (a :class:`~wflow.solvers.base.Result` of kind ``particles``).

    Attributes
    ----------
    times : ndarray, shape (k,)
    points : ndarray, shape (k, ..., n, d)
        Positions at the save times.
    weights : ndarray, shape (..., n)
    diagnostics : dict of ndarray, each shape (k, ...)
        ``energy`` and ``log_energy`` (gradient models), ``order_parameter``
        :math:`|\\sum_i w_i x_i|`, ``n_clusters`` at ``config["cluster_threshold"]``.
    tracers : ndarray, shape (k, ..., m, d) or None
    stats : dict
        Cumulative ``steps``, ``rejected`` steps and velocity ``evaluations``, and ``dt_next``, shape (k,).
    config : dict
        Everything needed to repeat the run: model, solver, dt, tolerances, kappa, seed,
        backend, save times, wflow version.
    status, message : int, str
        0 and ``"reached t_end"`` on success; see :class:`~wflow.solvers.base.Result`.

    Examples
    --------
    >>> import numpy as np, wflow
    >>> traj = wflow.simulate(wflow.USA(2.0), wflow.sphere.uniform(16, 3, seed=0), 1.0, dt=0.1, backend="numpy")
    >>> traj.points.shape, traj.weights.shape, traj.tracers
    ((11, 16, 3), (16,), None)
    >>> sorted(traj.diagnostics)
    ['energy', 'log_energy', 'n_clusters', 'order_parameter']
    >>> bool(np.all(np.diff(traj.diagnostics["energy"]) > 0))  # USA ascends its energy
    True
    """

    @property
    def points(self) -> np.ndarray:
        """Positions on the sphere (the directions, for a scheme with radii), shape ``(k, ..., n, d)``."""
        if "points" in self.data:
            return self.data["points"][1]
        if (
            "span" in self.data
        ):  # coordinates="span": x = y U, U the stored basis of the initial span
            return np.matmul(self.data["span"][1], self.static["span_basis"][1])
        x = self.data["positions"][1]
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    @property
    def positions(self) -> np.ndarray:
        """The tokens :math:`x = r\theta` (free space) or the points (sphere), shape ``(k, ..., n, d)``."""
        return self.data["positions"][1] if "positions" in self.data else self.points

    @property
    def radii(self) -> np.ndarray:
        """Token radii :math:`r_i`, shape ``(k, ..., n)`` (all 1 on the sphere)."""
        if "radii" in self.data:
            return self.data["radii"][1]
        return np.ones(self.points.shape[:-1])

    @property
    def weights(self) -> np.ndarray:
        return self.static["weights"][1]

    @property
    def tracers(self) -> np.ndarray | None:
        return self.data["tracers"][1] if "tracers" in self.data else None

    @property
    def diagnostics(self) -> dict[str, np.ndarray]:
        return {
            k: v
            for k, (_, v) in self.data.items()
            if k not in ("points", "positions", "radii", "tracers")
        }

    @property
    def energy(self) -> np.ndarray | None:
        """The ascended energy per save; None when not recorded (the model is not a gradient flow)."""
        return self.data["energy"][1] if "energy" in self.data else None

    @property
    def dt_next(self) -> np.ndarray:
        return self.stats["dt_next"]

    def atoms(self, i: int = -1) -> Atoms:
        """The measure at save index ``i``."""
        return Atoms._trusted(self.points[i], self.weights)

    @property
    def final(self) -> Atoms:
        return self.atoms(-1)


# ------------------------------------------------------------------------------ defaults
def default_dt(model: Model, method: str | None = None, save_at: Any = None) -> float:
    """A default fixed step: ``0.5 / (1 + L)`` with ``L = model.rate_bound()``, shortened to divide equal save intervals.

    The bound is crude; pass ``dt`` explicitly for accuracy studies.

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.solvers.particles import default_dt
    >>> round(default_dt(wflow.SA(4.0)), 6)  # 0.5 / (1 + L), L = rate_bound() = 5
    0.083333
    >>> default_dt(wflow.SA(4.0), save_at=np.linspace(0.0, 1.0, 11))  # two steps per save interval
    0.05
    """
    dt = 0.5 / (1.0 + model.rate_bound())
    if save_at is not None:
        gaps = np.diff(np.asarray(save_at, dtype=float))
        if gaps.size and np.ptp(gaps) <= 1e-9 * gaps.max():
            dt = gaps[0] / math.ceil(gaps[0] / dt - 1e-9)
    return float(dt)


def simulate(
    model: Model,
    mu0: Atoms | np.ndarray,
    t_end: float,
    *,
    save_at: Any = None,
    method: str | None = None,
    dt: float | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    kappa: float | None = None,
    seed: Any = None,
    backend: str = "auto",
    t0: float = 0.0,
    cluster_threshold: float = 0.1,
    writer: Tracker | None = None,
    progress: bool = False,
    max_steps: int = 10**7,
    callback: Callable[[float, Atoms], Any] | None = None,
    tracers: np.ndarray | None = None,
    diagnostics: Sequence[str] = DIAGNOSTICS,
    extra_diagnostics: dict[str, Callable[[Atoms], Any]] | None = None,
    trackers: Sequence[Tracker] = (),
    keep: bool = True,
    throw: bool = True,
    coordinates: str = "cartesian",
) -> Trajectory:
    r"""Evolve particles :math:`\dot x_i = v[\mu_N](x_i)` on the sphere.

    Parameters
    ----------
    model : Model
        Gives the velocity (``SA``, ``USA``, ``Perceptron`` or sums).
    mu0 : Atoms or ndarray, shape (..., n, d)
        Initial measure; leading axes are independent systems evolved together.  For a
        scheme with radii (``model.space == "free"``, :mod:`wflow.schemes`) an array holds the
        tokens :math:`x = r\theta` with their radii.
    t_end : float
        Final time (> ``t0``).
    save_at : array_like, optional
        Save times in ``[t0, t_end]`` (``t0`` is always saved); default 11 equally spaced.
        With a fixed step each is snapped to the nearest step time and the result holds
        the step time (``config["save_mode"] == "snap"``).
    method : str, optional
        A solver of :data:`wflow.solvers.base.SOLVERS`: ``"rk4"`` (default), ``"dopri5"``,
        ``"euler"``, ``"euler-maruyama"`` (default when ``kappa`` is given), ``"ssprk3"``.
    dt : float, optional
        Fixed step, never changed (the last step ends at ``t_end``), or the first trial step
        of ``"dopri5"``.  Default :func:`default_dt` for fixed-step methods.
    rtol, atol : float, optional
        Tolerances of ``"dopri5"`` (default 1e-6 and 1e-9); not accepted by fixed-step methods.
    kappa : float, optional
        Noise: diffusion :math:`\kappa^{-1}\Delta_S` (``sqrt(2/kappa) dW``).
    seed : int or numpy.random.Generator, optional
        Seed of the noise (recorded in ``config["seed"]``).
    backend : str
        Kernel-sum backend (see :mod:`wflow.kernels`).
    cluster_threshold : float
        Geodesic linkage distance of the cluster count.
    writer : Tracker, optional
        A recorder (e.g. :class:`wflow.io.ZarrRecorder`); the same as adding it to ``trackers``.
    progress : bool
        Show a progress bar.
    callback : callable, optional
        ``callback(t, mu)`` after each save; a true return value stops the run (status 1).  ``mu``'s
        points are a read-only view of the state the run continues from.
    tracers : ndarray, shape (..., m, d), optional
        Passive points carried by the flow of :math:`\mu_N` without mass of their own
        (e.g. to measure the flow map's Jacobian); returned in ``Trajectory.tracers``.
    diagnostics : sequence of str
        Saved at each save time; default ``("energy", "order_parameter", "n_clusters")``.
        The cluster count costs a single-linkage pass per system (docs/particles.md): drop it
        for long runs of many systems.
    extra_diagnostics : dict, optional
        ``name -> f(mu)`` user diagnostics, one value per system.
    trackers : sequence of Tracker
        Further trackers of the driver (:mod:`wflow.solvers.trackers`).
    keep : bool
        Hold every snapshot in memory (default); ``False`` keeps only the last one.
    throw : bool
        Raise :class:`~wflow.errors.SolverError` on failure (default) or return a result with
        ``status = -1``.
    coordinates : {"cartesian", "angles", "gaps", "span"}
        ``"angles"``: on :math:`S^1`, integrate the angles in the Kuramoto form
        (:class:`CircleAngleProblem`; attention with Q = K = I, V = ±I): exact for merged tokens.
        ``"gaps"``: the same flow in the gaps between sorted tokens (:class:`CircleGapProblem`):
        with ``method="ros2"`` the choice for metastable staircases at large beta, where steps grow
        to :math:`t\sim10^{30}` between merges.  ``"span"``: SA/USA with Q = K = V = I for n tokens in
        d > n dimensions, integrated exactly in the n coordinates of the initial tokens' span
        (:class:`SpanProblem`): the cost of a step no longer grows with d (many small systems).

    Returns
    -------
    Trajectory

    Raises
    ------
    SolverError
        A non-finite state (the snapshots already recorded are kept), a step size underflow
        or ``max_steps`` exceeded (with ``throw=True``).

    Examples
    --------
    >>> import wflow
    >>> mu0 = wflow.Atoms(wflow.sphere.uniform(64, 3, seed=0))
    >>> traj = wflow.simulate(wflow.SA(beta=4.0), mu0, t_end=1.0, dt=0.05)
    >>> traj.points.shape
    (11, 64, 3)
    >>> traj.status, int(traj.stats["steps"][-1])
    (0, 20)
    """
    if not isinstance(model, Model):
        raise TypeError(
            f"model must be a wflow Model (SA, USA, Perceptron, ...), got {short_repr(model)}"
        )
    x_free = None
    if model.space == "free" and not isinstance(mu0, Atoms):
        # a scheme with radii starts from tokens x = r theta in R^d (uniform weights)
        x_free = np.asarray(mu0, dtype=np.float64)
        if x_free.ndim < 2 or x_free.shape[-1] < 2 or not np.all(np.isfinite(x_free)):
            raise ValueError(
                f"mu0 must be finite tokens of shape (..., n, d), d >= 2, got {short_repr(mu0)}"
            )
        r = np.linalg.norm(x_free, axis=-1)
        if np.any(r <= 0):
            raise ValueError(
                "mu0: every token of a scheme with radii needs a radius > 0 (a direction)"
            )
        mu0 = Atoms._trusted(
            x_free / r[..., None], np.full(x_free.shape[:-1], 1.0 / x_free.shape[-2])
        )
    mu0 = as_atoms(mu0, "mu0")
    if kappa is not None:
        kappa = check_positive(kappa, "kappa")
    if method is None:
        method = "euler-maruyama" if kappa is not None else "rk4"
    solver = get_solver(method)
    if solver.stochastic and kappa is None:
        raise ValueError(f"method={method!r} needs a noise level kappa")
    if kappa is not None and not solver.stochastic:
        raise ValueError(
            f"noise (kappa={kappa:g}) needs method='euler-maruyama', got method={method!r}"
        )
    if not solver.adaptive and (rtol is not None or atol is not None):
        raise ValueError(
            f"rtol/atol apply to the adaptive method 'dopri5', not to method={method!r}"
        )
    t0 = float(t0)
    if dt is None and not solver.adaptive:
        if (
            isinstance(t_end, (int, float, np.integer, np.floating))
            and not isinstance(t_end, bool)
            and math.isfinite(float(t_end))
            and float(t_end) > t0
        ):
            dt = default_dt(model, method, check_save_at(save_at, t0, float(t_end)))
    x = mu0.points if x_free is None else x_free
    n_tr = 0
    if tracers is not None:
        tracers = np.asarray(tracers, dtype=x.dtype)
        if (
            tracers.ndim != x.ndim
            or tracers.shape[:-2] != mu0.batch_shape
            or tracers.shape[-1] != mu0.d
        ):
            raise ValueError(
                f"tracers must have shape {mu0.batch_shape + ('m', mu0.d)}, got {tracers.shape}"
            )
        if (
            not np.all(np.isfinite(tracers))
            or np.abs(np.linalg.norm(tracers, axis=-1) - 1).max() > 1e-6
        ):
            raise ValueError(
                "tracers must be finite points on the unit sphere (norms within 1e-6 of 1)"
            )
        n_tr = tracers.shape[-2]
        x = np.concatenate([x, tracers], axis=-2)
    if coordinates not in ("cartesian", "angles", "gaps", "span"):
        raise ValueError(
            f"coordinates must be 'cartesian', 'angles', 'gaps' or 'span', got {coordinates!r}"
        )
    kw = dict(
        kappa=kappa,
        backend=backend,
        diagnostics=diagnostics,
        cluster_threshold=cluster_threshold,
        extra_diagnostics=extra_diagnostics,
        n_tracers=n_tr,
    )
    problem = None
    if coordinates == "span":
        from ..kernels.small import span_coordinates

        y_span, basis = span_coordinates(x)
        if basis is not None:  # else d <= n: the tokens' own coordinates already
            problem, x = SpanProblem(model, mu0.weights, basis, **kw), np.ascontiguousarray(y_span)
    elif coordinates in ("angles", "gaps"):
        if mu0.d != 2 or model.space != "sphere":
            raise ValueError(
                f"coordinates={coordinates!r} is for the circle S^1 (d = 2), got d = {mu0.d}"
            )
        x = np.arctan2(mu0.points[..., 1], mu0.points[..., 0])
        if coordinates == "angles":
            problem = CircleAngleProblem(model, mu0.weights, **kw)
        else:
            order, x = CircleGapProblem.from_angles(x)
            problem = CircleGapProblem(model, mu0.weights, order, **kw)
    if problem is None:
        problem = ParticleProblem(model, mu0.weights, mu0.d, **kw)
    trs = list(trackers)
    if writer is not None:
        if not all(callable(getattr(writer, m, None)) for m in ("start", "save", "step", "finish")):
            raise TypeError(
                f"writer must be a wflow Tracker (e.g. wflow.io.ZarrRecorder), got {short_repr(writer)}"
            )
        trs.insert(0, writer)
    if callback is not None:
        trs.append(Callback(lambda t, y: callback(t, problem.measure(y))))
    if progress:
        trs.append(ProgressBar(method))
    return integrate(
        problem,
        solver,
        x,
        t0,
        t_end,
        save_at=save_at,
        dt=dt,
        rtol=rtol,
        atol=atol,
        max_steps=max_steps,
        seed=seed,
        trackers=trs,
        keep=keep,
        throw=throw,
        result_class=Trajectory,
    )


def _rebuild(
    cfg: dict[str, Any], stored: dict[str, Any]
) -> tuple[ParticleProblem, Any, np.ndarray]:
    """Problem, solver and last state of a stored particle run (for :func:`wflow.resume`)."""
    from ..models import model_from_dict

    weights = stored["static"]["weights"][1]
    if cfg.get("coordinates") == "span":
        problem = SpanProblem(
            model_from_dict(cfg["model"]),
            weights,
            stored["static"]["span_basis"][1],
            kappa=cfg["kappa"],
            backend=cfg["backend"],
            diagnostics=cfg["diagnostics"],
            cluster_threshold=cfg["cluster_threshold"],
        )
        return (
            problem,
            get_solver(cfg["solver"], **cfg["solver_options"]),
            stored["data"]["span"][1][-1],
        )
    if cfg.get("coordinates") == "gaps":
        problem = CircleGapProblem(
            model_from_dict(cfg["model"]),
            weights,
            stored["static"]["order"][1],
            kappa=cfg["kappa"],
            backend=cfg["backend"],
            diagnostics=cfg["diagnostics"],
            cluster_threshold=cfg["cluster_threshold"],
        )
        return (
            problem,
            get_solver(cfg["solver"], **cfg["solver_options"]),
            stored["data"]["gaps"][1][-1],
        )
    if cfg.get("coordinates") == "angles":
        problem = CircleAngleProblem(
            model_from_dict(cfg["model"]),
            weights,
            kappa=cfg["kappa"],
            backend=cfg["backend"],
            diagnostics=cfg["diagnostics"],
            cluster_threshold=cfg["cluster_threshold"],
        )
        return (
            problem,
            get_solver(cfg["solver"], **cfg["solver_options"]),
            stored["data"]["angles"][1][-1],
        )
    problem = ParticleProblem(
        model_from_dict(cfg["model"]),
        weights,
        cfg["d"],
        kappa=cfg["kappa"],
        backend=cfg["backend"],
        diagnostics=cfg["diagnostics"],
        cluster_threshold=cfg["cluster_threshold"],
        n_tracers=cfg["n_tracers"],
    )
    y = stored["data"]["positions" if "positions" in stored["data"] else "points"][1][-1]
    if cfg["n_tracers"]:
        y = np.concatenate([y, stored["data"]["tracers"][1][-1]], axis=-2)
    return problem, get_solver(cfg["solver"], **cfg["solver_options"]), y


register_kind("particles", Trajectory, _rebuild)
