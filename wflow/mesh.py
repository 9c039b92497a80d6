r"""Finite-volume meshes on the circle :math:`S^1` and the sphere :math:`S^2`.

A mesh stores flat arrays (``M`` cells, ``E`` edges) so that a finite-volume solver needs no
Python loop: ``centers`` (M, d), ``generators``, ``areas`` (plain surface measure, summing to
:math:`2\pi` or :math:`4\pi`), ``cell_left``/``cell_right`` (E,), ``edge_length``,
``edge_midpoint``, ``edge_normal`` (unit co-normal from left to right), ``edge_distance``
(between the generators) and the padded per-cell ``cell_edges`` (pad -1), ``cell_neighbors``
(pad: self) and ``cell_edge_sign`` (+1 out, -1 in, 0 pad); ``docs/continuum.md``.

:class:`CircleMesh` has ``m`` equal arcs; :class:`SphereMesh` is the spherical Voronoi
tessellation of a refined icosahedron (or Fibonacci points) smoothed by Lloyd iterations
(Du, Faber & Gunzburger 1999): every edge is orthogonal to the segment joining its two
generators, so the two-point diffusive flux is consistent.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
from scipy.spatial import SphericalVoronoi, cKDTree

from ._typing import ArrayLike
from .errors import as_points, check_finite, check_int
from .sphere import fibonacci_nodes, geodesic_distance, log_map, points_to_angles

__all__ = ["Mesh", "CircleMesh", "SphereMesh", "icosahedral_nodes", "mesh_from_dict"]


class Mesh(ABC):
    """Common interface of :class:`CircleMesh` and :class:`SphereMesh` (see module docstring).

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.mesh import Mesh, CircleMesh
    >>> mesh = CircleMesh(8)
    >>> isinstance(mesh, Mesh), mesh.n_cells, round(mesh.total_area, 6)  # 2 pi
    (True, 8, 6.283185)
    """

    d: int
    centers: np.ndarray
    generators: np.ndarray
    areas: np.ndarray
    cell_left: np.ndarray
    cell_right: np.ndarray
    edge_length: np.ndarray
    edge_midpoint: np.ndarray
    edge_normal: np.ndarray
    edge_distance: np.ndarray
    cell_edges: np.ndarray
    cell_neighbors: np.ndarray
    cell_edge_sign: np.ndarray

    @property
    def n_cells(self) -> int:
        return int(self.areas.shape[0])

    @property
    def n_edges(self) -> int:
        return int(self.cell_left.shape[0])

    @property
    def total_area(self) -> float:
        r"""Area of the whole sphere: :math:`2\pi` (circle) or :math:`4\pi`."""
        return 2 * np.pi if self.d == 2 else 4 * np.pi

    @property
    def spacing(self) -> float:
        """Characteristic cell size: the arc width on the circle, ``sqrt(mean area)`` on ``S^2``."""
        mean = float(np.mean(self.areas))
        return mean if self.d == 2 else float(np.sqrt(mean))

    @abstractmethod
    def to_dict(self) -> dict:
        """The specification that rebuilds this mesh exactly (:func:`mesh_from_dict`)."""

    # -- derived connectivity -------------------------------------------------
    def _finish(self) -> None:
        """Padded per-cell arrays from the edge lists."""
        M, E = self.n_cells, self.n_edges
        cells = np.concatenate([self.cell_left, self.cell_right])
        edges = np.concatenate([np.arange(E), np.arange(E)])
        signs = np.concatenate([np.ones(E, dtype=np.int8), -np.ones(E, dtype=np.int8)])
        other = np.concatenate([self.cell_right, self.cell_left])
        order = np.lexsort((edges, cells))
        cells, edges, signs, other = cells[order], edges[order], signs[order], other[order]
        counts = np.bincount(cells, minlength=M)
        if np.any(counts < 2):
            raise ValueError(
                f"mesh has a cell with fewer than 2 edges (cell {int(np.argmin(counts))})"
            )
        k = int(counts.max())
        start = np.concatenate([[0], np.cumsum(counts)[:-1]])
        slot = np.arange(cells.size) - start[cells]
        self.cell_edges = np.full((M, k), -1, dtype=np.intp)
        self.cell_neighbors = np.repeat(np.arange(M)[:, None], k, axis=1)
        self.cell_edge_sign = np.zeros((M, k), dtype=np.int8)
        self.cell_edges[cells, slot] = edges
        self.cell_neighbors[cells, slot] = other
        self.cell_edge_sign[cells, slot] = signs
        # slot of each edge inside its left and right cells
        self.edge_slot_left = np.empty(E, dtype=np.intp)
        self.edge_slot_right = np.empty(E, dtype=np.intp)
        left = signs > 0
        self.edge_slot_left[edges[left]] = slot[left]
        self.edge_slot_right[edges[~left]] = slot[~left]
        # offsets (geodesic, tangent at the centre) from each centre to its edge midpoints and neighbours
        valid = self.cell_edges >= 0
        e = np.where(valid, self.cell_edges, 0)
        c = self.centers[:, None, :]
        self.cell_edge_offset = np.where(valid[..., None], log_map(c, self.edge_midpoint[e]), 0.0)
        self.cell_neighbor_offset = np.where(
            valid[..., None], log_map(c, self.centers[self.cell_neighbors]), 0.0
        )

    # -- point location and quadrature ----------------------------------------
    @abstractmethod
    def locate(self, points: ArrayLike) -> np.ndarray:
        """Index of the cell containing each point, shape ``(n,)``."""

    @abstractmethod
    def quadrature(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A quadrature rule subordinate to the cells: ``(points (Q, d), weights (Q,), cell (Q,))``.

        Weights are for the plain surface measure; the weights of cell ``i`` sum to its area
        (up to the rule's error).
        """

    def cell_averages(self, f) -> np.ndarray:
        r"""Cell averages :math:`\frac{1}{|C_i|}\int_{C_i} f\,dA` of ``f(points (n, d)) -> (n,)`` by :meth:`quadrature`."""
        x, w, cell = self.quadrature()
        fx = np.asarray(f(x), dtype=float)
        if fx.shape != w.shape:
            raise ValueError(
                f"f must map points of shape {x.shape} to values of shape {w.shape}, got shape {fx.shape}"
            )
        num = np.bincount(cell, weights=w * fx, minlength=self.n_cells)
        den = np.bincount(cell, weights=w, minlength=self.n_cells)
        return num / den

    def _check_points(self, points: ArrayLike) -> np.ndarray:
        x = as_points(points, "points", normalize=True)
        if x.ndim != 2 or x.shape[1] != self.d:
            raise ValueError(f"points must have shape (n, {self.d}) for this mesh, got {x.shape}")
        return x


