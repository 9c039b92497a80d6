"""Numerical contracts of wflow.transport: exact methods against each other and closed forms."""

from __future__ import annotations

import os
import re

import numpy as np
import ot
import pytest

import wflow
from wflow import Atoms, sphere
from wflow.sphere import (
    angles_to_points,
    cost_matrix,
    fibonacci_nodes,
    normalize,
    random_rotation,
    uniform,
    vmf_mixture,
)
from wflow.transport import (
    sinkhorn_divergence,
    w2_to_uniform_circle,
    wasserstein,
    wasserstein_result,
)
from wflow.transport.semidiscrete import semidiscrete_w2


def _random_circle(rng, n):
    theta = rng.uniform(0, 2 * np.pi, n)
    return Atoms(angles_to_points(theta), rng.uniform(0.1, 1.0, n)), theta


def _random_sphere(rng, n, d=3):
    return Atoms(uniform(n, d, rng), rng.uniform(0.1, 1.0, n))


@pytest.mark.parametrize("p", [1, 2, 1.5])
def test_circle_matches_emd_geodesic(p):
    rng = np.random.default_rng(0)
    for _ in range(10):
        n, m = rng.integers(1, 40, size=2)
        mu, _ = _random_circle(rng, n)
        nu, _ = _random_circle(rng, m)
        exact = wasserstein(mu, nu, p, method="emd")
        circ = wasserstein(mu, nu, p, method="circle")
        assert abs(circ - exact) <= 1e-8
        assert wasserstein(mu, nu, p) == circ  # auto -> circle on S^1


def test_zero_and_symmetry():
    rng = np.random.default_rng(0)
    mu = _random_sphere(rng, 30)
    nu = _random_sphere(rng, 25)
    assert wasserstein(mu, mu, method="emd") <= 1e-7
    assert wasserstein(mu, nu, method="emd") == pytest.approx(
        wasserstein(nu, mu, method="emd"), abs=1e-12
    )
    c, _ = _random_circle(rng, 50)
    assert wasserstein(c, c, method="circle") <= 1e-6


@pytest.mark.parametrize("cost", ["geodesic", "chordal"])
@pytest.mark.parametrize("p", [1, 2])
def test_triangle_inequality(cost, p):
    rng = np.random.default_rng(0)
    for _ in range(5):
        a, b, c = (_random_sphere(rng, k) for k in rng.integers(5, 30, size=3))
        ab = wasserstein(a, b, p, method="emd", cost=cost)
        bc = wasserstein(b, c, p, method="emd", cost=cost)
        ac = wasserstein(a, c, p, method="emd", cost=cost)
        assert ac <= ab + bc + 1e-12


def test_rotation_invariance_s2():
    rng = np.random.default_rng(0)
    mu, nu = _random_sphere(rng, 40), _random_sphere(rng, 35)
    R = random_rotation(3, rng)
    for cost in ("geodesic", "chordal"):
        w = wasserstein(mu, nu, method="emd", cost=cost)
        assert wasserstein(mu.rotate(R), nu.rotate(R), method="emd", cost=cost) == pytest.approx(
            w, abs=1e-10
        )


def test_two_diracs_and_dirac_against_measure():
    rng = np.random.default_rng(0)
    x, y = uniform(2, 3, rng)
    theta = np.arccos(np.clip(x @ y, -1, 1))
    for p in (1, 2, 3):
        assert wasserstein(Atoms(x[None]), Atoms(y[None]), p, method="emd") == pytest.approx(
            theta, abs=1e-10
        )
        chord = wasserstein(Atoms(x[None]), Atoms(y[None]), p, method="emd", cost="chordal")
        assert chord == pytest.approx(2 * np.sin(theta / 2), abs=1e-12)
    nu = _random_sphere(rng, 20)
    th = np.arccos(np.clip(nu.points @ x, -1, 1))
    for p in (1, 2):
        expected = (nu.weights @ th**p) ** (1 / p)
        assert wasserstein(Atoms(x[None]), nu, p, method="emd") == pytest.approx(
            expected, abs=1e-10
        )
    # on the circle, by the exact circle method
    c = Atoms(angles_to_points([0.3]))
    d = Atoms(angles_to_points([0.3 + 2.5]))
    assert wasserstein(c, d, 1) == pytest.approx(2.5, abs=1e-10)
    assert wasserstein(c, Atoms(angles_to_points([0.3 - 2.9])), 2) == pytest.approx(2.9, abs=1e-10)


