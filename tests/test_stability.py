"""wflow.stability: the Wasserstein Hessian against finite differences of model.energy,
stability verdicts on configurations whose answer is known in closed form, the paper's
witnesses (our reading, docs/stability.md), and sup F against brute force."""

import numpy as np
import pytest
import scipy.linalg
import scipy.optimize

import wflow
from wflow.errors import NotAGradientFlowError
from wflow.sphere import angles_to_points, exp_map, normalize, uniform
from wflow.stability import (
    circle_condition,
    circle_threshold,
    energy_supremum,
    is_stable,
    potential_maximum,
    stability,
    wasserstein_hessian,
)

ACTS = ("relu", "gelu", "tanh", "identity")
NP = "numpy"  # the auto backend may compile kernels on first use (seconds)


def _tangent(rng, x):
    xi = rng.standard_normal(x.shape)
    return xi - np.sum(xi * x, -1, keepdims=True) * x


def _fd2(model, points, weights, xi, h=2e-3):
    """d^2/dt^2 F(exp(t xi)) at 0: central differences, Richardson-extrapolated (error O(h^4))."""
    F = lambda t: float(
        model.energy(wflow.Atoms._trusted(exp_map(points, t * xi), weights), backend=NP)
    )  # noqa: E731
    F0 = F(0.0)
    D = lambda s: (F(s) - 2 * F0 + F(-s)) / s**2  # noqa: E731
    return (4 * D(h / 2) - D(h)) / 3


def _models(d, rng, x):
    A = rng.standard_normal((3, d))
    omega = rng.standard_normal(3)
    b = 0.3 * rng.standard_normal(3)
    an = np.linalg.norm(A, axis=1)
    while np.any(
        near := np.min(np.abs(x @ A.T + b), axis=0) < 0.05 * an
    ):  # ReLU kinks away from the atoms
        b = b + 0.1 * an * near
    out = [
        wflow.USA(1.3),
        wflow.USA(2.0, V=-np.eye(d)),
        wflow.USA(0.0, V=-np.eye(d)),
        wflow.SA(1.5),
    ]
    out += [wflow.Perceptron.conservative(A, omega, b, "gelu")]
    out += [
        wflow.USA(0.7, V=(-1) ** i * np.eye(d)) + wflow.Perceptron.conservative(A, omega, b, act)
        for i, act in enumerate(ACTS)
    ]
    return out


# --------------------------------------------------------------------------- Hessian vs finite differences
@pytest.mark.parametrize("d", [2, 3, 5])
def test_hessian_matches_finite_differences(d, rng):
    k = 4
    x = uniform(k, d, seed=d)
    m = rng.random(k) + 0.2
    m /= m.sum()
    for model in _models(d, rng, x):
        H = wasserstein_hessian(model, wflow.Atoms(x, m))
        for _ in range(3):
            xi = _tangent(rng, x)
            xi /= np.linalg.norm(xi, axis=1, keepdims=True)
            for (
                p
            ) in model.parts:  # keep the finite differences off the ReLU kinks (|step| <= 2e-3 |a|)
                if isinstance(p, wflow.Perceptron) and p.activation == "relu":
                    margin = np.abs(x @ p.A.T + p.b) / np.linalg.norm(p.A, axis=1)
                    assert margin.min() > 5e-3, margin.min()
            exact = H.quadratic_form(xi)
            fd = _fd2(model, x, m, xi)
            assert abs(exact - fd) <= 1e-7 * max(1.0, abs(fd)), (model, exact, fd)


def test_hessian_every_entry_by_polarization(rng):
    """All entries of the form (d = 3, two atoms, attention + ReLU) by polarization of finite differences."""
    d, k = 3, 2
    x = uniform(k, d, seed=7)
    m = np.array([0.3, 0.7])
    A = rng.standard_normal((4, d))
    model = wflow.USA(1.1, V=-np.eye(d)) + wflow.Perceptron.conservative(
        A, rng.standard_normal(4), 0.2 * np.ones(4)
    )
    H = wasserstein_hessian(model, wflow.Atoms(x, m))
    K = k * (d - 1)
    fd = np.zeros((K, K))
    for p in range(K):
        for q in range(p, K):
            e_p, e_q = np.eye(K)[p], np.eye(K)[q]
            plus = _fd2(model, x, m, H.field(e_p + e_q))
            minus = _fd2(model, x, m, H.field(e_p - e_q))
            fd[p, q] = fd[q, p] = (plus - minus) / 4
    assert np.max(np.abs(fd - H.form)) <= 1e-7 * max(1.0, np.abs(H.form).max())
    assert np.allclose(H.form, H.form.T, rtol=0, atol=1e-14)


