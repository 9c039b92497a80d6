r"""The fused small-system SA step: one explicit Euler step of SA with :math:`Q = K = V = I` for a batch
of tiny systems in one compiled pass per system, and what a save reads off it.

:func:`wflow.simulate` runs it for the GLPR phase-diagram workload (thousands of systems of n <= 256
tokens) when the model says its step can be fused (:meth:`wflow.models.Model.fused_attention`);
``docs/particles.md`` describes it.  The compiled passes are in :mod:`wflow.solvers.fused_kernels`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ..diagnostics import pairs
from ..kernels import dense, exp_floor, small
from ..kernels.jit import LOG_ZERO
from ..kernels.precision import float32_logits_bound
from ..kernels.threads import blas_threads, chunk_bounds, num_threads, parallel, shares
from ..linkage import link_bounds
from . import fused_kernels as fk
from .contract import Problem, Solver, StepResult, register_solver

__all__ = ["sa_euler_step", "fused_step", "step_log_weights", "MAX_TOKENS", "FusedEuler"]

# FusedStep (what fused_step returns) is public but left out of __all__: the API reference documents
# __all__, and its field ``points`` would make the docs' cross-references to Trajectory.points ambiguous.

#: Largest number of tokens per system of the fused step (that of the tiny-systems kernel sums,
#: :data:`wflow.kernels.small.SMALL_MAX`).
MAX_TOKENS = small.SMALL_MAX

#: the step shifts every logit by |beta| + max log-weight when the log-weights of a system span at most
#: this much (less 2|beta| for beta < 0), else by each row's maximum: the diagonal term stays normal
_FIXED_SHIFT_SPREAD = 600.0
#: the same in float32 (exponent floor -80)
_FIXED_SHIFT_SPREAD_32 = 60.0


def sa_euler_step(
    x: np.ndarray,
    weights: np.ndarray,
    beta: float,
    dt: float,
    out: np.ndarray | None = None,
    projected: bool = True,
    log_weights: np.ndarray | None = None,
    count_pairs_above: float | None = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    r"""One explicit Euler step of SA with :math:`Q = K = V = I`, fused, for a batch of tiny systems.

    .. math::

        \theta_i = \frac{x_i}{|x_i|}, \qquad
        A_i = \frac{\sum_j w_j e^{\beta\langle\theta_i, \theta_j\rangle}\,\theta_j}{\sum_j w_j e^{\beta\langle\theta_i, \theta_j\rangle}},
        \qquad
        x_i \leftarrow \frac{x_i + h\,(A_i - \langle\theta_i, A_i\rangle\theta_i)}{|x_i + h\,(A_i - \langle\theta_i, A_i\rangle\theta_i)|}

    -- what :class:`wflow.solvers.steppers.Euler` computes through the particle problem, in one compiled
    pass per system (worker threads take chunks of systems), with the Gram matrix and the averages by
    BLAS's gemm.  float32 input: directions, logits, exponentials and averages in float32 when the logits'
    rounding is provably small, :math:`2^{-24}\big((r+4)|\beta| + 2\,\mathrm{span}\log w\big) \le
    3\cdot 10^{-6}` (the rule of the kernel sums), row sums, projection and retraction in float64.  With
    ``projected=False``: :math:`x_i \leftarrow (x_i + hA_i)/|x_i + hA_i|`, GLPR's published scheme
    (:class:`wflow.solvers.steppers.EulerAverage`).

    Parameters
    ----------
    x : ndarray, shape (..., n, r)
        Points (on the sphere up to rounding); leading axes are independent systems,
        ``n <=`` :data:`MAX_TOKENS`.  ``r`` may be the dimension ``d`` or the number of
        coordinates in an orthonormal basis of the points' span (:func:`~wflow.kernels.small.span_coordinates`):
        the step commutes with orthogonal maps.
    weights : ndarray, shape (..., n)
        Non-negative token weights.
    beta : float
    dt : float
        The step :math:`h`.
    out : ndarray, shape (..., n, r), optional
        Where to write the new points (may be ``x`` itself).
    projected : bool
        Project the average on the tangent plane (projected Euler, the default) or not (GLPR's scheme).
    log_weights : ndarray, shape (..., n), optional
        ``max(log(weights), -1e300)`` as float64 when the caller keeps it between steps (a run's weights do
        not change); formed here otherwise.
    count_pairs_above : float, optional
        Also count, per system, the ordered pairs :math:`i \ne j` of the *input* with
        :math:`\langle\theta_i, \theta_j\rangle` above this cosine, from the step's Gram matrix:
        :func:`~wflow.diagnostics.pair_counts`' count (for float64 points, but for a pair within
        :math:`10^{-15}` of the threshold).

    Returns
    -------
    ndarray, shape (..., n, r)
        The new points, in ``x``'s dtype (float32 or float64); with ``count_pairs_above``, the pair
        ``(points, counts)``, counts int64 of shape ``(...)``.

    Examples
    --------
    >>> from wflow import sphere
    >>> x = sphere.uniform(8, 3, seed=0, batch=(2,))
    >>> y = sa_euler_step(x, np.full((2, 8), 1 / 8), 5.0, 0.1)
    >>> bool(np.allclose(np.linalg.norm(y, axis=-1), 1.0))
    True
    >>> z = sa_euler_step(x, np.full((2, 8), 1 / 8), 5.0, 0.1, projected=False)  # GLPR's scheme
    >>> bool(np.allclose(np.linalg.norm(z, axis=-1), 1.0)), bool(np.abs(z - y).max() < 1e-2)
    (True, True)
    >>> y2, counts = sa_euler_step(x, np.full((2, 8), 1 / 8), 5.0, 0.1, count_pairs_above=0.5)  # the input's pairs
    >>> bool((y2 == y).all()), bool((counts == pairs.pair_counts(x, 0.5)).all())
    (True, True)
    """
    st = fused_step(x, weights, beta, dt, out, projected, log_weights, count_pairs_above)
    return st.points if st.counts is None else (st.points, st.counts)


class FusedStep(NamedTuple):
    """What :func:`fused_step` returns: the new points, whether they are all finite, and what was asked of
    the input (``None`` otherwise), each of shape ``x.shape[:-2]`` but ``means``, ``x.shape[:-2] + (r,)``."""

    points: np.ndarray
    finite: bool
    counts: np.ndarray | None = None
    energy_sums: np.ndarray | None = None
    n_clusters: np.ndarray | None = None
    means: np.ndarray | None = None


def fused_step(
    x,
    weights,
    beta,
    dt,
    out=None,
    projected=True,
    log_weights=None,
    count_pairs_above=None,
    energy_sums=False,
    cluster_threshold=None,
    means=False,
    strict=True,
) -> FusedStep:
    """:func:`sa_euler_step` as a :class:`FusedStep`; ``finite`` comes from the pass's row norms.  Of the
    input, when the Gram matrix is float64 (else a ValueError, or with ``strict=False`` None for each):
    with ``energy_sums``, per system log sum_i w_i sum_j w_j e^(beta <theta_i, theta_j>); with
    ``cluster_threshold`` (radians), :func:`wflow.diagnostics.count_clusters`' count, exactly; with
    ``means``, sum_i w_i x_i."""
    x = np.asarray(x)
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float64)
    if x.ndim < 2 or x.shape[-2] == 0 or x.shape[-2] > small.SMALL_MAX or x.shape[-1] == 0:
        raise ValueError(
            f"x must have shape (..., n, r) with 1 <= n <= {small.SMALL_MAX} and r >= 1, got shape {x.shape}"
        )
    n, r = x.shape[-2:]
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != x.shape[:-1]:
        raise ValueError(f"weights must have shape {x.shape[:-1]}, got {w.shape}")
    xf = np.ascontiguousarray(x).reshape(-1, n, r)
    if log_weights is None:
        log_weights = step_log_weights(w)
    lw = np.asarray(log_weights, dtype=np.float64).reshape(-1, n)
    if out is None:
        out = np.empty(x.shape, dtype=x.dtype)
    of = out.reshape(-1, n, r)  # (a view: out must be contiguous)
    B = xf.shape[0]
    threads = num_threads() if B * n * n * 2 * r >= small.SERIAL_MAX_FLOPS else 1
    chunks = chunk_bounds(B, n * n, threads, small.CHUNK_PAIRS)
    be, h = float(beta), float(dt)
    proj = 1.0 if projected else 0.0
    lw, fl, spread = _logits_precision(x.dtype, r, be, lw)
    count = count_pairs_above is not None
    c, pb, counts, kcounts = _pair_plan(count_pairs_above, x.dtype, lw.dtype, out, xf)
    health = np.zeros(B)
    if lw.dtype != np.float64:  # float32 logits: the Gram matrix is float32, too coarse for these
        _refuse_float32_statistics(strict, energy_sums, cluster_threshold, means, be, r)
        energy_sums, cluster_threshold, means = False, None, False
    lses = np.zeros(B if energy_sums else 0)
    cl, nclust = _cluster_plan(cluster_threshold, B)
    wm = w.reshape(-1, n) if means else np.zeros((0, n))
    mf = np.zeros((B if means else 0, r))
    if B:
        share = shares(B, min(threads, len(chunks)))

        # BLAS's gemm (dgemm or sgemm at the address passed last) inside the compiled pass, one thread each
        def work(t: int) -> None:
            fk.sa_euler_blas(
                xf,
                lw,
                be,
                h,
                fl,
                spread,
                proj,
                c,
                pb,
                *share[t],
                of,
                kcounts,
                health,
                lses,
                cl,
                nclust,
                wm,
                mf,
                dense.GEMM[lw.dtype],
            )

        with blas_threads(1):
            parallel(work, len(share))
    finite = np.isfinite(health)
    all_finite = bool(finite.all())
    if pb:
        near = counts < 0
        if not all_finite:  # systems with zero, infinite or NaN rows: no decision from their Gram
            near |= ~finite  # matrix (the kernels' fast-math compares promise nothing about NaN)
        if near.any():
            counts[near] = pairs.pair_counts(xf[near], c)
    batch = x.shape[:-2]
    return FusedStep(
        out,
        all_finite,
        counts.reshape(batch) if count else None,
        lses.reshape(batch) if energy_sums else None,
        nclust.reshape(batch) if cluster_threshold is not None else None,
        mf.reshape(batch + (r,)) if means else None,
    )


def _logits_precision(
    dtype: np.dtype, r: int, beta: float, lw: np.ndarray
) -> tuple[np.ndarray, float, float]:
    """The log-weights in the dtype of the step's logits, the exponent floor and the fixed-shift spread: float32
    for float32 points when the kernel sums' rule for dimension r + 2 allows (|theta| = 1; 2 |beta| 2^-24
    more for the directions' rounding), else float64."""
    if dtype == np.float32:
        fl32 = exp_floor(np.dtype(np.float32))
        ok, lw_rel, _ = float32_logits_bound(r + 2, abs(beta) * (1.0 + 1e-6), lw, fl32)
        if ok:
            return lw_rel, fl32, _FIXED_SHIFT_SPREAD_32
    return lw, exp_floor(np.dtype(np.float64)), _FIXED_SHIFT_SPREAD


