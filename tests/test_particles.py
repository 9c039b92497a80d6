import numpy as np
import pytest

from wflow import SA, USA, Atoms, Perceptron, SolverError, simulate, sphere, theory
from wflow.models import Model
from wflow.solvers.base import Tracker
from wflow.theory import equiangular_configuration


@pytest.mark.parametrize("kind", ["SA", "USA"])
@pytest.mark.parametrize("beta,n", [(1.0, 3), (4.0, 6), (9.0, 10)])
def test_equiangular_reduction(kind, beta, n):
    """Particles from an equiangular start follow rho' = F(rho) of DESIGN.md §1 to 1e-9 (RK4)."""
    rho0 = 0.1
    x0 = equiangular_configuration(n, rho0)
    model = SA(beta) if kind == "SA" else USA(beta)
    t = np.linspace(0, 1.0, 6)
    traj = simulate(
        model, Atoms(x0), t[-1], save_at=t, dt=2e-3 if kind == "SA" else 2e-4 * 9 / max(beta, 1)
    )
    G = np.einsum("tid,tjd->tij", traj.points, traj.points)
    off = G[:, ~np.eye(n, dtype=bool)]
    assert np.ptp(off, axis=1).max() < 1e-12  # stays equiangular
    ref = theory.equiangular_solution(
        rho0, traj.times, beta, n, kind
    )  # saves snapped to the step grid
    np.testing.assert_allclose(off.mean(axis=1), ref, rtol=0, atol=1e-9)


@pytest.mark.parametrize("model", [SA(4.0), USA(2.0)], ids=["SA", "USA"])
@pytest.mark.parametrize("d", [2, 3])
def test_energy_non_decreasing(model, d, rng):
    mu0 = Atoms(sphere.uniform(80, d, rng))
    traj = simulate(model, mu0, 3.0, save_at=np.linspace(0, 3, 31), dt=0.02)
    e = traj.energy
    assert np.all(np.diff(e) >= -1e-12 * np.abs(e).max())
    assert e[-1] > e[0] * 1.01  # and it really moves
    np.testing.assert_allclose(np.linalg.norm(traj.points, axis=-1), 1, atol=1e-12)


def test_rk4_order_four(rng):
    model = SA(2.0) + Perceptron(
        rng.standard_normal((3, 4)), rng.standard_normal((4, 3)), activation="tanh"
    )
    mu0 = Atoms(sphere.uniform(20, 3, rng))
    ref = simulate(
        model, mu0, 1.0, save_at=[0, 1.0], method="dopri5", rtol=1e-13, atol=1e-14
    ).points[-1]
    dts = np.array([0.2, 0.1, 0.05, 0.025])
    errs = [
        np.abs(simulate(model, mu0, 1.0, save_at=[0, 1.0], dt=h).points[-1] - ref).max()
        for h in dts
    ]
    slope = np.polyfit(np.log(dts), np.log(errs), 1)[0]
    assert 3.8 < slope < 4.3, (slope, errs)


def test_euler_order_one(rng):
    mu0 = Atoms(sphere.uniform(15, 3, rng))
    ref = simulate(SA(1.0), mu0, 1.0, save_at=[0, 1.0], dt=0.01).points[-1]
    errs = [
        np.abs(
            simulate(SA(1.0), mu0, 1.0, save_at=[0, 1.0], dt=h, method="euler").points[-1] - ref
        ).max()
        for h in (0.02, 0.01, 0.005)
    ]
    slope = np.polyfit(np.log([0.02, 0.01, 0.005]), np.log(errs), 1)[0]
    assert 0.9 < slope < 1.1


@pytest.mark.parametrize("rtol", [1e-5, 1e-8])
def test_adaptive_agrees_with_fixed_step(rtol, rng):
    mu0 = Atoms(sphere.uniform(30, 3, rng))
    model = SA(5.0)
    ref = simulate(model, mu0, 2.0, dt=0.005)
    ad = simulate(model, mu0, 2.0, method="dopri5", rtol=rtol, atol=rtol * 1e-3)
    err = np.abs(ad.points - ref.points).max()
    assert err < 20 * rtol  # global error within a modest multiple of the local tolerance
    assert ad.stats["steps"][-1] < ref.stats["steps"][-1]
    assert ad.stats["evaluations"][-1] >= 7 * ad.stats["steps"][-1]