@pytest.mark.parametrize("d", [2, 3])
def test_gradient_is_the_velocity(d, rng):
    """The Wasserstein gradient at the atoms is USA's velocity, and SA's velocity times Z_mu."""
    x = uniform(5, d, seed=3)
    mu = wflow.Atoms(x, rng.random(5) + 0.1)
    A = rng.standard_normal((3, d))
    model = wflow.USA(1.7, V=-np.eye(d)) + wflow.Perceptron.conservative(
        A, rng.standard_normal(3), None, "tanh"
    )
    H = wasserstein_hessian(model, mu)
    assert np.allclose(H.gradient, model.velocity(x, mu, backend=NP), rtol=0, atol=1e-13)
    sa = wflow.SA(2.0)
    Hs = wasserstein_hessian(sa, mu)
    Z = sa.normalizer(x, mu, backend=NP)
    assert np.allclose(Hs.gradient / Z[:, None], sa.velocity(x, mu, backend=NP), rtol=0, atol=1e-13)
    # SA's operator is the form in the metric sum_i m_i Z_i |xi_i|^2: generalized eigenvalues
    w = np.repeat(mu.weights * Z, d - 1)
    assert np.allclose(
        Hs.eigenvalues, scipy.linalg.eigh(Hs.form, np.diag(w), eigvals_only=True), atol=1e-12
    )
    assert np.allclose(Hs.metric_weights, mu.weights * Z)


def test_splitting_blocks_match_finite_differences(rng):
    """Tearing atom i into pieces q, 1-q moving along xi_i + delta_1, xi_i + delta_2 (q delta_1 + (1-q) delta_2 = 0)
    adds m_i (q delta_1^T S delta_1 + (1-q) delta_2^T S delta_2) to H(xi, xi)."""
    d, k = 3, 3
    x = uniform(k, d, seed=11)
    m = np.array([0.5, 0.3, 0.2])
    A = rng.standard_normal((3, d))
    for V in (np.eye(d), -np.eye(d)):
        model = wflow.USA(1.4, V=V) + wflow.Perceptron.conservative(
            A, rng.standard_normal(3), None, "gelu"
        )
        H = wasserstein_hessian(model, wflow.Atoms(x, m))
        xi = _tangent(rng, x)
        for i, q in ((0, 0.5), (1, 0.25)):
            delta1 = _tangent(rng, x[i : i + 1])[0]
            delta2 = -q / (1 - q) * delta1
            pts = np.concatenate([x, x[i : i + 1]])
            w = np.concatenate([m, [m[i] * (1 - q)]])
            w[i] = m[i] * q
            field = np.concatenate([xi, xi[i : i + 1] + delta2])
            field[i] = xi[i] + delta1
            fd = _fd2(model, pts, w, field)
            c1 = H.basis[i] @ delta1
            c2 = H.basis[i] @ delta2
            S = H.splitting[i]
            exact = H.quadratic_form(xi) + m[i] * (q * c1 @ S @ c1 + (1 - q) * c2 @ S @ c2)
            assert abs(exact - fd) <= 1e-7 * max(1.0, abs(fd)), (V[0, 0], i, exact, fd)


def test_circle_form_is_a_graph_laplacian(rng):
    """On S^1 the general Hessian equals sum c_ij (xi_i - xi_j)^2 + sum u_i xi_i^2 of circle_condition."""
    x = angles_to_points(rng.uniform(0, 2 * np.pi, 5))
    mu = wflow.Atoms(x, rng.random(5) + 0.1)
    A = rng.standard_normal((3, 2))
    for act in ACTS:
        model = (
            wflow.USA(2.5, V=-np.eye(2))
            + wflow.USA(0.5)
            + wflow.Perceptron.conservative(A, rng.standard_normal(3), 0.1 * np.ones(3), act)
        )
        H = wasserstein_hessian(model, mu)
        cc = circle_condition(model, mu)
        c, u = cc.pair_weights, cc.curvatures
        lap = np.diag(c.sum(1)) - c
        assert np.allclose(H.form, lap + np.diag(u), rtol=0, atol=1e-12 * np.abs(H.form).max())


