import numpy as np
import pytest

from wflow import SA, USA, Atoms, NotAGradientFlowError, Perceptron, sphere, theory


def models(rng, d=3):
    Q, K, V = rng.standard_normal((d, d)), rng.standard_normal((d, d)), rng.standard_normal((d, d))
    A = rng.standard_normal((5, d))
    return [
        SA(2.0),
        USA(1.5),
        SA(3.0, V=-np.eye(d)),
        Perceptron.conservative(A, rng.standard_normal(5), rng.standard_normal(5), "relu"),
        Perceptron(rng.standard_normal((d, 5)), A, None, "gelu"),
        USA(1.0) + Perceptron.conservative(A, rng.standard_normal(5), None, "tanh"),
        SA(1.0, Q=Q, K=K, V=V),
    ]


def test_rotation_equivariance(rng):
    """v[R#mu](Rx) = R v[mu](x) for every rotation-invariant model."""
    x = sphere.uniform(30, 3, rng)
    mu = Atoms(x, rng.uniform(size=30))
    R = sphere.random_rotation(3, rng)
    for m in models(rng)[:3]:  # the rotation-invariant ones
        v = m.velocity(x, mu)
        vr = m.velocity(x @ R.T, mu.rotate(R))
        np.testing.assert_allclose(vr, v @ R.T, atol=1e-13, err_msg=repr(m))


def test_equivariance_with_conjugated_matrices(rng):
    """General Q, K, V, perceptrons: rotating points and conjugating the matrices commutes."""
    d = 3
    x = sphere.uniform(30, d, rng)
    mu = Atoms(x)
    R = sphere.random_rotation(d, rng)
    Q, K, V = rng.standard_normal((d, d)), rng.standard_normal((d, d)), rng.standard_normal((d, d))
    W, A, b = rng.standard_normal((d, 4)), rng.standard_normal((4, d)), rng.standard_normal(4)
    m = SA(1.5, Q=Q, K=K, V=V) + Perceptron(W, A, b, "gelu")
    mr = SA(1.5, Q=Q @ R.T, K=K @ R.T, V=R @ V @ R.T) + Perceptron(R @ W, A @ R.T, b, "gelu")
    np.testing.assert_allclose(
        mr.velocity(x @ R.T, mu.rotate(R)), m.velocity(x, mu) @ R.T, atol=1e-13
    )


def test_velocity_is_tangent(rng):
    x = sphere.uniform(25, 3, rng)
    mu = Atoms(x)
    for m in models(rng):
        v = m.velocity(x, mu)
        np.testing.assert_allclose(np.sum(v * x, -1), 0, atol=1e-13)


def _energy_of(model, x, w):
    return float(model.energy(Atoms(x, w)))


def test_velocity_is_riemannian_gradient_usa_plus_perceptron(rng):
    """d/dh E(exp_{x_i}(h u)) = w_i <v(x_i), u>: USA + conservative ReLU and GELU perceptrons."""
    d, n = 3, 12
    x = sphere.uniform(n, d, rng)
    w = rng.uniform(0.5, 1.5, n)
    w /= w.sum()
    A = rng.standard_normal((6, d))
    for act in ("relu", "gelu", "tanh"):
        model = USA(2.0) + Perceptron.conservative(
            A, rng.standard_normal(6), rng.standard_normal(6), act
        )
        v = model.velocity(x, Atoms(x, w))
        h = 1e-5
        for i in (0, 5, 11):
            u = sphere.project(x[i], rng.standard_normal(d))
            xp, xm = x.copy(), x.copy()
            xp[i] = sphere.exp_map(x[i], h * u)
            xm[i] = sphere.exp_map(x[i], -h * u)
            fd = (_energy_of(model, xp, w) - _energy_of(model, xm, w)) / (2 * h)
            assert abs(fd - w[i] * v[i] @ u) < 1e-8 * max(1.0, abs(fd)), act


