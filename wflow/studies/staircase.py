r"""The energy staircase of metastable clustering: ``wflow validate staircase [--quick]``.

Geshkovski, Koubbi, Polyanskiy & Rigollet, *Dynamic metastability in the self-attention model*
(2024): five tokens on :math:`S^1` (:func:`initial_angles`), USA in the rescaled kernel
:math:`e^{\beta(\langle x,y\rangle - 1)}`, :math:`\beta \in \{500, 1000, 2000, 4000\}`.  The energy
climbs a staircase of plateaus (clusters at rest) and fast merges.  Checked: every merge
5 -> 4 -> 3 -> 2 -> 1 is resolved (gap coordinates, ``ros2``), the plateau energies
:math:`\sum_a m_a^2/(2\beta)` (:func:`plateau_energies`) and that the energy never decreases, and
each metastable merge time against the two-cluster law (:func:`two_cluster_log_time`) within 1 % of
its logarithm; the slopes of :math:`\log t_k` against :math:`(\log\beta)^2` are reported.  Details
and measured values: docs/papers/staircase.md.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..models import USA
from ..solvers.base import Tracker
from ..solvers.control import StepControl
from ..solvers.particles import simulate
from ..solvers.saveat import SaveAt
from .parts import Parts
from .progress import numbered
from .report import StudyReport, register, save_figure, subplots

__all__ = ["initial_angles", "run_staircase", "two_cluster_log_time", "plateau_energies", "BETAS"]

BETAS = (500.0, 1000.0, 2000.0, 4000.0)
T_END = 1e150
#: a gap below this (radians) is a merged pair
MERGED = 1e-6


def initial_angles(beta: float) -> np.ndarray:
    r"""GKPR's start :math:`\tfrac12[0, \tfrac12, 2, 4, 7]\log\beta/\sqrt\beta`.

    Examples
    --------
    >>> import numpy as np
    >>> np.round(initial_angles(4000.0), 4)
    array([0.    , 0.0328, 0.1311, 0.2623, 0.459 ])
    """
    return 0.5 * np.array([0.0, 0.5, 2.0, 4.0, 7.0]) * np.log(beta) / np.sqrt(beta)


def two_cluster_log_time(beta: float, delta: float, mass: float, ratio: float = 0.5) -> float:
    r"""``log t`` for two point clusters of total mass ``mass`` (rescaled USA) to go from gap ``delta`` to
    ``ratio * delta``: :math:`t = \int_{r\delta}^{\delta} e^{2\beta\sin^2(u/2)}/(M\sin u)\,du`, by quadrature
    of the integrand scaled by its largest value (finite for any beta).

    Examples
    --------
    At beta = 4000 two clusters at gap 0.3 take :math:`e^{172.8}` to halve it; at beta = 2 the integral
    is small enough to check against a direct quadrature:

    >>> import math
    >>> from scipy.integrate import quad
    >>> round(two_cluster_log_time(4000.0, 0.3, 1.0), 2)
    172.8
    >>> direct = quad(lambda u: math.exp(4 * math.sin(u / 2) ** 2) / math.sin(u), 0.25, 0.5)[0]
    >>> abs(math.exp(two_cluster_log_time(2.0, 0.5, 1.0)) / direct - 1) < 1e-12
    True
    """
    from scipy.integrate import quad

    top = 2 * beta * np.sin(delta / 2) ** 2
    val, _ = quad(
        lambda u: np.exp(2 * beta * np.sin(u / 2) ** 2 - top) / np.sin(u),
        ratio * delta,
        delta,
        epsabs=0,
        epsrel=1e-12,
        limit=200,
    )
    return float(top + np.log(val / mass))


class _Steps(Tracker):
    """Keeps (t, state) of every accepted step: merge times from the full step sequence."""

    def __init__(self):
        self.t: list[float] = []
        self.y: list[np.ndarray] = []

    def step(self, t, dt, res):
        self.t.append(t)
        self.y.append(np.array(res.y, copy=True))


def run_staircase(beta: float, rtol: float) -> dict[str, Any]:
    """One staircase run: save times, log-energy, gaps at saves and at every step, wall time, steps.

    Examples
    --------
    Skipped in the doctests (about 4 s):

    >>> part = run_staircase(500.0, 1e-4)  # doctest: +SKIP
    >>> part["status"], part["times"][-1]  # doctest: +SKIP
    (0, 1e+150)
    """
    th = initial_angles(beta)
    x0 = np.stack([np.cos(th), np.sin(th)], axis=-1)
    saves = np.concatenate([[0.0], np.logspace(-3, np.log10(T_END), 307)])
    steps = _Steps()
    t0 = time.perf_counter()
    r = simulate(
        USA(beta, kernel="rescaled"),
        x0,
        T_END,
        method="ros2",
        control=StepControl(rtol=rtol, atol=1e-10),
        save_at=SaveAt(saves, diagnostics=("log_energy",)),
        coordinates="gaps",
        trackers=[steps],
        throw=False,
    )
    return {
        "times": r.times,
        "log_energy": r.diagnostics["log_energy"],
        "gaps": r.data["gaps"][1],
        "step_t": np.array(steps.t),
        "step_gaps": np.array(steps.y),
        "wall": time.perf_counter() - t0,
        "steps": int(r.stats["steps"][-1]),
        "status": r.status,
        "message": r.message,
    }


def plateau_energies(masses_per_plateau: list[list[float]], beta: float) -> list[float]:
    r""":math:`\sum_a m_a^2/(2\beta)` per plateau (clusters at rest, cross terms dropped).

    Examples
    --------
    >>> [round(e * 2 * 4000, 12) for e in plateau_energies([[0.6, 0.4], [1.0]], 4000.0)]
    [0.52, 1.0]
    """
    return [float(np.sum(np.square(m)) / (2 * beta)) for m in masses_per_plateau]


def _clusters(gaps: np.ndarray) -> list[list[int]]:
    """Particles (sorted order) grouped by merged neighbours; gaps of shape (n,) = (theta_0, g_1..g_{n-1})."""
    groups = [[0]]
    for i, g in enumerate(gaps[1:], start=1):
        if abs(g) < MERGED:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _merges(part: dict[str, Any], beta: float) -> list[dict[str, Any]]:
    """Each merge: the plateau before it (time, gap, masses), its time (gap at half its plateau value,
    interpolated in log t between steps) and the two-cluster prediction."""
    ts, ys = part["step_t"], part["step_gaps"]
    n = ys.shape[1]
    count = np.array([len(_clusters(y)) for y in ys])
    out = []
    for j in np.flatnonzero(np.diff(count) < 0):
        before = _clusters(ys[j])
        after = _clusters(ys[j + 1])
        # the pair that merged: the gap index closing between the two groupings
        closed = [i for i in range(1, n) if abs(ys[j, i]) >= MERGED and abs(ys[j + 1, i]) < MERGED]
        if len(closed) != 1:
            continue
        i = closed[0]
        # the plateau: go back while the gap is within 1e-3 of its value well before the merge
        g = np.abs(ys[:, i])
        start = j
        while start > 0 and len(_clusters(ys[start - 1])) == len(before) and g[start - 1] > 0:
            start -= 1
        # plateau gap: the gap when the time is sqrt(t_start * t_merge) (the middle of the plateau in log t)
        t_mid = np.sqrt(max(ts[start], 1e-3) * ts[j])
        k = int(np.searchsorted(ts, t_mid))
        delta = float(g[k])
        crossing = np.flatnonzero(
            (g[:-1] > delta / 2) & (g[1:] <= delta / 2) & (np.arange(len(g) - 1) >= k)
        )
        if crossing.size == 0:
            continue
        c = crossing[0]
        # log-linear interpolation of the crossing of delta/2
        a = (g[c] - delta / 2) / (g[c] - g[c + 1])
        t_half = (
            float(np.exp(np.log(ts[c]) + a * (np.log(ts[c + 1]) - np.log(ts[c]))))
            if ts[c] > 0
            else ts[c + 1]
        )
        grp = [grp for grp in before if i in grp or i - 1 in grp]
        mass = (len(grp[0]) + len(grp[1])) / n if len(grp) == 2 else float("nan")
        predicted = ts[k] + np.exp(two_cluster_log_time(beta, delta, mass))
        out.append(
            {
                "beta": beta,
                "clusters_after": len(after),
                "t_plateau": float(ts[k]),
                "gap": delta,
                "mass": mass,
                "t_half": t_half,
                "log_t_half": float(np.log(t_half)),
                "log_t_predicted": float(np.log(predicted)),
                "masses_before": [len(gr) / n for gr in before],
            }
        )
    return out


@register("staircase", group="papers")
def study(out: Path, quick: bool) -> StudyReport:
    rep = StudyReport("staircase")
    parts = Parts(out, "staircase", quick)
    rtol = 1e-4 if quick else 1e-6
    label = numbered(len(BETAS))
    runs = {
        b: parts.get(
            {"beta": b, "rtol": rtol, "t_end": T_END},
            functools.partial(run_staircase, b, rtol),
            what=label(f"beta = {b:g}: five tokens through the staircase to t = {T_END:g}"),
        )
        for b in BETAS
    }
    all_merges, worst_log, levels_err, monotone = [], 0.0, 0.0, True
    for beta, part in runs.items():
        ok = part["status"] == 0
        merges = _merges(part, beta)
        counts = [m["clusters_after"] for m in merges]
        done = float(ok and counts == [4, 3, 2, 1])
        rep.expect(
            f"beta={beta:g}: merges 5->4->3->2->1 completed (clusters after each)", done, 1, 1
        )
        le = part["log_energy"]
        monotone &= bool(np.all(np.diff(le) >= -1e-12))
        # plateau energies: the energy at each plateau's middle against sum m^2 / (2 beta)
        for m in merges:
            i = int(np.searchsorted(part["times"], m["t_plateau"]))
            level = np.log(plateau_energies([m["masses_before"]], beta)[0])
            m["log_energy_plateau"] = float(le[i])
            m["log_energy_clusters"] = float(level)
            # clusters at rest and metastable merges (not the five tokens' fast first collapse)
            if m["clusters_after"] <= 3:
                levels_err = max(levels_err, abs(le[i] - level))
                worst_log = max(worst_log, abs(m["log_t_predicted"] / m["log_t_half"] - 1))
        levels_err = max(levels_err, abs(le[-1] + np.log(2 * beta)))
        all_merges += merges
        rep.rows += [
            {k: v for k, v in m.items() if k != "masses_before"}
            | {"wall_s": part["wall"], "steps": part["steps"]}
            for m in merges
        ]
    rep.expect("energy never decreases (all beta)", float(monotone), 1, 1)
    rep.expect(
        "plateau log-energy vs log(sum m_a^2 / 2 beta), max |difference|", levels_err, 0, 1e-6
    )
    rep.expect("metastable merges: |log t / log t_two-cluster - 1|, max", worst_log, 0, 0.01)
    # plateau scaling: log t_k against (log beta)^2, per merge k
    for k, target in zip((4, 3, 2, 1), (0.25, 0.875, 1.5, 7 / 3)):
        pts = [
            (np.log(m["beta"]) ** 2, m["log_t_half"])
            for m in all_merges
            if m["clusters_after"] == k
        ]
        if len(pts) >= 2:
            x, y = np.array(pts).T
            slope = float(np.polyfit(x, y, 1)[0])
            rep.notes.append(
                f"merge to {k} clusters: log t fitted as {slope:.3f} (log beta)^2 + const over "
                f"beta = 500..4000; the gap of the merging pair, {target:.3g} s, gives "
                f"{target**2 / 2:.3f} (t ~ exp(beta delta^2 / 2))"
            )
            rep.rows.append(
                {
                    "merge_to": k,
                    "fitted_slope_log_t_vs_log2_beta": slope,
                    "naive_slope": target**2 / 2,
                }
            )
    rep.figures.append(_figure(out, runs))
    rep.notes.append(parts.note())
    rep.notes.append(
        "wall time per beta: "
        + ", ".join(f"{b:g}: {p['wall']:.1f} s ({p['steps']} steps)" for b, p in runs.items())
    )
    return rep


def _figure(out: Path, runs: dict[float, dict[str, Any]]) -> Path:
    fig, ax = subplots(figsize=(6.0, 3.8), layout="constrained")
    for beta, part in runs.items():
        t, le = part["times"][1:], part["log_energy"][1:]
        ax.plot(np.log10(t), np.exp(le) * 2 * beta, label=rf"$\beta={beta:g}$")
    for level in (7 / 25, 11 / 25, 13 / 25, 1.0):
        ax.axhline(level, color="0.7", lw=0.6, ls=":")
    ax.set_xlabel(r"$\log_{10} t$ (time in the rescaled kernel)")
    ax.set_ylabel(r"$2\beta\,E_\beta$ (rescaled energy)")
    ax.set_title("GKPR staircase: USA on $S^1$, n = 5")
    ax.legend(fontsize=8)
    return save_figure(fig, out / "staircase.png", dpi=90)