def test_circle_threshold():
    for beta in (0.01, 1.0, 10.0, 400.0):
        t = circle_threshold(beta)
        assert abs(beta * np.sin(t) ** 2 - np.cos(t)) < 1e-14
    assert abs(circle_threshold(1e6) * 1e3 - 1.0) < 1e-6  # ~ beta^{-1/2}
    assert circle_threshold(0.0) == pytest.approx(np.pi / 2)


# --------------------------------------------------------------------------- known verdicts
@pytest.mark.parametrize("beta", [0.01, 1.0, 10.0])
def test_antipodal_pair_minimizes_repulsive_energy(beta):
    """Descent of E_beta (V = -I): among pairs of half-masses the antipodal pair has the least E_beta
    (brute force over 721 separations); it is critical, strictly stable modulo rotations, with the
    closed-form eigenvalue -e^{-beta} on S^1 and S^2; other pairs are not critical."""
    model = wflow.USA(beta, V=-np.eye(2))
    theta = np.linspace(0, np.pi, 721)[1:]
    E = np.array(
        [-float(model.energy(wflow.Atoms(angles_to_points([0.0, t])), backend=NP)) for t in theta]
    )
    closed = (0.5 * np.exp(beta) + 0.5 * np.exp(beta * np.cos(theta))) / (2 * beta)
    assert np.allclose(E, closed, rtol=1e-13)
    assert np.argmin(E) == len(theta) - 1 and np.all(np.diff(E) < 0)
    pair = wflow.Atoms(angles_to_points([0.3, 0.3 + np.pi]))
    s = stability(model, pair)
    assert s.critical and s.strictly_stable and s.modulo_rotations
    assert np.allclose(s.hessian.eigenvalues, [-np.exp(-beta), 0.0], atol=1e-14)
    for t in theta[::60]:
        assert not is_stable(model, wflow.Atoms(angles_to_points([0.3, 0.3 + t])))
    # S^2: d-1 rotation zero modes, d-1 modes -e^{-beta}
    model3 = wflow.USA(beta, V=-np.eye(3))
    pair3 = wflow.Atoms([[0.0, 0.6, 0.8], [0.0, -0.6, -0.8]])
    s3 = stability(model3, pair3)
    assert s3.strictly_stable
    assert np.allclose(s3.hessian.eigenvalues, [-np.exp(-beta)] * 2 + [0.0] * 2, atol=1e-14)
    assert np.allclose(s3.eigenvalues, [-np.exp(-beta)] * 2, atol=1e-14)
    # no absolute floor in the tolerances: at beta = 30 the eigenvalue -e^{-30} = -9e-14 still counts
    far = stability(wflow.USA(30.0, V=-np.eye(2)), pair)
    assert far.strictly_stable and far.max_eigenvalue == pytest.approx(-np.exp(-30.0), rel=1e-12)
    # tearing a half-mass atom apart lowers E_beta: unstable for plans, S_i/m_i = (e^b - e^-b)/2
    sp = stability(model, pair, splitting=True)
    assert not sp.stable and sp.splitting_max == pytest.approx(np.sinh(beta), rel=1e-13)


def test_equilateral_circle_configuration():
    """n equally spaced equal atoms, repulsive: operator eigenvalues are the Laplacian's of the circulant
    pair weights, times -n; the rotation is the only zero mode."""
    n, beta = 5, 3.0
    model = wflow.USA(beta, V=-np.eye(2))
    th = 2 * np.pi * np.arange(n) / n
    mu = wflow.Atoms(angles_to_points(th))
    H = wasserstein_hessian(model, mu)
    delta = th[:, None] - th[None, :]
    c = -np.exp(beta * np.cos(delta)) * (beta * np.sin(delta) ** 2 - np.cos(delta)) / n**2
    np.fill_diagonal(c, 0)
    lap = np.diag(c.sum(1)) - c
    assert np.allclose(H.eigenvalues, np.sort(np.linalg.eigvalsh(lap) * n), atol=1e-13)
    cc = circle_condition(model, mu)
    # adjacent pairs (2 pi / 5 = 1.257 > threshold 0.55) are good, so the graph is connected
    assert cc.holds and cc.strict and stability(model, mu).strictly_stable


