r"""Blurring mean shift on the sphere is softmax self-attention at another clock (``wflow validate mean-shift``).

Mean shift (Fukunaga--Hostetler 1975; Cheng 1995) moves a point up the Riemannian gradient of the
log of the von Mises--Fisher density estimate :math:`\hat f(x) = \sum_j w_j e^{\beta\langle x, x_j\rangle}`:

.. math::

    v_{MS}[\mu](x) = P_x \nabla_x \log \hat f(x)
                   = \beta\, P_x \frac{\sum_j w_j e^{\beta\langle x, x_j\rangle} x_j}{\sum_k w_k e^{\beta\langle x, x_k\rangle}}
                   = \beta\, v_{SA}[\mu](x),

so blurring mean shift (the data move) is the SA particle system at the time :math:`\beta t`:
:math:`x^{MS}(t) = x^{SA}(\beta t)`.  :func:`mean_shift_field` computes the field independently of
wflow's kernel code; the study checks the identity of the fields to 1e-12 and of the runs (dopri5)
at matched times (docs/papers/mean_shift.md).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
from scipy import special

from ..measure import Atoms
from ..models import SA, Model
from ..solvers.control import StepControl
from ..solvers.particles import simulate
from ..solvers.saveat import SaveAt
from ..sphere import uniform, vmf_mixture
from .parts import Parts
from .progress import numbered
from .report import StudyReport, register, save_figure, subplots

__all__ = [
    "mean_shift_field",
    "MeanShift",
    "random_configurations",
    "field_gap",
    "run_gap",
    "study_mean_shift",
    "BETAS",
]

#: inverse temperatures of the checks
BETAS = (0.5, 3.0, 20.0)
#: tolerances of the adaptive runs (dopri5)
RTOL, ATOL = 1e-11, 1e-13
DOPRI5: dict[str, Any] = {"method": "dopri5", "control": StepControl(rtol=RTOL, atol=ATOL)}


def mean_shift_field(x: Any, points: Any, weights: Any, beta: float) -> np.ndarray:
    r"""The blurring mean-shift field :math:`P_x\nabla_x\log\sum_j w_j e^{\beta\langle x, x_j\rangle}` on the sphere.

    Parameters
    ----------
    x : array_like, shape (..., m, d)
        Query points on :math:`S^{d-1}`.
    points : array_like, shape (..., n, d)
        The cloud :math:`x_j` (same leading axes as ``x``, or broadcastable).
    weights : array_like, shape (..., n)
        Nonnegative weights :math:`w_j` (any positive total; they are normalized by the softmax).
    beta : float
        Concentration of the von Mises--Fisher kernel, ``>= 0``.

    Returns
    -------
    ndarray, shape (..., m, d)
        Tangent vectors; :math:`\beta` times the softmax-attention velocity.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.array([[1.0, 0.0, 0.0]]); pts = np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    >>> v = mean_shift_field(x, pts, np.array([0.5, 0.5]), beta=0.0)   # beta = 0: no kernel, flat
    >>> bool(np.allclose(v, 0.0))
    True
    """
    x = np.asarray(x, dtype=np.float64)
    points = np.asarray(points, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.float64)
    if x.ndim < 2 or points.ndim < 2 or x.shape[-1] != points.shape[-1]:
        raise ValueError(
            f"x and points must have shapes (..., m, d) and (..., n, d) with the same d, got {x.shape} "
            f"and {points.shape}"
        )
    if weights.shape[-1] != points.shape[-2]:
        raise ValueError(
            f"weights must have shape (..., n) with n = {points.shape[-2]}, got {weights.shape}"
        )
    if np.any(weights < 0) or not np.all(np.isfinite(weights)):
        raise ValueError("weights must be finite and >= 0")
    if not np.isfinite(beta) or beta < 0:
        raise ValueError(f"beta must be finite and >= 0, got {beta!r}")
    # log of the kernel terms; -inf for zero weights (softmax gives them weight 0)
    with np.errstate(divide="ignore"):
        logits = beta * np.einsum("...md,...nd->...mn", x, points) + np.log(weights)[..., None, :]
    p = special.softmax(logits, axis=-1)
    grad = beta * np.einsum("...mn,...nd->...md", p, points)  # Euclidean gradient of log f_hat
    return grad - np.sum(grad * x, axis=-1, keepdims=True) * x  # P_x


class MeanShift(Model):
    r"""Blurring mean shift on the sphere as a :class:`~wflow.models.Model`: :math:`v = v_{MS}[\mu](x)`.

    :func:`mean_shift_field` with the measure's atoms; :func:`wflow.simulate` runs it like any model.
    Not a registered model (no ``model_from_dict``): a study tool.

    Examples
    --------
    Its velocity is :math:`\beta` times the SA velocity:

    >>> from wflow.models import SA
    >>> from wflow.sphere import uniform
    >>> x = uniform(5, 3, np.random.default_rng(0))
    >>> ms = MeanShift(2.0)
    >>> ms
    MeanShift(beta=2)
    >>> v = ms.velocity(x, Atoms(x), backend="numpy")
    >>> bool(np.allclose(v, 2.0 * SA(2.0).velocity(x, Atoms(x), backend="numpy")))
    True
    """

    def __init__(self, beta: float):
        if not np.isfinite(beta) or beta < 0:
            raise ValueError(f"beta must be finite and >= 0, got {beta!r}")
        self.beta = float(beta)

    def velocity(self, x: Any, mu: Atoms, *, backend: str = "auto") -> np.ndarray:
        x = self._check_query(x, mu)
        return mean_shift_field(x, mu.points, mu.weights, self.beta)

    def rate_bound(self) -> float:
        return self.beta * (1.0 + self.beta)

    def to_dict(self) -> dict[str, Any]:
        return {"type": "MeanShift", "beta": self.beta}

    def __repr__(self) -> str:
        return f"MeanShift(beta={self.beta:g})"


def random_configurations(seed: int, count: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``count`` weighted clouds ``(x, w)``, shapes ``(n, d)`` and ``(n,)``: uniform and clustered (vMF
    mixtures) in turn, d cycling through 2, 3, 8, 5 <= n < 40, random weights summing to 1.

    Examples
    --------
    >>> [(x.shape[1], round(float(w.sum()), 12)) for x, w in random_configurations(0, 3)]
    [(2, 1.0), (3, 1.0), (8, 1.0)]
    """
    rng = np.random.default_rng(seed)
    out = []
    for k in range(count):
        d = (2, 3, 8)[k % 3]
        n = int(rng.integers(5, 40))
        if k % 2:
            means = uniform(3, d, rng)
            x = vmf_mixture(n, means, [20.0, 20.0, 20.0], None, rng)
        else:
            x = uniform(n, d, rng)
        w = rng.uniform(0.1, 1.0, n)
        out.append((x, w / w.sum()))
    return out


