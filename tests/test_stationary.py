"""Stationary states you can trust (wflow.solvers.jko.stationary_states): atoms read off the mass
(no merging of separated groups), polishing that never leaves the mass or raises the residual,
``converged`` only at a critical point, and the same atoms from particles, the Eulerian solver
and JKO.

The reproduced case of the bug report: repulsive attention ("descent") USA(1, V=-I) plus a
conservative perceptron of d = 2 units sampled as in the perceptron paper (a_j uniform on S^1,
omega_j ~ N(0, 1), b = 0), rng = numpy.random.default_rng(13) (atoms) and 29 (a measure still
concentrating), uniform initial density on CircleMesh(256)."""

import numpy as np
import pytest

import wflow
from wflow.density import Density
from wflow.mesh import CircleMesh
from wflow.models import USA, Perceptron
from wflow.solvers.jko import cluster_atoms, stationary
from wflow.solvers.jko.stationary_states import atom_groups
from wflow.studies.stationary import reference_model  # the configurations, code convention

BK = "numpy"


def angles(a):
    return np.mod(np.arctan2(a[:, 1], a[:, 0]), 2 * np.pi)


def circ(a, b):
    d = np.abs(np.mod(a, 2 * np.pi) - np.mod(b, 2 * np.pi))
    return np.minimum(d, 2 * np.pi - d)


def paper_model(seed, activation, beta=1.0):
    rng = np.random.default_rng(seed)
    A = wflow.sphere.uniform(2, 2, seed=rng)
    omega = rng.standard_normal(2)
    return USA(beta, V=-np.eye(2)) + Perceptron.conservative(A, omega, activation=activation)


@pytest.fixture(scope="module")
def mesh256():
    return CircleMesh(256)


@pytest.fixture(scope="module")
def uniform256(mesh256):
    return Density.from_function(mesh256, lambda x: np.ones(len(x)))


def test_groups_joined_by_a_bridge_are_not_merged():
    # the reported failure in miniature: two groups (near 0.21 and 1.04 rad) joined by a thin
    # bridge of mass above 1e-3 of the peak were merged into one atom at their barycentre
    # (0.62 rad here) by the single-threshold cluster_atoms of before
    mesh = CircleMesh(256)
    th = mesh.center_angles
    w = 0.6 * np.exp(-(((th - 0.21) / 0.03) ** 2)) + 0.4 * np.exp(-(((th - 1.04) / 0.03) ** 2))
    w[(th > 0.21) & (th < 1.04)] += 3e-3
    w /= w.sum()
    atoms, masses = cluster_atoms(mesh.centers, w, mesh=mesh)
    assert atoms.shape[0] == 2
    assert np.all(circ(np.sort(angles(atoms)), [0.21, 1.04]) < mesh.spacing)
    assert masses.sum() == pytest.approx(1.0)
    assert (
        np.abs(masses - [0.6 + 0.5 * (1 - 0.6 - 0.4) / 1, 0.4]).max() < 0.02
    )  # bridge mass split at the middle


def test_polishing_never_leaves_the_mass_nor_raises_the_residual(mesh256, uniform256):
    # ReLU descent, beta = 1, seed 13: the old polish moved the atoms (0.75 -> 0.004 rad, ...)
    # away from the mass, raised the residual from 0.0036 to 0.675 and still said converged=True
    s = stationary(paper_model(13, "relu"), uniform256, backend=BK)
    h = mesh256.spacing
    th = mesh256.center_angles
    assert s.atoms.shape[0] == 4
    for a in angles(s.atoms):  # every atom sits on its mass: the weight within 2h of it is large
        near = circ(th, a) <= 2 * h
        assert s.weights[near].sum() > 0.1
    assert s.residual <= s.residual_grid + 1e-15
    assert s.atomic
    if not s.polished:
        assert "not applied" in s.message
    assert s.converged == (
        s.stopped and s.residual <= s.residual_tol and s.residual_support <= s.residual_tol
    )
    assert s.converged and s.residual <= s.residual_tol
    assert np.abs(np.sort(s.masses) - np.sort([0.5, 0.18, 0.165, 0.155])).max() < 0.01


