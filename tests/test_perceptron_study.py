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


def test_every_run_is_a_part_and_is_reused(tmp_path):
    """The plan lists each run of the study once (41 in quick mode, 248 in full); a run through the study's
    parts equals run_paper and a second request reads it back without running."""
    from wflow.studies.parts import Parts

    quick, full = P._plan(True), P._plan(False)
    for plan, count in ((quick, 41), (full, 248)):
        keys = {str(P._Runs._key(P._Runs._args(*c, **kw))) for c, kw in plan["calls"]}
        assert len(plan["calls"]) == count == len(keys)
    parts = Parts(tmp_path, "perceptron", quick=True)
    runs = P._Runs(parts)
    a = runs(1.0, 1, d=2, N=8, seeds=2, t_max=5.0)
    b = runs(1.0, 1, d=2, N=8, seeds=2, t_max=5.0)
    direct = P.run_paper(1.0, 1, d=2, N=8, seeds=2, t_max=5.0)
    assert parts.computed == 1 and parts.reused == 1
    np.testing.assert_array_equal(a["x"], direct["x"])
    np.testing.assert_array_equal(b["x"], direct["x"])
    assert (a["settled"], a["t_stop"], a["threshold"]) == (
        direct["settled"],
        direct["t_stop"],
        direct["threshold"],
    )
    assert [len(c[1]) for c in a["clusters"]] == [len(c[1]) for c in direct["clusters"]]