def test_batched_systems_match_single_runs(rng):
    x = sphere.uniform(8, 3, rng, batch=(4,))
    traj = simulate(SA(3.0), Atoms(x), 1.0, dt=0.05)
    for b in (0, 3):
        single = simulate(SA(3.0), Atoms(x[b]), 1.0, dt=0.05)
        np.testing.assert_allclose(traj.points[:, b], single.points, atol=1e-14)
        np.testing.assert_allclose(traj.energy[:, b], single.energy, rtol=1e-13)


def test_noise_is_seeded_and_stays_on_sphere(rng):
    mu0 = Atoms(sphere.uniform(50, 3, rng))
    a = simulate(SA(1.0), mu0, 1.0, kappa=2.0, dt=0.01, seed=5)
    b = simulate(SA(1.0), mu0, 1.0, kappa=2.0, dt=0.01, seed=5)
    c = simulate(SA(1.0), mu0, 1.0, kappa=2.0, dt=0.01, seed=6)
    np.testing.assert_array_equal(a.points, b.points)
    assert np.abs(a.points[-1] - c.points[-1]).max() > 0.1
    np.testing.assert_allclose(np.linalg.norm(a.points, axis=-1), 1, atol=1e-12)


def test_pure_diffusion_decay_rate(rng):
    """V = 0: each particle is a Brownian motion on S^2, whose mean decays like e^{-(d-1) t / kappa}.

    20000 independent one-particle systems (a batch), so no pair sums are needed.
    """
    n, kappa, t = 20_000, 4.0, 1.0
    x0 = np.tile([0.0, 0.0, 1.0], (n, 1, 1))
    traj = simulate(
        USA(0.0, V=np.zeros((3, 3))), Atoms(x0), t, save_at=[0, t], kappa=kappa, dt=0.01, seed=1
    )
    m = traj.points[-1, :, 0, 2].mean()
    # Brownian motion on S^2 with generator Delta/kappa: E[z] = exp(-2 t / kappa); weak error O(dt)
    assert abs(m - np.exp(-2 * t / kappa)) < 4 / np.sqrt(n) + 0.01 * 2 / kappa


class _Exploding(Model):
    """Velocity turns NaN after t > 0.5 (to test the NaN stop)."""

    def velocity(self, x, mu, *, backend="auto"):
        return np.full_like(x, np.nan) if self.t > 0.5 else sphere.project(x, np.ones_like(x))

    def to_dict(self):
        return {"type": "Exploding"}


def test_nan_stops_run_and_keeps_snapshots(rng):
    class Keep(Tracker):
        def __init__(self):
            self.times = []

        def save(self, snap):
            self.times.append(snap.t)

    model = _Exploding()
    model.t = 0.0

    def tick(t, mu):
        model.t = t

    keep = Keep()
    with pytest.raises(SolverError, match="non-finite"):
        simulate(model, Atoms(sphere.uniform(5, 3, rng)), 1.0, dt=0.1, writer=keep, callback=tick)
    assert keep.times == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6])


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        (dict(t_end=-1.0), ValueError, "t_end"),
        (dict(t_end="1"), TypeError, "t_end"),
        (dict(dt=0.0), ValueError, "dt"),
        (dict(dt=-0.1), ValueError, "dt"),
        (dict(method="leapfrog"), ValueError, "method"),
        (dict(method="rk4", kappa=1.0), ValueError, "euler-maruyama"),
        (dict(rtol=1e-6, dt=0.1), ValueError, "rtol"),
        (dict(save_at=[0, 2.0]), ValueError, "save_at"),
        (dict(kappa=-1.0), ValueError, "kappa"),
        (dict(seed="x", kappa=1.0), TypeError, "seed"),
    ],
)
def test_bad_simulate_input(kwargs, exc, match, rng):
    args = dict(t_end=1.0)
    args.update(kwargs)
    t_end = args.pop("t_end")
    with pytest.raises(exc, match=match):
        simulate(SA(1.0), Atoms(sphere.uniform(4, 3, rng)), t_end, **args)


