import numpy as np
import pytest
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from scipy.spatial import cKDTree

import wflow
from wflow import SA, USA, Atoms, sphere
from wflow.diagnostics import (
    batched_cluster_labels,
    cluster_labels,
    count_clusters,
    mass_clusters,
    pair_fraction,
)


def _all_pairs_components(x, threshold):
    p = cKDTree(x).query_pairs(2 * np.sin(threshold / 2), output_type="ndarray")
    g = coo_matrix((np.ones(len(p)), (p[:, 0], p[:, 1])), shape=(len(x), len(x)))
    return connected_components(g, directed=False)[1]


@pytest.mark.parametrize("d", [2, 3])
def test_fast_single_linkage_equals_all_pairs(d, rng):
    """Angular order (S^1) and Delaunay edges (S^2, n > 2000) give exactly the all-pairs clusters."""
    centres = sphere.uniform(30, d, rng)
    x = np.concatenate([sphere.von_mises_fisher(80, c, 3000.0, rng) for c in centres])
    x = np.concatenate([x, x[:50]])  # exact duplicates (collapsed clusters)
    for threshold in (0.01, 0.03, 0.1, 0.4):
        k, labels = cluster_labels(x, threshold)
        ref = _all_pairs_components(x, threshold)
        # same partition: labels map one-to-one
        pairs = set(zip(labels.tolist(), ref.tolist()))
        assert k == ref.max() + 1 and len(pairs) == k


def test_count_clusters_batched_and_min_mass(rng):
    c = sphere.uniform(3, 3, rng)
    x = np.concatenate(
        [sphere.von_mises_fisher(n, c[i], 1e4, rng) for i, n in enumerate((50, 30, 2))]
    )
    mu = Atoms(np.stack([x, x[::-1]]))
    np.testing.assert_array_equal(count_clusters(mu, 0.2), [3, 3])
    np.testing.assert_array_equal(count_clusters(mu, 0.2, min_mass=0.05), [2, 2])


def _clustered(rng, batch, n, d, k, spread):
    """Batches of n points near k random centres each (spread ~ distance to the centre)."""
    c = sphere.uniform(k, d, rng, batch=batch)
    pick = rng.integers(0, k, (*batch, n))
    x = np.take_along_axis(c, pick[..., None], axis=-2) + spread / np.sqrt(d) * rng.standard_normal(
        (*batch, n, d)
    )
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _same_partition(a, b):
    return len(set(zip(a.tolist(), b.tolist()))) == len(set(a.tolist())) == len(set(b.tolist()))


@pytest.mark.parametrize("d", [2, 3, 8, 128])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_batched_cluster_labels_equal_single_system(d, dtype, rng):
    """Batched components = cluster_labels and all-pairs components, system by system, exactly."""
    cases = [
        sphere.uniform(40, d, rng, batch=(30,)),  # random: percolation-like graphs
        _clustered(rng, (30,), 64, d, 5, 0.03),  # clustered
        _clustered(rng, (30,), 64, d, 3, 0.0),
    ]  # collapsed (exact duplicates)
    thresholds = (0.05, 0.1, 0.4, 1.2)
    for x in cases:
        x = x.astype(dtype)
        for threshold in thresholds:
            k, labels = batched_cluster_labels(x, threshold)
            assert k.shape == (x.shape[0],) and labels.shape == x.shape[:2]
            for b in range(x.shape[0]):
                k_ref, lab_ref = cluster_labels(x[b], threshold)
                assert (
                    k[b]
                    == k_ref
                    == _all_pairs_components(x[b].astype(np.float64), threshold).max() + 1
                )
                assert _same_partition(labels[b], lab_ref)
                assert (
                    labels[b].max() == k[b] - 1 and labels[b][0] == 0
                )  # numbered 0..k-1 by first appearance


def test_batched_cluster_labels_near_threshold_pairs_decided_exactly():
    """Pairs at the threshold up to Gram rounding are decided from coordinates, as cluster_labels does."""
    t = 0.1
    gaps = t + np.array([-1e-15, -1e-13, 1e-13, 1e-15, 0.0])
    x = np.stack([np.stack([[1.0, 0.0], [np.cos(g), np.sin(g)]]) for g in gaps])
    k, _ = batched_cluster_labels(x, t)
    np.testing.assert_array_equal(k, [cluster_labels(xx, t)[0] for xx in x])