def test_unfinished_gelu_descent_says_so(uniform256):
    # stopped at 80 steps the measure is still concentrating: the old code reported one atom of
    # mass 1 at argmax v (the ascent answer, after polishing a single Dirac)
    # 80 steps in the model's time (time_unit=1.0, the old default): still concentrating
    s = stationary(paper_model(13, "gelu"), uniform256, max_steps=80, time_unit=1.0, backend=BK)
    assert not s.converged and "NOT converged" in s.message and "max_steps" in s.message
    assert s.atoms.shape[0] >= 4 and s.masses.max() < 0.6
    assert not s.polished


def test_converged_means_critical(uniform256):
    for act in ("relu", "gelu"):
        s = stationary(paper_model(29, act), uniform256, max_steps=60, backend=BK)
        if s.converged:
            assert s.residual_support <= s.residual_tol
            if s.atomic:
                assert s.residual <= s.residual_tol
        else:
            assert "NOT converged" in s.message


def test_atom_groups_bad_input():
    x = np.eye(2)
    with pytest.raises(ValueError, match="weights"):
        atom_groups(x, np.array([-1.0, 1.0]))
    with pytest.raises(ValueError, match="shape"):
        atom_groups(x, np.ones(3))
    with pytest.raises(ValueError, match="threshold"):
        atom_groups(x, np.ones(2), threshold=0.9, top=0.5)
    with pytest.raises(ValueError, match="neighbors"):
        atom_groups(x, np.ones(2), neighbors=np.ones((3, 2), dtype=int))


# --------------------------------------------------------------------------- three ways
def _match(ref_atoms, ref_masses, atoms, masses, h, min_mass=0.05):
    """Largest location and mass differences of the reference atoms (mass >= min_mass) to their nearest found atom."""
    dl, dm = 0.0, 0.0
    for a, m in zip(angles(ref_atoms), ref_masses):
        if m < min_mass:
            continue
        d = circ(angles(atoms), a)
        j = int(np.argmin(d))
        dl, dm = max(dl, float(d[j])), max(dm, abs(float(masses[j]) - m))
    return dl, dm


def test_three_ways_agree():
    # ReLU descent: JKO/stationary, a long particle run and the Eulerian solver give the same atoms
    # within one mesh spacing in location and 1e-2 in mass (small sizes, about 5 s).  The GELU case,
    # whose heavy group is two atoms 17 cells apart, needs 256 cells: wflow validate stationary.
    n, N = 128, 256
    mesh = CircleMesh(n)
    h = mesh.spacing
    model = paper_model(13, "relu")
    rho0 = Density.from_function(mesh, lambda x: np.ones(len(x)))
    s = stationary(model, rho0, max_steps=1000, backend=BK)
    assert s.converged and s.atomic, s.message
    th = 2 * np.pi * (np.arange(N) + 0.5) / N
    x0 = np.stack([np.cos(th), np.sin(th)], axis=1)
    traj = wflow.simulate(
        model,
        wflow.Atoms(x0),
        150.0,
        save_at=wflow.SaveAt([0.0, 150.0], diagnostics=()),
        method="euler",
        dt=0.1,
    )
    gp = atom_groups(traj.points[-1], np.full(N, 1.0 / N), radius=2 * h)
    dens = wflow.solve_density(model, rho0, 60.0, save_at=[0.0, 60.0])
    ge = atom_groups(mesh.centers, dens.density(-1).masses(), neighbors=mesh.cell_neighbors)
    for g in (gp, ge):
        dl, dm = _match(s.atoms, s.masses, g.atoms, g.masses, h)
        assert dl <= h and dm <= 1e-2, (dl, dm)


# The GELU descent of the same draw (five atoms, two of them 17 cells apart) needs 256 cells and
# long runs (about 6-13 s): it is the three-way check of `wflow validate stationary`
# (wflow.studies.stationary.three_ways_gelu), run in quick mode too.


# --------------------------------------------------------------------------- issue 35: right by default
def particle_atoms(model, beta, n=256, s_end=1500.0):
    """Atoms of n particles from the uniform grid run to paper time s_end (wflow time e^-beta s_end),
    merged and polished by wflow.stability (strictly stable ones only)."""
    th = 2 * np.pi * (np.arange(n) + 0.5) / n
    t = np.exp(-beta) * s_end
    x = wflow.simulate(
        model,
        wflow.Atoms(np.stack([np.cos(th), np.sin(th)], axis=1)),
        t,
        method="dopri5",
        save_at=wflow.SaveAt([0.0, t], diagnostics=()),
        backend=BK,
    ).points[-1]
    st = wflow.stability.stability(model, wflow.Atoms(x))
    assert st.strictly_stable, st.message
    return st.hessian.points, st.hessian.masses