def test_dimension_mismatch_is_reported(rng):
    with pytest.raises(ValueError, match="d=3"):
        simulate(SA(1.0, V=np.eye(3)), Atoms(sphere.uniform(4, 2, rng)), 1.0)
    with pytest.raises(TypeError, match="model"):
        simulate("SA", Atoms(sphere.uniform(4, 2, rng)), 1.0)


def test_euler_on_many_small_sa_systems_takes_the_fused_step(monkeypatch):
    """SA with Q = K = V = I, backend auto: Euler takes ParticleProblem.euler_step (one compiled pass per
    system) and equals the unfused step (backend numpy) to rounding; a general V falls back."""
    import wflow
    from wflow.solvers import fused as fused_module

    calls = []
    fused = fused_module.fused_step
    monkeypatch.setattr(
        fused_module, "fused_step", lambda *a, **k: calls.append(1) or fused(*a, **k)
    )
    x0 = np.stack([wflow.sphere.uniform(16, 5, seed=s) for s in range(6)])
    kw = dict(
        method="euler", dt=0.1, save_at=np.linspace(0, 3, 7), diagnostics=("order_parameter",)
    )
    a = wflow.simulate(wflow.SA(4.0), x0, 3.0, backend="auto", **kw)
    assert len(calls) == 30  # (the order parameter alone is not worth a step taken ahead)
    b = wflow.simulate(wflow.SA(4.0), x0, 3.0, backend="numpy", **kw)
    assert len(calls) == 30
    np.testing.assert_allclose(a.points, b.points, atol=1e-12)
    wflow.simulate(wflow.SA(4.0, V=-np.eye(5)), x0, 3.0, backend="auto", **kw)
    assert len(calls) == 30


def test_fused_steps_skip_the_state_scan_only_when_they_saw_a_finite_state(monkeypatch):
    """A fused step tells the driver its output is finite (no scan of the state); a step that puts a token on
    the origin (GLPR's scheme, h = 1, the token's only weighted neighbour antipodal) is reported as the
    driver's non-finite-state error, and the points saved before are the fused steps' outputs, unchanged by
    the steps after them (the snapshots hold read-only views of them, not copies)."""
    import wflow
    import wflow.solvers.driver as driver

    scans = []
    finite = driver._finite
    monkeypatch.setattr(driver, "_finite", lambda y: scans.append(1) or finite(y))
    x0 = np.stack([sphere.uniform(16, 5, seed=s) for s in range(6)])
    kw = dict(method="euler", dt=0.1, save_at=np.linspace(0, 2, 5))
    a = wflow.simulate(wflow.SA(4.0), x0, 2.0, backend="auto", **kw)
    assert scans == []
    b = wflow.simulate(wflow.SA(4.0), x0, 2.0, backend="numpy", **kw)
    assert len(scans) == 20
    np.testing.assert_allclose(a.points, b.points, rtol=0, atol=1e-12)
    e = np.array([1.0, 0.0, 0.0])
    x = np.stack([np.stack([e, -e]), sphere.uniform(2, 3, seed=1)])
    with pytest.raises(SolverError, match="non-finite in the step from t=0 "):
        wflow.simulate(
            wflow.SA(0.0),
            Atoms(x, np.array([[0.0, 1.0]] * 2)),
            2.0,
            method="euler-average",
            dt=1.0,
            backend="auto",
        )


