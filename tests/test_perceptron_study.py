"""The perceptron study's conventions (wflow.studies.perceptron): the rescaled-kernel conversion,
the stopping callback, the sampling and the registry."""
import numpy as np
import pytest

import wflow
from wflow.studies import perceptron as P
from wflow.studies.report import STUDY_MODULES


@pytest.mark.parametrize("sign", [1, -1])
def test_paper_model_is_the_rescaled_field_in_wflow_time(sign):
    # paper: e^{beta(<x,y>-1)} attention + u_omega; wflow: factor * (USA_plain + u_{omega/factor})
    beta, d = 7.0, 2
    A, omega = P.paper_perceptron(d, 1.0, seed=0, activation="gelu")
    model, factor = P.paper_model(beta, sign, d, A=A, omega=omega, activation="gelu")
    assert factor == pytest.approx(np.exp(-beta))
    x = wflow.sphere.uniform(32, d, seed=1)
    mu = wflow.Atoms(x)
    th = x @ x.T
    raw = np.exp(beta * (th - 1)) @ x / 32 * sign
    paper = raw - np.sum(raw * x, axis=1, keepdims=True) * x
    paper = paper + wflow.Perceptron.conservative(A, omega, activation="gelu").velocity(x)
    assert np.allclose(factor * model.velocity(x, mu), paper, rtol=1e-10, atol=1e-12)
    sa, f_sa = P.paper_model(beta, sign, d, attention="SA")
    assert f_sa == 1.0 and isinstance(sa, wflow.SA)


def test_threshold_sampling_and_registry():
    assert P.cluster_threshold(1.0, 2) == pytest.approx(0.5)
    assert P.cluster_threshold(100.0, 2) == pytest.approx(0.05)
    assert P.cluster_threshold(0.01, 10) == pytest.approx(np.pi / 20)
    A, omega = P.paper_perceptron(5, 2.0, seed=3, activation="relu")
    assert A.shape == (5, 5) and omega.shape == (5,)
    assert np.allclose(np.linalg.norm(A, axis=1), 1.0)
    assert "wflow.studies.perceptron" in STUDY_MODULES


def test_settle_stop_stops_a_settled_run():
    r = P.run_paper(1.0, 1, d=2, N=32, seeds=2, t_max=200.0)
    assert r["settled"] and r["t_stop"] < 200.0
    assert all(len(c[1]) == 1 for c in r["clusters"])  # attraction at beta = 1: one atom