def test_attractive_cluster_is_not_repulsive_stable():
    """Attraction: one Dirac of pure attention is stable (zero Hessian: every Dirac is a maximizer),
    two nearby atoms are not critical, two antipodal atoms are unstable."""
    for d in (2, 3):
        model = wflow.USA(2.0)
        dirac = wflow.Atoms(np.eye(d)[:1])
        s = stability(model, dirac, splitting=True)
        # every tangent direction is a rotation: strict modulo rotations holds vacuously, not without the quotient
        assert (
            s.stable
            and s.strictly_stable
            and s.eigenvalues.size == 0
            and np.all(s.hessian.form == 0)
        )
        assert not stability(model, dirac, modulo_rotations=False).strictly_stable
        assert s.splitting_max == pytest.approx(-np.exp(2.0), rel=1e-14)  # pieces attract
        anti = wflow.Atoms(np.stack([np.eye(d)[0], -np.eye(d)[0]]))
        sa = stability(model, anti)
        assert sa.critical and not sa.stable
        assert sa.max_eigenvalue == pytest.approx(np.exp(-2.0), rel=1e-13)


def test_pinned_dirac_with_zero_field():
    """A Dirac where every ReLU unit is off: zero field, zero Hessian; stable not strict under maps;
    under plans stable for attraction (pieces attract, -e^beta) and unstable for repulsion (+e^beta)."""
    beta = 1.5
    A = np.array([[1.0, 0.0, 0.0], [0.6, 0.8, 0.0]])
    p = wflow.Perceptron.conservative(A, [2.0, -1.0], [-0.5, -0.2])
    x = np.array([[-1.0, 0.0, 0.0]])  # a.x + b < 0 for both units
    for sign in (1, -1):
        model = wflow.USA(beta, V=sign * np.eye(3)) + p
        mu = wflow.Atoms(x)
        assert np.all(model.velocity(x, mu, backend=NP) == 0)
        s = stability(model, mu)
        assert s.critical and s.velocity == 0 and s.stable and not s.strictly_stable
        assert np.all(s.hessian.form == 0)
        assert float(model.energy(mu, backend=NP)) == pytest.approx(
            sign * np.exp(beta) / (2 * beta), rel=1e-15
        )
        sp = stability(model, mu, splitting=True)
        assert sp.splitting_max == pytest.approx(-sign * np.exp(beta), rel=1e-14)
        assert sp.stable == (sign == 1)


def _constant_half_perceptron(a, omega):
    """sigma = 1/2 exactly: tanh saturated by a bias of 40 (tanh(39) == 1.0 in float64), omega halved.
    Then W sigma = omega a / 2 and v(y) = omega (a.y) + const."""
    a = np.atleast_2d(np.asarray(a, float))
    return wflow.Perceptron.conservative(
        a, np.asarray(omega, float) / 2, 40.0 * np.ones(len(a)), "tanh"
    )


@pytest.mark.parametrize("d", [2, 3])
def test_witness_constant_activation(d):
    """Witness 1 (sigma = 1/2, a_0 = -x): the field omega a_0 / 2 is normal at x, so delta_x is critical,
    but v(y) = -<x, y> is smallest there: Hessian +omega/2 on every tangent direction, unstable for the ascent.
    The antipodal Dirac delta_{-x} = delta_{argmax v} is strictly stable and the maximizer of F."""
    beta, omega = 1.0, 1.0
    x = np.r_[0.6, 0.8, np.zeros(d - 2)][None]
    p = _constant_half_perceptron(-x, [omega])
    assert np.allclose(p.raw(x), -omega * x / 2, atol=1e-15)  # W sigma = omega a_0 / 2, constant
    model = wflow.USA(beta) + p
    s = stability(model, wflow.Atoms(x))
    assert s.critical and not s.stable
    assert np.allclose(s.hessian.eigenvalues, omega / 2, atol=1e-13)
    s2 = stability(model, wflow.Atoms(-x))
    assert s2.strictly_stable and np.allclose(s2.hessian.eigenvalues, -omega / 2, atol=1e-13)
    sup = energy_supremum(model)
    assert len(sup.maximizers) == 1 and np.allclose(sup.maximizers[0], -x[0], atol=1e-6)
    assert sup.value == pytest.approx(float(model.energy(wflow.Atoms(-x), backend=NP)), rel=1e-12)
    assert sup.value - float(model.energy(wflow.Atoms(x), backend=NP)) == pytest.approx(
        omega, rel=1e-10
    )