@pytest.mark.parametrize(
    "beta, sign, act, s_end",
    # paper times at which the particles have settled (same atoms as at 1500 to 1e-7 rad); ReLU
    # ascent leaves a saddle only after paper time 300
    [(5.0, 1, "gelu", 300.0), (5.0, 1, "relu", 1500.0), (25.0, -1, "gelu", 300.0)],
)
def test_default_call_agrees_with_particles(beta, sign, act, s_end, mesh256, uniform256):
    # issue 35: with tau in model time the default call jumped to the global maximiser at beta = 5
    # (one atom of mass 1, converged=True; particles: two atoms) and left one atom at beta = 25 GELU
    # descent (particles: three).  Now tau is in the model's time unit T = e^-beta / (1 + ...):
    # every atom within two spacings and 0.02 in mass of the particles', and a stable verdict.
    # ReLU ascent stops first on a critical point that is not stable and is perturbed off it.
    model = reference_model(beta, sign, act)
    s = stationary(model, uniform256, backend=BK)
    assert s.converged and s.resolved and s.test == "atoms", s.message
    assert s.stability is not None and s.stability.stable
    pa, pm = particle_atoms(model, beta, s_end=s_end)
    assert s.atoms.shape[0] == pa.shape[0], (s.masses, pm)
    d = np.arccos(np.clip(s.atoms @ pa.T, -1, 1))
    j = np.argmin(d, axis=1)
    assert len(set(j.tolist())) == len(j)
    assert d[np.arange(len(j)), j].max() <= 2 * mesh256.spacing
    assert np.abs(s.masses - pm[j]).max() <= 0.02
    assert s.masses.sum() + s.residual_mass == pytest.approx(1.0)
    if (beta, act, sign) == (5.0, "relu", 1):
        assert s.perturbations and "critical but unstable" in s.message


def test_self_interaction_is_not_in_the_tolerance(mesh256):
    # issue 35: the tolerance h max|Hess dF/dmu| held each atom's own term (-0.543 e^5 at beta = 5),
    # so states that were not critical points passed.  Now it is h max_i sum_j |H_ij| / m_i from the
    # Wasserstein Hessian, which leaves the self term out: for one Dirac of attention alone (the
    # self term is all there is) it is the floor 1e-9 h / T, where the old one was h e^beta.
    rho0 = Density.from_function(mesh256, lambda x: np.exp(20 * (x[:, 0] - 1)))
    s = stationary(USA(5.0), rho0, backend=BK)
    h = mesh256.spacing
    assert s.converged and s.atoms.shape[0] == 1 and s.test == "atoms"
    assert s.residual_tol == pytest.approx(1e-9 * h / s.time_unit, rel=1e-12)
    assert s.hessian[0, 0] == pytest.approx(-np.exp(5.0), rel=1e-3)  # the old tolerance's h |Hess|
    # two atoms: the tolerance is the Hessian's row sums, recomputed here from wasserstein_hessian
    model = reference_model(5.0, 1, "gelu")
    s = stationary(model, Density.from_function(mesh256, lambda x: np.ones(len(x))), backend=BK)
    H = wflow.stability.wasserstein_hessian(model, wflow.Atoms(s.atoms, s.masses))
    rows = np.abs(H.form).sum(axis=1) / H.masses
    assert s.residual_tol == pytest.approx(h * rows.max(), rel=1e-9)
    assert s.residual <= s.residual_tol and "test: atoms" in s.message


@pytest.mark.parametrize("n", [4, 16])
def test_coarse_mesh_is_not_resolved(n):
    # issue 35: CircleMesh(3), (4) and (16) returned converged=True at beta = 25 although the
    # clusters' width 1/sqrt(beta) = 0.2 is below the spacing
    rho0 = Density.from_function(CircleMesh(n), lambda x: np.ones(len(x)))
    s = stationary(reference_model(25.0, -1, "gelu"), rho0, backend=BK)
    assert not s.resolved and not s.converged
    assert "resolved=False" in s.message and "1/sqrt(beta)" in s.message


