r"""Multiscale entropic :math:`W_2` on the sphere with a certified bracket.

:func:`certified_w2` computes :math:`W_2` between two atomic measures on :math:`S^{d-1}`
(:math:`10^5`--:math:`10^6` atoms) and returns a bracket ``lower <= W_2 <= upper`` of relative
width at most ``tol`` (Schmitzer 2019, "Stabilized sparse scaling"; Feydy 2020, GeomLoss
multiscale).  docs/transport.md explains the method; in short:

1. **Coarse level.**  Clusterings with ``RATIO`` times more cells per level; a dense
   log-domain Sinkhorn on the coarsest anneals :math:`\varepsilon` from :math:`\mathrm{diam}^2`
   to its spacing squared, and a level of :math:`N_\ell` cells anneals down to
   ``HANDOVER`` :math:`/N_\ell` before the finer level takes over.
2. **Finer levels.**  Each atom starts from the soft c-transform of the coarser potentials
   (:func:`_extrapolate`); per :math:`\varepsilon` (halved) the kept pairs have
   :math:`f_i + g_j - c_{ij} \ge -\tau\varepsilon` (``TAU``), expanded from the coarse cell
   pairs on a level's first two steps (:func:`_expand`), filtered from the previous step's
   (:func:`_narrow`), or searched exactly by cells (:func:`_search`); rows that lost their
   best partner are repaired (:func:`_repair`).  Over-relaxed Sinkhorn scaling on the
   pattern (:mod:`._scaling`) until the marginals' L1 error is below ``LEVEL_ERR``.
3. **Certificate.**  At :math:`\varepsilon \le` ``reg``: the lower bound is the dual value
   of the exact c-transforms (:func:`wflow.transport.certify.c_transform`), the upper bound
   the cost of the sparse plan rounded onto the exact marginals; a bracket wider than
   ``tol`` halves :math:`\varepsilon` again.

Memory and each pass are O(kept pairs).  The cost is :math:`\theta^2` (geodesic) or
:math:`|x-y|^2` (chordal); ``reg`` is in its units.  Only balanced transport is supported.
"""

from __future__ import annotations

import logging
import math
import numbers
import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.spatial import cKDTree
from scipy.special import logsumexp

from ..errors import real_float_dtype, short_repr
from ._common import SINKHORN_RESOLUTION, import_pot
from ._scaling import Scaling
from .certify import MIN_TOL, Cells, c_transform, cmax
from .sparse_kernels import (
    best_partner,
    csc_order,
    expand_count,
    expand_fill,
    expand_thresholds,
    merge_pairs,
    pattern_costs,
    plan_cost,
    rounded_plan_cost,
    sparse_softmin,
)

__all__ = ["certified_w2", "check_measure"]

log = logging.getLogger(__name__)

#: kernel truncation: a pair is kept when its dual slack is within TAU eps of its row's best
TAU = 12.0
#: the hierarchy: each level has RATIO times fewer atoms than the next finer one
RATIO = 4
#: a level of N atoms (not the last) anneals down to eps = HANDOVER / N, then hands over
HANDOVER = 2.5
#: L1 error of the marginals at which an eps level hands over to the next (halved) one
LEVEL_ERR = 1e-3
#: the hand-over's coarse cell pairs: those within (TAU + MARGIN) eps of their row's or
#: column's best at the coarse level's last eps (a fine atom's slack differs from its cell's
#: by about 2 r sqrt(TAU eps), r the cell radius, r^2 several eps at the hand-over)
MARGIN = 100.0
#: a row (column) whose best partner in the kept pairs is more than LOST eps above its exact
#: best over all atoms has lost its partners: its window is searched and added
LOST = 1.0
#: the marginals are tight enough for the certificate once the bracket estimated on the kept
#: pairs takes at most SAFE of the width allowed (the exact c-transform can only lower the dual)
SAFE = 0.5
#: on the finest level, the first eps's kept pairs go to the exact network simplex (POT's sparse
#: ``ot.emd``, :func:`_simplex`) when there are at most this many
EXACT_PAIRS = 4_000_000
#: ... and when the first eps is above SIMPLEX_GAP tol W_2^2 (the scaling has several halvings to go)
SIMPLEX_GAP = 16.0


# -- input checks ---------------------------------------------------------------------------
def _real(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {short_repr(value)}")
    return float(value)


def check_measure(points: Any, weights: Any, name: str, d: int | None = None):
    """Points ``(n, d)`` on the unit sphere and weights ``(n,)`` >= 0 with positive mass, float64."""
    x = np.asarray(points)
    real_float_dtype(x.dtype, f"{name}: points", integers=True)  # complex and object alike
    x = x.astype(np.float64, copy=False)
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] < 2:
        raise ValueError(
            f"{name} must be a non-empty array of points of shape (n, d), d >= 2, got shape {x.shape}"
        )
    if d is not None and x.shape[1] != d:
        raise ValueError(
            f"{name} must live on the same sphere as the first measure: its points have d={x.shape[1]}, "
            f"the first measure's d={d}"
        )
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name} has non-finite coordinates")
    norms = np.linalg.norm(x, axis=1)
    bad = int(np.argmax(np.abs(norms - 1.0)))
    if abs(norms[bad] - 1.0) > 1e-9:
        raise ValueError(
            f"{name} must lie on the unit sphere: point {bad} has norm {float(norms[bad]):.17g} (normalize it first)"
        )
    if weights is None:
        w = np.full(x.shape[0], 1.0 / x.shape[0])
    else:
        w = np.asarray(weights)
        real_float_dtype(w.dtype, f"{name}: weights", integers=True)
        w = w.astype(np.float64, copy=False)
        if w.shape != (x.shape[0],):
            raise ValueError(f"{name} weights must have shape ({x.shape[0]},), got shape {w.shape}")
        if not np.all(np.isfinite(w)) or np.any(w < 0):
            raise ValueError(f"{name} weights must be finite and >= 0, got min {w.min()!r}")
    mass = float(w.sum())
    if not mass > 0:
        raise ValueError(f"{name} has zero mass (weights sum to {mass!r})")
    keep = w > 0
    return x[keep], w[keep], mass


