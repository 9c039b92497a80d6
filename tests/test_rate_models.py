"""fit_rate_models: the slope's interval and the two rate models of W2 against N; the mean-field table."""

import numpy as np
import pytest
from scipy import stats

from wflow.studies.mean_field import _rate_models_section
from wflow.studies.report import fit_rate_models

N = np.repeat([100.0, 1000.0, 10_000.0, 100_000.0], 3)


def test_exact_akt_data_names_the_log_model():
    fit = fit_rate_models(N, 0.7 * np.sqrt(np.log(N) / N))
    assert fit.better == "sqrt(log N/N)"
    assert fit.C_log == pytest.approx(0.7, rel=1e-12)
    assert fit.rms_log < 1e-14
    # log residuals of N^-1/2 are those of sqrt(log N) about its mean: 0.1713 on these N
    assert fit.rms_sqrt == pytest.approx(0.5 * np.std(np.log(np.log(N))), rel=1e-12)
    assert fit.rms_sqrt == pytest.approx(0.1713, abs=1e-4)


def test_exact_inverse_root_data_names_the_root_model():
    fit = fit_rate_models(N, 2.5 * N**-0.5)
    assert fit.better == "N^-1/2"
    assert fit.C_sqrt == pytest.approx(2.5, rel=1e-12)
    assert fit.rms_sqrt < 1e-14
    assert fit.rms_log == pytest.approx(0.5 * np.std(np.log(np.log(N))), rel=1e-12)
    assert fit.slope == pytest.approx(-0.5, abs=1e-12)
    assert fit.half < 1e-12


def test_slope_interval_is_linregress_stderr_times_t_and_covers_the_truth():
    rng = np.random.default_rng(0)
    n = np.repeat([100.0, 400.0, 1600.0, 6400.0, 25600.0], 8)
    err = 3.0 * n**-0.45 * np.exp(0.1 * rng.standard_normal(len(n)))
    fit = fit_rate_models(n, err)
    res = stats.linregress(np.log(n), np.log(err))
    assert fit.slope == pytest.approx(res.slope, rel=1e-12)
    assert fit.half == pytest.approx(stats.t.ppf(0.975, len(n) - 2) * res.stderr, rel=1e-12)
    assert fit.slope - fit.half <= -0.45 <= fit.slope + fit.half
    assert 0.005 < fit.half < 0.05


def test_two_points_give_no_interval():
    fit = fit_rate_models(np.array([100.0, 1000.0]), np.array([0.1, 0.03]))
    assert fit.half == np.inf
    assert fit.slope == pytest.approx(np.log10(0.3), rel=1e-12)


@pytest.mark.parametrize(
    ("N", "err", "match"),
    [
        (np.array([1.0, 10.0]), np.array([0.1, 0.1]), "N must"),
        (np.array([10.0, 10.0]), np.array([0.1, 0.2]), "N must"),
        (np.array([10.0, 100.0]), np.array([0.1, np.nan]), "err must"),
        (np.array([10.0, 100.0]), np.array([0.1]), "shapes"),
    ],
)
def test_bad_input_names_the_argument(N, err, match):
    with pytest.raises(ValueError, match=match):
        fit_rate_models(N, err)


def test_mean_field_table_fits_s1_and_semidiscrete_s2_rows_only():
    rows = [
        {"sphere": "S1", "model": "SA", "start": "iid", "t": 1.0, "N": n, "W2": 0.4 * n**-0.5}
        for n in (100, 1000, 10_000)
    ]
    rows += [  # S2 semi-discrete: exactly the AKT rate, two points
        {
            "sphere": "S2",
            "model": "USA",
            "start": "iid",
            "t": 0.0,
            "N": n,
            "W2": 0.2 * np.sqrt(np.log(n) / n),
            "W2_method": "semidiscrete",
        }
        for n in (100, 1000)
    ]
    rows += [  # not fitted: S2 EMD (floored), S2 without W2, the quadrature start
        {"sphere": "S2", "model": "SA", "start": "iid", "t": 2.0, "N": 100, "W2": 0.1},
        {"sphere": "S2", "model": "SA", "start": "iid", "t": 1.0, "N": 100, "W2": np.nan},
        {"sphere": "S1", "model": "SA", "start": "quadrature", "t": 2.0, "N": 16, "W2": 0.01},
    ]
    table = _rate_models_section(rows).splitlines()[-2:]
    s1, s2 = (line.split(" | ") for line in table)
    assert s1[0] == "| S1 SA t=1" and s1[3] == "-0.500" and s1[-1] == "N^-1/2 |"
    assert s2[0] == "| S2 USA t=0" and s2[4] == "none (2 points)"
    assert s2[7] == "0.2" and s2[8] == "0" and s2[-1] == "sqrt(log N/N) |"
    assert len(_rate_models_section(rows).splitlines()) == 8
