"""The default distance is certified and shows its bracket (issue 52, item 5).

Above ``max_emd`` atoms ``method="auto"`` ran Sinkhorn, whose value hides a bias; it now takes a
certified bracket for W_2 (multiscale), and :func:`wasserstein` returns a float that shows the
interval it is known to lie in."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import wflow
from wflow.transport import Distance, wasserstein, wasserstein_result


def _exact(x, y, a=None, b=None):
    mu = wflow.Atoms(x, a) if a is not None else x
    nu = wflow.Atoms(y, b) if b is not None else y
    return wasserstein_result(mu, nu, method="emd", allow_large=True).value


def test_small_measures_stay_exact_and_say_so():
    x, y = wflow.sphere.uniform(30, 3, seed=0), wflow.sphere.uniform(40, 3, seed=1)
    d = wasserstein(x, y)
    assert isinstance(d, Distance) and d.method == "emd" and d.lower == d.upper == float(d)
    assert float(d) == pytest.approx(_exact(x, y), rel=1e-12)
    assert repr(d).endswith("(W_2 exact, emd)")


def test_auto_above_max_emd_is_a_certified_bracket_holding_the_exact_value():
    x, y = wflow.sphere.uniform(300, 3, seed=2), wflow.sphere.uniform(300, 3, seed=3)
    d = wasserstein(x, y, max_emd=100)
    exact = _exact(x, y)
    assert d.method == "multiscale"
    assert d.lower <= exact <= d.upper and (d.upper - d.lower) / exact < 2e-3
    assert f"in [{d.lower:.6g}, {d.upper:.6g}], multiscale)" in repr(d)


def test_other_orders_keep_sinkhorn_with_its_bias_bound():
    x, y = wflow.sphere.uniform(120, 3, seed=5), wflow.sphere.uniform(120, 3, seed=6)
    d = wasserstein(x, y, p=1, max_emd=100, backend="numpy")
    assert d.method == "sinkhorn" and "W_1 in [" in repr(d)
    exact = wasserstein_result(x, y, p=1, method="emd").value
    assert d.lower <= exact <= d.upper


def test_a_distance_is_a_float():
    x, y = wflow.sphere.uniform(30, 3, seed=0), wflow.sphere.uniform(40, 3, seed=1)
    d = wasserstein(x, y)
    back = pickle.loads(pickle.dumps(d))
    assert isinstance(back, Distance) and back == d and back.method == "emd"
    assert np.asarray([d, 2 * d]).dtype == np.float64 and 2 * d == 2 * float(d)
    assert f"{d:.3f}" == f"{float(d):.3f}"


def test_a_distance_solve_that_takes_seconds_says_so_on_stderr(monkeypatch, capsys):
    """One line on stderr before a solve of at least NOTICE_PAIRS[method] pairs; none below it,
    none with WFLOW_NOTICES=0, and the value is unchanged."""
    from wflow.transport import _dispatch

    x, y = wflow.sphere.uniform(30, 3, seed=0), wflow.sphere.uniform(20, 3, seed=1)
    quiet = wasserstein(x, y)
    assert capsys.readouterr().err == ""  # 600 pairs: far below the exact solver's threshold
    monkeypatch.setitem(_dispatch.NOTICE_PAIRS, "emd", 600)
    assert wasserstein(x, y) == quiet
    assert (
        capsys.readouterr().err == "wflow: W_2 by emd between 30 and 20 atoms (seconds or more)\n"
    )
    monkeypatch.setenv("WFLOW_NOTICES", "0")
    assert wasserstein(x, y) == quiet
    assert capsys.readouterr().err == ""
