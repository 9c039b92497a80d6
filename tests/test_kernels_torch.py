"""The PyTorch backend agrees with the NumPy backend (the reference), on the CPU build of PyTorch.

float64 results must agree to 1e-12 relative (logits up to 1000, as for the numba backend).
float32 logits are rounded in float32, so a term e^l is uncertain by about 3 u |l|
(u = 6e-8) and the float32 tolerance grows with beta: 1e-5 up to beta = 10, 3e-4 at 1000.
"""

from __future__ import annotations

import numpy as np
import pytest

import wflow
from wflow.density import Density
from wflow.kernels import AUTO_ORDER, BACKENDS, kernel_sums
from wflow.kernels import torch_backend as tb
from wflow.mesh import CircleMesh

U32 = float(np.finfo(np.float32).eps)


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def _sphere(rng, shape, dtype):
    x = rng.standard_normal(shape)
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(dtype)


def _problem(rng, dtype, batch=(), n=37, m=300, d=3, p=None, q=None):
    x = _sphere(rng, (*batch, n, d), dtype)
    y = _sphere(rng, (*batch, m, d), dtype)
    w = rng.random((*batch, m))
    w[..., ::5] = 0.0  # zero weights: log w = -inf
    w = (w / w.sum(axis=-1, keepdims=True)).astype(dtype)
    mats = {}
    if p is not None:
        mats["Q"] = (rng.standard_normal((p, d)) / np.sqrt(d)).astype(dtype)
        mats["K"] = (rng.standard_normal((p, d)) / np.sqrt(d)).astype(dtype)
    if q is not None:
        mats["V"] = rng.standard_normal((q, d)).astype(dtype)
    return x, y, w, mats


def _check(got, x, y, w, beta, mats, values=True, logit_scale=None):
    """``got`` against the NumPy backend run in float64 on the same numbers."""
    dtype = x.dtype.type
    up = {k: v.astype(np.float64) for k, v in mats.items()}
    ref = kernel_sums(
        x.astype(np.float64), y.astype(np.float64), w.astype(np.float64), beta,
        values=values, backend="numpy", **up,
    )  # fmt: skip
    scale = abs(beta) if logit_scale is None else logit_scale
    if dtype == np.float64:
        rtol = 1e-12 * max(1.0, scale / 1000.0)
    else:
        rtol = max(1e-5, 10 * U32 * scale)
    assert got.backend == "torch"
    assert got.log_scale.dtype == dtype and got.mass.dtype == dtype
    assert got.log_scale.shape == ref.log_scale.shape
    np.testing.assert_allclose(got.log_scale, ref.log_scale, rtol=rtol, atol=rtol)
    # the true sums e^c s0 agree: e^(c - c_ref) s0 = s0_ref
    mass = got.mass.astype(np.float64) * np.exp(got.log_scale.astype(np.float64) - ref.log_scale)
    np.testing.assert_allclose(mass, ref.mass, rtol=rtol)
    if not values:
        assert got.vector is None
        return
    assert got.vector.dtype == dtype and got.vector.shape == ref.vector.shape
    sa, sa_ref = got.softmax_average(), ref.softmax_average()
    size = np.max(np.abs(sa_ref), axis=-1, keepdims=True)  # components may cancel
    err = np.max(np.abs(sa - sa_ref) / size)
    assert err <= rtol, f"softmax average differs by {err:.3g} relative (tolerance {rtol})"


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("beta", [0.0, 1.0, 100.0, 1000.0])
def test_identity_qkv_agrees_with_numpy(torch, rng, dtype, beta):
    x, y, w, mats = _problem(rng, dtype)
    _check(kernel_sums(x, y, w, beta, backend="torch:cpu"), x, y, w, beta, mats)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("d, p, q", [(3, 5, 2), (8, 8, 8)])
def test_general_qkv_agrees_with_numpy(torch, rng, dtype, d, p, q):
    x, y, w, mats = _problem(rng, dtype, d=d, p=p, q=q)
    got = kernel_sums(x, y, w, 1000.0, backend="torch", **mats)  # "auto" device: the CPU here
    a, b = np.abs(x @ mats["Q"].T).astype(np.float64), np.abs(y @ mats["K"].T).astype(np.float64)
    _check(got, x, y, w, 1000.0, mats, logit_scale=1000.0 * float(np.max(a @ b.T)))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_batched_agrees_with_numpy(torch, rng, dtype):
    x, y, w, mats = _problem(rng, dtype, batch=(3, 5), n=9, m=13, d=8, q=4)
    got = kernel_sums(x, y, w, 1000.0, backend="torch:cpu", **mats)
    assert got.log_scale.shape == (3, 5, 9) and got.vector.shape == (3, 5, 9, 4)
    _check(got, x, y, w, 1000.0, mats)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_values_false(torch, rng, dtype):
    x, y, w, mats = _problem(rng, dtype, d=4)
    got = kernel_sums(x, y, w, 10.0, values=False, backend="torch:cpu")
    _check(got, x, y, w, 10.0, mats, values=False)


