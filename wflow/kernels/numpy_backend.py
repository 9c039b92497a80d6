"""Dense NumPy kernel sums, blocked so that temporaries stay near 100 MB for any size."""

from __future__ import annotations

import numpy as np

from .sums import KernelProblem, KernelSums, exp_floor, register_backend

__all__ = ["NumpyBackend", "BLOCK_ELEMENTS"]

#: Largest number of (i, j) pairs held at once; three temporaries of this size in
#: float64 are about 100 MB.
BLOCK_ELEMENTS = 4 * 1024 * 1024


def _shifted_exp(L: np.ndarray, shift: np.ndarray, floor: float) -> np.ndarray:
    """``exp(max(L - shift, floor))`` in place on ``L``."""
    L -= shift[..., None]
    np.maximum(L, floor, out=L)
    np.exp(L, out=L)
    return L


class NumpyBackend:
    """Reference backend: BLAS inner products, then a shifted, clamped exponential.

    The shift is the exact row maximum of :math:`\\ell_{ij} + \\log w_j`; when the
    columns do not fit in one block it is found in a first pass of inner products
    only (cheap beside the exponentials).

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.kernels import KernelProblem
    >>> from wflow.kernels.numpy_backend import NumpyBackend
    >>> x = wflow.sphere.uniform(5, 3, seed=0)[None]  # one system of 5 points on S^2
    >>> problem = KernelProblem(x=x, y=x, weights=np.full((1, 5), 0.2), beta=1.0, Q=None, K=None, V=None,
    ...                         values=False)
    >>> s = NumpyBackend()(problem)
    >>> s.backend, s.mass.shape, s.vector is None
    ('numpy', (1, 5), True)
    >>> bool(np.allclose(np.exp(s.log_scale) * s.mass, np.exp(x[0] @ x[0].T).mean(axis=1)))
    True
    """

    name = "numpy"
    reason = ""

    def available(self) -> bool:
        return True

    def accepts(self, problem: KernelProblem) -> bool:
        return True

    def __call__(self, problem: KernelProblem) -> KernelSums:
        a, b, logw, c = problem.dense_operands()
        B, n, _ = a.shape
        m = b.shape[1]
        floor = exp_floor(a.dtype)
        if B * n * m <= BLOCK_ELEMENTS:
            L = a @ np.swapaxes(b, -1, -2)
            L += logw[:, None, :]
            shift = L.max(axis=-1)
            E = _shifted_exp(L, shift, floor)
            s0 = E.sum(axis=-1)
            s1 = None if c is None else E @ c
            return KernelSums(shift, s0, s1, self.name)
        shift = np.empty((B, n), dtype=a.dtype)
        s0 = np.zeros((B, n), dtype=a.dtype)
        s1 = None if c is None else np.zeros((B, n, c.shape[-1]), dtype=a.dtype)
        rows = min(n, 2048)
        cols = max(1, min(m, BLOCK_ELEMENTS // rows))
        for k in range(B):
            for i0 in range(0, n, rows):
                ai = a[k, i0 : i0 + rows]
                if cols < m:  # first pass: exact row maxima
                    mx = np.full(ai.shape[0], -np.inf, dtype=a.dtype)
                    for j0 in range(0, m, cols):
                        L = ai @ b[k, j0 : j0 + cols].T
                        L += logw[k, j0 : j0 + cols]
                        np.maximum(mx, L.max(axis=1), out=mx)
                else:
                    mx = None
                for j0 in range(0, m, cols):
                    L = ai @ b[k, j0 : j0 + cols].T
                    L += logw[k, j0 : j0 + cols]
                    if mx is None:
                        mx = L.max(axis=1)
                    E = _shifted_exp(L, mx, floor)
                    s0[k, i0 : i0 + rows] += E.sum(axis=1)
                    if s1 is not None and c is not None:  # (s1 is None exactly when c is)
                        s1[k, i0 : i0 + rows] += E @ c[k, j0 : j0 + cols]
                shift[k, i0 : i0 + rows] = mx
        return KernelSums(shift, s0, s1, self.name)


register_backend(NumpyBackend(), auto_priority=100)
