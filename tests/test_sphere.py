import numpy as np
import pytest
from scipy import special, stats

from wflow import sphere


def test_projection_and_geodesics(rng):
    x = sphere.uniform(50, 4, rng)
    v = rng.standard_normal((50, 4))
    u = sphere.project(x, v)
    np.testing.assert_allclose(np.sum(u * x, -1), 0, atol=1e-14)
    # exp map: unit norm, distance = |u|, log inverts exp
    u = 0.7 * u / np.linalg.norm(u, axis=-1, keepdims=True)
    y = sphere.exp_map(x, u)
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), 1, atol=1e-15)
    np.testing.assert_allclose(sphere.geodesic_distance(x, y), 0.7, atol=1e-14)
    np.testing.assert_allclose(sphere.log_map(x, y), u, atol=1e-13)
    # retraction agrees with exp to second order: |R(tu) - exp(tu)| = O(t^3)
    errs = [np.abs(sphere.retract(x, t * u) - sphere.exp_map(x, t * u)).max() for t in (1e-2, 5e-3)]
    assert 7.0 < errs[0] / errs[1] < 9.0


def test_geodesic_distance_accurate_near_zero_and_pi():
    x = np.array([1.0, 0.0, 0.0])
    t = 1e-9
    y = np.array([np.cos(t), np.sin(t), 0.0])
    assert abs(sphere.geodesic_distance(x, y) - t) < 1e-20
    assert abs(sphere.geodesic_distance(x, -y) - (np.pi - t)) < 1e-15


def test_normalize_rejects_zero_and_nan():
    with pytest.raises(ValueError, match="zero vector"):
        sphere.normalize([[1.0, 0.0], [0.0, 0.0]])
    with pytest.raises(ValueError, match="non-finite"):
        sphere.normalize([[np.nan, 1.0]])


def test_uniform_moments(rng):
    x = sphere.uniform(200_000, 3, rng)
    # E[x] = 0, E[x x^T] = I/3 ; Monte Carlo error ~ 1/sqrt(n)
    np.testing.assert_allclose(x.mean(0), 0, atol=6e-3)
    np.testing.assert_allclose(x.T @ x / len(x), np.eye(3) / 3, atol=6e-3)


@pytest.mark.parametrize("d,kappa", [(2, 3.0), (3, 10.0), (5, 1.0)])
def test_von_mises_fisher_mean_resultant(d, kappa, rng):
    mean = np.zeros(d)
    mean[0] = 1
    x = sphere.von_mises_fisher(100_000, mean, kappa, rng)
    # E<mu, x> = A_d(kappa) = I_{d/2}(kappa) / I_{d/2-1}(kappa)
    expected = special.iv(d / 2, kappa) / special.iv(d / 2 - 1, kappa)
    assert abs(x[:, 0].mean() - expected) < 4 * x[:, 0].std() / np.sqrt(len(x))


def test_sample_circle_density_ks(rng):
    f = lambda th: 1 + 0.8 * np.cos(2 * th)  # noqa: E731
    th = sphere.points_to_angles(sphere.sample_circle_density(f, 20_000, rng))
    cdf = lambda t: (t + 0.4 * np.sin(2 * t)) / (2 * np.pi)  # noqa: E731
    assert stats.kstest(th, cdf).pvalue > 1e-3


def test_quadrature_exactness():
    x, w = sphere.gauss_sphere_nodes(6)
    assert abs(w.sum() - 1) < 1e-14
    # exact for degree <= 11 in z and < 12 in phi: E[z^10] = 1/11 ; E[x^4] = 1/5
    assert abs(w @ x[:, 2] ** 10 - 1 / 11) < 1e-14
    assert abs(w @ x[:, 0] ** 4 - 1 / 5) < 1e-14
    c, wc = sphere.circle_nodes(16)
    assert abs(wc @ c[:, 0] ** 8 - 35 / 128) < 1e-14


def test_random_rotation_is_orthogonal(rng):
    R = sphere.random_rotation(5, rng)
    np.testing.assert_allclose(R @ R.T, np.eye(5), atol=1e-14)
    assert abs(np.linalg.det(R) - 1) < 1e-12


def test_seeds_reproduce():
    a = sphere.uniform(5, 3, seed=7)
    b = sphere.uniform(5, 3, seed=np.random.default_rng(7))
    np.testing.assert_array_equal(a, b)
    with pytest.raises(TypeError, match="seed"):
        sphere.uniform(5, 3, seed="seven")