def test_witness_identity_omega_minus_4():
    """Witness 2 (sigma(s) = s, omega_0 = -4, beta = 1): v(y) = -4 (a.y)^2.
    Ascent: sup F = e/2, attained at every Dirac on the great sphere a-perp (two points on S^1, a circle on S^2:
    stable but not strictly, one zero eigenvalue).  Descent (V = -I) on S^1: the Dirac on a-perp is stable even
    against splitting, since its splitting block is e^beta - 4 < 0 at beta = 1 (but not at beta = 2): a stable
    atom of full mass, so the perceptron term C = 2 sum |omega| |a|^2 = 8 of the anti-concentration bound is
    needed."""
    a = np.array([[1.0, 0.0]])
    p = wflow.Perceptron.conservative(a, [-4.0], None, "identity")
    up = wflow.USA(1.0) + p
    sup = energy_supremum(up)
    assert sup.value == pytest.approx(np.e / 2, rel=1e-12)
    assert np.allclose(np.sort(sup.maximizers[:, 1]), [-1.0, 1.0], atol=1e-7)
    y = wflow.Atoms([[0.0, 1.0]])
    s = stability(up, y)
    assert s.strictly_stable and s.hessian.eigenvalues == pytest.approx([-4.0], rel=1e-14)
    # S^2: a circle of maximizers
    p3 = wflow.Perceptron.conservative([[1.0, 0.0, 0.0]], [-4.0], None, "identity")
    s3 = stability(wflow.USA(1.0) + p3, wflow.Atoms([[0.0, 0.6, 0.8]]))
    assert s3.stable and not s3.strictly_stable
    assert np.allclose(s3.hessian.eigenvalues, [-4.0, 0.0], atol=1e-14)
    # descent: stable against splitting iff e^beta < 4
    for beta, expected in ((1.0, True), (2.0, False)):
        down = wflow.USA(beta, V=-np.eye(2)) + p
        sp = stability(down, y, splitting=True)
        assert sp.splitting_max == pytest.approx(np.exp(beta) - 4.0, rel=1e-13)
        assert sp.strictly_stable is expected and sp.critical
        assert stability(down, y).strictly_stable  # maps alone cannot see it


def test_modulo_rotations_switch():
    """With a perceptron the energy is not rotation invariant: no quotient, zero modes count."""
    model = wflow.USA(1.0, V=-np.eye(2))
    pair = wflow.Atoms(angles_to_points([0.0, np.pi]))
    assert stability(model, pair).strictly_stable
    assert not stability(model, pair, modulo_rotations=False).strictly_stable
    p = wflow.Perceptron.conservative(
        [[0.0, 1.0]], [-1.0], None, "identity"
    )  # v = -(x_2)^2, max at +-e_1
    s = stability(model + p, pair)
    assert not s.modulo_rotations and s.strictly_stable
    assert np.allclose(
        np.sort(s.hessian.eigenvalues), np.sort([-np.exp(-1.0) - 1.0, -1.0]), atol=1e-13
    )


def _ascent_limit(model, x, m, steps=800, eta=0.1):
    """Particle gradient ascent (model.velocity, projected Euler) then Newton polishing of the zero-velocity
    equations on S^1; independent of wflow.stability."""
    for _ in range(steps):
        v = model.velocity(x, wflow.Atoms._trusted(x, m), backend=NP)
        x = normalize(exp_map(x, eta * v))

    def speed(th):
        y = angles_to_points(th)
        v = model.velocity(y, wflow.Atoms._trusted(y, m), backend=NP)
        return v[:, 1] * y[:, 0] - v[:, 0] * y[:, 1]

    r = scipy.optimize.root(speed, np.arctan2(x[:, 1], x[:, 0]), tol=1e-14)
    assert np.abs(speed(r.x)).max() < 1e-13
    return angles_to_points(r.x)


@pytest.mark.parametrize("seed, act, split_stable", [(0, "gelu", False), (3, "relu", True)])
def test_limit_of_the_ascent_is_stable(seed, act, split_stable):
    """Repulsive attention + perceptron on S^1, three particles: the flow's limit is strictly stable under maps;
    whether it survives splitting depends on how hard the perceptron pins each atom."""
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((4, 2))
    model = wflow.USA(2.0, V=-np.eye(2)) + wflow.Perceptron.conservative(
        A, rng.standard_normal(4), 0.3 * rng.standard_normal(4), act
    )
    m = np.array([0.4, 0.35, 0.25])
    y = _ascent_limit(model, uniform(3, 2, seed=seed), m)
    s = stability(model, wflow.Atoms(y, m))
    assert s.critical and s.strictly_stable and s.velocity < 1e-13
    assert stability(model, wflow.Atoms(y, m), splitting=True).strictly_stable is split_stable


