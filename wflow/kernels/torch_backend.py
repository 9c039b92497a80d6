r"""PyTorch kernel sums: the dense NumPy route on a CUDA GPU (or on the CPU), in blocks.

For each block of query rows the logits :math:`\ell_{ij} + \log w_j` of all sources are formed
at once (one batched matrix product), their row maximum :math:`c_i` is the log-scale, and one
more product with :math:`(1, V y_j)` gives :math:`s^0_i` and :math:`s^1_i`.  A block holds at most
``block_elements`` pairs (or one full row of sources, if that is more).

PyTorch is an optional dependency (``pip install ".[torch]"``), imported on the first sum.
``backend="torch"`` runs on the GPU when PyTorch sees one, else on the CPU;
``backend="torch:cuda"`` and ``backend="torch:cpu"`` choose the device.
``backend="auto"`` picks it for large problems on a machine with an NVIDIA GPU where KeOps
is not usable (see :func:`wflow.kernels.keops_backend.keops_probe`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..errors import WflowError
from .keops_backend import nvidia_driver_present
from .sums import KernelProblem, KernelSums, exp_floor, register_backend

__all__ = ["TorchBackend", "DEVICES", "INSTALL_HINT"]

#: Devices ``backend="torch:<device>"`` accepts; ``"auto"`` is the GPU when PyTorch sees one.
DEVICES = ("auto", "cpu", "cuda")
#: How to get PyTorch, in the error raised where it is missing.
INSTALL_HINT = 'pip install ".[torch]" in a checkout of wflow (or "wflow-meanfield[torch]")'


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise WflowError(
            f"backend 'torch' needs PyTorch, which cannot be imported ({exc}): {INSTALL_HINT}, "
            f"or choose backend='numba' or 'numpy'"
        ) from exc
    return torch


class TorchBackend:
    """Kernel sums with PyTorch tensors, blocked over query rows (see module docstring).

    Parameters
    ----------
    device : {"auto", "cpu", "cuda"}
        Where the sums run; ``"auto"``: the GPU when ``torch.cuda.is_available()``, else the CPU.

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.kernels import kernel_sums
    >>> from wflow.kernels.torch_backend import TorchBackend
    >>> TorchBackend("cpu").device, TorchBackend().block_elements("cpu")
    ('cpu', 4194304)
    >>> x = wflow.sphere.uniform(4, 3, seed=0)
    >>> s = kernel_sums(x, x, np.full(4, 0.25), 2.0, backend="torch:cpu")  # doctest: +SKIP
    >>> bool(np.allclose(np.exp(s.log_scale) * s.mass, np.exp(2.0 * x @ x.T).mean(axis=1)))  # doctest: +SKIP
    True

    The sums are not run as a doctest: PyTorch is optional (``tests/test_kernels_torch.py``).
    """

    name = "torch"
    #: ``"auto"`` picks this backend (on a GPU) for at least this many pairs ``B n m``
    min_pairs_auto = 10**6

    def __init__(self, device: str = "auto") -> None:
        if device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
        self.device = device
        self._variants: dict[str, TorchBackend] = {}

    @staticmethod
    def block_elements(device: str) -> int:
        """Pairs held at once: 4 Mi on the CPU (the NumPy backend's block), 64 Mi on a GPU, where
        each block costs a few kernel launches."""
        return 2**26 if device == "cuda" else 2**22

    def on_device(self, device: str) -> TorchBackend:
        """This backend on ``device`` (``backend="torch:<device>"``)."""
        if device not in DEVICES:
            raise ValueError(
                f"backend 'torch:<device>' takes a device in {DEVICES}, got {device!r}"
            )
        if device == self.device:
            return self
        if device not in self._variants:
            self._variants[device] = TorchBackend(device)
        return self._variants[device]

    @property
    def reason(self) -> str:
        """Why :meth:`available` is false (one line), else ``""``."""
        if not _torch_installed():
            return f"PyTorch is not installed: {INSTALL_HINT}, or choose backend='numba' or 'numpy'"
        if self.device == "cuda" and not _cuda(_import_torch()):
            torch = _import_torch()
            build = (
                "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
            )
            return (
                f"PyTorch {torch.__version__} ({build}) sees no CUDA GPU: choose backend='torch:cpu', "
                f"'numba' or 'numpy'"
            )
        return ""

    def available(self) -> bool:
        """PyTorch is installed (asks no import), and a GPU is visible for ``device="cuda"``."""
        if not _torch_installed():
            return False
        return self.device != "cuda" or _cuda(_import_torch())

    def accepts(self, problem: KernelProblem) -> bool:
        return True

    def accepts_auto(self, problem: KernelProblem) -> bool:
        """Large problems on a machine whose NVIDIA GPU PyTorch sees (never on a CPU-only one)."""
        return (
            problem.pairs >= self.min_pairs_auto
            and self.device != "cpu"
            and nvidia_driver_present()
            and _torch_installed()
            and _cuda(_import_torch())
        )

    def resolved_device(self) -> str:
        """``"cuda"`` or ``"cpu"``: where the next sum runs."""
        if self.device != "auto":
            return self.device
        return "cuda" if _cuda(_import_torch()) else "cpu"

    def __call__(self, problem: KernelProblem) -> KernelSums:
        torch = _import_torch()
        device = self.resolved_device()
        if device == "cuda" and not _cuda(torch):
            raise WflowError(f"backend 'torch:cuda' is not available: {self.reason}")
        a_np, b_np, logw_np, c_np = problem.dense_operands()
        dtype = a_np.dtype
        B, n, _ = a_np.shape
        m = b_np.shape[1]
        g_np = np.ones((B, m, 1), dtype=dtype)
        if c_np is not None:
            g_np = np.concatenate([g_np, c_np], axis=-1)

        def put(arr: np.ndarray) -> Any:
            return torch.from_numpy(np.ascontiguousarray(arr)).to(device)

        a, bt, g = put(a_np), put(b_np).transpose(1, 2), put(g_np)
        logw = put(logw_np).unsqueeze(1)  # (B, 1, m)
        floor = exp_floor(dtype)
        shift = torch.empty((B, n), dtype=a.dtype, device=device)
        out = torch.empty((B, n, g.shape[-1]), dtype=a.dtype, device=device)
        budget = self.block_elements(device)
        with torch.no_grad():
            for ks, rs in _blocks(B, n, m, budget):
                L = torch.baddbmm(logw[ks], a[ks, rs], bt[ks])  # (k, r, m) logits + log w
                c = L.amax(dim=-1)
                L.sub_(c.unsqueeze(-1)).clamp_(min=floor).exp_()
                shift[ks, rs] = c
                out[ks, rs] = torch.bmm(L, g[ks])
                del L
        out_np = out.cpu().numpy()
        vector = np.ascontiguousarray(out_np[..., 1:]) if c_np is not None else None
        return KernelSums(
            shift.cpu().numpy(), np.ascontiguousarray(out_np[..., 0]), vector, self.name
        )


def _blocks(B: int, n: int, m: int, budget: int) -> Iterator[tuple[slice, slice]]:
    """``(systems, rows)`` slices covering ``(B, n)`` with at most ``max(budget, m)`` pairs each."""
    if n * m <= budget:
        k = max(1, budget // (n * m))
        for k0 in range(0, B, k):
            yield slice(k0, k0 + k), slice(0, n)
        return
    rows = max(1, budget // m)
    for k0 in range(B):
        for i0 in range(0, n, rows):
            yield slice(k0, k0 + 1), slice(i0, i0 + rows)


def _torch_installed() -> bool:
    """Whether PyTorch is installed, without importing it (which takes seconds)."""
    return importlib.util.find_spec("torch") is not None


def _cuda(torch: Any) -> bool:
    return bool(torch.cuda.is_available())


register_backend(TorchBackend(), auto_priority=1)
