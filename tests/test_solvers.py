"""The solver contract (wflow.solvers.base): every registered solver's observed order against its
declared one, the driver's step control and save times, resume of every kind, bad input."""

import re

import numpy as np
import pytest
from scipy.special import iv

import wflow
from wflow import SA, USA, CircleMesh, Density, sphere
from wflow.errors import SolverError
from wflow.solvers import SOLVERS
from wflow.solvers.base import Problem, Tracker, integrate
from wflow.solvers.particles import ParticleProblem

BK = "numpy"


def _slope(h, err):
    return float(np.polyfit(np.log(h), np.log(err), 1)[0])


# ------------------------------------------------------------------------------ orders
def _particle_problem(backend=BK):
    rng = np.random.default_rng(1)
    x0 = sphere.uniform(8, 3, rng)
    return ParticleProblem(SA(1.5), np.full(8, 1 / 8), 3, backend=backend, diagnostics=()), x0


def _deterministic_order(name):
    # (the fused Euler step fuses with the numba kernels only: its problem must ask for them)
    problem, x0 = _particle_problem("numba" if name == "fused-euler" else BK)
    assert name != "fused-euler" or problem.fused_spec(0.0, x0) is not None
    ref = integrate(problem, "dopri5", x0, 0.0, 1.0, save_at=[0, 1], rtol=1e-13, atol=1e-14).data[
        "points"
    ][1][-1]
    hs = {
        "euler": [0.05, 0.025, 0.0125],
        "euler-average": [0.05, 0.025, 0.0125],
        "fused-euler": [0.05, 0.025, 0.0125],
        "rk4": [0.2, 0.1, 0.05],
        "dopri5": [0.5, 0.25, 0.125],
        "ssprk3": [0.1, 0.05, 0.025],
        "ros2": [0.05, 0.025, 0.0125],
    }[name]
    errs = [
        np.abs(
            integrate(problem, name, x0, 0.0, 1.0, save_at=[0, 1], dt=h, adaptive=False).data[
                "points"
            ][1][-1]
            - ref
        ).max()
        for h in hs
    ]
    return _slope(hs, errs)


class _GeometricBrownian(Problem):
    """dX = a X dt + b X dW for P independent paths; the noise reads a fixed fine Brownian path, so
    runs with different steps see the same path (a strong-order test)."""

    kind = "ode"

    def __init__(self, a, b, W, dt_fine):
        super().__init__()
        self.a, self.b, self.W, self.h = a, b, W, dt_fine

    @property
    def stochastic(self):
        return True

    def rhs(self, t, y):
        self.evaluations += 1
        return self.a * y

    def noise(self, t, y, dt, rng):
        k0, k1 = int(round(t / self.h)), int(round((t + dt) / self.h))
        return self.b * y * (self.W[k1] - self.W[k0])


def _em_order():
    P, n_fine, a, b = 400, 2**10, 1.0, 1.0
    rng = np.random.default_rng(0)
    W = np.concatenate(
        [np.zeros((1, P)), np.cumsum(rng.standard_normal((n_fine, P)) / np.sqrt(n_fine), axis=0)]
    )
    exact = np.exp((a - b * b / 2) + b * W[-1])
    problem = _GeometricBrownian(a, b, W, 1.0 / n_fine)
    hs = [2.0**-4, 2.0**-5, 2.0**-6, 2.0**-7]
    errs = [
        np.mean(
            np.abs(
                integrate(
                    problem, "euler-maruyama", np.ones(P), 0.0, 1.0, save_at=[0, 1], dt=h, seed=0
                ).data["state"][1][-1]
                - exact
            )
        )
        for h in hs
    ]
    return _slope(hs, errs)


def _jko_order():
    """Successive refinement in tau of the heat equation (pure diffusion) on a 64-cell circle."""
    m = CircleMesh(64)
    rho0 = Density.from_function(m, lambda x: np.exp(np.cos(np.arctan2(x[:, 1], x[:, 0]))))
    taus = [0.1, 0.05, 0.025, 0.0125]
    w = [
        wflow.solvers.jko.jko(None, rho0, t, int(round(0.4 / t)), kappa=1.0, backend=BK).weights[-1]
        for t in taus
    ]
    diffs = [np.abs(w[i] - w[i + 1]).sum() for i in range(3)]
    return _slope(taus[:3], diffs)