def test_particles_that_merge_form_a_split_stable_atom():
    """Same setting, seed 2, ReLU: particles 0 and 2 fall into one well and merge despite the repulsion; the
    merged atom (mass 0.65) is stable against splitting, as the particles' merging says it must be."""
    rng = np.random.default_rng(2)
    A = rng.standard_normal((4, 2))
    model = wflow.USA(2.0, V=-np.eye(2)) + wflow.Perceptron.conservative(
        A, rng.standard_normal(4), 0.3 * rng.standard_normal(4), "relu"
    )
    m = np.array([0.4, 0.35, 0.25])
    y = _ascent_limit(model, uniform(3, 2, seed=2), m)
    assert np.linalg.norm(y[0] - y[2]) < 1e-7
    merged = wflow.Atoms(y[:2], [0.65, 0.35])
    s = stability(model, merged, splitting=True)
    assert s.critical and s.strictly_stable and s.splitting_max < 0


# --------------------------------------------------------------------------- sup F
@pytest.mark.parametrize("act", ACTS)
def test_potential_maximum_on_the_circle(act, rng):
    A = rng.standard_normal((6, 2))
    p = wflow.Perceptron.conservative(A, rng.standard_normal(6), 0.5 * rng.standard_normal(6), act)
    r = potential_maximum(p)
    th = np.linspace(0, 2 * np.pi, 100_001)
    k = int(np.argmax(p.potential(angles_to_points(th))))
    fine = np.linspace(
        th[k] - 2 * np.pi / 1e5, th[k] + 2 * np.pi / 1e5, 20_001
    )  # step 6e-9 around the grid's best
    brute = float(p.potential(angles_to_points(fine)).max())
    assert brute - 1e-12 <= r.value <= r.upper_bound
    assert r.value - brute < 1e-9
    assert r.upper_bound - r.value < 1e-5
    assert np.allclose(p.potential(r.maximizers), r.value, rtol=0, atol=1e-9 * max(1, abs(r.value)))


@pytest.mark.parametrize("act", ["relu", "gelu"])
def test_potential_maximum_on_s2_and_s4(act, rng):
    for d, n_brute in ((3, 50_000), (5, 100_000)):
        A = rng.standard_normal((5, d))
        p = wflow.Perceptron.conservative(
            A, rng.standard_normal(5), 0.3 * rng.standard_normal(5), act
        )
        r = potential_maximum(p, seed=1)
        y = rng.standard_normal((n_brute, d))
        y /= np.linalg.norm(y, axis=1, keepdims=True)
        assert r.value >= float(p.potential(y).max()) - 1e-12
        for z in r.maximizers:  # first-order condition: the tangent gradient vanishes
            g = (wflow.Perceptron.raw(p, z[None]))[0]
            assert np.linalg.norm(g - np.dot(g, z) * z) < 1e-6


def test_energy_supremum_beats_every_measure(rng):
    d = 3
    A = rng.standard_normal((4, d))
    model = wflow.USA(0.8) + wflow.Perceptron.conservative(
        A, rng.standard_normal(4), 0.2 * np.ones(4), "gelu"
    )
    sup = energy_supremum(model)
    assert sup.value == pytest.approx(float(model.energy(sup.dirac(), backend=NP)), rel=1e-14)
    assert sup.interaction == pytest.approx(np.exp(0.8) / 1.6)
    diracs = uniform(20_000, d, seed=5)
    F_dirac = np.exp(0.8) / 1.6 + 0.5 * model.parts[1].potential(diracs)
    assert F_dirac.max() <= sup.value + 1e-12
    pts = uniform(6, d, seed=6, batch=(200,))
    mus = wflow.Atoms(pts, rng.random((200, 6)))
    assert np.all(model.energy(mus, backend=NP) < sup.value)
    # pure attention: every Dirac; beta = 0: 1/2
    assert energy_supremum(wflow.USA(2.0)).value == pytest.approx(np.exp(2.0) / 4)
    assert energy_supremum(wflow.USA(2.0)).maximizers is None
    assert energy_supremum(wflow.USA(0.0)).value == 0.5
    with pytest.raises(ValueError, match="repulsive"):
        energy_supremum(wflow.USA(1.0, V=-np.eye(d)) + model.parts[1])


