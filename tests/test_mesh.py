"""Meshes: areas, orientation, closure (divergence theorem), location, quadrature."""

import numpy as np
import pytest

from wflow.mesh import CircleMesh, SphereMesh, icosahedral_nodes


@pytest.fixture(scope="module", params=["icosahedral", "fibonacci"])
def sphere(request):
    return SphereMesh(6, generators=request.param)


def test_circle_geometry():
    m = CircleMesh(37, offset=0.3)
    assert abs(m.areas.sum() - 2 * np.pi) < 1e-12
    assert m.n_cells == m.n_edges == 37
    # normal tangent at the edge point and pointing from left cell to right cell
    assert np.allclose(np.sum(m.edge_normal * m.edge_midpoint, axis=1), 0, atol=1e-15)
    step = m.centers[m.cell_right] - m.centers[m.cell_left]
    assert np.all(np.sum(step * m.edge_normal, axis=1) > 0)
    x = np.array(
        [[np.cos(0.3 + 1e-9), np.sin(0.3 + 1e-9)], [np.cos(0.3 - 1e-9), np.sin(0.3 - 1e-9)]]
    )
    assert m.locate(x).tolist() == [0, 36]


def test_circle_rejects_small_m():
    with pytest.raises(ValueError, match="m"):
        CircleMesh(2)


@pytest.mark.parametrize("offset", [float("nan"), float("inf"), "0.1", None])
def test_circle_rejects_an_offset_that_is_not_a_finite_number(offset):
    with pytest.raises((ValueError, TypeError), match="offset must be a"):
        CircleMesh(16, offset=offset)


def test_sphere_areas_and_counts(sphere):
    assert sphere.n_cells == 10 * 36 + 2
    assert abs(sphere.areas.sum() - 4 * np.pi) < 1e-12
    # Euler characteristic of the Voronoi diagram: V - E + F = 2, and all areas positive
    assert len(sphere.vertices) - sphere.n_edges + sphere.n_cells == 2
    assert np.all(sphere.areas > 0)


def test_sphere_conormals(sphere):
    n, x = sphere.edge_normal, sphere.edge_midpoint
    assert np.allclose(np.linalg.norm(n, axis=1), 1, atol=1e-14)
    assert np.abs(np.sum(n * x, axis=1)).max() < 1e-13  # tangent
    a, b = sphere.vertices[sphere.edge_vertices[:, 0]], sphere.vertices[sphere.edge_vertices[:, 1]]
    long = sphere.edge_length > 1e-8
    t = (b - a)[long] / np.linalg.norm((b - a)[long], axis=1, keepdims=True)
    assert np.abs(np.sum(n[long] * t, axis=1)).max() < 1e-12  # normal to the edge
    assert np.abs(np.sum(n * a, axis=1)).max() < 1e-13  # orthogonal to the whole arc
    # out of the left cell: towards the right generator
    g = sphere.generators
    assert np.all(np.sum((g[sphere.cell_right] - g[sphere.cell_left]) * n, axis=1) > 0)


def test_sphere_cells_close_divergence_theorem(sphere):
    r"""sum_e l_e n_e = -2 int_C x dA for each cell (div_S P_x c = -2<c, x> on S^2)."""
    M = sphere.n_cells
    lhs = np.zeros((M, 3))
    for sgn, cells in ((1.0, sphere.cell_left), (-1.0, sphere.cell_right)):
        for k in range(3):
            lhs[:, k] += sgn * np.bincount(
                cells, weights=sphere.edge_length * sphere.edge_normal[:, k], minlength=M
            )
    x, w, cell = sphere.quadrature()
    rhs = np.stack([np.bincount(cell, weights=w * x[:, k], minlength=M) for k in range(3)], axis=1)
    # the left side is exact; the right side carries the h^6 error of the degree-5 quadrature
    err = np.linalg.norm(lhs + 2 * rhs, axis=1) / sphere.areas
    assert err.max() < 5e-8
    # the quadrature weights give the exact areas, and the centroids are the normalized vector areas
    assert np.allclose(np.bincount(cell, weights=w), sphere.areas, rtol=1e-8)
    c = rhs / np.linalg.norm(rhs, axis=1, keepdims=True)
    assert np.abs(c - sphere.centers).max() < 5e-8


def test_sphere_locate_matches_voronoi(sphere):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((500, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    cells = sphere.locate(x)
    d = x @ sphere.generators.T
    assert np.array_equal(cells, np.argmax(d, axis=1))
    assert np.array_equal(sphere.locate(sphere.centers), np.arange(sphere.n_cells))


def test_sphere_quality_and_repr():
    m = SphereMesh(8)
    q = m.quality()
    assert q["area_ratio"] < 2.0 and q["min_angle"] > 100
    assert "area_ratio" in repr(m) and "min_angle" in repr(m)
    assert len(icosahedral_nodes(5)) == 252


def test_padded_connectivity_consistent(sphere):
    for m in (sphere, CircleMesh(9)):
        valid = m.cell_edges >= 0
        i, s = np.nonzero(valid)
        e = m.cell_edges[i, s]
        left = m.cell_edge_sign[i, s] > 0
        assert np.array_equal(np.where(left, m.cell_left[e], m.cell_right[e]), i)
        assert np.array_equal(
            np.where(left, m.cell_right[e], m.cell_left[e]), m.cell_neighbors[i, s]
        )
        assert np.array_equal(m.cell_edges[m.cell_left, m.edge_slot_left], np.arange(m.n_edges))
        assert np.array_equal(m.cell_edges[m.cell_right, m.edge_slot_right], np.arange(m.n_edges))


def test_bad_generators():
    with pytest.raises(ValueError, match="generators"):
        SphereMesh(4, generators="cube")
    with pytest.raises(ValueError, match="shape"):
        SphereMesh.from_generators(np.eye(3))