# -- the coarse level ---------------------------------------------------------------------------
def cluster_measure(x, w, k, rng):
    """Cluster labels (nearest of ``k`` random atoms), normalized cluster means and masses."""
    n = x.shape[0]
    if n <= k:
        return np.arange(n), x.copy(), w.copy()
    centres = x[rng.choice(n, size=k, replace=False)]
    _, lab = cKDTree(centres).query(x, workers=2)
    mass = np.bincount(lab, weights=w, minlength=k)
    mean = np.stack(
        [np.bincount(lab, weights=w * x[:, t], minlength=k) for t in range(x.shape[1])], 1
    )
    used = mass > 0
    relabel = np.cumsum(used) - 1
    mean = mean[used]
    mean /= np.linalg.norm(mean, axis=1, keepdims=True)
    return relabel[lab], mean, mass[used]


def _dense_cost(x, y, geodesic):
    s = np.maximum(2.0 - 2.0 * np.clip(x @ y.T, -1.0, 1.0), 0.0)
    if not geodesic:
        return s
    return (2.0 * np.arctan2(np.sqrt(s), np.sqrt(np.maximum(4.0 - s, 0.0)))) ** 2


def _softmin(c, pot, logw, eps, buf):
    r""":math:`-\varepsilon \log \sum_j w_j e^{(pot_j - c_{ij})/\varepsilon}` per row of the dense
    ``c`` (``buf``: scratch of its shape; in place, without ``logsumexp``'s copies)."""
    np.subtract(pot + eps * logw, c, out=buf)
    buf /= eps
    top = buf.max(axis=1)
    buf -= top[:, None]
    np.exp(buf, out=buf)
    return -eps * (top + np.log(buf.sum(axis=1)))


def _coarse(xc, ac, yc, bc, geodesic, eps_list, n_final, need=1e-3):
    """Dense log-domain Sinkhorn on the clusters along ``eps_list`` (one pass each), then at
    the last one until the row marginals' L1 error is at most ``need`` (``n_final`` passes
    at most)."""
    c = _dense_cost(xc, yc, geodesic)
    ct = np.ascontiguousarray(c.T)
    buf, buft = np.empty_like(c), np.empty_like(ct)
    la, lb = np.log(ac), np.log(bc)
    f, g = np.zeros(len(ac)), np.zeros(len(bc))
    for k, eps in enumerate([*eps_list, *[eps_list[-1]] * n_final]):
        f = _softmin(c, g, lb, eps, buf)
        g = _softmin(ct, f, la, eps, buft)
        if k >= len(eps_list) and k % 10 == 0:
            rows = np.exp(logsumexp((f[:, None] + g[None, :] - c) / eps + lb[None, :], axis=1))
            if np.abs(rows - 1.0).dot(ac) <= need:
                break
    return f, g, c


def _extrapolate(q, pts, pot, logw, eps, geodesic):
    r"""Soft c-transform :math:`-\varepsilon\log\sum_J w_J e^{(pot_J - c(q_i, p_J))/\varepsilon}` of each query.

    Over every :math:`J` whose term is within :math:`e^{-\tau}` of the largest, found exactly
    by cells (:meth:`wflow.transport.certify.Cells.within`).
    """
    h = pot + eps * logw
    rows, cols, c = Cells(pts).within(q, h, np.full(q.shape[0], TAU * eps), geodesic)
    order = np.argsort(rows, kind="stable")
    cols, c = cols[order].astype(np.int64), c[order]
    ptr = np.zeros(q.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=q.shape[0]), out=ptr[1:])
    out = np.empty(q.shape[0])
    sparse_softmin(ptr, cols, c, pot, logw, eps, out)
    return out


