"""Multi-head and causal attention (wflow.models.MultiHead) against dense per-head formulas written
here, and causal attention's known behaviour."""

from __future__ import annotations

import numpy as np
import pytest

import wflow
from wflow.models import MultiHead, model_from_dict


def dense_heads(x, w, beta, Q, K, V, O, bq, bk, bv, bo, causal):
    """The attention output token by token, head by head, with the d x d value matrix O_h V_h formed."""
    n, d = x.shape
    out = np.zeros((n, d))
    for i in range(n):
        for h in range(Q.shape[0]):
            js = range(i + 1) if causal else range(n)
            logits = np.array([beta * np.dot(Q[h] @ x[i] + bq[h], K[h] @ x[j] + bk[h]) for j in js])
            a = w[list(js)] * np.exp(logits - logits.max())
            a /= a.sum()
            Vd = O[h] @ V[h]
            out[i] += sum(a[k] * (Vd @ x[j] + O[h] @ bv[h]) for k, j in enumerate(js))
        out[i] += bo
    return out


def random_heads(rng, H=3, p=2, d=5, r=2):
    Q, K = rng.standard_normal((2, H, p, d))
    V, O = rng.standard_normal((H, r, d)), rng.standard_normal((H, d, r))
    biases = dict(
        bias_q=rng.standard_normal((H, p)),
        bias_k=rng.standard_normal((H, p)),
        bias_v=rng.standard_normal((H, r)),
        bias_o=rng.standard_normal(d),
    )
    return Q, K, V, O, biases


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_multihead_matches_dense_per_head_formula(causal, with_bias):
    rng = np.random.default_rng(0)
    Q, K, V, O, biases = random_heads(rng)
    H, p, d = Q.shape
    r = V.shape[1]
    x = wflow.sphere.uniform(7, d, seed=1)
    w = rng.uniform(0.5, 1.5, 7)
    w /= w.sum()
    kw = biases if with_bias else {}
    m = MultiHead(0.8, Q, K, V, O, causal=causal, **kw)
    zero = dict(
        bias_q=np.zeros((H, p)),
        bias_k=np.zeros((H, p)),
        bias_v=np.zeros((H, r)),
        bias_o=np.zeros(d),
    )
    b = biases if with_bias else zero
    ref = dense_heads(
        x, w, 0.8, Q, K, V, O, b["bias_q"], b["bias_k"], b["bias_v"], b["bias_o"], causal
    )
    np.testing.assert_allclose(m.update(x, w), ref, rtol=1e-12, atol=1e-12)
    v = m.velocity(x, wflow.Atoms(x, w))
    np.testing.assert_allclose(v, ref - np.sum(ref * x, -1, keepdims=True) * x, atol=1e-12)
    # queries attending to other keys: the keys' own tokens give the same answer; other queries too
    if not causal:
        y = wflow.sphere.uniform(3, d, seed=5)
        ref_y = dense_heads(np.concatenate([y, x]), np.concatenate([np.zeros(3), w]), 0.8, Q, K, V, O,
                            b["bias_q"], b["bias_k"], b["bias_v"], b["bias_o"], False)[:3]  # fmt: skip
        np.testing.assert_allclose(m.update(y, w, keys=x), ref_y, rtol=1e-12, atol=1e-12)
        v_y = m.velocity(y, wflow.Atoms(x, w))
        np.testing.assert_allclose(
            v_y, ref_y - np.sum(ref_y * y, -1, keepdims=True) * y, atol=1e-12
        )
    # a batch of systems gives each system's own answer
    xb = np.stack([x, x[::-1]])
    ub = m.update(xb)
    np.testing.assert_allclose(ub[1], m.update(x[::-1]), atol=1e-13)


def test_multihead_is_the_sum_of_sa_heads_and_blocks_agree():
    """Without biases or mask: the sum of H SA blocks with V_h = O_h V_h; query blocks give the same."""
    rng = np.random.default_rng(2)
    Q, K, V, O, _ = random_heads(rng, H=4, p=3, d=6, r=2)
    x = wflow.sphere.uniform(30, 6, seed=0)
    mu = wflow.Atoms(x)
    m = MultiHead(1.5, Q, K, V, O)
    heads = wflow.SA(1.5, Q=Q[0], K=K[0], V=O[0] @ V[0])
    for h in range(1, 4):
        heads = heads + wflow.SA(1.5, Q=Q[h], K=K[h], V=O[h] @ V[h])
    np.testing.assert_allclose(
        m.velocity(x, mu), heads.velocity(x, mu, backend="numpy"), rtol=1e-11, atol=1e-12
    )
    import wflow.models.multihead as mod

    old = mod._BLOCK_NUMBERS
    try:
        mod._BLOCK_NUMBERS = 30 * 7  # blocks of 7 query rows
        np.testing.assert_allclose(m.update(x), MultiHead(1.5, Q, K, V, O).update(x), atol=0)
        mc = MultiHead(1.5, Q, K, V, O, causal=True)
        ref = dense_heads(x, np.ones(30), 1.5, Q, K, V, O, *(np.zeros((4, 3)),) * 2, np.zeros((4, 2)),
                          np.zeros(6), True)  # fmt: skip
        np.testing.assert_allclose(mc.update(x), ref, rtol=1e-11, atol=1e-12)
    finally:
        mod._BLOCK_NUMBERS = old


