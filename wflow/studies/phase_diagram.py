r"""The GLPR phase diagram of clustering, and how much of it is the discretization (``phase-diagram``).

Geshkovski, Letrouit, Polyanskiy & Rigollet, *A mathematical perspective on Transformers* (GLPR,
2023/2025): SA with :math:`Q = K = V = I` on :math:`n = 32` i.i.d. uniform tokens on :math:`S^{d-1}`,
the fraction of pairs with cosine above 0.999 (:func:`wflow.diagnostics.pair_fraction`) over
:math:`(t, \beta)`, whose 0.5-level should approach the equiangular curve :math:`t^*(\beta)`
(:func:`wflow.theory.equiangular_time`) as :math:`d` grows.  On the same starts the study runs the
published scheme (``euler-average``, step 0.1), projected Euler (``euler``), ``dopri5`` and both
Euler variants at step 0.01 (:data:`SCHEMES`), and reports per :math:`(d, \beta)` the crossing time
:math:`t_{1/2}` of the mean pair fraction, its gap to :math:`t^*` and each scheme's delay.  Every
:math:`(d, \beta, \text{scheme}, \text{chunk})` is one part of :class:`~wflow.studies.parts.Parts`.
Details and measured values: docs/papers/phase_diagram.md.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..models import SA
from ..solvers.control import StepControl
from ..solvers.particles import simulate
from ..solvers.saveat import SaveAt
from ..solvers.trackers import Record
from ..theory import equiangular_time
from .parts import Parts
from .progress import steps
from .report import StudyReport, register, save_figure, subplots

__all__ = [
    "phase_diagram_study",
    "SCHEMES",
    "QUICK",
    "FULL",
    "checkpoints",
    "t_end_for",
    "initial_points",
    "pair_fraction_curves",
    "crossing_time",
    "density_curve",
    "curve_part",
    "curve_part_key",
    "plot_heat",
]

#: tokens, the published horizon and number of checkpoints, the pair threshold
N_TOKENS = 32
T_PUBLISHED = 30.0
N_CHECKPOINTS = 200
SPACING = T_PUBLISHED / (N_CHECKPOINTS - 1)
THRESHOLD = 0.999
#: the latest time any part runs to (t* at beta = 9 is 179: beyond it the crossing is reported as missing)
T_MAX = 120.0

#: scheme -> simulate keywords
SCHEMES: dict[str, dict[str, Any]] = {
    "original": {"method": "euler-average", "dt": 0.1},
    "projected": {"method": "euler", "dt": 0.1},
    "dopri5": {"method": "dopri5", "rtol": 1e-6, "atol": 1e-9},
    "original-fine": {"method": "euler-average", "dt": 0.01},
    "projected-fine": {"method": "euler", "dt": 0.01},
}

#: the plans: dimensions; the heat map's betas (original scheme); the betas where every scheme runs; the
#: dimensions where the eta = 0.01 schemes run (the step's effect does not depend on d; in d = 1024 they alone
#: would take ~40 CPU hours here); systems of the heat map; systems of the scheme comparison (the first
#: chunks: every scheme on the same starts, the published one included); systems per batched call (one part each)
QUICK: dict[str, Any] = {
    "dims": (8, 128),
    "heat_betas": (1.0, 2.0, 3.0, 4.0, 5.0, 6.0),
    "compare_betas": (1.0, 3.0, 5.0),
    "fine_dims": (8,),
    "systems": 24,
    "compare_systems": 24,
    "chunk": 256,
}
FULL: dict[str, Any] = {
    "dims": (8, 128, 1024),
    "heat_betas": tuple(round(float(b), 6) for b in np.linspace(0.1, 9, 90)),
    "compare_betas": (1.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0),
    "fine_dims": (8, 128),
    "systems": 2048,
    "compare_systems": 512,
    "chunk": 256,
}


def t_end_for(beta: float, scheme: str = "original", n: int = N_TOKENS) -> float:
    """The horizon of a part, on the checkpoint grid: for the heat map (``original``) the published 30, or
    2 t* (at most :data:`T_MAX`) when that is later; the other schemes stop at 3 t* if that is earlier (only
    the crossing of 0.5 is read from them, and in d = 8 it comes as late as ~1.9 t*).

    Examples
    --------
    >>> round(t_end_for(1.0), 6), round(t_end_for(5.0, "dopri5"), 6)
    (30.0, 28.643216)
    """
    ts = float(equiangular_time(beta, n, THRESHOLD))
    t = max(T_PUBLISHED, min(2.0 * ts, T_MAX))
    if scheme != "original":
        t = min(t, 3.0 * ts)
    return math.ceil(t / SPACING - 1e-9) * SPACING


def checkpoints(t_end: float) -> np.ndarray:
    """The published checkpoints ``linspace(0, 30, 200)``, continued with the same spacing up to ``t_end``.

    Examples
    --------
    >>> c = checkpoints(30.0)
    >>> c.shape, round(float(c[1]), 6), round(float(c[-1]), 9)
    ((200,), 0.150754, 30.0)
    """
    return np.arange(int(round(t_end / SPACING)) + 1) * SPACING


def initial_points(d: int, chunk: int, size: int, n: int = N_TOKENS) -> np.ndarray:
    """``size`` systems of ``n`` i.i.d. uniform points on :math:`S^{d-1}`, shape ``(size, n, d)``; the same
    for every beta and scheme (seeded by ``(d, chunk)``).

    Examples
    --------
    >>> x = initial_points(3, 0, 2, n=4)
    >>> x.shape, bool(np.allclose(np.linalg.norm(x, axis=-1), 1.0)), bool(np.array_equal(x, initial_points(3, 0, 2, n=4)))
    ((2, 4, 3), True, True)
    """
    g = np.random.default_rng([15, d, chunk]).standard_normal((size, n, d))
    return g / np.linalg.norm(g, axis=-1, keepdims=True)


def pair_fraction_curves(
    x0: np.ndarray, beta: float, scheme: str, t_end: float, save_at: Sequence[float] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Run ``scheme`` (:data:`SCHEMES`) from ``x0`` (shape ``(B, n, d)``) for SA(beta) and return
    ``(times, fractions)``: the save times and the pair fraction of every system at each, shape ``(T, B)``.
    A fixed-step scheme records, as the published loop does, the step nearest each checkpoint.

    Examples
    --------
    Four tokens at one point: every pair is closer than the threshold from the start.

    >>> x0 = np.tile([[1.0, 0.0, 0.0]], (1, 4, 1))
    >>> t, f = pair_fraction_curves(x0, 1.0, "original", 0.2, save_at=[0.0, 0.1, 0.2])
    >>> t, f.ravel()
    (array([0. , 0.1, 0.2]), array([1., 1., 1.]))
    """
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {list(SCHEMES)}, got {scheme!r}")
    saves = checkpoints(t_end) if save_at is None else np.asarray(save_at, dtype=float)
    dt = SCHEMES[scheme].get("dt")
    if dt is not None:  # the published loop's records: the step nearest each checkpoint
        saves = np.unique(np.round(saves / dt)) * dt
    record = Record("pair_fraction")
    # span coordinates: n = 32 numbers per token whatever d (exact for SA with Q = K = V = I; the pair
    # fraction is computed from them), so d = 1024 costs what d = 32 does
    saving = SaveAt(saves, points=False, diagnostics=("pair_fraction",))
    kw = dict(SCHEMES[scheme])
    if "rtol" in kw:  # the stored part keys keep the tolerances flat; simulate takes them grouped
        kw["control"] = StepControl(rtol=kw.pop("rtol"), atol=kw.pop("atol"))
    simulate(
        SA(beta), x0, float(saves[-1]), save_at=saving, trackers=[record], coordinates="span", **kw
    )
    return np.array(record.times), np.array(record.values["pair_fraction"])