def _remap_order():
    """The zonal remap step (a 1-D conservation law, not an ODE on particles) on 2048 bands, fine enough that
    the remap's per-step spatial error stays below the time error: fixed steps against a step of 0.0125."""
    from wflow.solvers.zonal import ZonalProblem

    problem = ZonalProblem(8, 2048, beta=4.0)
    m0 = problem.fv.masses_from_function(lambda z: np.exp(1.5 * z) * (1 + 0.3 * np.cos(3 * z)))

    def end(h):
        return integrate(
            problem, "remap", m0, 0.0, 1.6, save_at=[0, 1.6], dt=h, adaptive=False
        ).data["masses"][1][-1]

    ref = end(0.0125)
    hs = [0.2, 0.1, 0.05]
    return _slope(hs, [np.abs(end(h) - ref).sum() for h in hs])


@pytest.mark.parametrize("name", sorted(SOLVERS))
def test_every_solver_has_its_declared_order(name):
    """As diffrax's test_ode_order: the log-log slope of the error against the step matches ``order``."""
    solver = SOLVERS[name]
    if name == "euler-maruyama":
        slope = _em_order()
    elif name == "jko":
        slope = _jko_order()
    elif name == "remap":
        slope = _remap_order()
    else:
        slope = _deterministic_order(name)
    assert abs(slope - solver.order) < 0.25 * max(1.0, solver.order / 2), (
        name,
        slope,
        solver.order,
    )


# ------------------------------------------------------------------------------ the driver
def test_fixed_steps_keep_dt_and_land_on_saves():
    """`simulate(SA(4), x0, 2, save_at=[0, 1, 2], method="rk4", dt=0.3).times` was [0, 0.9, 2]: save
    times snapped to the grid (issue 52, item 4).  The step crossing a save time is now split in two
    (to it, then on to the grid time): the times are those asked for, every other step is dt, and on
    a linear problem the state at a save is Euler's exact product over the split steps."""
    x0 = sphere.uniform(6, 3, np.random.default_rng(0), batch=(2,))
    req = np.linspace(0, 30, 200)  # 198 of them between grid times
    traj = wflow.simulate(SA(2.0), x0, 30.0, method="euler", dt=0.1, save_at=req, backend=BK)
    np.testing.assert_array_equal(traj.times, req)
    on_grid = np.abs(req / 0.1 - np.round(req / 0.1)) < 1e-9
    assert int(traj.stats["steps"][-1]) == 300 + int((~on_grid).sum())
    grid_saves = np.arange(0, 151) * 0.2  # on the grid (to 1e-9 dt): no step is split
    traj = wflow.simulate(SA(2.0), x0, 30.0, method="euler", dt=0.1, save_at=grid_saves, backend=BK)
    assert int(traj.stats["steps"][-1]) == 300

    class Decay(Problem):
        def rhs(self, t, y):
            return -y

    res = integrate(Decay(), "euler", np.array([1.0]), 0.0, 1.0, dt=0.3, save_at=[0.5, 0.65, 1.0])
    hs = {0.5: [0.3, 0.2], 0.65: [0.3, 0.2, 0.1, 0.05], 1.0: [0.3, 0.2, 0.1, 0.05, 0.25, 0.1]}
    for t, y in zip(res.times[1:], res["state"][1:, 0]):
        assert y == pytest.approx(np.prod([1 - h for h in hs[round(float(t), 12)]]), rel=1e-14)


def test_finite_volume_defaults_resolve_linear_growth():
    """Issue 11's case: SA(beta=5), 1e-5 cos 3 theta on 1024 cells to T = 1/lambda used to take ONE
    step (growth rate 2 % off); with default arguments it is now within 1e-4 of theory."""
    m = CircleMesh(1024)
    k, beta = 3, 5.0
    lam = k**2 * iv(k, beta) / (beta * iv(0, beta))
    rho0 = Density.from_function(m, lambda x: 1 + 1e-5 * np.cos(k * np.arctan2(x[:, 1], x[:, 0])))
    r = wflow.solve_density(SA(beta), rho0, 1.0 / lam, backend=BK)
    a = np.abs((r.values * m.areas) @ np.exp(-1j * k * m.center_angles))
    measured = np.log(a[1] / a[0]) * lam
    assert abs(measured / lam - 1) < 1e-4, measured
    assert r.stats["steps"][-1] >= 10


