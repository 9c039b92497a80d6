r"""The perceptron paper in wflow: its model and conventions, its weight draws, its runs and clusters.

Álvarez-López, Geshkovski & Ruiz-Balet, *Perceptrons and localization of attention's mean-field
landscape* (ICML 2026), in the paper's conventions, converted to wflow's explicitly here
(docs/perceptron.md; the study: :mod:`wflow.studies.perceptron`): the rescaled kernel, a time
change for USA (:func:`paper_model`); the two sign conventions of descent (``"code"``, the
authors' simulation code, flips the perceptron with the attention; ``"poster"`` only the
attention); the weight draws (:func:`paper_perceptron`), the cluster threshold
(:func:`cluster_threshold`) and runs until every system has settled (:func:`run_paper`,
:class:`SettleStop`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .diagnostics import batched_cluster_labels
from .errors import check_int, check_positive
from .measure import Atoms
from .models import SA, USA, Model, Perceptron
from .solvers.particles import simulate
from .solvers.saveat import SaveAt
from .sphere import uniform

__all__ = [
    "BETAS",
    "CONVENTIONS",
    "check_convention",
    "cluster_threshold",
    "paper_perceptron",
    "paper_model",
    "run_paper",
    "clusters_of",
    "SettleStop",
]

#: the paper's beta grid
BETAS = (0.01, 0.05, 0.1, 0.5, 1.0, 3.0, 5.0, 7.0, 10.0, 15.0, 25.0, 35.0, 50.0)
#: the two sign conventions of descent (:func:`paper_model`)
CONVENTIONS = ("code", "poster")


def check_convention(convention: Any) -> str:
    """``convention`` if it is one of :data:`CONVENTIONS`, else a one-line ``ValueError`` naming it.

    Examples
    --------
    >>> check_convention("poster")
    'poster'
    >>> check_convention("paper")
    Traceback (most recent call last):
    ...
    ValueError: convention must be 'code' or 'poster', got 'paper'
    """
    if not isinstance(convention, str) or convention not in CONVENTIONS:
        raise ValueError(f"convention must be 'code' or 'poster', got {convention!r}")
    return convention


def cluster_threshold(beta: float, d: int) -> float:
    r"""The paper's cluster threshold :math:`\min(1/(2\sqrt\beta), \pi/(2d))`.

    Examples
    --------
    >>> cluster_threshold(1.0, 2), round(cluster_threshold(100.0, 2), 4), round(cluster_threshold(1.0, 8), 4)
    (0.5, 0.05, 0.1963)
    >>> cluster_threshold(-1.0, 2)
    Traceback (most recent call last):
    ...
    ValueError: beta must be a finite number > 0, got -1.0
    """
    beta = check_positive(beta, "beta")
    d = check_int(d, "d", minimum=2)
    return float(min(1.0 / (2.0 * np.sqrt(beta)), np.pi / (2 * d)))


def paper_perceptron(
    d: int, scale: float, seed: int, *, units: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The paper's sampling: ``units`` (default d) rows a_j uniform on the sphere, omega_j ~ N(0, scale^2).

    Examples
    --------
    >>> import numpy as np
    >>> A, omega = paper_perceptron(4, 2.0, seed=0)
    >>> A.shape, omega.shape, bool(np.allclose(np.linalg.norm(A, axis=1), 1))
    ((4, 4), (4,), True)
    """
    rng = np.random.default_rng(seed)
    m = d if units is None else units
    A = uniform(m, d, seed=rng)
    omega = scale * rng.standard_normal(m)
    return A, omega


