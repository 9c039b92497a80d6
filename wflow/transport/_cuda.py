r"""The multiscale solver's Sinkhorn passes on a GPU (PyTorch CSR tensors, cuSPARSE).

Each pass of :class:`wflow.transport._scaling.Scaling` is two sparse matrix--vector products
with the Gibbs kernel :math:`K` and :math:`K^\top` on a pattern of no block structure (so not
KeOps), bound by memory traffic; here they run on the GPU, the rest of the solver on the
CPU.  In float64 (cuSPARSE multiplies a matrix and a vector of one type): the two engines
follow the same iterates up to the CPU's float32 rounding of the kernel values.
"""

from __future__ import annotations

import os
import sys
import warnings

import numpy as np

from ._scaling import FAR, Scaling
from .sparse_kernels import absorb

__all__ = ["CudaScaling", "cuda_device"]


#: where an NVIDIA driver shows itself (Linux, WSL): without one, PyTorch is not imported
_DRIVER_PATHS = ("/dev/nvidiactl", "/proc/driver/nvidia", "/dev/dxg")


def cuda_device():
    """``torch.device("cuda")`` when PyTorch imports and sees a GPU, else ``None``."""
    if "torch" not in sys.modules and not any(os.path.exists(p) for p in _DRIVER_PATHS):
        return None
    try:
        import torch
    except ImportError:
        return None
    return torch.device("cuda") if torch.cuda.is_available() else None


def _csr(torch, ptr, idx, values, shape):
    with warnings.catch_warnings():  # "Sparse CSR tensor support is in beta state"
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(ptr, idx, values, size=shape, check_invariants=False)


class CudaScaling(Scaling):
    """:class:`~wflow.transport._scaling.Scaling` with its passes on ``device`` (a
    ``torch.device``: a GPU, or the CPU for the tests): the pattern and the scalings live there
    during :meth:`run`, the potentials ``f``, ``g`` on the host."""

    def __init__(self, pat, c, c_csc, a, b, f, g, eps, omega, state, device):
        import torch

        self.torch, self.device = torch, device
        n, m = pat.ptr.size - 1, pat.cptr.size - 1
        # 32-bit indices while they fit (cuSPARSE takes both), as on the CPU
        itype = torch.int32 if pat.nnz < 2**31 - 1 else torch.int64

        def put(arr, dtype=None):
            t = torch.from_numpy(np.ascontiguousarray(arr))
            return t.to(device=device, dtype=dtype if dtype is not None else t.dtype)

        self._shape = (n, m)
        self._ptr, self._cols = put(pat.ptr, itype), put(pat.cols, itype)
        self._cptr, self._crows = put(pat.cptr, itype), put(pat.crows, itype)
        self._rows, self._perm = put(pat.rows, itype), put(pat.perm, itype)
        self._c = put(c, torch.float64)
        self._a, self._b = put(a), put(b)
        self._host_kv = None
        super().__init__(pat, c, c_csc, a, b, f, g, eps, omega, state)

    # -- the engine primitives ----------------------------------------------------------------
    def _kernel(self):
        torch = self.torch
        f, g = torch.from_numpy(self.f).to(self.device), torch.from_numpy(self.g).to(self.device)
        kv = f[self._rows]
        kv += g[self._cols]
        kv -= self._c
        kv /= self.eps
        kv.exp_()
        # as on the CPU: a kernel value above float32's range (potentials absorbed from a
        # diverging iterate) is clipped, any nonnegative kernel still gives a plan
        kv.clamp_(max=float(np.finfo(np.float32).max))
        n, m = self._shape
        self._K = _csr(torch, self._ptr, self._cols, kv, (n, m))
        self._KT = _csr(torch, self._cptr, self._crows, kv[self._perm], (m, n))
        self._kv, self._host_kv = kv, None
        self._u, self._v = self._a.clone(), self._b.clone()
        self.u, self.v = self.a.copy(), self.b.copy()

    @property
    def kv(self):
        """The kernel values in CSR order, on the host (copied once per kernel)."""
        if self._host_kv is None:
            self._host_kv = self._kv.cpu().numpy()
        return self._host_kv

    def _step(self, K, z, target, s_old, w):
        """Over-relaxed ``s_old <- s_old (target / (s_old K z))^w`` where finite and > 0;
        returns the L1 error of ``s_old K z`` against ``target``."""
        torch = self.torch
        s = torch.mv(K, z)
        r = s_old * s
        err = (r - target).abs().sum()
        plain = target / s
        new = plain if w == 1.0 else torch.where(r > 0, s_old * (target / r) ** w, plain)
        ok = (s > 0) & (new > 0) & torch.isfinite(new)
        return torch.where(ok, new, s_old), err

    def _pass(self, w):
        self._u, err = self._step(self._K, self._v, self._a, self._u, w)
        self._v, _ = self._step(self._KT, self._u, self._b, self._v, w)
        return float(err)

    def _far(self):
        torch = self.torch
        ru, rv = self._u / self._a, self._v / self._b
        hi_u, hi_v, lo_u, lo_v = torch.stack([ru.max(), rv.max(), ru.min(), rv.min()]).tolist()
        return max(hi_u, hi_v) > FAR or min(lo_u, lo_v) < 1.0 / FAR

    def _save(self):
        return (self.f.copy(), self.g.copy(), self._u.clone(), self._v.clone())

    def _restore(self, saved):
        self.f[:], self.g[:] = saved[0], saved[1]
        self._kernel()
        self._u, self._v = saved[2].clone(), saved[3].clone()

    def _finish(self):
        self.u, self.v = self._u.cpu().numpy(), self._v.cpu().numpy()

    def absorb(self):
        """Move the scalings into the potentials (the plan is unchanged)."""
        self._finish()
        absorb(self.f, self.u, self.a, self.eps)
        absorb(self.g, self.v, self.b, self.eps)
        self._kernel()