@pytest.mark.parametrize("budget", [300, 300 * 37 * 2, 1000])
def test_blocks_of_rows_and_of_systems(torch, rng, monkeypatch, budget):
    """Blocks of some rows of one system, of whole systems, and of one row (budget < m)."""
    monkeypatch.setattr(tb.TorchBackend, "block_elements", staticmethod(lambda device: budget))
    blocks = list(tb._blocks(5, 37, 300, budget))
    covered = np.zeros((5, 37), dtype=int)
    for ks, rs in blocks:
        covered[ks, rs] += 1
    assert np.all(covered == 1) and len(blocks) == {300: 5 * 37, 22200: 3, 1000: 5 * 13}[budget]
    x, y, w, mats = _problem(rng, np.float64, batch=(5,), q=3)
    _check(kernel_sums(x, y, w, 300.0, backend="torch:cpu", **mats), x, y, w, 300.0, mats)


def test_simulate_with_torch_matches_numpy(torch):
    """The particle solver (SA on S^2, beta = 9) with the torch backend: the NumPy run to round-off."""
    mu0 = wflow.sphere.uniform(48, 3, seed=1)
    run = lambda backend: (
        wflow.simulate(
            wflow.SA(9.0), mu0, 2.0, dt=0.05, save_at=[0.0, 1.0, 2.0], backend=backend
        ).points
    )
    ref, got = run("numpy"), run("torch")
    assert np.max(np.abs(ref[-1] - ref[0])) > 0.1  # the tokens moved
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-12)


def test_solve_density_with_torch_matches_numpy(torch):
    """The finite-volume solver (SA on the circle) with the torch backend: NumPy's run to round-off."""
    rho0 = Density.from_function(CircleMesh(64), lambda x: 1 + 0.8 * x[:, 0])
    run = lambda backend: (
        wflow.solve_density(
            wflow.SA(4.0), rho0, 1.0, dt=0.01, save_at=[0.0, 0.5, 1.0], backend=backend
        ).values
    )
    ref, got = run("numpy"), run("torch")
    assert np.max(np.abs(ref[-1] - ref[0])) > 0.1 * np.max(ref[0])  # the density moved
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=0)


def test_auto_on_a_cpu_only_machine_does_not_pick_torch(torch, rng):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: auto may pick torch for large problems")
    assert "torch" in BACKENDS and AUTO_ORDER.index("torch") < AUTO_ORDER.index("numba")
    x, y, w, _ = _problem(rng, np.float64, n=1000, m=1000)  # 10^6 pairs: large enough for a GPU
    assert kernel_sums(x, y, w, 1.0).backend != "torch"


def test_cuda_without_a_gpu_is_one_line(torch, rng):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    x, y, w, _ = _problem(rng, np.float64, n=4, m=5)
    with pytest.raises(ValueError, match="sees no CUDA GPU: choose backend='torch:cpu'") as e:
        kernel_sums(x, y, w, 1.0, backend="torch:cuda")
    assert "\n" not in str(e.value)


def test_unknown_device_and_a_backend_without_devices(rng):
    x, y, w, _ = _problem(rng, np.float64, n=4, m=5)
    with pytest.raises(ValueError, match="takes a device in .* got 'gpu'"):
        kernel_sums(x, y, w, 1.0, backend="torch:gpu")
    with pytest.raises(
        ValueError, match="backend 'numpy' takes no device, got backend='numpy:cpu'"
    ):
        kernel_sums(x, y, w, 1.0, backend="numpy:cpu")


def test_torch_missing_says_how_to_install(rng, monkeypatch):
    """Where PyTorch is not installed (simulated here): one line naming it and the install command."""
    monkeypatch.setattr(tb, "_torch_installed", lambda: False)
    x, y, w, _ = _problem(rng, np.float64, n=4, m=5)
    with pytest.raises(ValueError, match=r"PyTorch is not installed: pip install") as e:
        kernel_sums(x, y, w, 1.0, backend="torch")
    assert "\n" not in str(e.value) and "backend='numba'" in str(e.value)
    assert kernel_sums(x, y, w, 1.0).backend != "torch"  # auto never asks for it


def test_the_device_script_runs_on_the_cpu(capsys):
    """``python -m benchmarks.gpu --device cpu --quick``: every table filled, the sums right."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu.py"
    spec = importlib.util.spec_from_file_location("benchmarks_gpu", path)
    assert spec is not None and spec.loader is not None
    gpu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu)  # the installed wflow, not the checkout's (under CI)
    assert gpu.main(["--device", "cpu", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "## KeOps probe" in out and "not run: no NVIDIA driver" in out
    sums = [r.split("|")[1:-1] for r in out.splitlines() if r.startswith("| 3000 |")]
    names = ["numba", "spectral"] + (["torch:cpu"] if tb._torch_installed() else [])
    assert sorted({r[1].strip() for r in sums}) == sorted(names)
    for _, name, dtype, rows, *_, err in sums:
        assert int(rows) == (2000 if name.strip() == "numba" else 3000)
        assert float(err) < (1e-12 if dtype.strip() == "float64" else 1e-4), (name, dtype, err)
    runs = [r.split("|")[1:-1] for r in out.splitlines() if r.startswith("| 128 |")]
    assert len(runs) == len(names)
    for _, name, seconds, steps, evaluations, *_, reached in runs:
        assert int(evaluations) > 5 * int(steps) > 0, (
            name
        )  # dopri5: 6 stages a step, the first reused
        assert reached.strip() == "30" or reached.strip().endswith("(budget)"), name
