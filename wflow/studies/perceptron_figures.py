"""The perceptron study's figures (:mod:`wflow.studies.perceptron`): each ``draw_*`` fills one axes from
what an experiment returned; :func:`save_figure` writes it without pyplot's global state left behind."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from . import report
from .perceptron_checks import POSTER_E4

__all__ = ["save_figure", "draw_e1", "draw_e23", "draw_e4_masses", "draw_e5", "draw_sweep"]


def save_figure(out: Path, name: str, draw: Callable[[Any], None]) -> Path:
    """``draw(ax)`` on a new figure, written to ``out / f"perceptron_{name}.png"``; returns the path."""
    fig, ax = report.subplots(figsize=(5.2, 3.8), layout="constrained")
    draw(ax)
    return report.save_figure(fig, out / f"perceptron_{name}.png", dpi=80)


def draw_e1(ax: Any, e1: dict[tuple[int, float], tuple], betas: tuple[float, ...]) -> None:
    """E1: clusters at the stop (mean over seeds) against sqrt(beta), ascent and descent."""
    for sign, mk in ((1, "o"), (-1, "x")):
        clusters = [np.mean(e1[(sign, b)][0]) for b in betas]
        ax.plot(np.sqrt(betas), clusters, mk + "-", label="ascent" if sign > 0 else "descent")
    ax.set(
        xlabel="sqrt(beta)",
        ylabel="clusters at the stop (mean over seeds)",
        yscale="log",
        title="E1: attention on S^1",
    )
    ax.legend()


def draw_e23(ax: Any, locs: dict[str, list]) -> None:
    """E2/E3: the heavy atoms' angles of every seed against sqrt(beta), one colour per regime."""
    for i, (tag, rows) in enumerate(locs.items()):
        for beta, per_seed in rows:
            for th in per_seed:
                ax.plot(np.full(th.size, np.sqrt(beta)) + 0.04 * i, th, ".", ms=3, color=f"C{i}")
        ax.plot([], [], ".", color=f"C{i}", label=tag)
    ax.set(
        xlabel="sqrt(beta)",
        ylabel="heavy atom angle (rad), all seeds",
        title="E2/E3: atoms across seeds",
    )
    ax.legend(fontsize=7)


def draw_e5(ax: Any, e5: dict[str, list], betas: tuple[float, ...]) -> None:
    """E5: heavy clusters on S^2 against sqrt(beta) beside the corollary's 4 (1 + sqrt(beta))."""
    for tag, rows in e5.items():
        ax.plot([np.sqrt(b) for b, _ in rows], [h for _, h in rows], "o-", ms=3, label=tag)
    s = np.sqrt(np.array(betas))
    ax.plot(s, 4 * (1 + s), "k--", label="4 (1 + sqrt beta)")
    ax.set(
        xlabel="sqrt(beta)", ylabel="heavy clusters (mass >= 0.05)", title="E5: S^2", yscale="log"
    )
    ax.legend(fontsize=6)


def draw_e4_masses(ax: Any, e4: dict[int, list], limit: float) -> None:
    """E4's three masses against sqrt(beta), one colour per d, beside :data:`POSTER_E4` (grey)."""
    allb = sorted({b for rows in e4.values() for b, *_ in rows})
    lo = np.sqrt(max(POSTER_E4["beta_min"], min(allb)))
    hi = np.sqrt(max(allb))
    ax.axhspan(*POSTER_E4["largest"], color="0.85", label="poster: largest")
    for key, ls in (("second", "--"), ("third", ":")):
        ax.plot([lo, hi], POSTER_E4[key], color="0.4", ls=ls, lw=2, label=f"poster: {key}")
    for i, (d, rows) in enumerate(sorted(e4.items())):
        s = np.sqrt([b for b, *_ in rows])
        for j, mk in enumerate(("o-", "x--", "^:")):
            m = [r[1][j] if len(r[1]) > j else 0.0 for r in rows]
            ax.plot(s, m, mk, color=f"C{i}", ms=3, label=f"d={d}" if j == 0 else None)
    ax.axhline(limit, color="k", lw=0.8, label=f"limit {limit:.4f}")
    ax.set(
        xlabel="sqrt(beta)",
        ylabel="mass of the 1st (o), 2nd (x), 3rd (^) cluster",
        title="E4: descent + GELU, threshold 1/(2 sqrt beta)",
        ylim=(0, 1),
    )
    ax.legend(fontsize=6, ncol=2)


def draw_sweep(ax: Any, sweep: dict[tuple[str, int], list]) -> None:
    """The MLP-scale sweep: stopping time against |omega|, log-log, one line per attention and sign."""
    for (att, sign), rows in sweep.items():
        label = f"{att} {'ascent' if sign > 0 else 'descent'}"
        style = "o-" if att == "USA" else "s--"
        ax.plot([r[0] for r in rows], [r[1] for r in rows], style, ms=3, label=label)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="|omega|",
        ylabel="stopping time (paper time)",
        title="MLP-scale sweep, GELU, S^1",
    )
    ax.legend(fontsize=7)