def crossing_time(times: np.ndarray, curve: np.ndarray, level: float = 0.5) -> float:
    """First time ``curve`` reaches ``level``, linear between the two checkpoints around it; NaN if never.

    Examples
    --------
    >>> crossing_time(np.array([0.0, 1.0, 2.0]), np.array([0.0, 0.4, 0.8]))
    1.25
    >>> crossing_time(np.array([0.0, 1.0]), np.array([0.0, 0.1]))
    nan
    """
    curve = np.asarray(curve, dtype=float)
    above = np.flatnonzero(curve >= level)
    if above.size == 0:
        return math.nan
    k = int(above[0])
    if k == 0:
        return float(times[0])
    c0, c1 = curve[k - 1], curve[k]
    return float(times[k - 1] + (level - c0) / (c1 - c0) * (times[k] - times[k - 1]))


def curve_part_key(d: int, beta: float, scheme: str, chunk: int, size: int) -> dict[str, Any]:
    """The key of :func:`curve_part`'s stored part (:class:`~wflow.studies.parts.Parts`): its arguments,
    the scheme's step settings, its horizon and the number of tokens.

    Examples
    --------
    >>> key = curve_part_key(3, 1.0, "projected", 0, 2)
    >>> key["scheme"], key["chunk"], key["size"], key["n"]
    ('projected', 0, 2, 32)
    """
    return {
        "d": d,
        "beta": float(beta),
        "scheme": scheme,
        **SCHEMES[scheme],
        "chunk": chunk,
        "size": size,
        "t_end": round(t_end_for(beta, scheme), 9),
        "n": N_TOKENS,
    }