class _Stop(Tracker):
    def __init__(self, k):
        self.k, self.n = k, 0

    def save(self, snap):
        self.n += 1
        if self.n == self.k:
            raise KeyboardInterrupt


def _runs(tmp_path):
    """For each kind: a function that runs it with extra trackers into a store."""
    rng = np.random.default_rng(3)
    x0 = sphere.uniform(12, 3, rng)
    c0 = sphere.uniform(6, 2, rng)
    m = CircleMesh(48)
    rho0 = Density.from_function(m, lambda x: 1 + 0.6 * x[:, 0] + 0.3 * x[:, 1] ** 2)
    return {
        "particles-dopri5": lambda tr: wflow.simulate(
            SA(3.0), x0, 1.5, method="dopri5", rtol=1e-8, backend=BK, trackers=tr
        ),
        "particles-split": lambda tr: wflow.simulate(
            SA(3.0),
            x0,
            1.5,
            method="rk4",
            dt=0.2,
            save_at=[0, 0.25, 0.5, 0.7, 1.1, 1.5],
            backend=BK,
            trackers=tr,
        ),
        "particles-noise": lambda tr: wflow.simulate(
            SA(3.0), x0, 1.5, kappa=4.0, dt=0.01, seed=2, backend=BK, trackers=tr
        ),
        "particles-gaps": lambda tr: wflow.simulate(
            USA(30.0, kernel="rescaled"),
            c0,
            1e3,
            method="ros2",
            rtol=1e-4,
            coordinates="gaps",
            trackers=tr,
            save_at=np.geomspace(1e-3, 1e3, 8),
        ),
        "lagrangian": lambda tr: wflow.solve_lagrangian(
            SA(2.0), lambda x: 1 + 0.3 * x[:, 0], 1.0, nodes=32, backend=BK, trackers=tr
        ),
        "density": lambda tr: wflow.solve_density(
            USA(2.0), rho0, 1.0, save_at=np.linspace(0, 1, 6), kappa=5.0, backend=BK, trackers=tr
        ),
        "jko": lambda tr: wflow.solvers.jko.jko(
            USA(2.0), rho0, 0.1, 6, kappa=4.0, backend=BK, save_every=1, trackers=tr
        ),
    }


@pytest.mark.parametrize(
    "kind",
    [
        "particles-dopri5",
        "particles-split",
        "particles-noise",
        "particles-gaps",
        "lagrangian",
        "density",
        "jko",
    ],
)
def test_resume_repeats_the_uninterrupted_run(kind, tmp_path):
    """Interrupted after the third committed snapshot, wflow.resume finishes bit for bit equal to the
    uninterrupted run (the density from masses = values * areas: to rounding)."""
    run = _runs(tmp_path)[kind]
    full = run([])
    path = tmp_path / "r.zarr"
    with pytest.raises(KeyboardInterrupt):
        run([wflow.io.ZarrRecorder(path), _Stop(3)])
    assert len(wflow.load(path).times) == 3
    back = wflow.resume(path)
    disk = wflow.load(path)
    assert type(back) is type(full) and back.kind == full.kind
    for res in (back, disk):
        np.testing.assert_array_equal(res.times, full.times)
        for name, (_, v) in full.data.items():
            if kind == "density":
                np.testing.assert_allclose(res[name], v, rtol=1e-12, atol=1e-15)
            else:
                np.testing.assert_array_equal(res[name], v, err_msg=name)
        np.testing.assert_array_equal(res.stats["steps"], full.stats["steps"])


@pytest.mark.parametrize("kind", ["particles-dopri5", "lagrangian", "density", "jko"])
def test_every_kind_round_trips_through_save_load_and_dataset(kind, tmp_path):
    res = _runs(tmp_path)[kind]([])
    path = wflow.save(res, tmp_path / "s.zarr")
    back = wflow.load(path)
    assert type(back) is type(res)
    for name, (dims, v) in res.data.items():
        np.testing.assert_array_equal(back[name], v)
    ds = res.to_dataset()
    assert ds.sizes["time"] == len(res.times) and ds.attrs["kind"] == res.kind
    with pytest.raises(FileExistsError):
        wflow.save(res, path)


