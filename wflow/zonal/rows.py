r"""Kernel sums against fixed sources, dense or by a verified panel Chebyshev factorization.

.. math::

    S_0(f) = \sum_j w_j\,k(z_f, y_j)\,e^{-t_f}, \qquad S_1(f) = \sum_j w_j\,k(z_f, y_j)\,h(z_f, y_j)\,e^{-t_f}

over fixed rows :math:`z_f` and sources :math:`y_j`, :math:`t_f` the row maximum of :math:`\log k`
(``docs/zonal.md`` §6, "Kernel sums").
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .kernel import zonal_kernel_unchecked

__all__ = ["KernelRows"]

#: kernel rows computed per block when building dense matrices (temporaries ~ block * S * 8 bytes * ~10)
_BLOCK_ELEMENTS = 1 << 19
#: rows compared with the dense kernel when a factorization is verified
_CHECK_ROWS = 48


def _chebyshev(r: int) -> tuple[np.ndarray, np.ndarray]:
    """First-kind Chebyshev points on [-1, 1] and their barycentric weights (Berrut & Trefethen 2004)."""
    theta = (2 * np.arange(r) + 1) * np.pi / (2 * r)
    return np.cos(theta), (-1.0) ** np.arange(r) * np.sin(theta)


def _lagrange(x: np.ndarray, nodes: np.ndarray, bw: np.ndarray) -> np.ndarray:
    """Lagrange basis ``L_q(x)`` at the points ``x`` (barycentric formula, exact at the nodes), shape (n, r)."""
    diff = x[:, None] - nodes[None, :]
    hit = diff == 0
    with np.errstate(divide="ignore", invalid="ignore"):
        t = bw[None, :] / diff
    rows = hit.any(axis=1)
    t[rows] = hit[rows].astype(float)
    return t / t.sum(axis=1, keepdims=True)


class KernelRows:
    r"""The sums :math:`S_0, S_1` (module docstring) for fixed rows and sorted sources.

    Parameters
    ----------
    rows : ndarray, shape (R,)
        Row points :math:`z_f` in ``[-1, 1]``.
    sources : ndarray, shape (S,)
        Source points :math:`y_j`, non-decreasing, in ``[-1, 1]``.
    beta, d : float, int
    with_h : bool
        Also the sums with :math:`h` (velocity); ``False``: :math:`S_0` only (energy).
    method : {"auto", "panel", "dense"}
        ``"auto"``: the cheapest verified panel factorization, else dense; ``"panel"``: the
        same but an error when none passes; ``"dense"``: dense matrices.
    tol : float
        Verification tolerance (relative to each panel's scale).

    Attributes
    ----------
    top : ndarray, shape (R,)
        The row shifts :math:`t_f`.
    method : str
        ``"panel"`` or ``"dense"`` (what was built).
    panels, points : int
        :math:`P` and :math:`r` of the factorization (0 when dense).
    error : float
        Largest verified error relative to the panel scale (0 when dense).

    Examples
    --------
    The panel factorization against dense rows (sums are relative to each row's shift ``top``):

    >>> import numpy as np
    >>> z = np.linspace(-0.99, 0.99, 600)
    >>> w = np.full(600, 1 / 600)
    >>> panel, dense = KernelRows(z, z, 9.0, 128), KernelRows(z, z, 9.0, 128, method="dense")
    >>> panel.method, dense.method
    ('panel', 'dense')
    >>> (s0, s1), (d0, d1) = panel(w), dense(w)
    >>> scale = np.exp(panel.top - dense.top)
    >>> bool(np.abs(s0 * scale - d0).max() < 1e-13 * d0.max()), bool(np.abs(s1 * scale - d1).max() < 1e-13 * np.abs(d1).max())
    (True, True)
    """

    def __init__(
        self,
        rows: np.ndarray,
        sources: np.ndarray,
        beta: float,
        d: int,
        *,
        with_h: bool = True,
        method: str = "auto",
        tol: float = 1e-13,
    ):
        if method not in ("auto", "panel", "dense"):
            raise ValueError(f"kernel method must be 'auto', 'panel' or 'dense', got {method!r}")
        self.rows = np.asarray(rows, dtype=float)
        self.sources = np.asarray(sources, dtype=float)
        self.beta, self.d, self.with_h, self.tol = float(beta), int(d), bool(with_h), float(tol)
        self.panels = self.points = 0
        self.error = 0.0
        self.method = "dense"
        S = self.sources.size
        if method != "dense" and self._try_panels():
            self.method = "panel"
        elif method == "panel":
            raise ValueError(
                f"no panel factorization of the zonal kernel met tol={tol:g} below a quarter of the dense "
                f"cost (beta={beta:g}, d={d}, {S} sources); use method='dense'"
            )
        else:
            self._build_dense()
        self.nbytes = sum(a.nbytes for a in self._arrays())

    # -- construction ------------------------------------------------------------------------------
    def _exact(self, rows: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        lk, h = zonal_kernel_unchecked(rows[:, None], cols[None, :], self.beta, self.d)
        return lk, (h if self.with_h else None)

    def _candidates(self):
        S = self.sources.size
        base = max(2, int(np.ceil(self.beta / 4.0)))
        cands = sorted(
            {(P, r) for P in (base, 2 * base, 4 * base, 8 * base) for r in (24, 32, 48)},
            key=lambda c: (c[0] * c[1], c[0]),
        )
        return [(P, r) for P, r in cands if P * r <= S / 4]

    def _try_panels(self) -> bool:
        cands = self._candidates()
        if not cands:
            return False
        R = self.rows.size
        check = np.unique(
            np.concatenate([np.linspace(0, R - 1, _CHECK_ROWS).round().astype(int), [0, R - 1]])
        )
        lk_ex, h_ex = self._exact(self.rows[check], self.sources)
        for P, r in cands:
            built = self._panel_parts(P, r)
            err = self._verify(built, check, lk_ex, h_ex)
            if err <= self.tol:
                self._set_panels(*built)
                self.panels, self.points, self.error = P, r, err
                return True
        return False

    def _panel_parts(self, P: int, r: int):
        x, bw = _chebyshev(r)
        edges = np.linspace(-1.0, 1.0, P + 1)
        pid = np.clip(np.searchsorted(edges, self.sources, side="right") - 1, 0, P - 1)
        used = np.unique(pid)  # panels holding sources (the others contribute nothing)
        mid, half = 0.5 * (edges[1:] + edges[:-1]), 0.5 * np.diff(edges)
        cheb = (mid[used, None] + half[used, None] * x[None, :]).ravel()  # (P' r,)
        local = (self.sources - mid[pid]) / half[pid]
        L = _lagrange(np.clip(local, -1.0, 1.0), x, bw)  # (S, r)
        slot = np.searchsorted(used, pid)  # panel of each source among used
        starts = np.flatnonzero(np.r_[True, np.diff(slot) != 0])
        lk, h = self._exact(self.rows, cheb)
        top = lk.max(axis=1)
        with np.errstate(under="ignore"):
            phi = np.exp(lk - top[:, None])
        phih = phi * h if self.with_h else None
        return top, phi, phih, L, starts, slot, r

    def _verify(self, built, check, lk_ex, h_ex) -> float:
        """Largest entry error at every source on the check rows, relative to the scale of the entry's panel."""
        top, phi, phih, L, starts, slot, r = built
        C = check.size
        with np.errstate(under="ignore"):
            e_ex = np.exp(lk_ex - top[check][:, None])
        sub_k = phi[check].reshape(C, starts.size, r)
        sub_h = None if phih is None else phih[check].reshape(C, starts.size, r)
        ends = np.r_[starts[1:], slot.size]
        worst = 0.0
        for p, (a, b) in enumerate(zip(starts, ends)):
            Lp = L[a:b]
            kp = sub_k[:, p, :]
            scale = kp.max(axis=1, keepdims=True)
            keep = scale[:, 0] > 1e-280  # entries lost to underflow in both
            if not keep.any():
                continue
            err = np.abs(kp @ Lp.T - e_ex[:, a:b]) / np.where(scale > 0, scale, 1.0)
            worst = max(worst, float(err[keep].max()))
            if sub_h is not None:
                hp = sub_h[:, p, :]
                # kh may cross zero on a panel: measure against max k * max |h| there
                hmax = np.abs(hp / np.where(kp > 0, kp, 1.0)).max(axis=1, keepdims=True)
                scale_h = np.maximum(np.abs(hp).max(axis=1, keepdims=True), scale * hmax)
                err = np.abs(hp @ Lp.T - e_ex[:, a:b] * h_ex[:, a:b]) / np.where(
                    scale_h > 0, scale_h, 1.0
                )
                worst = max(worst, float(err[keep].max()))
        return worst

    def _set_panels(self, top, phi, phih, L, starts, slot, r) -> None:
        self.top = top
        self._phi = np.ascontiguousarray(phi)
        self._phih = None if phih is None else np.ascontiguousarray(phih)
        self._L = np.ascontiguousarray(L)
        self._slot = np.ascontiguousarray(slot, dtype=np.int64)

    def _build_dense(self) -> None:
        R, S = self.rows.size, self.sources.size
        block = max(1, _BLOCK_ELEMENTS // S)
        self._E = E = np.empty((R, S))
        self._EH = EH = np.empty((R, S)) if self.with_h else None
        self.top = np.empty(R)
        for i in range(0, R, block):
            lk, h = self._exact(self.rows[i : i + block], self.sources)
            top = lk.max(axis=1)
            with np.errstate(under="ignore"):
                e = np.exp(lk - top[:, None])
            E[i : i + block] = e
            if EH is not None:
                EH[i : i + block] = e * h
            self.top[i : i + block] = top

    def _arrays(self):
        if self.method == "dense":
            return [a for a in (self._E, self._EH) if a is not None]
        return [a for a in (self._phi, self._phih, self._L) if a is not None]

    # -- use -----------------------------------------------------------------------------------------
    def __call__(self, w: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """``(S_0, S_1)`` for the source weights ``w`` (shape (S,)); ``S_1`` is None without ``h``."""
        if self.method == "dense":
            return self._E @ w, (self._EH @ w if self.with_h else None)
        out0 = np.empty(self.rows.size)
        out1 = np.empty(self.rows.size) if self.with_h else out0
        _panel_sums(
            self._phi,
            self._phih if self.with_h else self._phi,
            self._L,
            self._slot,
            np.ascontiguousarray(w, dtype=np.float64),
            out0,
            out1,
        )
        return out0, (out1 if self.with_h else None)

    def __repr__(self) -> str:
        how = (
            f"panel P={self.panels}, r={self.points}, error {self.error:.1e}"
            if self.method == "panel"
            else "dense"
        )
        return f"KernelRows({self.rows.size} x {self.sources.size}, {how}, {self.nbytes / 2**20:.1f} MB)"


@njit(cache=True, nogil=True)
def _panel_sums(phi, phih, L, slot, w, out0, out1):  # pragma: no cover (compiled)
    """mu[slot_j r + q] += w_j L_jq, then out0 = phi @ mu, out1 = phih @ mu in one pass over the rows."""
    R, K = phi.shape
    r = L.shape[1]
    mu = np.zeros(K)
    for j in range(w.size):
        base = slot[j] * r
        wj = w[j]
        for q in range(r):
            mu[base + q] += wj * L[j, q]
    for f in range(R):
        a0 = 0.0
        a1 = 0.0
        b0 = 0.0
        b1 = 0.0
        k = 0
        while k + 1 < K:
            a0 += phi[f, k] * mu[k]
            a1 += phi[f, k + 1] * mu[k + 1]
            b0 += phih[f, k] * mu[k]
            b1 += phih[f, k + 1] * mu[k + 1]
            k += 2
        if k < K:
            a0 += phi[f, k] * mu[k]
            b0 += phih[f, k] * mu[k]
        out0[f] = a0 + a1
        out1[f] = b0 + b1