def curve_part(d: int, beta: float, scheme: str, chunk: int, size: int) -> dict[str, Any]:
    """One part: ``size`` systems (chunk ``chunk`` of dimension ``d``) run by ``scheme`` to ``t_end_for(beta, scheme)``;
    the sums and sums of squares of their pair fractions at the checkpoints, and the compute seconds.

    Examples
    --------
    >>> p = curve_part(3, 1.0, "original", 0, 2)  # doctest: +SKIP
    >>> p["times"].shape, p["count"]  # doctest: +SKIP
    ((200,), 2)
    """
    start = time.perf_counter()
    t, f = pair_fraction_curves(
        initial_points(d, chunk, size), beta, scheme, t_end_for(beta, scheme)
    )
    return {
        "times": t,
        "sum": f.sum(axis=1),
        "sum2": (f * f).sum(axis=1),
        "count": size,
        "seconds": time.perf_counter() - start,
    }


def _chunks(systems: int, chunk: int) -> list[tuple[int, int]]:
    return [(c, min(chunk, systems - c * chunk)) for c in range(math.ceil(systems / chunk))]


def density_curve(
    parts: Parts, d: int, beta: float, scheme: str, systems: int, chunk: int = 256
) -> dict[str, Any]:
    """Mean and standard error over ``systems`` of the pair fraction at the checkpoints of ``t_end_for(beta, scheme)``,
    one part per chunk of systems (:func:`curve_part`); returns ``times``, ``mean``, ``sem``, ``systems`` and
    ``seconds`` (the parts' compute seconds, whenever and wherever they were computed).

    Examples
    --------
    >>> import pathlib, tempfile  # doctest: +SKIP
    >>> parts = Parts(pathlib.Path(tempfile.mkdtemp()), "pd", quick=True)  # doctest: +SKIP
    >>> c = density_curve(parts, 3, 1.0, "original", 2)  # doctest: +SKIP
    >>> c["times"].shape, float(c["mean"][0]), float(c["mean"][-1])  # doctest: +SKIP
    ((200,), 0.0, 1.0)
    """
    total, total2, count, seconds, times = 0.0, 0.0, 0, 0.0, None
    for c, size in _chunks(systems, chunk):
        args = (d, beta, scheme, c, size)
        p = parts.get(curve_part_key(*args), functools.partial(curve_part, *args))
        times = p["times"]
        total, total2, count = total + p["sum"], total2 + p["sum2"], count + int(p["count"])
        seconds += float(p["seconds"])
    mean = total / count
    var = np.maximum(total2 / count - mean**2, 0.0)
    return {
        "times": times,
        "mean": mean,
        "sem": np.sqrt(var / max(count - 1, 1)),
        "seconds": seconds,
        "systems": count,
    }


