r"""The perceptron study's stored runs: :func:`~wflow.perceptron_paper.run_paper` as parts.

The model, its conventions, the runs and their stopping rule are :mod:`wflow.perceptron_paper`'s;
:class:`Runs` reads each run of the study ``wflow validate perceptron``
(:mod:`wflow.studies.perceptron`) from a stored part when an earlier run computed it.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import time
from typing import Any

import numpy as np

from ..perceptron_paper import check_convention, cluster_threshold, clusters_of, run_paper
from .parts import Parts

__all__ = ["paper_part", "Runs"]


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
    if a is None:
        return None
    return hashlib.sha1(np.ascontiguousarray(a, dtype=np.float64).tobytes()).hexdigest()[:16]


#: :func:`run_paper`'s parameters; the study runs every part at the defaults of those in ``_FIXED``
_RUN_PAPER = inspect.signature(run_paper)
_FIXED = ("dt", "save_every")
_DT = _RUN_PAPER.parameters["dt"].default


class Runs:
    """The study's runs through its parts: ``runs(beta, sign, d=..., ...)`` is :func:`run_paper`'s result, read
    from a stored part when an earlier (or parallel, :meth:`prefetch`) run computed it.

    The keywords are :func:`run_paper`'s but ``dt`` and ``save_every``, which every run takes at
    their defaults; :meth:`key` names the part a call reads.
    """

    def __init__(self, parts: Parts):
        self.parts = parts
        self.seconds = 0.0

    @staticmethod
    def _args(beta: float, sign: int, **kw: Any) -> dict[str, Any]:
        for name in _FIXED:  # (every part runs at their defaults)
            if name in kw:
                raise TypeError(f"Runs._args() got an unexpected keyword argument {name!r}")
        bound = _RUN_PAPER.bind(beta, sign, **kw)
        bound.apply_defaults()
        args = {k: v for k, v in bound.arguments.items() if k not in _FIXED}
        args |= {k: float(args[k]) for k in ("beta", "t_max")}
        args |= {k: int(args[k]) for k in ("sign", "d", "N", "seeds", "seed0")}
        args["convention"] = check_convention(args["convention"])
        if args["threshold"] is not None:
            args["threshold"] = float(args["threshold"])
        return args

    @staticmethod
    def _key(args: dict[str, Any]) -> dict[str, Any]:
        key = {k: args[k] for k in ("beta", "sign", "d", "N", "seeds", "attention")}
        key |= {"A": _digest(args["A"]), "omega": _digest(args["omega"])}
        key |= {"activation": args["activation"], "t_max": args["t_max"], "dt": _DT}
        # the conventions differ only in descent with a perceptron
        if args["A"] is not None and args["sign"] < 0:
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
