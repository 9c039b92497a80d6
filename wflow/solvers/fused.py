r"""The fused small-system SA step: one explicit Euler step of SA with :math:`Q = K = V = I` for a batch
of tiny systems in one compiled pass per system, and what a save reads off it.

This is what :func:`wflow.simulate` runs for the GLPR phase-diagram workload (thousands of systems
of n <= 256 tokens, Euler or GLPR's scheme, the ``auto`` or ``numba`` backend): the particle
problem (:class:`wflow.solvers.particles.ParticleProblem`) asks the model whether its step can be
fused (:meth:`wflow.models.Model.fused_attention`) and, when it can, calls :func:`fused_step`
instead of the model's velocity and the kernel sums.  The compiled passes are in
:mod:`wflow.solvers.fused_kernels`, the small products they call in :mod:`wflow.kernels.dense`.
"""

from __future__ import annotations

import contextlib
import math
from typing import NamedTuple

import numpy as np

from ..diagnostics import pairs
from ..kernels import dense, exp_floor, small
from ..kernels.jit import LOG_ZERO, scratch
from ..kernels.precision import float32_logits_bound
from ..kernels.threads import blas_threads, chunk_bounds, num_threads, parallel, run_chunks, shares
from ..linkage import link_bounds
from . import fused_kernels as fk

__all__ = [
    "sa_euler_step",
    "fused_step",
    "step_log_weights",
    "MAX_TOKENS",
    "SA_STEP_BLAS",
    "SA_STEP_FUSED_MAX_DIM",
]

# FusedStep (what fused_step returns) is public but left out of __all__: the API reference documents
# __all__, and its field ``points`` would make the docs' cross-references to Trajectory.points ambiguous.

#: Largest number of tokens per system of the fused step (that of the tiny-systems kernel sums,
#: :data:`wflow.kernels.small.SMALL_MAX`).
MAX_TOKENS = small.SMALL_MAX

#: the fused SA step shifts every logit by |beta| + max log-weight when the log-weights of a system span at
#: most this much, less 2|beta| for beta < 0 (uniform weights, beta >= 0: 0), else by each row's maximum
#: (zero weights, weights beyond e^600 apart): the diagonal term e^(beta - |beta| + lw_i - max lw) stays normal
_FIXED_SHIFT_SPREAD = 600.0
#: the same in float32 (exponent floor -80)
_FIXED_SHIFT_SPREAD_32 = 60.0

