"""The numba backend agrees with the numpy backend (the reference) on small problems.

float64 results must agree to 1e-12 relative, float32 to 1e-5.  The float32 reference
is the numpy backend run in float64 on the same float32 numbers: the numba backend
forms its logits in float64, whereas a float32 logit of size beta = 1000 is itself
uncertain by 6e-5, so the numpy backend's own float32 result is only that close.
"""

from __future__ import annotations

import numpy as np
import pytest

from wflow import Atoms
from wflow.kernels import AUTO_ORDER, BACKENDS, kernel_sums, numba_backend, precision

RTOL = {np.float64: 1e-12, np.float32: 1e-5}


def _sphere(rng, shape, dtype):
    x = rng.standard_normal(shape)
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(dtype)


def _problem(rng, dtype, batch=(), n=37, m=300, d=3, p=None, q=None, zeros=True):
    x = _sphere(rng, (*batch, n, d), dtype)
    y = _sphere(rng, (*batch, m, d), dtype)
    w = rng.random((*batch, m))
    if zeros:
        w[..., ::5] = 0.0
    w = (w / w.sum(axis=-1, keepdims=True)).astype(dtype)
    mats = {}
    if p is not None:
        mats["Q"] = (rng.standard_normal((p, d)) / np.sqrt(d)).astype(dtype)
        mats["K"] = (rng.standard_normal((p, d)) / np.sqrt(d)).astype(dtype)
    if q is not None:
        mats["V"] = rng.standard_normal((q, d)).astype(dtype)
    return x, y, w, mats


def _reference(x, y, w, beta, mats, values=True):
    up = {k: v.astype(np.float64) for k, v in mats.items()}
    return kernel_sums(
        x.astype(np.float64),
        y.astype(np.float64),
        w.astype(np.float64),
        beta,
        values=values,
        backend="numpy",
        **up,
    )


