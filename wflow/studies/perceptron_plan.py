r"""The perceptron study's configurations: its sizes in quick and full mode and every run it makes.

:func:`study_plan` lists the runs of ``wflow validate perceptron`` (:mod:`wflow.studies.perceptron`)
as ``((beta, sign), keywords)`` of :class:`~wflow.studies.perceptron_runs.Runs`; the functions
``*_call`` give one experiment's keywords, the same for the study's prefetch and for its reading.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..perceptron_paper import BETAS, CONVENTIONS, check_convention, paper_perceptron
from .perceptron_checks import CONVENTION_DRAW, COUNT_BETAS, E4_DIMS, e4_threshold

__all__ = [
    "study_plan",
    "weights_call",
    "e1_call",
    "e23_call",
    "e4_call",
    "e5_call",
    "c9_call",
    "count_call",
    "sweep_grid",
    "sweep_call",
    "convention_call",
]


def study_plan(quick: bool, convention: str = "code") -> dict[str, Any]:
    """The study's parameters and, under ``"calls"``, every run it makes as ``((beta, sign), keywords)``
    (for :meth:`~wflow.studies.perceptron_runs.Runs.prefetch`), each once.

    Examples
    --------
    >>> plan = study_plan(quick=True)
    >>> plan["betas"], plan["N"], len(plan["calls"])
    ((0.1, 1.0, 5.0, 25.0), 128, 131)
    """
    conv = check_convention(convention)
    betas = (0.1, 1.0, 5.0, 25.0) if quick else BETAS
    plan: dict[str, Any] = {
        "convention": conv,
        "betas": betas,
        "seeds": 4 if quick else 10,
        "N": 128 if quick else 512,
        "t_max": 100.0 if quick else 1000.0,
        "betas_few": (1.0, 25.0) if quick else BETAS,
        "dims": (2, 5) if quick else E4_DIMS,
        "N4": 200 if quick else 1000,
        "betas4": (0.5, 1.0, 7.0, 25.0) if quick else BETAS,
        "t_max4": 300.0 if quick else 1000.0,
        "A2": paper_perceptron(2, 1.0, seed=1),
        "A3": paper_perceptron(3, 1.0, seed=3),
        "a1": (np.array([[0.0, 0.0, 1.0]]), np.array([1.0])),
        # the cluster counts over weight draws (COUNT_RULES)
        "draws": 10,
        "count_betas": COUNT_BETAS,
        "Nc": 64 if quick else 256,
        "t_maxc": 300.0 if quick else 1000.0,
        # the MLP-scale sweep and the convention check: one fixed draw, |omega| = 1 before scaling
        "scales": (0.25, 1.0, 4.0, 16.0) if quick else (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0),
        "sweep_signs": (1,) if quick else (1, -1),
        "sweep_beta": 5.0,
    }
    plan["A4"] = {d: paper_perceptron(d, 1.0, seed=2) for d in plan["dims"]}
    plan["draws_w"] = {
        act: [paper_perceptron(2, 1.0, seed=100 + k) for k in range(plan["draws"])]
        for act in ("relu", "gelu")
    }
    A6, om6 = paper_perceptron(2, 1.0, seed=CONVENTION_DRAW)
    plan["A6"] = (A6, om6 / np.linalg.norm(om6))
    calls = [((b, s), e1_call(plan)) for s in (1, -1) for b in betas]
    calls += [
        ((b, s), e23_call(plan, act, conv))
        for act in ("relu", "gelu")
        for s in (1, -1)
        for b in plan["betas_few"]
    ]
    calls += [((b, -1), e4_call(plan, d, b, conv)) for d in plan["dims"] for b in plan["betas4"]]
    calls += [
        ((b, s), e5_call(plan, att, p, conv))
        for att in ("USA", "SA")
        for s in (1, -1)
        for p in (False, True)
        for b in plan["betas_few"]
    ]
    calls += [((5.0, -1), c9_call(plan, conv))]
    calls += [
        ((b, s), count_call(plan, act, k, conv))
        for act in ("relu", "gelu")
        for s in (1, -1)
        for b in plan["count_betas"]
        for k in range(plan["draws"])
    ]
    calls += [
        ((plan["sweep_beta"], s), sweep_call(plan, att, sc, conv))
        for att, s, sc in sweep_grid(plan)
    ]
    calls += [((5.0, -1), convention_call(plan, c)) for c in CONVENTIONS]
    plan["calls"] = calls
    return plan


def weights_call(
    weights: tuple, conv: str, *, d: int, N: int, seeds: int, t_max: float, **extra: Any
) -> dict[str, Any]:
    """Keywords of one :meth:`Runs.__call__` at fixed perceptron ``weights = (A, omega)`` (or ``(None, None)``)."""
    A, om = weights
    return dict(d=d, N=N, seeds=seeds, A=A, omega=om, t_max=t_max, convention=conv, **extra)


def e23_call(plan: dict[str, Any], act: str, conv: str) -> dict[str, Any]:
    """E2/E3: the fixed ReLU/GELU weights ``plan["A2"]`` on S^1, ``plan["seeds"]`` particle seeds."""
    n, seeds, t_max = plan["N"], plan["seeds"], plan["t_max"]
    return weights_call(plan["A2"], conv, d=2, N=n, seeds=seeds, t_max=t_max, activation=act)


def e4_call(plan: dict[str, Any], d: int, beta: float, conv: str) -> dict[str, Any]:
    """E4: descent + GELU in dimension ``d``, threshold :func:`~.perceptron_checks.e4_threshold`."""
    n, t_max, threshold = plan["N4"], plan["t_max4"], e4_threshold(beta)
    return weights_call(
        plan["A4"][d], conv, d=d, N=n, seeds=1, t_max=t_max, activation="gelu", threshold=threshold
    )


def e5_call(plan: dict[str, Any], attention: str, with_p: bool, conv: str) -> dict[str, Any]:
    """E5: S^2, ``attention`` alone or with the GELU weights ``plan["A3"]``, two particle seeds."""
    w = plan["A3"] if with_p else (None, None)
    return weights_call(
        w, conv, d=3, N=plan["N"], seeds=2, t_max=plan["t_max"], attention=attention
    )


def count_call(plan: dict[str, Any], act: str, k: int, conv: str) -> dict[str, Any]:
    """The cluster counts: weight draw ``k`` of activation ``act`` on S^1."""
    w, n, t_max = plan["draws_w"][act][k], plan["Nc"], plan["t_maxc"]
    return weights_call(w, conv, d=2, N=n, seeds=1, t_max=t_max, activation=act)


def sweep_grid(plan: dict[str, Any]) -> list[tuple[str, int, float]]:
    """The MLP-scale sweep's ``(attention, sign, |omega|)``, in the order the study runs them."""
    return [
        (att, s, sc) for att in ("USA", "SA") for s in plan["sweep_signs"] for sc in plan["scales"]
    ]


