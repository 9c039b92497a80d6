"""The long-context study: the symmetric closed form against wflow's kernel sums, its helpers, and resume."""

import numpy as np
import pytest

from wflow import theory
from wflow.studies import long_context as lc
from wflow.studies.parts import Parts


@pytest.mark.parametrize("rho", [0.25, 0.5])
def test_closed_form_against_kernel_sums(rho):
    """n = 50 equiangular tokens in d = 50: SA(gamma).average's output cosine is the closed form to 1e-12."""
    n, gc = 50, 1 / (1 - rho)
    for gamma in (0.5 * gc, gc, 1.5 * gc, 4 * gc):
        cos, spread = lc.direct_cosines(n, rho, gamma)
        assert spread < 1e-13
        assert cos == pytest.approx(float(theory.long_context_cosine(rho, gamma, n)), abs=1e-12)
    # independently: the weights written out (self e^beta, n-1 others e^{beta rho})
    beta = 2.0 * np.log(n)
    x = theory.equiangular_configuration(n, rho)
    w = np.exp(beta * (x @ x.T - 1))
    y = (w @ x) / w.sum(1, keepdims=True)
    assert y[0] @ y[1] / (y[0] @ y[0]) == pytest.approx(
        lc.direct_cosines(n, rho, 2.0)[0], abs=1e-13
    )


def test_critical_slope_and_deviation_against_asymptotics():
    """d cos/d gamma at gamma_c ~ -4 rho (1-rho)^2/(1+3 rho)^2 log n; the deviation away from gamma_c ~ n^-delta."""
    rho = 0.5
    n = 1e10
    pred = -4 * rho * (1 - rho) ** 2 / (1 + 3 * rho) ** 2 * np.log(n)
    assert lc.critical_slope(rho, n) == pytest.approx(pred, rel=1e-6)
    g = np.linspace(0, 3, 301) * 2.0
    dev = [lc.deviation_away(rho, m, g) for m in (1e10, 1e11, 1e12)]
    slope = np.polyfit(np.log([1e10, 1e11, 1e12]), np.log(dev), 1)[0]
    assert slope == pytest.approx(-lc.DELTA, abs=0.01)
    # the deviation at gamma = 1.25 gamma_c (c = 1.25): cos - rho ~ 2 rho (1 - rho) n^-(c-1)
    assert dev[-1] == pytest.approx(2 * rho * (1 - rho) * 1e12**-0.25, rel=2e-3)


def test_parts_are_reused(tmp_path):
    """A second run reuses every part of the first (a resumed run recomputes nothing)."""
    g = np.linspace(0, 6, 13)
    calls = []

    def compute():
        calls.append(1)
        return lc.long_context_part(100.0, 0.5, g, direct=True)

    a = Parts(tmp_path, "long-context", quick=True).get({"n": 100, "rho": 0.5}, compute)
    parts = Parts(tmp_path, "long-context", quick=True)
    b = parts.get({"n": 100, "rho": 0.5}, compute)
    assert len(calls) == 1 and parts.reused == 1
    np.testing.assert_array_equal(a["cos"], b["cos"])
    assert b["direct_err"] < 1e-12