def _pair_plan(
    count_pairs_above: float | None,
    dtype: np.dtype,
    logits: np.dtype,
    out: np.ndarray,
    xf: np.ndarray,
) -> tuple[float, float, np.ndarray, np.ndarray]:
    """How the pairs of the input are counted: ``(c, pb, counts, kcounts)``, the kernels' threshold ``c`` (2,
    above every cosine, when they do not count), ``pb`` 1.0 when the kernels flag the systems with a pair near
    ``c`` (float32 points), the counts and the array the kernels count into (empty: they count nothing)."""
    none = np.zeros(0, dtype=np.int64)
    if count_pairs_above is None:
        return 2.0, 0.0, none, none
    cp = float(count_pairs_above)
    if not math.isfinite(cp):
        raise ValueError(f"count_pairs_above must be a finite cosine, got {count_pairs_above!r}")
    B = xf.shape[0]
    if dtype == np.float64:
        counts = np.zeros(B, dtype=np.int64)
        return cp, 0.0, counts, counts
    if logits == np.float64 and not np.may_share_memory(out, xf):
        # float32 points, float64 Gram matrix: the systems with a pair near c are counted by pair_counts
        # after the step, from the input (out is elsewhere)
        counts = np.zeros(B, dtype=np.int64)
        return cp, 1.0, counts, counts
    # float32 logits (a float32 Gram matrix), or in place: pair_counts' products, before out is written
    return 2.0, 0.0, pairs.pair_counts(xf, cp), none