def paper_model(
    beta: float,
    sign: int,
    d: int,
    *,
    attention: str = "USA",
    A: np.ndarray | None = None,
    omega: np.ndarray | None = None,
    activation: str = "gelu",
    convention: str = "code",
) -> tuple[Model, float]:
    r"""The paper's model in wflow's convention, and the factor ``c`` with :math:`t_{\rm wflow} = c\,s_{\rm paper}`.

    USA: the paper's field :math:`e^{-\beta}\,\mathrm{USA}_{\rm wflow} + u_\omega` is
    :math:`e^{-\beta}(\mathrm{USA}_{\rm wflow} + u_{e^\beta\omega})`, a time change ``c = e^-beta``
    (the perceptron's output weights times :math:`e^\beta`).  SA: unchanged, ``c = 1``.

    Parameters
    ----------
    beta : float
        Inverse temperature of the paper's rescaled kernel :math:`e^{\beta(\langle x,y\rangle-1)}`.
    sign : {1, -1}
        1: ascent (attraction, ``V = I``), -1: descent (repulsion, ``V = -I``).
    d : int
        Dimension of the ambient space (the sphere is :math:`S^{d-1}`).
    attention : {"USA", "SA"}
    A, omega : ndarray, shape (m, d) and (m,), optional
        The conservative perceptron :math:`W = A^\top\mathrm{diag}(\omega)`; none when ``A`` is None.
    activation : str
    convention : {"code", "poster"}
        Descent flips the whole velocity, :math:`\dot x = -(v_{\rm attn} + u_\omega)`, in the
        authors' code (``"code"``, default: the paper's figures), only the attention,
        :math:`\dot x = -v_{\rm attn} + u_\omega`, in the poster (``"poster"``).

    Examples
    --------
    >>> model, c = paper_model(2.0, -1, 2)     # descent (repulsion), USA
    >>> model, round(c, 6)
    (USA(beta=2, V=-I), 0.135335)
    >>> paper_model(2.0, 1, 2, attention="SA")
    (SA(beta=2), 1.0)

    Descent with a perceptron: the code's convention flips the perceptron too.

    >>> import numpy as np, wflow
    >>> A, omega = np.eye(2), np.array([1.0, -0.5])
    >>> x = np.array([[0.6, 0.8]])
    >>> code, _ = paper_model(1.0, -1, 2, A=A, omega=omega, convention="code")
    >>> poster, _ = paper_model(1.0, -1, 2, A=A, omega=omega, convention="poster")
    >>> attention, _ = paper_model(1.0, -1, 2)
    >>> mu = wflow.Atoms(x)
    >>> bool(np.allclose(code.velocity(x, mu) + poster.velocity(x, mu), 2 * attention.velocity(x, mu)))
    True
    """
    conv = check_convention(convention)
    V = None if sign > 0 else -np.eye(d)
    if attention == "USA":
        model: Model = USA(beta, V=V)
        factor = float(np.exp(-beta))
    elif attention == "SA":
        model = SA(beta, V=V)
        factor = 1.0
    else:
        raise ValueError(f"attention must be 'USA' or 'SA', got {attention!r}")
    if A is not None:
        flip = -1.0 if (sign < 0 and conv == "code") else 1.0
        model = model + Perceptron.conservative(
            A, flip * np.asarray(omega) / factor, activation=activation
        )
    return model, factor


class SettleStop:
    """``callback(t, mu)`` of :func:`wflow.simulate`: true once every system has settled.

    Settled: the cluster count the same for ``stable_saves`` saves, every cluster's diameter below
    the threshold, the drift (largest displacement per unit of paper time between saves) below
    ``drift_tol``.

    Times are wflow's; ``factor`` converts them to the paper's (``s = t / factor``).

    Examples
    --------
    Two systems already collapsed to one point each settle at the third save (same cluster count
    three times, zero drift):

    >>> import numpy as np, wflow
    >>> x = np.stack([np.tile([[1.0, 0.0]], (5, 1)), np.tile([[0.0, 1.0]], (5, 1))])
    >>> stop = SettleStop(threshold=0.1, factor=1.0)
    >>> [stop(t, wflow.Atoms(x)) for t in (0.0, 1.0, 2.0)], stop.settled_at
    ([False, False, True], 2.0)
    """

    def __init__(
        self, threshold: float, factor: float, drift_tol: float = 1e-4, stable_saves: int = 3
    ):
        self.threshold, self.factor = threshold, factor
        self.drift_tol, self.stable = drift_tol, stable_saves
        self.prev: tuple[float, np.ndarray] | None = None
        self.history: list[np.ndarray] = []
        self.settled_at: float | None = None

    def __call__(self, t: float, mu: Atoms) -> bool:
        x = np.asarray(mu.points, dtype=np.float64)
        k, labels = batched_cluster_labels(x, self.threshold)
        self.history.append(np.asarray(k))
        drift = np.inf
        if self.prev is not None and t > self.prev[0]:
            ds = (t - self.prev[0]) / self.factor
            drift = float(np.max(np.linalg.norm(x - self.prev[1], axis=-1))) / ds
        self.prev = (t, x.copy())
        if len(self.history) < self.stable or drift > self.drift_tol:
            return False
        if not all(np.array_equal(h, self.history[-1]) for h in self.history[-self.stable :]):
            return False
        if _max_diameter(x, labels) >= self.threshold:
            return False
        self.settled_at = t / self.factor
        return True