def test_count_clusters_routes_and_shapes(rng, monkeypatch):
    import wflow.diagnostics.clusters as D

    x = _clustered(rng, (3, 4), 50, 3, 4, 0.05)
    w = rng.uniform(size=(3, 4, 50))
    mu = Atoms(x, w / w.sum(-1, keepdims=True))
    for min_mass in (0.0, 0.1):
        batched = count_clusters(mu, 0.2, min_mass=min_mass)
        monkeypatch.setattr(D, "BATCHED_MAX_N", 10)  # force the one-system path
        looped = count_clusters(mu, 0.2, min_mass=min_mass)
        monkeypatch.setattr(D, "BATCHED_MAX_N", 512)
        assert batched.shape == (3, 4)
        np.testing.assert_array_equal(batched, looped)


def test_pair_fraction_against_loop(rng):
    x = _clustered(rng, (2, 5), 30, 16, 3, 0.02)
    f = pair_fraction(x, 0.999)
    ref = np.empty((2, 5))
    for idx in np.ndindex(2, 5):
        G = x[idx] @ x[idx].T
        ref[idx] = (np.sum(G > 0.999) - np.sum(np.diag(G) > 0.999)) / (30 * 29)
    np.testing.assert_array_equal(f, ref)
    assert f.dtype == np.float64 and 0 < f.min() and f.max() < 1
    assert pair_fraction(np.repeat(x[:1, :1, :1], 30, axis=-2))[0, 0] == 1.0
    assert np.isnan(pair_fraction(x[:, :, :1]).ravel()).all()
    np.testing.assert_allclose(pair_fraction(x.astype(np.float32)), f, atol=3 / (30 * 29))
    # above SMALL_MAX tokens: the batched-GEMM route, against the same loop
    from wflow.kernels.small import SMALL_MAX

    big = _clustered(rng, (2,), SMALL_MAX + 4, 8, 3, 0.02)
    G = big @ np.swapaxes(big, -1, -2)
    n = big.shape[-2]
    ref = [(np.sum(g > 0.999) - np.sum(np.diag(g) > 0.999)) / (n * (n - 1)) for g in G]
    np.testing.assert_array_equal(pair_fraction(big, 0.999), ref)


def test_grid_clusters_on_s2_dense_and_collapsed(rng):
    """S^2 above BATCHED_MAX_N: the cube grid equals the all-pairs components (collapsed, tiny and huge thresholds)."""
    centres = sphere.uniform(6, 3, rng)
    x = np.concatenate(
        [
            np.repeat(centres, 300, axis=0) + 1e-10 * rng.standard_normal((1800, 3)),
            sphere.uniform(700, 3, rng),
        ]
    )
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    for threshold in (1e-4, 0.02, 0.1, 0.3, 2.0, 3.2):
        k, labels = cluster_labels(x, threshold)
        ref = _all_pairs_components(x, threshold)
        assert k == ref.max() + 1 and _same_partition(labels, ref), threshold


def test_mass_clusters(rng):
    from wflow.mesh import CircleMesh

    # S^1 mesh: two bumps of mass, one of them across the periodic seam
    mesh = CircleMesh(64)
    w = np.zeros(64)
    w[[62, 63, 0, 1]] = [0.1, 0.2, 0.15, 0.05]
    w[[20, 21, 22]] = [0.2, 0.3, 0.1]
    w[40] = 1e-6  # below threshold * max
    atoms, masses = mass_clusters(mesh.centers, w, neighbors=mesh.cell_neighbors)
    np.testing.assert_allclose(masses, [0.6, 0.5])
    for a, idx in zip(atoms, ([20, 21, 22], [62, 63, 0, 1])):
        bary = w[idx] @ mesh.centers[idx]
        np.testing.assert_allclose(a, bary / np.linalg.norm(bary), rtol=1e-14)
    # -1 padding and the point-cloud path give the same atoms
    nb = np.where(np.arange(mesh.cell_neighbors.shape[1]) == 0, mesh.cell_neighbors, -1)
    nb = np.concatenate([nb, np.roll(np.arange(64), -1)[:, None]], axis=1)
    a2, m2 = mass_clusters(mesh.centers, w, neighbors=nb)
    a3, m3 = mass_clusters(mesh.centers, w)
    for a, m in ((a2, m2), (a3, m3)):
        np.testing.assert_allclose(m, masses, rtol=1e-14)
        np.testing.assert_allclose(a, atoms, rtol=1e-14)
    with pytest.raises(ValueError, match="neighbors must be an integer array"):
        mass_clusters(mesh.centers, w, neighbors=np.zeros((3, 2), dtype=int))
    with pytest.raises(ValueError, match="weights must be finite"):
        mass_clusters(mesh.centers, -w)