def field_gap(beta: float, configs: list[tuple[np.ndarray, np.ndarray]]) -> tuple[float, float]:
    r"""Largest :math:`|v_{MS} - \beta v_{SA}|` over the configurations, and the largest :math:`|v_{MS}|`."""
    gap, size = 0.0, 0.0
    for x, w in configs:
        mu = Atoms(x, w)
        vms = mean_shift_field(x, x, w, beta)
        vsa = SA(beta).velocity(x, mu, backend="numpy")
        gap = max(gap, float(np.abs(vms - beta * vsa).max()))
        size = max(size, float(np.abs(vms).max()))
    return gap, size


def run_gap(beta: float, x0: np.ndarray, t_end: float, n_saves: int = 5) -> dict[str, Any]:
    r"""Mean shift to ``t_end`` and SA to :math:`\beta t_{end}` (dopri5, rtol 1e-11): largest gap at matched times."""
    times = np.linspace(0.0, t_end, n_saves)
    t_ms = time.perf_counter()
    ms = simulate(MeanShift(beta), x0, t_end, save_at=SaveAt(times, diagnostics=()), **DOPRI5)
    t_ms = time.perf_counter() - t_ms
    t_sa = time.perf_counter()
    sa_saves = SaveAt(beta * times, diagnostics=())
    sa = simulate(SA(beta), x0, beta * t_end, save_at=sa_saves, **DOPRI5)
    t_sa = time.perf_counter() - t_sa
    x_ms, x_sa = np.asarray(ms.points), np.asarray(sa.points)
    gaps = np.abs(x_ms - x_sa).max(axis=tuple(range(1, x_ms.ndim)))
    moved = np.abs(x_ms[-1] - x_ms[0]).max()
    return {
        "times": times,
        "gaps": gaps,
        "moved": float(moved),
        "seconds_ms": t_ms,
        "seconds_sa": t_sa,
    }


