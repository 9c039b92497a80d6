"""The normalization study's helpers: rate fits on exact laws, pair gaps, and one part against theory."""

import numpy as np
import pytest

from wflow import theory
from wflow.studies import normalization as nm
from wflow.studies.parts import Parts


@pytest.mark.parametrize(
    "law,clock,rate",
    [
        ("exponential", lambda t: t, 2.0),
        ("exponential-sqrt", lambda t: np.sqrt(t + 1), 4.0),
        ("power", np.log, 2.0),
    ],
)
def test_fit_rate_recovers_exact_laws(law, clock, rate):
    t = np.logspace(-1, 3, 400) if law == "power" else np.linspace(0, 200, 2000)
    gap = 7.0 * np.exp(-rate * clock(t))
    got, m = nm.fit_rate(t, gap, law, window=(1e-12, 1e-2))
    assert m >= 10 and got == pytest.approx(rate, rel=1e-12)
    assert np.isnan(nm.fit_rate(t, gap, law, window=(1e-300, 1e-299))[0])
    with pytest.raises(ValueError, match="law"):
        nm.fit_rate(t, gap, "linear")


def test_pair_gaps_keep_small_gaps():
    """|x - y|^2 / 2 equals 1 - cos without cancellation: two tokens at angle 1e-7."""
    a = 1e-7
    x = np.array([[1.0, 0.0], [np.cos(a), np.sin(a)]])
    assert nm.pair_gaps(3.0 * x) == pytest.approx(1 - np.cos(a), rel=1e-8)
    x = theory.equiangular_configuration(5, 0.3)
    assert nm.pair_gaps(x) == pytest.approx(0.7, abs=1e-14)


def test_equiangular_part_post_ln_matches_theory(tmp_path):
    """Post-LN on 4 equiangular tokens: particles = reduced ODE to 1e-8, fitted rate 2 within 2e-3, stored once."""
    calls = []

    def compute():
        calls.append(1)
        return nm.equiangular_part("post-ln", 4, 1.0, 0.0, 12.0)

    parts = Parts(tmp_path, "normalization", quick=True)
    p = parts.get({"scheme": "post-ln"}, compute)
    p2 = Parts(tmp_path, "normalization", quick=True).get({"scheme": "post-ln"}, compute)
    assert len(calls) == 1 and np.array_equal(p["gap"], p2["gap"])
    assert np.max(np.abs(p["gap"] - p["gap_ode"])) < 1e-8
    law = theory.equiangular_asymptotics(1.0, 4, "SA", "post-ln", rho0=0.0)
    assert nm.fit_rate(p["t"], p["gap"], law.law)[0] == pytest.approx(2.0, rel=2e-3)


@pytest.mark.parametrize("scheme", ["post-ln", "sqrt"])
def test_collapse_part_follows_the_staircase_to_one_point(scheme):
    """Random tokens through every merge to one point (BDF with the exact Jacobian in span coordinates): the
    cluster count falls one merge at a time from n to 1, the merge times equal those of an independent
    explicit run (wflow.simulate, dopri5 in the full dimension, no Jacobian), and the late rate is the
    theory's (2 in t for Post-LN, 4 in sqrt(t + 1) for sqrt-scaling)."""
    from wflow import SA, simulate
    from wflow.schemes import Normalized
    from wflow.sphere import uniform
    from wflow.studies.normalization import collapse_part, fit_scheme_rate, scheme_law

    n, d, beta = 8, 16, 4.0
    p = collapse_part(scheme, n, d, beta, 0)
    assert p["collapsed"] and p["clusters"][0] == n and p["clusters"][-1] == 1
    assert np.all(np.diff(p["clusters"]) <= 0)
    rate = fit_scheme_rate(p["t_fit"], p["gap_fit"], scheme, scheme_law(beta, n, scheme, p["rho0"]))
    assert abs(rate / (2.0 if scheme == "post-ln" else 4.0) - 1) < 1e-3
    assert p["radius_drift"] < 1e-6
    # the first merges against an explicit run on the same grid
    t = p["t"][p["t"] <= p["merge_times"][min(2, len(p["merge_times"]) - 1)] * 1.2]
    ref = simulate(
        Normalized(SA(beta), scheme),
        uniform(n, d, seed=0),
        float(t[-1]),
        save_at=t,
        method="dopri5",
        rtol=1e-10,
        atol=1e-12,
        backend="numpy",
        diagnostics=(),
    )
    x = np.asarray(ref.points)
    i, j = np.triu_indices(n, 1)
    gaps = 0.5 * np.sum((x[:, i] - x[:, j]) ** 2, axis=-1)
    np.testing.assert_allclose(gaps.mean(axis=-1), p["gap"][: t.size], rtol=1e-5)


def test_sqrt_collapse_in_its_own_clock_equals_the_run_in_t():
    """sqrt-scaling is integrated in tau = 2(sqrt(t+1) - 1), where it is Post-LN; integrated in t instead
    (the field divided by sqrt(t+1)) it gives the same staircase and collapse time up to BDF's error,
    and the tau run is Post-LN's own run with its times mapped."""
    from wflow.studies.normalization import collapse_part, sqrt_clock

    n, d, beta = 8, 16, 4.0
    tau = collapse_part("sqrt", n, d, beta, 0)
    direct = collapse_part("sqrt", n, d, beta, 0, own_clock=False)
    post = collapse_part("post-ln", n, d, beta, 0)
    assert tau["collapsed"] and direct["collapsed"]
    assert tau["t_stop"] == pytest.approx(direct["t_stop"], rel=1e-4)
    assert len(tau["merge_times"]) == len(direct["merge_times"])
    assert tau["t_half"] == pytest.approx(direct["t_half"], rel=1e-4)
    assert sqrt_clock(tau["t_stop"]) == pytest.approx(post["t_stop"], rel=1e-12)


def test_collapse_part_rejects_radius_schemes():
    from wflow.studies.normalization import collapse_part

    with pytest.raises(ValueError, match="scheme must be one of"):
        collapse_part("pre-ln", 4, 8, 1.0, 0)