@pytest.mark.parametrize("method", ["euler", "euler-average"])
@pytest.mark.parametrize("coordinates", ["cartesian", "span"])
def test_fused_euler_counts_saved_pairs_on_the_next_step(monkeypatch, method, coordinates):
    """pair_fraction in a run of fused Euler steps: each save after the first is counted on the Gram matrices
    of the step from it, taken ahead (ParticleProblem._step_ahead), so pair_counts runs once; the
    saved fractions equal pair_fraction of the saved points, the points equal those of a run without the
    diagnostic bit for bit, one evaluation per step; a last step shorter than dt (t_end = 7.95) is taken
    afresh."""
    import wflow
    from wflow.diagnostics import pair_fraction, pairs

    calls = []
    counts = pairs.pair_counts
    monkeypatch.setattr(pairs, "pair_counts", lambda *a, **k: calls.append(1) or counts(*a, **k))
    x0 = np.stack([wflow.sphere.uniform(12, 20, seed=s) for s in range(5)])
    for t_end, saves in ((8.0, np.linspace(0, 8, 17)), (7.95, [0.0, 6.0, 7.9, 7.95])):
        kw = dict(method=method, dt=0.1, save_at=saves, backend="auto", coordinates=coordinates)
        calls.clear()
        a = wflow.simulate(SA(3.0), x0, t_end, diagnostics=("pair_fraction",), **kw)
        assert len(calls) == 1  # the first save's
        b = wflow.simulate(SA(3.0), x0, t_end, diagnostics=(), **kw)
        np.testing.assert_array_equal(a.points, b.points)
        pf = pair_fraction(a.points, 0.999)
        np.testing.assert_array_equal(a.diagnostics["pair_fraction"], pf)
        assert (
            pf[0].max() == 0.0 and pf[-1].min() == 1.0 and ((0 < pf) & (pf < 1)).any()
        )  # tokens merge
        np.testing.assert_array_equal(a.stats["evaluations"], a.stats["steps"])


@pytest.mark.parametrize("coordinates", ["cartesian", "span"])
@pytest.mark.parametrize("weights", ["equal", "unequal", "zeros"])
def test_fused_euler_energy_from_the_next_steps_row_sums(monkeypatch, coordinates, weights):
    """energy and log_energy in a run of fused Euler steps: each save after the first is summed from the row
    sums of the step from it (ParticleProblem._step_ahead; SA.log_energy runs once, at the first save), and
    equals SA.log_energy of the saved points (numpy backend) to rounding, with one shift per system (equal
    weights, and unequal ones within a factor of 3) and with each row shifted by its maximum (zero weights);
    the points are those of a run without diagnostics, bit for bit."""
    import wflow
    from wflow.models import SA as SAModel

    calls = []
    log_energy = SAModel.log_energy
    monkeypatch.setattr(
        SAModel, "log_energy", lambda self, *a, **k: calls.append(1) or log_energy(self, *a, **k)
    )
    x0 = np.stack([wflow.sphere.uniform(12, 20, seed=s) for s in range(5)])
    w = np.full((5, 12), 1 / 12)
    if weights == "zeros":
        w[:, ::5] = 0.0
    elif weights == "unequal":
        w = w * (1.0 + 2.0 * np.random.default_rng(4).random((5, 12)))
    w /= w.sum(axis=-1, keepdims=True)
    kw = dict(
        method="euler",
        dt=0.1,
        save_at=np.linspace(0, 4, 9),
        backend="auto",
        coordinates=coordinates,
    )
    a = wflow.simulate(SA(3.0), Atoms(x0, w), 4.0, diagnostics=("energy", "log_energy"), **kw)
    assert len(calls) == 1  # the first save's
    b = wflow.simulate(SA(3.0), Atoms(x0, w), 4.0, diagnostics=(), **kw)
    np.testing.assert_array_equal(a.points, b.points)
    ref = np.array([log_energy(SA(3.0), Atoms(p, w), backend="numpy") for p in a.points])
    np.testing.assert_allclose(a.diagnostics["log_energy"], ref, rtol=0, atol=1e-14)
    np.testing.assert_allclose(a.energy, np.exp(ref), rtol=1e-14)
    assert (np.diff(a.energy, axis=0) > 0).all()  # SA ascends its energy