# -- the fine level -------------------------------------------------------------------------------
class _Pattern:
    """Kept pairs in CSR (``ptr``, ``cols``) and CSC (``cptr``, ``crows``, ``perm``).

    ``i``, ``j``: the pairs' rows and columns, sorted by row then column, no repeats.
    """

    def __init__(self, i, j, n, m, ptr=None):
        if ptr is None:
            ptr = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(np.bincount(i, minlength=n), out=ptr[1:])
        self.ptr = ptr
        # 32-bit indices: the Sinkhorn passes read them for every pair (memory bandwidth)
        self.rows = i.astype(np.int32, copy=False)
        self.cols = j.astype(np.int32, copy=False)
        self.perm, self.cptr = csc_order(self.cols, m)
        self.crows = self.rows[self.perm]
        self.nnz = self.cols.size

    @classmethod
    def from_csr(cls, ptr, cols, m):
        """The pattern of CSR rows ``ptr``, ``cols`` (each row's columns distinct)."""
        n = ptr.size - 1
        return cls(np.repeat(np.arange(n, dtype=np.int32), np.diff(ptr)), cols, n, m, ptr)

    def with_pairs(self, c, rows_i, rows_j, x, y, geodesic):
        """This pattern (costs ``c``, CSR order) with the pairs ``(rows_i[k], rows_j[k])`` added
        (any order, repeats allowed), and its costs: a merge row by row, no 64-bit copy."""
        n, m = self.ptr.size - 1, self.cptr.size - 1
        add = _sorted_keys(rows_i, rows_j, m)
        add_ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(add // m, minlength=n), out=add_ptr[1:])
        ptr, cols, cn = merge_pairs(self.ptr, self.cols, c, add_ptr, add % m, x, y, geodesic)
        return _Pattern.from_csr(ptr, cols, m), cn

    @classmethod
    def union(cls, rows_i, rows_j, n, m):
        """The pattern of the pairs ``(rows_i[k], rows_j[k])``, in any order, repeats allowed."""
        key = _sorted_keys(rows_i, rows_j, m)
        return cls(key // m, key % m, n, m)


def _sorted_keys(rows_i, rows_j, m):
    """The distinct keys ``rows_i * m + rows_j``, ascending (a sort: np.unique hashes first)."""
    key = np.sort(rows_i.astype(np.int64) * m + rows_j)
    return key[np.r_[True, key[1:] != key[:-1]]] if key.size else key


def certified_w2(
    x: Any,
    y: Any,
    a: Any = None,
    b: Any = None,
    *,
    cost: str = "geodesic",
    reg: float = 1e-2,
    tol: float = 1e-3,
    n_coarse: int = 1000,
    max_levels: int = 30,
    max_iter: int = 2000,
    seed: int = 0,
    omega: float = 1.9,
    threads: int | None = None,
    device: str = "auto",
) -> dict:
    r"""Certified :math:`W_2` between :math:`\sum_i a_i\delta_{x_i}` and :math:`\sum_j b_j\delta_{y_j}` on :math:`S^{d-1}`.

    .. math::
        W_2^2 = \min_{\pi \in \Pi(a, b)} \sum_{ij} \pi_{ij}\, c(x_i, y_j),\qquad
        c = \theta^2 \ \text{(geodesic)}\ \text{or}\ |x - y|^2 \ \text{(chordal)}.

    Parameters
    ----------
    x : array_like, shape (n, d)
        Atoms of the first measure, on the unit sphere (norms within 1e-9 of 1).
    y : array_like, shape (m, d)
        Atoms of the second measure, same ``d``.
    a, b : array_like, shapes (n,) and (m,), optional
        Non-negative weights (default uniform).  Their sums must agree to 1e-9
        (relative): unbalanced transport is not supported.
    cost : {"geodesic", "chordal"}
        Ground cost, squared.
    reg : float > 0
        :math:`\varepsilon` (units of the cost) down to which the solver anneals before it
        tries to certify; it goes below ``reg`` (halving) while the bracket is wider than
        ``tol``.
    tol : float
        Target relative width of the bracket, ``(upper - lower) <= tol * upper``;
        at least 1e-9 (float64 certifies no less).
    n_coarse : int
        Clusters per measure on the coarsest (dense) level.
    max_levels, max_iter : int
        Budget: :math:`\varepsilon` levels below ``reg``, and Sinkhorn passes per level.
    seed : int
        Seed of the random cluster centres.
    omega : float in [1, 2)
        Over-relaxation of the Sinkhorn passes (1: plain Sinkhorn), backed off towards 1
        while the passes diverge (:meth:`wflow.transport._scaling.Scaling.run`).
    threads : int, optional
        numba threads (default: 1 when ``512 (n + m) < 2·10^6``, where thread start-up
        dominates, else numba's default).
    device : {"auto", "cpu", "cuda"}
        Where the Sinkhorn passes run: ``"cuda"`` on the GPU through PyTorch (the rest stays on
        the CPU), ``"cpu"`` with numba; ``"auto"`` takes the GPU when PyTorch sees one.

    Returns
    -------
    dict
        ``value`` (midpoint of the bracket), ``lower``, ``upper`` (bounds on :math:`W_2`,
        certified up to float64 round-off), ``rel_width``, ``certified`` (width <= tol),
        ``eps`` (final :math:`\varepsilon`), ``levels``, ``passes``, ``pairs`` (kept pairs
        at the end), ``marginal_error`` (L1, before rounding), ``scanned`` (points the
        certificate's c-transforms scanned per atom, on average), ``device`` (where the
        passes ran), ``seconds``.

    Raises
    ------
    ValueError
        Empty or zero-mass measures, masses that differ, points off the sphere or of
        different dimensions, ``reg <= 0``, ``tol`` outside ``[1e-9, 1)``, ``device`` not
        one of the three, or ``"cuda"`` where PyTorch sees no GPU.

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.transport.multiscale import certified_w2
    >>> x = wflow.sphere.vmf_mixture(400, [[0, 0, 1.0], [1.0, 0, 0]], [20.0, 5.0], seed=0)
    >>> y = wflow.sphere.uniform(400, 3, seed=1)
    >>> r = certified_w2(x, y, tol=1e-3)
    >>> from scipy.optimize import linear_sum_assignment  # equal uniform weights: an assignment
    >>> C = wflow.sphere.cost_matrix(x, y)
    >>> exact = np.sqrt(C[linear_sum_assignment(C)].mean())
    >>> bool(r["lower"] <= exact <= r["upper"]), r["rel_width"] <= 1e-3
    (True, True)
    """
    t0 = time.perf_counter()
    if cost not in ("geodesic", "chordal"):
        raise ValueError(f"cost must be 'geodesic' or 'chordal', got {cost!r}")
    geodesic = cost == "geodesic"
    x, a, ma = check_measure(x, a, "x")
    y, b, mb = check_measure(y, b, "y", d=x.shape[1])
    if abs(ma - mb) > 1e-9 * max(ma, mb):
        raise ValueError(
            f"the masses differ: sum(a)={ma!r}, sum(b)={mb!r}; unbalanced transport is not supported "
            "(normalize both to the same mass)"
        )
    reg = _real(reg, "reg")
    if not (reg > 0 and math.isfinite(reg)):
        raise ValueError(f"reg (epsilon) must be a finite number > 0, got {reg!r}")
    floor = SINKHORN_RESOLUTION * cmax(geodesic)
    if reg < 10 * floor:  # the rule wasserstein(method="sinkhorn") applies to tol = 0.1 reg
        raise ValueError(
            f"certified_w2 cannot resolve reg={reg!r}: its dual potentials, of size up to "
            f"{cmax(geodesic):.4g} (the largest {cost} cost), carry float64 rounding of about "
            f"{floor:.1e}, so below reg = {10 * floor:.1e} each kernel entry e^((f + g - c)/reg) is "
            f"off by more than 10 %; use reg >= {10 * floor:.1e}"
        )
    tol = _real(tol, "tol")
    if not (MIN_TOL <= tol < 1):
        raise ValueError(
            f"tol must be in [{MIN_TOL:g}, 1): float64 cannot certify a relative width below {MIN_TOL:g}, got {tol!r}"
        )
    for v, name in ((n_coarse, "n_coarse"), (max_levels, "max_levels"), (max_iter, "max_iter")):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    omega = _real(omega, "omega")
    if not 1 <= omega < 2:
        raise ValueError(f"omega must be in [1, 2), got {omega!r}")
    engine = _engine(device)
    a, b = a / a.sum(), b / b.sum()
    n, m = x.shape[0], y.shape[0]
    import numba

    before = numba.get_num_threads()
    wanted = threads if threads is not None else (1 if (n + m) * 512 < 2e6 else before)
    numba.set_num_threads(
        max(1, min(int(wanted), int(getattr(numba.config, "NUMBA_NUM_THREADS", before))))
    )
    try:
        opts = _Settings(geodesic, reg, tol, max_levels, max_iter, omega, engine)
        result = _solve(x, a, y, b, opts, n_coarse, seed)
    finally:
        numba.set_num_threads(before)
    result["seconds"] = time.perf_counter() - t0
    result.update(n=n, m=m, cost=cost, reg=reg, tol=tol, device="cpu" if engine is None else "cuda")
    return result


def _engine(device):
    """The ``torch.device`` on which the passes run, or ``None`` for numba on the CPU."""
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {short_repr(device)}")
    if device == "cpu":
        return None
    from ._cuda import cuda_device

    gpu = cuda_device()
    if gpu is None and device == "cuda":
        raise ValueError(
            "device='cuda' needs PyTorch with a GPU it can see (torch.cuda.is_available() is False "
            "or torch is not installed); use device='cpu'"
        )
    return gpu


@dataclass(frozen=True)
class _Settings:
    """The solver's options, checked by :func:`certified_w2`."""

    geodesic: bool
    reg: float
    tol: float
    max_levels: int
    max_iter: int
    omega: float
    #: where the Sinkhorn passes run: None (numba, the CPU) or a torch.device (:mod:`._cuda`)
    engine: Any = None


def _solve(x, a, y, b, opts: _Settings, n_coarse: int, seed: int) -> dict:
    geodesic, reg = opts.geodesic, opts.reg
    d = x.shape[1]
    diam2 = cmax(geodesic)
    rng = np.random.default_rng(seed)
    t_start = time.perf_counter()
    area = 2 * math.pi ** (d / 2) / math.gamma(d / 2)  # |S^{d-1}|

    # the hierarchy: clusterings of each measure, RATIO x fewer atoms per level, down to n_coarse
    sizes = [min(x.shape[0], y.shape[0])]
    while sizes[-1] > n_coarse:
        sizes.append(max(sizes[-1] // RATIO, n_coarse))
    hier = [] if len(sizes) > 1 else [(x, a, y, b)]  # coarsest first: (x, a, y, b)
    for k in sizes[:0:-1]:
        _, xc, ac = cluster_measure(x, a, k, rng)
        _, yc, bc = cluster_measure(y, b, k, rng)
        hier.append((xc, ac, yc, bc))
    hier.append((x, a, y, b))

    # 1. coarsest level: dense annealing from diam^2 down to its spacing squared
    xc, ac, yc, bc = hier[0]
    spacing2 = (area / min(len(ac), len(bc))) ** (2.0 / (d - 1))
    eps = max(spacing2, reg) if len(sizes) > 1 else reg
    eps_list = [diam2]
    while eps_list[-1] * 0.25 > eps:
        eps_list.append(eps_list[-1] * 0.25)
    eps_list.append(eps)
    f, g, cc = _coarse(xc, ac, yc, bc, geodesic, eps_list, 100)
    log.debug(
        "coarse %d x %d, eps %.3g, t %.1f", len(ac), len(bc), eps, time.perf_counter() - t_start
    )
    state = {"levels": 0, "passes": 0, "t_start": t_start}
    result: dict = {}
    # the dense level's cell pairs that the first sparse level expands
    nc, mc = cc.shape
    full = _Pattern(np.repeat(np.arange(nc), mc), np.tile(np.arange(mc), nc), nc, mc)
    wide = _narrow(full, cc.ravel(), f, g, eps, tau=TAU + MARGIN)[0]
    for lev in range(1, len(hier)):
        xp, ap, yp, bp = hier[lev - 1]
        x, a, y, b = hier[lev]
        f, g = (  # the soft c-transforms of the coarser level's potentials (Feydy 2020)
            _extrapolate(x, yp, g, np.log(bp), eps, geodesic),
            _extrapolate(y, xp, f, np.log(ap), eps, geodesic),
        )
        last = lev == len(hier) - 1
        eps_end = reg if last else HANDOVER / min(len(a), len(b)) * (area / (4 * math.pi))
        co = _links(wide, hier[lev], hier[lev - 1])
        (f, g), eps, result, wide = _sparse_level(
            hier[lev], (f, g), eps, eps_end, last, opts, state, co
        )
    return result


def _search(x, y, f, g, eps, geodesic, k_min=16):
    r"""Kept pairs searched anew, exactly by cells, from both sides: ``(pattern, c, c_csc)``.

    Row i keeps :math:`c_{ij} - g_j \le t_i + \tau\varepsilon`, :math:`t_i = \min(\max(f_i,
    m_i), m_i + \tau\varepsilon)`, :math:`m_i = \min_j (c_{ij} - g_j)` over all atoms; the
    columns likewise.  A row with fewer than ``k_min`` in its window also keeps the ``k_min``
    atoms nearest its best partner (with a partner or two per row no plan may fit).
    """
    slack = TAU * eps
    found = []
    for q, pts, pot, ref in ((x, y, g, f), (y, x, f, g)):
        cells = Cells(pts)
        rows, cols, c = cells.within(q, pot, np.full(q.shape[0], slack), geodesic, ref=ref)
        k = min(k_min, pts.shape[0])
        short = np.bincount(rows, minlength=q.shape[0]) < k
        if short.any():
            sel = np.flatnonzero(short[rows])
            # each short row's best partner (the first of its pairs by value), then its neighbours
            order = sel[np.lexsort((c[sel] - pot[cols[sel]], rows[sel]))]
            first = order[np.r_[True, rows[order][1:] != rows[order][:-1]]]
            near = cKDTree(pts).query(pts[cols[first]], k=k, workers=2)[1].reshape(-1, k)
            rows = np.concatenate([rows, np.repeat(rows[first], k)])
            cols = np.concatenate([cols, near.ravel()])
        found.append((rows, cols))
    (rx, cx), (ry, cy) = found
    pat = _Pattern.union(np.concatenate([rx, cy]), np.concatenate([cx, ry]), x.shape[0], y.shape[0])
    c = pattern_costs(x, y, pat.ptr, pat.cols, geodesic)
    return pat, c, c[pat.perm]


@dataclass(frozen=True)
class _Coarse:
    """What a finer level needs of the coarser one: its kept cell pairs (``pat``, coarse
    indices) and each coarse cell's fine atoms, its children (CSR ``chx_ptr``, ``chx`` and
    ``chy_ptr``, ``chy``)."""

    pat: _Pattern
    chx_ptr: np.ndarray
    chx: np.ndarray
    chy_ptr: np.ndarray
    chy: np.ndarray


def _children(par, k):
    ptr = np.zeros(k + 1, dtype=np.int64)
    np.cumsum(np.bincount(par, minlength=k), out=ptr[1:])
    return ptr, np.argsort(par, kind="stable").astype(np.int64)


def _links(pat, fine, coarse):
    """:class:`_Coarse` from the coarse pattern and the two levels' atoms: a fine atom's
    cell is its nearest coarse atom."""
    x, _, y, _ = fine
    xc, _, yc, _ = coarse
    par_x = cKDTree(xc).query(x, workers=2)[1].astype(np.int64)
    par_y = cKDTree(yc).query(y, workers=2)[1].astype(np.int64)
    return _Coarse(pat, *_children(par_x, len(xc)), *_children(par_y, len(yc)))


def _repair(x, y, f, g, eps, narrowed, geodesic, exact=(None, None)):
    r"""The pattern with the windows of the rows and columns whose best partner it misses.

    Row i is *lost* when the best of its pairs, :math:`\min_{j \in P_i} (c_{ij} - g_j)`, lies
    more than ``LOST`` eps above the exact best over all atoms (``exact[0]``, by cells when
    not given); its window (the rule of :func:`_search`) is added; the columns likewise.
    Patterns expanded from coarse cells miss such rows near the transport map's
    discontinuities.  Returns ``None`` when nothing is lost, else the new
    ``(pattern, c, c_csc)`` and the number of lost rows and columns.
    """
    pat, c, c_csc = narrowed
    added, n_lost = [], 0
    sides = ((x, y, g, f, pat.ptr, pat.cols, c), (y, x, f, g, pat.cptr, pat.crows, c_csc))
    for side, (q, pts, pot, ref, ptr, idx, cq) in enumerate(sides):
        best, cells = exact[side], None
        if best is None:
            cells = Cells(pts)
            best, _ = cells.c_transform(q, pot, geodesic)
        on, _ = best_partner(ptr, idx, cq, pot)
        lost = np.flatnonzero(on - best > LOST * eps)
        n_lost += lost.size
        if lost.size:
            cells = cells if cells is not None else Cells(pts)
            r, p, _ = cells.within(
                q[lost], pot, np.full(lost.size, TAU * eps), geodesic, ref=ref[lost]
            )
            added.append((lost[r], p) if side == 0 else (p, lost[r]))
    if not n_lost:
        return None
    log.debug("eps %.3g: %d rows and columns lost their partners, repaired", eps, n_lost)
    rows_i = np.concatenate([r for r, _ in added])
    rows_j = np.concatenate([p for _, p in added])
    new, cn = pat.with_pairs(c, rows_i, rows_j, x, y, geodesic)
    return (new, cn, cn[new.perm]), n_lost


def _expand(x, y, f, g, eps, co: _Coarse, geodesic, k_min=16):
    r"""Kept pairs of a fine level from the coarse level's kept cell pairs (Schmitzer 2019).

    Atom i in cell I and atom j in cell J are candidates iff (I, J) is in ``co.pat``; the
    rule of :func:`_narrow` filters them, in O(candidates).
    """
    slack = TAU * eps
    cp = co.pat
    rows_side = (cp.ptr, cp.cols, co.chy_ptr, co.chy, co.chx_ptr, co.chx)
    thr_r = expand_thresholds(*rows_side, x, y, f, g, slack, k_min, geodesic)
    cols_side = (cp.cptr, cp.crows, co.chx_ptr, co.chx, co.chy_ptr, co.chy)
    thr_c = expand_thresholds(*cols_side, y, x, g, f, slack, k_min, geodesic)
    args = (*rows_side, x, y, f, g, thr_r, thr_c, geodesic)
    ptr = np.zeros(x.shape[0] + 1, dtype=np.int64)
    np.cumsum(expand_count(*args), out=ptr[1:])
    cols, c = expand_fill(*args, ptr)
    pat = _Pattern.from_csr(ptr, cols, y.shape[0])
    return pat, c, c[pat.perm]


def _narrow(pat, c, f, g, eps, k_min=16, tau=TAU):
    r"""The kept pairs at a smaller ``eps``, filtered from the previous eps step's pattern.

    Pairs within ``tau eps`` of the row's or the column's reference, :math:`t_i = \max(f_i,
    \min_j (c_{ij} - g_j))`; a row or column left with fewer than ``k_min`` keeps all its old
    ones.  (The new window lies inside the old while the potentials move by less than
    ``TAU eps``.)
    """
    n, m = pat.ptr.size - 1, pat.cptr.size - 1
    slack = tau * eps
    val_r = c - g[pat.cols]  # c_ij - g_j, CSR order
    t_r = np.maximum(f, np.minimum.reduceat(val_r, pat.ptr[:-1]))
    keep = val_r <= t_r[pat.rows] + slack
    cols_c = pat.cols[pat.perm]
    val_c = (c - f[pat.rows])[pat.perm]  # c_ij - f_i, CSC order
    t_c = np.maximum(g, np.minimum.reduceat(val_c, pat.cptr[:-1]))
    keep[pat.perm[val_c <= t_c[cols_c] + slack]] = True
    few_r = np.bincount(pat.rows[keep], minlength=n) < k_min
    few_c = np.bincount(pat.cols[keep], minlength=m) < k_min
    keep |= few_r[pat.rows] | few_c[pat.cols]
    new = _Pattern(pat.rows[keep], pat.cols[keep], n, m)
    cn = c[keep]
    return new, cn, cn[new.perm]


def _scaling(opts: _Settings, pat, c, c_csc, a, b, f, g, eps, state) -> Scaling:
    """The scaling on ``opts.engine``: numba's on the CPU, or PyTorch's on a device."""
    if opts.engine is None:
        return Scaling(pat, c, c_csc, a, b, f, g, eps, opts.omega, state)
    from ._cuda import CudaScaling

    return CudaScaling(pat, c, c_csc, a, b, f, g, eps, opts.omega, state, opts.engine)


def _tightened(sk: Scaling, meas, narrowed, opts: _Settings, primal, optimistic):
    r"""The scaling's marginals tightened as far as the certificate needs; the rounded plan's
    cost bound and moved mass ``(cost, delta)`` (:func:`rounded_plan_cost`).

    An error of ``need`` (rounding moves that much mass at :math:`c_{\max}` at most) bounds
    the bracket whatever the plan; the scaling stops earlier once the bracket estimated on the
    kept pairs takes at most ``SAFE`` of the width allowed.
    """
    x, a, y, b = meas
    pat, c, c_csc = narrowed
    tol, diam2 = opts.tol, cmax(opts.geodesic)
    need = 0.5 * (2.0 * tol * primal - max(optimistic, 0.0)) / diam2
    settled = False  # the last tightening stalled or ran out of passes: round as it is
    while True:
        pc, delta = rounded_plan_cost(
            pat.ptr, pat.cols, sk.kv, c, sk.u, sk.v, a, b, x, y, opts.geodesic, diam2
        )
        if settled or sk.err <= need:
            return pc, delta
        # the dual on the kept pairs with the scalings' potentials (the exact c-transform's is
        # lower); a scaling of 0 makes it -inf, and the estimate asks for the worst case's error
        with np.errstate(divide="ignore"):
            fu, gv = sk.f + sk.eps * np.log(sk.u / a), sk.g + sk.eps * np.log(sk.v / b)
        gs, _ = best_partner(pat.cptr, pat.crows, c_csc, fu)
        fs, _ = best_partner(pat.ptr, pat.cols, c, gv)
        lo = max(float(a @ fu + b @ gs), float(a @ fs + b @ gv))
        allowed = SAFE * (2.0 * tol - tol * tol) * pc  # (1 - tol)^2 W_up^2 <= W_lo^2
        est = pc - lo
        if est <= allowed:
            return pc, delta
        target = max(need, sk.err * min(0.5, 0.8 * allowed / est))
        st = sk.run(target, opts.max_iter)
        log.debug(
            "bracket %.2g of %.2g: to %.2g: %s, %.2g", est / pc, allowed / pc, target, st, sk.err
        )
        settled = st != "ok"


def _pairs(meas, f, g, eps, pat, c, co: _Coarse, geodesic, filtering, searching):
    """The kept pairs of one scaling attempt, ``(pattern, c, c_csc)``: the previous eps step's pairs
    filtered (``filtering``: a later eps step on a level), searched anew (``searching``: after a
    stall or a bracket wider than tol), else expanded from the coarse level's cell pairs."""
    x, _, y, _ = meas
    if filtering:
        return _narrow(pat, c, f, g, eps)
    if not searching:  # the first two eps steps: from the coarse cell pairs, repaired
        narrowed = _expand(x, y, f, g, eps, co, geodesic)
        checked = _repair(x, y, f, g, eps, narrowed, geodesic)
        return narrowed if checked is None else checked[0]
    return _search(x, y, f, g, eps, geodesic)


def _optimistic(meas, f, pattern, sk, opts: _Settings, levels):
    """Whether to certify on the last level's final eps, ``(certify, plan cost, rounding mass)``:
    when the bracket on the pattern is within ``tol`` (or the levels are spent), the plan
    rounded onto the marginals (:func:`_tightened`)."""
    _, a, _, b = meas
    pat, c, c_csc = pattern
    primal = plan_cost(pat.ptr, pat.cols, sk.kv, c, sk.u, sk.v)
    gs, _ = best_partner(pat.cptr, pat.crows, c_csc, f)
    optimistic = primal - float(a @ f + b @ gs)
    certify = optimistic <= opts.tol * primal or levels >= opts.max_levels
    if not certify:
        return False, math.nan, math.nan
    pc, delta = _tightened(sk, meas, pattern, opts, primal, optimistic)
    sk.absorb()
    return True, pc, delta


def _simplex(meas, duals, eps, pattern, sk, opts: _Settings, state):
    r"""The exact transport on the kept pairs (POT's sparse network simplex, started from the
    potentials), bracketed by its plan's cost and the exact c-transforms of its potentials.

    Tried once, on the finest level's first eps, when it is above ``SIMPLEX_GAP`` tol
    :math:`W_2^2` and there are at most ``EXACT_PAIRS`` pairs (docs/transport.md).  Returns
    the certified result, or ``None`` (not tried, no plan fits the pairs, or too wide)."""
    pat, c = pattern
    f, g = duals
    if state.get("simplex_tried") or pat.nnz > EXACT_PAIRS:
        return None
    state["simplex_tried"] = True
    primal = plan_cost(pat.ptr, pat.cols, sk.kv, c, sk.u, sk.v)
    if eps <= SIMPLEX_GAP * opts.tol * primal:
        return None
    ot = import_pot()
    from scipy.sparse import coo_array

    x, a, y, b = meas
    n, m = len(a), len(b)
    rows = np.repeat(np.arange(n), np.diff(pat.ptr))
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an infeasible pattern is a warning, read from the log
        _, lg = ot.emd(
            a,
            b,
            coo_array((c, (rows, pat.cols)), shape=(n, m)),
            numItermax=max(10**7, 100 * pat.nnz),
            log=True,
            potentials_init=(f, g),
        )
    log.debug(
        "network simplex on %d pairs: %s, %.1f s", pat.nnz, lg["warning"], time.perf_counter() - t0
    )
    if lg["warning"] is not None or lg.get("result_code", 1) != 1:
        return None
    u, v = np.asarray(lg["u"], float), np.asarray(lg["v"], float)
    result, _ = _certificate(meas, (u, v), eps, pat, float(lg["cost"]), opts, state)
    result["simplex"] = True
    return result if result["certified"] else None


def _certificate(meas, duals, eps, pat, up2, opts: _Settings, state, **details):
    """The certified bracket on the last level: ``(result, (f^c, g^c))``, the lower bound from the
    c-transforms of both potentials ``duals``, the upper from a feasible plan's cost ``up2``; ``details``
    (the marginal error and rounded mass of the scaling's plan) go into the result."""
    x, a, y, b = meas
    f, g = duals
    gt, st1 = c_transform(y, x, f, opts.geodesic)
    ft, st2 = c_transform(x, y, g, opts.geodesic)
    lo2 = min(max(float(a @ f + b @ gt), float(a @ ft + b @ g)), up2)  # (round-off: lo <= up)
    lo, up = math.sqrt(max(lo2, 0.0)), math.sqrt(max(up2, 0.0))
    width = (up - lo) / up if up > 0 else 0.0
    result = {
        "lower": lo,
        "upper": up,
        "value": 0.5 * (lo + up),
        "rel_width": width,
        "certified": width <= opts.tol,
        "eps": eps,
        "levels": state["levels"],
        "passes": state["passes"],
        "pairs": int(pat.nnz),
        "marginal_error": 0.0,
        "rounding_mass": 0.0,
        "scanned": 0.5 * (st1["scanned"] + st2["scanned"]),
        "lower_sq": lo2,
        "upper_sq": up2,
        "simplex": False,
        **{k: float(v) for k, v in details.items()},
    }
    log.debug("bracket [%.6f, %.6f], t %.1f", lo, up, time.perf_counter() - state["t_start"])
    return result, (ft, gt)


def _sparse_level(meas, duals, eps, eps_end, last, opts: _Settings, state, co: _Coarse):
    """The eps-halving loop on one level of atoms (kernel truncation); certifies on the last one.

    ``meas`` is ``(x, a, y, b)``, ``duals`` ``(f, g)``, ``co`` the coarser level's kept cell
    pairs.  Returns ``(f, g)``, the final eps, on the last level the certificate, and on the
    others the kept pairs (with margin ``MARGIN``) that the finer level expands.
    """
    x, a, y, b = meas
    f, g = duals
    geodesic = opts.geodesic
    la, lb_ = np.log(a), np.log(b)
    result: dict = {}
    pat = c = c_csc = None
    first = None  # the first eps step's pairs: the widest window on this level
    step, wide = 0, False
    repaired = None  # a pattern with the windows of the rows and columns that had lost theirs
    while True:
        state["levels"] += 1
        levels = state["levels"]
        final = last and eps <= opts.reg * (1 + 1e-12)
        for rebuild in range(4):  # a stalled scaling searches its pairs anew
            if pat is not None:  # the soft-min at this eps on the previous pairs: the reference
                sparse_softmin(pat.ptr, pat.cols, c, g, lb_, eps, f)
                sparse_softmin(pat.cptr, pat.crows, c_csc, f, la, eps, g)
            if repaired is not None:  # the pairs with the lost rows' and columns' windows
                narrowed, repaired = repaired, None
            else:
                filtering = not (step <= 1 or wide) and rebuild == 0  # a later eps step
                searching = wide or rebuild > 0
                narrowed = _pairs(meas, f, g, eps, pat, c, co, geodesic, filtering, searching)
            pat, c, c_csc = narrowed
            if step == 0 and not last:  # (after a stall, the pairs that replaced them)
                first = (pat, c)
            sparse_softmin(pat.ptr, pat.cols, c, g, lb_, eps, f)
            sparse_softmin(pat.cptr, pat.crows, c_csc, f, la, eps, g)
            sk = _scaling(opts, pat, c, c_csc, a, b, f, g, eps, state)
            status = sk.run(LEVEL_ERR, opts.max_iter)
            sk.absorb()
            log.debug("scaling: %s, err %.2g, passes %d", status, sk.err, state["passes"])
            if status != "stalled":
                break
            # rows that lost their partners stall the scaling: add their windows, or search anew
            log.debug("level %d eps %.3g: stalled at err %.2g, new pattern", levels, eps, sk.err)
            checked = _repair(x, y, f, g, eps, narrowed, geodesic)
            repaired = None if checked is None else checked[0]
        assert pat is not None  # the loop above ran at least once
        certify = False
        if final and (exact := _simplex(meas, (f, g), eps, (pat, c), sk, opts, state)):
            result = exact
            break
        if final:
            certify, pc, delta = _optimistic(meas, f, (pat, c, c_csc), sk, opts, levels)
        log.debug(
            "level %d (%d x %d atoms) eps %.3g pairs %d passes %d err %.2g certify %s t %.1f",
            levels,
            len(a),
            len(b),
            eps,
            pat.nnz,
            state["passes"],
            sk.err,
            certify,
            time.perf_counter() - state["t_start"],
        )
        if certify:
            result, (ft, gt) = _certificate(
                meas, (f, g), eps, pat, pc, opts, state, marginal_error=sk.err, rounding_mass=delta
            )
            if result["rel_width"] <= opts.tol or levels >= opts.max_levels:
                break
            checked = _repair(x, y, f, g, eps, (pat, c, c_csc), geodesic, exact=(ft, gt))
            if checked is not None:  # rows that lost their partners: at the same eps, repaired
                repaired = checked[0]
                continue
            wide = True  # the pairs may be incomplete: search them anew at the next eps
        if not last and eps <= 1.5 * eps_end:  # close enough: the finer level takes over
            break
        eps = max(0.5 * eps, eps_end) if eps > eps_end else 0.5 * eps
        step += 1
    # the pairs the finer level expands, with the hand-over's margin
    handed = None if first is None else _narrow(*first, f, g, eps, tau=TAU + MARGIN)[0]
    return (f, g), eps, result, handed