def test_w2_to_uniform_circle():
    rng = np.random.default_rng(0)
    # a Dirac: W_2^2 = mean of theta^2 over (-pi, pi) = pi^2/3
    assert w2_to_uniform_circle(Atoms(angles_to_points([1.0]))) == pytest.approx(
        np.pi / np.sqrt(3), abs=1e-12
    )
    mu, _ = _random_circle(rng, 25)
    closed = w2_to_uniform_circle(mu)
    assert wasserstein(mu, "uniform") == closed
    assert wasserstein("uniform", mu) == closed
    # fine uniform grid, exact circle method: the grid is within pi/N of uniform
    N = 20000
    grid = Atoms(angles_to_points(2 * np.pi * (np.arange(N) + 0.5) / N))
    assert wasserstein(mu, grid, 2, method="circle") == pytest.approx(closed, abs=2 * np.pi / N)
    # a coarser grid checks the weight handling against the LP
    M = 400
    grid = Atoms(angles_to_points(2 * np.pi * (np.arange(M) + 0.5) / M))
    assert wasserstein(mu, grid, 2, method="emd") == pytest.approx(closed, abs=2 * np.pi / M)


def test_sinkhorn_close_to_emd_within_bias():
    rng = np.random.default_rng(0)
    mu = _random_sphere(rng, 60)
    nu = Atoms(vmf_mixture(50, [[0, 0, 1], [1, 0, 0]], [5.0, 20.0], seed=rng))
    w2 = wasserstein(mu, nu, 2, method="emd") ** 2
    for reg in (1e-1, 1e-2):
        res = wasserstein_result(mu, nu, 2, method="sinkhorn", reg=reg, backend="numpy")
        assert res.info["converged"] and not res.exact
        s = res.info["divergence"]
        bound = res.info["bias_bound_pth_power"]
        assert bound <= reg * np.log(60)
        assert abs(s - w2) <= bound
        assert abs(res.value - np.sqrt(w2)) <= res.error_bound
    # small eps: the observed error is far below the bound
    s = sinkhorn_divergence(mu, nu, 2, reg=1e-2, backend="numpy")
    assert abs(s - w2) <= 0.01 * w2
    # S(mu, mu) = 0 up to the stopping residual (tol = 0.1 reg)
    assert abs(sinkhorn_divergence(mu, mu, 2, reg=1e-2, backend="numpy")) <= 1e-3


def test_sinkhorn_chordal_p1():
    rng = np.random.default_rng(0)
    mu, nu = _random_sphere(rng, 40), _random_sphere(rng, 30)
    w1 = wasserstein(mu, nu, 1, method="emd", cost="chordal")
    s = sinkhorn_divergence(mu, nu, 1, cost="chordal", reg=1e-2, backend="numpy")
    assert abs(s - w1) <= 1e-2 * np.log(40)


def test_sinkhorn_keops_matches_numpy():
    pytest.importorskip("pykeops")
    from wflow.kernels.keops_backend import import_pykeops

    if import_pykeops() is None:
        pytest.skip("pykeops does not import")
    rng = np.random.default_rng(0)
    mu, nu = _random_sphere(rng, 50), _random_sphere(rng, 40)
    a = sinkhorn_divergence(mu, nu, 2, reg=1e-1, backend="numpy")
    b = sinkhorn_divergence(mu, nu, 2, reg=1e-1, backend="keops")  # first run compiles (10-25 s)
    assert b == pytest.approx(a, abs=1e-9)


def test_sliced_proxy():
    rng = np.random.default_rng(0)
    mu, nu = _random_sphere(rng, 200), _random_sphere(rng, 150)
    r = wasserstein_result(mu, nu, 2, method="sliced", seed=0)
    assert not r.exact and np.isnan(r.error_bound)
    assert r.value == wasserstein(mu, nu, 2, method="sliced", seed=0)  # reproducible
    assert wasserstein(mu, mu, 2, method="sliced", seed=1) <= 1e-6
    # any projection count (POT reshapes by n_projections, not by the projections passed)
    r7 = wasserstein(mu, nu, 2, method="sliced", n_projections=7, seed=0)
    assert np.isfinite(r7) and abs(r7 / r.value - 1) < 0.3
    # the proxy moves with the distance: a far measure is farther than a near one
    far = Atoms(vmf_mixture(150, [[0, 0, 1]], [50.0], seed=rng))
    assert wasserstein(mu, far, method="sliced", seed=0) > wasserstein(
        mu, nu, method="sliced", seed=0
    )
    # on S^1 the sliced method is the exact circle distance
    c1, _ = _random_circle(rng, 30)
    c2, _ = _random_circle(rng, 20)
    assert wasserstein(c1, c2, method="sliced") == wasserstein(c1, c2, method="circle")