def _plan_curves(plan: dict[str, Any]) -> list[tuple[int, float, str]]:
    """Every (d, beta, scheme) curve of a plan, in the order the study reads them."""
    out = []
    for d in plan["dims"]:
        for beta in sorted(set(plan["heat_betas"]) | set(plan["compare_betas"])):
            names = ["original"]
            if beta in plan["compare_betas"]:
                names += ["projected", "dopri5"]
                if d in plan["fine_dims"]:
                    names += ["original-fine", "projected-fine"]
            out += [(d, beta, s) for s in names]
    return out


def _distance(a: dict, b: dict) -> float:
    """Largest difference of two mean curves on the common checkpoints (nearest-time matching)."""
    m = min(len(a["mean"]), len(b["mean"]))
    return float(np.max(np.abs(a["mean"][:m] - b["mean"][:m])))


def _curves(
    parts: Parts, plan: dict[str, Any]
) -> tuple[dict[tuple[int, float], dict], dict[tuple[int, float, str], dict], dict[str, float]]:
    """Every (d, beta, scheme) mean curve of the plan through the stored parts (computed costliest first):
    the heat map's curves, the compared curves (every scheme on the same starts), compute seconds."""
    heat: dict[tuple[int, float], dict] = {}
    curves: dict[tuple[int, float, str], dict] = {}
    seconds: dict[str, float] = {}
    todo = _plan_curves(plan)

    def systems(beta, scheme):
        heat_curve = scheme == "original" and beta in plan["heat_betas"]
        return plan["systems"] if heat_curve else plan["compare_systems"]

    # the costliest parts first (long horizons, small steps, dopri5), so the workers finish together
    jobs = [
        (curve_part_key(d, b, s, c, size), curve_part, (d, b, s, c, size))
        for d, b, s in todo
        for c, size in _chunks(systems(b, s), plan["chunk"])
    ]
    weight = {"original": 1, "projected": 1, "dopri5": 6, "original-fine": 10, "projected-fine": 10}
    jobs.sort(key=lambda j: -weight[j[2][2]] * t_end_for(j[2][1], j[2][2]))
    parts.prefetch(jobs)
    what = f"pair-fraction curves of {len(todo)} (d, beta, scheme), {len(jobs)} parts"
    for d, beta, s in steps(parts.study, what, todo):
        c = density_curve(parts, d, beta, s, systems(beta, s), plan["chunk"])
        seconds[f"d={d} {s}"] = seconds.get(f"d={d} {s}", 0.0) + c["seconds"]
        if s == "original" and beta in plan["heat_betas"]:
            heat[(d, beta)] = c
        if (
            s == "original"
            and beta in plan["compare_betas"]
            and systems(beta, s) != plan["compare_systems"]
        ):
            # the comparison reads every scheme on the same starts: the published curve of the first chunks
            # (already computed: the heat map's first parts)
            c = dict(
                density_curve(parts, d, beta, s, plan["compare_systems"], plan["chunk"]),
                seconds=0.0,
            )
        curves[(d, beta, s)] = c
    return heat, curves, seconds


def _tstar(plan: dict[str, Any]) -> dict[float, float]:
    """t*(beta, n = 32) of the equiangular ODE, for every beta of the plan (the root's accuracy against the
    ODE's solution and a quadrature of 1/F is a fast contract, asserted by the tests, not here)."""
    betas = sorted(set(plan["heat_betas"]) | set(plan["compare_betas"]))
    return {b: float(equiangular_time(b, N_TOKENS, THRESHOLD)) for b in betas}