def test_sa_velocity_is_reweighted_gradient(rng):
    """SA, Q = K = V = I: v = grad_S(dE/dmu) / Z_mu, checked on the first variation."""
    x = sphere.uniform(10, 3, rng)
    mu = Atoms(x)
    m = SA(3.0)
    v = m.velocity(x, mu)
    Z = m.normalizer(x, mu)
    h = 1e-6
    for i in range(3):
        u = sphere.project(x[i], rng.standard_normal(3))
        fp = m.first_variation(sphere.exp_map(x[i], h * u)[None], mu)[0]
        fm = m.first_variation(sphere.exp_map(x[i], -h * u)[None], mu)[0]
        assert abs((fp - fm) / (2 * h) / Z[i] - v[i] @ u) < 1e-8


@pytest.mark.parametrize("beta", [0.0, 0.7, 3.0])
def test_usa_on_circle_is_kuramoto(beta, rng):
    theta = rng.uniform(0, 2 * np.pi, 40)
    x = sphere.angles_to_points(theta)
    v = USA(beta).velocity(x, Atoms(x))
    tangent = np.stack([-np.sin(theta), np.cos(theta)], -1)
    np.testing.assert_allclose(
        np.sum(v * tangent, -1), theory.kuramoto_velocity(theta, beta), atol=1e-13
    )


def test_energy_values_and_sign_convention(rng):
    x = sphere.uniform(15, 3, rng)
    mu = Atoms(x)
    G = np.exp(2.0 * x @ x.T)
    e = G.mean() / (2 * 2.0)
    assert abs(USA(2.0).energy(mu) - e) < 1e-13 * e
    assert abs(SA(2.0, V=-np.eye(3)).energy(mu) + e) < 1e-13 * e
    assert abs(USA(0.0).energy(mu) - 0.5 * np.sum(x.mean(0) ** 2)) < 1e-15


def test_non_gradient_models_say_why(rng):
    x = sphere.uniform(5, 3, rng)
    mu = Atoms(x)
    with pytest.raises(NotAGradientFlowError, match="Q = K = I"):
        SA(1.0, Q=2 * np.eye(3)).energy(mu)
    with pytest.raises(NotAGradientFlowError, match="V = I .* or V = -I"):
        USA(1.0, V=np.diag([1.0, 2.0, 3.0])).energy(mu)
    with pytest.raises(NotAGradientFlowError, match="W = A\\^T diag"):
        Perceptron(rng.standard_normal((3, 4)), rng.standard_normal((4, 3))).first_variation(x, mu)
    with pytest.raises(NotAGradientFlowError, match="reweighted"):
        (SA(1.0) + Perceptron.conservative(np.eye(3), np.ones(3))).energy(mu)


def test_bad_model_input(rng):
    with pytest.raises(ValueError, match="beta"):
        SA(-1.0)
    with pytest.raises(TypeError, match="beta"):
        USA("big")
    with pytest.raises(ValueError, match="W must have shape"):
        Perceptron(np.ones((3, 4)), np.ones((5, 3)))
    with pytest.raises(ValueError, match="activation"):
        Perceptron(np.ones((3, 4)), np.ones((4, 3)), activation="swish")
    x = sphere.uniform(5, 2, rng)
    with pytest.raises(ValueError, match="d=3"):
        SA(1.0, V=np.eye(3)).velocity(x, Atoms(x))
    with pytest.raises(ValueError, match="Q, K, V must act on the same dimension"):
        SA(1.0, Q=np.eye(3), K=np.eye(4))


def test_usa_overflow_is_an_error(rng):
    from wflow import WflowError

    x = sphere.uniform(5, 3, rng)
    with pytest.raises(WflowError, match="overflows"):
        USA(1000.0).velocity(x, Atoms(x))
    v = SA(1000.0).velocity(x, Atoms(x))  # SA stays finite
    assert np.all(np.isfinite(v))


def test_model_round_trip(rng):
    from wflow.models import model_from_dict

    for m in models(rng):
        m2 = model_from_dict(m.to_dict())
        x = sphere.uniform(7, 3, rng)
        np.testing.assert_array_equal(m2.velocity(x, Atoms(x)), m.velocity(x, Atoms(x)))
    with pytest.raises(ValueError, match="unknown keys"):
        model_from_dict({"type": "SA", "beta": 1.0, "temperature": 2})