def test_residual_mass_is_not_an_atom(uniform256):
    # beta = 1 GELU descent: 0.003 of the mass still drains from a point between atoms; it used to
    # be reported as a fourth atom
    s = stationary(reference_model(1.0, -1, "gelu"), uniform256, backend=BK)
    assert s.converged and s.atoms.shape[0] == 3
    assert 0 < s.residual_mass <= 0.01 and "residual_mass" in s.message
    assert s.masses.sum() + s.residual_mass == pytest.approx(1.0, abs=1e-12)


def test_stationary_bad_input(uniform256):
    sphere = Density.from_function(wflow.SphereMesh(1), lambda x: np.ones(len(x)))
    with pytest.raises(ValueError, match="^rho0: .*d=2.*d=3"):
        stationary(reference_model(1.0, 1, "gelu"), sphere)
    with pytest.raises(ValueError, match="time_unit"):
        stationary(USA(1.0), uniform256, time_unit=-1.0)
    with pytest.raises(ValueError, match="max_restarts"):
        stationary(USA(1.0), uniform256, max_restarts=-1)
    with pytest.raises(ValueError, match="t_max must be a finite number > 0, got 0"):
        stationary(USA(1.0), uniform256, t_max=0)
    with pytest.raises(ValueError, match="max_steps must be an integer >= 1, got 0"):
        stationary(USA(1.0), uniform256, max_steps=0)


def test_kernel_convention_does_not_change_the_answer(uniform256):
    # the rescaled kernel e^{beta(<x,y>-1)} is a time change of the plain one (t' = e^beta t, the
    # perceptron's weights divided by e^beta): in each model's own time unit the default call takes
    # the same steps and finds the same atoms
    from wflow.studies.perceptron import paper_perceptron

    A, omega = paper_perceptron(2, 1.0, seed=1)
    plain = reference_model(25.0, 1, "gelu")
    rescaled = USA(25.0, kernel="rescaled") + Perceptron.conservative(A, omega, activation="gelu")
    a, b = stationary(plain, uniform256, backend=BK), stationary(rescaled, uniform256, backend=BK)
    assert b.time_unit == pytest.approx(np.exp(25.0) * a.time_unit, rel=1e-12)
    assert a.converged and b.converged and a.steps == b.steps
    assert np.abs(a.atoms - b.atoms).max() < 1e-10 and np.abs(a.masses - b.masses).max() < 1e-10


def test_atoms_too_close_for_the_mesh_are_not_resolved():
    # beta = 50 GELU descent: two of the three atoms are 0.14 rad apart; 256 cells blur them into one
    # group (spread 0.086 > three spacings): resolved=False, not converged.  512 cells separate them
    # (masses 0.435 / 0.325 / 0.240; particles 0.434 / 0.320 / 0.246).
    model = reference_model(50.0, -1, "gelu")
    rho0 = Density.from_function(CircleMesh(256), lambda x: np.ones(len(x)))
    s = stationary(model, rho0, backend=BK)
    assert not s.resolved and not s.converged and "not resolved into atoms" in s.message
    fine = stationary(model, Density.from_function(CircleMesh(512), lambda x: np.ones(len(x))))
    assert fine.resolved and fine.converged and fine.atoms.shape[0] == 3
    assert np.abs(np.sort(fine.masses) - np.sort([0.434, 0.320, 0.246])).max() < 0.02