def _refuse_float32_statistics(
    strict: bool,
    energy_sums: bool,
    cluster_threshold: float | None,
    means: bool,
    beta: float,
    r: int,
) -> None:
    """With ``strict``, a ValueError for the statistics a float32 Gram matrix is too coarse for."""
    asked = {
        "energy_sums": energy_sums,
        "cluster_threshold": cluster_threshold is not None,
        "means": means,
    }
    for name, wanted in asked.items():
        if wanted and strict:
            raise ValueError(
                f"{name} needs a float64 Gram matrix: float64 points, or float32 points whose "
                f"logits the float32 rule keeps in float64; got float32 logits (beta={beta:g}, r={r})"
            )


def _cluster_plan(cluster_threshold: float | None, B: int) -> tuple[np.ndarray, np.ndarray]:
    """The kernels' cluster-count arguments: the link bounds (:func:`wflow.linkage.link_bounds`) and the counts
    (empty: no count)."""
    cl = np.zeros(4)
    if cluster_threshold is None:
        return cl, np.zeros(0, dtype=np.int64)
    chord, lo, hi = link_bounds(cluster_threshold)
    cl[:] = chord, 1.0 - 0.5 * chord * chord, lo, hi
    return cl, np.zeros(B, dtype=np.int64)


def step_log_weights(weights: np.ndarray) -> np.ndarray:
    """The log-weights :func:`sa_euler_step` takes: ``max(log w, -1e300)`` in float64 (zero weights finite).

    Examples
    --------
    >>> step_log_weights(np.array([1.0, 0.0])).tolist()
    [0.0, -1e+300]
    """
    with np.errstate(divide="ignore"):
        return np.maximum(np.log(np.asarray(weights, dtype=np.float64)), LOG_ZERO)