@register("mean-shift", group="papers")
def study_mean_shift(out: Path, quick: bool = True) -> StudyReport:
    """Mean-shift field = beta x SA field (to 1e-12) and mean-shift runs = SA runs at time beta t (module docstring).

    Examples
    --------
    >>> rep = study_mean_shift("out/mean-shift", quick=True)  # doctest: +SKIP
    >>> rep.name  # doctest: +SKIP
    'mean-shift'
    """
    rep = StudyReport("mean-shift")
    parts = Parts(out, "mean-shift", quick)
    n_configs = 30 if quick else 300
    configs = random_configurations(0, n_configs)
    field_rows = []
    label = numbered(2 * len(BETAS))
    for beta in BETAS:
        g = parts.get(
            {"part": "field", "beta": beta, "configs": n_configs},
            lambda: dict(zip(("gap", "size"), field_gap(beta, configs))),
            what=label(f"beta = {beta:g}: the fields on {n_configs} random clouds"),
        )
        field_rows.append((beta, g["gap"], g["size"]))
        rep.rows.append(
            {
                "check": "field",
                "beta": beta,
                "configs": n_configs,
                "max_abs_gap": g["gap"],
                "max_abs_field": g["size"],
            }
        )
        rep.expect(
            f"beta={beta:g}: max |v_MS - beta v_SA| over {n_configs} random clouds (d = 2, 3, 8)",
            g["gap"],
            0.0,
            1e-12,
        )
    # runs: a batch of clouds, mean shift to t_end against SA to beta t_end
    n, d = (24, 3) if quick else (64, 3)
    batch = 4 if quick else 16
    runs = {}
    for beta in BETAS:
        t_end = 1.0 if beta <= 3 else 0.25  # SA time beta t_end: 0.5, 3, 5, clustering under way
        x0 = uniform(n, d, np.random.default_rng([11, int(beta * 10)]), batch=(batch,))
        r = parts.get(
            {
                "part": "run",
                "beta": beta,
                "n": n,
                "d": d,
                "batch": batch,
                "t_end": t_end,
                "rtol": RTOL,
            },
            lambda: run_gap(beta, x0, t_end),
            what=label(
                f"beta = {beta:g}: mean shift to t = {t_end:g} against SA to t = {beta * t_end:g}"
            ),
        )
        runs[beta] = r
        for t, g in zip(r["times"], r["gaps"]):
            rep.rows.append(
                {
                    "check": "run",
                    "beta": beta,
                    "t_mean_shift": float(t),
                    "t_sa": float(beta * t),
                    "n": n,
                    "d": d,
                    "batch": batch,
                    "max_abs_gap": float(g),
                }
            )
        rep.expect(
            f"beta={beta:g}: max |x_MS(t) - x_SA(beta t)| over t <= {t_end:g}, {batch} clouds of n={n} "
            f"(dopri5, rtol {RTOL:g}; particles moved up to {r['moved']:.2f})",
            float(r["gaps"].max()),
            0.0,
            1e-8,
        )
        rep.notes.append(
            f"beta={beta:g}: mean-shift run {r['seconds_ms']:.2f} s, SA run {r['seconds_sa']:.2f} s; "
            f"largest gap {r['gaps'].max():.2e}"
        )
    rep.notes.append(parts.note())
    rep.notes.append(
        "Cheng (1995), Mean shift, mode seeking, and clustering, IEEE TPAMI 17(8); blurring mean "
        "shift moves the data themselves.  The field is beta times SA's: the runs are the same "
        "trajectories at time beta t."
    )
    rep.figures.append(_figure(out, field_rows, runs))
    return rep


def _figure(out: Path, field_rows, runs) -> Path:
    fig, axes = subplots(1, 2, figsize=(9, 3.6), constrained_layout=True)
    b = [r[0] for r in field_rows]
    axes[0].semilogy(b, [max(r[1], 1e-18) for r in field_rows], "o-", label="max |v_MS - β v_SA|")
    axes[0].semilogy(b, [r[2] for r in field_rows], "s--", label="max |v_MS|")
    axes[0].axhline(1e-12, color="k", ls=":", lw=0.8, label="tolerance 1e-12")
    axes[0].set_xscale("log")
    axes[0].set_xlabel("β (inverse temperature, dimensionless)")
    axes[0].set(ylabel="field magnitude (1/time)", title="fields on random clouds")
    axes[0].legend(fontsize=7)
    for beta, r in runs.items():
        axes[1].semilogy(
            r["times"][1:], np.maximum(r["gaps"][1:], 1e-18), "o-", label=f"β = {beta:g}"
        )
    axes[1].axhline(1e-8, color="k", ls=":", lw=0.8, label="tolerance 1e-8")
    axes[1].set_xlabel("mean-shift time t (SA time β t)")
    axes[1].set(ylabel="max |x_MS(t) - x_SA(βt)| (chordal)", title="runs, dopri5 rtol 1e-11")
    axes[1].legend(fontsize=7)
    return save_figure(fig, Path(out) / "mean_shift.png", dpi=110)
