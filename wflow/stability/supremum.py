r"""The supremum of the energy over probability measures, and its maximizers.

For gradient *ascent* the supremum of :math:`F` is reached at Diracs at the argmax of the
perceptron potential: :func:`potential_maximum` finds that argmax (a certified grid on the
circle, multistart local ascent on :math:`S^{d-1}`), :func:`energy_supremum` adds the
attention blocks' share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import optimize

from .._typing import SeedLike
from ..errors import NotAGradientFlowError, check_int, check_nonnegative, short_repr
from ..measure import Atoms
from ..models import ACTIVATIONS, Model, Perceptron
from ..sphere import as_generator
from .blocks import DSIGMA, conservative_omega, gradient_blocks, tangent_basis


def _potential(perceptrons: list[Perceptron], x: np.ndarray) -> np.ndarray:
    """:math:`v(x) = \\sum_p v_{\\omega,p}(x)`, shape ``x.shape[:-1]``."""
    out = np.zeros(x.shape[:-1])
    for p in perceptrons:
        out = out + p.potential(x)
    return out


def _potential_grad(perceptrons: list[Perceptron], x: np.ndarray) -> np.ndarray:
    """Ambient gradient :math:`\\nabla v = 2\\sum_j\\omega_j\\sigma(a_j\\cdot x+b_j)a_j`."""
    out = np.zeros(x.shape)
    for p in perceptrons:
        out = (
            out
            + 2.0 * (ACTIVATIONS[p.activation][0](x @ p.A.T + p.b) * conservative_omega(p)) @ p.A
        )
    return out


def _local_max(perceptrons: list[Perceptron], y: np.ndarray, iters: int = 200) -> np.ndarray:
    """Riemannian ascent of v from ``y``: Armijo gradient steps, Newton steps where the Hessian is negative."""
    d = y.shape[0]
    y = y / np.linalg.norm(y)
    val = float(_potential(perceptrons, y[None])[0])
    for _ in range(iters):
        g_amb = _potential_grad(perceptrons, y[None])[0]
        B = tangent_basis(y[None])[0]  # (d-1, d)
        g = B @ g_amb
        if np.linalg.norm(g) <= 1e-12 * max(1.0, float(np.linalg.norm(g_amb))):
            break
        D2 = np.zeros((d, d))
        for p in perceptrons:
            dsig = DSIGMA[p.activation](p.A @ y + p.b) * conservative_omega(p)
            D2 = D2 + 2.0 * np.einsum("j,ja,jb->ab", dsig, p.A, p.A)
        Hr = B @ D2 @ B.T - np.dot(g_amb, y) * np.eye(d - 1)
        ev = np.linalg.eigvalsh(Hr)
        step = -np.linalg.solve(Hr, g) if ev[-1] < 0 else g / max(float(np.abs(ev).max()), 1e-12)
        t, accepted = 1.0, False
        while t > 1e-10 and not accepted:
            v = t * (step @ B)
            cand = y * np.cos(np.linalg.norm(v)) + np.sinc(np.linalg.norm(v) / np.pi) * v
            cand /= np.linalg.norm(cand)
            cval = float(_potential(perceptrons, cand[None])[0])
            accepted = cval > val + 1e-4 * t * float(g @ step)
            t /= 2
        if not accepted:
            break
        y, val = cand, cval
    return y


@dataclass
class PotentialMaximum:
    r"""Global maximum of the perceptron potential :math:`v_\omega` on the sphere.

    Attributes
    ----------
    value : float
        :math:`\max v_\omega` (the best value found).
    maximizers : ndarray, shape (n, d)
        Distinct points where it is attained (to ``tol``).
    upper_bound : float or None
        On :math:`S^1`, a certified bound :math:`\max v_\omega \le` ``upper_bound`` from the
        grid and a bound on :math:`|v_\omega''|`; ``None`` for :math:`d \ge 3` (multi-start
        search, not certified).

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.stability import potential_maximum
    >>> r = potential_maximum(wflow.Perceptron.conservative([[0.0, 1.0]], [2.0]))
    >>> round(r.value, 12), bool(r.value <= r.upper_bound), r.maximizers.shape  # 2 |a|^2 on S^1
    (2.0, True, (1, 2))
    """

    value: float
    maximizers: np.ndarray
    upper_bound: float | None


def potential_maximum(
    perceptron: Perceptron | list[Perceptron],
    *,
    n_grid: int | None = None,
    n_starts: int = 256,
    n_local: int = 32,
    seed: SeedLike = 0,
    tol: float = 1e-9,
) -> PotentialMaximum:
    r"""Global maximum of :math:`v_\omega(x) = \sum_j\omega_j\varphi(a_j\cdot x+b_j)` over :math:`S^{d-1}`.

    On :math:`S^1`: the local maxima of ``v`` on a grid of ``n_grid`` angles (default
    :math:`\max(2^{14}, 256m)`) refined by bounded Brent search, with the certified bound
    :math:`\max v \le \max_k\max(v_k, v_{k+1}) + C h^2/8` (:math:`h` the grid step,
    :math:`C \ge |v''|`).  For :math:`d \ge 3`: ``n_starts`` uniform points and the
    :math:`\pm a_j/|a_j|`, the best ``n_local`` polished by Riemannian gradient and Newton steps.

    Parameters
    ----------
    perceptron : Perceptron or list of Perceptron
        Conservative perceptron(s) on the same dimension (their potentials add).
    n_grid, n_starts, n_local : int
        Grid size on the circle; random starts and local searches on higher spheres.
    seed : seed-like
        For the random starts.
    tol : float
        Points within ``tol * max(1, |max v|)`` of the maximum value count as maximizers.

    Examples
    --------
    One ReLU unit: :math:`v(x) = 2(a\cdot x)_+^2` is largest, :math:`2|a|^2`, at :math:`a/|a|`.

    >>> import numpy as np, wflow
    >>> from wflow.stability import potential_maximum
    >>> p = wflow.Perceptron.conservative([[0.0, 1.0]], [2.0])
    >>> r = potential_maximum(p)
    >>> round(r.value, 12), np.round(r.maximizers, 8) + 0.0
    (2.0, array([[0., 1.]]))
    """
    perceptrons = list(perceptron) if isinstance(perceptron, (list, tuple)) else [perceptron]
    if not perceptrons:
        raise ValueError("potential_maximum needs at least one perceptron, got an empty list")
    for p in perceptrons:
        if not isinstance(p, Perceptron):
            raise TypeError(f"perceptron must be a wflow Perceptron, got {short_repr(p)}")
        why = p.gradient_obstruction()
        if why is not None:
            raise NotAGradientFlowError(f"{p!r} has no potential: {why}")
    dims = {int(p.A.shape[1]) for p in perceptrons}
    if len(dims) != 1:
        raise ValueError(f"the perceptrons act on different dimensions: {sorted(dims)}")
    d = dims.pop()
    tol = check_nonnegative(tol, "tol")
    rng = as_generator(seed)
    upper = None
    if d == 2:
        m_units = sum(p.A.shape[0] for p in perceptrons)
        n = max(2**14, 256 * m_units) if n_grid is None else check_int(n_grid, "n_grid", minimum=16)
        h = 2 * np.pi / n
        theta = h * np.arange(n)
        vals = _potential(perceptrons, np.stack([np.cos(theta), np.sin(theta)], -1))
        # C >= |v''| along the circle: |<D^2 v t, t>| + |<grad v, x>|
        C = 0.0
        for p in perceptrons:
            an = np.linalg.norm(p.A, axis=1)
            reach = an + np.abs(p.b)
            # |sigma(s)| <= |s| (or 1)
            smax = np.ones_like(reach) if p.activation == "tanh" else reach
            dmax = 1.13 if p.activation == "gelu" else 1.0  # sup sigma'
            C += float(np.sum(2 * np.abs(conservative_omega(p)) * (dmax * an**2 + an * smax)))
        upper = float(np.max(np.maximum(vals, np.roll(vals, -1)))) + C * h * h / 8
        f = lambda t: -float(_potential(perceptrons, np.array([[np.cos(t), np.sin(t)]]))[0])  # noqa: E731
        is_max = (
            (vals >= np.roll(vals, 1))
            & (vals >= np.roll(vals, -1))
            & (vals >= upper - 2 * C * h * h / 8 - tol)
        )
        idx = np.flatnonzero(is_max)
        if idx.size > 4 * n_local:  # a plateau: keep a spread subset
            idx = idx[np.linspace(0, idx.size - 1, 4 * n_local).astype(int)]
        cands = []
        for k in idx:
            r = optimize.minimize_scalar(
                f, bounds=(theta[k] - h, theta[k] + h), method="bounded", options={"xatol": 1e-13}
            )
            cands.append(r.x if -r.fun >= vals[k] else theta[k])
        pts = np.stack([np.cos(cands), np.sin(cands)], -1)
    else:
        starts = rng.standard_normal((check_int(n_starts, "n_starts"), d))
        starts /= np.linalg.norm(starts, axis=1, keepdims=True)
        dirs = np.concatenate([p.A[np.linalg.norm(p.A, axis=1) > 0] for p in perceptrons])
        dirs = dirs / np.linalg.norm(dirs, axis=1, keepdims=True)
        starts = np.concatenate([starts, dirs, -dirs])
        order = np.argsort(-_potential(perceptrons, starts))[: check_int(n_local, "n_local")]

        pts = np.array([_local_max(perceptrons, starts[i]) for i in order])
    vals = _potential(perceptrons, pts)
    best = float(vals.max())
    keep = vals >= best - tol * max(1.0, abs(best))
    out: list[np.ndarray] = []
    for y in pts[keep][np.argsort(-vals[keep])]:
        if all(np.linalg.norm(y - z) > 1e-6 for z in out):
            out.append(y)
    if upper is not None:
        upper = max(upper, best)
    return PotentialMaximum(value=best, maximizers=np.array(out), upper_bound=upper)


@dataclass
class EnergySupremum:
    r"""Supremum of :math:`F` over probability measures (see :func:`energy_supremum`).

    Attributes
    ----------
    value : float
        :math:`\sup F = c_\beta + \tfrac12\max v_\omega`.
    interaction : float
        :math:`c_\beta = \sum_{\text{attention}} e^\beta/(2\beta)` (:math:`\tfrac12` at
        :math:`\beta = 0`): the interaction energy of any Dirac.
    potential : PotentialMaximum or None
        The maximum of the perceptron potential (``None`` without a perceptron).
    maximizers : ndarray, shape (n, d) or None
        Points :math:`x` with :math:`F(\delta_x) = \sup F`; ``None`` means every Dirac (no
        perceptron).

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.stability import energy_supremum
    >>> s = energy_supremum(wflow.USA(2.0))  # no perceptron: every Dirac, e^beta / (2 beta)
    >>> bool(np.isclose(s.value, np.exp(2.0) / 4)), s.potential, s.maximizers
    (True, None, None)
    """

    value: float
    interaction: float
    potential: PotentialMaximum | None
    maximizers: np.ndarray | None

    def dirac(self, i: int = 0) -> Atoms:
        """The maximizer :math:`\\delta_{x_i}` as :class:`~wflow.Atoms`."""
        if self.maximizers is None:
            raise ValueError("every Dirac is a maximizer here (no perceptron): pick any point")
        return Atoms(self.maximizers[i : i + 1], normalize=True)


def energy_supremum(model: Model, **kwargs: Any) -> EnergySupremum:
    r"""Supremum of :math:`F` (the ascended energy) and its Dirac maximizers.

    For attractive attention (:math:`V = I`) plus conservative perceptrons,

    .. math::

        F(\mu) = \sum_{\text{attention}}\frac1{2\beta}\iint e^{\beta\langle x,y\rangle}d\mu\,d\mu
                 + \frac12\int v_\omega\,d\mu
        \;\le\; \sum_{\text{attention}}\frac{e^\beta}{2\beta} + \frac12\max_{S^{d-1}} v_\omega,

    with equality exactly at :math:`\mu = \delta_{x^*}`, :math:`x^* \in \arg\max v_\omega` (at
    :math:`\beta = 0` the interaction is :math:`\tfrac12|\int x\,d\mu|^2 \le \tfrac12`).  Without
    attention every measure carried by :math:`\arg\max v_\omega` is a maximizer; the Diracs are
    reported.

    Parameters
    ----------
    model : Model
        USA or SA with :math:`V = I` (:math:`Q = K = I`), conservative perceptrons, or a sum.
    **kwargs
        Passed to :func:`potential_maximum` (``n_grid``, ``n_starts``, ``seed``, ...).

    Raises
    ------
    ValueError
        If an attention block is repulsive (:math:`V = -I`): the supremum is then not at a
        Dirac.

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.stability import energy_supremum
    >>> model = wflow.USA(1.0) + wflow.Perceptron.conservative([[0.0, 1.0]], [2.0])
    >>> s = energy_supremum(model)
    >>> bool(np.isclose(s.value, np.e / 2 + 1.0)), np.round(s.maximizers, 8) + 0.0
    (True, array([[0., 1.]]))
    >>> bool(np.isclose(model.energy(s.dirac()), s.value))
    True
    """
    attention, perceptrons = gradient_blocks(model)
    for sign, beta in attention:
        if sign < 0:
            raise ValueError(
                f"model {model!r} has a repulsive attention block (V = -I): its energy's supremum is not "
                f"attained at a Dirac; energy_supremum covers attractive attention (V = I) only"
            )
    interaction = float(
        sum(np.exp(beta) / (2 * beta) if beta > 0 else 0.5 for _, beta in attention)
    )
    if not perceptrons:
        return EnergySupremum(
            value=interaction, interaction=interaction, potential=None, maximizers=None
        )
    pm = potential_maximum(perceptrons, **kwargs)
    return EnergySupremum(
        value=interaction + 0.5 * pm.value,
        interaction=interaction,
        potential=pm,
        maximizers=pm.maximizers,
    )