def _rows(
    rep: StudyReport,
    plan: dict[str, Any],
    heat: dict[tuple[int, float], dict],
    curves: dict[tuple[int, float, str], dict],
    tstar: dict[float, float],
) -> None:
    """One row per curve: crossing time, gap to t*, delays, distance to the ODE's curve."""
    for (d, beta, s), c in curves.items():
        t_half = crossing_time(c["times"], c["mean"])
        ref = curves.get((d, beta, "dopri5"))
        proj = curves.get((d, beta, "projected"))
        row = {
            "d": d,
            "beta": beta,
            "scheme": s,
            **{k: v for k, v in SCHEMES[s].items() if k != "atol"},
            "systems": c["systems"],
            "t_half": t_half,
            "t_star": tstar[beta],
            "gap": t_half - tstar[beta],
            "gap_checkpoints": (t_half - tstar[beta]) / SPACING,
            "t_end": float(c["times"][-1]),
            "max_sem": float(np.max(c["sem"])),
        }
        if ref is not None:
            row["distance_to_dopri5"] = _distance(c, ref)
        if proj is not None and s == "original":
            row["delay_vs_projected_checkpoints"] = (
                t_half - crossing_time(proj["times"], proj["mean"])
            ) / SPACING
        if s == "original" and (d, beta) in heat:
            row["heat_systems"] = plan["systems"]
            row["t_half_heat"] = crossing_time(heat[(d, beta)]["times"], heat[(d, beta)]["mean"])
        rep.rows.append(row)


