r"""The solver contract: problems say *what* moves, solvers *how* one step is taken, one driver *when*.

Every time-dependent computation in wflow -- particles, Lagrangian nodes, finite volumes,
JKO steps -- is a :class:`Problem` (the state space and its right-hand side), a
:class:`Solver` (one step: ``init`` / ``step``, a declared ``order``, an error estimate
where it has one, a stability limit) and one call of :func:`integrate`, the only time
loop of the package.  The driver owns save times, step-size control, ``max_steps``,
detection of non-finite states, trackers (progress bar, callbacks, recorders) and
resume; the result is a :class:`Result` that turns into an :class:`xarray.Dataset`.

This module is where programs import these names from; the code lives in one module per job:

=====================================  ===========================================================
:mod:`~wflow.solvers.contract`         :class:`Problem`, :class:`StepResult`, :class:`Solver`,
                                       the registry :data:`SOLVERS` (:func:`register_solver`,
                                       :func:`get_solver`)
:mod:`~wflow.solvers.driver`           :func:`integrate` (the loop), :class:`ResumeState`,
                                       :func:`seed_entropy`, :func:`read_only`
:mod:`~wflow.solvers.control`          step-size controllers: fixed steps on a grid, adaptive
                                       steps (``init`` / ``propose`` / ``accept`` / ``advance``)
:mod:`~wflow.solvers.saveat`           save times (:class:`SaveAt`, :func:`check_save_at`) and
                                       the fixed-step grid they snap to
:mod:`~wflow.solvers.result`           the status codes (:class:`Status`), :class:`Result`, the
                                       kinds of results (:data:`KINDS`, :func:`register_kind`)
:mod:`~wflow.solvers.trackers`         :class:`Tracker`, :class:`Snapshot`, :class:`RunInfo` and
                                       the progress bar, callbacks and step logs
=====================================  ===========================================================

Step-size control
-----------------
*Fixed steps* (``dt`` given and the solver has no error estimate, or ``adaptive=False``):
steps of exactly ``dt`` on the grid :math:`t_k = t_0 + k\,dt`; the last step ends at
``t_end`` (it is stretched by at most :math:`10^{-6}dt` rather than followed by a
round-off step).  A save time is *snapped* to the nearest grid time and the result
records the grid time: ``dt`` is never changed to land on a save time.

*Adaptive steps* (a solver with an error estimate): the step is accepted when the
solver's scaled error norm is :math:`\le 1`, and the next step is
:math:`h\min(5, \max(0.2, 0.9\,\mathrm{err}^{-1/(q+1)}))` with :math:`q` the order of the
error estimate (Hairer, Nørsett & Wanner, *Solving ODEs I*, II.4).  The step is capped by
the solver's stability limit (e.g. the positivity CFL limit of a finite-volume scheme)
and lands exactly on each save time; a remainder below :math:`10^{-3}` of a step is
absorbed by stretching that step, so no step is shorter than the problem warrants.

Randomness
----------
The noise of step ``k`` is drawn from ``default_rng(SeedSequence(seed, spawn_key=(k,)))``,
so a run resumed after any saved snapshot repeats the uninterrupted run bit for bit.
"""

from __future__ import annotations

from .contract import SOLVERS, Problem, Solver, StepResult, Variable, get_solver, register_solver
from .control import MAX_REJECTIONS, AdaptiveSteps, ConstantSteps, StepSizeController
from .driver import ResumeState, integrate, read_only, seed_entropy
from .result import KINDS, Kind, Result, Status, register_kind
from .saveat import SaveAt, StepGrid, check_save_at
from .trackers import RunInfo, Snapshot, Tracker

__all__ = [
    "Problem",
    "Solver",
    "StepResult",
    "Snapshot",
    "Tracker",
    "Result",
    "SOLVERS",
    "register_solver",
    "get_solver",
    "integrate",
    "ResumeState",
    "check_save_at",
    "seed_entropy",
    # also importable from here, as before the split
    "Variable",
    "RunInfo",
    "Kind",
    "KINDS",
    "register_kind",
    "read_only",
    "MAX_REJECTIONS",
    # added with the split
    "Status",
    "SaveAt",
    "StepGrid",
    "StepSizeController",
    "ConstantSteps",
    "AdaptiveSteps",
]