def test_batched_clusters_decide_ties_as_cluster_labels_on_the_circle(rng):
    """Pairs of points on S^1 at the linking distance to rounding (the angle between them exactly the
    threshold): the batched pass and cluster_labels link the same pairs (|x_i - x_j| < chord, the norm of
    the difference in float64)."""
    from wflow.diagnostics import batched_cluster_labels, cluster_labels

    threshold = 0.1
    a = rng.uniform(0, 2 * np.pi, 4000)
    x = np.stack(
        [
            np.stack([np.cos(a), np.sin(a)], -1),
            np.stack([np.cos(a + threshold), np.sin(a + threshold)], -1),
        ],
        axis=1,
    )
    k, _ = batched_cluster_labels(x, threshold)
    ref = np.array([cluster_labels(p, threshold)[0] for p in x])
    assert 0 < np.count_nonzero(ref == 1) < len(x)  # ties both ways
    np.testing.assert_array_equal(k, ref)


# ------------------------------------------------------------------ effective number of clusters
def _fibonacci_sphere(n):
    k = np.arange(n) + 0.5
    z = 1 - 2 * k / n
    phi = np.pi * (1 + 5**0.5) * k
    r = np.sqrt(1 - z * z)
    return np.stack([r * np.cos(phi), r * np.sin(phi), z], axis=1)


@pytest.mark.parametrize("beta", [0.5, 4.0, 30.0])
def test_n_eff_of_the_uniform_circle_is_e_beta_over_i0(beta):
    """Equispaced points: the double sum is the trapezoid rule of a periodic analytic integrand, exact to
    rounding; the closed form e^beta / I_0(beta)."""
    from scipy.special import i0e

    from wflow.diagnostics import effective_clusters, uniform_effective_clusters

    th = 2 * np.pi * np.arange(256) / 256
    x = np.stack([np.cos(th), np.sin(th)], axis=1)
    exact = 1 / i0e(beta)  # e^beta / I_0(beta)
    assert effective_clusters(x, beta=beta, backend="numpy") == pytest.approx(exact, rel=1e-12)
    assert uniform_effective_clusters(beta, 2) == pytest.approx(exact, rel=1e-14)


@pytest.mark.parametrize("beta", [2.0, 9.0])
def test_n_eff_of_the_uniform_sphere_is_2beta_over_1_minus_e_minus_2beta(beta):
    """The issue's closed form on S^2: 2 beta / (1 - e^(-2 beta)) (18.0 at beta = 9), on a Fibonacci lattice
    of 2000 points (a quadrature: 1e-6) and on 2000 random points (what `wflow run` starts from: within 2 %,
    where single linkage at 0.1 rad counts about 38 percolation components)."""
    from wflow.diagnostics import count_clusters, effective_clusters, uniform_effective_clusters

    exact = 2 * beta / (1 - np.exp(-2 * beta))
    assert uniform_effective_clusters(beta, 3) == pytest.approx(exact, rel=1e-13)
    assert effective_clusters(_fibonacci_sphere(2000), beta=beta) == pytest.approx(exact, rel=1e-6)
    x = sphere.uniform(2000, 3, seed=0)
    assert effective_clusters(x, beta=beta) == pytest.approx(exact, rel=0.02)
    if beta == 9.0:
        assert int(count_clusters(Atoms(x), 0.1)) > 30  # the single-linkage count it replaces


@pytest.mark.parametrize("d", [2, 3, 5, 128])
def test_uniform_n_eff_in_any_dimension_against_quadrature(d):
    """N_eff of the uniform measure on S^(d-1) against the law of t = <x, y>, c_d (1 - t^2)^((d-3)/2) dt."""
    from scipy.integrate import quad
    from scipy.special import beta as B

    from wflow.diagnostics import uniform_effective_clusters

    beta = 3.0
    c = 1 / B(0.5, (d - 1) / 2)  # normalises (1 - t^2)^((d-3)/2) on [-1, 1]
    a = (d - 3) / 2
    if d == 2:  # the weight (1 + t)^a (1 - t)^a with its integrable endpoint singularities
        mean, _ = quad(lambda t: c * np.exp(beta * (t - 1)), -1, 1, weight="alg", wvar=(a, a))
    else:
        f = lambda t: c * np.exp(a * np.log1p(-t * t) + beta * (t - 1))  # noqa: E731
        mean, _ = quad(f, -1, 1, epsabs=0, epsrel=1e-12, points=[0.0], limit=200)
    assert uniform_effective_clusters(beta, d) == pytest.approx(1 / mean, rel=1e-9)


