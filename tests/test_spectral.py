"""Spectral kernel sums (wflow.kernels.spectral) against the direct sum (backend "numpy")."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import special

from wflow.kernels import BACKENDS, kernel_sums
from wflow.kernels.spectral import (
    SpectralBackend,
    _miller_extra,
    _scaled_bessel,
    _scaled_bessel_rows,
    degree_tail,
    spectral_plan,
)


def _sphere(rng, n, d):
    x = rng.normal(size=(n, d))
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _errors(sp, ref, bound, rho_bar=1.0, v=1.0):
    """Errors of mass and vector in units of e^{c_i} (the spectral scale), and the SA error."""
    f = np.exp(ref.log_scale - sp.log_scale)
    e0 = np.abs(sp.mass - ref.mass * f)
    e1 = np.abs(sp.vector - ref.vector * f[..., None]).max(axis=-1)
    sa = np.linalg.norm(sp.softmax_average() - ref.softmax_average(), axis=-1)
    sa_bound = 2 * abs(v) * rho_bar * bound / (sp.mass - bound)
    return e0, e1, sa, sa_bound


ROUND = 2e-13  # rounding allowance beside the truncation bound


@pytest.mark.parametrize("engine", ["numba", "numpy"])
@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("beta", [0.1, 1.0, 10.0, 100.0, -3.0])
def test_matches_direct_sum(engine, d, beta):
    rng = np.random.default_rng(0)
    x, y = _sphere(rng, 150, d), _sphere(rng, 200, d)
    w = rng.random(200)
    backend = SpectralBackend(engine)
    BACKENDS["spectral"], old = backend, BACKENDS["spectral"]
    try:
        sp = kernel_sums(x, y, w, beta, backend="spectral")
    finally:
        BACKENDS["spectral"] = old
    ref = kernel_sums(x, y, w, beta, backend="numpy")
    assert sp.backend == "spectral"
    e0, e1, sa, sa_bound = _errors(sp, ref, 1e-12)
    assert e0.max() < 1e-12 + ROUND and e1.max() < 1e-12 + ROUND
    assert np.all(sa <= sa_bound + ROUND / sp.mass)
    # USA totals (unshifted) agree relative to their bound e^{c}
    if abs(beta) <= 100:
        tot = np.abs(sp.total() - ref.total()).max(axis=-1) / np.exp(sp.log_scale)
        assert tot.max() < 1e-12 + ROUND


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("tol", [1e-3, 1e-6, 1e-9, 1e-12])
def test_error_within_stated_bound(d, tol):
    rng = np.random.default_rng(0)
    beta = 30.0
    x, y = _sphere(rng, 200, d), _sphere(rng, 200, d)
    w = rng.random(200)
    raw = SpectralBackend()
    raw.direct_fallback = False  # measure the series itself
    out = raw(_problem(x, y, w, beta, None, tol))
    sp = type(out)(out.log_scale[0], out.mass[0], out.vector[0], out.backend)
    ref = kernel_sums(x, y, w, beta, backend="numpy")
    plan = spectral_plan(d, beta, 0.0, tol)
    assert plan.bound <= tol
    e0, e1, sa, sa_bound = _errors(sp, ref, plan.bound)
    assert e0.max() <= plan.bound + ROUND and e1.max() <= plan.bound + ROUND
    assert np.all(sa <= sa_bound + ROUND / sp.mass)
    if tol >= 1e-6:  # the bound is not wildly pessimistic
        assert e0.max() > 1e-4 * plan.bound


@pytest.mark.parametrize("d", [2, 3])
def test_off_sphere_points_and_scaled_values(d):
    """Runge--Kutta stages: queries and sources off the sphere; V = v I; float32 input."""
    rng = np.random.default_rng(0)
    x = _sphere(rng, 120, d) * (1 + 0.01 * rng.normal(size=(120, 1)))
    y = _sphere(rng, 150, d) * (1 + 0.01 * rng.normal(size=(150, 1)))
    w = rng.random(150)
    v = -0.7
    V = v * np.eye(d)
    for beta in (1.0, 20.0):
        sp = kernel_sums(x, y, w, beta, V=V, backend="spectral", tol=1e-11)
        ref = kernel_sums(x, y, w, beta, V=V, backend="numpy")
        plan = BACKENDS["spectral"].plan(_problem(x, y, w, beta, V, 1e-11))
        assert plan.radial_terms > 0
        rho_bar = max(1.0, np.linalg.norm(y, axis=-1).max())
        e0, e1, sa, sa_bound = _errors(sp, ref, plan.bound, rho_bar, v)
        assert e0.max() <= plan.bound + ROUND
        assert e1.max() <= abs(v) * rho_bar * plan.bound + ROUND
        assert np.all(sa <= sa_bound + ROUND / sp.mass)
    sp32 = kernel_sums(x.astype(np.float32), y.astype(np.float32), w, 5.0, backend="spectral")
    ref = kernel_sums(x, y, w, 5.0, backend="numpy")
    assert sp32.mass.dtype == np.float32
    np.testing.assert_allclose(sp32.softmax_average(), ref.softmax_average(), atol=2e-5)


def _problem(x, y, w, beta, V, tol):
    from wflow.kernels import KernelProblem

    return KernelProblem(
        x=x[None], y=y[None], weights=w[None], beta=beta, Q=None, K=None, V=V, values=True, tol=tol
    )


def test_batches_and_mass_only():
    rng = np.random.default_rng(0)
    x = _sphere(rng, 3 * 40, 3).reshape(3, 40, 3)
    y = _sphere(rng, 3 * 50, 3).reshape(3, 50, 3)
    w = rng.random((3, 50))
    sp = kernel_sums(x, y, w, 7.0, backend="spectral", values=False)
    ref = kernel_sums(x, y, w, 7.0, backend="numpy", values=False)
    assert sp.vector is None and sp.mass.shape == (3, 40)
    np.testing.assert_allclose(sp.total_mass(), ref.total_mass(), rtol=1e-11)


def test_tiny_local_mass_rows_fall_back_to_direct_sums():
    """A query antipodal to every source at large beta: mass e^{-2 beta} relative to the bound."""
    rng = np.random.default_rng(0)
    y = np.array([0.0, 0.0, 1.0]) + 0.05 * rng.normal(size=(100, 3))
    y /= np.linalg.norm(y, axis=-1, keepdims=True)
    x = np.vstack([_sphere(rng, 20, 3), [[0.0, 0.0, -1.0]]])
    w = np.full(100, 0.01)
    sp = kernel_sums(x, y, w, 100.0, backend="spectral")
    ref = kernel_sums(x, y, w, 100.0, backend="numpy")
    np.testing.assert_allclose(sp.softmax_average(), ref.softmax_average(), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(sp.mass * np.exp(sp.log_scale - ref.log_scale), ref.mass, rtol=1e-6)


def test_large_beta_never_overflows():
    rng = np.random.default_rng(0)
    x, y = _sphere(rng, 50, 2), _sphere(rng, 60, 2)
    w = rng.random(60)
    sp = kernel_sums(x, y, w, 1000.0, backend="spectral")
    ref = kernel_sums(x, y, w, 1000.0, backend="numpy")
    assert np.all(np.isfinite(sp.mass)) and np.all(sp.mass > 0)
    np.testing.assert_allclose(sp.softmax_average(), ref.softmax_average(), atol=1e-6)


def test_bad_input_gives_clear_errors():
    rng = np.random.default_rng(0)
    x4 = _sphere(rng, 10, 4)
    with pytest.raises(ValueError, match=r"spectral.*d=4"):
        kernel_sums(x4, x4, np.ones(10), 1.0, backend="spectral")
    x3 = _sphere(rng, 10, 3)
    Q = np.diag([1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=r"spectral.*rotation-invariant"):
        kernel_sums(x3, x3, np.ones(10), 1.0, Q=Q, backend="spectral")
    with pytest.raises(ValueError, match=r"spectral.*rotation-invariant"):
        kernel_sums(x3, x3, np.ones(10), 1.0, V=np.diag([1.0, 1.0, 2.0]), backend="spectral")
    with pytest.raises(ValueError, match="tol"):
        kernel_sums(x3, x3, np.ones(10), 1.0, backend="spectral", tol=0.0)
    with pytest.raises(ValueError, match="engine"):
        SpectralBackend("fortran")


def test_auto_selection():
    """``accepts_auto`` takes large rotation-invariant problems on S^1, S^2 only."""
    from wflow.kernels import AUTO_ORDER, KernelProblem

    rng = np.random.default_rng(0)

    def problem(n, d, beta, Q=None):
        x = _sphere(rng, n, d)[None]
        return KernelProblem(
            x=x, y=x, weights=np.ones((1, n)), beta=beta, Q=Q, K=None, V=None, values=True
        )

    b = BACKENDS["spectral"]
    assert AUTO_ORDER.index("spectral") < AUTO_ORDER.index("numpy")
    assert b.accepts_auto(problem(100_000, 3, 10.0))
    assert b.accepts_auto(problem(100_000, 2, 100.0))
    assert not b.accepts_auto(problem(200, 3, 10.0))  # direct is faster
    assert not b.accepts_auto(problem(100_000, 4, 10.0))
    assert not b.accepts_auto(problem(100_000, 3, 10.0, Q=2 * np.eye(3)))


def test_coefficients_and_tails():
    # backward ratio recurrence against scipy, up to z = 2000
    for d in (2, 3):
        for z in (0.0, 1e-3, 0.5, 10.0, 300.0, 2000.0):
            K = 40 if z < 100 else 350
            rows = _scaled_bessel_rows(d, np.array([z, z]), K, _miller_extra(max(z, 1.0)))
            ref = _scaled_bessel(d, z, K)
            np.testing.assert_allclose(rows[0], ref, rtol=0, atol=1e-14 * ref.max())
    # the tails T_K(z) increase with z (used for rows with smaller z than z_max)
    zs = np.linspace(0.05, 150, 300)
    for d in (2, 3):
        for K in (0, 3, 20, 60):
            T = np.array([degree_tail(d, z, K) for z in zs])
            assert np.all(np.diff(T) >= -1e-16)
    # circle: the tail is that of the Skellam law; degree grows like sqrt(2 z log(1/tol))
    assert np.isclose(degree_tail(2, 5.0, 0), 1 - special.ive(0, 5.0))
    for beta in (10.0, 100.0, 1000.0):
        K = spectral_plan(3, beta, 0.0, 1e-12).degree
        assert K < 1.25 * np.sqrt(2 * beta * np.log(1e12)) + 10


def _with_backend(backend, *args, **kw):
    BACKENDS["spectral"], old = backend, BACKENDS["spectral"]
    try:
        return kernel_sums(*args, backend="spectral", **kw)
    finally:
        BACKENDS["spectral"] = old


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("beta", [5.0, -20.0])
def test_streamed_blocks_change_no_bit(d, beta):
    """Many small blocks per worker give the same numbers as one block per worker, bit for bit: the
    moments are added in the same order (blocks are multiples of the kernels' 128 lanes) and every
    query row is evaluated on its own.  Points off the sphere (Runge--Kutta stages) use the radial
    series (P > 0) and per-row coefficients."""
    rng = np.random.default_rng(3)
    x = _sphere(rng, 1000, d) * (1 + 1e-3 * rng.uniform(-1, 1, (1000, 1)))
    w = rng.random(1000)
    one = SpectralBackend()
    many = SpectralBackend()
    many.stream_block = 256
    assert one.plan(_problem(x, x, w, beta, None, None)).radial_terms > 0
    for values in (True, False):
        a = _with_backend(one, x, x, w, beta, values=values)
        b = _with_backend(many, x, x, w, beta, values=values)
        assert np.array_equal(a.log_scale, b.log_scale) and np.array_equal(a.mass, b.mass)
        assert values == (a.vector is not None) and (
            not values or np.array_equal(a.vector, b.vector)
        )


@pytest.mark.parametrize("d", [2, 3])
def test_streamed_blocks_against_dense_sum(d):
    """Several blocks per worker, points off the sphere, V = -I: the dense sum to 1e-12 of e^{c_i}."""
    rng = np.random.default_rng(4)
    x = _sphere(rng, 700, d) * (1 + 1e-3 * rng.uniform(-1, 1, (700, 1)))
    y = _sphere(rng, 500, d) * (1 + 1e-3 * rng.uniform(-1, 1, (500, 1)))
    w = rng.random(500)
    backend = SpectralBackend()
    backend.stream_block = 64
    beta = 8.0
    s = _with_backend(backend, x, y, w, beta, V=-np.eye(d))
    G = np.exp(beta * x @ y.T)  # the dense kernel, in float64 (beta small: no overflow)
    scale = np.exp(s.log_scale)
    assert np.abs(scale * s.mass - G @ w).max() / scale.max() < 1e-12
    assert np.abs(scale[:, None] * s.vector + (G * w) @ y).max() / scale.max() < 1e-12
    # and the numpy engine (whole arrays), the reference implementation, to rounding
    ref = _with_backend(SpectralBackend("numpy"), x, y, w, beta, V=-np.eye(d))
    np.testing.assert_allclose(s.mass, ref.mass, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(s.vector, ref.vector, rtol=1e-13, atol=1e-15)


def test_memory_estimate_and_refusal(monkeypatch):
    """The footprint is the output plus a work space that does not grow with N; a problem whose
    footprint exceeds the memory left is refused before anything is allocated."""
    from wflow.kernels import spectral

    def problem(n, d=3, values=True):
        x = np.broadcast_to(np.eye(d)[-1], (1, n, d))
        return _problem_arrays(x, values)

    b = BACKENDS["spectral"]
    out = lambda n, d=3: 8 * n * (2 + d)  # noqa: E731 - log_scale, mass, vector in float64
    for n in (10**6, 10**7, 10**8):
        assert out(n) < b.memory_bytes(problem(n)) < out(n) + 64 * 2**20
    assert b.memory_bytes(problem(10**8, values=False)) < 8 * 2 * 10**8 + 64 * 2**20
    monkeypatch.setattr(spectral, "available_memory", lambda: 1e9)
    with pytest.raises(
        ValueError, match=r"^x: 100000000 query points need about 3\.7\d* GiB.*0\.931 GiB"
    ):
        b(problem(10**8))


def _problem_arrays(x, values=True):
    from wflow.kernels import KernelProblem

    return KernelProblem(
        x=x,
        y=x,
        weights=np.broadcast_to(1.0, x.shape[:-1]),
        beta=10.0,
        Q=None,
        K=None,
        V=None,
        values=values,
    )
