"""Normalization schemes, layer-dependent parameters and large beta (wflow.schemes, kernel conventions)."""

import warnings

import numpy as np
import pytest

import wflow
from wflow import SA, USA, sphere, theory
from wflow.errors import WflowError
from wflow.schemes import Layered, Normalized, TimeDependent, layer_map

BK = "numpy"
OPTS = {"mix-ln": {"tau": 0.5}, "ngpt": {"alpha": 0.7}}


@pytest.mark.parametrize("attention", ["SA", "USA"])
@pytest.mark.parametrize("scheme", ["post-ln", "pre-ln", "peri-ln", "mix-ln", "ngpt", "sqrt"])
def test_equiangular_tokens_follow_the_reduced_ode(scheme, attention):
    """n = 6 equiangular tokens (radius 1.3 for the schemes with radii) against wflow.theory's coupled ODE
    for (rho, r): agreement 1e-8 in the cosine and the radius, and the tokens stay equiangular."""
    n, beta, rho0, r0 = 6, 1.0, 0.1, 1.3
    free = scheme in ("pre-ln", "peri-ln", "mix-ln")
    x0 = theory.equiangular_configuration(n, rho0) * (r0 if free else 1.0)
    att = SA(beta) if attention == "SA" else USA(beta)
    m = Normalized(att, scheme, **OPTS.get(scheme, {}))
    traj = wflow.simulate(
        m,
        x0,
        2.0,
        save_at=np.linspace(0, 2, 5),
        method="dopri5",
        rtol=1e-12,
        atol=1e-14,
        backend=BK,
    )
    P = traj.points
    off = np.einsum("tid,tjd->tij", P, P)[:, ~np.eye(n, dtype=bool)]
    ref = theory.equiangular_scheme_solution(
        traj.times,
        beta,
        n,
        attention,
        scheme,
        rho0=rho0,
        r0=r0 if free else 1.0,
        **OPTS.get(scheme, {}),
    )
    assert np.ptp(off, axis=1).max() < 1e-12
    np.testing.assert_allclose(off.mean(axis=1), ref.rho, rtol=0, atol=1e-8)
    np.testing.assert_allclose(traj.radii.mean(axis=-1), ref.r if free else 1.0, rtol=0, atol=1e-8)
    if free:  # the stored tokens are r * theta
        np.testing.assert_allclose(
            traj.positions, traj.radii[..., None] * traj.points, rtol=0, atol=1e-14
        )
    assert traj.energy is not None and np.all(np.diff(traj.energy) >= -1e-12)  # a Lyapunov function


def test_pre_ln_is_the_free_ode_x_dot_equals_attention():
    """Pre-LN tokens follow x' = A(theta) with no projection: radii grow, and one explicit Euler step is
    x + dt * U exactly."""
    x0 = 1.7 * sphere.uniform(7, 3, seed=2)
    m = Normalized(SA(2.0), "pre-ln")
    one = wflow.simulate(m, x0, 0.01, method="euler", dt=0.01, save_at=[0, 0.01], backend=BK)
    theta = x0 / np.linalg.norm(x0, axis=-1, keepdims=True)
    u = SA(2.0).average(theta, wflow.Atoms(theta), backend=BK)
    np.testing.assert_allclose(one.positions[-1], x0 + 0.01 * u, rtol=0, atol=1e-15)
    long = wflow.simulate(m, x0, 5.0, method="dopri5", backend=BK)
    assert np.all(long.radii[-1] > long.radii[0])


def test_sqrt_scaling_is_post_ln_at_the_transformed_time():
    """theta' = P A / sqrt(t+1): the SA run at s(t) = 2 (sqrt(t+1) - 1)."""
    x0 = sphere.uniform(12, 3, seed=3)
    t = np.array([0.0, 1.0, 3.0])
    a = wflow.simulate(
        Normalized(SA(3.0), "sqrt"),
        x0,
        3.0,
        save_at=t,
        method="dopri5",
        rtol=1e-11,
        atol=1e-13,
        backend=BK,
    )
    s = 2 * (np.sqrt(t + 1) - 1)
    b = wflow.simulate(
        SA(3.0), x0, s[-1], save_at=s, method="dopri5", rtol=1e-11, atol=1e-13, backend=BK
    )
    np.testing.assert_allclose(a.points, b.points, rtol=0, atol=1e-8)


