r"""The perceptron paper's runs in wflow: the stopping rule, the clusters, the study's stored parts.

Álvarez-López, Geshkovski & Ruiz-Balet, *Perceptrons and localization of attention's mean-field
landscape* (ICML 2026); the model and its conventions are :mod:`wflow.studies.perceptron_model`'s.

* **time.** Every time below is the paper's :math:`s`; the Euler step is ``dt = 0.1`` of it.
* **stop.** A run stops once the cluster count has been the same for three saves, every
  cluster's diameter is below the threshold and the particles' drift (largest displacement per
  unit time between saves) is below 1e-4 (:class:`SettleStop`, a ``callback`` of
  :func:`wflow.simulate`), or at ``t_max``.
* **parts.** :class:`Runs` reads each run of the study ``wflow validate perceptron``
  (:mod:`wflow.studies.perceptron`) from a stored part when an earlier run computed it.
"""

from __future__ import annotations

import functools
import hashlib
import time
from typing import Any

import numpy as np

from ..diagnostics import batched_cluster_labels
from ..measure import Atoms
from ..solvers.particles import simulate
from ..solvers.saveat import SaveAt
from ..sphere import uniform
from .parts import Parts
from .perceptron_model import check_convention, cluster_threshold, paper_model

__all__ = [
    "SettleStop",
    "clusters_of",
    "run_paper",
    "paper_part",
    "Runs",
]


class SettleStop:
    """``callback(t, mu)`` of :func:`wflow.simulate`: true once every system has settled (module docstring).

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
        self.threshold, self.factor, self.drift_tol, self.stable = (
            threshold,
            factor,
            drift_tol,
            stable_saves,
        )
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


def paper_part(beta: float, sign: int, **kw: Any) -> dict[str, Any]:
    """:func:`run_paper` as a part of the study (:class:`~wflow.studies.parts.Parts`): the final points, whether
    every system settled, and the stopping time (the clusters are recomputed from the points).

    Examples
    --------
    >>> p = paper_part(1.0, 1, d=2, N=16, seeds=2, t_max=50.0)  # doctest: +SKIP
    >>> sorted(p), p["x"].shape  # doctest: +SKIP
    (['seconds', 'settled', 't_stop', 'x'], (2, 16, 2))
    """
    start = time.perf_counter()
    r = run_paper(beta, sign, **kw)
    return {
        "x": r["x"],
        "settled": r["settled"],
        "t_stop": r["t_stop"],
        "seconds": time.perf_counter() - start,
    }


def _digest(a: np.ndarray | None) -> str | None:
    return (
        None
        if a is None
        else hashlib.sha1(np.ascontiguousarray(a, dtype=np.float64).tobytes()).hexdigest()[:16]
    )


class Runs:
    """The study's runs through its parts: ``runs(beta, sign, d=..., ...)`` is :func:`run_paper`'s result, read
    from a stored part when an earlier (or parallel, :meth:`prefetch`) run computed it.

    The keywords are :func:`paper_part`'s (``d``, ``N``, ``seeds`` required; ``attention="USA"``,
    ``A=None``, ``omega=None``, ``activation="gelu"``, ``t_max=200.0``, ``convention="code"``,
    ``threshold=None``, ``seed0=0``); :meth:`key` names the part a call reads.
    """

    def __init__(self, parts: Parts):
        self.parts = parts
        self.seconds = 0.0

    @staticmethod
    def _args(
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
        convention: str = "code",
        threshold: float | None = None,
        seed0: int = 0,
    ) -> dict[str, Any]:
        return {
            "beta": float(beta),
            "sign": int(sign),
            "d": int(d),
            "N": int(N),
            "seeds": int(seeds),
            "attention": attention,
            "A": A,
            "omega": omega,
            "activation": activation,
            "t_max": float(t_max),
            "convention": check_convention(convention),
            "threshold": None if threshold is None else float(threshold),
            "seed0": int(seed0),
        }

    @staticmethod
    def _key(args: dict[str, Any]) -> dict[str, Any]:
        key = {k: args[k] for k in ("beta", "sign", "d", "N", "seeds", "attention")}
        key |= {"A": _digest(args["A"]), "omega": _digest(args["omega"])}
        key |= {"activation": args["activation"], "t_max": args["t_max"], "dt": 0.1}
        if (
            args["A"] is not None and args["sign"] < 0
        ):  # (the conventions differ only in descent with a perceptron)
            key["convention"] = args["convention"]
        if args["threshold"] is not None:
            key["threshold"] = args["threshold"]
        if args["seed0"]:
            key["seed0"] = args["seed0"]
        return key

    @classmethod
    def key(cls, beta: float, sign: int, **kw: Any) -> dict[str, Any]:
        """The key of the part that ``runs(beta, sign, **kw)`` reads: the run's parameters, the
        perceptron's weights by digest, the convention only where it changes the run.

        Examples
        --------
        >>> Runs.key(1.0, 1, d=2, N=8, seeds=2, t_max=5.0)["t_max"]
        5.0
        >>> Runs.key(1.0, 1, d=2, N=8, seeds=2) == Runs.key(1, 1, d=2, N=8, seeds=2, convention="poster")
        True
        """
        return cls._key(cls._args(beta, sign, **kw))

    def prefetch(self, calls: list[tuple[tuple, dict]]) -> None:
        """Compute (or find stored) every run of ``calls``, ``((beta, sign), keywords)`` each, largest first."""
        runs = sorted(
            (self._args(*c, **kw) for c, kw in calls), key=lambda a: -(a["N"] ** 2) * a["seeds"]
        )
        self.parts.prefetch([(self._key(a), functools.partial(paper_part, **a), ()) for a in runs])

    def __call__(self, beta: float, sign: int, **kw: Any) -> dict[str, Any]:
        args = self._args(beta, sign, **kw)
        p = self.parts.get(self._key(args), lambda: paper_part(**args))
        self.seconds += float(p["seconds"])
        thr = args["threshold"]
        thr = cluster_threshold(args["beta"], args["d"]) if thr is None else thr
        return {
            "x": p["x"],
            "clusters": clusters_of(p["x"], thr),
            "threshold": thr,
            "settled": bool(p["settled"]),
            "t_stop": float(p["t_stop"]),
        }