def _max_diameter(x: np.ndarray, labels: np.ndarray) -> float:
    """Largest geodesic distance of a point to its cluster's mean direction, times 2."""
    worst = 0.0
    for b in range(x.shape[0]):
        for c in np.unique(labels[b]):
            pts = x[b, labels[b] == c]
            m = pts.sum(0)
            m /= np.linalg.norm(m)
            worst = max(worst, 2 * float(np.arccos(np.clip(pts @ m, -1, 1)).max()))
    return worst


def clusters_of(x: np.ndarray, threshold: float) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per system: cluster mean directions ``(k, d)`` and masses ``(k,)``, heaviest first."""
    k, labels = batched_cluster_labels(x, threshold)
    out = []
    for b in range(x.shape[0]):
        n = x.shape[1]
        masses = np.bincount(labels[b], minlength=k[b]) / n
        means = np.stack([x[b, labels[b] == c].sum(0) for c in range(k[b])])
        means /= np.linalg.norm(means, axis=1, keepdims=True)
        order = np.argsort(-masses, kind="stable")
        out.append((means[order], masses[order]))
    return out


def run_paper(
    beta: float,
    sign: int,
    *,
    d: int,
    N: int,
    seeds: int,
    attention: str = "USA",
    A: np.ndarray | None = None,
    omega: np.ndarray | None = None,
    activation: str = "gelu",
    t_max: float = 200.0,
    dt: float = 0.1,
    save_every: float = 1.0,
    seed0: int = 0,
    convention: str = "code",
    threshold: float | None = None,
) -> dict[str, Any]:
    """``seeds`` particle systems (a batch) of the paper's model, run until settled or ``t_max`` (paper time).

    ``convention`` is :func:`paper_model`'s; ``threshold`` the cluster threshold (default
    :func:`cluster_threshold`).

    Examples
    --------
    Two systems of 16 tokens on the circle, ascent: about 4 s, so not run here.

    >>> r = run_paper(1.0, 1, d=2, N=16, seeds=2, t_max=50.0)  # doctest: +SKIP
    >>> sorted(r)  # doctest: +SKIP
    ['clusters', 'settled', 't_stop', 'threshold', 'x']
    """
    model, c = paper_model(
        beta,
        sign,
        d,
        attention=attention,
        A=A,
        omega=omega,
        activation=activation,
        convention=convention,
    )
    thr = cluster_threshold(beta, d) if threshold is None else float(threshold)
    x0 = np.stack([uniform(N, d, seed=seed0 + s) for s in range(seeds)])
    stop = SettleStop(thr, c)
    saves = np.arange(0.0, t_max + 0.5 * save_every, save_every) * c
    traj = simulate(
        model,
        Atoms(x0),
        float(saves[-1]),
        save_at=SaveAt(saves, points=False, diagnostics=()),
        method="euler",
        dt=dt * c,
        trackers=[stop],
    )
    x = np.asarray(traj.points_at(-1), dtype=np.float64)
    return {
        "x": x,
        "clusters": clusters_of(x, thr),
        "threshold": thr,
        "settled": stop.settled_at is not None,
        "t_stop": stop.settled_at if stop.settled_at is not None else t_max,
    }