def test_rescaled_and_plain_kernels_agree_after_the_time_change():
    """USA in e^(beta(<x,y>-1)) at time e^beta t is USA in e^(beta<x,y>) at t; energies differ by e^-beta."""
    beta = 4.0
    x0 = sphere.uniform(10, 3, seed=4)
    t = np.array([0.0, 0.02, 0.05])
    plain = wflow.simulate(
        USA(beta), x0, t[-1], save_at=t, method="dopri5", rtol=1e-11, atol=1e-13, backend=BK
    )
    tr = theory.rescaled_time(t, beta)
    resc = wflow.simulate(
        USA(beta, kernel="rescaled"),
        x0,
        tr[-1],
        save_at=tr,
        method="dopri5",
        rtol=1e-11,
        atol=1e-13,
        backend=BK,
    )
    np.testing.assert_allclose(resc.points, plain.points, rtol=0, atol=1e-8)
    np.testing.assert_allclose(resc.energy, plain.energy * np.exp(-beta), rtol=1e-10)
    # SA: the same velocity in both conventions
    mu = wflow.Atoms(x0)
    np.testing.assert_allclose(
        SA(30.0, kernel="rescaled").velocity(x0, mu), SA(30.0).velocity(x0, mu), atol=1e-14
    )


@pytest.mark.parametrize("beta,kernel", [(30.0, "plain"), (700.0, "rescaled"), (1e4, "rescaled")])
def test_usa_at_large_beta_finishes_with_dopri5(beta, kernel):
    """The step-size floor is relative (t + h == t), never absolute: USA at beta = 30 (plain: time scale
    e^-30 ~ 1e-13) and at 700 and 1e4 in the rescaled kernel run to the end without NaN."""
    x0 = sphere.uniform(8, 3, seed=5)
    t_end = np.exp(-beta) if kernel == "plain" else 1.0
    r = wflow.simulate(USA(beta, kernel=kernel), x0, t_end, method="dopri5", backend=BK)
    assert (
        r.status == 0
        and np.all(np.isfinite(r.points))
        and np.all(np.isfinite(r.diagnostics["log_energy"]))
    )


def test_ngpt_step_as_values_on_a_grid_and_as_a_function():
    x0 = sphere.uniform(6, 3, seed=6)
    grid = Normalized(SA(1.0), "ngpt", alpha=[0.5, 1.5], alpha_times=[0.0, 2.0])
    fn = Normalized(SA(1.0), "ngpt", alpha=lambda t: 0.5 + 0.5 * min(t, 2.0))
    a = wflow.simulate(grid, x0, 2.0, method="dopri5", rtol=1e-10, atol=1e-12, backend=BK)
    b = wflow.simulate(fn, x0, 2.0, method="dopri5", rtol=1e-10, atol=1e-12, backend=BK)
    np.testing.assert_allclose(a.points, b.points, atol=1e-8)
    with pytest.raises(ValueError, match="function"):
        wflow.models.model_from_dict(fn.to_dict())


def test_layered_parameters_switch_at_layer_boundaries(tmp_path):
    """Two layers: the run equals running layer 1 to t = 1 then layer 2 from there; adaptive steps land on
    the boundary; the store resumes (the layers serialize)."""
    x0 = sphere.uniform(9, 3, seed=7)
    l1, l2 = SA(1.0), SA(5.0, V=-np.eye(3))
    m = Layered([l1, l2], period=1.0)
    full = wflow.simulate(
        m, x0, 2.0, save_at=[0, 1, 2], method="dopri5", rtol=1e-10, atol=1e-12, backend=BK
    )
    a = wflow.simulate(
        l1, x0, 1.0, save_at=[0, 1], method="dopri5", rtol=1e-10, atol=1e-12, backend=BK
    )
    b = wflow.simulate(
        l2, a.points[-1], 1.0, save_at=[0, 1], method="dopri5", rtol=1e-10, atol=1e-12, backend=BK
    )
    np.testing.assert_allclose(full.points[-1], b.points[-1], atol=1e-8)
    path = tmp_path / "l.zarr"

    class Stop(wflow.solvers.base.Tracker):
        n = 0

        def save(self, snap):
            Stop.n += 1
            if Stop.n == 2:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        wflow.simulate(
            m,
            x0,
            2.0,
            save_at=[0, 1, 2],
            method="dopri5",
            rtol=1e-10,
            atol=1e-12,
            backend=BK,
            writer=wflow.io.ZarrRecorder(path),
            trackers=[Stop()],
        )
    np.testing.assert_array_equal(wflow.resume(path).points, full.points)
    rnd = Layered.random(3, 3, beta=2.0, seed=0)
    assert len({id(layer) for layer in rnd.layers}) == 3 and rnd.at(2.5) is rnd.layers[2]