class CircleMesh(Mesh):
    r"""Uniform grid of ``m`` equal arcs on :math:`S^1`.

    Cell ``i`` is the arc :math:`[\theta_0 + i h, \theta_0 + (i+1) h]`, :math:`h = 2\pi/m`; edge ``i``
    is the point :math:`\theta_0 + i h` between cells ``i-1`` and ``i`` (length 1).

    Parameters
    ----------
    m : int
        Number of cells, ``>= 3``.
    offset : float
        :math:`\theta_0`.

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.mesh import CircleMesh
    >>> mesh = CircleMesh(8)
    >>> mesh.n_cells, mesh.n_edges, round(mesh.spacing, 6)  # h = 2 pi / 8
    (8, 8, 0.785398)
    >>> mesh.locate([[1.0, 0.0], [0.0, 1.0]])  # angles 0 and pi / 2
    array([0, 2])
    """

    def __init__(self, m: int, *, offset: float = 0.0):
        self.m = check_int(m, "m", minimum=3)
        self.offset = check_finite(offset, "offset")
        self.d = 2
        h = 2 * np.pi / self.m
        self.width = h
        self.edge_angles = self.offset + h * np.arange(self.m)
        self.center_angles = self.edge_angles + 0.5 * h
        self.centers = np.stack([np.cos(self.center_angles), np.sin(self.center_angles)], axis=-1)
        self.generators = self.centers
        self.areas = np.full(self.m, h)
        i = np.arange(self.m)
        self.cell_left = (i - 1) % self.m
        self.cell_right = i
        self.edge_length = np.ones(self.m)
        t = self.edge_angles
        self.edge_midpoint = np.stack([np.cos(t), np.sin(t)], axis=-1)
        self.edge_normal = np.stack([-np.sin(t), np.cos(t)], axis=-1)
        self.edge_distance = np.full(self.m, h)
        self._finish()

    @property
    def edges(self) -> np.ndarray:
        """Edge angles, shape ``(m,)`` (cell ``i`` lies between ``edges[i]`` and ``edges[i] + h``)."""
        return self.edge_angles

    @property
    def widths(self) -> np.ndarray:
        return self.areas

    def locate(self, points: ArrayLike) -> np.ndarray:
        theta = points_to_angles(self._check_points(points))
        return (
            np.floor(np.mod(theta - self.offset, 2 * np.pi) / self.width).astype(np.intp) % self.m
        )

    def quadrature(self, order: int = 4) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Gauss--Legendre rule with ``order`` nodes in each arc (exact for polynomials in θ of degree ``2 order - 1``)."""
        s, ws = np.polynomial.legendre.leggauss(order)
        theta = (self.edge_angles[:, None] + 0.5 * self.width * (s + 1)[None, :]).reshape(-1)
        w = np.tile(0.5 * self.width * ws, self.m)
        cell = np.repeat(np.arange(self.m), order)
        return np.stack([np.cos(theta), np.sin(theta)], axis=-1), w, cell

    def to_dict(self) -> dict:
        """The specification that rebuilds this mesh exactly (:func:`mesh_from_dict`)."""
        return {"type": "circle", "m": self.m, "offset": self.offset}

    def __repr__(self) -> str:
        return f"CircleMesh(m={self.m}, h={self.width:.4g})"


# --------------------------------------------------------------------------- sphere


def _icosahedron() -> tuple[np.ndarray, np.ndarray]:
    """The 12 unit vertices (cyclic permutations of (0, +-1, +-phi)) and the 20 faces."""
    p = (1 + np.sqrt(5)) / 2
    # fmt: off
    v = np.array([[-1, p, 0], [1, p, 0], [-1, -p, 0], [1, -p, 0],
                  [0, -1, p], [0, 1, p], [0, -1, -p], [0, 1, -p],
                  [p, 0, -1], [p, 0, 1], [-p, 0, -1], [-p, 0, 1]], dtype=float)
    f = np.array([[0, 11, 5], [0, 5, 1], [0, 1, 7], [0, 7, 10], [0, 10, 11],
                  [1, 5, 9], [5, 11, 4], [11, 10, 2], [10, 7, 6], [7, 1, 8],
                  [3, 9, 4], [3, 4, 2], [3, 2, 6], [3, 6, 8], [3, 8, 9],
                  [4, 9, 5], [2, 4, 11], [6, 2, 10], [8, 6, 7], [9, 8, 1]])
    # fmt: on
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return v, f


def icosahedral_nodes(n: int) -> np.ndarray:
    r"""The ``10 n^2 + 2`` vertices of the icosahedron with every face cut into :math:`n^2`
    triangles, projected radially onto :math:`S^2` (class-I geodesic grid), shape ``(N, 3)``.

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.mesh import icosahedral_nodes
    >>> icosahedral_nodes(1).shape, icosahedral_nodes(2).shape  # 10 n^2 + 2
    ((12, 3), (42, 3))
    >>> bool(np.allclose(np.linalg.norm(icosahedral_nodes(2), axis=1), 1.0))
    True
    """
    n = check_int(n, "n")
    v, faces = _icosahedron()
    seen: dict[tuple, int] = {}
    pts: list[np.ndarray] = []
    for a, b, c in faces:
        for i in range(n + 1):
            for j in range(n + 1 - i):
                k = n - i - j
                key = tuple(sorted((vtx, wt) for vtx, wt in ((a, i), (b, j), (c, k)) if wt > 0))
                if key in seen:
                    continue
                seen[key] = len(pts)
                pts.append((i * v[a] + j * v[b] + k * v[c]) / n)
    x = np.array(pts)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _regions(sv: SphericalVoronoi) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Flattened regions: (cell id per corner, vertex index per corner, next vertex index)."""
    sv.sort_vertices_of_regions()
    lens = np.array([len(r) for r in sv.regions])
    cell = np.repeat(np.arange(len(sv.regions)), lens)
    vert = np.concatenate([np.asarray(r, dtype=np.intp) for r in sv.regions])
    start = np.concatenate([[0], np.cumsum(lens)[:-1]])
    pos = np.arange(vert.size) - start[cell]
    nxt = vert[start[cell] + (pos + 1) % lens[cell]]
    return cell, vert, nxt


