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


def _project_reference(x, v):
    return v - np.sum(x * v, axis=-1, keepdims=True) * x


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", [(7, 3), (64, 32, 16), (300, 200, 2)])
def test_project_and_normalize_fused_equal_numpy(shape, dtype, rng):
    """Large arrays (fused numba pass) and small ones (einsum) agree with the plain formulas."""
    x = rng.standard_normal(shape).astype(dtype)
    v = rng.standard_normal(shape).astype(dtype)
    tol = 1e-14 if dtype == np.float64 else 3e-6
    ref = x / np.linalg.norm(x.astype(np.float64), axis=-1, keepdims=True)
    for check in (True, False):
        y = sphere.normalize(x, check=check)
        assert y.dtype == dtype and y.shape == shape
        np.testing.assert_allclose(y, ref, rtol=tol, atol=tol)
    u = sphere.project(y, v)
    assert u.dtype == dtype
    np.testing.assert_allclose(
        u,
        _project_reference(y.astype(np.float64), v.astype(np.float64)),
        atol=tol * 10 * np.sqrt(shape[-1]),
    )
    # broadcasting (one x for a batch of v) takes the einsum path
    np.testing.assert_allclose(
        sphere.project(y[..., :1, :], v), _project_reference(y[..., :1, :], v), atol=tol * 10
    )


def test_normalize_fused_rejects_zero_and_nan():
    x = np.ones((100_000, 3))
    x[123] = 0.0
    with pytest.raises(ValueError, match=r"zero vector \(index \(123,"):
        sphere.normalize(x)
    x[123, 1] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        sphere.normalize(x)


@pytest.mark.parametrize("d", [2, 3, 7])
@pytest.mark.parametrize("cost", ["geodesic", "chordal"])
def test_cost_matrix_against_pairwise_distances(d, cost, rng):
    x = sphere.uniform(60, d, rng)
    # near pairs (1e-9 apart), antipodal pairs (pi - 1e-9) and exact duplicates
    t = rng.standard_normal((10, d)) * 1e-9
    y = np.concatenate([x[:10] + t, -x[10:20] + t, x[20:25], sphere.uniform(30, d, rng)])
    y /= np.linalg.norm(y, axis=-1, keepdims=True)
    geo = sphere.geodesic_distance(x[:, None, :], y[None, :, :])
    ref = geo if cost == "geodesic" else 2 * np.sin(geo / 2)
    for p in (1, 2, 0.5):
        C = sphere.cost_matrix(x, y, cost=cost, p=p)
        assert C.shape == (60, 55)
        np.testing.assert_allclose(C, ref**p, rtol=1e-13, atol=1e-13 if p >= 1 else 3e-8)
    # blocked rows give the same numbers
    import wflow.sphere as S

    old = S._COST_BLOCK
    try:
        S._COST_BLOCK = 100
        np.testing.assert_array_equal(
            sphere.cost_matrix(x, y, cost=cost), sphere.cost_matrix(x, y, cost=cost, p=2)
        )
    finally:
        S._COST_BLOCK = old
    Cxx = sphere.cost_matrix(x, cost=cost, p=1)
    assert np.all(np.diag(Cxx) == 0) and np.allclose(Cxx, Cxx.T, atol=1e-15)
    with pytest.raises(ValueError, match="cost must be one of"):
        sphere.cost_matrix(x, cost="euclid")
    with pytest.raises(ValueError, match="p must be a finite number > 0"):
        sphere.cost_matrix(x, p=0)


@pytest.mark.parametrize("d", [2, 3, 4, 9, 64])
def test_tangent_frame_orthonormal(d, rng):
    n = max(50, d)
    x = sphere.uniform(n, d, rng, batch=(2,))
    x[0, :d] = np.eye(d)  # coordinate axes (both signs): the Householder pivot's edge cases
    x[1, :d] = -np.eye(d)
    e = sphere.tangent_frame(x)
    assert e.shape == (2, n, d - 1, d)
    np.testing.assert_allclose(
        np.einsum("...ad,...bd->...ab", e, e),
        np.broadcast_to(np.eye(d - 1), e.shape[:-2] + (d - 1, d - 1)),
        atol=1e-14,
    )
    np.testing.assert_allclose(np.einsum("...ad,...d->...a", e, x), 0, atol=1e-14)
    if d == 3:  # the Lagrangian solver's frame: (e1, e2, x) positively oriented
        np.testing.assert_allclose(
            np.linalg.det(np.concatenate([e, x[..., None, :]], axis=-2)), 1, atol=1e-13
        )
    if d == 2:
        np.testing.assert_allclose(e[..., 0, :], np.stack([-x[..., 1], x[..., 0]], -1))


def test_von_mises_fisher_is_scipy_and_reproducible():
    a = sphere.von_mises_fisher(50, [0, 1, 0], 20.0, seed=3)
    b = stats.vonmises_fisher([0, 1.0, 0], 20.0).rvs(50, random_state=np.random.default_rng(3))
    np.testing.assert_allclose(a, b / np.linalg.norm(b, axis=1, keepdims=True), rtol=1e-15)
    np.testing.assert_array_equal(
        a, sphere.von_mises_fisher(50, [0, 1, 0], 20.0, seed=np.random.default_rng(3))
    )
    np.testing.assert_allclose(
        np.linalg.norm(sphere.von_mises_fisher(10, [1, 0], 0.0, seed=0), axis=1), 1
    )


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", [(5, 3), (64, 32, 16)])
def test_project_scaled_and_retract_step(shape, dtype, rng):
    x = sphere.uniform(shape[-2], shape[-1], rng, batch=shape[:-2]).astype(dtype)
    v = rng.standard_normal(shape).astype(dtype)
    s = rng.uniform(0.5, 2.0, shape[:-1]).astype(dtype)
    tol = 1e-13 if dtype == np.float64 else 3e-6
    ref = _project_reference(x.astype(np.float64), v.astype(np.float64)) / s[..., None]
    got = sphere.project(x, v, scale=s)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, ref, atol=tol * 10 * np.sqrt(shape[-1]))
    y = (x + 0.1 * v).astype(np.float64)
    got = sphere.retract(x, v, step=0.1)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, y / np.linalg.norm(y, axis=-1, keepdims=True), atol=tol * 10)