@register("phase-diagram", group="papers")
def phase_diagram_study(out: Path, quick: bool = True) -> StudyReport:
    """The GLPR phase diagram, three schemes beside the published one, and its gap to t*(beta) (module docstring).

    Examples
    --------
    >>> rep = phase_diagram_study("out/phase-diagram", quick=True)  # doctest: +SKIP
    >>> rep.name  # doctest: +SKIP
    'phase-diagram'
    """
    rep = StudyReport("phase-diagram")
    plan = QUICK if quick else FULL
    parts = Parts(out, "phase-diagram", quick)
    heat, curves, seconds = _curves(parts, plan)
    tstar = _tstar(plan)
    _rows(rep, plan, heat, curves, tstar)
    rows = {(r["d"], r["beta"], r["scheme"]): r for r in rep.rows}
    cb = plan["compare_betas"]

    # -- how much of the published diagram is the discretization (crossing times, in checkpoints)
    def th(d, b, s):
        return rows[(d, b, s)]["t_half"]

    def crosses(d, b, *schemes):
        """Every scheme's mean curve crosses 0.5 within its horizon (d = 8 at large beta lags past it)."""
        return all(np.isfinite(th(d, b, s)) for s in schemes)

    pairs = [
        (d, b) for d in plan["dims"] for b in cb if crosses(d, b, "original", "projected", "dopri5")
    ]
    missing = [(d, b) for d in plan["dims"] for b in cb if (d, b) not in pairs]
    if missing:
        rep.notes.append(
            "no 0.5-crossing within the horizon (left out of the eta = 0.1 scheme comparison): "
            + ", ".join(f"d={d} beta={b:g}" for d, b in missing)
        )

    def shift(d, b, s, r):
        return (th(d, b, s) - th(d, b, r)) / SPACING

    delays = [shift(d, b, "original", "projected") for d, b in pairs]
    rel = [shift(d, b, "original", "projected") * SPACING / th(d, b, "projected") for d, b in pairs]
    rep.expect(
        "eta=0.1: original crosses 0.5 later than projected (min delay over d, beta, in checkpoints)",
        float(np.min(delays)),
        1.0,
        math.inf,
    )
    # the original moves tokens by 1/(1 + eta<x,Ax>) >= 1/(1 + eta) of the projected step: a time dilation of at
    # most eta = 0.1 (10 % allowed on top for the O(eta^2) terms and the sampling of 0.5-crossings)
    rep.expect(
        "eta=0.1: relative delay (t_orig - t_proj)/t_proj, max over d, beta (dilation <= eta)",
        float(np.max(rel)),
        0.0,
        0.11,
    )
    rep.expect(
        "eta=0.1: projected Euler's crossing vs the ODE's (dopri5), max |shift| in checkpoints",
        float(np.max([abs(shift(d, b, "projected", "dopri5")) for d, b in pairs])),
        0.0,
        1.5,
    )
    rep.expect(
        "eta=0.1: original's crossing vs the ODE's (dopri5), min shift in checkpoints",
        float(np.min([shift(d, b, "original", "dopri5") for d, b in pairs])),
        1.0,
        math.inf,
    )
    fine = [
        (d, b)
        for d in plan["fine_dims"]
        for b in cb
        if (d, b) in pairs and crosses(d, b, "original-fine", "projected-fine")
    ]
    if fine:
        agree = max(
            abs(th(d, b, "original-fine") / th(d, b, "projected-fine") - 1) for d, b in fine
        )
        rep.notes.append(
            "eta=0.01: t_half original - projected in checkpoints: "
            + "; ".join(
                f"d={d} beta={b:g}: {shift(d, b, 'original-fine', 'projected-fine'):.2f}"
                for d, b in fine
            )
        )
        to_ode = (
            max(abs(th(d, b, "projected-fine") - th(d, b, "dopri5")) for d, b in fine) / SPACING
        )
        rep.expect(
            "eta=0.01: |t_orig/t_proj - 1|, max (dilation <= eta = 0.01: within one checkpoint up to t = 15)",
            agree,
            0.0,
            0.011,
        )
        rep.expect(
            "eta=0.01: |t_half projected - t_half dopri5| in checkpoints (max)", to_ode, 0.0, 1.0
        )

    # -- the gap to the equiangular curve shrinks with d (the ODE's diagram: dopri5)
    d0, d1 = min(plan["dims"]), max(plan["dims"])
    both = [b for b in cb if crosses(d0, b, "dopri5") and crosses(d1, b, "dopri5")]
    g0 = np.mean([abs(rows[(d0, b, "dopri5")]["gap"]) for b in both]) if both else np.nan
    g1 = np.mean([abs(rows[(d1, b, "dopri5")]["gap"]) for b in both]) if both else np.nan
    rep.expect(
        f"dopri5: mean |t_half - t*| over beta at d={d1} / at d={d0} (gap shrinks with d)",
        g1 / g0,
        0.0,
        1.0,
    )
    low = [b for b in cb if b <= 4.0]
    worst = max(abs(rows[(d1, b, "dopri5")]["gap_checkpoints"]) for b in low)
    rep.expect(f"dopri5, d={d1}: max |t_half - t*| over beta <= 4, in checkpoints", worst, 0.0, 2.0)

    for d in plan["dims"]:
        rep.notes.append(
            f"d={d}: t_half vs t* (original | projected | dopri5): "
            + "; ".join(
                f"beta={b:g}: "
                + " | ".join(
                    f"{rows[(d, b, s)]['t_half']:.2f}" for s in ("original", "projected", "dopri5")
                )
                + f" vs {tstar[b]:.2f}"
                for b in cb
            )
        )
    for d in plan["dims"]:
        rep.notes.append(
            f"d={d}: largest |mean fraction - dopri5's| over the checkpoints (original | projected): "
            + "; ".join(
                f"beta={b:g}: {rows[(d, b, 'original')]['distance_to_dopri5']:.3f} | "
                f"{rows[(d, b, 'projected')]['distance_to_dopri5']:.3f}"
                for b in cb
            )
        )
    rep.notes.append(
        "compute seconds of the parts (whenever and wherever computed): "
        + ", ".join(f"{k} {v:.1f}" for k, v in seconds.items())
        + f"; total {sum(seconds.values()):.0f}"
    )
    rep.notes.append(parts.note())
    rep.figures += _figures(out, plan, heat, curves, tstar, rows)
    return rep


