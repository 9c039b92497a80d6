r"""The finite-volume right-hand side of the zonal equation (:class:`ZonalFV`; ``docs/zonal.md`` §6)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from .._typing import ArrayLike
from ..errors import SolverError, check_int, check_nonnegative, check_positive, short_repr
from .kernel import check_d, log_cap_volume, log_zonal_constant, zonal_kernel_unchecked
from .rows import KernelRows

__all__ = ["ZonalFV"]

# -- finite volumes --------------------------------------------------------------------------------

#: relative mass defects rescaled silently / with a warning (as in wflow.density); beyond, rejected
_MASS_SILENT = 1e-12
_MASS_WARN = 1e-6
#: rows whose shifted normalizer falls below this are recomputed in log scale
_UNDERFLOW = 1e-200


class ZonalFV:
    r"""Finite-volume right-hand side of the zonal mean-field equation on :math:`S^{d-1}` (:mod:`wflow.zonal`).

    The state is the vector of band masses :math:`m_i = \mu(\{z_i \le \langle x, e\rangle \le z_{i+1}\})`,
    a probability vector.  :meth:`rhs` returns :math:`dm/dt = F_i - F_{i+1}` (upwind fluxes of an
    MC-limited linear reconstruction, conservative to round-off) and the positivity limit of one
    forward-Euler step, like :class:`wflow.solvers.eulerian.FiniteVolume`; the velocity is a
    two-node quadrature of the kernel in every band (:meth:`face_velocity`), all in log scale.

    Parameters
    ----------
    d : int
        Ambient dimension, ``>= 2`` (:math:`d = 2`: even densities on the circle).
    n_cells : int
        Number of bands ``M >= 4``.
    attention : {"SA", "USA"}
    beta : float
        Inverse temperature, ``>= 0``.
    sign : {1, -1}
        :math:`V = \mathrm{sign}\cdot I` (1: attraction, -1: repulsion).
    kappa : float, optional
        Inverse diffusivity; ``None`` or ``inf``: no noise.
    kernel : {"plain", "rescaled"}
        :math:`e^{\beta\langle x,y\rangle}` (the package's convention) or :math:`e^{\beta(\langle x,y\rangle-1)}`
        (a time change of USA, nothing for SA).  USA in the plain kernel needs :math:`\beta \lesssim 700`.
    grid : {"angle", "z"} or array_like
        Cells uniform in the polar angle, uniform in :math:`z`, or the increasing edges
        :math:`-1 = z_0 < \dots < z_M = 1` themselves.

    Attributes
    ----------
    edges : ndarray, shape (M+1,)
    centers : ndarray, shape (M,)
        Weighted centroids :math:`\bar z_i = \int_{\rm cell} z\,d\sigma / V_i`.
    volumes : ndarray, shape (M,)
        :math:`V_i = \sigma(\text{band } i)`, sum 1 (may underflow to 0 near the poles for large
        ``d``; ``log_volumes`` does not).
    face_weights : ndarray, shape (M+1,)
        :math:`\ell_f`.

    Examples
    --------
    >>> import numpy as np
    >>> fv = ZonalFV(128, 256, attention="SA", beta=4.0)
    >>> m0 = fv.masses_from_function(lambda z: 1 + 0.1 * z)
    >>> dm, dt_max = fv.rhs(m0)
    >>> bool(abs(dm.sum()) < 1e-15), bool(dt_max > 0)
    (True, True)
    >>> bool(dm[-1] > 0)   # attraction: the upper cap gains mass
    True
    """

    name = "zonal-fv-muscl"
    order = 2

    def __init__(
        self,
        d: int,
        n_cells: int,
        *,
        attention: str = "SA",
        beta: float = 1.0,
        sign: int = 1,
        kappa: float | None = None,
        kernel: str = "plain",
        grid: str | ArrayLike = "angle",
        kernel_method: str = "auto",
    ):
        self.d = check_d(d)
        M = check_int(n_cells, "n_cells", minimum=4)
        if attention not in ("SA", "USA"):
            raise ValueError(f"attention must be 'SA' or 'USA', got {attention!r}")
        self.attention = attention
        self.beta = check_nonnegative(beta, "beta")
        if isinstance(sign, bool) or sign not in (1, -1):
            raise ValueError(f"sign must be 1 (V = I) or -1 (V = -I), got {sign!r}")
        self.sign = int(sign)
        if kappa is not None:
            kappa = check_positive(kappa, "kappa", allow_inf=True)
        self.kappa = kappa
        self.inv_kappa = 0.0 if kappa is None or np.isinf(kappa) else 1.0 / kappa
        if kernel not in ("plain", "rescaled"):
            raise ValueError(f"kernel must be 'plain' or 'rescaled', got {kernel!r}")
        self.kernel = kernel
        if kernel_method not in ("auto", "panel", "dense"):
            raise ValueError(
                f"kernel_method must be 'auto', 'panel' or 'dense', got {kernel_method!r}"
            )
        self.kernel_method = kernel_method
        self._shift = self.beta if kernel == "rescaled" else 0.0
        self.edges = _edges(grid, M)
        self.n_cells = self.edges.size - 1
        self.evaluations = 0
        self._geometry()
        self._build_kernel()
        self._energy_rows: KernelRows | None = None

    # -- construction ------------------------------------------------------------------------------
    @classmethod
    def from_model(cls, model, d: int, n_cells: int, **kwargs) -> ZonalFV:
        """The scheme for a wflow :class:`~wflow.models.SA` or :class:`~wflow.models.USA` model.

        The model must be zonal: :math:`Q = K = I` and :math:`V = \\pm I` (``None`` counts as I).
        """
        from ..models import SA, USA

        if not isinstance(model, (SA, USA)):
            raise ValueError(
                f"model must be a wflow SA or USA attention block to be solved by ZonalFV, got {short_repr(model)}"
            )
        sign = 1
        for name in ("Q", "K", "V"):
            A = getattr(model, name)
            if A is None:
                continue
            if A.shape != (d, d):
                raise ValueError(
                    f"model.{name} has shape {A.shape}, not ({d}, {d}): the model does not act on S^{d - 1}"
                )
            if np.array_equal(A, np.eye(d)):
                continue
            if name == "V" and np.array_equal(A, -np.eye(d)):
                sign = -1
                continue
            raise ValueError(
                f"model is not zonal: {name} must be the identity (or V = -I) for the flow to keep "
                f"zonal densities zonal, got {name} = {short_repr(A)}"
            )
        return cls(d, n_cells, attention=type(model).__name__, beta=model.beta, sign=sign, **kwargs)

    def _geometry(self) -> None:
        d, z = self.d, self.edges
        self.log_volumes = _log_band_volumes(z, d)
        with np.errstate(divide="ignore"):
            self.log_face_weights = log_zonal_constant(d) + 0.5 * (d - 1) * np.log(
                (1.0 - z) * (1.0 + z)
            )
        self.log_face_weights[[0, -1]] = -np.inf
        with np.errstate(under="ignore"):
            self.volumes = np.exp(self.log_volumes)
            self.face_weights = np.exp(self.log_face_weights)
            # lam_left[f] = ell_f / V_{f-1}, lam_right[f] = ell_f / V_f at the interior faces f = 1..M-1
            self._lam_left = np.exp(self.log_face_weights[1:-1] - self.log_volumes[:-1])
            self._lam_right = np.exp(self.log_face_weights[1:-1] - self.log_volumes[1:])
            # centroid: (ell_i - ell_{i+1}) / ((d-1) V_i), both ratios finite
            up = np.concatenate([[0.0], self._lam_right])  # ell_i / V_i
            down = np.concatenate([self._lam_left, [0.0]])  # ell_{i+1} / V_i
        self.centers = np.clip((up - down) / (d - 1), z[:-1], z[1:])
        self._dz_centers = np.diff(self.centers)  # (M-1,) distance of centroids across each face
        self._off_right = z[1:] - self.centers  # face offsets from the centroid
        self._off_left = z[:-1] - self.centers
        reach = np.maximum(self._off_right, -self._off_left)
        reach[0], reach[-1] = self._off_right[0], -self._off_left[-1]  # no flux at the poles
        self._reach = reach
        self.spread = self._cell_spread()
        # polar angle from the lower pole, theta = arccos(-z) in [0, pi] (the variable of the remap step)
        th = np.arccos(np.clip(-z, -1.0, 1.0))
        th[0], th[-1] = 0.0, math.pi
        self.theta_edges = th
        self._sin_faces = np.sqrt(np.maximum((1.0 - z[1:-1]) * (1.0 + z[1:-1]), 0.0))

    def _polar_nodes(self, nodes: int) -> tuple[np.ndarray, np.ndarray]:
        r"""Gauss--Legendre polar angles ``(cells, nodes)`` in every cell and their weights under
        :math:`\sin^{d-2}\varphi\,d\varphi`, normalized per cell (log-scale: no underflow near the poles)."""
        x, w = np.polynomial.legendre.leggauss(nodes)
        phi_lo, phi_hi = np.arccos(self.edges[1:]), np.arccos(self.edges[:-1])
        phi = 0.5 * (phi_lo + phi_hi)[:, None] + 0.5 * (phi_hi - phi_lo)[:, None] * x[None, :]
        with np.errstate(divide="ignore"):
            logw = np.log(w)[None, :] + (self.d - 2) * np.log(np.sin(phi))
        logw -= logw.max(axis=1, keepdims=True)
        with np.errstate(under="ignore"):
            wt = np.exp(logw)
        wt /= wt.sum(axis=1, keepdims=True)
        return phi, wt

    def _cell_spread(self, nodes: int = 8) -> np.ndarray:
        r"""Standard deviation :math:`\varsigma_i` of :math:`z` under :math:`\sigma` restricted to cell ``i``.

        Gauss--Legendre in the polar angle (log-scale weights); no cancellation near the poles.
        """
        phi, wt = self._polar_nodes(nodes)
        zq = np.cos(phi)
        mean = np.sum(wt * zq, axis=1)
        return np.sqrt(np.sum(wt * (zq - mean[:, None]) ** 2, axis=1))

    def _build_kernel(self) -> None:
        r"""Kernel rows (:class:`~wflow.zonal.rows.KernelRows`) at the faces against the two nodes
        :math:`\bar z_j \pm \varsigma_j` of every band."""
        lo = np.maximum(self.centers - self.spread, self.edges[:-1])
        hi = np.minimum(self.centers + self.spread, self.edges[1:])
        half = 0.5 * (hi - lo)
        self._nodes = (lo, hi, half)
        self._rows = KernelRows(
            self.edges[1:-1],
            np.stack([lo, hi], axis=1).ravel(),
            self.beta,
            self.d,
            method=self.kernel_method,
        )
        self._row_log = self._rows.top
        if self.attention == "USA":
            excess = float(np.max(self._row_log)) - self._shift
            if excess > 700:
                raise ValueError(
                    f"USA with the plain kernel at beta={self.beta:g} has velocities ~ e^{excess:.0f}, beyond "
                    f"double precision; use kernel='rescaled' (a time change)"
                )
            with np.errstate(under="ignore"):
                self._row_scale = np.exp(self._row_log - self._shift)

    # -- densities ---------------------------------------------------------------------------------
    def uniform(self) -> np.ndarray:
        """Masses of the uniform measure :math:`\\sigma`: the band volumes, summing to 1."""
        with np.errstate(under="ignore"):
            v = np.exp(self.log_volumes - np.logaddexp.reduce(self.log_volumes))
        return v

    def masses_from_function(
        self, f: Callable[[np.ndarray], ArrayLike], *, normalize: bool = True, nodes: int = 8
    ) -> np.ndarray:
        r"""Band masses :math:`m_i = \int_{\rm band} f\,d\sigma` of the zonal density :math:`\mu = f(z)\sigma`.

        Gauss--Legendre with ``nodes`` points per cell in the polar angle; the band volume is exact.

        Parameters
        ----------
        f : callable
            ``f(z)`` for an array ``z`` in ``(-1, 1)``, values ``>= 0``.
        normalize : bool
            Rescale to mass 1 (default).  With ``False`` the mass must already be 1.
        """
        if not callable(f):
            raise TypeError(f"f must be a callable of z in [-1, 1], got {short_repr(f)}")
        phi, wt = self._polar_nodes(check_int(nodes, "nodes", minimum=1))
        vals = np.asarray(f(np.cos(phi)), dtype=float)
        if vals.shape != phi.shape:
            raise ValueError(
                f"f must return one value per point (shape {phi.shape}), got shape {vals.shape}"
            )
        if not np.all(np.isfinite(vals)):
            raise ValueError(
                f"f returned non-finite values, e.g. at z={float(np.cos(phi)[~np.isfinite(vals)][0]):.6g}"
            )
        if np.any(vals < 0):
            i = np.unravel_index(int(np.argmin(vals)), vals.shape)
            raise ValueError(
                f"f must be a non-negative density, got f({np.cos(phi)[i]:.6g}) = {vals[i]:.6g}"
            )
        with np.errstate(under="ignore"):
            m = self.volumes * np.sum(wt * vals, axis=1)
        if normalize:
            total = m.sum()
            if not total > 0:
                raise ValueError("f has zero mass on the sphere; a density must have mass 1")
            m = m / total
        return self.check_masses(m)

    def check_masses(self, masses: ArrayLike, name: str = "masses") -> np.ndarray:
        """Validate band masses: shape ``(M,)``, finite, ``>= 0``, total 1 (as :class:`wflow.density.Density`).

        A relative mass defect below 1e-12 is rescaled silently, below 1e-6 with a warning;
        beyond, ``ValueError``.
        """
        m = np.asarray(masses)
        if m.dtype == object or not np.issubdtype(m.dtype, np.number) or np.iscomplexobj(m):
            raise TypeError(f"{name} must be a real array, got {short_repr(masses)}")
        m = m.astype(float)
        if m.shape != (self.n_cells,):
            raise ValueError(
                f"{name} must have shape ({self.n_cells},) (one per band), got {m.shape}"
            )
        if not np.all(np.isfinite(m)):
            raise ValueError(
                f"{name} contain non-finite entries at bands {np.flatnonzero(~np.isfinite(m))[:5].tolist()}"
            )
        if np.any(m < 0):
            i = int(np.argmin(m))
            raise ValueError(f"{name} must be non-negative, got {m[i]:.6g} in band {i}")
        total = float(m.sum())
        defect = abs(total - 1.0)
        if defect > _MASS_WARN:
            raise ValueError(
                f"{name} must sum to 1 (a probability measure), got total mass {total:.12g}"
            )
        if defect > _MASS_SILENT:
            import warnings

            warnings.warn(
                f"{name} total {total:.15g} differs from 1 by {defect:.2g}; rescaled to 1",
                UserWarning,
                stacklevel=2,
            )
        return m / total

    def density(self, masses: np.ndarray) -> np.ndarray:
        r"""Cell averages :math:`\bar f_i = m_i/V_i` of the density w.r.t. :math:`\sigma` (uniform: 1)."""
        with np.errstate(divide="ignore", over="ignore", under="ignore"):
            return np.exp(np.log(np.asarray(masses, dtype=float)) - self.log_volumes)

    # -- the right-hand side -----------------------------------------------------------------------
    def face_velocity(self, masses: np.ndarray, slope: np.ndarray | None = None) -> np.ndarray:
        r""":math:`g_f` at the interior faces, shape ``(M-1,)``; the :math:`z`-velocity is :math:`w = (1-z_f^2)g_f`.

        Quadrature of :math:`\int p(z')k\,h\,dz'` (and of :math:`\int p\,k\,dz'` for SA) at the two nodes
        :math:`\bar z_j\pm\varsigma_j` of every band, the density linear in it (relative slope ``slope``,
        default the limited reconstruction); second order.
        """
        m = np.asarray(masses, dtype=float)
        if slope is None:
            slope = self._slopes(m)
        self.evaluations += 1
        tilt = self._tilt(slope)
        # node weights (m/2)(1 -+ tilt) at zbar -+ spread: first moment m * slope * spread^2
        w = np.empty((m.size, 2))
        w[:, 0] = 0.5 * m * (1.0 - tilt)
        w[:, 1] = 0.5 * m * (1.0 + tilt)
        den, num = self._rows(w.ravel())
        bad = den < _UNDERFLOW
        if self.attention == "SA":
            with np.errstate(divide="ignore", invalid="ignore"):
                g = num / den
        else:
            g = self._row_scale * num
        if np.any(bad):
            g[bad] = self._rows_in_log_scale(np.flatnonzero(bad), m, tilt)
        return self.sign * g

    def _tilt(self, slope: np.ndarray) -> np.ndarray:
        lo, hi, half = self._nodes
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(half > 0, slope * self.spread**2 / np.where(half > 0, half, 1.0), 0.0)
        return np.clip(t, -1.0, 1.0)

    def _rows_in_log_scale(self, rows: np.ndarray, m: np.ndarray, tilt: np.ndarray) -> np.ndarray:
        """Velocity rows whose shifted normalizer underflowed, recomputed with the masses in the shift."""
        lo, hi, half = self._nodes
        z = self.edges[1:-1][rows, None]
        nodes = np.concatenate([lo, hi])
        weights = np.concatenate([0.5 * m * (1 - tilt), 0.5 * m * (1 + tilt)])
        log_k, h = zonal_kernel_unchecked(z, nodes[None, :], self.beta, self.d)
        with np.errstate(divide="ignore"):
            log_km = log_k + np.log(np.maximum(weights, 0.0))[None, :]
        top = log_km.max(axis=1)
        if not np.all(np.isfinite(top)):
            raise ValueError("masses are all zero: a density must have mass 1")
        with np.errstate(under="ignore"):
            E = np.exp(log_km - top[:, None])
        s0, s1 = E.sum(axis=1), (E * h).sum(axis=1)
        if self.attention == "SA":
            return s1 / s0
        with np.errstate(under="ignore"):
            return np.exp(np.minimum(top - self._shift, 700.0)) * s1

    def rhs(self, masses: ArrayLike) -> tuple[np.ndarray, float]:
        """``(dm/dt, dt_max)``: the semi-discrete right-hand side and the positivity step limit.

        Parameters
        ----------
        masses : ndarray, shape (M,)
            Band masses, ``>= 0`` (round-off below zero is treated as zero).

        Returns
        -------
        dm : ndarray, shape (M,)
            Sums to zero up to round-off.
        dt_max : float
            Largest forward-Euler step that keeps every mass non-negative (``inf`` if nothing moves).
        """
        m = np.asarray(masses, dtype=float)
        if m.shape != (self.n_cells,):
            raise ValueError(f"masses must have shape ({self.n_cells},), got {m.shape}")
        if not np.all(np.isfinite(m)):
            raise SolverError(
                f"non-finite masses at bands {np.flatnonzero(~np.isfinite(m))[:5].tolist()}"
            )
        m = np.maximum(m, 0.0)
        if not m.sum() > 0:
            raise ValueError("masses are all zero: a density must have mass 1")
        M = self.n_cells
        slope = self._slopes(m)
        g = self.face_velocity(m, slope)
        theta_l = np.clip(1.0 + slope * self._off_left, 0.0, 2.0)
        theta_r = np.clip(1.0 + slope * self._off_right, 0.0, 2.0)
        a_left = self._lam_left * m[:-1]  # ell_f fbar_{f-1}
        a_right = self._lam_right * m[1:]  # ell_f fbar_f
        flux = (
            np.maximum(g, 0.0) * a_left * theta_r[:-1] + np.minimum(g, 0.0) * a_right * theta_l[1:]
        )
        rate = np.zeros(M)
        rate[:-1] += 2.0 * self._lam_left * np.maximum(g, 0.0)
        rate[1:] += 2.0 * self._lam_right * np.maximum(-g, 0.0)
        if self.inv_kappa:
            flux -= self.inv_kappa * (a_right - a_left) / self._dz_centers
            rate[:-1] += self.inv_kappa * self._lam_left / self._dz_centers
            rate[1:] += self.inv_kappa * self._lam_right / self._dz_centers
        dm = np.zeros(M)
        dm[:-1] -= flux
        dm[1:] += flux
        if not np.all(np.isfinite(dm)):
            raise SolverError(self._nonfinite_message())
        top = float(rate.max())
        return dm, (1.0 / top if top > 0 else np.inf)

    def _nonfinite_message(self) -> str:
        """What a non-finite right-hand side says: the model and grid, and the likely cause for them."""
        what = (
            f"non-finite right-hand side of the zonal scheme ({self.attention}, beta={self.beta:g}, "
            f"d={self.d}, {self.n_cells} cells)"
        )
        if self.attention == "USA" and self.kernel == "plain":
            return f"{what}: the USA velocity overflows at this beta; try kernel='rescaled'"
        width, cell = 1.0 / np.sqrt(self.d), 2.0 / self.n_cells
        if width < cell:
            return (
                f"{what}: on S^(d-1) the zonal measure concentrates within 1/sqrt(d) = {width:.2g} of "
                f"z = 0, below the cells' width ~{cell:.2g}; use more cells (n_cells) or a smaller d"
            )
        return f"{what}: the face velocities are not finite"

    #: the name ``wflow.solvers.eulerian.FiniteVolume`` gives the same ``(dm/dt, dt_max)`` under the solver contract
    positivity_rhs = rhs

    def _slopes(self, m: np.ndarray) -> np.ndarray:
        r"""Limited slopes of :math:`f` relative to the cell average, shape ``(M,)``.

        Face values :math:`f^{L,R}_i = \bar f_i(1 + \hat s_i(z_{i,i+1} - \bar z_i))` stay in :math:`[0, 2\bar f_i]`
        (:func:`_mc_log_slopes` between centroids).
        """
        with np.errstate(divide="ignore"):
            logf = np.log(m) - self.log_volumes
        slope = _mc_log_slopes(logf, m > 0, self._dz_centers)
        return np.clip(slope, -1.0 / self._reach, 1.0 / self._reach)

    # -- characteristics and remap: steps beyond the positivity limit ---------------------------------
    def theta_velocity(self, masses: np.ndarray) -> np.ndarray:
        r"""Velocity of the polar angle :math:`\theta = \arccos(-z)` at every face, shape ``(M+1,)``.

        :math:`\dot\theta = \dot z/\sin\theta = \sin\theta\,g_f` (:meth:`face_velocity`), exactly zero
        at the poles.
        """
        u = np.zeros(self.n_cells + 1)
        u[1:-1] = self._sin_faces * self.face_velocity(
            np.maximum(np.asarray(masses, dtype=float), 0.0)
        )
        return u

    def departure(self, u: np.ndarray, dt: float, u_mid: np.ndarray | None = None) -> np.ndarray:
        r"""Departure points :math:`\theta^*_f` of the faces after a step ``dt`` ending in the field ``u``.

        The midpoint rule :math:`\theta^* = \theta - \Delta t\,u_{1/2}(\theta - \tfrac{\Delta t}{2}u(\theta))`,
        ``u_mid`` the field at the middle of the step (default ``u``), both linear between faces.
        """
        th = self.theta_edges
        mid = np.clip(th - 0.5 * dt * u, 0.0, math.pi)
        dep = np.clip(th - dt * np.interp(mid, th, u if u_mid is None else u_mid), 0.0, math.pi)
        dep[0], dep[-1] = 0.0, math.pi
        return dep

    def _theta_slopes(self, m: np.ndarray) -> np.ndarray:
        r"""Limited slopes :math:`|s_j| \le 2` of the density :math:`\bar q_j(1 + s_j(\xi - \tfrac12))` in
        :math:`\theta`, :math:`\xi \in [0, 1]` across cell ``j``."""
        w = np.diff(self.theta_edges)
        with np.errstate(divide="ignore"):
            logq = np.log(m) - np.log(w)
        slope = _mc_log_slopes(logq, m > 0, 0.5 * (w[1:] + w[:-1]))
        return np.clip(slope * w, -2.0, 2.0)

    def remap(self, masses: np.ndarray, departure: np.ndarray) -> np.ndarray:
        r"""The masses after a step whose faces came from ``departure``: band ``i`` receives the old mass in
        :math:`[\theta^*_i, \theta^*_{i+1}]`.

        The old mass is the limited linear reconstruction in :math:`\theta`; positive and conservative
        for increasing departure points (``docs/zonal.md`` §6b).
        """
        return self._remap(self.reconstruction(masses), departure)

    def reconstruction(self, masses: np.ndarray) -> tuple[np.ndarray, ...]:
        """What :meth:`remap` needs of the old masses, formed once for several departure sets: the
        masses (negative round-off as zero), the slopes in theta, the prefix and suffix sums."""
        m = np.maximum(np.asarray(masses, dtype=float), 0.0)
        P = np.concatenate([[0.0], np.cumsum(m)])  # P[k] = sum_{l < k} m_l
        S = np.concatenate([np.cumsum(m[::-1])[::-1], [0.0]])  # S[k] = sum_{l >= k} m_l
        return m, self._theta_slopes(m), P, S

    def _remap(self, rec: tuple[np.ndarray, ...], departure: np.ndarray) -> np.ndarray:
        m, s, P, S = rec
        M = m.size
        th = self.theta_edges
        w = np.diff(th)
        j = np.clip(np.searchsorted(th, departure, side="right") - 1, 0, M - 1)
        xi = np.clip((departure - th[j]) / w[j], 0.0, 1.0)
        a, b = j[:-1], j[1:]
        xa, xb = xi[:-1], xi[1:]
        sa, sb = s[a], s[b]
        # the part of band a above theta*_i, of band b below theta*_{i+1}: (1-xi)(1 + s xi/2), xi(1 - s(1-xi)/2)
        above = m[a] * (1.0 - xa) * (1.0 + 0.5 * sa * xa)
        below = m[b] * xb * (1.0 - 0.5 * sb * (1.0 - xb))
        lo = np.minimum(a + 1, b)
        between = np.where(P[lo] <= 0.5, P[b] - P[lo], S[lo] - S[b])
        inside = m[a] * (xb - xa) * (1.0 + sa * (0.5 * (xa + xb) - 0.5))
        return np.where(a == b, inside, above + np.maximum(between, 0.0) + below)

    # -- energy ------------------------------------------------------------------------------------
    def energy(self, masses: ArrayLike) -> float:
        r"""The functional the flow ascends: :math:`\mathrm{sign}\cdot E_\beta` (``wflow.models`` convention).

        .. math::

            E_\beta = \frac{1}{2\beta}\iint k(z, z')\,p(z)p(z')\,dz\,dz'
                    \approx \frac{1}{2\beta}\sum_{i,j} m_i m_j\,k(\bar z_i, \bar z_j),

        times :math:`e^{-\beta}` in the rescaled kernel; at :math:`\beta = 0` the limit
        :math:`\tfrac12(\sum_i m_i\bar z_i)^2`.
        """
        m = np.maximum(np.asarray(masses, dtype=float), 0.0)
        if m.shape != (self.n_cells,):
            raise ValueError(f"masses must have shape ({self.n_cells},), got {m.shape}")
        if self.beta == 0:
            return self.sign * 0.5 * float(m @ self.centers) ** 2
        if self._energy_rows is None:
            c = self.centers
            self._energy_rows = KernelRows(
                c, c, self.beta, self.d, with_h=False, method=self.kernel_method
            )
        rows = self._energy_rows
        s0 = rows(m)[0]  # sum_j m_j k(c_i, c_j) e^{-top_i}
        bad = (m > 0) & ~(s0 > _UNDERFLOW)
        with np.errstate(divide="ignore"):
            lm = np.log(m)
            x = lm + rows.top + np.log(np.maximum(s0, 0.0))
        # rows whose shifted sum underflowed: in log scale with the masses in the shift
        if np.any(bad):
            lk = zonal_kernel_unchecked(
                self.centers[bad, None], self.centers[None, :], self.beta, self.d
            )[0]
            y = lk + lm[None, :]
            t = y.max(axis=1)
            with np.errstate(under="ignore"):
                x[bad] = lm[bad] + t + np.log(np.exp(y - t[:, None]).sum(axis=1))
        top = float(x.max())
        with np.errstate(under="ignore"):
            log_e = top + math.log(float(np.exp(x - top).sum()))
        log_e += -math.log(2.0 * self.beta) - self._shift
        if log_e > 709:
            raise SolverError(
                f"E_beta = e^{log_e:.0f} overflows at beta={self.beta:g}; use kernel='rescaled'"
            )
        return self.sign * math.exp(log_e)

    def __repr__(self) -> str:
        noise = "" if not self.inv_kappa else f", kappa={self.kappa:g}"
        return (
            f"ZonalFV(d={self.d}, n_cells={self.n_cells}, attention={self.attention!r}, beta={self.beta:g}, "
            f"sign={self.sign}{noise}, kernel={self.kernel!r})"
        )


def _mc_log_slopes(logf: np.ndarray, full: np.ndarray, h: np.ndarray) -> np.ndarray:
    r"""Slopes of a cell-average density relative to its value, :math:`\hat s_i = f'/\bar f_i`, shape ``(M,)``.

    ``logf`` the log cell averages (``-inf`` where ``full`` is False), ``h`` the distances across the
    ``M - 1`` interior faces; MC limiter of the neighbour ratios (in log scale), one-sided at the ends.
    """
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        up = np.exp(np.minimum(logf[1:] - logf[:-1], 300.0))  # fbar_{i+1}/fbar_i, i = 0..M-2
        down = np.exp(np.minimum(logf[:-1] - logf[1:], 300.0))  # fbar_{i-1}/fbar_i, i = 1..M-1
    up = np.where(full[:-1], up, 1.0)
    down = np.where(full[1:], down, 1.0)
    M = logf.size
    dplus = np.zeros(M)
    dminus = np.zeros(M)
    dplus[:-1] = (up - 1.0) / h
    dminus[1:] = (1.0 - down) / h
    central = (up[1:] - down[:-1]) / (h[1:] + h[:-1])
    a, b = 2.0 * dminus[1:-1], 2.0 * dplus[1:-1]
    same = (a > 0) & (b > 0) & (central > 0) | (a < 0) & (b < 0) & (central < 0)
    mag = np.minimum(np.minimum(np.abs(a), np.abs(b)), np.abs(central))
    slope = np.empty(M)
    slope[1:-1] = np.where(same, np.sign(central) * mag, 0.0)
    slope[0], slope[-1] = dplus[0], dminus[-1]
    return slope


def _edges(grid, M: int) -> np.ndarray:
    if isinstance(grid, str):
        if grid == "angle":
            z = -np.cos(np.pi * np.arange(M + 1) / M)
        elif grid == "z":
            z = np.linspace(-1.0, 1.0, M + 1)
        else:
            raise ValueError(f"grid must be 'angle', 'z' or an array of edges, got {grid!r}")
        z[0], z[-1] = -1.0, 1.0
        if M % 2 == 0:
            z[M // 2] = 0.0
        return z
    z = np.asarray(grid, dtype=float)
    if (
        z.ndim != 1
        or z.size < 5
        or not np.all(np.isfinite(z))
        or z[0] != -1
        or z[-1] != 1
        or np.any(np.diff(z) <= 0)
    ):
        raise ValueError(
            f"grid edges must be increasing from -1 to 1 with at least 4 cells, got {short_repr(grid)}"
        )
    return z


def _log_band_volumes(z: np.ndarray, d: int) -> np.ndarray:
    """log sigma(z_i <= <x,e> <= z_{i+1}) from the log caps, without cancellation or underflow."""
    up = log_cap_volume(np.maximum(z, 0.0), d)  # log sigma(<x,e> >= z), z >= 0
    low = log_cap_volume(np.maximum(-z, 0.0), d)  # log sigma(<x,e> <= z), z <= 0
    lo, hi = z[:-1], z[1:]
    out = np.empty(z.size - 1)
    with np.errstate(divide="ignore", invalid="ignore", under="ignore"):
        upper = lo >= 0
        out[upper] = up[:-1][upper] + np.log(-np.expm1(up[1:][upper] - up[:-1][upper]))
        lower = hi <= 0
        out[lower] = low[1:][lower] + np.log(-np.expm1(low[:-1][lower] - low[1:][lower]))
    mid = ~upper & ~lower
    out[mid] = np.log1p(-(np.exp(up[1:][mid]) + np.exp(low[:-1][mid])))
    return out