def test_multihead_round_trips_and_dense_constructor():
    rng = np.random.default_rng(3)
    Q, K, V, O, b = random_heads(rng)
    m = MultiHead(0.5, Q, K, V, O, causal=True, **b)
    m2 = model_from_dict(m.to_dict())
    x = wflow.sphere.uniform(6, 5, seed=0)
    np.testing.assert_array_equal(m2.update(x), m.update(x))
    assert m2.causal and m2.ordered and not m.is_gradient
    Vd = rng.standard_normal((3, 5, 5))
    md = MultiHead.from_dense(0.5, Q, K, Vd)
    ref = dense_heads(x, np.ones(6), 0.5, Q, K, Vd, np.broadcast_to(np.eye(5), (3, 5, 5)),
                      *(np.zeros((3, 2)),) * 2, np.zeros((3, 5)), np.zeros(5), False)  # fmt: skip
    np.testing.assert_allclose(md.update(x), ref, rtol=1e-12, atol=1e-12)


def test_causal_first_token_never_moves_and_all_reach_it():
    """Q = K = V = I: token 0 attends only to itself (velocity P_x x = 0); from a generic start every token
    converges to token 0's position (Karagodin, Polyanskiy & Rigollet 2024), exponentially fast."""
    eye = np.eye(3)[None]
    m = MultiHead(1.0, eye, eye, eye, eye, causal=True)
    x0 = wflow.sphere.uniform(6, 3, seed=3)
    assert np.abs(m.velocity(x0, wflow.Atoms(x0))[0]).max() < 1e-15  # P_x x = 0 up to rounding
    traj = wflow.simulate(m, x0, 40.0, dt=0.05, save_at=[0.0, 20.0, 40.0])
    P = traj.points
    assert np.abs(P[:, 0] - x0[0]).max() < 1e-14
    dist = [float(np.arccos(np.clip(P[k] @ P[k][0], -1, 1)).max()) for k in range(3)]
    assert dist[0] > 1.0
    assert dist[1] < 2e-3 and dist[2] < 1e-6
    # the second token is attracted by the first alone: its geodesic distance decays as the two-token
    # SA flow, theta' = -2 sin(theta) e^{beta cos theta} / (e^beta + e^{beta cos theta}) ... at least 20x
    assert dist[2] < dist[1] / 20


def test_causal_mask_bad_input():
    eye = np.eye(3)[None]
    m = MultiHead(1.0, eye, eye, eye, eye, causal=True)
    x0 = wflow.sphere.uniform(4, 3, seed=0)
    with pytest.raises(ValueError, match="causal.*noise"):
        wflow.simulate(m, x0, 1.0, kappa=10.0)
    with pytest.raises(ValueError, match="causal.*tracers"):
        wflow.simulate(m, x0, 1.0, tracers=wflow.sphere.uniform(2, 3, seed=1))
    with pytest.raises(ValueError, match="causal.*Lagrangian"):
        wflow.solve_lagrangian(m, lambda x: 1 + 0 * x[:, 0], 0.5, nodes=16)
    with pytest.raises(ValueError, match="causal.*finite-volume"):
        from wflow.density import Density
        from wflow.mesh import CircleMesh
        from wflow.solvers.eulerian import solve_density

        e2 = np.eye(2)[None]
        circle = CircleMesh(32)
        solve_density(MultiHead(1.0, e2, e2, e2, e2, causal=True),
                      Density.from_function(circle, lambda x: 1 + 0 * x[:, 0]), 0.5)  # fmt: skip
    with pytest.raises(ValueError, match="causal"):
        wflow.simulate(wflow.SA(1.0) + m, x0, 1.0, kappa=10.0)
    with pytest.raises(TypeError, match="causal must be True or False"):
        MultiHead(1.0, eye, eye, eye, eye, causal="yes")
    with pytest.raises(ValueError, match="O must have shape"):
        MultiHead(1.0, eye, eye, eye, np.eye(3)[None, :, :2])
    with pytest.raises(ValueError, match="bias_q must have 2 axes"):
        MultiHead(1.0, eye, eye, eye, eye, bias_q=np.zeros(3))