#: :func:`sa_euler_step` takes each system's two products by BLAS from inside one compiled pass
#: (:func:`~wflow.solvers.fused_kernels.sa_euler_blas`); ``False`` selects the two routes below, numba's own products or batched NumPy
#: GEMMs (kept to check against).  At n = 32, one thread, round-robin medians of 15: 256 systems
#: r = 8 0.61 against 0.92 ms (one pass), r = 16 1.29 against 1.78 ms, r = 32 2.01 against 2.51 ms,
#: r = 64 3.25 against 4.20 ms (GEMM route); 2048 systems r = 2 3.7 against 4.3 ms, r = 8 5.3 against 7.8 ms.
SA_STEP_BLAS = True
#: With :data:`SA_STEP_BLAS` off, the largest dimension r for which :func:`sa_euler_step` forms each system's
#: products in numba's own loops in one compiled pass; beyond it batched GEMMs per chunk of systems.  Measured at n = 32 (two threads, 256 and 2048 systems,
#: round-robin medians): the one pass 0.80-0.92x of the GEMM route's time at r = 8, 1.0-1.25x at r = 9...16.
SA_STEP_FUSED_MAX_DIM = 8


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

    -- what :class:`wflow.solvers.steppers.Euler` computes through the particle problem's
    ``rhs`` (velocity at :math:`\theta`, the SA average projected on the tangent plane) and
    ``retract``, but in one compiled pass per system (worker threads take chunks of systems)
    with no array of the batch's size in between: the Gram matrix and the averages by BLAS's gemm
    called from the compiled pass (OpenBLAS's small-matrix kernels; :data:`SA_STEP_BLAS`), the
    softmax (shifted by :math:`|\beta|` + the largest log-weight, a bound of every logit, or by each
    row's maximum when the log-weights span more than :math:`600 - 2\max(-\beta, 0)`, 60 in place of
    600 in float32), the projection and the retraction, in float64 (1.2-1.5x faster steps than
    numba's own products or batched NumPy GEMMs, the two earlier routes, which ``SA_STEP_BLAS =
    False`` selects: products in the pass up to :data:`SA_STEP_FUSED_MAX_DIM`, batched GEMMs per
    chunk of systems beyond).  float32 input: the directions, logits, exponentials and averages in
    float32 when the logits' rounding is provably small,
    :math:`2^{-24}\big((r+4)|\beta| + 2\,\mathrm{span}\log w\big) \le 3\cdot 10^{-6}` (the rule
    of the kernel sums, :math:`|\theta| = 1` bounding every logit by :math:`|\beta|`, with
    :math:`2|\beta|` more for the directions' rounding to float32; as there, the shift's subtraction
    adds at most :math:`2^{-24}(\mathrm{span}\log w + \log n)` to the sums' relative error), with row
    sums, projection and retraction in float64 and a float32 result; float64 logits otherwise.
    Measured against the float64 step at :math:`\beta = 4.15`, :math:`r = 8`, :math:`h = 0.1`: 3.6e-8, of
    which the result's own rounding is 3.0e-8.
    With ``projected=False`` the average is not projected on the tangent plane:
    :math:`x_i \leftarrow (x_i + hA_i)/|x_i + hA_i|`, the published scheme of the GLPR phase
    diagram (what :class:`wflow.solvers.steppers.EulerAverage` computes).

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
        :math:`\langle\theta_i, \theta_j\rangle` above this cosine (the phase diagram's observable),
        from the Gram matrix of the directions the step forms anyway: a compare per entry instead of a
        second pass.  For float64 points on the sphere (to rounding) that is :func:`~wflow.diagnostics.pair_counts`' count
        of :math:`\langle x_i, x_j\rangle > c` but for a pair within :math:`10^{-15}` of the threshold.
        float32 points get :func:`~wflow.diagnostics.pair_counts`' count exactly: when their logits are float64 it is read
        off the step's float64 Gram matrix but in the systems with a pair within a proven bound of the
        threshold (about 1e-7: the points lie off the sphere by float32 rounding), which
        :func:`~wflow.diagnostics.pair_counts` counts after the step; otherwise, and in place, :func:`~wflow.diagnostics.pair_counts` counts
        them all before the step (so ``out`` may be ``x``).

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
    """:func:`sa_euler_step` as a :class:`FusedStep`: ``finite`` says whether every new point is finite, known
    from the compiled pass's row norms (no scan of the output).  Of the input, from the Gram matrix and row
    sums the step forms anyway, when they are float64 (float64 points, and float32 points whose logits the
    float32 rule keeps in float64, as at beta = 5 for r >= 7; otherwise a ValueError, or with ``strict=False``
    None for each): with ``energy_sums``, per system
    log sum_i w_i sum_j w_j e^(beta <theta_i, theta_j>) (:meth:`wflow.models.SA.log_energy` less log 2 beta);
    with ``cluster_threshold`` (radians), :func:`wflow.diagnostics.count_clusters`' count, exactly
    (:func:`~wflow.solvers.fused_kernels.gram_clusters`; count_clusters clusters systems of up to BATCHED_MAX_N = 512 >= SMALL_MAX
    points from the coordinates, whose decisions it reproduces); with ``means``,
    sum_i w_i x_i (:meth:`wflow.Atoms.mean`, to rounding)."""
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
    fl, spread = exp_floor(np.dtype(np.float64)), _FIXED_SHIFT_SPREAD
    if x.dtype == np.float32:
        # float32 directions, logits, exponentials and averages when the logits' rounding is provably
        # small: the rule of the kernel sums for dimension r + 2 (|theta| = 1, so every logit is at most
        # |beta| in size; the directions, formed in float64, are rounded to float32: 2 |beta| 2^-24 more)
        fl32 = exp_floor(np.dtype(np.float32))
        ok, lw_rel, _ = float32_logits_bound(r + 2, abs(be) * (1.0 + 1e-6), lw, fl32)
        if ok:
            lw = lw_rel
            fl, spread = fl32, _FIXED_SHIFT_SPREAD_32

    count = count_pairs_above is not None
    c = 2.0  # the kernels' threshold when they do not count: above every cosine (finite: no infinities there)
    counts = kcounts = np.zeros(
        0, dtype=np.int64
    )  # kcounts: what the kernels count into (nothing if empty)
    pb = 0.0  # 1.0: the kernels flag the systems with a pair near c (float32 points, see below)
    if count:
        cp = float(count_pairs_above)
        if not math.isfinite(cp):
            raise ValueError(
                f"count_pairs_above must be a finite cosine, got {count_pairs_above!r}"
            )
        if x.dtype == np.float64:
            c = cp
            counts = kcounts = np.zeros(B, dtype=np.int64)
        elif lw.dtype == np.float64 and not np.may_share_memory(out, xf):
            # float32 points, float64 Gram matrix of their directions: pair_counts' count (float64 products of
            # the points) wherever no pair lies within _pair_band of c; the systems with one (about 1e-3 of
            # them at a save near c = 0.999) are counted by pair_counts after the step, from the input (not
            # overwritten: out is elsewhere)
            c, pb = cp, 1.0
            counts = kcounts = np.zeros(B, dtype=np.int64)
        else:  # float32 logits (a float32 Gram matrix), or in place: pair_counts' products, before out is written
            counts = pairs.pair_counts(xf, cp)
    health = np.zeros(B)
    if lw.dtype != np.float64:  # float32 logits: the Gram matrix is float32, too coarse for these
        for name, asked in (
            ("energy_sums", energy_sums),
            ("cluster_threshold", cluster_threshold is not None),
            ("means", means),
        ):
            if asked and strict:
                raise ValueError(
                    f"{name} needs a float64 Gram matrix: float64 points, or float32 points whose "
                    f"logits the float32 rule keeps in float64; got float32 logits (beta={be:g}, r={r})"
                )
        energy_sums, cluster_threshold, means = False, None, False
    lses = np.zeros(B if energy_sums else 0)
    cl = np.zeros(4)
    nclust = np.zeros(0, dtype=np.int64)
    if cluster_threshold is not None:
        chord, lo, hi = link_bounds(cluster_threshold)
        cl[:] = chord, 1.0 - 0.5 * chord * chord, lo, hi
        nclust = np.zeros(B, dtype=np.int64)
    wm = w.reshape(-1, n) if means else np.zeros((0, n))
    mf = np.zeros((B if means else 0, r))
    if B == 0:
        pass
    elif SA_STEP_BLAS or r <= SA_STEP_FUSED_MAX_DIM:
        share = shares(B, min(threads, len(chunks)))
        # BLAS inside the compiled pass (dgemm or sgemm at the address passed last), one thread each; or
        # numba's own products
        kernel, blas = (
            (fk.sa_euler_blas, (dense.GEMM[lw.dtype],)) if SA_STEP_BLAS else (fk.sa_euler, ())
        )

        def work(t: int) -> None:
            kernel(
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
                *blas,
            )

        with blas_threads(1) if blas else contextlib.nullcontext():
            parallel(work, len(share))
    else:
        _sa_step_gemm(
            xf,
            lw,
            be,
            h,
            fl,
            spread,
            proj,
            c,
            pb,
            chunks,
            threads,
            of,
            kcounts,
            health,
            lses,
            (cl, nclust, wm, mf),
        )
    finite = np.isfinite(health)
    all_finite = bool(finite.all())
    if pb:
        near = counts < 0
        if (
            not all_finite
        ):  # systems with zero, infinite or NaN rows: no decision from their Gram matrix (the
            near |= ~finite  # kernels' fast-math compares promise nothing about NaN)
        if near.any():
            counts[near] = pairs.pair_counts(xf[near], cp)
    batch = x.shape[:-2]
    return FusedStep(
        out,
        all_finite,
        counts.reshape(batch) if count else None,
        lses.reshape(batch) if energy_sums else None,
        nclust.reshape(batch) if cluster_threshold is not None else None,
        mf.reshape(batch + (r,)) if means else None,
    )


def _sa_step_gemm(
    xf, lw, be, h, fl, spread, proj, c, pb, chunks, threads, of, counts, health, lses, stats
) -> None:
    """The GEMM route of :func:`sa_euler_step` (``r >`` :data:`SA_STEP_FUSED_MAX_DIM`); ``stats`` = (cl, nclust,
    w, means), the statistics arguments of the compiled passes (what a save asks of the input)."""

    # the Gram matrices and the averages of a chunk of systems by batched GEMMs (BLAS on one thread
    # inside each worker), the directions, exponentials and the move in compiled passes; the chunk's
    # arrays apart from all others, as the passes' own (scratch: the same bits wherever they lie)
    n, r = xf.shape[1:]
    size = chunks[0][1] - chunks[0][0]

    def gemm_work(t: int) -> None:
        T = scratch((size, n, r), lw.dtype)
        G = scratch((size, n, n), lw.dtype)
        A = scratch((size, n, r), lw.dtype)
        inv_s = scratch((size, n), np.float64)
        dls = scratch((size,), np.float64)
        for b0, b1 in chunks[t::threads]:
            C = b1 - b0
            Tc, Gc, Ac, ic = T[:C], G[:C], A[:C], inv_s[:C]
            fk.sa_directions_chunk(xf, b0, Tc, dls)
            np.matmul(Tc, Tc.swapaxes(1, 2), out=Gc)
            fk.sa_exps_chunk(Gc, lw, b0, be, fl, spread, ic, c, pb, counts, lses, xf, dls, *stats)
            np.matmul(Gc, Tc, out=Ac)
            fk.sa_move_chunk(xf, Tc, Ac, ic, h, proj, b0, of, health)

    with blas_threads(1):
        run_chunks(gemm_work, threads, len(chunks))


def step_log_weights(weights: np.ndarray) -> np.ndarray:
    """The log-weights :func:`sa_euler_step` takes: ``max(log w, -1e300)`` in float64 (zero weights finite).

    Examples
    --------
    >>> step_log_weights(np.array([1.0, 0.0])).tolist()
    [0.0, -1e+300]
    """
    with np.errstate(divide="ignore"):
        return np.maximum(np.log(np.asarray(weights, dtype=np.float64)), LOG_ZERO)
