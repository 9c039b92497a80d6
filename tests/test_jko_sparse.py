"""The JKO step's truncated (sparse) Gibbs kernel against the dense one (wflow.solvers.jko.sparse)."""

import numpy as np
import pytest

import wflow.solvers.jko.sparse as sparse_mod
import wflow.solvers.jko.stepper as stepper_mod
from wflow.density import Density
from wflow.mesh import SphereMesh
from wflow.models import USA
from wflow.solvers.jko import JKOStepper
from wflow.solvers.jko.sparse import SparseCost
from wflow.solvers.jko.step import default_eps, support
from wflow.sphere import cost_matrix


@pytest.fixture(scope="module")
def sphere():
    mesh = SphereMesh(12)  # 1442 cells
    rho = Density.from_function(mesh, lambda p: np.exp(2 * p[:, 0]) + np.exp(1.5 * p[:, 2]))
    x, a, r, _ = support(rho, None)
    return x, a, r, default_eps(x, r)


def _two_steps(x, a, r, eps, kappa, dense_max):
    stepper_mod.DENSE_MAX_CELLS = dense_max
    st = JKOStepper(
        USA(2.0),
        x,
        r,
        tau=0.05,
        eps=eps,
        cost="geodesic",
        kappa=kappa,
        method="sinkhorn",
        debias=True,
        eps_scaling=None,
        tol=1e-10,
        max_iter=200,
        max_sinkhorn=5000,
        backend="auto",
    )
    w = a
    for _ in range(2):
        w, s = st.step(w)
        assert s.converged
    return w, st


@pytest.mark.parametrize("kappa", [None, 4.0])
def test_sparse_step_matches_dense(sphere, monkeypatch, kappa):
    """Two JKO steps (scaling iterations without noise, Newton-CG with) on the truncated kernel agree
    with the dense kernel to round-off: the truncation drops e^{-36} = 2.3e-16 of each row's mass.
    Measured: L1 differences 4e-15 (no noise) and 1e-15 (kappa = 4); with THETA_SPARSE = 30 they
    are 5e-13 and 3e-14, with 24 1e-10 and 1e-11, and the test fails."""
    x, a, r, eps = sphere
    monkeypatch.setattr(stepper_mod, "DENSE_MAX_CELLS", stepper_mod.DENSE_MAX_CELLS)
    dense, st_d = _two_steps(x, a, r, eps, kappa, 10**9)
    sparse, st_s = _two_steps(x, a, r, eps, kappa, 0)
    assert isinstance(st_d.C, np.ndarray) and isinstance(st_s.C, SparseCost)
    # linear memory: about 2 pi THETA eps / (2 h^2) pairs per cell (226 at the default eps), not n
    assert st_s.C.nnz < 300 * x.shape[0]
    assert st_s.sigma2 == pytest.approx(st_d.sigma2, rel=1e-12)
    assert abs(sparse.sum() - 1) < 1e-14 and sparse.min() >= 0
    # the same iterations on kernels that differ by e^{-36} relative: weights agree to round-off
    assert np.abs(sparse - dense).sum() < 1e-13


@pytest.mark.parametrize("theta", [16.0, 24.0])
def test_truncation_error_tracks_theta(sphere, monkeypatch, theta):
    """The weights' L1 error is a few times e^{-THETA}, the mass a row's truncation drops (measured
    2.6 e^{-16} and 3.3 e^{-24}): the truncation, not the solver, sets the difference."""
    x, a, r, eps = sphere
    monkeypatch.setattr(stepper_mod, "DENSE_MAX_CELLS", stepper_mod.DENSE_MAX_CELLS)
    dense, _ = _two_steps(x, a, r, eps, None, 10**9)
    monkeypatch.setattr(sparse_mod, "THETA_SPARSE", theta)
    sparse, _ = _two_steps(x, a, r, eps, None, 0)
    err = np.abs(sparse - dense).sum()
    assert np.exp(-theta) < err < 10 * np.exp(-theta)


def test_pattern_keeps_every_pair_above_threshold(sphere):
    """Every pair within e^{-THETA} of its row's largest kernel entry is kept, for a potential that
    displaces rows by several cells, and the kept costs are the dense matrix's entries."""
    x, _, r, eps = sphere
    rng = np.random.default_rng(0)
    pot = 0.2 * x[:, 0] + 0.01 * rng.standard_normal(x.shape[0])
    sc = SparseCost(x, "geodesic")
    ptr, cols, c = sc.pattern(pot, eps)
    C = cost_matrix(x)
    rows = np.repeat(np.arange(x.shape[0]), np.diff(ptr))
    assert np.allclose(c, C[rows, cols], rtol=0, atol=1e-14)
    E = C - pot[None, :]
    need = E <= E.min(axis=1, keepdims=True) + sparse_mod.THETA_SPARSE * eps * (1 - 1e-9)
    kept = np.zeros_like(need)
    kept[rows, cols] = True
    assert np.all(kept[need])
    # and not much more: the k-d tree search keeps a complete set, not the whole row
    assert kept.sum() < 2 * need.sum()


def test_sparse_cost_rejects_bad_input(sphere):
    x = sphere[0]
    with pytest.raises(ValueError, match="cost must be 'geodesic' or 'chordal', got 'flat'"):
        SparseCost(x, "flat")
    with pytest.raises(ValueError, match="theta must be a positive number, got -1"):
        SparseCost(x, "geodesic", theta=-1)


def test_default_solver_goes_sparse_above_the_limit():
    """The JKO solver's defaults (what jko() uses) keep the dense cost up to DENSE_MAX_CELLS cells and
    the truncated kernel above: a 5292-cell mesh gets ~230 pairs per cell, not 5292."""
    from wflow.solvers.jko.step import JKO, JKOProblem

    mesh = SphereMesh(23)  # 5292 cells
    assert mesh.n_cells > stepper_mod.DENSE_MAX_CELLS
    rho = Density.from_function(mesh, lambda p: 1 + 0.5 * p[:, 0])
    st = JKO().init(JKOProblem(USA(2.0), mesh.centers, mesh.areas, mesh=mesh), 0.0, rho.masses())
    assert isinstance(st.C, SparseCost)
    assert 200 * mesh.n_cells < st.C.nnz < 260 * mesh.n_cells


def test_column_log_sums_where_the_kernel_is_empty(sphere):
    """Columns that no kept row reaches (mass only on a polar cap) fall back to an exact
    log-sum-exp over all rows; elsewhere the truncated and dense column sums agree to round-off
    of the largest (a column e^{-30} below the others keeps only an absolute accuracy)."""
    from wflow.solvers.jko.transport import SemiRelaxed

    x, _, r, eps = sphere
    a = np.where(x[:, 0] > 0.3, 1.0, 0.0)
    a /= a.sum()
    C = cost_matrix(x)
    out = []
    for cost in (C, SparseCost(x, "geodesic")):
        ot = SemiRelaxed(cost, r)
        ot.set_eps(eps)
        ot.row_update()
        empty = ~(ot.KT @ (a * ot.u) > 1e-300)
        E = (ot.f[:, None] - C) / eps + np.log(np.maximum(a, 1e-300))[:, None]
        m = E.max(axis=0)
        exact = m + np.log(np.exp(E - m).sum(axis=0))
        got = ot.column_log_sums(a)
        assert empty.sum() > 100  # the fallback is exercised
        assert np.allclose(got[empty], exact[empty], rtol=1e-13, atol=0)
        out.append(got)
    dense, sparse = np.exp(out[0]), np.exp(out[1])
    assert np.abs(sparse - dense).max() < 1e-14 * dense.max()