def sweep_call(plan: dict[str, Any], att: str, scale: float, conv: str) -> dict[str, Any]:
    """The MLP-scale sweep: the draw ``plan["A6"]`` with ``|omega| = scale``, GELU on S^1."""
    A, om = plan["A6"]
    n = plan["Nc"]
    return weights_call(
        (A, scale * om), conv, d=2, N=n, seeds=1, t_max=1000.0, attention=att, activation="gelu"
    )


def convention_call(plan: dict[str, Any], conv: str) -> dict[str, Any]:
    """The conventions check: the draw :data:`~.perceptron_checks.CONVENTION_DRAW` in convention ``conv``."""
    w = paper_perceptron(2, 1.0, seed=CONVENTION_DRAW)
    return weights_call(w, conv, d=2, N=128, seeds=2, t_max=300.0, activation="gelu")


def e1_call(plan: dict[str, Any]) -> dict[str, Any]:
    """E1: attention alone on S^1, ``plan["seeds"]`` particle seeds."""
    return dict(d=2, N=plan["N"], seeds=plan["seeds"], t_max=plan["t_max"])


def c9_call(plan: dict[str, Any], conv: str) -> dict[str, Any]:
    """C9: one GELU neuron ``plan["a1"]`` on S^2, descent, one system of ``4 N`` particles."""
    return weights_call(
        plan["a1"], conv, d=3, N=4 * plan["N"], seeds=1, t_max=plan["t_max"], activation="gelu"
    )
