r"""The mean-field study: finite-N particle systems against the continuum on :math:`S^1` and :math:`S^2`.

``wflow validate mean-field [--quick]`` (:func:`mean_field`) is the central check of the package:
finite-N particle systems converge to the continuum solution at the predicted rates.  Its parts:
the coupling error and :math:`W_2` against :math:`N` from i.i.d. starts (this module), the
semi-discrete :math:`W_2` on :math:`S^2` in full mode (:func:`_s2_semidiscrete_w2`), the
deterministic quadrature start, the cross-check with the finite-volume solver, and :math:`W_2` in
time against Dobrushin's bound (:func:`wflow.studies.mean_field_time.w2_in_time`).  What is
computed, what is expected and the measured run times: docs/validation.md.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
from scipy import special

from .. import sphere
from ..measure import Atoms
from ..models import SA, USA, Model
from ..solvers.control import StepControl
from ..solvers.particles import simulate
from .mean_field_time import CHAOS_BETAS, w2_in_time
from .parts import Parts
from .progress import numbered, phase, steps
from .report import (
    Expectation,
    StudyReport,
    fit_rate_models,
    fit_slope,
    register,
    save_figure,
    subplots,
)

__all__ = [
    "mean_field",
    "S2_REFERENCE_ATOMS",
    "S2_EMD_MAX_N",
    "S2_SD_PLAN",
    "S2_SD_TIMES",
    "S2_SD_ASSERT_UNTIL",
    "S2_ATOMS_PER_PARTICLE",
    "S2_REFINED_ATOMS_PER_PARTICLE",
]


def _circle_density(x: np.ndarray) -> np.ndarray:
    """Smooth initial density on S^1: two von Mises bumps (kappa = 2) at theta = 0 and 2.2, mean 1."""
    th = np.arctan2(x[..., 1], x[..., 0])
    k = 2.0
    return (
        0.5
        * (np.exp(k * (np.cos(th) - 1)) + np.exp(k * (np.cos(th - 2.2) - 1)))
        / special.ive(0, k)
    )


_S2_MEANS = sphere.normalize(np.array([[0.0, 0.0, 1.0], [0.9, 0.0, -0.4]]))


def _sphere_density(x: np.ndarray) -> np.ndarray:
    """Smooth initial density on S^2: two von Mises-Fisher bumps (kappa = 3), mean 1."""
    k = 3.0
    c0 = np.sinh(k) / k * np.exp(-k)  # E_unif[e^{k(<m,x>-1)}]
    return 0.5 * np.sum(np.exp(k * (x @ _S2_MEANS.T - 1)), axis=-1) / c0


#: atoms of the S^2 reference measure and the largest N whose W2 to it is computed by EMD (quick mode)
S2_REFERENCE_ATOMS = 4096
S2_EMD_MAX_N = 1600
#: full mode, S^2: W2(mu_N(t), mu(t)) by semi-discrete transport for these N (seeds each), against
#: the push-forward of S2_ATOMS_PER_PARTICLE * N rho_0-weighted Fibonacci nodes; at the smallest N
#: also against S2_REFINED_ATOMS_PER_PARTICLE * N nodes, which measures the reference's own error
S2_SD_PLAN = {100: 16, 1000: 8, 10_000: 2}
#: ... at these times; expectations only up to S2_SD_ASSERT_UNTIL (later times are reported).  Not
#: t = 2: by then the pushed Fibonacci set is far from quasi-uniform
S2_SD_TIMES = (0.0, 1.0)
S2_SD_ASSERT_UNTIL = 1.0
S2_ATOMS_PER_PARTICLE = 16
S2_REFINED_ATOMS_PER_PARTICLE = 64


def _sample(d: int, n: int, rng: np.random.Generator) -> np.ndarray:
    if d == 2:
        return sphere.sample_circle_density(
            lambda th: _circle_density(sphere.angles_to_points(th)), n, rng
        )
    return sphere.vmf_mixture(n, _S2_MEANS, [3.0, 3.0], None, rng)


def _quadrature(d: int, nodes: int) -> Atoms:
    if d == 2:
        x, q = sphere.circle_nodes(nodes)
        return Atoms(x, q * _circle_density(x))
    x, q = sphere.gauss_sphere_nodes(nodes)
    return Atoms(x, q * _sphere_density(x))


def _akt_slope(n_min: float, n_max: float) -> float:
    """Secant slope of log sqrt(log N / N) against log N between ``n_min`` and ``n_max``."""
    return -0.5 + 0.5 * np.log(np.log(n_max) / np.log(n_min)) / np.log(n_max / n_min)


def _s2_semidiscrete_w2(
    rep: StudyReport,
    name: str,
    model: Any,
    quad: Atoms,
    sd_plan: dict[int, int],
    times: np.ndarray,
    rk4_dt: float,
) -> None:
    r"""S^2: :math:`W_2(\mu_N(t), \mu(t))` (chordal) by semi-discrete transport; rows, expectations, notes.

    :math:`\mu(t)` is the push-forward of ``16 N`` Fibonacci nodes weighted by :math:`\rho_0`
    (one set per N, carried as tracers by one reference run); each value is the midpoint of
    the certified bracket of :func:`wflow.transport.semidiscrete.semidiscrete_w2`.  At the smallest N
    the same is computed against ``64 N`` nodes: the change is the reference's own error.
    Expected: the i.i.d. rate on a 2-dimensional sphere, :math:`\sqrt{\log N / N}`
    (Ajtai--Komlós--Tusnády), whose secant slope between the smallest and the largest N lies
    between -1/2 and :func:`_akt_slope`; asserted (with the brackets' widths and the
    reference's error) for ``t <= S2_SD_ASSERT_UNTIL``, reported in the notes after.
    """
    import warnings

    from ..transport import wasserstein_result

    t0 = time.perf_counter()
    n_ref = min(sd_plan)
    sizes: dict[int | str, int] = {
        **{N: S2_ATOMS_PER_PARTICLE * N for N in sd_plan},
        "refined": S2_REFINED_ATOMS_PER_PARTICLE * n_ref,
    }
    ref_sets = {key: sphere.fibonacci_nodes(M) for key, M in sizes.items()}
    ref_w = {key: _sphere_density(z) / _sphere_density(z).sum() for key, z in ref_sets.items()}
    tracers = np.concatenate(list(ref_sets.values()))
    phase(rep.name, f"S2 {name}: reference run carrying {len(tracers)} nodes to t = {times[-1]:g}")
    # RK4 at dt = 0.05: error ~1e-7, far below the W2 values (>= 1e-2) and the brackets' widths
    ref = simulate(model, quad, times[-1], save_at=times, dt=0.05, tracers=tracers)
    assert ref.tracers is not None  # tracers= asked for them
    offsets = np.cumsum([0] + [len(z) for z in ref_sets.values()])
    pushed = {
        key: [
            Atoms._trusted(ref.tracers[i, offsets[q] : offsets[q + 1]], ref_w[key])
            for i in range(len(times))
        ]
        for q, key in enumerate(ref_sets)
    }
    t_ref = time.perf_counter() - t0
    rows, n_stalled = [], 0
    runs = [(N, s) for N, seeds in sd_plan.items() for s in range(seeds)]
    what = (
        f"S2 {name}: particle runs and semi-discrete W2 solves, N = {min(sd_plan)}..{max(sd_plan)}"
    )
    for N, s in steps(rep.name, what, runs):  # the same samples as the main loop (seeds [3, N, s])
        x0 = _sample(3, N, np.random.default_rng([3, N, s]))
        traj = simulate(model, Atoms(x0), times[-1], save_at=times, dt=rk4_dt)
        for i, t in enumerate(times):
            targets: list[int | str] = [N, "refined"] if N == n_ref else [N]
            res = {}
            for key in targets:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always", UserWarning)
                    res[key] = wasserstein_result(
                        traj.atoms(i), pushed[key][i], method="semidiscrete", cost="chordal"
                    )
                n_stalled += bool(caught)
            r = res[N]
            row = {
                "sphere": "S2",
                "model": name,
                "start": "iid",
                "N": N,
                "seed": s,
                "t": float(t),
                "coupling": np.nan,
                "W2": r.value,
                "W2_method": "semidiscrete",
                "W2_lower": r.info["lower"],
                "W2_upper": r.info["upper"],
                "sd_seconds": r.info["seconds"],
            }
            if "refined" in res:
                row["W2_refined"] = res["refined"].value
                row["sd_seconds_refined"] = res["refined"].info["seconds"]
            rows.append(row)
    rep.rows.extend(rows)
    later = []
    for t in times:
        sel = [r for r in rows if r["t"] == t]
        Ns = np.array([r["N"] for r in sel], float)
        slope, half = fit_slope(Ns, np.array([r["W2"] for r in sel]))
        akt = _akt_slope(Ns.min(), Ns.max())
        width = max((r["W2_upper"] - r["W2_lower"]) / r["W2"] for r in sel)
        label = (
            f"S2 {name} W2 slope in N at t={t:g}, semi-discrete ({slope:.3f} ± {half:.3f}, "
            f"N={int(Ns.min())}..{int(Ns.max())})"
        )
        if t > S2_SD_ASSERT_UNTIL:
            later.append(
                f"t={t:g}: slope {slope:.3f} ± {half:.3f} (99% CI), brackets up to {width:.2g} wide "
                "(relative)"
            )
            continue
        ok = bool(
            np.isfinite(slope) and slope - half <= akt and slope + half >= -0.5 and half <= 0.25
        )
        rep.expectations.append(
            Expectation(
                label,
                slope,
                f"99% CI meets [-0.5, {akt:.3f}] (N^-1/2 .. sqrt(log N/N)), half-width <= 0.25",
                ok,
            )
        )
    early = [r for r in rows if r["t"] <= S2_SD_ASSERT_UNTIL]
    gap = max((r["W2_upper"] - r["W2_lower"]) / r["W2"] for r in early)
    quant = max(abs(r["W2"] / r["W2_refined"] - 1) for r in early if "W2_refined" in r)
    rep.expect(
        f"S2 {name} semi-discrete brackets at t <= {S2_SD_ASSERT_UNTIL:g}: largest relative width "
        f"(hi - lo) / W2",
        gap,
        0.0,
        1e-3,
    )
    rep.expect(
        f"S2 {name} reference error at t <= {S2_SD_ASSERT_UNTIL:g}: largest "
        f"|W2(16N nodes) / W2(64N nodes) - 1| at N={n_ref}",
        quant,
        0.0,
        0.02,
    )
    solves = len(rows) + sum("W2_refined" in r for r in rows)
    per_n = ", ".join(
        f"N={N}: {np.mean([r['sd_seconds'] for r in rows if r['N'] == N]):.2g} s" for N in sd_plan
    )
    growth = ", ".join(
        f"{np.mean([r['W2'] for r in rows if r['N'] == max(sd_plan) and r['t'] == t]):.4g}"
        for t in times
    )
    rep.notes.append(
        f"S2 {name}: W2(mu_N(t), mu(t)) (chordal) by semi-discrete transport against the push-forward of 16 N "
        f"rho_0-weighted Fibonacci nodes (rows with W2_method = semidiscrete): at t <= {S2_SD_ASSERT_UNTIL:g} "
        f"certified brackets of relative width <= {gap:.2g}; against 64 N nodes at N={n_ref} the values change by <= "
        f"{quant:.2g} (the reference's own error). Reported, not asserted (the pushed reference is no longer "
        f"quasi-uniform): {'; '.join(later) or 'none'}. Mean W2 at N={max(sd_plan)} and t = "
        f"{', '.join(f'{t:g}' for t in times)}: {growth}. {solves} solves ({n_stalled} stopped early with a "
        f"valid, wider bracket), mean time per solve {per_n}; reference run {t_ref:.0f} s, all "
        f"{time.perf_counter() - t0:.0f} s."
    )


def _iid_block(
    d: int,
    model,
    seeds_per_N: dict[int, int],
    quad: Atoms,
    times: np.ndarray,
    fx: np.ndarray,
    fine_w: np.ndarray,
    quick: bool,
    rk4_dt: float,
    study: str = "mean-field",
) -> dict[str, np.ndarray]:
    """One sphere and model of the study: the continuum reference run carrying every i.i.d. sample (and the
    fine reference set ``fx``) as passive tracers, then each sample's particle run; the coupling error and
    W2 of every sample at every time, as columns, and the fine set at t_end.  On a terminal, a bar of
    ``study`` over the particle runs (:func:`~wflow.studies.progress.steps`)."""
    from ..transport import wasserstein

    samples = {
        (N, s): _sample(d, N, np.random.default_rng([d, N, s]))
        for N, seeds in seeds_per_N.items()
        for s in range(seeds)
    }
    # one reference run carries every sample (and, on S^1, a fine set of nodes) as passive tracers
    parts = [*samples.values(), fx]
    tracers = np.concatenate(parts)
    if d == 3 and len(tracers) > 200_000:  # full mode on S^2: RK4 (error ~1e-7, far below D_N)
        ref = simulate(model, quad, times[-1], save_at=times, dt=0.05, tracers=tracers)
    else:
        tight = StepControl(rtol=1e-10, atol=1e-12)
        ref = simulate(
            model, quad, times[-1], save_at=times, method="dopri5", control=tight, tracers=tracers
        )
    assert ref.tracers is not None  # tracers= asked for them
    offsets = np.cumsum([0] + [len(p) for p in parts])
    fine = [Atoms._trusted(ref.tracers[i, offsets[-2] :], fine_w) for i in range(len(times))]
    cols: dict[str, list] = {"N": [], "seed": [], "t": [], "coupling": [], "W2": []}
    runs = steps(study, f"S{d - 1} particle runs", samples.items(), announced=True)
    for k, ((N, s), x0) in enumerate(runs):
        traj = simulate(model, Atoms(x0), times[-1], save_at=times, dt=rk4_dt)
        chars = ref.tracers[:, offsets[k] : offsets[k + 1]]
        for i, t in enumerate(times):
            coupling = float(
                np.sqrt(np.mean(sphere.geodesic_distance(traj.points[i], chars[i]) ** 2))
            )
            w2: float
            if d == 2:
                w2 = wasserstein(traj.atoms(i), fine[i], method="circle")
            elif quick and i == len(times) - 1 and N <= S2_EMD_MAX_N:
                w2 = wasserstein(traj.atoms(i), fine[i], method="emd")
            else:
                w2 = np.nan
            for col, v in zip(cols, (N, s, t, coupling, w2)):
                cols[col].append(v)
    return {
        **{k: np.asarray(v, dtype=float) for k, v in cols.items()},
        "fine_start": ref.tracers[0, offsets[-2] :],
        "fine_end": ref.tracers[-1, offsets[-2] :],
    }


def mean_field(out: Path, quick: bool = True, s2_max_n: str = "10000") -> StudyReport:
    r"""Finite-N particle systems against the continuum solution (Lagrangian quadrature).

    SA and USA (:math:`\beta = 1`) from a smooth density :math:`\rho_0` on :math:`S^1` and
    :math:`S^2`; the continuum flow map carries every sample as a passive tracer.  Expected: the
    coupling error :math:`D_N(t)` falls like :math:`N^{-1/2}` on both spheres, the exact circle
    :math:`W_2(\mu_N(t), \mu(t))` too; in full mode the semi-discrete :math:`W_2` on :math:`S^2`
    (:func:`_s2_semidiscrete_w2`, up to :math:`N = 10^5` with ``s2_max_n="100000"``) like
    :math:`\sqrt{\log N/N}`; from a quadrature start :math:`W_2` like :math:`N^{-1}` and smooth
    moments spectrally; on :math:`S^1` :math:`W_2` in time within Dobrushin's bound
    (:func:`~wflow.studies.mean_field_time.w2_in_time`).  Details: docs/validation.md.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> rep = mean_field(pathlib.Path(tempfile.mkdtemp()), quick=True)  # doctest: +SKIP
    >>> rep.passed  # doctest: +SKIP
    True
    """
    rep = StudyReport("mean-field")
    times = np.array([0.0, 1.0, 2.0])
    plan, models, quad_N = _plan(quick)
    ref_nodes = {2: 512, 3: 24}
    rk4_dt = 0.1  # RK4 error ~1e-6, far below the N^{-1/2} effects measured
    parts = Parts(out, rep.name, quick)
    label = numbered(_phase_count(plan, models))
    for d, seeds_per_N in plan.items():
        quad = _quadrature(d, ref_nodes[d])
        for name, model in models[d].items():
            fx, fine_w = _fine_reference_nodes(d)
            # the block of runs (one reference, every sample) is one part: an interrupted study keeps it
            key = {
                "part": "iid",
                "d": d,
                "model": name,
                "plan": {str(N): s for N, s in seeds_per_N.items()},
                "times": times.tolist(),
                "nodes": ref_nodes[d],
                "dt": rk4_dt,
            }
            runs = sum(seeds_per_N.values())
            block = parts.get(
                key,
                lambda: _iid_block(
                    d, model, seeds_per_N, quad, times, fx, fine_w, quick, rk4_dt, rep.name
                ),
                what=label(
                    f"S{d - 1} {name}: reference run and {runs} particle runs, "
                    f"N = {min(seeds_per_N)}..{max(seeds_per_N)}, to t = {times[-1]:g}"
                ),
            )
            fine = {
                i: Atoms._trusted(block[f"fine_{e}"], fine_w)
                for i, e in ((0, "start"), (-1, "end"))
            }
            _iid_rates(rep, d, name, block, times)
            if d == 3 and not quick:  # S^2 W2 by semi-discrete transport, with its slope
                sd_plan = {**S2_SD_PLAN, **({100_000: 1} if int(s2_max_n) >= 100_000 else {})}
                phase(rep.name, label(f"S2 {name}: W2 by semi-discrete transport"))
                _s2_semidiscrete_w2(rep, name, model, quad, sd_plan, np.array(S2_SD_TIMES), rk4_dt)
            if d == 3 and quick:  # S^2 W2 at t_end by EMD (reported, not asserted)
                phase(rep.name, label(f"S2 {name}: the EMD reference's own W2 floor"))
                _s2_emd_note(rep, name, fine[0])
            _largest_n_notes(rep, d, name, max(seeds_per_N), times)
            if d == 2:
                phase(rep.name, label(f"S1 {name}: finite-volume cross-check, M = 256, 512"))
                _finite_volume_check(rep, name, model, fine[-1], times)
                phase(
                    rep.name, label(f"S1 {name}: quadrature starts, N = {quad_N[0]}..{quad_N[-1]}")
                )
                _quadrature_start(rep, name, model, fine[-1], times, quad_N)
    rep.sections.append(_rate_models_section(rep.rows))
    t_chaos = time.perf_counter()
    rep.figures.append(_figure(rep, out))
    rep.figures.append(w2_in_time(rep, out, quick, _circle_density, label))
    rep.notes.append(
        f"W2 in time on S1 (SA, USA, beta = {', '.join(f'{b:g}' for b in CHAOS_BETAS)}): "
        f"{time.perf_counter() - t_chaos:.0f} s"
    )
    return rep


def _rate_models_section(rows: list[dict[str, Any]]) -> str:
    r"""The report's table of every fitted series of :math:`W_2` against N: slope with its 95 % CI, and
    the fits of :math:`C N^{-1/2}` and :math:`C \sqrt{\log N / N}` (:func:`~wflow.studies.report.fit_rate_models`).

    A series is one sphere, model and time: the i.i.d. rows on S^1, the semi-discrete rows on S^2
    (the quick mode's EMD values on S^2 are floored by their reference and not fitted).

    Examples
    --------
    >>> rows = [
    ...     {"sphere": "S1", "model": "SA", "start": "iid", "t": 0.0, "N": N, "W2": 0.5 * g / N**0.5}
    ...     for N, g in zip((100, 400, 1600, 6400), (1.02, 0.97, 1.01, 0.99))
    ... ]
    >>> print(_rate_models_section(rows).splitlines()[-1])
    | S1 SA t=0 | 100..6400 | 4 | -0.504 | [-0.540, -0.467] | 0.4987 | 0.01931 | 0.1956 | 0.1277 | N^-1/2 |
    """
    series: dict[tuple[str, str, float], list[tuple[float, float]]] = {}
    for r in rows:
        fitted = r["sphere"] == "S1" or r.get("W2_method") == "semidiscrete"
        if r.get("start") == "iid" and fitted and np.isfinite(r["W2"]):
            series.setdefault((r["sphere"], r["model"], r["t"]), []).append((r["N"], r["W2"]))
    lines = [
        "## W2 against N: slope and rate models",
        "",
        "Each series (one sphere, model and time; every sample at every N) fitted by least squares "
        "in log-log: the slope with its 95 % confidence interval (Student's t from the residuals; none "
        "with two points), and the two rate models W2 ~ C N^-1/2 and W2 ~ C (log N / N)^1/2, one free "
        "constant each fitted in log space, with the RMS of their log residuals; the better model has "
        "the smaller RMS.",
        "",
        "| series | N | points | slope | 95% CI | C, N^-1/2 | RMS | C, sqrt(log N/N) | RMS | better |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|---|",
    ]
    for (sph, model, t), pts in series.items():
        N, w2 = np.array(pts, dtype=float).T
        f = fit_rate_models(N, w2)
        ci = (
            f"[{f.slope - f.half:.3f}, {f.slope + f.half:.3f}]"
            if np.isfinite(f.half)
            else "none (2 points)"
        )
        lines.append(
            f"| {sph} {model} t={t:g} | {int(N.min())}..{int(N.max())} | {len(N)} | {f.slope:.3f} | "
            f"{ci} | {f.C_sqrt:.4g} | {f.rms_sqrt:.4g} | {f.C_log:.4g} | {f.rms_log:.4g} | {f.better} |"
        )
    return "\n".join(lines)


def _phase_count(plan: dict[int, dict[int, int]], models: dict[int, dict[str, Model]]) -> int:
    """The phases :func:`mean_field` announces: per sphere and model the i.i.d. block, then the finite-volume
    check and the quadrature start on S^1, the EMD floor (quick) or the semi-discrete W2 (full) on S^2; and
    the parts of :func:`~wflow.studies.mean_field_time.w2_in_time`."""
    per_model = {2: 3, 3: 2}
    return sum(per_model[d] * len(models[d]) for d in plan) + 2 * len(CHAOS_BETAS)


def _plan(quick: bool) -> tuple[dict[int, dict[int, int]], dict[int, dict[str, Model]], list[int]]:
    """Seeds per N for each d, the models for each d, the N of the quadrature start.

    Samples per N: the slope's error is dominated by the spread of log W at each N, which hardly
    depends on N, so small N (cheap) get more seeds."""
    if quick:
        plan = {2: {100: 40, 400: 30, 1600: 20, 6400: 12}, 3: {100: 16, 400: 12, 1600: 8}}
        models: dict[int, dict[str, Model]] = {
            2: {"SA": SA(1.0), "USA": USA(1.0)},
            3: {"SA": SA(1.0)},
        }
        return plan, models, [16, 32, 64, 128]
    plan = {
        2: {100: 64, 1000: 32, 10_000: 16, 100_000: 8},
        3: {100: 32, 1000: 16, 10_000: 8, 100_000: 4},
    }
    models = {2: {"SA": SA(1.0), "USA": USA(1.0)}, 3: {"SA": SA(1.0), "USA": USA(1.0)}}
    return plan, models, [16, 32, 64, 128, 256, 512, 1024]


def _fine_reference_nodes(d: int) -> tuple[np.ndarray, np.ndarray]:
    """The nodes pushed by the reference run and their weights (rho_0 times the quadrature weights)."""
    if d == 2:
        fx, fq = sphere.circle_nodes(2**15, offset=np.pi / 2**15)
    else:  # S^2: a Fibonacci set (quasi-Monte Carlo weights), for an EMD reference at t_end
        fx = sphere.fibonacci_nodes(S2_REFERENCE_ATOMS)
        fq = np.full(len(fx), 1.0 / len(fx))
    fine_w = fq * (_circle_density(fx) if d == 2 else _sphere_density(fx))
    fine_w /= fine_w.sum()
    return fx, fine_w


def _iid_rates(
    rep: StudyReport, d: int, name: str, block: dict[str, Any], times: np.ndarray
) -> None:
    """The i.i.d. block's rows, and the slopes in N of D_N (t > 0) and, on S^1, of W2."""
    per_t: dict[float, list[tuple[int, float, float]]] = {t: [] for t in times}
    run = {"sphere": f"S{d - 1}", "model": name, "start": "iid"}
    for N, s, t, coupling, w2 in zip(
        block["N"], block["seed"], block["t"], block["coupling"], block["W2"]
    ):
        per_t[float(t)].append((int(N), float(coupling), float(w2)))
        at = dict(N=int(N), seed=int(s), t=float(t), coupling=float(coupling), W2=float(w2))
        rep.rows.append(run | at)
    for t in times:
        arr = np.array(per_t[t])
        if t > 0:
            slope, half = fit_slope(arr[:, 0], arr[:, 1])
            rep.expect_slope(
                f"S{d - 1} {name} coupling error D_N slope in N at t={t:g}", slope, half, -0.5
            )
        if d == 2:
            slope, half = fit_slope(arr[:, 0], arr[:, 2])
            rep.expect_slope(f"S1 {name} W2 slope in N at t={t:g}", slope, half, -0.5)


def _s2_emd_note(rep: StudyReport, name: str, fine_start: Atoms) -> None:
    """Quick mode on S^2: the EMD reference's own floor, beside the W2 column (no slope asserted)."""
    from ..transport import wasserstein

    R = sphere.random_rotation(3, np.random.default_rng(7))
    rx = sphere.fibonacci_nodes(S2_REFERENCE_ATOMS) @ R.T
    other = Atoms(rx, _sphere_density(rx))
    floor = wasserstein(other, fine_start, method="emd")
    rep.notes.append(
        f"S2 {name}: W2(mu_N(t_end), mu(t_end)) by EMD against the push-forward of {S2_REFERENCE_ATOMS} "
        f"Fibonacci atoms (N <= {S2_EMD_MAX_N}; CSV column W2). The reference's own discretization, "
        f"measured as W2 between two rotated {S2_REFERENCE_ATOMS}-atom representations of rho_0, is "
        f"{floor:.3g}: W2 values near it are floored, so no slope is asserted on S2; the coupling "
        f"error D_N carries the rate there."
    )


def _largest_n_notes(rep: StudyReport, d: int, name: str, n_max: int, times: np.ndarray) -> None:
    """The growth of the error with t, at the largest N: mean D_N and mean W2 at each save."""
    run = {"sphere": f"S{d - 1}", "model": name, "start": "iid", "N": n_max}
    for t in times:
        vals = [r for r in rep.rows if r["t"] == t and all(r[k] == v for k, v in run.items())]
        rep.notes.append(
            f"S{d - 1} {name} N={n_max} t={t:g}: mean D_N = "
            f"{np.mean([r['coupling'] for r in vals]):.4g}, mean W2 = "
            f"{np.nanmean([r['W2'] for r in vals]) if any(np.isfinite(r['W2']) for r in vals) else float('nan'):.4g}"
        )


def _finite_volume_check(
    rep: StudyReport, name: str, model: Model, fine_end: Atoms, times: np.ndarray
) -> None:
    """S^1: the continuum reference cross-checked with the finite-volume solver (Fourier moments 1..3)."""
    from ..density import Density
    from ..mesh import CircleMesh
    from ..solvers.eulerian import solve_density

    ks = np.arange(1, 4)

    def moments(mu: Atoms) -> np.ndarray:
        angles = np.arctan2(mu.points[:, 1], mu.points[:, 0])
        return np.exp(1j * ks[:, None] * angles[None]) @ mu.weights

    gaps = []
    for M in (256, 512):  # orders 1.80 / 2.18 (SA / USA) at 128..256, 1.90 / 2.13 at 256..512
        rho0 = Density.from_function(CircleMesh(M), _circle_density)
        fv = solve_density(model, rho0, times[-1], save_at=[0.0, times[-1]]).density(-1).to_atoms()
        gaps.append(float(np.abs(moments(fv) - moments(fine_end)).max()))
    rep.expect(
        f"S1 {name} Lagrangian vs finite volume (M=512), Fourier moments 1..3 at t={times[-1]:g}",
        gaps[1],
        0.0,
        2e-4,
    )
    order = np.log2(gaps[0] / gaps[1])
    rep.expect(f"S1 {name} Lagrangian vs finite volume, observed order M=256..512", order, 1.8, 2.3)


def _quadrature_start(
    rep: StudyReport, name: str, model: Model, fine_end: Atoms, times: np.ndarray, quad_N: list[int]
) -> None:
    """S^1 from a deterministic start (trapezoid nodes, weights rho_0/N): W2 like 1/N, moments spectral."""
    from ..transport import wasserstein

    errs, moms = [], []
    for N in quad_N:
        qx, qq = sphere.circle_nodes(N, offset=np.pi / N)
        start = Atoms(qx, qq * _circle_density(qx))
        tight = StepControl(rtol=1e-11, atol=1e-13)
        tr = simulate(model, start, times[-1], save_at=times, method="dopri5", control=tight)
        w2 = wasserstein(tr.atoms(-1), fine_end, method="circle")
        m_err = float(np.abs(tr.atoms(-1).mean() - fine_end.mean()).max())
        errs.append(w2)
        moms.append(m_err)
        rep.rows.append(
            {
                "sphere": "S1",
                "model": name,
                "start": "quadrature",
                "N": N,
                "seed": -1,
                "t": times[-1],
                "coupling": np.nan,
                "W2": w2,
                "moment_error": m_err,
            }
        )
    slope, half = fit_slope(np.array(quad_N, float), np.array(errs))
    rep.expect(
        f"S1 {name} quadrature-start W2 slope at t={times[-1]:g} ({slope:.3f} ± {half:.3f})",
        slope,
        -1.1,
        -0.9,
    )
    # smooth moments converge spectrally until the time-stepping tolerance (~1e-11)
    order = np.log(moms[0] / moms[2]) / np.log(quad_N[2] / quad_N[0])
    rep.expect(
        f"S1 {name} quadrature-start moment error, observed order N={quad_N[0]}..{quad_N[2]}",
        order,
        6.0,
        np.inf,
    )
    rep.expect(f"S1 {name} quadrature-start moment error at N={quad_N[-1]}", moms[-1], 0.0, 1e-10)


def _figure(rep: StudyReport, out: Path) -> Path:
    groups = sorted({(r["sphere"], r["model"]) for r in rep.rows if r["start"] == "iid"})
    fig, axes = subplots(
        1, len(groups) + 1, figsize=(4.2 * (len(groups) + 1), 3.8), constrained_layout=True
    )
    for ax, (sph, name) in zip(axes, groups):
        rows = [
            r for r in rep.rows if r["sphere"] == sph and r["model"] == name and r["start"] == "iid"
        ]
        for t in sorted({r["t"] for r in rows}):
            for key, style in (("coupling", "o-"), ("W2", "s--")):
                pts = [
                    (r["N"], r[key])
                    for r in rows
                    if r["t"] == t and np.isfinite(r[key]) and r[key] > 0
                ]
                if not pts:
                    continue
                Ns = sorted({p[0] for p in pts})
                means = [np.mean([v for n, v in pts if n == N]) for N in Ns]
                ax.loglog(Ns, means, style, label=f"{key}, t={t:g}", ms=4)
        n_axis = np.array(sorted({r["N"] for r in rows}), float)
        ax.loglog(n_axis, 0.5 * n_axis**-0.5, "k:", label="N^-1/2")
        ax.set(title=f"{sph}, {name}, i.i.d. start", xlabel="N")
        ax.legend(fontsize=7)
    q = [r for r in rep.rows if r["start"] == "quadrature"]
    ax = axes[-1]
    for name in sorted({r["model"] for r in q}):
        Ns = [r["N"] for r in q if r["model"] == name]
        ax.loglog(Ns, [r["W2"] for r in q if r["model"] == name], "o-", label=f"W2, {name}")
        moments = [max(r["moment_error"], 1e-17) for r in q if r["model"] == name]
        ax.loglog(Ns, moments, "s--", label=f"|moment error|, {name}")
    if q:
        n_axis = np.array(sorted({r["N"] for r in q}), float)
        ax.loglog(n_axis, 1.0 / n_axis, "k:", label="N^-1")
    ax.set(title="S1, quadrature start, t = 2", xlabel="N")
    ax.legend(fontsize=7)
    return save_figure(fig, out / "mean_field.png", dpi=110)


register("mean-field", options={"s2_max_n": ("10000", "100000")})(mean_field)
