"""The figures of the normalization study (:mod:`wflow.studies.normalization`).

Drawn from the parts the study computed: the collapse of random tokens through the
metastable staircase (:func:`collapse_figure`), the equiangular runs against the reduced
ODE and its asymptotic law, and the early phase of random starts (:func:`study_figures`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .report import save_figure, subplots

__all__ = ["collapse_figure", "study_figures"]


def collapse_figure(out: Path, col: dict, n: int, d: int) -> Path:
    """``normalization_collapse.png``: the mean pair gap and the cluster count along each collapse."""
    fig, (ax, ax2) = subplots(2, 1, figsize=(6.5, 6.0), layout="constrained", sharex=True)
    for k, (scheme, p) in enumerate(col.items()):
        t = np.maximum(p["t"], 1e-1)
        ax.loglog(t, p["gap"], f"C{k}", label=scheme)
        ax2.semilogx(t, p["clusters"], f"C{k}", drawstyle="steps-post", label=scheme)
    ax.set_ylabel("mean pair gap 1 - <θ_i, θ_j>")
    ax.set_title(f"{n} random tokens, d = {d}, β = √d: the metastable staircase to one point")
    ax.legend()
    ax2.set(xlabel="t (each scheme's own time)", ylabel="clusters (1 - cos < 1e-3 joined)")
    return save_figure(fig, out / "normalization_collapse.png", dpi=80)


def study_figures(
    out: Path, eq: dict, rnd: dict, laws: dict, beta_r: float, n_r: int, d: int
) -> list[Path]:
    """The equiangular, compensated and random-start figures (``normalization_*.png``)."""
    paths = []
    fig, ax = subplots(figsize=(6.5, 4.5), layout="constrained")
    for k, (scheme, p) in enumerate(eq.items()):
        c = f"C{k}"
        ax.loglog(
            p["t"][1:], p["gap_ode"][1:], "-", color=c, label=f"{scheme}: {laws[scheme].formula}"
        )
        sel = slice(1, None, 4)
        ax.loglog(p["t"][sel], p["gap"][sel], "o", ms=3, color=c)
    ax.set(
        xlabel="t (depth, units of the ODE time)",
        ylabel="1 - rho (mean cosine gap, dimensionless)",
        ylim=(1e-13, 2),
        title="n = 8 equiangular, SA beta = 1: lines reduced ODE, dots particles",
    )
    ax.legend(fontsize=7)
    paths.append(save_figure(fig, out / "normalization_equiangular.png", dpi=90))

    fig, ax = subplots(figsize=(6.5, 4.5), layout="constrained")
    for k, (scheme, p) in enumerate(eq.items()):
        law = laws[scheme]
        ok = (p["t"] > 0) & (p["gap"] > 1e-11)
        ax.semilogx(
            p["t"][ok], p["gap"][ok] / law.gap(p["t"][ok]), "-", color=f"C{k}", label=scheme
        )
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set(
        xlabel="t (depth)",
        ylabel="(1 - rho) / predicted law C f(t) (dimensionless)",
        ylim=(0, 3),
        title="particles over the asymptotic law of equiangular_asymptotics: -> 1",
    )
    ax.legend(fontsize=7)
    paths.append(save_figure(fig, out / "normalization_compensated.png", dpi=90))

    fig, ax = subplots(figsize=(6.5, 4.5), layout="constrained")
    for k, (scheme, runs) in enumerate(rnd.items()):
        for s, p in enumerate(runs):
            label = scheme if s == 0 else None
            ax.loglog(p["t"][1:], p["gap"][0] - p["gap"][1:], "-", color=f"C{k}", lw=1, label=label)
            ax.loglog(p["t"][1:], p["gap_ode"][0] - p["gap_ode"][1:], "--", color=f"C{k}", lw=1)
    ax.set(
        xlabel="t (depth)",
        ylabel="decrease of 1 - mean cosine since t = 0 (dimensionless)",
        title=f"n = {n_r} random tokens, d = {d}, beta = sqrt(d): solid tokens, dashed ODE",
    )
    ax.legend(fontsize=7)
    paths.append(save_figure(fig, out / "normalization_random.png", dpi=90))
    return paths