def test_default_call_agrees_with_particles_on_s2():
    # issue 35, S^2: GELU ascent at beta = 5 in the code's convention (A, omega =
    # paper_perceptron(3, 1, seed=3)), uniform on SphereMesh(6) (362 cells, spacing 0.19 rad).
    # One particle per cell (the cells' masses) settles by paper time 100 into two strictly stable
    # atoms 0.497 / 0.503; the default call: 0.509 / 0.491, the same atoms to 1e-4 rad.  With steps
    # in model time (time_unit=1.0, the old default) it jumps to one atom of mass 1.
    mesh = wflow.SphereMesh(6)
    model = reference_model(5.0, 1, "gelu", d=3)
    s = stationary(model, Density.from_function(mesh, lambda x: np.ones(len(x))), backend=BK)
    assert s.converged and s.resolved and s.test == "atoms", s.message
    assert s.stability is not None and s.stability.strictly_stable
    h = float(np.sqrt(np.mean(mesh.areas)))
    t = np.exp(-5.0) * 100.0
    w0 = mesh.areas / mesh.areas.sum()
    x = wflow.simulate(
        model,
        wflow.Atoms(mesh.centers, w0),
        t,
        method="dopri5",
        save_at=wflow.SaveAt([0.0, t], diagnostics=()),
    ).points[-1]
    st = wflow.stability.stability(model, wflow.Atoms(x, w0))
    assert st.strictly_stable, st.message
    pa, pm = st.hessian.points, st.hessian.masses
    assert s.atoms.shape[0] == pa.shape[0] == 2, (s.masses, pm)
    d = np.arccos(np.clip(s.atoms @ pa.T, -1, 1))
    j = np.argmin(d, axis=1)
    assert len(set(j.tolist())) == 2
    assert d[np.arange(2), j].max() <= 2 * h
    assert np.abs(s.masses - pm[j]).max() <= 0.02


# --------------------------------------------------------------------------- issue 51: a budget in time
def test_default_budget_is_model_time_and_reaches_the_particles_atoms(mesh256, uniform256):
    # issue 51: the default budget is model time, pi / (e 0.01 h) T (4709 T on 256 cells), the
    # longest a linear mode needs to slow below the support test's speed 0.01 h / T.  S^1, beta = 1,
    # ReLU descent (code convention): 3 strictly stable atoms, 0.16 spacings and 0.0033 in mass
    # from the particles' (0.387 / 0.316 / 0.297)
    model = reference_model(1.0, -1, "relu")
    s = stationary(model, uniform256, backend=BK)
    h = mesh256.spacing
    assert s.t_max == pytest.approx(100 * np.pi / (np.e * h), rel=1e-12)
    assert s.converged and s.stopped and s.test == "atoms", s.message
    assert s.stability is not None and s.stability.strictly_stable
    assert s.t == pytest.approx(sum(s.history["tau"]), rel=1e-12) and s.t < s.t_max * s.time_unit
    pa, pm = particle_atoms(model, 1.0, s_end=200.0)  # the atoms of paper time 1500 to 1e-6 rad
    assert s.atoms.shape[0] == pa.shape[0] == 3, (s.masses, pm)
    d = np.arccos(np.clip(s.atoms @ pa.T, -1, 1))
    j = np.argmin(d, axis=1)
    assert len(set(j.tolist())) == 3
    assert d[np.arange(3), j].max() <= 0.5 * h
    assert np.abs(s.masses - pm[j]).max() <= 0.01


def test_slow_tails_are_waited_for_by_default():
    # ReLU descent, poster convention, seed 29, CircleMesh(160): five atoms, the slowest eigenvalue
    # -0.037; the tails drain for more than 1000 T, where the step count of before (1000 steps of
    # at most 1 T) stopped it NOT converged.  The same masses on 128, 192 and 256 cells.
    rho0 = Density.from_function(CircleMesh(160), lambda x: np.ones(len(x)))
    s = stationary(paper_model(29, "relu"), rho0, backend=BK)
    assert s.converged and s.stability is not None and s.stability.strictly_stable, s.message
    assert 1000 < s.t / s.time_unit < s.t_max
    assert np.abs(s.masses - [0.248, 0.244, 0.194, 0.189, 0.122]).max() < 0.005, s.masses


def test_a_spent_time_budget_says_not_converged_and_why(uniform256):
    # the configuration of the first test with a budget of 50 T (it needs 72 T): still moving
    s = stationary(reference_model(1.0, -1, "relu"), uniform256, t_max=50.0, backend=BK)
    assert not s.converged and not s.stopped
    assert 50.0 <= s.t / s.time_unit < 51.0  # the last step (tau_max = 1 T) crosses the budget
    assert s.message.startswith("NOT converged") and "budget spent at t=" in s.message
    assert "of t_max=50 T" in s.message and "still moving: last change" in s.message
    assert "residual_tol" in s.message, s.message  # the residual of the test, against its tolerance
