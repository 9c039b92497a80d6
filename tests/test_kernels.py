from pathlib import Path

import numpy as np
import pytest

from wflow import sphere
from wflow.kernels import BACKENDS, kernel_sums, numpy_backend


def naive(x, y, w, beta, Q=None, K=None, V=None):
    """Direct sums in extended precision-free form (small beta only)."""
    Q = np.eye(x.shape[-1]) if Q is None else Q
    K = np.eye(x.shape[-1]) if K is None else K
    V = np.eye(x.shape[-1]) if V is None else V
    E = np.exp(beta * (x @ Q.T) @ (y @ K.T).T) * w
    return E.sum(1), E @ (y @ V.T)


def test_against_naive_general_qkv(rng):
    x, y = sphere.uniform(40, 3, rng), sphere.uniform(30, 3, rng)
    w = rng.uniform(size=30)
    Q, K, V = rng.standard_normal((4, 3)), rng.standard_normal((4, 3)), rng.standard_normal((3, 3))
    s = kernel_sums(x, y, w, 1.3, Q=Q, K=K, V=V, backend="numpy")
    m0, m1 = naive(x, y, w, 1.3, Q, K, V)
    np.testing.assert_allclose(s.total_mass(), m0, rtol=1e-13)
    np.testing.assert_allclose(s.total(), m1, rtol=1e-12, atol=1e-13 * np.abs(m1).max())


@pytest.mark.parametrize("beta", [0.0, 1.0, 100.0, 1000.0])
def test_blocked_equals_unblocked_and_finite(beta, rng, monkeypatch):
    x = sphere.uniform(70, 3, rng)
    w = rng.uniform(size=70)
    w[3] = 0.0
    full = kernel_sums(x, x, w, beta, backend="numpy")
    monkeypatch.setattr(numpy_backend, "BLOCK_ELEMENTS", 100)
    blocked = kernel_sums(x, x, w, beta, backend="numpy")
    for s in (full, blocked):
        assert np.all(np.isfinite(s.log_scale)) and np.all(np.isfinite(s.vector))
        assert np.all(s.mass >= 1.0 - 1e-12)  # the largest term is exactly 1 after the shift
    np.testing.assert_allclose(blocked.log_scale, full.log_scale, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(
        blocked.softmax_average(), full.softmax_average(), rtol=1e-13, atol=1e-15
    )


def test_shift_is_exact_row_maximum(rng):
    x = sphere.uniform(20, 3, rng)
    w = np.full(20, 0.05)
    s = kernel_sums(x, x, w, 1000.0, backend="numpy")
    np.testing.assert_allclose(s.log_scale, 1000.0 + np.log(0.05), rtol=1e-14)


def test_float32_matches_float64(rng):
    x = sphere.uniform(200, 3, rng)
    w = np.full(200, 1 / 200)
    s64 = kernel_sums(x, x, w, 100.0, backend="numpy")
    s32 = kernel_sums(
        x.astype(np.float32), x.astype(np.float32), w.astype(np.float32), 100.0, backend="numpy"
    )
    assert s32.vector.dtype == np.float32
    np.testing.assert_allclose(s32.softmax_average(), s64.softmax_average(), rtol=2e-4, atol=2e-5)


def test_batched_equals_loop(rng):
    x = sphere.uniform(6, 4, rng, batch=(3, 2))
    w = rng.uniform(size=(3, 2, 6))
    s = kernel_sums(x, x, w, 2.0, backend="numpy")
    for i in range(3):
        for j in range(2):
            r = kernel_sums(x[i, j], x[i, j], w[i, j], 2.0, backend="numpy")
            np.testing.assert_allclose(s.softmax_average()[i, j], r.softmax_average(), rtol=1e-14)


@pytest.mark.parametrize("beta", [0.5, 10.0, 1000.0])
def test_numpy_and_keops_agree(beta, rng, keops_ready):
    x, y = sphere.uniform(300, 3, rng), sphere.uniform(257, 3, rng)
    w = rng.uniform(size=257)
    a = kernel_sums(x, y, w, beta, backend="numpy")
    b = kernel_sums(x, y, w, beta, backend="keops")
    assert b.backend == "keops"
    np.testing.assert_allclose(b.log_scale, a.log_scale, rtol=1e-14)
    np.testing.assert_allclose(b.mass, a.mass, rtol=1e-12)
    np.testing.assert_allclose(b.vector, a.vector, rtol=1e-12, atol=1e-12 * np.abs(a.vector).max())


def test_bad_arguments(rng):
    x = sphere.uniform(5, 3, rng)
    w = np.full(5, 0.2)
    with pytest.raises(ValueError, match="backend"):
        kernel_sums(x, x, w, 1.0, backend="fortran")
    with pytest.raises(ValueError, match="Q must have shape"):
        kernel_sums(x, x, w, 1.0, Q=np.eye(2))
    with pytest.raises(ValueError, match="weights must have shape"):
        kernel_sums(x, x, w[:4], 1.0)
    with pytest.raises(ValueError, match="beta must be finite"):
        kernel_sums(x, x, w, np.inf)
    with pytest.raises(ValueError, match=r"weights must be finite and non-negative, got -0\.2"):
        kernel_sums(x, x, -w, 1.0)
    with pytest.raises(ValueError, match="weights must be finite and non-negative, got nan"):
        kernel_sums(x, x, np.where(np.arange(5) == 2, np.nan, w), 1.0)
    with pytest.raises(ValueError, match="every weight of a system is zero"):
        kernel_sums(np.stack([x, x]), np.stack([x, x]), np.stack([w, 0 * w]), 1.0)
    with pytest.raises(ValueError, match="x and y must be finite"):
        kernel_sums(np.where(x > 0.5, np.inf, x), x, w, 1.0)
    assert "numpy" in BACKENDS


@pytest.mark.parametrize("which", ["x", "y"])
def test_complex_points_are_refused_naming_the_argument(which):
    from wflow.kernels import kernel_sums

    x = sphere.uniform(5, 3, seed=0)
    args = {"x": x, "y": x}
    args[which] = x.astype(complex)
    with pytest.raises(
        TypeError, match=rf"^{which} must be a real array of points, got dtype complex"
    ):
        kernel_sums(args["x"], args["y"], np.full(5, 0.2), 1.0, backend="numpy")


def test_a_truncated_keops_cache_index_is_rebuilt(tmp_path):
    """A process stopped by a file size limit while KeOps saved its cache index at exit left a truncated
    pickle, and every later import of pykeops failed ('pickle data was truncated'): wflow drops the
    index of its own cache folder and imports again."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, WFLOW_KEOPS_CACHE=str(tmp_path), KEOPS_CACHE_FOLDER=str(tmp_path))
    probe = (
        "import wflow.kernels.keops_backend as kb; pk = kb.import_pykeops(); "
        "print(pk.get_build_folder() if pk is not None else 'UNAVAILABLE ' + str(kb._IMPORT_ERROR))"
    )
    first = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    build = first.stdout.strip().splitlines()[-1]
    if build.startswith("UNAVAILABLE"):
        pytest.skip(f"pykeops unavailable: {build}")
    host = [p for p in Path(build).iterdir() if p.is_dir()]  # KeOps' folder for this machine
    for folder in host or [Path(build)]:
        (folder / "get_keops_dll_impl_cache.pkl").write_bytes(b"\x80\x04\x95\x10\x00")  # truncated
    again = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert again.stdout.strip().splitlines()[-1] == build, again.stderr[-2000:]
