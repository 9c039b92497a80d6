"""Parameters float64 cannot honour are refused up front, inputs of the wrong dtype are refused
alike everywhere, stores keep the run's precision, and compiled kernels give the same bits whatever
numba's cache holds (issue 51, items 3-5)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from wflow import USA, CircleMesh, Density
from wflow.errors import SolverError
from wflow.solvers.jko import jko
from wflow.solvers.jko.stepper import smallest_eps

BK = "numpy"


@pytest.fixture(scope="module")
def bump32():
    return Density.from_function(CircleMesh(32), lambda x: 1 + 0.5 * x[:, 0])


# --------------------------------------------------------------------------- item 3: jko's eps and tau
def test_jko_eps_floor_is_the_float64_rounding_of_the_neighbour_kernel_entry():
    """32 cells on the circle: c_nn = h^2 = (2 pi / 32)^2 and e^(-c_nn/eps) = 2^-53 at
    eps = h^2 / (53 log 2) = 1.04944e-3."""
    eps_min, c_nn = smallest_eps(CircleMesh(32).centers)
    h2 = (2 * np.pi / 32) ** 2
    assert c_nn == pytest.approx(h2, rel=1e-12)
    assert eps_min == pytest.approx(h2 / (53 * math.log(2)), rel=1e-12)
    assert math.exp(-c_nn / eps_min) == pytest.approx(2.0**-53, rel=1e-12)
    eps_chord, c_chord = smallest_eps(CircleMesh(32).centers, "chordal")
    assert c_chord == pytest.approx(4 * math.sin(np.pi / 32) ** 2, rel=1e-12)


def test_jko_refuses_an_eps_that_locks_every_cell(bump32):
    """eps = 1e-3 on 32 cells moved an L1 mass of 1e-13 in 20 'converged' steps: refused up front,
    naming eps, its value, h^2 and the smallest eps that moves mass."""
    with pytest.raises(ValueError) as err:
        jko(USA(2.0), bump32, 0.05, 20, eps=1e-3, backend=BK)
    msg = str(err.value)
    for part in ("eps=0.001", "0.00104944", "h^2 = 0.03855", "eps >= 0.00105"):
        assert part in msg, msg


def test_jko_flags_a_step_whose_eps_locks_the_mass_in_its_cells(bump32):
    """Above the float64 floor but well below h^2 (tau |v| < h/2) the entropic plan keeps the mass in
    its cells: eps = 1.06e-3 moved an L1 mass of 1e-10 in 'converged' steps, status 0.  The step
    compares the mass its plan moved between cells with what the flow moves out of them."""
    with pytest.raises(SolverError) as err:
        jko(USA(2.0), bump32, 0.05, 2, eps=1.06e-3, backend=BK)
    msg = str(err.value)
    for part in ("locked the mass in its cells", "eps=0.00106", "h^2 = 0.03855", "2 h^2 = 0.07711"):
        assert part in msg, msg
    r = jko(USA(2.0), bump32, 0.05, 2, eps=1.06e-3, backend=BK, throw=False)
    assert r.status == -1 and "locked" in r.message
    # a fifth of h^2 moves a third of the default's mass per step: still flagged; half of h^2 moves
    # 0.9 of it and is taken, as is any eps when tau |v| > h (exact transport moves whole cells)
    h2 = (2 * np.pi / 32) ** 2
    with pytest.raises(SolverError, match="locked"):
        jko(USA(2.0), bump32, 0.05, 1, eps=0.2 * h2, backend=BK)
    for eps, tau in ((0.5 * h2, 0.05), (0.1 * h2, 0.4)):
        assert jko(USA(2.0), bump32, tau, 1, eps=eps, backend=BK).status == 0


def test_jko_refuses_a_tau_whose_residual_float64_cannot_resolve(bump32):
    """tau = 1e-300 ran to a residual of 3e+282 and advised a smaller tau; the residual's rounding
    u C_max / (2 tau) exceeds tol below tau = 2^-53 pi^2 / (2 tol) = 5.48e-10."""
    with pytest.raises(ValueError, match=r"tau=1e-300 is below 5\.48e-10"):
        jko(USA(2.0), bump32, 1e-300, 1, backend=BK)
    with pytest.raises(ValueError, match=r"tau=1e-12 is below 5\.48e-08"):
        jko(USA(2.0), bump32, 1e-12, 1, tol=1e-8, backend=BK)
    assert jko(USA(2.0), bump32, 1e-9, 1, backend=BK).status == 0


# --------------------------------------------------------------------------- item 4: one dtype rule
def _entries():
    """(argument, call) pairs: each call gets one bad array ``bad`` in the argument named."""
    import wflow
    from wflow.kernels import kernel_sums
    from wflow.transport.multiscale import certified_w2
    from wflow.transport.semidiscrete import semidiscrete_w2

    x = wflow.sphere.fibonacci_nodes(20)
    y = wflow.sphere.fibonacci_nodes(200)
    a, w = np.full(20, 0.05), np.full(200, 0.005)
    mesh = CircleMesh(16)
    return [
        ("x: points", lambda bad: certified_w2(x.astype(bad), y)),
        ("y: weights", lambda bad: certified_w2(x, y, None, w.astype(bad))),
        ("a", lambda bad: semidiscrete_w2(x, a.astype(bad), y, w)),
        ("y", lambda bad: semidiscrete_w2(x, a, y.astype(bad), w)),
        (
            "f's values",
            lambda bad: Density.from_function(mesh, lambda p: (1 + p[:, 0]).astype(bad)),
        ),
        ("f", lambda bad: Density.uniform(mesh).integrate(np.ones(16).astype(bad))),
        ("weights", lambda bad: kernel_sums(x, x, a.astype(bad), 1.0, backend="numpy")),
        (
            "reference",
            lambda bad: jko(
                None, Density.uniform(mesh), 0.05, 1, kappa=1.0, reference=mesh.areas.astype(bad)
            ),
        ),
    ]


@pytest.mark.parametrize("bad", [complex, object])
def test_complex_and_object_inputs_are_refused_alike(bad):
    """certified_w2 certified the distance between the real parts of complex points (a NumPy
    ComplexWarning the only sign) and took object arrays; so did the others listed here."""
    import warnings

    name = np.dtype(bad).name
    for arg, call in _entries():
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (no ComplexWarning on the way to the error)
            with pytest.raises(TypeError) as err:
                call(bad)
        assert str(err.value) == f"{arg} must be real (a float or integer dtype), got {name}", arg


def test_integer_inputs_are_still_taken():
    """The rule refuses complex and object, not integers: points written [[1, 0], [0, 1]] convert."""
    from wflow.transport.multiscale import certified_w2

    x = np.array([[1, 0], [0, 1], [-1, 0], [0, -1]])
    y = np.sqrt(0.5) * np.array([[1.0, 1.0], [-1.0, 1.0], [-1.0, -1.0], [1.0, -1.0]])
    r = certified_w2(x, y, tol=1e-3)  # each atom moves by pi/4
    assert r["certified"] and r["lower"] <= np.pi / 4 <= r["upper"] < np.pi / 4 * (1 + 1e-3)


# --------------------------------------------------------------------------- item 4: stores keep the precision
@pytest.mark.parametrize(
    "method, kw", [("dopri5", {}), ("euler-maruyama", {"dt": 0.05, "kappa": 8.0, "seed": 3})]
)
def test_float32_points_store_and_resume_what_the_run_computed(tmp_path, method, kw):
    """float32 initial points, a solver that computes in float64: the store held float32 (the first
    snapshot's dtype), so load and resume differed from the run by 3e-8 at every save."""
    import wflow
    from wflow.io import ZarrRecorder

    x0 = wflow.sphere.uniform(12, 3, seed=0).astype(np.float32)
    ts = [0.0, 0.25, 0.5, 0.75, 1.0]
    run = dict(save_at=ts, method=method, backend=BK, **kw)
    full = wflow.simulate(wflow.SA(2.0), x0, 1.0, **run)
    assert np.asarray(full.points).dtype == np.float64
    path = tmp_path / "cut.zarr"
    cut = wflow.simulate(
        wflow.SA(2.0), x0, 1.0, trackers=[ZarrRecorder(path), lambda t, mu: t >= 0.5], **run
    )
    assert cut.status == 1 and len(cut) == 3
    loaded = wflow.load(path)
    assert np.asarray(loaded.points).dtype == np.float64
    np.testing.assert_array_equal(np.asarray(loaded.points), np.asarray(full.points)[:3])
    back = wflow.resume(path)
    np.testing.assert_array_equal(np.asarray(back.points), np.asarray(full.points))


def test_saveat_dtype_still_asks_for_float32(tmp_path):
    """The store's precision changes only when a save specification asks for it."""
    import wflow

    x0 = wflow.sphere.uniform(12, 3, seed=0)
    spec = wflow.SaveAt(ts=[0.0, 0.5], dtype=np.float32)
    tr = wflow.simulate(wflow.SA(2.0), x0, 0.5, save_at=spec, backend=BK)
    assert np.asarray(tr.points).dtype == np.float32


# --------------------------------------------------------------------------- item 3: transport parameters
def test_certified_w2_refuses_a_reg_float64_cannot_resolve():
    """reg=1e-300 ran to an uncertified "diverged" answer at eps = 1.9e-309 (subnormal); refused up front
    by wasserstein(method="sinkhorn")'s rule: potentials of size pi^2 carry 2^-46 pi^2 = 1.40e-13 of
    rounding, so reg >= 1.40e-12 keeps each kernel entry within 10 %."""
    import wflow
    from wflow.transport.multiscale import certified_w2

    x, y = wflow.sphere.fibonacci_nodes(20), wflow.sphere.fibonacci_nodes(200)
    floor = 2.0**-46 * np.pi**2
    assert f"{10 * floor:.1e}" == "1.4e-12"
    for reg in (1e-300, 1.3e-12):
        with pytest.raises(ValueError, match=rf"reg={reg!r}.*use reg >= 1\.4e-12"):
            certified_w2(x, y, reg=reg)
    with pytest.raises(ValueError, match=r"use reg >= 5\.7e-13"):  # chordal: 2^-46 * 4
        certified_w2(x, y, reg=1e-13, cost="chordal")


def test_wasserstein_refuses_a_p_whose_cost_overflows():
    """p=1e6: emd spoke of "measures this large" at n = 20 and sinkhorn raised a bare OverflowError;
    pi^p overflows float64 above p = log(max float) / log(pi) = 620.044 (chordal: 2^p, 1024)."""
    import wflow
    from wflow.transport import wasserstein

    x, y = wflow.sphere.uniform(20, 3, seed=0), wflow.sphere.uniform(20, 3, seed=1)
    for method in ("auto", "sinkhorn", "emd"):
        with pytest.raises(ValueError, match=r"p=1000000\.0 is above 620\.044"):
            wasserstein(x, y, p=1e6, method=method)
    with pytest.raises(ValueError, match=r"p=1025\.0 is above 1024"):
        wasserstein(x, y, p=1025.0, cost="chordal")
    assert np.isfinite(wasserstein(x, y, p=620.0))


# --------------------------------------------------------------------------- item 5: the same bits always
_BITS = """
import hashlib
import numpy as np
from wflow.kernels import kernel_sums
from wflow.sphere import uniform
for n, m, d in ((12, 12, 3), (300, 7, 3), (40, 5000, 64)):  # the small, direct and BLAS routes
    x, y = uniform(n, d, seed=1), uniform(m, d, seed=2)
    s = kernel_sums(x, y, np.full(m, 1.0 / m), 5.0, backend="numba")
    print(n, m, d, hashlib.sha1(s.log_scale.tobytes() + s.mass.tobytes() + s.vector.tobytes()).hexdigest())
"""


def test_numba_kernel_sums_same_bits_cold_cache_warm_cache_and_one_thread(tmp_path):
    """kernel_sums(backend="numba") from an empty numba cache (compiling, default threads) and again
    from the warm cache with NUMBA_NUM_THREADS=1: the same bits on each route.  The BLAS route split
    its columns by the thread count (its partial sums merged in another order: 5.6e-16 apart)."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"))
    env.pop("NUMBA_NUM_THREADS", None)
    cmd = [sys.executable, "-c", _BITS]
    cold = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert cold.returncode == 0, cold.stderr[-2000:]
    assert any((tmp_path / "numba-cache").rglob("*.nbi"))  # it compiled into the fresh cache
    warm = subprocess.run(
        cmd, env=dict(env, NUMBA_NUM_THREADS="1"), capture_output=True, text=True, timeout=600
    )
    assert warm.returncode == 0, warm.stderr[-2000:]
    lines = cold.stdout.splitlines()
    assert len(lines) == 3
    assert warm.stdout.splitlines() == lines


_SMALL_BITS = """
import hashlib
import numpy as np
import wflow
from wflow.kernels import kernel_sums
x = wflow.sphere.uniform(12, 3, seed=1)
s = kernel_sums(x, x, np.full(12, 1 / 12), 5.0, backend="numba")  # the small route: one compiled pass
print(wflow.__file__, hashlib.sha1(s.log_scale.tobytes() + s.mass.tobytes() + s.vector.tobytes()).hexdigest())
"""


def test_a_warm_numba_cache_is_not_reused_once_a_callee_changed(tmp_path):
    """numba keys a cached kernel on its own file; the small route's pass (wflow/kernels/dense.py) inlines
    the exponential of wflow/kernels/jit.py.  Change one coefficient of that exponential in a copy of
    the package: the warm cache served the old pass (the bits of before the change), an empty cache
    the new one.  Now every wflow kernel's cache entry is stamped with all compiled sources (about
    15 s: three runs, each compiling the pass)."""
    import os
    import shutil
    import subprocess
    import sys

    import wflow

    src = tmp_path / "src"
    shutil.copytree(
        os.path.dirname(wflow.__file__), src / "wflow", ignore=shutil.ignore_patterns("__pycache__")
    )
    env = dict(os.environ, PYTHONPATH=str(src), NUMBA_CACHE_DIR=str(tmp_path / "warm"))

    def bits(cache: str) -> str:
        run = subprocess.run(
            [sys.executable, "-c", _SMALL_BITS],
            env=dict(env, NUMBA_CACHE_DIR=str(tmp_path / cache)),
            cwd=tmp_path,  # (not the checkout: python -c looks in the working folder first)
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert run.returncode == 0, run.stderr[-2000:]
        where, digest = run.stdout.split()
        assert where.startswith(str(src))  # the copy ran
        return digest

    before = bits("warm")
    jit = src / "wflow" / "kernels" / "jit.py"
    text = jit.read_text()
    assert text.count("p = p * r + 1.0000000000000004\n") == 1
    jit.write_text(
        text.replace("p = p * r + 1.0000000000000004\n", "p = p * r + 1.0000000000000007\n")
    )
    after_warm, after_cold = bits("warm"), bits("cold")
    assert after_cold != before  # the change moves the last bits
    assert after_warm == after_cold


def test_jko_emd_says_it_stalled_instead_of_asking_for_more_iterations(bump32):
    """method="emd" on 32 cells kept stepping by 1e-16 (J unchanged) until max_iter and then advised
    raising it; whatever max_iter, it now stops at the first step that cannot lower J and says so."""
    for max_iter in (200, 1000):
        r = jko(USA(2.0), bump32, 0.05, 1, method="emd", max_iter=max_iter, backend=BK, throw=False)
        s = r.steps[0]
        assert r.status == -1 and s.stalled and not s.converged
        assert s.iterations == 1
        assert "stalled" in r.message and "max_iter would not help" in r.message
        assert "raise max_iter" not in r.message


def test_the_cli_key_jko_eps_is_refused_before_the_run_starts(tmp_path):
    """`wflow run --set jko.eps=1e-3` on 32 circle cells: one line, exit 2, no run folder."""
    import subprocess
    import sys

    sets = ["problem=jko", "jko.eps=1e-3", "mesh.resolution=32", "init.d=2", "model.type=USA"]
    cmd = [
        sys.executable,
        "-m",
        "wflow.cli",
        "run",
        "--no-progress",
        "--out",
        str(tmp_path / "out"),
    ]
    for s in sets:
        cmd += ["--set", s]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2
    assert run.stderr.splitlines() == [
        "wflow: error: config key jko.eps: "
        + str(
            pytest.raises(
                ValueError, jko, USA(2.0), Density.uniform(CircleMesh(32)), 0.05, 1, eps=1e-3
            ).value
        )
    ]
    assert not (tmp_path / "out").exists()


def test_cost_matrix_refuses_complex_and_object_points():
    """cost_matrix cast complex points to their real parts with a ComplexWarning and took object arrays."""
    from wflow.sphere import cost_matrix

    for bad in (np.array([[1j, 0.0]]), np.array([[1.0, 0.0]], dtype=object)):
        with pytest.raises(TypeError, match=r"x must be real .*got (complex128|object)"):
            cost_matrix(bad)
        with pytest.raises(TypeError, match=r"y must be real"):
            cost_matrix([[1.0, 0.0]], bad)
    np.testing.assert_allclose(cost_matrix([[1, 0], [0, 1]], p=1), [[0, np.pi / 2], [np.pi / 2, 0]])


def test_bert_layer_random_refuses_heads_that_do_not_divide_d():
    """BertLayer.random(3, 0, 4) raised a bare ZeroDivisionError."""
    from wflow.models import BertLayer

    with pytest.raises(ValueError, match="heads must be an integer >= 1, got 0"):
        BertLayer.random(3, 0, 4)
    with pytest.raises(ValueError, match=r"heads must divide d .* d=3, heads=2"):
        BertLayer.random(3, 2, 4)
    layer = BertLayer.random(4, 2, 3, seed=0)
    assert layer.attention.Q.shape == (2, 2, 4)


def test_a_perceptron_too_large_for_float64_is_refused_in_one_line(tmp_path, capsys):
    """perceptron.scale=1e150 printed six lines of NumPy overflow warnings, then "x and y must be finite";
    weights whose velocity bound |W|(|A| + |b|) has no finite square are refused up front."""
    import wflow
    from wflow.cli import main

    A = np.eye(3)[:2]
    with pytest.raises(ValueError, match=r"too large for float64: its velocity can reach"):
        wflow.Perceptron(1e80 * A.T, 1e80 * A)
    assert wflow.Perceptron(1e70 * A.T, 1e70 * A).W.shape == (3, 2)  # 1e140: its square is finite
    args = ["run", "--out", str(tmp_path / "r"), "--set", "perceptron.m=8"]
    assert main([*args, "--set", "perceptron.scale=1e150"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "too large for float64" in err[0], err
    assert not (tmp_path / "r").exists()
