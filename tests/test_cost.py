"""The cost model of the numba backend's routes for tiny systems (wflow.kernels.cost) and the choices made by it."""

from __future__ import annotations

import numpy as np
import pytest

from wflow.kernels import cost, kernel_sums, numba_backend, small


def _samples(truth, rng, noise=0.0):
    shapes = [
        (B, n, m, p, q)
        for B in (1, 8, 256)
        for n, m in ((32, 32), (200, 48))
        for p, q in ((3, 3), (64, 0))
    ]
    out = []
    for (route, dt), c in truth.items():
        for B, n, m, p, q in shapes:
            t = float(cost.features(B, n, m, p, q) @ np.asarray(c))
            out.append((route, dt, B, n, m, p, q, t * (1 + noise * rng.uniform(-1, 1))))
    return out


def test_fit_recovers_the_coefficients_of_exact_times(rng):
    """Times that follow the model exactly give back its coefficients (zeros among them: the fit is
    non-negative), for every route and both dtypes; 5 % noise moves the predictions by about as much."""
    truth = {
        (r, dt): tuple(rng.uniform(0, 1) * s for s in (1e-4, 1e-6, 5e-9, 1e-10))
        for r in cost.ROUTES
        for dt in ("float32", "float64")
    }
    truth[("direct", "float32")] = (5e-4, 0.0, 0.0, 2e-10)
    got = cost.fit(_samples(truth, rng))
    assert set(got) == set(truth)
    for key, c in truth.items():
        np.testing.assert_allclose(got[key], c, rtol=1e-7, atol=1e-22)
    noisy = cost.fit(_samples(truth, rng, noise=0.05))
    for r, dt, B, n, m, p, q, t in _samples(truth, rng):
        assert abs(cost.predict(r, B, n, m, p, q, dt, noisy) / t - 1) < 0.1


def test_predict_and_cheapest_follow_the_coefficients():
    costs = {
        ("fused", "float64"): (1.0, 0.0, 0.0, 0.0),
        ("gemm", "float64"): (0.0, 0.0, 0.0, 1e-3),
        ("direct", "float64"): (0.2, 0.0, 1e-3, 0.0),
        ("blas", "float64"): (2.0, 0.0, 0.0, 0.0),
    }
    assert cost.predict("gemm", 2, 3, 4, 5, 1, np.float64, costs) == pytest.approx(
        2 * 3 * 4 * 6 * 1e-3
    )
    # (fused 1, gemm 2e-3 n^2, direct 0.2 + 1e-3 n^2, blas 2)
    assert (
        cost.cheapest(1, 2, 2, 1, 1, np.float64, costs=costs) == "gemm"
    )  # 0.008 against 0.204, 1, 2
    assert (
        cost.cheapest(1, 20, 20, 1, 1, np.float64, costs=costs) == "direct"
    )  # 0.6 against 0.8, 1, 2
    assert (
        cost.cheapest(1, 30, 30, 1, 1, np.float64, costs=costs) == "fused"
    )  # 1 against 1.8, 1.1, 2
    assert (
        cost.cheapest(1, 40, 40, 1, 1, np.float64, ("gemm", "blas"), costs) == "blas"
    )  # 3.2 against 2


@pytest.mark.parametrize(
    "call, match",
    [
        (
            lambda: cost.predict("tiled", 1, 2, 2, 1, 1, np.float64),
            "route must be one of .* got 'tiled'",
        ),
        (
            lambda: cost.predict("fused", 1, 2, 2, 1, 1, np.int64),
            "dtype must be float32 or float64, got int64",
        ),
        (lambda: cost.features(1, -2, 2, 1, 1), "n must be a non-negative integer, got -2"),
        (lambda: cost.features(1, 2, 2.5, 1, 1), "m must be a non-negative integer, got 2.5"),
        (
            lambda: cost.cheapest(1, 2, 2, 1, 1, np.float64, ()),
            "routes must name at least one route",
        ),
        (
            lambda: cost.fit([("fused", "float64", 1, 2, 2, 1, 1, 0.0)]),
            "must be finite and positive, got 0.0",
        ),
        (
            lambda: cost.fit([("fused", "float64", 1, 2, 2, 1, 1, float("nan"))]),
            "must be finite and positive, got nan",
        ),
    ],
)
def test_bad_input_is_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_routes_follow_the_model(monkeypatch, dtype):
    """choose_route and choose_method take the route the model prices cheapest (a cheapest direct or blas
    route is taken for tiny systems too); FORCE_ROUTE and FORCE_METHOD still win; beyond SMALL_MAX the size
    rule holds."""
    name = np.dtype(dtype).name
    for best in cost.ROUTES:
        costs = {
            (r, dt): ((1e-3 if r == best else 1.0), 0.0, 0.0, 0.0)
            for r in cost.ROUTES
            for dt in ("float32", "float64")
        }
        monkeypatch.setattr(cost, "COSTS", costs)
        route = numba_backend.choose_route(16, 32, 32, 8, dtype, 8)
        assert route == ("small" if best in ("fused", "gemm") else best)
        if best in ("fused", "gemm"):
            assert small.choose_method(32, 32, 8, 8, 16, dtype) == best
        monkeypatch.setattr(numba_backend, "FORCE_ROUTE", "blas")
        assert numba_backend.choose_route(16, 32, 32, 8, dtype, 8) == "blas"
        monkeypatch.setattr(numba_backend, "FORCE_ROUTE", None)
        monkeypatch.setattr(small, "FORCE_METHOD", "gemm")
        assert small.choose_method(32, 32, 8, 8, 16, dtype) == "gemm"
        monkeypatch.setattr(small, "FORCE_METHOD", None)
    assert numba_backend.choose_route(1, small.SMALL_MAX + 1, 10, 128, dtype) == "blas"
    assert numba_backend.choose_route(1, small.SMALL_MAX + 1, 10, 3, dtype) == "direct"
    assert name in ("float32", "float64")


def test_kernel_sums_price_the_values_they_compute(monkeypatch, rng):
    """The backend hands choose_route the value dimension: d with values, V's rows with V, 0 without."""
    seen = []
    real = numba_backend.choose_route
    monkeypatch.setattr(numba_backend, "choose_route", lambda *a: seen.append(a) or real(*a))
    x = rng.standard_normal((3, 10, 6))
    w = np.full((3, 10), 0.1)
    kernel_sums(x, x, w, 1.0, backend="numba")
    kernel_sums(x, x, w, 1.0, backend="numba", values=False)
    kernel_sums(x, x, w, 1.0, backend="numba", V=rng.standard_normal((2, 6)))
    assert [a[-1] for a in seen] == [6, 0, 2]
    assert all(a[:4] == (3, 10, 10, 6) for a in seen)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_shipped_coefficients_pick_the_measured_fastest_method(dtype):
    """The coefficients shipped (fitted on the development machine) against that machine's route tables
    (benchmarks/SMALL.md, measured on shapes the fit did not see): n = 32, 256 systems, the compiled
    pass at d = 3 and 8 (1.4-1.7x faster than the GEMMs), the GEMMs at d = 128 and 1024 (1.5-1.9x);
    one system of 40 tokens at d = 48: the compiled pass (1.4x); never the direct or blas route there."""
    for d, B, n, want in (
        (3, 16, 64, "fused"),
        (8, 256, 32, "fused"),
        (128, 256, 32, "gemm"),
        (1024, 256, 32, "gemm"),
        (128, 2048, 32, "gemm"),
        (48, 1, 40, "fused"),
    ):
        assert cost.cheapest(B, n, n, d, d, dtype) == want, (d, B, n)
