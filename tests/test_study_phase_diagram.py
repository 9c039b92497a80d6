"""The phase-diagram study (issue 15): the published 'euler-average' step against projected Euler, the
equiangular time t* against the ODE, and the study's core pieces against direct computations."""

import numpy as np
import pytest
from scipy.integrate import quad

import wflow
from wflow import SA, sphere
from wflow.diagnostics import pair_fraction
from wflow.solvers import SOLVERS
from wflow.solvers.base import integrate
from wflow.solvers.fused import FusedEuler
from wflow.solvers.particles import ParticleProblem
from wflow.studies import phase_diagram as pd
from wflow.studies import run_studies
from wflow.studies.parts import Parts
from wflow.theory import equiangular_rhs, equiangular_solution, equiangular_time

BK = "numpy"


def _problem(beta=1.5, n=8, d=3, batch=(), backend=BK):
    x0 = sphere.uniform(n, d, np.random.default_rng(1), batch=batch)
    return ParticleProblem(
        SA(beta), np.full((*batch, n), 1 / n), d, backend=backend, diagnostics=()
    ), x0


def _softmax_average(x, beta):
    """A x for SA with Q = K = V = I, written out directly."""
    logits = beta * x @ np.swapaxes(x, -1, -2)
    w = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return (w / w.sum(axis=-1, keepdims=True)) @ x


@pytest.mark.parametrize("solver", ["euler-average", "fused-euler"])
def test_euler_average_is_projected_euler_with_a_shorter_step_per_token(solver):
    """x + h A x = (1 + h<x,Ax>)(x + h' P_x A x), h' = h/(1 + h<x,Ax>): one step of 'euler-average' equals
    projected Euler with the step h' token by token, and the published normalize(x + h A x); so does the
    fused step that simulate takes in its place (``FusedEuler(projected=False)``, numba backend)."""
    backend = "numba" if solver == "fused-euler" else BK
    problem, x0 = _problem(batch=(2,), backend=backend)
    stepper = FusedEuler(projected=False) if solver == "fused-euler" else SOLVERS[solver]()
    h = 0.1
    step, _ = stepper.step(problem, 0.0, x0, h, stepper.init(problem, 0.0, x0))
    A = _softmax_average(x0, 1.5)
    direct = x0 + h * A
    direct /= np.linalg.norm(direct, axis=-1, keepdims=True)
    np.testing.assert_allclose(step.y, direct, rtol=0, atol=1e-14)
    hp = h / (1 + h * np.einsum("...i,...i->...", x0, A))
    v = problem.rhs(0.0, x0)  # P_x A x
    proj = x0 + hp[..., None] * v
    proj /= np.linalg.norm(proj, axis=-1, keepdims=True)
    np.testing.assert_allclose(step.y, proj, rtol=0, atol=1e-14)
    # and it is not the projected Euler step with h itself (they differ at O(h^2 <x,Ax>))
    euler, _ = SOLVERS["euler"]().step(problem, 0.0, x0, h, None)
    assert np.abs(euler.y - step.y).max() > 1e-4


def test_euler_average_has_order_one():
    """Error against the exact flow (dopri5 at rtol 1e-13) halves with the step."""
    problem, x0 = _problem()
    ref = integrate(problem, "dopri5", x0, 0.0, 1.0, save_at=[0, 1], rtol=1e-13, atol=1e-14).data[
        "points"
    ][1][-1]
    hs = [0.05, 0.025, 0.0125]
    errs = [
        np.abs(
            integrate(problem, "euler-average", x0, 0.0, 1.0, save_at=[0, 1], dt=h).data["points"][
                1
            ][-1]
            - ref
        ).max()
        for h in hs
    ]
    slope = np.polyfit(np.log(hs), np.log(errs), 1)[0]
    assert SOLVERS["euler-average"].order == 1 and abs(slope - 1) < 0.1, slope
    # e(h) = C h + D h^2 + O(h^3): each halving ratio is 2 - (D / C) h + O(h^2), below 2 here (measured
    # 1.963, 1.981), and its distance from 2 halves with h (measured 1.97)
    r = [errs[0] / errs[1], errs[1] / errs[2]]
    assert all(1.95 < q < 2.0 for q in r) and 1.8 < (2 - r[0]) / (2 - r[1]) < 2.2, r


def test_euler_average_needs_an_average():
    class NoAverage(wflow.solvers.base.Problem):
        def rhs(self, t, y):
            return -y

    with pytest.raises(TypeError, match="euler-average"):
        SOLVERS["euler-average"]().step(NoAverage(), 0.0, np.ones(3), 0.1, None)


@pytest.mark.parametrize("beta", [1.0, 4.0, 8.0])
def test_equiangular_time_is_the_root_to_1e6(beta):
    """t*(beta, 32) against the ODE's solution (rho(t*) = 0.999) and against the quadrature of dt = drho/F."""
    t_star = equiangular_time(beta, 32, 0.999)
    rho = equiangular_solution(0.0, [t_star - 1e-6, t_star, t_star + 1e-6], beta, 32)
    assert rho[0] < 0.999 < rho[2] and abs(rho[1] - 0.999) < 1e-10
    ref = quad(
        lambda r: 1.0 / float(equiangular_rhs(r, beta, 32)),
        0.0,
        0.999,
        epsabs=1e-12,
        epsrel=1e-13,
        limit=200,
    )[0]
    assert abs(t_star - ref) < 1e-6


