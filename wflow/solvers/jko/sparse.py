r"""The JKO step's Gibbs kernel without the dense cost matrix: adaptive truncation in linear memory.

:class:`SparseCost` keeps the pairs with
:math:`C_{ij} - \bar g_j - \varepsilon\log r_j \le \min_k(C_{ik} - \bar g_k - \varepsilon\log r_k) + \Theta\varepsilon`
(a k-d tree search, :func:`wflow.transport.certify.threshold_pairs`, Schmitzer 2019) in CSR form:
memory linear in the cells at fixed :math:`\varepsilon/h^2` (``docs/jko.md``, "Large meshes").
"""

from __future__ import annotations

import numpy as np
from scipy import sparse

from ...sphere import cost_matrix
from ...transport.certify import cmax, threshold_pairs
from ...transport.sparse_kernels import gibbs, pattern_costs, sparse_softmin

__all__ = ["THETA_SPARSE", "DENSE_MAX_CELLS", "SparseCost", "sparse_blur_variance"]

#: kept pairs: within e^{-THETA_SPARSE} of their row's largest kernel entry (2.3e-16 of its mass)
THETA_SPARSE = 36.0
#: supports up to this many points keep the dense cost matrix (200 MB at 5000; faster there)
DENSE_MAX_CELLS = 5000
_ROWS = 5000  # queries per k-d tree call: bounds the search's temporaries (~100 MB at k = 512)


class SparseCost:
    r"""Squared distances on a point cloud, evaluated only on the pairs a truncated kernel keeps.

    Parameters
    ----------
    x : ndarray, shape (n, 3)
        Support points on the sphere.
    cost : {"geodesic", "chordal"}
        :math:`C_{ij} = \theta_{ij}^2` or :math:`|x_i - x_j|^2`.
    theta : float, optional
        Truncation level :math:`\Theta` (entries below :math:`e^{-\Theta}` of their row's maximum
        are dropped); default ``THETA_SPARSE``.

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.mesh import SphereMesh
    >>> from wflow.sphere import cost_matrix
    >>> from wflow.solvers.jko.sparse import SparseCost
    >>> mesh = SphereMesh(8)
    >>> sc = SparseCost(mesh.centers, "geodesic")
    >>> ptr, cols, c = sc.pattern(np.zeros(mesh.n_cells), 0.01)
    >>> C = cost_matrix(mesh.centers)
    >>> bool(np.allclose(c, C[np.repeat(np.arange(mesh.n_cells), np.diff(ptr)), cols], atol=1e-14))
    True
    >>> bool(np.all((C <= 0.36 * (1 - 1e-9)).sum(axis=1) <= np.diff(ptr)))  # every pair with C <= 36 eps
    True
    """

    def __init__(self, x: np.ndarray, cost: str, theta: float | None = None):
        if cost not in ("geodesic", "chordal"):
            raise ValueError(f"cost must be 'geodesic' or 'chordal', got {cost!r}")
        theta = THETA_SPARSE if theta is None else theta
        if not (isinstance(theta, (int, float)) and np.isfinite(theta) and theta > 0):
            raise ValueError(f"theta must be a positive number, got {theta!r}")
        self.x = np.ascontiguousarray(x, dtype=np.float64)
        self.n = self.x.shape[0]
        self.cost = cost
        self.geodesic = cost == "geodesic"
        self.theta = float(theta)
        self.nnz = 0

    def max(self) -> float:
        """The largest possible cost (the squared diameter)."""
        return cmax(self.geodesic)

    def pattern(self, pot: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        r"""CSR ``(ptr, cols, c)`` of the pairs with :math:`C_{ij} - pot_j \le \min_k(C_{ik} - pot_k) + \Theta\varepsilon`."""
        n = self.n
        # first guess of the candidates per row: 1.4x the kept disc's cells on S^2; the search grows it
        k = 128
        if self.x.shape[1] == 3:
            k = int(min(n, max(32, 1.4 * self.theta * eps * n / 4.0 + 16)))
        counts = np.zeros(n, dtype=np.int64)
        parts = []
        for i in range(0, n, _ROWS):
            q = self.x[i : i + _ROWS]
            rows, cols = threshold_pairs(
                q, self.x, pot, None, self.geodesic, self.theta * eps, k=k, k_max=n, k_min=1
            )
            order = np.argsort(rows, kind="stable")
            parts.append(cols[order].astype(np.int32))
            counts[i : i + q.shape[0]] = np.bincount(rows, minlength=q.shape[0])
            del rows, cols, order
        ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=ptr[1:])
        cols = np.concatenate(parts)
        del parts
        self.nnz = int(ptr[-1])
        if self.nnz < 2**31:
            ptr = ptr.astype(np.int32)
        c = pattern_costs(self.x, self.x, ptr, cols, self.geodesic)
        return ptr, cols, c

    def kernel(
        self, gbar: np.ndarray, logr: np.ndarray, eps: float
    ) -> tuple[sparse.csr_matrix, np.ndarray]:
        r"""The truncated kernel, rows normalized to sum 1, and its row potential :math:`\bar f`.

        :math:`\bar f_i = -\varepsilon\log\sum_j r_j e^{(\bar g_j - C_{ij})/\varepsilon}` over the kept
        pairs, :math:`K_{ij} = r_j e^{(\bar f_i + \bar g_j - C_{ij})/\varepsilon}`.
        """
        ptr, cols, c = self.pattern(gbar + eps * logr, eps)
        fbar = np.empty(self.n)
        sparse_softmin(ptr, cols, c, gbar, logr, eps, fbar)
        data = gibbs(ptr, cols, c, fbar, gbar + eps * logr, eps)
        del c
        K = sparse.csr_matrix((data, cols, ptr), shape=(self.n, self.n), copy=False)
        return K, fbar

    def column_logsumexp(
        self, f: np.ndarray, logw: np.ndarray, eps: float, cols: np.ndarray
    ) -> np.ndarray:
        r""":math:`\log\sum_i w_i e^{(f_i - C_{ij})/\varepsilon}` for the columns ``cols``, over all rows (exact)."""
        out = np.empty(cols.size)
        step = max(1, 2**21 // self.n)
        for s in range(0, cols.size, step):
            cj = cols[s : s + step]
            E = (f[None, :] - cost_matrix(self.x[cj], self.x, cost=self.cost)) / eps + logw[None, :]
            m = E.max(axis=1)
            out[s : s + step] = m + np.log(np.sum(np.exp(E - m[:, None]), axis=1))
        return out


def sparse_blur_variance(sc: SparseCost, r: np.ndarray, eps: float, dim: int) -> float:
    r"""Per-direction variance of the blur kernel :math:`r_j e^{-C_{ij}/\varepsilon}`, averaged over rows.

    The truncated counterpart of :func:`~wflow.solvers.jko.transport.blur_variance` (same value
    to :math:`e^{-\Theta}` relative).
    """
    ptr, cols, c = sc.pattern(eps * np.log(r), eps)
    w = np.multiply(c, -1.0 / eps)
    np.exp(w, out=w)
    w *= np.take(r, cols)
    del cols
    starts = ptr[:-1]  # every row keeps at least its best pair: no empty segment
    den = np.add.reduceat(w, starts)
    w *= c
    num = np.add.reduceat(w, starts)
    return float(np.mean(num / den)) / dim