def test_n_eff_counts_separated_clusters_by_their_masses():
    """k atoms far apart (pairs at inner product 0 or -1, so e^-60 or less): N_eff = 1 / sum m_k^2; k for
    equal masses; between 1 and 1/sum w_i^2; e^beta / (2 beta E_beta) with SA's energy."""
    from wflow.diagnostics import effective_clusters

    x = np.vstack([np.eye(3), -np.eye(3)])
    m = np.array([0.3, 0.25, 0.2, 0.1, 0.1, 0.05])
    assert effective_clusters(x, m, beta=60.0) == pytest.approx(1 / np.sum(m**2), rel=1e-14)
    assert effective_clusters(x, beta=60.0) == pytest.approx(6.0, rel=1e-14)
    y = sphere.uniform(40, 4, seed=3, batch=(3,))
    w = np.random.default_rng(0).uniform(0.1, 1.0, (3, 40))
    w /= w.sum(axis=1, keepdims=True)
    n_eff = effective_clusters(y, w, beta=5.0, backend="numpy")
    assert n_eff.shape == (3,) and np.all(n_eff >= 1) and np.all(n_eff <= 1 / np.sum(w**2, axis=1))
    energy = SA(5.0).energy(Atoms(y, w), backend="numpy")
    np.testing.assert_allclose(n_eff, np.exp(5.0) / (2 * 5.0 * energy), rtol=1e-12)
    direct = 1 / np.einsum("bi,bj,bij->b", w, w, np.exp(5.0 * (y @ y.transpose(0, 2, 1) - 1)))
    np.testing.assert_allclose(n_eff, direct, rtol=1e-12)
    with pytest.raises(ValueError, match="beta"):
        effective_clusters(y, w, beta=-1.0)


@pytest.mark.parametrize(
    "model,kw",
    [
        (SA(4.0), dict(method="euler-average", dt=0.1)),  # the fused step: from its double sums
        (SA(4.0), dict(backend="numpy", dt=0.1)),  # from SA's log-energy
        (USA(2.0, V=-np.eye(8)), dict(backend="numpy", dt=0.1)),  # a kernel sum of its own
    ],
    ids=["fused", "log-energy", "own-sum"],
)
def test_simulate_records_n_eff_by_default_at_the_models_beta(model, kw):
    from wflow.diagnostics import effective_clusters

    x0 = sphere.uniform(16, 8, seed=0, batch=(4,))
    traj = wflow.simulate(model, x0, 1.0, save_at=[0.0, 0.5, 1.0], **kw)
    assert traj.config["n_eff_beta"] == model.beta
    w = np.broadcast_to(traj.weights, traj.points.shape[:-1])
    ref = effective_clusters(traj.points, w, beta=model.beta, backend="numpy")
    np.testing.assert_allclose(traj.diagnostics["n_eff"], ref, rtol=1e-12)


def test_n_eff_beta_of_sums_schemes_and_models_without_attention():
    """The attention block's beta answers for a sum; a perceptron alone has no N_eff (not recorded)."""
    from wflow.diagnostics import kernel_beta

    A = np.random.default_rng(0).standard_normal((4, 3))
    block = wflow.Perceptron(A.T, A)
    assert kernel_beta(block, 5) is None
    assert kernel_beta(USA(2.0) + block, 5) == 2.0
    assert kernel_beta(SA(gamma=0.5), 100) == pytest.approx(0.5 * np.log(100), rel=1e-15)
    traj = wflow.simulate(block, sphere.uniform(6, 3, seed=0), 0.2, dt=0.1, backend="numpy")
    assert "n_eff" not in traj.diagnostics and traj.config["n_eff_beta"] is None


@pytest.mark.parametrize("coordinates", ["angles", "gaps"])
def test_n_eff_in_circle_coordinates_from_the_angle_energy(coordinates):
    from wflow.diagnostics import effective_clusters

    x = sphere.uniform(12, 2, seed=0)
    traj = wflow.simulate(SA(5.0), x, 1.0, coordinates=coordinates, dt=0.1, backend="numpy")
    ref = effective_clusters(traj.points, beta=5.0, backend="numpy")
    np.testing.assert_allclose(traj.diagnostics["n_eff"], ref, rtol=1e-13)