@pytest.mark.parametrize("method", ["euler", "euler-average"])
@pytest.mark.parametrize("coordinates", ["cartesian", "span"])
def test_fused_euler_clusters_and_order_parameter_from_the_next_step(
    monkeypatch, method, coordinates
):
    """n_clusters and order_parameter in a run of fused Euler steps: each save after the first is read off the
    step from it (its Gram matrix and the points it reads; count_clusters and order_parameter run once, at
    the first save), equal to count_clusters of the saved state exactly and to order_parameter to rounding
    (at several cluster thresholds, as tokens merge); the points are those of a run without diagnostics."""
    import wflow
    import wflow.solvers.particle_problem as P
    from wflow.diagnostics import count_clusters, order_parameter

    calls = []
    for name, f in (("count_clusters", count_clusters), ("order_parameter", order_parameter)):
        monkeypatch.setattr(P, name, lambda *a, f=f, **k: calls.append(1) or f(*a, **k))
    x0 = np.stack([wflow.sphere.uniform(12, 20, seed=s) for s in range(5)])
    w = np.random.default_rng(3).random((5, 12))
    w /= w.sum(axis=-1, keepdims=True)
    kw = dict(
        method=method,
        dt=0.1,
        save_at=np.linspace(0, 8, 17),
        backend="auto",
        coordinates=coordinates,
    )
    b = wflow.simulate(SA(3.0), Atoms(x0, w), 8.0, diagnostics=(), **kw)
    for threshold in (0.05, 0.3):
        calls.clear()
        a = wflow.simulate(
            SA(3.0),
            Atoms(x0, w),
            8.0,
            diagnostics=("n_clusters", "order_parameter"),
            cluster_threshold=threshold,
            **kw,
        )
        assert len(calls) == 2  # the first save's
        np.testing.assert_array_equal(a.points, b.points)
        k = a.diagnostics["n_clusters"]
        state = (
            a.data["span"][1] if coordinates == "span" else a.points
        )  # (the span run's state: y, x = y U)
        np.testing.assert_array_equal(k, count_clusters(Atoms(state, w), threshold))
        assert k[0].min() == 12 and k[-1].max() < 12 and len(np.unique(k)) > 3  # tokens merge
        np.testing.assert_allclose(
            a.diagnostics["order_parameter"], order_parameter(Atoms(a.points, w)), rtol=1e-14
        )


def test_fused_euler_float32_reads_the_observables_off_float64_logits(monkeypatch):
    """float32 states whose step forms float64 logits (beta = 3, d = 20: the float32 rule's bound is 4.3e-6 >
    3e-6): the cluster count, order parameter and energy of each save after the first are read off the step
    (count_clusters, order_parameter and log_energy run once), the count exactly count_clusters' of the
    float32 points, the others within float32 rounding of the separate computations; at beta = 0.5 (float32
    logits) each save computes them on its own, with the same results."""
    import wflow
    import wflow.solvers.particle_problem as P
    from wflow.diagnostics import count_clusters, order_parameter
    from wflow.models import SA as SAModel

    calls = []
    for name, f in (("count_clusters", count_clusters), ("order_parameter", order_parameter)):
        monkeypatch.setattr(P, name, lambda *a, f=f, **k: calls.append(1) or f(*a, **k))
    log_energy = SAModel.log_energy
    monkeypatch.setattr(
        SAModel, "log_energy", lambda self, *a, **k: calls.append(1) or log_energy(self, *a, **k)
    )
    x0 = np.stack([wflow.sphere.uniform(12, 20, seed=s) for s in range(5)]).astype(np.float32)
    w = np.full((5, 12), 1 / 12)
    kw = dict(
        method="euler",
        dt=0.1,
        save_at=np.linspace(0, 8, 17),
        backend="auto",
        cluster_threshold=0.3,
        coordinates="cartesian",  # (the float32 rule of the fused step at r = d = 20)
        diagnostics=("n_clusters", "order_parameter", "energy", "log_energy"),
    )
    for beta, n_calls in ((3.0, 3), (0.5, 3 * 17)):
        calls.clear()
        a = wflow.simulate(SA(beta), Atoms(x0, w), 8.0, **kw)
        assert a.points.dtype == np.float32 and len(calls) == n_calls
        mus = [Atoms(p, w) for p in a.points]
        np.testing.assert_array_equal(
            a.diagnostics["n_clusters"], [count_clusters(mu, 0.3) for mu in mus]
        )
        np.testing.assert_allclose(
            a.diagnostics["order_parameter"], [order_parameter(mu) for mu in mus], rtol=2e-6
        )
        ref = np.array([log_energy(SA(beta), mu, backend="numpy") for mu in mus])
        np.testing.assert_allclose(a.diagnostics["log_energy"], ref, rtol=0, atol=2e-6 * beta)
        if beta == 3.0:
            k = a.diagnostics["n_clusters"]
            assert k[0].min() == 12 and k[-1].max() < 12  # tokens merge