def test_crossing_time_interpolates():
    t = np.array([0.0, 1.0, 2.0, 3.0])
    assert pd.crossing_time(t, [0.0, 0.2, 0.6, 1.0]) == pytest.approx(1.75)
    assert pd.crossing_time(t, [0.6, 0.7, 0.8, 0.9]) == 0.0
    assert np.isnan(pd.crossing_time(t, [0.0, 0.1, 0.2, 0.3]))


def test_checkpoints_are_the_published_ones():
    np.testing.assert_allclose(pd.checkpoints(30.0), np.linspace(0, 30, 200), atol=1e-12)
    assert pd.t_end_for(1.0) == pytest.approx(30.0)
    t1 = pd.t_end_for(1.0, "dopri5")
    assert (
        3 * 5.2703 <= t1 < 3 * 5.2703 + pd.SPACING
        and abs(t1 / pd.SPACING - round(t1 / pd.SPACING)) < 1e-9
    )
    assert pd.t_end_for(8.0) == pytest.approx(pd.T_MAX) and pd.t_end_for(9.0) == pytest.approx(
        pd.T_MAX
    )


def test_curves_against_a_direct_loop():
    """The study's core (simulate with 'euler-average' and the pair fraction at the checkpoints) against the
    published loop written out in NumPy."""
    x0 = pd.initial_points(8, 0, 3)
    beta = 1.0
    times, frac = pd.pair_fraction_curves(x0, beta, "original", 8.0, save_at=[0.0, 4.0, 6.0, 8.0])
    np.testing.assert_allclose(times, [0, 4, 6, 8], atol=1e-12)
    x, ref = x0.copy(), [pair_fraction(x0)]
    for k in range(80):
        y = x + 0.1 * _softmax_average(x, beta)
        x = y / np.linalg.norm(y, axis=-1, keepdims=True)
        if k + 1 in (40, 60, 80):
            ref.append(pair_fraction(x))
    np.testing.assert_array_equal(frac, np.array(ref))
    # nothing collapsed at t = 0, everything by t = 8 (t* = 5.27 at beta = 1), something in between
    assert (
        frac.shape == (4, 3)
        and frac[0].max() == 0
        and frac[-1].min() == 1
        and 0 < frac[1:3].sum() < 6
    )