# --------------------------------------------------------------------------- bad input
def test_bad_input(rng):
    x = uniform(3, 3, seed=0)
    mu = wflow.Atoms(x)
    with pytest.raises(NotAGradientFlowError, match="V = I"):
        wasserstein_hessian(wflow.USA(1.0, V=2 * np.eye(3)), mu)
    W = rng.standard_normal((3, 2))
    with pytest.raises(NotAGradientFlowError, match="conservative"):
        stability(wflow.Perceptron(W, rng.standard_normal((2, 3))), mu)
    with pytest.raises(NotAGradientFlowError, match="reweighted"):
        wasserstein_hessian(
            wflow.SA(1.0) + wflow.Perceptron.conservative(np.eye(3), np.ones(3)), mu
        )
    with pytest.raises(TypeError, match="atomic"):
        wasserstein_hessian(wflow.USA(1.0), {"points": x})
    with pytest.raises(TypeError, match="model must be"):
        wasserstein_hessian("USA", mu)
    with pytest.raises(ValueError, match="dimension"):
        wasserstein_hessian(wflow.Perceptron.conservative(np.eye(2), np.ones(2)), mu)
    with pytest.raises(ValueError, match="distinct.*atoms 0 and 2"):
        wasserstein_hessian(wflow.USA(1.0), wflow.Atoms(np.stack([x[0], x[1], x[0]])))
    with pytest.raises(ValueError, match="batch"):
        wasserstein_hessian(wflow.USA(1.0), wflow.Atoms(uniform(3, 3, seed=0, batch=(2,))))
    with pytest.raises(ValueError, match="atom 1 has mass 0"):
        wasserstein_hessian(wflow.USA(1.0), wflow.Atoms(x, [1.0, 0.0, 1.0]))
    bad = x.copy()
    bad[1, 0] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        wasserstein_hessian(wflow.USA(1.0), bad)
    with pytest.raises(ValueError, match="non-finite"):
        wasserstein_hessian(wflow.USA(1.0), wflow.Atoms._trusted(bad, np.ones(3) / 3))
    with pytest.raises(ValueError, match="d = 2"):
        circle_condition(wflow.USA(1.0), mu)
    with pytest.raises(ValueError, match="rtol"):
        stability(wflow.USA(1.0), mu, rtol=-1.0)
    with pytest.raises(wflow.WflowError, match="overflow"):
        wasserstein_hessian(wflow.USA(800.0), mu)
    with pytest.raises(NotAGradientFlowError):
        potential_maximum(wflow.Perceptron(W, rng.standard_normal((2, 3))))


def test_relu_kink_warns():
    p = wflow.Perceptron.conservative([[1.0, 0.0]], [1.0])
    with pytest.warns(RuntimeWarning, match="kink"):
        wasserstein_hessian(p, wflow.Atoms([[0.0, 1.0]]))


def test_anticoncentration_bound():
    from wflow.stability import ANTICONCENTRATION_LIMIT, anticoncentration_bound

    A = np.array([[1.0, 0.0], [0.6, 0.8]])
    omega = np.array([0.5, -2.0])
    c = 2 * (0.5 + 2.0)
    for beta in (0.01, 1.0, 5.0, 50.0):
        full = (2 * np.exp(beta - 1.5) + c) / (
            2 * np.exp(beta - 1.5) + 0.375 * np.exp(beta - 0.125)
        )
        assert anticoncentration_bound(beta, omega, A) == pytest.approx(full, rel=1e-12)
    assert ANTICONCENTRATION_LIMIT == pytest.approx(0.57420, abs=5e-5)
    b = anticoncentration_bound(np.array([1.0, 10.0, 1e4]), omega, A)
    assert (
        b.shape == (3,)
        and np.all(np.diff(b) < 0)
        and b[-1] == pytest.approx(ANTICONCENTRATION_LIMIT, rel=1e-12)
    )
    with pytest.raises(ValueError, match="omega contains non-finite"):
        anticoncentration_bound(1.0, [np.nan, 1.0], A)
    with pytest.raises(ValueError, match="A must have shape"):
        anticoncentration_bound(1.0, [1.0], A)
    with pytest.raises(ValueError, match="beta"):
        anticoncentration_bound(-1.0, omega, A)
    with pytest.raises(ValueError, match="A contains non-finite"):
        anticoncentration_bound(1.0, omega, [[np.inf, 0.0], [0.0, 1.0]])


# --------------------------------------------------------------------------- particle output (issue 35, item 4)
def _particle_state():
    """64 particles from the uniform grid under USA(1, V=-I) + a GELU perceptron (the authors' code
    convention: output weights -e^beta omega), run to paper time 300 (wflow time e^-1 300)."""
    from wflow.studies.perceptron import paper_perceptron

    A, omega = paper_perceptron(2, 1.0, seed=1)
    model = wflow.USA(1.0, V=-np.eye(2)) + wflow.Perceptron.conservative(
        A, -np.e * omega, activation="gelu"
    )
    th = 2 * np.pi * (np.arange(64) + 0.5) / 64
    tr = wflow.simulate(
        model,
        wflow.Atoms(angles_to_points(th)),
        300 / np.e,
        method="dopri5",
        save_at=[0.0, 300 / np.e],
        diagnostics=(),
        backend=NP,
    )
    return model, tr.points[-1]