def _check(got, ref, dtype, values=True, logit_scale=1000.0):
    # Each term e^l inherits the absolute rounding error of its logit l, about u * sum_l |a_l b_l|
    # for either summation order (Higham, Thm 3.1): the 1e-12 of float64 holds for logits up
    # to 1000 (beta <= 1000 on the sphere with Q = K = I) and grows in proportion beyond.
    rtol = RTOL[dtype] * (max(1.0, logit_scale / 1000.0) if dtype == np.float64 else 1.0)
    assert got.backend == "numba"
    assert got.log_scale.dtype == dtype and got.mass.dtype == dtype
    assert got.log_scale.shape == ref.log_scale.shape
    # the shift is the exact row maximum (up to rounding to the output dtype)
    np.testing.assert_allclose(got.log_scale, ref.log_scale, rtol=rtol, atol=rtol)
    # mass relative to the reference's shift: e^(c - c_ref) s0 = s0_ref
    mass = got.mass.astype(np.float64) * np.exp(got.log_scale.astype(np.float64) - ref.log_scale)
    np.testing.assert_allclose(mass, ref.mass, rtol=rtol)
    if not values:
        assert got.vector is None
        return
    assert got.vector.dtype == dtype
    sa, sa_ref = got.softmax_average(), ref.softmax_average()
    # relative to the row's size (components may cancel)
    scale = np.max(np.abs(sa_ref), axis=-1, keepdims=True)
    err = np.max(np.abs(sa - sa_ref) / scale)
    assert err <= rtol, f"softmax average differs by {err:.3g} relative (tolerance {rtol})"


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("beta", [0.0, 1.0, 100.0, 1000.0])
def test_identity_qkv_agrees_with_numpy(rng, dtype, beta):
    x, y, w, mats = _problem(rng, dtype)
    got = kernel_sums(x, y, w, beta, backend="numba")
    _check(got, _reference(x, y, w, beta, mats), dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("beta", [1.0, 1000.0])
@pytest.mark.parametrize("d, p, q", [(3, 5, 2), (8, 6, 8), (5, 50, 7)])
def test_general_qkv_agrees_with_numpy(rng, dtype, beta, d, p, q):
    """p != d, q != d; p = 50 takes the BLAS route."""
    x, y, w, mats = _problem(rng, dtype, d=d, p=p, q=q, m=2100)
    got = kernel_sums(x, y, w, beta, backend="numba", **mats)
    assert got.vector.shape == (x.shape[0], q)
    a, b = np.abs(x @ mats["Q"].T).astype(np.float64), np.abs(y @ mats["K"].T).astype(np.float64)
    _check(got, _reference(x, y, w, beta, mats), dtype, logit_scale=beta * float(np.max(a @ b.T)))


@pytest.mark.parametrize("route", [None, "direct"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_batched_agrees_with_numpy(rng, dtype, route, monkeypatch):
    monkeypatch.setattr(numba_backend, "FORCE_ROUTE", route)  # tiny systems: "small" unless forced
    x, y, w, mats = _problem(rng, dtype, batch=(3, 5), n=9, m=13, d=8, q=4)
    got = kernel_sums(x, y, w, 100.0, backend="numba", **mats)
    assert got.log_scale.shape == (3, 5, 9) and got.vector.shape == (3, 5, 9, 4)
    _check(got, _reference(x, y, w, 100.0, mats), dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_values_false(rng, dtype):
    x, y, w, mats = _problem(rng, dtype, d=4)
    got = kernel_sums(x, y, w, 10.0, values=False, backend="numba")
    _check(got, _reference(x, y, w, 10.0, mats, values=False), dtype, values=False)


def test_many_column_blocks_online_maximum(rng):
    """Columns in several blocks whose maxima increase: the running shift is rescaled."""
    x, y, w, mats = _problem(rng, np.float64, n=5, m=3 * numba_backend.TILE_COLS + 7, zeros=False)
    order = np.argsort(y @ x[0])  # the best column of row 0 comes last
    y, w = y[order], w[order]
    got = kernel_sums(x, y, w, 300.0, backend="numba")
    _check(got, _reference(x, y, w, 300.0, mats), np.float64)


def test_largest_term_is_one(rng):
    x, y, w, _ = _problem(rng, np.float64, zeros=False)
    got = kernel_sums(x, y, w, 1000.0, backend="numba")
    logits = 1000.0 * x @ y.T + np.log(w)
    np.testing.assert_allclose(got.log_scale, logits.max(axis=1), rtol=1e-14)
    assert np.all(got.mass >= 1.0)


def test_auto_picks_numba_on_cpu(rng):
    assert AUTO_ORDER.index("numba") < AUTO_ORDER.index("numpy")
    keops = BACKENDS.get("keops")
    if keops is not None and keops.available() and keops.gpu():
        pytest.skip("a GPU is present: auto picks KeOps for large problems")
    x, y, w, mats = _problem(rng, np.float64, q=3, p=4)
    assert kernel_sums(x, y, w, 1.0, **mats).backend == "numba"


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_blas_route_many_row_blocks(rng, dtype):
    """Several row blocks run on the worker threads (and a batch), merged in the right places."""
    x, y, w, mats = _problem(rng, dtype, batch=(2,), n=600, m=700, d=4, p=64, q=3)
    mats["Q"] /= 4.0  # logits below 1000 at beta = 100
    got = kernel_sums(x, y, w, 100.0, backend="numba", **mats)
    assert got.vector.shape == (2, 600, 3)
    _check(got, _reference(x, y, w, 100.0, mats), dtype)


def test_float32_logits_only_where_accurate(rng, monkeypatch):
    """float32 input at small beta and near-uniform weights forms its logits in float32: still within
    1e-5 of the float64 reference.  Forcing float32 logits at beta = 1000 shows why the rule exists."""
    x, y, _, _ = _problem(rng, np.float32, n=64, m=700, d=3)
    w = np.full(700, 1.0 / 700, np.float32)
    for beta in (0.5, 1.0, 2.0):
        assert (
            2.0**-24 * (6 * beta + 0.0) <= precision.LOWP_LOGIT_ERROR
        )  # this case takes the float32 path
        _check(
            kernel_sums(x, y, w, beta, backend="numba"), _reference(x, y, w, beta, {}), np.float32
        )
    # the batched workload of the benchmarks: 8-dimensional tokens, beta = 4
    xb, yb, _, _ = _problem(rng, np.float32, batch=(64,), n=32, m=32, d=8)
    wb = np.full((64, 32), 1.0 / 32, np.float32)
    assert 2.0**-24 * (10 * 4.0) <= precision.LOWP_LOGIT_ERROR
    for route in ("direct", "small"):
        monkeypatch.setattr(numba_backend, "FORCE_ROUTE", route)
        _check(
            kernel_sums(xb, yb, wb, 4.0, backend="numba"),
            _reference(xb, yb, wb, 4.0, {}),
            np.float32,
        )
    monkeypatch.setattr(numba_backend, "FORCE_ROUTE", None)
    monkeypatch.setattr(precision, "LOWP_LOGIT_ERROR", 1.0)  # float32 logits whatever their size
    got = kernel_sums(x, y, w, 1000.0, backend="numba")
    ref = _reference(x, y, w, 1000.0, {})
    mass = got.mass.astype(np.float64) * np.exp(got.log_scale.astype(np.float64) - ref.log_scale)
    assert np.max(np.abs(mass / ref.mass - 1.0)) > 1e-5


def _mixed_error(got, ref):
    """Largest relative error of the mass and of the value sums (relative to each row's size)."""
    f = np.exp(got.log_scale.astype(np.float64) - ref.log_scale)
    em = np.max(np.abs(got.mass * f / ref.mass - 1.0))
    scale = np.max(np.abs(ref.vector), axis=-1, keepdims=True)
    ev = np.max(np.abs(got.vector * f[:, None] - ref.vector) / scale)
    return max(em, ev)


@pytest.mark.parametrize("case", ["far", "clamped", "rising"])
def test_float32_mixed_shift_moves(rng, case):
    """float32 input with float64 logits: each logit is rounded to float32 after subtracting the
    row's running shift.  The shift starts at a Cauchy-Schwarz bound and must move: down to the
    first block's maximum when that bound is far above it ("far": the queries face away from every
    source, 2 beta below it; "clamped": so far that every shifted value is clamped at the floor and
    the maximum is recomputed in float64), and up when a later block's maximum exceeds it by more
    than MIXED_JUMP ("rising": the columns sorted by logit).  Each case exercises one way the
    shift moves; a wrong rescaling or a wrong new shift in any of them is off by O(1) (checked by
    breaking each), and all stay within 2e-6 of the float64 reference.  (The point of moving the
    shift, keeping the rounding of l - c below 2^-24 (|l - max l| + MIXED_JUMP), is a worst-case
    bound: on random data the unmoved values would round nearly as well.)"""
    m = 3 * numba_backend.MIXED_TILE_COLS + 3
    y = _sphere(rng, (m, 3), np.float64)
    w = rng.random(m)
    w[::7] = 0.0
    w /= w.sum()
    if case == "rising":
        x = _sphere(rng, (9, 3), np.float64)
        y = y[
            np.argsort(y @ x[0])
        ]  # row 0's largest logits come last: its shift rises block by block
        beta = 300.0
    else:
        y[:, 0] = np.abs(y[:, 0]) + 0.5  # sources around +e1, queries around -e1
        y /= np.linalg.norm(y, axis=1, keepdims=True)
        x = _sphere(rng, (9, 3), np.float64)
        x[:, 0] = -np.abs(x[:, 0]) - 0.5
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        beta = 40.0 if case == "far" else 300.0
    x32, y32, w32 = x.astype(np.float32), y.astype(np.float32), w.astype(np.float32)
    got = kernel_sums(x32, y32, w32, beta, backend="numba")
    ref = _reference(x32, y32, w32, beta, {})
    gap = beta + np.log(w.max()) - ref.log_scale  # the starting bound against the true maxima
    floor = -numba_backend.exp_floor(np.float32)
    if case == "far":
        assert np.all((gap > numba_backend.MIXED_JUMP) & (gap < floor))
    elif case == "clamped":
        assert np.all(gap > floor)
    err = _mixed_error(got, ref)
    assert err <= 2e-6, f"{case}: relative error {err:.3g}"
    np.testing.assert_allclose(got.log_scale, ref.log_scale, rtol=1e-6, atol=1e-5)


# ---------------------------------------------------------------- the tiny-systems route
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("beta", [0.0, 5.0, 100.0, 1000.0])
@pytest.mark.parametrize("d,n,m", [(64, 32, 32), (128, 7, 33), (200, 256, 256), (3, 16, 16)])
def test_small_route_agrees_with_numpy(rng, dtype, beta, d, n, m, monkeypatch):
    """Batches of tiny systems through batched GEMMs (what auto picks for n, m <= 256)."""
    monkeypatch.setattr(numba_backend, "FORCE_ROUTE", "small")
    x, y, w, mats = _problem(rng, dtype, batch=(5,), n=n, m=m, d=d)
    got = kernel_sums(x, y, w, beta, backend="numba")
    _check(got, _reference(x, y, w, beta, mats), dtype)
    got = kernel_sums(x, y, w, beta, values=False, backend="numba")
    _check(got, _reference(x, y, w, beta, mats, values=False), dtype, values=False)


@pytest.mark.parametrize("method", ["fused", "gemm"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_small_route_general_qkv_and_many_chunks(rng, dtype, method, monkeypatch):
    from wflow.kernels import small

    monkeypatch.setattr(
        small, "CHUNK_PAIRS", 64
    )  # one system per chunk: every worker takes several
    monkeypatch.setattr(small, "SERIAL_MAX_FLOPS", 0)  # on the worker threads however small
    monkeypatch.setattr(small, "FORCE_METHOD", method)
    x, y, w, mats = _problem(rng, dtype, batch=(3, 7), n=9, m=40, d=50, p=60, q=5)
    got = kernel_sums(x, y, w, 30.0, backend="numba", **mats)
    assert numba_backend.choose_route(21, 9, 40, 60, dtype) == "small"
    _check(got, _reference(x, y, w, 30.0, mats), dtype)


def test_route_choice():
    from wflow.kernels.small import SMALL_MAX

    assert numba_backend.choose_route(256, 32, 32, 128, np.float64) == "small"
    assert numba_backend.choose_route(256, 32, 32, 8, np.float64) == "small"
    assert numba_backend.choose_route(1, 300, 32, 8, np.float64) == "direct"
    assert numba_backend.choose_route(1, 1000, 1000, 128, np.float64) == "blas"
    assert numba_backend.choose_route(1, SMALL_MAX + 1, 10, 128, np.float32) == "blas"


def test_parallel_runs_every_share_and_raises_after_all_have_finished():
    """threads.parallel: share 0 in the calling thread, the others on the pool; an error in any share
    is raised only once every share has finished (none left writing into the caller's arrays)."""
    import threading
    import time

    from wflow.kernels.threads import parallel

    seen = {}

    def work(t):
        seen[t] = threading.current_thread() is threading.main_thread()

    parallel(work, 3)
    assert seen == {0: True, 1: False, 2: False}
    parallel(work, 0)  # nothing to do

    done = []

    def failing(t, bad):
        if t == bad:
            raise RuntimeError(f"share {t}")
        time.sleep(0.05)
        done.append(t)

    for bad in (0, 1):
        done.clear()
        with pytest.raises(RuntimeError, match=f"share {bad}"):
            parallel(lambda t: failing(t, bad), 3)
        assert sorted(done) == sorted({0, 1, 2} - {bad})

    def both_fail(t):
        time.sleep(0.05 * (t == 0))  # the pool's share fails first
        raise RuntimeError(f"share {t}")

    with pytest.raises(RuntimeError, match="share 0"):  # the caller's own error
        parallel(both_fail, 2)


@pytest.mark.parametrize(
    "B, workers", [(0, 2), (1, 2), (5, 4), (7, 3), (3, 8), (2048, 2), (2049, 2)]
)
def test_shares_cover_every_system_once(B, workers):
    """threads.shares: contiguous, disjoint shares covering 0..B-1, at most ``workers`` of them, the largest
    ceil(B / workers) systems."""
    from wflow.kernels.threads import shares

    sh = shares(B, workers)
    assert [k for b0, b1 in sh for k in range(b0, b1)] == list(range(B))
    assert len(sh) <= workers and all(b1 > b0 for b0, b1 in sh)
    assert max((b1 - b0 for b0, b1 in sh), default=0) == -(-B // workers)


def test_executor_grows_and_is_not_rebuilt_for_fewer_workers():
    """threads.executor: callers ask for as many workers as they have shares; the pool only grows."""
    from wflow.kernels import threads

    pool = threads.executor(3)
    assert (
        threads.executor(2) is pool and threads.executor(3) is pool and threads.executor(1) is pool
    )
    bigger = threads.executor(threads._EXECUTOR_SIZE + 1)
    assert bigger is not pool and threads.executor(2) is bigger


def test_bmm_equals_matmul(rng):
    from wflow.kernels.small import bmm

    a = rng.standard_normal((300, 16, 40))
    b = rng.standard_normal((300, 40, 24))
    np.testing.assert_array_equal(bmm(a, b), np.matmul(a, b))
    np.testing.assert_array_equal(bmm(a, np.swapaxes(a, 1, 2)), np.matmul(a, np.swapaxes(a, 1, 2)))


def test_small_route_float32_logits_when_tol_allows(rng):
    """float32 input at beta = 5, d = 128: float64 logits by default (1e-5 held), float32 logits with tol=2e-4."""
    from wflow.kernels import small

    x, y, w, mats = _problem(rng, np.float32, batch=(4,), n=32, m=32, d=128)
    a = 5.0 * x.astype(np.float64)
    lw = np.log(w.astype(np.float64), where=w > 0, out=np.full(w.shape, -1e300))
    assert not small._logits_in_float32(a, y, lw, -80.0)[0]
    assert small._logits_in_float32(a, y, lw, -80.0, 2e-4)[0]
    ref = _reference(x, y, w, 5.0, mats)
    _check(kernel_sums(x, y, w, 5.0, backend="numba"), ref, np.float32)
    loose = kernel_sums(x, y, w, 5.0, backend="numba", tol=2e-4)
    err = np.max(np.abs(loose.softmax_average() - ref.softmax_average()))
    assert err < 2e-4 / 3


@pytest.mark.parametrize("method", ["fused", "gemm"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_small_route_methods_agree_with_numpy(rng, dtype, method, monkeypatch):
    """Both methods of the tiny-systems route, odd sizes (block tails), zero weights, general Q, K, V."""
    from wflow.kernels import small

    monkeypatch.setattr(small, "FORCE_METHOD", method)
    for beta, kw in (
        (5.0, dict(n=7, m=33, d=5)),
        (300.0, dict(n=32, m=32, d=40)),
        (30.0, dict(n=9, m=13, d=6, p=7, q=3)),
    ):
        x, y, w, mats = _problem(rng, dtype, batch=(6,), **kw)
        if "Q" in mats:
            mats["Q"] /= 2.0
        got = kernel_sums(x, y, w, beta, backend="numba", **mats)
        _check(got, _reference(x, y, w, beta, mats), dtype)
        got = kernel_sums(x, y, w, beta, values=False, backend="numba", **mats)
        _check(got, _reference(x, y, w, beta, mats, values=False), dtype, values=False)


def _dense_sa_euler(x, w, beta, dt, projected=True):
    """The projected SA Euler step (or GLPR's unprojected one) in dense float64 NumPy (the reference of the
    fused step)."""
    x = np.asarray(x, dtype=np.float64)
    th = x / np.linalg.norm(x, axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        L = (
            beta * th @ np.swapaxes(th, -1, -2)
            + np.log(np.asarray(w, dtype=np.float64))[..., None, :]
        )
    E = np.exp(L - L.max(axis=-1, keepdims=True))
    A = (E @ th) / E.sum(axis=-1)[..., None]
    y = x + dt * (A - projected * np.sum(A * th, axis=-1, keepdims=True) * th)
    return y / np.linalg.norm(y, axis=-1, keepdims=True)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize(
    "d, n, batch",
    [(2, 1, (3,)), (3, 7, (5,)), (8, 32, (4, 3)), (13, 9, (4,)), (33, 5, (6,)), (128, 32, (9,))],
)
@pytest.mark.parametrize("threads", [False, True])
@pytest.mark.parametrize("weights", ["zeros", "positive", "e^-650", "equal"])
def test_sa_euler_step_agrees_with_dense(rng, dtype, d, n, batch, threads, weights, monkeypatch):
    """Against dense NumPy, for weights with zeros and spanning e^650 (each row shifted by its maximum),
    positive within a factor of 11 (one shift, beta + the largest log-weight, for the whole system) and equal
    (symmetric exponentials, whose transpose the BLAS route multiplies by)."""
    from wflow.kernels import small
    from wflow.solvers import fused

    if threads:  # one system per chunk, on the worker threads however small
        monkeypatch.setattr(small, "CHUNK_PAIRS", 1)
        monkeypatch.setattr(small, "SERIAL_MAX_FLOPS", 0)
    x = _sphere(rng, (*batch, n, d), dtype)
    w = rng.random((*batch, n))
    if weights == "zeros":
        w[..., ::4] = 0.0  # zero weights: log 0 stands in as the floor
    elif weights == "e^-650":
        w[..., ::3] = np.exp(-650.0)
    if weights == "equal":
        w[:] = 1.0 / n
    else:
        w[..., 1 % n] += 0.1
    for beta in (
        0.0,
        2.0,
        5.0,
        200.0,
        -400.0,
    ):  # (beta = 2: float32 logits where r allows; -400: row maxima)
        y = fused.sa_euler_step(x, w, beta, 0.1)
        assert y.dtype == dtype and y.shape == x.shape
        ref = _dense_sa_euler(x, w, beta, 0.1)
        np.testing.assert_allclose(y, ref, rtol=0, atol=1e-14 if dtype == np.float64 else 3e-7)
        z = fused.sa_euler_step(x, w, beta, 0.1, projected=False)  # GLPR's scheme
        np.testing.assert_allclose(
            z,
            _dense_sa_euler(x, w, beta, 0.1, projected=False),
            rtol=0,
            atol=1e-14 if dtype == np.float64 else 3e-7,
        )
        if n > 1 and beta == 5.0:
            assert np.abs(z - y).max() > 1e-6
    out = x.copy()  # in place
    assert fused.sa_euler_step(out, w, 5.0, 0.1, out=out) is out
    np.testing.assert_allclose(
        out, _dense_sa_euler(x, w, 5.0, 0.1), atol=1e-14 if dtype == np.float64 else 3e-7
    )


def test_sa_euler_step_in_span_coordinates(rng):
    """d > n: the step in the coordinates of an orthonormal basis of the span is the same step."""
    from wflow.kernels.small import span_coordinates
    from wflow.solvers.fused import sa_euler_step

    x = _sphere(rng, (4, 16, 100), np.float64)
    w = np.full((4, 16), 1 / 16)
    y, basis = span_coordinates(x)
    assert y.shape == (4, 16, 16) and basis.shape == (4, 16, 100)
    np.testing.assert_allclose(y @ basis, x, atol=1e-15)
    np.testing.assert_allclose(
        basis @ np.swapaxes(basis, 1, 2), np.broadcast_to(np.eye(16), (4, 16, 16)), atol=1e-15
    )
    z, zs = x.copy(), y.copy()
    for _ in range(50):
        z = _dense_sa_euler(z, w, 5.0, 0.1)
        sa_euler_step(zs, w, 5.0, 0.1, out=zs)
    np.testing.assert_allclose(zs @ basis, z, atol=1e-13)
    x3 = _sphere(rng, (2, 16, 3), np.float64)
    y3, b3 = span_coordinates(x3)  # d <= n: the points themselves
    assert y3 is x3 and b3 is None


@pytest.mark.parametrize(
    "r, rounding", [(8, "nearest"), (20, "nearest"), (40, "nearest"), (8, "outward")]
)
def test_sa_euler_step_float32_pairs_from_the_step_equal_pair_counts(rng, r, rounding, monkeypatch):
    """float32 points whose step forms float64 logits (beta = 5, r >= 7): the pairs are counted on the step's
    Gram matrix of their directions, except in systems with a pair within _pair_band (about 1e-7 here) of the
    threshold, which pair_counts counts from the input after the step; the counts equal pair_counts'
    exactly, at thresholds equal to a pair's own float64 product (where the two inner products disagree),
    for float32 points rounded to nearest and outward (the furthest off the sphere), r > 24 (pair_counts'
    GEMM route), systems with a zero row, in place too; only the systems near the threshold are counted
    twice."""
    from wflow.diagnostics import pairs
    from wflow.solvers import fused

    x = _sphere(rng, (40, 32, r), np.float64)
    x[:, 16:] = x[:, :16] + 0.03 * np.sqrt(8 / r) * rng.standard_normal(
        (40, 16, r)
    )  # pairs near cosine 0.999
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    x32 = x.astype(np.float32)
    if rounding == "outward":  # each coordinate rounded away from zero: |x| > 1 by up to r 2^-24
        x32 = np.where(
            np.abs(x32.astype(np.float64)) < np.abs(x), np.nextafter(x32, np.sign(x32) * 2), x32
        )
    w = np.full((40, 32), 1 / 32)
    x64 = x32.astype(np.float64)
    P = x64 @ np.swapaxes(x64, 1, 2)  # pair_counts' products (exact products; the sums to rounding)
    th = x64 / np.linalg.norm(x64, axis=-1, keepdims=True)
    G = th @ np.swapaxes(th, 1, 2)  # the step's
    off = ~np.eye(32, dtype=bool)
    gap = np.where(off, G - P, 0.0)
    k, i, j = np.unravel_index(
        np.argmax(np.where(np.abs(P - 0.999) < 2e-3, np.abs(gap), 0.0)), gap.shape
    )
    assert (
        abs(gap[k, i, j]) > 1e-9
    )  # the directions and the points disagree beyond rounding on this pair
    calls = []
    real = pairs.pair_counts
    monkeypatch.setattr(
        pairs, "pair_counts", lambda xs, c: calls.append(xs.shape[0]) or real(xs, c)
    )
    for c in (0.999, float(P[k, i, j]), float(np.nextafter(P[k, i, j], -1.0))):
        ref = real(x32, c)
        calls.clear()
        y, counts = fused.sa_euler_step(x32, w, 5.0, 0.1, count_pairs_above=c)
        np.testing.assert_array_equal(counts, ref)
        np.testing.assert_array_equal(y, fused.sa_euler_step(x32, w, 5.0, 0.1))
        assert sum(calls) <= 4 and (
            c == 0.999 or calls
        )  # a few near systems, the pair's among them
        xs = x32.copy()  # in place: the input's pairs, counted before the step overwrites them
        np.testing.assert_array_equal(
            fused.sa_euler_step(xs, w, 5.0, 0.1, out=xs, count_pairs_above=c)[1], ref
        )
    xz = x32.copy()
    xz[3, 5] = 0.0  # a zero row: a non-finite step for system 3, its pairs counted from its points
    for c in (-0.5, 0.999):
        calls.clear()
        counts = fused.sa_euler_step(xz, w, 5.0, 0.1, count_pairs_above=c)[1]
        np.testing.assert_array_equal(counts, real(xz, c))
        assert sum(calls) <= 4


@pytest.mark.parametrize("n, r", [(32, 3), (32, 8), (17, 13), (32, 40)])
def test_sa_euler_step_counts_the_pairs_of_its_input(rng, n, r, monkeypatch):
    """count_pairs_above: the ordered pairs i != j of the input above the cosine, counted on the Gram matrix
    the step forms (one shift per system and row maxima), equal to the dense count
    at thresholds between neighbouring inner products; the step itself unchanged bit for bit; float32
    points counted by pair_counts."""
    from wflow.diagnostics import pairs
    from wflow.kernels import small
    from wflow.solvers import fused

    x = _sphere(rng, (6, n, r), np.float64)
    x[:, n // 2 :] = x[:, : n - n // 2] + 0.02 * rng.standard_normal(
        (6, n - n // 2, r)
    )  # close pairs
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    w = rng.random((6, n))
    w[1, 2] = 0.0  # system 1: each row shifted by its maximum
    G = x @ np.swapaxes(x, -1, -2)
    off = ~np.eye(n, dtype=bool)
    vals = np.unique(G[:, off])
    cuts = (0.5 * (vals[:-1] + vals[1:]))[np.diff(vals) > 1e-9]
    monkeypatch.setattr(small, "CHUNK_PAIRS", 2 * n * n)  # several chunks
    plain = fused.sa_euler_step(x, w, 5.0, 0.1)
    for c in [-2.0, 0.999, *cuts[:: max(1, cuts.size // 6)]]:
        y, counts = fused.sa_euler_step(x, w, 5.0, 0.1, count_pairs_above=c)
        np.testing.assert_array_equal(y, plain)
        np.testing.assert_array_equal(counts, ((G > c) & off).sum(axis=(1, 2)))
    assert fused.sa_euler_step(x[:0], w[:0], 5.0, 0.1, count_pairs_above=0.5)[1].shape == (0,)
    x32 = x.astype(np.float32)
    y32, c32 = fused.sa_euler_step(x32, w, 2.0, 0.1, count_pairs_above=0.999)
    np.testing.assert_array_equal(y32, fused.sa_euler_step(x32, w, 2.0, 0.1))
    np.testing.assert_array_equal(c32, pairs.pair_counts(x32, 0.999))
    cq = float(np.quantile(G[:, off], 0.95))  # a threshold some pairs pass
    for xs in (x.copy(), x32.copy()):  # in place (out=x): the input's pairs, not the output's
        ref = pairs.pair_counts(xs, cq)
        _, cs = fused.sa_euler_step(xs, w, 50.0, 0.5, out=xs, count_pairs_above=cq)
        np.testing.assert_array_equal(cs, ref)
        assert not np.array_equal(pairs.pair_counts(xs, cq), ref)  # the step changed the pairs
    with pytest.raises(ValueError, match="count_pairs_above must be a finite cosine, got nan"):
        fused.sa_euler_step(x, w, 5.0, 0.1, count_pairs_above=float("nan"))


def test_scratch_arrays_lie_apart_from_every_other_array():
    """scratch(): np.empty with SCRATCH_PAD bytes of its own allocation free before and after its data, in
    Python and in compiled code (C-contiguous, of the shape and dtype asked), so that two of them lie at
    least 2 SCRATCH_PAD bytes apart wherever malloc puts them."""
    from numba import njit

    from wflow.kernels.jit import SCRATCH_PAD, scratch

    @njit
    def three(n, r, dtype):
        return scratch((n, r), dtype), scratch((r,), np.float64), scratch((n,), np.int64)

    for dtype in (np.float32, np.float64):
        a = scratch((5, 3), dtype)
        whole = a.base  # (the allocation: numpy points a view at the array owning the memory)
        assert a.shape == (5, 3) and a.dtype == dtype and a.flags.c_contiguous
        assert a.ctypes.data - whole.ctypes.data == SCRATCH_PAD
        assert whole.ctypes.data + whole.nbytes - (a.ctypes.data + a.nbytes) == SCRATCH_PAD
        arrs = three(5, 3, np.dtype(dtype))
        assert [(b.shape, b.dtype) for b in arrs] == [
            ((5, 3), dtype),
            ((3,), np.float64),
            ((5,), np.int64),
        ]
        assert all(b.flags.c_contiguous for b in arrs)
        spans = sorted((b.ctypes.data, b.ctypes.data + b.nbytes) for b in arrs)
        assert all(s1[0] - s0[1] >= 2 * SCRATCH_PAD for s0, s1 in zip(spans, spans[1:]))


def test_fused_step_work_arrays_are_scratch_arrays():
    """Every work array of the fused step's compiled passes is a scratch array: the passes' vectorized loops check at run time that the array they write does not start within
    256 bytes after one they read and otherwise take their scalar versions, which sum in another order,
    so work arrays placed side by side by malloc changed the step by an ulp with the heap's history
    (9 of 1536 numbers in test_sa_euler_step_counts_the_pairs_of_its_input, one run of the whole suite in
    many); scratch arrays always take the vector path.  Only gemm's argument arrays, which no loop
    touches, are plain."""
    import inspect
    import re

    from wflow.diagnostics import pairs
    from wflow.solvers import fused_kernels

    src = inspect.getsource(fused_kernels)
    plain = re.findall(r"^\s*(\w+) = np\.(?:empty|zeros|ones|full)\w*\(", src, re.M)
    assert sorted(plain) == ["chars", "ints", "scal"]
    # the pair counts' passes (the same Gram matrices: a count near the threshold)
    src = inspect.getsource(pairs._pair_counts) + inspect.getsource(pairs.pair_counts)
    assert re.findall(r"^\s*(\w+) = np\.(?:empty|zeros|ones|full)\w*\(", src, re.M) == ["out"]


def _near_threshold_pairs(rng, B, n, r, t):
    """B systems of n points in R^r: pairs (2k, 2k + 1) at geodesic distance t (1 + eps), eps within 5e-11 of 0,
    in random planes (the cluster decisions Gram rounding cannot make), rows scaled off the sphere by up to
    1e-10 (what the decision's bound must allow for)."""
    x = np.empty((B, n, r))
    eps = np.array(
        [
            0.0,
            1e-16,
            -1e-16,
            4e-16,
            -4e-16,
            1e-15,
            -1e-15,
            1e-14,
            -1e-14,
            1e-13,
            -1e-13,
            5e-11,
            -5e-11,
        ]
    )
    for b in range(B):
        for k in range(0, n - 1, 2):
            q, _ = np.linalg.qr(rng.standard_normal((r, 2)))
            g = t * (1 + rng.choice(eps))
            x[b, k] = q[:, 0]
            x[b, k + 1] = np.cos(g) * q[:, 0] + np.sin(g) * q[:, 1]
        if n % 2:
            x[b, -1] = x[b, 0]
    return x * (1 + 1e-10 * rng.uniform(-1, 1, (B, n, 1)))


@pytest.mark.parametrize("n, r", [(32, 3), (32, 8), (17, 13), (32, 40), (100, 5), (256, 8)])
def test_sa_euler_step_counts_the_clusters_and_barycentres_of_its_input(rng, n, r, monkeypatch):
    """cluster_threshold: count_clusters' count of the input, exactly, read off the Gram matrix the step
    forms (pairs within rounding of the threshold decided from the coordinates), for
    clustered points and for pairs at the threshold to 5e-11 (rows off the sphere by 1e-10), up to n = 256 (bit
    masks of several words, the last one partial at n = 100); means: Atoms.mean to rounding; the step itself
    unchanged bit for bit; the input's, not the output's, in place; float64 points only."""
    from wflow.diagnostics import BATCHED_MAX_N, count_clusters
    from wflow.kernels import small
    from wflow.solvers import fused

    assert (
        small.SMALL_MAX <= BATCHED_MAX_N
    )  # count_clusters takes _cluster_roots, whose decisions the step copies

    t = 0.1
    c = _sphere(rng, (40, 4, r), np.float64)
    x = (
        np.take_along_axis(c, rng.integers(0, 4, (40, n, 1)), axis=1)
        + 0.04 * rng.standard_normal((40, n, r)) / r**0.5
    )
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    x = np.concatenate([x, _near_threshold_pairs(rng, 40, n, r, t)])
    w = rng.random(x.shape[:2])
    w /= w.sum(axis=-1, keepdims=True)
    monkeypatch.setattr(small, "CHUNK_PAIRS", 2 * n * n)  # several chunks
    plain = fused.sa_euler_step(x, w, 5.0, 0.1)
    for th in (0.03, t, 0.5):
        st = fused.fused_step(x, w, 5.0, 0.1, cluster_threshold=th, means=True)
        np.testing.assert_array_equal(st.points, plain)
        ref = count_clusters(Atoms(x, w), th)
        np.testing.assert_array_equal(st.n_clusters, ref)
        if th == t:  # the pairs at the threshold: some linked, some not
            assert len(np.unique(ref[40:])) > 2
        # (two sums of n terms of total size <= sum w = 1, in different orders: n u apart at most)
        np.testing.assert_allclose(st.means, Atoms(x, w).mean(), rtol=0, atol=n * 1.2e-16)
    xs = x.copy()
    st = fused.fused_step(xs, w, 50.0, 0.5, out=xs, cluster_threshold=t)
    np.testing.assert_array_equal(st.n_clusters, count_clusters(Atoms(x, w), t))
    assert not np.array_equal(
        count_clusters(Atoms(xs, w), t), st.n_clusters
    )  # the step changed the clusters
    # float32 points: read off the step when the float32 rule keeps its logits in float64 (beta = 50), the same
    # count as count_clusters' of the float32 points; with float32 logits (beta = 0.01) an error, or None
    x32 = x.astype(np.float32)
    st = fused.fused_step(x32, w, 50.0, 0.1, cluster_threshold=t, means=True)
    np.testing.assert_array_equal(st.n_clusters, count_clusters(Atoms(x32, w), t))
    np.testing.assert_allclose(
        st.means, Atoms(x32.astype(np.float64), w).mean(), rtol=0, atol=n * 1.2e-16
    )
    for kw in ({"cluster_threshold": 0.1}, {"means": True}, {"energy_sums": True}):
        with pytest.raises(
            ValueError, match=f"{next(iter(kw))} needs a float64 Gram matrix: .* got float32 logits"
        ):
            fused.fused_step(x32, w, 0.01, 0.1, **kw)
    st = fused.fused_step(
        x32, w, 0.01, 0.1, cluster_threshold=t, means=True, energy_sums=True, strict=False
    )
    assert st.n_clusters is None and st.means is None and st.energy_sums is None


@pytest.mark.parametrize("beta", [-400.0, -1000.0, 1000.0])
def test_sa_euler_step_at_large_beta_of_either_sign(rng, beta, monkeypatch):
    """The fixed shift is |beta| + max log-weight (a bound of every logit); for beta < 0 the diagonal term
    e^(-2|beta|) would leave the row sums below range, and each row is shifted by its maximum instead
    (the shift beta + max log-weight overflowed at beta = -400 and divided by zero at -1000).  Both
    routes against the dense step."""
    from wflow.solvers import fused

    for d in (8, 40):
        x = _sphere(rng, (3, 32, d), np.float64)
        w = rng.random((3, 32))
        y = fused.sa_euler_step(x, w, beta, 0.1)
        np.testing.assert_allclose(y, _dense_sa_euler(x, w, beta, 0.1), rtol=0, atol=3e-15)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_sa_euler_step_knows_whether_its_output_is_finite(monkeypatch, dtype):
    """The fused step's finiteness flag (what lets the driver skip its scan of the state) agrees with a scan
    of the output: finite steps, a system with a NaN coordinate, and a token stepped onto
    the origin (GLPR's unprojected step with h = 1, its only weighted neighbour antipodal: x + h A x = 0)."""
    from wflow import sphere
    from wflow.solvers import fused

    x = sphere.uniform(8, 3, seed=4, batch=(5,)).astype(dtype)
    w = np.full((5, 8), 1 / 8)
    bad = x.copy()
    bad[3, 2, 1] = np.nan
    e = np.array([1.0, 0.0, 0.0])
    pair = np.stack([e, -e]).astype(dtype)[None]
    y, finite, counts = fused.fused_step(x, w, 5.0, 0.1)[:3]
    assert finite and counts is None and np.isfinite(y).all()
    y, finite = fused.fused_step(bad, w, 5.0, 0.1)[:2]
    assert not finite and not np.isfinite(y[3]).all() and np.isfinite(y[[0, 1, 2, 4]]).all()
    y, finite = fused.fused_step(pair, np.array([[0.0, 1.0]]), 0.0, 1.0, projected=False)[:2]
    assert not finite and not np.isfinite(y[0, 0]).all()
    y, finite = fused.fused_step(pair, np.array([[0.0, 1.0]]), 0.0, 1.0)[:2]  # projected: no move
    assert finite and np.array_equal(y, pair)


def test_sa_euler_step_rejects_bad_input():
    from wflow.kernels.small import SMALL_MAX
    from wflow.solvers.fused import sa_euler_step

    with pytest.raises(ValueError, match="weights must have shape"):
        sa_euler_step(np.ones((2, 3, 4)), np.ones((2, 4)), 1.0, 0.1)
    with pytest.raises(ValueError, match="n <= "):
        sa_euler_step(np.ones((SMALL_MAX + 1, 3)), np.ones(SMALL_MAX + 1), 1.0, 0.1)
    with pytest.raises(ValueError, match=r"r >= 1, got shape \(2, 3, 0\)"):
        sa_euler_step(np.ones((2, 3, 0)), np.ones((2, 3)), 1.0, 0.1)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n, r", [(1, 3), (2, 8), (7, 3), (32, 8), (5, 12), (33, 17), (64, 64)])
def test_pair_counts_against_numpy(rng, dtype, n, r):
    """Ordered pairs above a threshold, per system, against the dense float64 Gram matrix, at thresholds
    half-way between neighbouring inner products (so no count depends on the last bit); odd n and r take the
    edge rows and columns of the compiled product."""
    from wflow.diagnostics import pairs

    x = _sphere(rng, (3, 2, n, r), dtype)
    x[..., n // 2 :, :] = (
        x[..., :1, :] + 0.01 * x[..., n // 2 :, :]
    )  # half the tokens near the first one
    x64 = x.astype(np.float64)
    G = x64 @ np.swapaxes(x64, -1, -2)
    off = ~np.eye(n, dtype=bool)
    vals = np.unique(G[..., off])
    gaps = np.diff(vals) > 1e-9
    cuts = (0.5 * (vals[:-1] + vals[1:]))[gaps] if vals.size > 1 else np.array([])
    for c in [-2.0, *cuts[:: max(1, cuts.size // 7)]]:
        ref = ((G > c) & off).sum(axis=(-1, -2))
        np.testing.assert_array_equal(pairs.pair_counts(x, c), ref)
    assert pairs.pair_counts(x, -2.0).shape == (3, 2) and int(
        pairs.pair_counts(x, -2.0)[0, 0]
    ) == n * (n - 1)


@pytest.mark.parametrize(
    "d, beta, projected",
    [(8, 4.15, True), (3, 7.08, False), (8, -4.15, True), (12, 3.1, True), (24, 1.77, False)],
)
def test_sa_euler_step_float32_path(rng, d, beta, projected):
    """float32 input whose logits' rounding is provably below 3e-6 per term (|beta| (d + 4) 2^-24 with equal
    weights: 2.97e-6 at beta = 4.15, d = 8) runs in float32 (directions, Gram matrix -- blocked and padded
    at d = 12, the small product at d = 24 --, exponentials, averages): within 1e-7 of dense float64 (the
    output's own rounding is 3e-8; the bound allows 0.1 x 2 x 3e-6 more), and not the float64 path's
    numbers; just beyond the bound the float64 path runs."""
    from wflow.kernels import precision
    from wflow.solvers import fused

    x = _sphere(rng, (64, 32, d), np.float32)
    w = np.full((64, 32), 1 / 32)
    beyond = (
        beta * 1.02
    )  # each beta is 0.985-0.99 of its bound: (d + 4) |beta| 2^-24 above 3e-6 here
    np.testing.assert_array_equal(
        fused.sa_euler_step(x, w, beyond, 0.1, projected=projected),
        fused.sa_euler_step(x.astype(np.float64), w, beyond, 0.1, projected=projected).astype(
            np.float32
        ),
    )

    x = _sphere(rng, (64, 32, d), np.float32)
    w = np.full((64, 32), 1 / 32)
    y = fused.sa_euler_step(x, w, beta, 0.1, projected=projected)
    ref = _dense_sa_euler(x, w, beta, 0.1, projected=projected)
    assert y.dtype == np.float32
    err = np.abs(y - ref).max()
    assert err < 1e-7, err
    y64 = fused.sa_euler_step(x.astype(np.float64), w, beta, 0.1, projected=projected).astype(
        np.float32
    )
    assert np.any(y != y64)  # the float32 path ran
    # zero weights (log-weights clamped at -3e38, a span beyond 60): each row shifted by its maximum, same accuracy
    w2 = w.copy()
    w2[:, ::5] = 0.0
    assert precision.float32_logits_bound(d, abs(beta), fused.step_log_weights(w2), -80.0)[0]
    y2 = fused.sa_euler_step(x, w2, beta, 0.1, projected=projected)
    assert np.abs(y2 - _dense_sa_euler(x, w2, beta, 0.1, projected=projected)).max() < 1e-7
    assert np.any(
        y2
        != fused.sa_euler_step(x.astype(np.float64), w2, beta, 0.1, projected=projected).astype(
            np.float32
        )
    )


def test_float32_logits_rule_against_numpy(rng):
    """The compiled float32 rule (relative log-weights, maxima, span of the nonzero weights) equals its
    NumPy statement, with zero weights (log 0 stands in as -1e300) and log-weights near +-1e38."""
    from wflow.kernels import precision
    from wflow.solvers import fused

    w = rng.random((7, 9))
    w[:, ::4] = 0.0
    w[3] = 0.0  # a system of zero weights only
    for lw in (fused.step_log_weights(w), rng.uniform(-1e38, 1e38, (5, 3)), np.zeros((2, 1))):
        top = np.max(lw, axis=1)
        rel = lw - top[:, None]
        span = float(np.max(-rel[rel > -5e299], initial=0.0))
        for p, size in ((8, 4.0), (3, 1e-3)):
            limit = 2.0**-24 * ((p + 2) * size + 2.0 * min(span, 80.0)) <= 3e-6
            ok, lw32, mx = precision.float32_logits_bound(p, size, lw, -80.0)
            assert ok == limit
            np.testing.assert_array_equal(mx, top)
            np.testing.assert_array_equal(lw32, np.maximum(rel, -3e38).astype(np.float32))
    assert not precision.float32_logits_bound(
        8, 4.0, fused.step_log_weights([[1.0, np.exp(-30.0)]]), -80.0
    )[0]
    assert precision.float32_logits_bound(
        8, 4.0, fused.step_log_weights([[1.0, np.exp(-3.0)]]), -80.0
    )[0]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("d, n", [(13, 32), (17, 32), (33, 9), (64, 5)])
def test_sa_step_and_pair_counts_agree_with_dense(rng, dtype, d, n, monkeypatch):
    """The step equals the dense step (to rounding: the products are summed in other orders), with zero
    weights (each row shifted by its maximum) and without, both schemes, float32 logits at small beta;
    beyond PAIR_COUNTS_FUSED_MAX_DIM the pair counts take batched GEMMs: exact counts on both of their
    routes."""
    from wflow.diagnostics import pairs
    from wflow.kernels import small
    from wflow.solvers import fused

    x = _sphere(rng, (7, n, d), dtype)
    w = rng.random((7, n))
    w[::2, ::3] = 0.0
    monkeypatch.setattr(small, "CHUNK_PAIRS", 2 * n * n)  # several chunks
    for beta, projected in ((5.0, True), (-3.0, False), (0.05, True)):
        np.testing.assert_allclose(
            fused.sa_euler_step(x, w, beta, 0.1, projected=projected),
            _dense_sa_euler(x, w, beta, 0.1, projected=projected),
            rtol=0,
            atol=2e-15 if dtype == np.float64 else 1.5e-7,
        )
    for limit in (0, 10**6):  # no systems: empty results
        monkeypatch.setattr(pairs, "PAIR_COUNTS_FUSED_MAX_DIM", limit)
        assert fused.sa_euler_step(x[:0], w[:0], 1.0, 0.1).shape == (0, n, d)
        assert pairs.pair_counts(x[:0], 0.5).shape == (0,)
    G = x.astype(np.float64) @ np.swapaxes(x.astype(np.float64), -1, -2)
    off = ~np.eye(n, dtype=bool)
    vals = np.unique(G[:, off])
    cuts = (0.5 * (vals[:-1] + vals[1:]))[
        np.diff(vals) > 1e-9
    ]  # between neighbouring inner products
    for route in (0, 10**6):  # the GEMM route, the one-pass route
        monkeypatch.setattr(pairs, "PAIR_COUNTS_FUSED_MAX_DIM", route)
        for c in [-2.0, *cuts[:: max(1, cuts.size // 5)]]:
            np.testing.assert_array_equal(pairs.pair_counts(x, c), ((G > c) & off).sum(axis=(1, 2)))