def _solid_angle(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Area of the spherical triangle (a, b, c) (Van Oosterom & Strackee 1983), unsigned."""
    dot = lambda u, v: np.einsum("...i,...i->...", u, v)
    return 2 * np.arctan2(np.abs(dot(a, np.cross(b, c))), 1 + dot(a, b) + dot(b, c) + dot(c, a))


def _vector_areas(
    gen: np.ndarray, verts: np.ndarray, cell: np.ndarray, vert: np.ndarray, nxt: np.ndarray
) -> np.ndarray:
    r""":math:`\int_C x\,dA` for every cell: :math:`\tfrac12\sum_e \ell_e\,\hat{(v_a \times v_b)}`, oriented by the generator."""
    a, b = verts[vert], verts[nxt]
    cr = np.cross(a, b)
    nrm = np.linalg.norm(cr, axis=1)
    ell = geodesic_distance(a, b)
    with np.errstate(invalid="ignore", divide="ignore"):
        u = np.where(nrm[:, None] > 0, cr / np.where(nrm > 0, nrm, 1)[:, None], 0.0)
    terms = 0.5 * ell[:, None] * u
    M = gen.shape[0]
    va = np.stack([np.bincount(cell, weights=terms[:, k], minlength=M) for k in range(3)], axis=1)
    sign = np.sign(np.einsum("ij,ij->i", va, gen))
    return va * sign[:, None]


class SphereMesh(Mesh):
    r"""Quasi-uniform spherical Voronoi mesh of :math:`S^2`.

    Parameters
    ----------
    resolution : int
        ``n``: the mesh has ``M = 10 n^2 + 2`` cells of mean spacing about ``3.6 / (n \sqrt{10})``
        (``n = 32`` gives 10242 cells).
    generators : {"icosahedral", "fibonacci"}
        Initial generators: the refined icosahedron (:func:`icosahedral_nodes`) or the
        Fibonacci spiral with the same number of points.
    lloyd : int
        Lloyd iterations (generators moved to their cell centroids) towards a centroidal
        Voronoi tessellation; they even out the cell areas of the projected icosahedron.

    Notes
    -----
    ``centers`` are the spherical centroids :math:`\int_C x\,dA / |\int_C x\,dA|`; the diffusive
    flux uses the generators.  :meth:`from_generators` takes any generator set.

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.mesh import SphereMesh
    >>> mesh = SphereMesh(2)
    >>> mesh.n_cells, round(float(mesh.areas.sum()), 6)  # 10 n^2 + 2 cells covering 4 pi
    (42, 12.566371)
    """

    def __init__(self, resolution: int = 8, *, generators: str = "icosahedral", lloyd: int = 3):
        n = check_int(resolution, "resolution")
        if generators == "icosahedral":
            pts = icosahedral_nodes(n)
        elif generators == "fibonacci":
            pts = fibonacci_nodes(10 * n * n + 2)
        else:
            raise ValueError(f"generators must be 'icosahedral' or 'fibonacci', got {generators!r}")
        lloyd = check_int(lloyd, "lloyd", minimum=0)
        self.resolution: int | None = n  # (None for a mesh of arbitrary generators)
        self.kind = generators
        self.lloyd = lloyd
        self._build(pts, lloyd)

    @classmethod
    def from_generators(cls, points: ArrayLike, *, lloyd: int = 0) -> SphereMesh:
        """Voronoi mesh of arbitrary distinct generators on :math:`S^2`, shape ``(M, 3)``, ``M >= 4``."""
        x = as_points(points, "points", normalize=True)
        if x.ndim != 2 or x.shape[1] != 3 or x.shape[0] < 4:
            raise ValueError(f"points must have shape (M, 3) with M >= 4, got {x.shape}")
        obj = cls.__new__(cls)
        obj.resolution = None
        obj.kind = "custom"
        obj.lloyd = check_int(lloyd, "lloyd", minimum=0)
        obj._build(x.astype(float), obj.lloyd)
        return obj

    def _build(self, pts: np.ndarray, lloyd: int) -> None:
        self.d = 3
        for _ in range(lloyd):
            sv = SphericalVoronoi(pts, threshold=1e-10)
            cell, vert, nxt = _regions(sv)
            va = _vector_areas(pts, sv.vertices, cell, vert, nxt)
            pts = va / np.linalg.norm(va, axis=1, keepdims=True)
        try:
            sv = SphericalVoronoi(pts, threshold=1e-10)
        except ValueError as exc:
            raise ValueError(
                f"cannot build a spherical Voronoi mesh of these generators: {exc}"
            ) from None
        cell, vert, nxt = _regions(sv)
        verts = sv.vertices / np.linalg.norm(sv.vertices, axis=1, keepdims=True)
        M = pts.shape[0]
        self.generators = pts
        self.vertices = verts
        self.regions = [np.asarray(r, dtype=np.intp) for r in sv.regions]
        # areas: fan of exact spherical triangles (generator, a, b): sums to 4 pi to round-off
        self.areas = np.bincount(
            cell, weights=_solid_angle(pts[cell], verts[vert], verts[nxt]), minlength=M
        )
        va = _vector_areas(pts, verts, cell, vert, nxt)
        self.centers = va / np.linalg.norm(va, axis=1, keepdims=True)
        # edges: each arc (a, b) appears in exactly two regions
        lo, hi = np.minimum(vert, nxt), np.maximum(vert, nxt)
        key = lo * verts.shape[0] + hi
        _, inv, cnt = np.unique(key, return_inverse=True, return_counts=True)
        if np.any(cnt != 2):
            raise ValueError(
                "spherical Voronoi regions do not close (an edge is not shared by exactly two cells); "
                "check that the generators are distinct"
            )
        order = np.argsort(inv, kind="stable")
        first, second = order[0::2], order[1::2]
        cl, cr = cell[first], cell[second]
        a, b = verts[lo[first]], verts[hi[first]]
        normal = np.cross(a, b)
        nn = np.linalg.norm(normal, axis=1)
        gdiff = pts[cr] - pts[cl]
        # degenerate (zero-length) arcs: the normal is the bisector direction of the generators
        normal = np.where(
            nn[:, None] > 1e-14,
            normal / np.where(nn > 1e-14, nn, 1)[:, None],
            gdiff / np.linalg.norm(gdiff, axis=1, keepdims=True),
        )
        normal *= np.sign(np.einsum("ij,ij->i", normal, gdiff))[:, None]
        mid = a + b
        self.cell_left = cl.astype(np.intp)
        self.cell_right = cr.astype(np.intp)
        self.edge_length = geodesic_distance(a, b)
        self.edge_midpoint = mid / np.linalg.norm(mid, axis=1, keepdims=True)
        self.edge_normal = normal
        self.edge_distance = geodesic_distance(pts[cl], pts[cr])
        self.edge_vertices = np.stack([lo[first], hi[first]], axis=1)
        self._corner = (cell, vert, nxt)
        self._tree: cKDTree | None = None
        self._finish()

    # -- quality ----------------------------------------------------------------
    def quality(self) -> dict[str, float]:
        """``area_ratio`` (max/min), ``min_angle`` (smallest corner angle of a cell, degrees),
        ``edge_ratio`` (shortest edge / mean edge), ``centroid_offset`` (max generator-centroid
        distance / spacing)."""
        cell, vert, nxt = self._corner
        lens = np.bincount(cell)
        start = np.concatenate([[0], np.cumsum(lens)[:-1]])
        pos = np.arange(vert.size) - start[cell]
        prev = vert[start[cell] + (pos - 1) % lens[cell]]
        v = self.vertices[vert]
        t1 = log_map(v, self.vertices[prev])
        t2 = log_map(v, self.vertices[nxt])
        cosang = np.einsum("ij,ij->i", t1, t2) / np.maximum(
            np.linalg.norm(t1, axis=1) * np.linalg.norm(t2, axis=1), 1e-300
        )
        ok = (np.linalg.norm(t1, axis=1) > 1e-12) & (np.linalg.norm(t2, axis=1) > 1e-12)
        ang = np.degrees(np.arccos(np.clip(cosang[ok], -1, 1)))
        return {
            "area_ratio": float(self.areas.max() / self.areas.min()),
            "min_angle": float(ang.min()),
            "edge_ratio": float(self.edge_length.min() / self.edge_length.mean()),
            "centroid_offset": float(
                geodesic_distance(self.centers, self.generators).max() / self.spacing
            ),
        }

    # -- location and quadrature ------------------------------------------------
    def locate(self, points: ArrayLike) -> np.ndarray:
        """Voronoi cell of each point: its nearest generator."""
        x = self._check_points(points)
        if self._tree is None:
            self._tree = cKDTree(self.generators)
        return self._tree.query(x)[1].astype(np.intp)

    # Dunavant (1985) degree-5 rule on a triangle: barycentric nodes and weights (sum 1).
    _RULE_L = np.array(
        [
            [1 / 3, 1 / 3, 1 / 3],
            [0.059715871789770, 0.470142064105115, 0.470142064105115],
            [0.470142064105115, 0.059715871789770, 0.470142064105115],
            [0.470142064105115, 0.470142064105115, 0.059715871789770],
            [0.797426985353087, 0.101286507323456, 0.101286507323456],
            [0.101286507323456, 0.797426985353087, 0.101286507323456],
            [0.101286507323456, 0.101286507323456, 0.797426985353087],
        ]
    )
    _RULE_W = np.array([0.225, *[0.132394152788506] * 3, *[0.125939180544827] * 3])

    def quadrature(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        r"""Fan of each cell into triangles (generator, a, b); on each, Dunavant's degree-5 rule on
        the flat triangle pushed radially onto the sphere with the area element
        :math:`\det(g, a, b) / (2|p|^3)` (solid angle of a flat element)."""
        cell, vert, nxt = self._corner
        g, a, b = self.generators[cell], self.vertices[vert], self.vertices[nxt]
        det = np.abs(np.einsum("ij,ij->i", g, np.cross(a, b)))
        L = self._RULE_L
        p = (
            L[None, :, 0, None] * g[:, None]
            + L[None, :, 1, None] * a[:, None]
            + L[None, :, 2, None] * b[:, None]
        )
        r = np.linalg.norm(p, axis=-1)
        w = self._RULE_W[None, :] * det[:, None] / (2 * r**3)
        return (p / r[..., None]).reshape(-1, 3), w.reshape(-1), np.repeat(cell, L.shape[0])

    def to_dict(self) -> dict:
        """The specification that rebuilds this mesh exactly (:func:`mesh_from_dict`); generators listed
        for meshes built by :meth:`from_generators`."""
        if self.resolution is None:
            return {"type": "sphere", "generators": self.generators.tolist(), "lloyd": 0}
        return {
            "type": "sphere",
            "resolution": self.resolution,
            "generators": self.kind,
            "lloyd": self.lloyd,
        }

    def __repr__(self) -> str:
        q = self.quality()
        res = f"resolution={self.resolution}, " if self.resolution is not None else ""
        return (
            f"SphereMesh({res}M={self.n_cells}, generators={self.kind!r}, lloyd={self.lloyd}, "
            f"h={self.spacing:.4g}, area_ratio={q['area_ratio']:.3f}, min_angle={q['min_angle']:.1f}deg)"
        )


def mesh_from_dict(spec: dict) -> Mesh:
    """The mesh of a specification written by ``Mesh.to_dict()``.

    Examples
    --------
    >>> from wflow.mesh import CircleMesh, mesh_from_dict
    >>> spec = CircleMesh(16).to_dict()
    >>> spec
    {'type': 'circle', 'm': 16, 'offset': 0.0}
    >>> mesh_from_dict(spec).n_cells
    16
    """
    if not isinstance(spec, dict) or spec.get("type") not in ("circle", "sphere"):
        raise ValueError(
            f"a mesh specification is a dict with type 'circle' or 'sphere', got {spec!r:.80}"
        )
    if spec["type"] == "circle":
        return CircleMesh(spec["m"], offset=spec.get("offset", 0.0))
    if isinstance(spec.get("generators"), list):
        return SphereMesh.from_generators(
            np.asarray(spec["generators"]), lloyd=spec.get("lloyd", 0)
        )
    return SphereMesh(
        spec["resolution"],
        generators=spec.get("generators", "icosahedral"),
        lloyd=spec.get("lloyd", 3),
    )