def test_conservation_and_positivity_of_the_continuum_solvers(tmp_path):
    runs = _runs(tmp_path)
    d = runs["density"]([])
    assert np.abs(d.mass - 1).max() < 1e-13 and d.values.min() >= 0
    j = runs["jko"]([])
    assert np.abs(j.weights.sum(axis=1) - 1).max() < 1e-13 and j.weights.min() >= 0


def test_recorder_streams_and_keep_false_holds_only_the_last(tmp_path):
    x0 = sphere.uniform(10, 3, np.random.default_rng(0))
    r = wflow.simulate(
        SA(2.0),
        x0,
        1.0,
        dt=0.05,
        backend=BK,
        writer=wflow.io.ZarrRecorder(tmp_path / "t.zarr"),
        keep=False,
    )
    full = wflow.load(tmp_path / "t.zarr")
    assert len(r.times) == 1 and r.times[0] == 1.0 and len(full.times) == 11
    np.testing.assert_array_equal(r.points[0], full.points[-1])


def test_kept_snapshots_equal_the_states_saved_whatever_their_size_and_dtype():
    """Large kept variables go into one preallocated array instead of being stacked at the end; the
    result must hold exactly what each save saw, and a variable whose dtype or shape changes between
    saves (here from the fourth save on) must be stacked as before, with nothing cast."""

    class Growth(Problem):  # y' = y, with a large variable that turns float32 at t > 0.25
        kind = "ode"

        def rhs(self, t, y):
            return y

        def snapshot(self, t, y):
            big = np.full((4, 8192), t, np.float64 if t <= 0.25 else np.float32)
            return {"state": (("i",), np.array(y, copy=True)), "big": (("a", "b"), big)}

    y0 = np.arange(1.0, 10001.0)  # 80 kB: buffered
    res = integrate(Growth(), "rk4", y0, 0.0, 0.5, save_at=np.linspace(0, 0.5, 6), dt=0.01)
    t = res.times
    np.testing.assert_allclose(res.data["state"][1], np.exp(t)[:, None] * y0, rtol=1e-9)
    big = res.data["big"][1]
    assert big.shape == (6, 4, 8192) and big.dtype == np.float64
    np.testing.assert_array_equal(big[:, 0, 0], [np.float32(x) if x > 0.25 else x for x in t])
    state = res.data["state"][1]
    del res  # the kept rows outlive the result that made them
    np.testing.assert_allclose(state[-1], np.exp(0.5) * y0, rtol=1e-9)


def test_kept_saves_beyond_the_machine_say_what_to_pass_instead():
    """Keeping every save of a variable too large for memory fails at the first save, before any
    step, with a MemoryError that names the variable, the size and the way out (SaveAt(points=False)
    with a recorder) -- not numpy's bare "Unable to allocate".  The variable is a broadcast view of 8 GB (no
    memory of its own); 10^5 saves of it exceed any machine's address space."""

    class Huge(Problem):
        kind = "ode"

        def rhs(self, t, y):
            return -y

        def snapshot(self, t, y):
            return {"field": (("i",), np.broadcast_to(t, (10**9,)))}

    with pytest.raises(MemoryError, match=r"keeping 100000 saves of 'field' .* points=False"):
        integrate(Huge(), "rk4", np.ones(3), 0.0, 1.0, save_at=np.linspace(0, 1, 10**5), dt=1e-6)