@pytest.mark.parametrize("method", ["rk4", "dopri5"])
def test_a_step_ending_on_a_layer_boundary_keeps_its_layer(method):
    """Regression: the last stage of a step that ends on a layer boundary (RK4's k4 at t + dt, the c = 1 stages
    of dopri5) saw the next layer.  RK4 with dt = 0.1 over two very different unit layers was 9.1e-3 off the
    layers integrated one after the other, and dopri5 (rtol 1e-10) rejected 66 steps at the boundary while
    its step collapsed to 1e-10.  Now every stage sees the step's layer: RK4 repeats the layer-by-layer run
    bit for bit, dopri5 to 1e-9 without a rejected step."""
    x0 = sphere.uniform(9, 3, seed=7)
    l1, l2 = SA(1.0), SA(5.0, V=-np.eye(3))
    kw = {"dt": 0.1} if method == "rk4" else {"control": wflow.StepControl(rtol=1e-10, atol=1e-12)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (steps of 0.1 land on the boundary: no warning)
        full = wflow.simulate(
            Layered([l1, l2]), x0, 2.0, save_at=[0, 1, 2], method=method, backend=BK, **kw
        )
    a = wflow.simulate(l1, x0, 1.0, save_at=[0, 1], method=method, backend=BK, **kw)
    b = wflow.simulate(l2, a.points[-1], 1.0, save_at=[0, 1], method=method, backend=BK, **kw)
    np.testing.assert_allclose(full.points[1], a.points[-1], rtol=0, atol=1e-9)
    np.testing.assert_allclose(full.points[-1], b.points[-1], rtol=0, atol=1e-9)
    if method == "rk4":
        np.testing.assert_array_equal(full.points[-1], b.points[-1])
        # a fixed grid across a boundary has one layer for that step: the run says so
        with pytest.warns(UserWarning, match=r"dt=0.3 straddle .* t = 1: "):
            wflow.simulate(Layered([l1, l2]), x0, 2.0, dt=0.3, backend=BK)
    else:
        assert full.stats["rejected"][-1] == 0
        assert full.stats["steps"][-1] <= a.stats["steps"][-1] + b.stats["steps"][-1]
    # Mix-LN switches at tau = 1: a step ending on tau is a step before the switch (Pre-LN side)
    att = SA(2.0)
    y0 = 1.3 * sphere.uniform(6, 3, seed=2)
    mix = wflow.simulate(Normalized(att, "mix-ln", tau=1.0), y0, 2.0, dt=0.1, backend=BK)
    before = wflow.simulate(Normalized(att, "mix-ln", tau=5.0), y0, 1.0, dt=0.1, backend=BK)
    after = wflow.simulate(
        Normalized(att, "mix-ln", tau=0.0), before.positions[-1], 1.0, dt=0.1, backend=BK
    )
    np.testing.assert_array_equal(mix.positions[-1], after.positions[-1])


def test_finite_volume_steps_ending_on_a_layer_boundary_keep_their_layer():
    """The same on the finite-volume solver (SSP-RK3, whose stage at t + dt and first-same-as-last derivative
    both fall on the boundary): fixed steps of 0.01 were 1.5e-4 off the layer-by-layer run (now to
    rounding), error-controlled ones rejected 72 steps (now none)."""
    rho0 = wflow.Density.from_function(wflow.CircleMesh(64), lambda x: 1 + 0.5 * x[:, 0])
    l1, l2 = SA(1.0), SA(4.0, V=-np.eye(2))
    for kw in ({"dt": 0.01}, {"rtol": 1e-6}):
        full = wflow.solve_density(Layered([l1, l2]), rho0, 2.0, save_at=[0, 2], backend=BK, **kw)
        a = wflow.solve_density(l1, rho0, 1.0, backend=BK, **kw)
        b = wflow.solve_density(l2, a.density(-1), 1.0, backend=BK, **kw)
        np.testing.assert_allclose(full.values[-1], b.values[-1], rtol=0, atol=1e-12)
        assert full.stats["rejected"][-1] == 0


def test_jko_steps_ending_on_a_layer_boundary_keep_their_layer():
    """The JKO step is implicit (the energy at the step's end): the third step of 0.1, ending on the boundary
    at 0.3 (3 x 0.1 = 0.30000000000000004), used the second layer's energy and was 2.2e-2 off the first
    layer's run; now both layers' runs are repeated exactly (warm start across the boundary)."""
    from wflow.solvers.jko import jko

    mesh = wflow.CircleMesh(64)
    rho0 = wflow.Density.from_function(
        mesh,
        lambda x: np.exp(np.cos(np.arctan2(x[:, 1], x[:, 0]) - 0.3)) + 0.5 * np.exp(2 * x[:, 0]),
    )
    l1, l2 = USA(2.0), USA(3.0, V=-np.eye(2))
    kw = {"kappa": 4.0, "backend": BK}
    full = jko(Layered([l1, l2], period=0.3), rho0, 0.1, 6, save_every=3, **kw)
    a = jko(l1, rho0, 0.1, 3, **kw)
    b = jko(l2, a.atoms(-1), 0.1, 3, warm_start=a.warm_start, reference=mesh.areas, **kw)
    np.testing.assert_array_equal(full.weights[1], a.weights[-1])
    np.testing.assert_array_equal(full.weights[-1], b.weights[-1])


def test_time_dependent_models_and_schemes_on_the_continuum_solvers():
    """nGPT and sqrt-scaling are fields on the sphere: the finite-volume solver runs them (mass kept)."""
    rho0 = wflow.Density.from_function(wflow.CircleMesh(64), lambda x: 1 + 0.5 * x[:, 0])
    for m in (Normalized(SA(2.0), "ngpt", alpha=0.5), Normalized(SA(2.0), "sqrt")):
        r = wflow.solve_density(m, rho0, 1.0, backend=BK)
        assert abs(r.mass[-1] - 1) < 1e-13 and r.values.min() >= 0
    with pytest.raises(ValueError, match="carries radii"):
        wflow.solve_density(Normalized(SA(2.0), "pre-ln"), rho0, 1.0)
    sq = TimeDependent(lambda t: SA(1.0 + t))
    assert wflow.simulate(sq, sphere.uniform(5, 3, seed=0), 1.0, dt=0.1, backend=BK).status == 0


def test_long_context_scaling_and_one_layer_map():
    """beta = gamma log n on n equiangular tokens: the cosines of the attention outputs and of one Post-LN
    layer equal the closed forms of wflow.theory at finite n, below, at and above gamma_c = 1/(1-rho)."""
    n, rho = 64, 0.5
    x = theory.equiangular_configuration(n, rho)
    off = ~np.eye(n, dtype=bool)

    def cosines(y):
        u = y / np.linalg.norm(y, axis=-1, keepdims=True)
        c = (u @ u.T)[off]
        assert np.ptp(c) < 1e-12
        return c.mean()

    for gamma in (1.0, 2.0, 3.0):
        att = SA(gamma=gamma)
        a = att.average(x, wflow.Atoms(x), backend=BK)
        np.testing.assert_allclose(
            cosines(a), theory.long_context_cosine(rho, gamma, n, scheme="pre-ln"), rtol=1e-10
        )
        post = layer_map(Normalized(att, "post-ln"), x, backend=BK)
        np.testing.assert_allclose(
            cosines(post), theory.long_context_cosine(rho, gamma, n, scheme="post-ln"), rtol=1e-10
        )
    pre = layer_map(Normalized(SA(gamma=2.0), "pre-ln"), 2.0 * x, backend=BK)
    np.testing.assert_allclose(
        pre, 2.0 * x + SA(gamma=2.0).average(x, wflow.Atoms(x), backend=BK), atol=1e-15
    )
    assert SA(gamma=2.0).beta_for(100) == pytest.approx(2 * np.log(100))


@pytest.mark.parametrize(
    "make,exc,match",
    [
        (lambda: Normalized(SA(1.0), "mix-ln"), ValueError, "tau"),
        (lambda: Normalized(SA(1.0), "mix-ln", tau=-1.0), ValueError, "tau"),
        (lambda: Normalized(SA(1.0), "ngpt", alpha=-0.5), ValueError, "alpha"),
        (
            lambda: Normalized(SA(1.0), "ngpt", alpha=[1.0, np.nan], alpha_times=[0, 1]),
            ValueError,
            "alpha",
        ),
        (lambda: Normalized(SA(1.0), "layer-norm"), ValueError, "scheme"),
        (lambda: Layered([SA(1.0, Q=np.eye(3)), SA(1.0, Q=np.eye(4))]), ValueError, "dimensions"),
        (lambda: Layered([], period=1.0), TypeError, "layers"),
        (lambda: Layered([SA(1.0)], period=0.0), ValueError, "period"),
        (lambda: SA(1.0, kernel="log"), ValueError, "kernel"),
        (lambda: SA(1.0, gamma=2.0), ValueError, "not both"),
        (lambda: USA(1e4).rate_bound(), WflowError, "rescaled"),
    ],
)
def test_bad_input_names_it(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


def test_angles_on_the_circle_resolve_forces_below_rounding():
    """coordinates='angles' (Kuramoto form) equals the Cartesian run where both resolve the dynamics, its
    exact Jacobian matches differences, and it passes a merge that Cartesian coordinates cannot see: USA
    (rescaled) at beta = 500, GKPR's five tokens, the fourth merge at t ~ 1e17 (attraction e^-40)."""
    x0 = sphere.uniform(7, 2, seed=8)
    a = wflow.simulate(
        SA(3.0), x0, 2.0, method="dopri5", rtol=1e-11, atol=1e-13, coordinates="angles"
    )
    c = wflow.simulate(SA(3.0), x0, 2.0, method="dopri5", rtol=1e-11, atol=1e-13, backend=BK)
    np.testing.assert_allclose(a.points, c.points, atol=1e-8)
    np.testing.assert_allclose(a.energy, c.energy, rtol=1e-10)
    from wflow.solvers.particles import CircleAngleProblem
    from wflow.solvers.steppers import ROS2

    th = np.random.default_rng(0).uniform(0, 1, 6)
    for m in (SA(3.0), USA(3.0, kernel="rescaled"), USA(2.0, V=-np.eye(2))):
        p = CircleAngleProblem(m, np.full(6, 1 / 6), diagnostics=())
        np.testing.assert_allclose(
            p.jacobian(0.0, th), ROS2().jacobian(p, 0.0, th, p.rhs(0.0, th)), atol=1e-6
        )
    beta = 500.0
    theta = 0.5 * np.array([0, 0.5, 2, 4, 7]) * np.log(beta) / np.sqrt(beta)
    x0 = np.stack([np.cos(theta), np.sin(theta)], -1)
    r = wflow.simulate(
        USA(beta, kernel="rescaled"),
        x0,
        1e18,
        method="ros2",
        rtol=1e-6,
        atol=1e-10,
        save_at=np.concatenate([[0], np.logspace(-3, 18, 60)]),
        coordinates="angles",
    )
    ang = r.data["angles"][1]
    clusters = (np.diff(np.sort(ang, axis=1), axis=1) > 1e-6).sum(axis=1) + 1
    assert list(np.unique(clusters)[::-1]) == [5, 4, 3, 2] and clusters[-1] == 2
    assert np.all(np.diff(r.energy) >= -1e-12 * r.energy.max())  # the staircase never steps down


def test_gap_coordinates_agree_with_angles_and_have_the_exact_jacobian():
    """coordinates='gaps' (CircleGapProblem): the run equals the angle run in the caller's order, the velocity
    is T^-1 of the angle velocity, and the Jacobian T^-1 J T matches finite differences (SA, USA, V = -I)."""
    x0 = sphere.uniform(7, 2, seed=8)
    for m in (SA(3.0), USA(2.0, kernel="rescaled")):
        a = wflow.simulate(
            m, x0, 2.0, method="dopri5", rtol=1e-11, atol=1e-13, coordinates="angles"
        )
        g = wflow.simulate(m, x0, 2.0, method="dopri5", rtol=1e-11, atol=1e-13, coordinates="gaps")
        np.testing.assert_allclose(g.points, a.points, atol=1e-9)
        np.testing.assert_allclose(g.energy, a.energy, rtol=1e-10)
        np.testing.assert_array_equal(g.weights, a.weights)
    from wflow.solvers.particles import CircleAngleProblem, CircleGapProblem
    from wflow.solvers.steppers import ROS2

    rng = np.random.default_rng(0)
    th = rng.uniform(0, 2 * np.pi, 6)
    w = rng.uniform(0.5, 1.5, 6)
    w /= w.sum()
    order, y = CircleGapProblem.from_angles(th)
    assert np.all(y[1:] >= 0) and np.sum(y[1:]) < 2 * np.pi
    np.testing.assert_allclose(
        np.mod(y[0] + np.concatenate([[0], np.cumsum(y[1:])]) - th[order] + 1, 2 * np.pi),
        1,
        atol=1e-14,
    )
    for m in (SA(3.0), USA(3.0, kernel="rescaled"), USA(2.0, V=-np.eye(2))):
        p = CircleGapProblem(m, w, order, diagnostics=())
        f = CircleAngleProblem(m, w[order], diagnostics=()).rhs(0.0, p.angles(y))
        np.testing.assert_allclose(p.rhs(0.0, y), np.concatenate([f[:1], np.diff(f)]), atol=1e-15)
        np.testing.assert_allclose(
            p.jacobian(0.0, y), ROS2().jacobian(p, 0.0, y, p.rhs(0.0, y)), atol=1e-6
        )


def _two_cluster_time(beta, delta0, delta1):
    """log of the time two point clusters (total mass 1, USA rescaled) take from gap delta0 to delta1:
    t = int_{delta1}^{delta0} e^{2 beta sin^2(u/2)} / sin u du (delta' = -e^{-2 beta sin^2(delta/2)} sin delta)."""
    from scipy.integrate import quad

    f0 = 2 * beta * np.sin(delta0 / 2) ** 2
    val, _ = quad(
        lambda u: np.exp(2 * beta * np.sin(u / 2) ** 2 - f0) / np.sin(u),
        delta1,
        delta0,
        epsabs=0,
        epsrel=1e-12,
        limit=200,
    )
    return f0 + np.log(val)


def test_the_gkpr_staircase_at_beta_4000_completes_every_merge():
    """USA (rescaled) at beta = 4000, GKPR's five tokens, gap coordinates and ros2: the four merges 5 -> 4 -> 3
    -> 2 -> 1 (the last at t ~ 1e78, in steps below the rounding of t), the energy never decreases and ends at
    1/(2 beta); and the last merge's timing against the exact two-cluster integral: two clusters of masses
    3/5, 2/5 at gap 0.3 reach gap 0.15 at t = 1.1e75 (log t = 172.80): the run crosses within 2e-5 of log t."""
    beta = 4000.0
    theta = 0.5 * np.array([0, 0.5, 2, 4, 7]) * np.log(beta) / np.sqrt(beta)
    x0 = np.stack([np.cos(theta), np.sin(theta)], -1)
    r = wflow.simulate(
        USA(beta, kernel="rescaled"),
        x0,
        1e90,
        method="ros2",
        rtol=1e-4,
        atol=1e-10,
        save_at=np.concatenate([[0], np.logspace(-3, 90, 94)]),
        coordinates="gaps",
    )
    gaps = r.data["gaps"][1][:, 1:]
    clusters = (np.abs(gaps) > 1e-6).sum(axis=1) + 1
    assert list(np.unique(clusters)[::-1]) == [5, 4, 3, 2, 1] and np.all(np.diff(clusters) <= 0)
    le = r.diagnostics["log_energy"]
    assert np.all(np.diff(le) >= -1e-12)
    assert abs(le[-1] + np.log(2 * beta)) < 1e-12
    # the last merge alone: exact time from the two-cluster ODE
    delta0 = 0.3
    x0 = sphere.angles_to_points(np.array([0, 0, 0, delta0, delta0]))
    logT = _two_cluster_time(beta, delta0, delta0 / 2)
    ts = np.exp(logT + np.array([-2e-5, 2e-5]) * logT)
    two = wflow.simulate(
        USA(beta, kernel="rescaled"),
        x0,
        ts[-1],
        method="ros2",
        rtol=1e-4,
        atol=1e-12,
        save_at=np.concatenate([[0], ts]),
        coordinates="gaps",
    )
    g = two.data["gaps"][1][:, 3]
    assert g[1] > delta0 / 2 > g[2], (logT, g)