def _figures(out: Path, plan, heat, curves, tstar, rows) -> list[Path]:
    paths = []
    dims = plan["dims"]
    hb = sorted(plan["heat_betas"])
    fig, axes = subplots(1, len(dims), figsize=(4.2 * len(dims), 3.8), sharey=True, squeeze=False)
    for ax, d in zip(axes[0], dims):
        m = len(checkpoints(T_PUBLISHED))
        z = np.array([heat[(d, b)]["mean"][:m] for b in hb])
        t = heat[(d, hb[0])]["times"][:m]
        im = plot_heat(ax, t, np.array(hb), z)
        bs = np.linspace(min(hb), max(hb), 200)
        t_star = np.minimum(equiangular_time(bs, N_TOKENS, THRESHOLD), 1e3)
        ax.plot(t_star, bs, "w-", lw=1.5, label="$t^*(\\beta)$")
        th = [crossing_time(heat[(d, b)]["times"], heat[(d, b)]["mean"]) for b in hb]
        ax.plot(th, hb, "o", color="tab:red", ms=3, label="0.5 level")
        ax.set_xlim(0, T_PUBLISHED)
        ax.set_title(f"d = {d}: published scheme, $\\eta$ = 0.1", fontsize=9)
        ax.set_xlabel("t (time = depth)")
        ax.legend(fontsize=7, loc="lower right")
    axes[0][0].set_ylabel("$\\beta$")
    fig.colorbar(
        im, ax=axes[0].tolist(), label="fraction of pairs with $\\langle x_i, x_j\\rangle > 0.999$"
    )
    paths.append(save_figure(fig, Path(out) / "phase_diagram_heat.png", dpi=110))

    cb = plan["compare_betas"]
    d = plan["fine_dims"][0] if plan["fine_dims"] else dims[0]
    fig, axes = subplots(1, len(cb), figsize=(4.0 * len(cb), 3.4), squeeze=False)
    for ax, b in zip(axes[0], cb):
        for s, style in (
            ("original", "-"),
            ("projected", "--"),
            ("dopri5", "k:"),
            ("original-fine", "-"),
            ("projected-fine", "--"),
        ):
            if (d, b, s) in curves:
                c = curves[(d, b, s)]
                ax.plot(c["times"], c["mean"], style, lw=1.2, label=s)
        ax.axvline(tstar[b], color="grey", lw=0.8)
        ax.set_xlim(0, min(curves[(d, b, "dopri5")]["times"][-1], 2.2 * tstar[b] + 2))
        ax.set(title=f"d = {d}, $\\beta$ = {b:g} (grey: $t^*$)", xlabel="t (time = depth)")
    axes[0][0].set_ylabel("mean fraction of pairs > 0.999")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    paths.append(save_figure(fig, Path(out) / "phase_diagram_schemes.png", dpi=110))

    fig, ax = subplots(figsize=(5.2, 3.6))
    for dd in dims:
        for s, mk in (("original", "o-"), ("dopri5", "s--")):
            g = [rows[(dd, b, s)]["gap"] for b in cb]
            ax.plot(cb, g, mk, ms=4, label=f"d={dd} {s}")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("$\\beta$")
    ax.set_ylabel("$t_{1/2} - t^*(\\beta)$ (time units)")
    ax.set_title("gap of the 0.5 level to the equiangular curve")
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(save_figure(fig, Path(out) / "phase_diagram_gap.png", dpi=110))
    return paths


def plot_heat(ax, t: np.ndarray, betas: np.ndarray, z: np.ndarray):
    """Draw the heat map ``z`` (shape ``(len(betas), len(t))``) over (t, beta) with cell edges halfway between values.

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> import matplotlib.pyplot as plt
    >>> fig, ax = plt.subplots()
    >>> mesh = plot_heat(ax, np.array([0.0, 1.0, 2.0]), np.array([1.0, 2.0]), np.zeros((2, 3)))
    >>> type(mesh).__name__, mesh.get_array().shape
    ('QuadMesh', (2, 3))
    >>> plt.close(fig)
    """

    def edges(v):
        v = np.asarray(v, dtype=float)
        if v.size == 1:
            return np.array([v[0] - 0.5, v[0] + 0.5])
        mid = 0.5 * (v[1:] + v[:-1])
        return np.concatenate([[v[0] - (mid[0] - v[0])], mid, [v[-1] + (v[-1] - mid[-1])]])

    return ax.pcolormesh(
        edges(t), edges(betas), z, vmin=0.0, vmax=1.0, cmap="viridis", shading="flat"
    )
