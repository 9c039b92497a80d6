r"""The long-context phase transition: ``wflow validate long-context [--quick]``.

Rigollet, *The Mean-Field Dynamics of Transformers* (2025, arXiv:2512.01868), after *Critical
attention scaling in long-context transformers* (arXiv:2510.05554): one Pre-LN softmax attention
layer with :math:`\beta = \gamma\log n` on :math:`n` equiangular tokens of cosine :math:`\rho` returns
outputs whose cosine tends to 1, :math:`4\rho/(1+3\rho)` or :math:`\rho` as :math:`\gamma` is below,
at or above :math:`\gamma_c = 1/(1-\rho)` (:func:`wflow.theory.long_context_limit`).  The study checks
the closed form at finite :math:`n` (:func:`wflow.theory.long_context_cosine`) against wflow's kernel
sums (:func:`direct_cosines`), the decay :math:`n^{-\delta}` of the deviation from the limit away
from :math:`\gamma_c` (:func:`deviation_away`) and the :math:`\log n` growth of the slope at
:math:`\gamma_c` (:func:`critical_slope`), and draws the :math:`(\rho, \gamma)` map; one part per
:math:`(n, \rho)`.  Details and measured values: docs/papers/long_context.md.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from .. import theory
from ..measure import Atoms
from ..models import SA
from .parts import Parts
from .progress import steps
from .report import StudyReport, register, save_figure, subplots

__all__ = [
    "direct_cosines",
    "deviation_away",
    "critical_slope",
    "long_context_part",
    "RHOS",
    "DELTA",
]

#: input cosines (gamma_c = 4/3, 2, 4)
RHOS = (0.25, 0.5, 0.75)
#: the distance |gamma - gamma_c| >= DELTA gamma_c that counts as "away from gamma_c"
DELTA = 0.25


def direct_cosines(
    n: int, rho: float, gamma: float, *, backend: str = "numpy"
) -> tuple[float, float]:
    r"""Output cosine of one Pre-LN layer on explicit equiangular tokens, by wflow's kernel sums.

    The tokens are :func:`wflow.theory.equiangular_configuration` (:math:`\mathbb{R}^n`), the outputs
    :math:`A_i` = ``SA(gamma=gamma).average`` (:math:`\beta = \gamma\log n`).  Returns the mean cosine of
    a few output pairs and their spread (0 by symmetry, up to rounding).

    Examples
    --------
    >>> cos, spread = direct_cosines(20, 0.5, 1.0)
    >>> round(cos, 10), spread < 1e-12
    (0.9795645248, True)
    >>> bool(np.isclose(cos, theory.long_context_cosine(0.5, 1.0, 20)))
    True
    """
    x = theory.equiangular_configuration(n, rho)
    A = SA(gamma=gamma).average(x, Atoms(x), backend=backend)
    A = A / np.linalg.norm(A, axis=1, keepdims=True)
    pairs = [(0, 1), (0, n - 1), (n // 2, n // 3), (n - 2, n - 1)]
    cos = np.array([A[i] @ A[j] for i, j in pairs])
    return float(cos.mean()), float(np.ptp(cos))


def deviation_away(rho: float, n: float, gammas: np.ndarray, delta: float = DELTA) -> float:
    r"""Largest :math:`|\cos_n(\gamma) - \lim|` over the ``gammas`` with :math:`|\gamma-\gamma_c|\ge\delta\gamma_c`.

    Examples
    --------
    >>> gammas = np.linspace(0.0, 6.0, 61)
    >>> round(deviation_away(0.5, 1e4, gammas), 6)
    0.047516
    >>> deviation_away(0.5, 1e6, gammas) < deviation_away(0.5, 1e4, gammas)
    True
    """
    gc = 1.0 / (1.0 - rho)
    g = np.asarray(gammas, dtype=float)
    g = g[np.abs(g - gc) >= delta * gc]
    limit = np.where(g < gc, 1.0, rho)
    below = g < gc  # the gap 1 - cos keeps its accuracy where the limit is 1
    dev = np.where(
        below,
        theory.long_context_gap(rho, g, n),
        np.abs(theory.long_context_cosine(rho, g, n) - limit),
    )
    return float(np.max(dev))


def critical_slope(rho: float, n: float, h: float = 1e-5) -> float:
    r""":math:`\partial_\gamma\cos` at :math:`\gamma_c`, by a central difference of the closed form.

    Examples
    --------
    At :math:`\rho = 1/2` the slope is close to :math:`-4\rho(1-\rho)^2/(1+3\rho)^2\,\log n`:

    >>> slope = critical_slope(0.5, 1e6)
    >>> round(slope, 4), bool(np.isclose(slope, -0.08 * np.log(1e6), rtol=1e-5))
    (-1.1052, True)
    """
    gc = 1.0 / (1.0 - rho)
    return float(
        (theory.long_context_cosine(rho, gc + h, n) - theory.long_context_cosine(rho, gc - h, n))
        / (2 * h)
    )


def long_context_part(n: float, rho: float, gammas: np.ndarray, direct: bool) -> dict[str, Any]:
    r"""One part of the study: the limit cosine at ``gammas``, the deviation away from
    :math:`\gamma_c = 1/(1-\rho)`, the slope and the value at :math:`\gamma_c`; with ``direct``, also the
    largest error of :func:`direct_cosines` against the theory at :math:`\gamma_c/2, \gamma_c, 3\gamma_c/2`.

    Examples
    --------
    >>> p = long_context_part(100.0, 0.5, np.array([1.0, 2.0, 3.0]), direct=False)
    >>> sorted(p), p["cos"].shape
    (['at_c', 'cos', 'dev_away', 'slope_c'], (3,))
    """
    gc = 1.0 / (1.0 - rho)
    out: dict[str, Any] = {
        "cos": theory.long_context_cosine(rho, gammas, n),
        "dev_away": deviation_away(rho, n, gammas),
        "slope_c": critical_slope(rho, n),
        "at_c": float(theory.long_context_cosine(rho, gc, n)),
    }
    if direct:
        t0 = time.perf_counter()
        checks = (0.5 * gc, gc, 1.5 * gc)
        got = [direct_cosines(int(n), rho, g) for g in checks]
        ref = [float(theory.long_context_cosine(rho, g, n)) for g in checks]
        out.update(
            direct_err=float(max(abs(c - r) for (c, _), r in zip(got, ref))),
            direct_spread=float(max(s for _, s in got)),
            direct_seconds=time.perf_counter() - t0,
        )
    return out


def _figures(out: Path, res: dict, ns: list, gammas: np.ndarray, slopes: dict) -> list[Path]:
    from matplotlib import colormaps

    paths = []
    fig, axes = subplots(1, len(RHOS), figsize=(11, 3.8), layout="constrained", sharey=False)
    for ax, rho in zip(axes, RHOS):
        for k, n in enumerate(ns):
            color = colormaps["viridis"](k / max(len(ns) - 1, 1))
            ax.plot(gammas, res[(n, rho)]["cos"], color=color, label=f"n = {n:.0e}")
        ax.plot([0, 1], [1, 1], "k--", lw=1)
        ax.plot([1, gammas[-1]], [rho, rho], "k--", lw=1, label="limit n -> inf")
        ax.plot([1], [4 * rho / (1 + 3 * rho)], "ko", ms=5)
        ax.set(
            xlabel="gamma / gamma_c (dimensionless)",
            ylabel="output cosine (dimensionless)",
            title=f"rho = {rho:g}",
        )
    axes[0].legend(fontsize=7)
    fig.suptitle(
        "one Pre-LN attention layer, beta = gamma log n, on n equiangular tokens of cosine rho; "
        "gamma_c = 1/(1-rho): the transition sharpens with n",
        fontsize=9,
    )
    paths.append(save_figure(fig, out / "long_context_transition.png", dpi=90))

    fig, ax = subplots(figsize=(6, 4.2), layout="constrained")
    for k, rho in enumerate(RHOS):
        dev = [res[(n, rho)]["dev_away"] for n in ns]
        ax.loglog(
            ns, dev, "o-", color=f"C{k}", label=f"rho = {rho:g}: fitted slope {slopes[rho]:.3f}"
        )
    ax.loglog(
        ns, 0.5 * np.asarray(ns, dtype=float) ** -DELTA, "k--", label=f"n^-{DELTA:g} (predicted)"
    )
    ax.set(
        xlabel="n (tokens)",
        ylabel=f"max |cos - limit| at |gamma - gamma_c| >= {DELTA:g} gamma_c",
        title="deviation from the limit away from gamma_c",
    )
    ax.legend(fontsize=7)
    paths.append(save_figure(fig, out / "long_context_deviation.png", dpi=90))

    fig, axes = subplots(1, 2, figsize=(10, 4), layout="constrained")
    r = np.linspace(0.02, 0.98, 193)
    g = np.linspace(0.01, 10.0, 200)
    R, Gm = np.meshgrid(r, g)
    for ax, n in zip(axes, (ns[0], ns[-1])):
        c = theory.long_context_cosine(R, Gm, n)
        im = ax.pcolormesh(R, Gm, (c - R) / (1 - R), shading="auto", cmap="magma", vmin=0, vmax=1)
        ax.plot(r, 1 / (1 - r), "c-", lw=1.5, label="gamma = 1/(1-rho)")
        ax.set(
            xlabel="rho (input cosine)",
            ylabel="gamma = beta / log n",
            ylim=(0, 10),
            title=f"n = {n:.0e}",
        )
        ax.legend(fontsize=7, loc="upper left")
    fig.colorbar(im, ax=axes, label="(cos - rho) / (1 - rho): 1 collapse, 0 identity")
    paths.append(save_figure(fig, out / "long_context_map.png", dpi=90))
    return paths


@register("long-context", group="papers")
def study_long_context(out: Path, quick: bool) -> StudyReport:
    """The long-context transition of one Pre-LN layer (module docstring)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rep = StudyReport("long-context")
    parts = Parts(out, "long-context", quick)
    ns = [1e2, 1e3, 1e4, 1e5, 1e6] if quick else [1e2, 1e3, 1e4, 1e5, 1e6, 1e8, 1e10, 1e12]
    direct_ns = (100, 300, 1000) if quick else (100, 300, 1000, 2000, 3000)
    gammas = np.linspace(0.0, 3.0, 601)  # in units of gamma_c below
    rep.notes.append(
        f"{'quick' if quick else 'full'} mode: rho in {list(RHOS)}, n in {[f'{n:.0e}' for n in ns]}, "
        f"601 gammas in [0, 3 gamma_c]; direct kernel sums (d = n, NumPy backend) for n in "
        f"{list(direct_ns)} at gamma = gamma_c/2, gamma_c, 3 gamma_c/2"
    )
    res: dict[tuple[float, float], dict] = {}
    todo = [(rho, n) for rho in RHOS for n in sorted(set(ns) | set(float(m) for m in direct_ns))]
    what = f"the closed form at 601 gammas for {len(todo)} (rho, n), kernel sums for n <= {max(direct_ns)}"
    for rho, n in steps(rep.name, what, todo):
        gc = 1.0 / (1.0 - rho)
        direct = int(n) in direct_ns
        p = parts.get(
            {"n": n, "rho": rho, "gammas": [0.0, 3.0, 601], "direct": direct},
            lambda: long_context_part(n, rho, gammas * gc, direct),
        )
        res[(n, rho)] = p
        row = {
            "rho": rho,
            "gamma_c": gc,
            "n": n,
            "dev_away": p["dev_away"],
            "slope_at_gamma_c": p["slope_c"],
            "slope_over_log_n": p["slope_c"] / np.log(n),
            "cos_at_gamma_c": p["at_c"],
            "limit_at_gamma_c": 4 * rho / (1 + 3 * rho),
        }
        if direct:
            row.update(
                direct_error=p["direct_err"],
                direct_spread=p["direct_spread"],
                direct_seconds=p["direct_seconds"],
            )
        rep.rows.append(row)
    # 1. the closed form against kernel sums
    err = max(r["direct_error"] for r in rep.rows if "direct_error" in r)
    rep.expect(
        f"closed form vs wflow kernel sums on explicit equiangular tokens (n <= {max(direct_ns)}, d = n), "
        "max |cos difference|",
        err,
        0.0,
        1e-12,
    )

    # 2. limits and sharpening
    def exponent(rho: float, sizes: list) -> float:
        dev = [res[(n, rho)]["dev_away"] for n in sizes]
        return float(np.polyfit(np.log(sizes), np.log(dev), 1)[0])

    slopes = {}
    for rho in RHOS:
        dev = np.array([res[(n, rho)]["dev_away"] for n in ns])
        slopes[rho] = slope = exponent(rho, ns[:5])
        rep.expect(
            f"rho = {rho:g}: max deviation from the limit at |gamma - gamma_c| >= {DELTA:g} gamma_c decreases "
            "with n (largest ratio of consecutive n)",
            float(np.max(dev[1:] / dev[:-1])),
            0.0,
            1.0,
        )
        rep.expect(
            f"rho = {rho:g}: its fitted exponent over n = 1e2..1e6 against the predicted -{DELTA:g}",
            slope,
            -DELTA - 0.05,
            -DELTA + 0.05,
        )
        pred = -4 * rho * (1 - rho) ** 2 / (1 + 3 * rho) ** 2
        got = res[(1e6, rho)]["slope_c"] / np.log(1e6)
        rep.expect(
            f"rho = {rho:g}: d cos / d gamma at gamma_c over log n at n = 1e6 against "
            f"-4 rho (1-rho)^2 / (1+3 rho)^2 = {pred:.5f} (ratio)",
            got / pred,
            0.999,
            1.001,
        )
        at_c = abs(res[(1e6, rho)]["at_c"] - 4 * rho / (1 + 3 * rho))
        rep.expect(
            f"rho = {rho:g}: |cos - 4 rho / (1 + 3 rho)| at gamma_c, n = 1e6", at_c, 0.0, 1e-5
        )
        rep.notes.append(
            f"rho = {rho:g}: max deviation away from gamma_c by n: "
            + ", ".join(f"{n:.0e}: {res[(n, rho)]['dev_away']:.4g}" for n in ns)
        )
    rep.notes.append(
        "the deviation's exponent is fitted over n = 1e2..1e6, where corrections of relative size "
        "n^-(c-1) to the leading 2 rho (1 - rho) n^-(c-1) still bend it: "
        + ", ".join(f"rho = {r:g}: {s:.4f}" for r, s in slopes.items())
    )
    if len(ns) > 5:
        tail = {rho: exponent(rho, ns[-3:]) for rho in RHOS}
        rep.notes.append(
            f"exponent fitted over n = {ns[-3]:.0e}..{ns[-1]:.0e} (closed form): "
            + ", ".join(f"rho = {r:g}: {s:.4f}" for r, s in tail.items())
            + f" (predicted -{DELTA:g})"
        )
    rep.figures.extend(_figures(out, res, ns, gammas, slopes))
    rep.notes.append(parts.note())
    return rep