# ------------------------------------------------------------------------------ the solver
@dataclass(frozen=True)
class _Ahead:
    """A fused step taken from a saved state (to read the save's diagnostics off it), for the next step."""

    dt: float
    beta: float
    points: np.ndarray
    finite: bool


@dataclass(frozen=True)
class _FusedState:
    log_weights: np.ndarray
    ahead: _Ahead | None = None


@register_solver
class FusedEuler(Solver):
    r"""Euler's step of SA with :math:`Q = K = V = I` on many tiny systems, fused (order 1): :func:`fused_step`.

    The same step as ``euler`` (``projected=True``) or ``euler-average`` (``projected=False``), to rounding
    (1e-14), which :func:`wflow.simulate` runs in their place when the problem can fuse its step
    (:meth:`~wflow.solvers.particle_problem.ParticleProblem.fused_spec`); a step it cannot fuse is taken as
    ``euler`` takes it.  At a save (``save=True``) the new state's diagnostics are read off the *next* step,
    taken now and kept for the next call (``docs/particles.md``).

    Examples
    --------
    >>> import numpy as np, wflow
    >>> x0 = wflow.sphere.uniform(8, 3, seed=0, batch=(4,))
    >>> fused = wflow.simulate(wflow.SA(5.0), x0, 1.0, method="euler", dt=0.1)
    >>> fused.solver, fused.config["solver_options"]
    ('fused-euler', {'projected': True})
    >>> plain = wflow.simulate(wflow.SA(5.0), x0, 1.0, method="euler", dt=0.1, backend="numpy")
    >>> plain.solver, bool(np.abs(fused.points[-1] - plain.points[-1]).max() < 1e-13)
    ('euler', True)
    """

    name = "fused-euler"
    order = 1
    forms_diagnostics = True

    def __init__(self, projected: bool = True) -> None:
        self.projected = bool(projected)

    def options(self) -> dict[str, Any]:
        return {"projected": self.projected}

    def init(self, problem: Problem, t0: float, y0: np.ndarray) -> _FusedState:
        return _FusedState(step_log_weights(problem.weights))  # type: ignore[attr-defined]

    def step(
        self,
        problem: Any,
        t: float,
        y: np.ndarray,
        dt: float,
        state: _FusedState,
        *,
        save: bool = False,
        **_: Any,
    ) -> tuple[StepResult, _FusedState]:
        spec = problem.fused_spec(t, y)
        if spec is None:  # a piece of the model (a layer) that is not fused: the plain step
            f = problem.rhs if self.projected else problem.average
            return StepResult(problem.retract(y + dt * f(t, y))), _FusedState(state.log_weights)
        problem.evaluations += 1
        ahead = state.ahead
        if ahead is not None and ahead.dt == dt and ahead.beta == spec.beta:
            points, finite = ahead.points, ahead.finite
        else:
            st = fused_step(
                y,
                problem.weights,
                spec.beta,
                dt,
                projected=self.projected,
                log_weights=state.log_weights,
            )
            points, finite = st.points, st.finite
        if not save:
            return StepResult(points, finite=finite), _FusedState(state.log_weights)
        known, ahead = self._ahead(problem, spec.beta, points, dt, state.log_weights)
        return StepResult(points, finite=finite, diagnostics=known), _FusedState(
            state.log_weights, ahead
        )

    def _ahead(
        self, problem: Any, beta: float, y: np.ndarray, dt: float, log_weights: np.ndarray
    ) -> tuple[dict[str, np.ndarray] | None, _Ahead | None]:
        """The diagnostics of the saved state ``y`` that the step from it forms, and that step; ``(None, None)``
        when the save asks for none of them."""
        want = {"energy" if name == "log_energy" else name for name in problem.diagnostics}
        pairs = "pair_fraction" in want and problem.n >= 2
        energy = ("energy" in want or "n_eff" in want) and beta != 0
        clusters = "n_clusters" in want
        if not (pairs or energy or clusters):
            return None, None
        st = fused_step(
            y,
            problem.weights,
            beta,
            dt,
            projected=self.projected,
            log_weights=log_weights,
            count_pairs_above=problem.pair_cosine if pairs else None,
            energy_sums=energy,
            cluster_threshold=problem.cluster_threshold if clusters else None,
            means="order_parameter" in want,
            strict=False,
        )
        # (None: float32 logits, too coarse; the save forms it itself)
        formed = {"energy_sums": st.energy_sums, "n_clusters": st.n_clusters, "means": st.means}
        known = {key: value for key, value in formed.items() if value is not None}
        if pairs:
            known["pair_fraction"] = st.counts / (problem.n * (problem.n - 1))
        return known, _Ahead(dt, beta, st.points, st.finite)