@pytest.mark.parametrize("coordinates", ["cartesian", "span"])
def test_diagnostics_see_the_saved_state_read_only(coordinates):
    """A saved state may be the fused step's output itself (no copy): a user diagnostic that writes into the
    measure it is handed raises instead of changing the saved points (span runs hand it the full
    coordinates, a new array: writing there changes nothing saved)."""
    import wflow

    def scribble(mu):
        mu.points[..., 0, 0] = 7.0
        return np.zeros(mu.batch_shape)

    x0 = np.stack([wflow.sphere.uniform(8, 12, seed=s) for s in range(3)])
    kw = dict(
        method="euler", dt=0.1, save_at=[0.0, 0.5, 1.0], backend="auto", coordinates=coordinates
    )
    if coordinates == "cartesian":
        with pytest.raises(ValueError, match="read-only"):
            wflow.simulate(SA(2.0), x0, 1.0, extra_diagnostics={"scribble": scribble}, **kw)
    else:
        a = wflow.simulate(SA(2.0), x0, 1.0, extra_diagnostics={"scribble": scribble}, **kw)
        b = wflow.simulate(SA(2.0), x0, 1.0, **kw)
        np.testing.assert_array_equal(a.points, b.points)


def test_saved_state_is_read_only_for_callbacks_and_fused_euler_elsewhere():
    """A callback sees the state read-only (the run continues from it: with the step from a saved state
    taken ahead, an edit would have been silently ignored); SA with method="euler" on S^1 in angles or gaps
    takes the unfused step (the fused one needs points: it raised before); one token in span coordinates
    has no pairs: pair_fraction NaN."""
    import wflow

    x0 = np.stack([wflow.sphere.uniform(12, 6, seed=s) for s in range(3)])

    def edit(t, mu):
        mu.points[..., 0, :] = mu.points[..., 1, :]

    with pytest.raises(ValueError, match="read-only"):
        wflow.simulate(
            SA(3.0),
            x0,
            1.0,
            method="euler",
            dt=0.1,
            save_at=[0.0, 0.5, 1.0],
            callback=edit,
            diagnostics=("pair_fraction",),
        )
    th = np.linspace(0.0, 2.0, 7)
    for coordinates in ("angles", "gaps"):
        kw = dict(method="euler", dt=0.1, coordinates=coordinates, diagnostics=("pair_fraction",))
        a = wflow.simulate(SA(1.0), sphere.angles_to_points(th), 1.0, backend="auto", **kw)
        b = wflow.simulate(SA(1.0), sphere.angles_to_points(th), 1.0, backend="numpy", **kw)
        np.testing.assert_allclose(a.points, b.points, rtol=0, atol=1e-15)
        assert np.abs(a.points - sphere.angles_to_points(th)).max() > 0.05  # it moved
    one = wflow.simulate(
        SA(1.0),
        x0[:, :1],
        1.0,
        method="euler",
        dt=0.1,
        coordinates="span",
        diagnostics=("pair_fraction",),
    )
    assert (
        one.diagnostics["pair_fraction"].shape == (11, 3)
        and np.isnan(one.diagnostics["pair_fraction"]).all()
    )