def test_stability_accepts_a_particle_run():
    # The raw particle state is refused (coinciding particles), and its clusters merged by hand are
    # "not a critical point" (velocities ~1e-7, tolerance 1e-8 of the terms); polish="auto" merges,
    # polishes and judges.  Independent answer: scipy's root of the angular velocity of the three
    # merged atoms, and the verdict of the exact Hessian there.
    model, x = _particle_state()
    with pytest.raises(ValueError, match="distinct"):
        stability(model, wflow.Atoms(x), polish=False)
    s = stability(model, wflow.Atoms(x))
    assert s.polish is not None and s.polish.applied
    assert s.hessian.points.shape == (3, 2) and s.critical and s.strictly_stable
    assert np.allclose(np.sort(s.hessian.masses), np.sort([27, 25, 12]) / 64, atol=1e-12)
    assert 0 < s.polish.displacement.max() < 1e-4  # the run's drift, not a jump to another point
    assert "merged into 3 atoms" in s.message and "polished first" in s.message
    merged = wflow.stability.merge_atoms(x, np.full(64, 1 / 64), 1e-3)
    raw = stability(model, merged, polish=False)
    assert not raw.critical and raw.message.startswith("not a critical point")
    m = merged.weights

    def speed(th):
        y = angles_to_points(th)
        v = model.velocity(y, wflow.Atoms._trusted(y, m), backend=NP)
        return v[:, 1] * y[:, 0] - v[:, 0] * y[:, 1]

    root = scipy.optimize.root(
        speed, np.arctan2(merged.points[:, 1], merged.points[:, 0]), tol=1e-14
    )
    ref = angles_to_points(root.x)
    assert np.abs(speed(root.x)).max() < 1e-12
    assert np.max(np.linalg.norm(s.hessian.points - ref, axis=1)) < 1e-9
    exact = stability(model, wflow.Atoms(ref, m), polish=False)
    assert exact.strictly_stable
    assert s.max_eigenvalue == pytest.approx(exact.max_eigenvalue, rel=1e-6)


def test_merge_and_polish_bad_input():
    mu = wflow.Atoms(angles_to_points(np.array([0.0, 2.0])))
    model = wflow.USA(1.0, V=-np.eye(2))
    with pytest.raises(ValueError, match="polish must be 'auto', True or False, got 'yes'"):
        stability(model, mu, polish="yes")
    with pytest.raises(ValueError, match="merge"):
        stability(model, mu, merge=-1.0)
    with pytest.raises(ValueError, match="max_move"):
        stability(model, mu, max_move=0.0)
    with pytest.raises(ValueError, match="radius"):
        wflow.stability.merge_atoms(mu.points, mu.weights, float("nan"))
    # far from a critical point the polish is refused and the verdict is on the atoms as given
    s = stability(model, mu)
    assert not s.critical and not s.polish.applied and "polish refused" in s.message


@pytest.mark.parametrize(
    "call",
    [
        lambda: circle_threshold(-1.0),
        lambda: wflow.stability.anticoncentration_bound(-1.0, [1.0], [[1.0, 0.0]]),
        lambda: wflow.stability.anticoncentration_bound([1.0, -2.0], [1.0], [[1.0, 0.0]]),
        lambda: stability(wflow.USA(-1.0), wflow.Atoms([[1.0, 0.0]])),
    ],
)
def test_negative_beta_is_refused(call):
    with pytest.raises(ValueError, match="beta.*-"):
        call()


def test_nan_in_perceptron_weights_names_the_argument():
    # issue 35: NaN in A was reported as "W contains non-finite values" (W = A^T diag(omega))
    with pytest.raises(ValueError, match="^A contains non-finite"):
        wflow.Perceptron.conservative([[1.0, np.nan], [0.0, 1.0]], [1.0, 2.0])
    with pytest.raises(ValueError, match="^omega contains non-finite"):
        wflow.Perceptron.conservative(np.eye(2), [1.0, np.nan])
    with pytest.raises(ValueError, match=r"^A must have shape \(m, d\)"):
        wflow.Perceptron.conservative([1.0, 2.0], [1.0])
