"""Semi-discrete W_2 (:mod:`wflow.transport.semidiscrete`): the multigrid Newton solver, warm
starts and bad input.  Brackets against the exact LP value (``ot.emd2``); the other semi-discrete
tests are in tests/test_transport.py."""

from __future__ import annotations

import numpy as np
import ot
import pytest

import wflow.transport.semidiscrete as sd
from wflow.sphere import cost_matrix, fibonacci_nodes, vmf_mixture
from wflow.transport.semidiscrete import semidiscrete_w2

MEANS = np.array([[0.0, 0.0, 1.0], [0.9138115, 0.0, -0.40613847]])


def _problem(n, seed=0, per_atom=16):
    """The mean-field study's problem at t = 0: n i.i.d. samples of a two-cap mixture, equal
    weights, against per_atom * n Fibonacci nodes weighted by the mixture's density."""
    x = vmf_mixture(n, MEANS, [3.0, 3.0], None, np.random.default_rng(seed))
    y = fibonacci_nodes(per_atom * n)
    w = np.exp(3.0 * (y @ MEANS.T - 1.0)).sum(axis=1)
    return x, np.full(n, 1.0 / n), y, w / w.sum()


def test_multigrid_preconditioner_solves_a_graph_laplacian():
    """Conjugate gradients with the smoothed-aggregation V-cycle on the Laplacian of the k-nearest
    neighbour graph of 6000 points (three levels with COARSEST = 100) reach the requested
    residual, in far fewer iterations than Jacobi needs."""
    from scipy import sparse
    from scipy.spatial import cKDTree

    x = vmf_mixture(6000, MEANS, [3.0, 3.0], None, np.random.default_rng(1))
    nbr = cKDTree(x).query(x, k=9)[1][:, 1:]
    rows = np.repeat(np.arange(6000), 8)
    G = sparse.csr_matrix((np.ones(rows.size), (rows, nbr.ravel())), shape=(6000, 6000))
    G = G + G.T
    A = (sparse.diags(np.asarray(G.sum(axis=1)).ravel() + 1e-3) - G).tocsr()
    b = np.random.default_rng(2).standard_normal(6000)
    calls = []

    def counted(prec):
        def apply(r):
            calls.append(1)
            return prec(r)

        return apply

    old = sd.COARSEST
    try:
        sd.COARSEST = 100
        u = sd._pcg(A, b, counted(sd._multigrid(A, x)), rtol=1e-8, maxiter=200)
    finally:
        sd.COARSEST = old
    assert np.linalg.norm(A @ u - b) <= 1e-8 * np.linalg.norm(b)
    assert len(calls) <= 40, len(calls)


def test_multigrid_newton_brackets_emd(monkeypatch):
    """With the multigrid levels in use (JACOBI_MAX = 0, COARSEST = 50: 400 atoms make two levels) the
    certified bracket of 400 atoms against 6400 weighted nodes holds ot.emd2 and is 1e-3 wide."""
    monkeypatch.setattr(sd, "COARSEST", 50)
    monkeypatch.setattr(sd, "JACOBI_MAX", 0)
    x, a, y, w = _problem(400)
    r = semidiscrete_w2(x, a, y, w)
    exact = ot.emd2(a, w, cost_matrix(x, y, cost="chordal"), numItermax=10**7)
    assert r["converged"] and not r["stalled"]
    assert r["lo"] - 1e-12 <= exact <= r["hi"] + 1e-12
    assert r["hi"] - r["lo"] <= 1e-3 * exact


def test_warm_start_from_a_nearby_problem():
    """psi0: the potential of the same atoms before a small rotation (a study's previous save
    time): fewer Newton steps (22 against 26), a bracket that holds ot.emd2 and the cold
    solve's potential."""
    x, a, y, w = _problem(300, seed=4)
    t = 0.02
    R = np.array([[np.cos(t), -np.sin(t), 0.0], [np.sin(t), np.cos(t), 0.0], [0.0, 0.0, 1.0]])
    before = semidiscrete_w2(x, a, y, w)
    cold = semidiscrete_w2(x @ R.T, a, y, w)
    warm = semidiscrete_w2(x @ R.T, a, y, w, psi0=before["psi"])
    exact = ot.emd2(a, w, cost_matrix(x @ R.T, y, cost="chordal"), numItermax=10**7)
    for r in (cold, warm):
        assert r["converged"] and not r["stalled"]
        assert r["lo"] - 1e-12 <= exact <= r["hi"] + 1e-12
        assert r["hi"] - r["lo"] <= 1e-3 * exact
    assert warm["newton_steps"] < cold["newton_steps"], (
        warm["newton_steps"],
        cold["newton_steps"],
    )
    # the same solution: the potentials agree up to the additive constant
    dpsi = warm["psi"] - cold["psi"]
    assert np.ptp(dpsi) <= 0.05 * np.ptp(cold["psi"])


def _small():
    return fibonacci_nodes(20), np.full(20, 0.05), fibonacci_nodes(200), np.full(200, 0.005)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda x, a, y, w: (x, a, y[:, :2] / np.linalg.norm(y[:, :2], axis=1)[:, None], w),
            r"^y: points on S\^1 \(d=2\), but x is on S\^2 \(d=3\)",
        ),
        (
            lambda x, a, y, w: (x, a, y, np.where(np.arange(200) == 7, -0.005, w)),
            r"^w: weights must be finite and >= 0, got 1 entries, e\.g\. \[7\] = -0\.005",
        ),
        (
            lambda x, a, y, w: (x, a, y, np.where(np.arange(200) == 3, np.nan, w)),
            r"^w: weights must be finite and >= 0, got 1 entries, e\.g\. \[3\] = nan",
        ),
        (
            lambda x, a, y, w: (x, a, y, np.where(np.arange(200) == 3, np.inf, w)),
            r"^w: weights must be finite and >= 0, got 1 entries, e\.g\. \[3\] = inf",
        ),
        (
            lambda x, a, y, w: (x, 2.0 * a, y, w),
            r"^a: the atoms' weights sum to 2, but the fine measure's w to 1$",
        ),
        (lambda x, a, y, w: (x, a[:10], y, w), r"^a: shape \(20,\) to match x, got \(10,\)"),
    ],
)
def test_bad_input_one_line_naming_the_argument(change, message):
    with pytest.raises(ValueError, match=message) as info:
        semidiscrete_w2(*change(*_small()))
    assert "\n" not in str(info.value)


def test_refuses_a_problem_larger_than_the_memory_left(monkeypatch):
    """Estimated before any work: here with 10 MB said to be available."""
    monkeypatch.setattr(sd, "available_memory", lambda: 1e7)
    with pytest.raises(
        ValueError, match=r"^y: N=20 atoms against M=20000 fine atoms need about"
    ) as info:
        semidiscrete_w2(
            fibonacci_nodes(20), np.full(20, 0.05), fibonacci_nodes(20000), np.full(20000, 5e-5)
        )
    assert "GiB is available" in str(info.value)


def test_bad_warm_start():
    x, a, y, w = _small()
    with pytest.raises(
        ValueError, match=r"^psi0: a finite potential of shape \(20,\), got shape \(19,\)"
    ):
        semidiscrete_w2(x, a, y, w, psi0=np.zeros(19))
    with pytest.raises(ValueError, match=r"^psi0: a finite potential"):
        semidiscrete_w2(x, a, y, w, psi0=np.full(20, np.nan))