def test_auto_choice_and_result():
    rng = np.random.default_rng(0)
    mu, nu = _random_sphere(rng, 30), _random_sphere(rng, 30)
    r = wasserstein_result(mu, nu)
    assert r.method == "emd" and r.exact and r.error_bound == 0.0 and float(r) == r.value
    c1, _ = _random_circle(rng, 10)
    assert wasserstein_result(c1, c1).method == "circle"
    assert wasserstein_result(c1, c1, cost="chordal").method == "emd"


def test_density_like_and_arrays():
    rng = np.random.default_rng(0)
    mu = _random_sphere(rng, 20)

    class FakeDensity:
        def to_atoms(self):
            return mu

    nu = _random_sphere(rng, 15)
    assert wasserstein(FakeDensity(), nu, method="emd") == wasserstein(mu, nu, method="emd")
    pts = uniform(10, 3, rng)
    assert wasserstein(pts, Atoms(pts), method="emd") <= 1e-7
    # zero-weight atoms are dropped
    z = Atoms(np.concatenate([mu.points, uniform(1, 3, rng)]), np.concatenate([mu.weights, [0.0]]))
    assert wasserstein(z, nu, method="emd") == pytest.approx(
        wasserstein(mu, nu, method="emd"), abs=1e-12
    )


def test_bad_input():
    rng = np.random.default_rng(0)
    s2, s1 = _random_sphere(rng, 10), _random_circle(rng, 10)[0]
    with pytest.raises(ValueError, match="same sphere"):
        wasserstein(s2, s1)
    with pytest.raises(ValueError, match="non-negative"):
        Atoms(uniform(3, 3, rng), [1.0, -1.0, 1.0])
    with pytest.raises(ValueError, match="p must be"):
        wasserstein(s2, s2, 0.5)
    with pytest.raises(TypeError, match="p must be"):
        wasserstein(s2, s2, "2")
    with pytest.raises(ValueError, match="method"):
        wasserstein(s2, s2, method="lp")
    with pytest.raises(ValueError, match="cost"):
        wasserstein(s2, s2, cost="euclid")
    with pytest.raises(ValueError, match="max_emd=5"):
        wasserstein(s2, s2, method="emd", max_emd=5)
    assert wasserstein(s2, s2, method="emd", max_emd=5, allow_large=True) <= 1e-7
    with pytest.raises(ValueError, match="batch"):
        wasserstein(Atoms(uniform(4, 3, rng, batch=(2,))), s2)
    with pytest.raises(ValueError, match="circle"):
        wasserstein(s2, s2, method="circle")
    with pytest.raises(ValueError, match="uniform"):
        wasserstein(s2, "uniform")
    with pytest.raises(ValueError, match="p=2"):
        wasserstein(s1, "uniform", p=1)
    with pytest.raises(ValueError, match="'uniform'"):
        wasserstein(s1, "gauss")
    with pytest.raises(TypeError, match="nu must be"):
        wasserstein(s1, 3.0)
    with pytest.raises(ValueError, match="reg"):
        wasserstein(s2, s2, method="sinkhorn", reg=-1.0)
    with pytest.raises(ValueError, match="scaling"):
        wasserstein(s2, s2, method="sinkhorn", scaling=1.5)
    with pytest.raises(ValueError, match="n_projections"):
        wasserstein(s2, s2, method="sliced", n_projections=0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_semidiscrete_brackets_emd(seed):
    """The certified bracket lo <= W_2 <= hi contains the exact LP value and is narrow."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(20, 80))
    x = vmf_mixture(n, [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]], [3.0, 6.0], None, rng)
    y = uniform(32 * n, 3, rng)
    nu = Atoms(y, np.exp(2.0 * y[:, 2]))
    for cost in ("chordal", "geodesic"):
        r = wasserstein_result(x, nu, method="semidiscrete", cost=cost)
        exact = wasserstein(x, nu, method="emd", cost=cost, allow_large=True)
        assert r.info["lower"] - 1e-12 <= exact <= r.info["upper"] + 1e-12
        assert r.value == pytest.approx(0.5 * (r.info["lower"] + r.info["upper"]))
        assert not r.exact
        if cost == "chordal":
            assert r.error_bound <= 1e-3 * exact
            assert r.info["converged"]
    # symmetric in its arguments: the smaller measure is the atomic side
    r2 = wasserstein_result(nu, x, method="semidiscrete", cost="chordal")
    assert r2.value == pytest.approx(
        wasserstein_result(x, nu, method="semidiscrete", cost="chordal").value, abs=1e-12
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_semidiscrete_uneven_fine_measure(seed):
    """Atoms and fine nodes pushed by one clustering map (as the mean-field flow does by t = 1).

    The pushed Fibonacci nodes are no longer quasi-uniform (spacing 0.008..0.04, was 0.10..0.11) and the atoms
    cluster: a global eps with 5 fixed candidates per fine node stalled here (brackets 2.5-11 %
    wide); local eps and supports holding every atom within the gap give <= 4e-4.
    """
    means = normalize(np.array([[0.0, 0.0, 1.0], [0.9, 0.0, -0.4]]))

    def push(z):
        return normalize(z + 2.0 * means[np.argmax(z @ means.T, axis=1)])

    rng = np.random.default_rng(seed)
    n = 60
    x = push(vmf_mixture(n, means, [3.0, 3.0], None, rng))
    z = fibonacci_nodes(16 * n)
    nu = Atoms(push(z), np.exp(3.0 * z @ means.T).sum(axis=1))
    r = wasserstein_result(Atoms(x), nu, method="semidiscrete", cost="chordal")
    exact = wasserstein(Atoms(x), nu, method="emd", cost="chordal")
    assert r.info["lower"] - 1e-12 <= exact <= r.info["upper"] + 1e-12
    assert r.info["upper"] - r.info["lower"] <= 1e-3 * exact
    assert r.info["converged"] and not r.info["stalled"]


def _two_caps(seed, n=800):
    """n i.i.d. atoms of a two-cap von Mises-Fisher mixture, equal weights, against 16 n
    Fibonacci nodes weighted by its density."""
    rng = np.random.default_rng(seed)
    x = vmf_mixture(n, [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]], [3.0, 3.0], None, rng)
    y = fibonacci_nodes(16 * n)
    w = np.exp(3.0 * y[:, 2]) + np.exp(3.0 * y[:, 0])
    return x, np.full(n, 1.0 / n), y, w / w.sum()


def test_semidiscrete_walk_gives_the_queried_bracket_with_few_queries():
    """Supports from the walk on the atoms' graph (the default) against supports from k-d
    queries only (walk=False), 800 atoms of a two-cap mixture against 12800 weighted Fibonacci
    nodes: the same certified bracket (to the marginal tolerance), and the walk builds at most half the
    k-d trees (it needs them only to check itself and for the rows it missed)."""
    x, a, y, w = _two_caps(5)
    walked = semidiscrete_w2(x, a, y, w)
    queried = semidiscrete_w2(x, a, y, w, walk=False)
    for r in (walked, queried):
        assert r["converged"] and not r["stalled"]
        assert r["hi"] - r["lo"] <= 5e-4 * r["lo"]
    assert walked["lo"] == pytest.approx(queried["lo"], rel=1e-9)
    # hi carries 2 ||m - a||_1 with ||m - a||_1 <= tol = 1e-8 on each path: equal to 4e-8
    assert walked["hi"] == pytest.approx(queried["hi"], abs=4e-8)
    assert walked["queries"] <= queried["queries"] / 2, (walked["queries"], queried["queries"])


def test_semidiscrete_uneven_atom_weights_converge_to_the_exact_value():
    """Atoms of uneven weight (a_i from 0.33 to 1 of the largest) against a fine quasi-uniform
    measure: the bracket holds ot.emd2 and is 1e-3 wide.  The entropic semi-dual weighs its
    softmax by a_i; it had a_i^(1/eps) (the log-weights divided by eps with the potential), and
    the solve stopped after 7 steps with the bracket [0.020, 0.872] around 0.0497."""
    x = uniform(200, 3, seed=2)
    a = 1.0 + 0.5 * x[:, 2]
    a /= a.sum()
    y = fibonacci_nodes(3200)
    w = np.full(3200, 1.0 / 3200)
    r = semidiscrete_w2(x, a, y, w)
    exact = ot.emd2(a, w, cost_matrix(x, y, cost="chordal"))
    assert r["converged"] and not r["stalled"]
    assert r["lo"] - 1e-12 <= exact <= r["hi"] + 1e-12
    assert r["hi"] - r["lo"] <= 1e-3 * exact


def test_semidiscrete_bracket_always_valid_and_bad_input(monkeypatch):
    import functools

    import wflow.transport.semidiscrete as sd

    rng = np.random.default_rng(3)
    mu = Atoms(uniform(40, 3, rng))
    fine = Atoms(fibonacci_nodes(1600), 1.0 + 0.5 * fibonacci_nodes(1600)[:, 0])
    r = r_design = wasserstein_result(mu, fine, method="semidiscrete", cost="chordal")
    exact = wasserstein(mu, fine, method="emd", cost="chordal")
    assert r.info["lower"] - 1e-12 <= exact <= r.info["upper"] + 1e-12
    assert r.error_bound <= 1e-3 * exact
    # uneven atom weights (0.1 to 1) against i.i.d. fine atoms: converged, 3e-5 wide (when the
    # softmax weighed atoms by a_i^(1/eps) these stalled after 5 failed line searches)
    hard = _random_sphere(rng, 1600)
    for nu in (hard, Atoms(uniform(1600, 3, rng))):
        atoms = _random_sphere(rng, 40)
        r = wasserstein_result(atoms, nu, method="semidiscrete", cost="chordal")
        exact = wasserstein(atoms, nu, method="emd", cost="chordal")
        assert r.info["lower"] - 1e-12 <= exact <= r.info["upper"] + 1e-12
        assert r.info["converged"] and not r.info["stalled"]
        assert r.error_bound <= 1e-3 * exact
    # a solve stopped early warns; its bracket is still valid, only wide
    monkeypatch.setattr(sd, "semidiscrete_w2", functools.partial(sd.semidiscrete_w2, max_steps=3))
    with pytest.warns(UserWarning, match=r"Newton stopped early \(3 steps"):
        r = wasserstein_result(atoms, nu, method="semidiscrete", cost="chordal")
    assert r.info["lower"] - 1e-12 <= exact <= r.info["upper"] + 1e-12
    assert r.error_bound > 1e-3 * exact
    # within the design no line search fails
    assert not r_design.info["stalled"] and r_design.info["failed_line_searches"] <= 1
    with pytest.raises(ValueError, match="p=1"):
        wasserstein(mu, fine, 1, method="semidiscrete")
    with pytest.raises(ValueError, match="at least 2 atoms"):
        wasserstein(Atoms([[0.0, 0.0, 1.0]]), fine, method="semidiscrete")


@pytest.mark.parametrize(
    "kw, name", [({"reg": 1e-300}, "reg=1e-300"), ({"reg": 1e-3, "tol": 1e-20}, "tol=1e-20")]
)
def test_sinkhorn_refuses_a_tolerance_below_float64_resolution(kw, name):
    """At reg = 1e-300 the soft c-transforms reach a fixed point in a few passes that is not the optimal
    plan (0.2577 against the exact 0.2776, reported converged with error bound 1.9e-150): a residual
    below the potentials' rounding proves nothing, so such a request is refused."""
    X, Y = sphere.uniform(60, 3, seed=0), sphere.uniform(60, 3, seed=1)
    with pytest.raises(ValueError, match=f"sinkhorn cannot resolve {re.escape(name)}"):
        wflow.wasserstein(X, Y, method="sinkhorn", reg=kw.pop("reg"), backend="numpy", **kw)


def test_pot_imported_quietly_with_wflows_keops_folder(tmp_path):
    """POT imports GeomLoss where installed, and GeomLoss imports pykeops, which prints a CUDA
    warning on stdout and picks its own cache folder: wflow's first POT use prints nothing and
    hands pykeops wflow's folder.  A stand-in GeomLoss (on the path first) prints and records
    the folder it was given, as the real one's pykeops import does."""
    import subprocess
    import sys

    fake = tmp_path / "geomloss"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "import os\n"
        "print('[KeOps] Warning : CUDA libraries not found or could not be loaded')\n"
        "with open(os.environ['PROBE_FILE'], 'w') as f:\n"
        "    f.write(os.environ.get('KEOPS_CACHE_FOLDER', ''))\n"
    )
    code = (
        "import numpy as np\n"
        "from wflow.transport import wasserstein\n"
        "from wflow.kernels.keops_backend import keops_cache_dir\n"
        "x = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])\n"
        "v = wasserstein(x, x[::-1], method='emd')\n"
        "print(round(v, 12), keops_cache_dir())\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KEOPS", "PYKEOPS"))}
    env.update(PYTHONPATH=str(tmp_path), PROBE_FILE=str(tmp_path / "folder.txt"))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    value, folder = out.split()
    assert float(value) == 0.0  # the same two points: W_2 = 0, from POT's exact solver
    assert "KeOps" not in out
    assert (tmp_path / "folder.txt").read_text() == folder