def test_span_coordinates_equal_the_full_run_and_resume(tmp_path):
    """coordinates='span' (n tokens in d > n): the same trajectory as the full-dimensional run to 1e-12,
    the same built-in and user diagnostics, and a resumed run equal to the uninterrupted one."""
    import wflow

    x0 = np.stack([sphere.uniform(6, 40, seed=s) for s in range(3)])
    pf = {
        "close_pairs": lambda mu: (
            np.einsum("...id,...jd->...ij", mu.points, mu.points) > 0.9
        ).mean(axis=(-1, -2))
    }
    kw = dict(
        method="rk4",
        dt=0.05,
        save_at=np.linspace(0, 4, 5),
        extra_diagnostics=pf,
        backend="numpy",
        diagnostics=("energy", "order_parameter", "n_clusters", "pair_fraction"),
    )
    full = wflow.simulate(SA(3.0), x0, 4.0, coordinates="cartesian", **kw)
    span = wflow.simulate(SA(3.0), x0, 4.0, coordinates="span", **kw)
    assert span.data["span"][1].shape == (5, 3, 6, 6) and span.points.shape == full.points.shape
    np.testing.assert_allclose(span.points, full.points, atol=1e-12)
    for name in ("energy", "order_parameter", "close_pairs", "pair_fraction"):
        np.testing.assert_allclose(
            span.diagnostics[name], full.diagnostics[name], rtol=1e-12, atol=1e-14
        )
    np.testing.assert_array_equal(span.diagnostics["n_clusters"], full.diagnostics["n_clusters"])
    from wflow.diagnostics import pair_fraction

    np.testing.assert_array_equal(
        span.diagnostics["pair_fraction"], pair_fraction(span.points, 0.999)
    )
    path = wflow.save(span, tmp_path / "s.zarr")
    back = wflow.load(path)
    np.testing.assert_array_equal(back.points, span.points)
    with pytest.raises(ValueError, match="coordinates='span' is not exact for this run: the model"):
        wflow.simulate(SA(3.0, V=-np.eye(40)), x0, 1.0, coordinates="span", **kw)
    with pytest.raises(ValueError, match="not exact for this run: noise"):
        wflow.simulate(
            SA(3.0), x0, 1.0, coordinates="span", method="euler-maruyama", kappa=2.0, dt=0.1
        )


def test_a_tiny_t_end_takes_the_default_step_without_blaming_dt():
    """t_end = 1e-300: the default step divided a save interval by ceil(tiny) = 0 and failed on a dt
    the user never passed."""
    import warnings

    x0 = sphere.uniform(6, 3, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        traj = simulate(SA(2.0), x0, 1e-300, backend="numpy")
    assert traj.status == 0 and traj.times[-1] == 1e-300
    np.testing.assert_allclose(traj.points[-1], x0, atol=1e-15)


def test_one_default_method_error_controlled_unless_dt_is_fixed():
    """The library and ``wflow run`` share one rule: dopri5 unless dt (rk4) or kappa (noise) is
    given.  The old fixed default step 0.5/(1 + L) took ~1000 rk4 steps at beta = 1000 where the
    error-controlled default takes a few and agrees with a fine fixed-step run."""
    from wflow.build import run_method
    from wflow.config import apply_overrides, default_config

    x0 = sphere.uniform(10, 3, seed=1)
    kw = dict(save_at=[0.0, 0.5], backend="numpy")
    auto = simulate(SA(1e3), x0, 0.5, **kw)
    fine = simulate(SA(1e3), x0, 0.5, dt=0.5 / 1002, **kw)
    assert (auto.config["solver"], fine.config["solver"]) == ("dopri5", "rk4")
    assert auto.stats["steps"][-1] < 50 and fine.stats["steps"][-1] == 1002
    np.testing.assert_allclose(auto.points[-1], fine.points[-1], atol=1e-7)
    noisy = simulate(SA(1.0), x0, 0.5, kappa=4.0, seed=0, **kw)
    assert noisy.config["solver"] == "euler-maruyama"
    cfg = default_config()
    assert cfg["run.method"] == "auto" and run_method(cfg) == "dopri5"
    assert run_method(apply_overrides(cfg, ["run.dt=0.05"])) == "rk4"
    assert run_method(apply_overrides(cfg, ["run.kappa=2"])) == "euler-maruyama"


def test_one_save_of_a_span_run_is_formed_alone():
    """``Trajectory.points`` forms x = yU for every save; ``points_at(i)``, ``atoms(i)`` and ``final``
    form only save ``i`` and equal the same rows of ``points``."""
    x0 = sphere.uniform(8, 40, seed=0, batch=(3,))
    traj = simulate(SA(3.0), x0, 1.0, dt=0.1, save_at=np.linspace(0, 1, 6))
    assert traj.config["coordinates"] == "span" and "points" not in traj.data
    for i in (0, 3, -1):
        np.testing.assert_array_equal(traj.points_at(i), traj.points[i])
    np.testing.assert_array_equal(traj.final.points, traj.points[-1])
    np.testing.assert_allclose(np.linalg.norm(traj.final.points, axis=-1), 1.0, atol=1e-14)