def test_dopri5_curves_use_the_grouped_tolerances_and_the_reference_flow():
    """The dopri5 scheme passes its tolerances as a StepControl (the flat spellings are
    deprecated) and follows the flow: at the checkpoints, the same pair fractions as the
    projected Euler loop at step 1e-4."""
    import warnings

    x0 = pd.initial_points(8, 0, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        times, frac = pd.pair_fraction_curves(x0, 1.0, "dopri5", 8.0, save_at=[0.0, 4.0, 6.0, 8.0])
    x, ref = x0.copy(), [pair_fraction(x0)]
    for k in range(80000):
        y = x + 1e-4 * _softmax_average(x, 1.0)
        x = y / np.linalg.norm(y, axis=-1, keepdims=True)
        if k + 1 in (40000, 60000, 80000):
            ref.append(pair_fraction(x))
    np.testing.assert_allclose(times, [0, 4, 6, 8], atol=1e-12)
    np.testing.assert_array_equal(frac, np.array(ref))


def test_density_curve_parts_are_reused(tmp_path, monkeypatch):
    """A second call computes nothing (every chunk is a stored part), and gives the same curve."""
    monkeypatch.setattr(pd, "t_end_for", lambda beta, scheme="original", n=32: 10 * pd.SPACING)
    parts = Parts(tmp_path, "phase-diagram", quick=True)
    a = pd.density_curve(parts, 8, 1.0, "projected", systems=5, chunk=3)
    assert parts.computed == 2 and parts.reused == 0
    b = pd.density_curve(
        Parts(tmp_path, "phase-diagram", quick=True), 8, 1.0, "projected", systems=5, chunk=3
    )
    np.testing.assert_array_equal(a["mean"], b["mean"])
    assert b["seconds"] == a["seconds"] > 0  # the stored compute seconds
    again = Parts(tmp_path, "phase-diagram", quick=True)
    pd.density_curve(again, 8, 1.0, "projected", systems=5, chunk=3)
    assert again.computed == 0 and again.reused == 2
    # the mean over two chunks is the mean over the five systems
    x0 = np.concatenate([pd.initial_points(8, 0, 3), pd.initial_points(8, 1, 2)])
    _, f = pd.pair_fraction_curves(x0, 1.0, "projected", 10 * pd.SPACING)
    np.testing.assert_allclose(a["mean"], f.mean(axis=1), atol=1e-15)


def test_a_part_is_announced_when_computed_not_when_reused(tmp_path, capsys):
    """Parts.get(..., what=) writes one line on stderr before it computes a part, none when it reads it."""
    parts = Parts(tmp_path, "demo", quick=True)
    for _ in range(2):
        assert parts.get({"a": 1}, lambda: {"x": 2.5}, what="one part (1/1)")["x"] == 2.5
    assert capsys.readouterr().err.splitlines() == ["demo: one part (1/1)"]


def test_parts_are_computed_on_worker_processes_then_reused(tmp_path, capsys):
    """prefetch on two Dask worker processes stores every missing part (the same numbers as computed here);
    a later get computes nothing; a failing part raises after the others are stored."""
    from wflow.studies import parts as parts_mod

    parts = Parts(tmp_path, "phase-diagram", quick=True)
    jobs = [
        (pd.curve_part_key(3, 1.0, "projected", c, 2), pd.curve_part, (3, 1.0, "projected", c, 2))
        for c in range(3)
    ]
    with parts_mod.workers(2):
        assert parts.prefetch(jobs) == 3
        assert parts.prefetch(jobs) == 0
    # the parent announces the parts in flight (the workers announce nothing)
    assert capsys.readouterr().err.splitlines() == [
        "phase-diagram: 3 parts on 2 worker processes (3)"
    ]
    for key, fn, args in jobs:
        got = parts.get(key, lambda: pytest.fail("a prefetched part was computed again"))
        np.testing.assert_array_equal(got["sum"], fn(*args)["sum"])
    assert parts.computed == 0 and parts.reused == 3
    assert (
        parts.prefetch(jobs[:1] + [({"other": 1}, pd.curve_part, (3, 2.0, "projected", 0, 2))]) == 0
    )  # 1 worker
    bad = [
        ({"bad": 1}, pd.curve_part, (3, 1.0, "no-such-scheme", 0, 2)),
        (pd.curve_part_key(3, 2.0, "projected", 0, 2), pd.curve_part, (3, 2.0, "projected", 0, 2)),
    ]
    with parts_mod.workers(2), pytest.raises(ValueError, match="scheme must be one of"):
        parts.prefetch(bad)
    assert parts.has(bad[1][0]) and not parts.has(bad[0][0])
    with pytest.raises(ValueError, match="workers must be an integer >= 1, got 0"):
        with parts_mod.workers(0):
            pass


def test_scheme_comparison_reads_the_first_chunks_on_the_same_starts(tmp_path, monkeypatch, capsys):
    """The heat map runs every system, the scheme comparison only the first ``compare_systems`` (every scheme,
    the published one included, on the same starts): the published row's t_half is the crossing of the
    first chunk's curve, its t_half_heat that of all chunks, and no other scheme runs beyond the first chunk."""
    tiny = {
        "dims": (3,),
        "heat_betas": (1.0, 2.0),
        "compare_betas": (1.0,),
        "fine_dims": (),
        "systems": 4,
        "compare_systems": 2,
        "chunk": 2,
    }
    monkeypatch.setattr(pd, "QUICK", tiny)
    monkeypatch.setattr(pd, "t_end_for", lambda beta, scheme="original", n=32: 60 * pd.SPACING)
    rep = pd.phase_diagram_study(tmp_path, quick=True)
    # where the study is: one line on stderr for its loop of parts (not a terminal: no bar), none on stdout
    captured = capsys.readouterr()  # (beside numba's compilation notices on a first run)
    assert [line for line in captured.err.splitlines() if line.startswith("phase-diagram")] == [
        "phase-diagram: pair-fraction curves of 4 (d, beta, scheme), 6 parts (4)"
    ]
    assert captured.out == ""
    # silenced: run_studies(progress=False) writes none (the parts are stored: nothing is computed)
    assert run_studies(["phase-diagram"], tmp_path, quick=True, progress=False)[0].rows == rep.rows
    assert "phase-diagram" not in capsys.readouterr().err
    rows = {(r["beta"], r["scheme"]): r for r in rep.rows}
    parts = Parts(tmp_path, "phase-diagram", quick=True)
    first = pd.density_curve(parts, 3, 1.0, "original", 2, 2)
    every = pd.density_curve(parts, 3, 1.0, "original", 4, 2)
    assert parts.computed == 0
    assert not np.array_equal(first["mean"], every["mean"])
    row = rows[(1.0, "original")]
    assert row["systems"] == 2 and row["heat_systems"] == 4
    assert row["t_half"] == pd.crossing_time(first["times"], first["mean"])
    assert row["t_half_heat"] == pd.crossing_time(every["times"], every["mean"])
    assert rows[(1.0, "dopri5")]["systems"] == rows[(1.0, "projected")]["systems"] == 2
    assert rows[(2.0, "original")]["systems"] == 4
    for s in ("projected", "dopri5"):
        assert parts.has(pd.curve_part_key(3, 1.0, s, 0, 2)) and not parts.has(
            pd.curve_part_key(3, 1.0, s, 1, 2)
        )