def test_failures_set_status_or_raise():
    class Bad(wflow.models.Model):
        def velocity(self, x, mu, *, backend="auto"):
            return np.full(np.shape(x), np.nan)

        def gradient_obstruction(self):
            return "not a gradient flow"

        def to_dict(self):
            return {"type": "Bad"}

    x0 = sphere.uniform(5, 3, np.random.default_rng(0))
    r = wflow.simulate(Bad(), x0, 1.0, dt=0.1, throw=False)
    assert r.status == -1 and not r.success and "non-finite" in r.message and len(r.times) == 1
    with pytest.raises(SolverError, match="non-finite"):
        wflow.simulate(Bad(), x0, 1.0, dt=0.1)
    r = wflow.simulate(SA(2.0), x0, 1.0, dt=0.01, max_steps=20, throw=False, backend=BK)
    assert r.status == -1 and "max_steps=20" in r.message


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        (dict(method="rk5"), ValueError, "solver/method must be one of"),
        (dict(method="dopri5", rtol=0.0), ValueError, "rtol"),
        (dict(method="dopri5", atol=float("nan")), ValueError, "atol"),
        (dict(method="dopri5", rtol=1e-300), ValueError, "rtol"),
        (dict(dt=1e-300), ValueError, "dt"),
        (dict(save_at=[0, 0.5, 2.0]), ValueError, "save_at"),
        (dict(dt=0.1, save_at=[0, 0.6, 0.5, 1.0]), ValueError, "save_at"),  # not increasing
    ],
)
def test_bad_input_is_named_before_anything_runs(kwargs, exc, match, tmp_path):
    x0 = sphere.uniform(5, 3, np.random.default_rng(0))
    path = tmp_path / "never.zarr"
    with pytest.raises(exc, match=match):
        wflow.simulate(SA(1.0), x0, 1.0, writer=wflow.io.ZarrRecorder(path), **kwargs)
    assert not path.exists()


def test_a_study_without_expectations_fails():
    from wflow.studies import StudyReport

    rep = StudyReport("empty")
    assert not rep.passed
    rep.expect("x", 1.0, 0.0, 2.0)
    assert rep.passed


def test_the_worked_example_of_the_docs_runs(capsys):
    """docs/solvers.md: the ~30-line solver added through the contract runs the finite-volume problem,
    conserving mass and positivity with error control."""
    import pathlib

    text = (pathlib.Path(__file__).parents[1] / "docs" / "solvers.md").read_text()
    blocks = [
        b
        for b in re.findall(r"```python\n(.*?)```", text, flags=re.S)
        if not b.lstrip().startswith(">>>")
    ]
    assert len(blocks) == 2
    scope: dict = {}
    try:
        for b in blocks:
            exec(compile(b, "docs/solvers.md", "exec"), scope)
        out = capsys.readouterr().out.split()
        assert (
            out[0] == "euler-richardson"
            and int(out[1]) > 10
            and float(out[2]) < 1e-13
            and out[3] == "True"
        )
        # the same density as the third-order default (to the first-order method's accuracy at rtol = 1e-3)
        r = scope["r"]
        ref = wflow.solve_density(SA(2.0), scope["rho0"], 1.0, rtol=1e-5)
        assert np.abs(r.values[-1] - ref.values[-1]).max() < 2e-3 * np.abs(ref.values[-1]).max()
    finally:
        SOLVERS.pop("euler-richardson", None)


def test_ros2_takes_long_steps_through_a_stiff_collapse():
    """USA (rescaled kernel) at beta = 500 on S^1: two tokens merge at t ~ 1 and then collapse at rate ~beta
    while the next merge is ~1e5 away.  The L-stable Rosenbrock solver reaches t = 1e6 (the second merge)
    in a few thousand steps; dopri5 is held to steps ~1/beta (stiffness) and spends 20x more."""
    beta = 500.0
    th = 0.5 * np.array([0, 0.5, 2, 4, 7]) * np.log(beta) / np.sqrt(beta)
    x0 = np.stack([np.cos(th), np.sin(th)], -1)
    model = USA(beta, kernel="rescaled")
    saves = np.concatenate([[0.0], np.logspace(-2, 6, 9)])
    r = wflow.simulate(
        model,
        x0,
        1e6,
        save_at=saves,
        method="ros2",
        rtol=1e-6,
        atol=1e-9,
        backend=BK,
        diagnostics=("energy",),
    )
    ang = np.sort(np.arctan2(r.points[-1, :, 1], r.points[-1, :, 0]))
    assert np.ptp(ang[:3]) < 1e-6 and np.all(np.diff(ang[2:]) > 0.2)  # three merged, two apart
    assert np.all(np.diff(r.energy) >= -1e-12 * r.energy.max()) and r.stats["steps"][-1] < 8000
    d = wflow.simulate(
        model,
        x0,
        1e6,
        save_at=saves,
        method="dopri5",
        rtol=1e-6,
        atol=1e-9,
        backend=BK,
        diagnostics=(),
        max_steps=8000,
        throw=False,
    )
    assert d.status == -1 and "max_steps" in d.message
