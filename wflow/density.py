r"""Probability densities on a finite-volume mesh.

Convention.  ``Density.values[i]`` is the *average over cell i of a probability density
with respect to the plain surface measure* (arc length on :math:`S^1`, area on
:math:`S^2`), so that

.. math::

    \mathrm{mass} = \sum_i \rho_i |C_i| = 1, \qquad
    \rho_{\mathrm{uniform}} = 1/|S^{d-1}| = \tfrac{1}{2\pi}\ (S^1),\ \tfrac{1}{4\pi}\ (S^2).

:class:`Density` refuses non-finite or negative values, rescales a total mass within
:data:`MASS_SILENT` of 1 silently and within :data:`MASS_WARN` with a :class:`UserWarning`, and
refuses one farther from 1 unless ``normalize=True``.

:meth:`Density.to_atoms` gives the atomic measure with the cell masses at the cell
centroids -- the form every kernel sum and model takes.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np

from ._typing import ArrayLike
from .errors import check_positive, real_float_dtype, short_repr
from .kernels import kernel_sums
from .measure import Atoms, as_atoms
from .mesh import Mesh

__all__ = ["Density", "MASS_SILENT", "MASS_WARN"]

#: relative mass defects rescaled silently / with a warning; beyond, rejected
MASS_SILENT = 1e-12
MASS_WARN = 1e-6


class Density:
    r"""Cell averages of a probability density on a :class:`~wflow.mesh.Mesh`.

    Parameters
    ----------
    mesh : CircleMesh or SphereMesh
    values : array_like, shape (M,)
        Cell averages w.r.t. the plain surface measure (module docstring), ``>= 0``.
    normalize : bool
        Rescale any positive total mass to 1 instead of checking it.

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.mesh import CircleMesh
    >>> rho = Density(CircleMesh(64), np.full(64, 1 / (2 * np.pi)))
    >>> round(rho.mass(), 12)
    1.0
    """

    __slots__ = ("mesh", "values")

    def __init__(self, mesh: Mesh, values: ArrayLike, *, normalize: bool = False):
        if not isinstance(mesh, Mesh):
            raise TypeError(
                f"mesh must be a wflow.mesh.CircleMesh or SphereMesh, got {short_repr(mesh)}"
            )
        v = np.asarray(values)
        if v.dtype == object or not np.issubdtype(v.dtype, np.number) or np.iscomplexobj(v):
            raise TypeError(f"values must be a real numeric array, got {short_repr(values)}")
        v = v.astype(np.float64)
        if v.shape != (mesh.n_cells,):
            raise ValueError(
                f"values must have shape ({mesh.n_cells},) (one per cell of {mesh!r}), got {v.shape}"
            )
        if not np.all(np.isfinite(v)):
            raise ValueError(
                f"values contain non-finite entries (NaN or inf) at cells {np.flatnonzero(~np.isfinite(v))[:5].tolist()}"
            )
        if np.any(v < 0):
            i = int(np.argmin(v))
            raise ValueError(f"values must be non-negative, got {v[i]:.6g} in cell {i}")
        mass = float(np.dot(v, mesh.areas))
        if mass <= 0:
            raise ValueError("values have total mass 0; a density must have mass 1")
        defect = abs(mass - 1.0)
        if not normalize and defect > MASS_WARN:
            raise ValueError(
                f"values have total mass sum(values * areas) = {mass:.12g}, expected 1 "
                f"(values are averages of a density w.r.t. the plain surface measure, uniform = "
                f"1/{mesh.total_area:.6g}); pass normalize=True to rescale"
            )
        if not normalize and defect > MASS_SILENT:
            warnings.warn(
                f"density mass {mass:.15g} differs from 1 by {defect:.2g}; rescaled to 1",
                UserWarning,
                stacklevel=2,
            )
        self.mesh = mesh
        self.values = v / mass

    @classmethod
    def _trusted(cls, mesh: Mesh, values: np.ndarray) -> Density:
        obj = cls.__new__(cls)
        obj.mesh = mesh
        obj.values = values
        return obj

    # -- constructors ----------------------------------------------------------
    @classmethod
    def uniform(cls, mesh: Mesh) -> Density:
        """The uniform density :math:`1/|S^{d-1}|`."""
        return cls(mesh, np.full(mesh.n_cells, 1.0 / mesh.total_area))

    @classmethod
    def from_function(
        cls, mesh: Mesh, f: Callable[[np.ndarray], np.ndarray], *, normalize: bool = True
    ) -> Density:
        r"""Cell averages :math:`\frac{1}{|C_i|}\int_{C_i} f\,dA` of ``f(points (n, d)) -> (n,)``.

        Quadrature: Gauss--Legendre (4 nodes per arc) on the circle, Dunavant's degree-5
        rule on a fan of each Voronoi cell on :math:`S^2` (:meth:`Mesh.quadrature`).
        ``f`` need not be normalized when ``normalize=True`` (the default).
        """
        if not callable(f):
            raise TypeError(f"f must be a callable of points (n, d) -> (n,), got {short_repr(f)}")

        def real_f(points: np.ndarray) -> np.ndarray:  # complex or object values refused, not cast
            values = np.asarray(f(points))
            real_float_dtype(values.dtype, "f's values", integers=True)
            return values

        return cls(mesh, mesh.cell_averages(real_f), normalize=normalize)

    @classmethod
    def from_samples(
        cls,
        mesh: Mesh,
        points: ArrayLike,
        weights: ArrayLike | None = None,
        *,
        method: str = "histogram",
        bandwidth: float | None = None,
        backend: str = "auto",
    ) -> Density:
        r"""Density estimate from samples on the sphere.

        Parameters
        ----------
        points : array_like, shape (n, d)
        weights : array_like, shape (n,), optional
            Non-negative sample weights (uniform if omitted).
        method : {"histogram", "kde"}
            ``"histogram"``: each sample's weight goes to the cell containing it (exact mass
            per cell).  ``"kde"``: a von Mises--Fisher kernel
            :math:`\propto e^{\langle x, y\rangle/\sigma^2}` of angular width ``bandwidth``
            :math:`\sigma` evaluated at the cell centres (through the shared kernel sums)
            and normalized on the mesh.
        bandwidth : float, optional
            Angular width for ``"kde"``; default :math:`\max(2h,\ n^{-1/(d+3)})`,
            ``h`` the mesh spacing.
        backend : str
            Kernel-sum backend for ``"kde"``.
        """
        mu = Atoms(points, weights)
        if mu.batch_shape:
            raise ValueError(f"points must have shape (n, d), got {mu.points.shape}")
        return cls.from_atoms(mesh, mu, method=method, bandwidth=bandwidth, backend=backend)

    @classmethod
    def from_atoms(
        cls,
        mesh: Mesh,
        mu: Atoms,
        *,
        method: str = "histogram",
        bandwidth: float | None = None,
        backend: str = "auto",
    ) -> Density:
        """:meth:`from_samples` with the atoms' points and weights; inverse of :meth:`to_atoms` for
        ``method="histogram"`` (atoms at the centres map back to the same cells)."""
        mu = as_atoms(mu)
        if mu.d != mesh.d:
            raise ValueError(f"the atoms live in dimension d={mu.d} but the mesh in d={mesh.d}")
        if mu.batch_shape:
            raise ValueError(
                f"mu must be a single measure (no batch axes), got batch {mu.batch_shape}"
            )
        x, w = mu.points.astype(np.float64), mu.weights.astype(np.float64)
        if method == "histogram":
            cells = mesh.locate(x)
            mass = np.bincount(cells, weights=w, minlength=mesh.n_cells)
            return cls(mesh, mass / mesh.areas, normalize=True)
        if method == "kde":
            if bandwidth is None:
                sigma = max(2 * mesh.spacing, mu.n ** (-1.0 / (mesh.d + 3)))
            else:
                sigma = check_positive(bandwidth, "bandwidth")
            s = kernel_sums(mesh.centers, x, w, 1.0 / sigma**2, values=False, backend=backend)
            # exp(log_scale - max) keeps the relative values finite for any bandwidth
            vals = s.mass * np.exp(s.log_scale - s.log_scale.max())
            return cls(mesh, vals, normalize=True)
        raise ValueError(f"method must be 'histogram' or 'kde', got {method!r}")

    # -- conversions and functionals --------------------------------------------
    def masses(self) -> np.ndarray:
        """Cell masses ``values * areas``, shape ``(M,)``; they sum to 1."""
        return self.values * self.mesh.areas

    def mass(self) -> float:
        r"""Total mass :math:`\sum_i \rho_i |C_i|`."""
        return float(np.sum(self.masses()))

    def to_atoms(self) -> Atoms:
        """The atomic measure with the cell masses at the cell centroids (``mesh.centers``)."""
        m = self.masses()
        return Atoms._trusted(self.mesh.centers, m / m.sum())

    def integrate(self, f: ArrayLike) -> float:
        r""":math:`\int f\rho\,dA \approx \sum_i f_i\rho_i|C_i|` for values ``f`` at the cell centres."""
        values = np.asarray(f)
        real_float_dtype(values.dtype, "f", integers=True)
        return float(np.dot(values.astype(np.float64, copy=False), self.masses()))

    def __repr__(self) -> str:
        return f"Density({self.mesh!r}, min={self.values.min():.4g}, max={self.values.max():.4g})"
