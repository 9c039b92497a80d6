r"""The solver contract: problems say *what* moves, solvers *how* one step is taken, one driver *when*.

Every time-dependent computation in wflow -- particles, Lagrangian nodes, finite volumes,
JKO steps -- is a :class:`~wflow.solvers.contract.Problem` (the state space and its
right-hand side), a :class:`~wflow.solvers.contract.Solver` (one step: ``init`` / ``step``,
a declared ``order``, an error estimate where it has one, a stability limit) and one call of
:func:`~wflow.solvers.driver.integrate`, the only time loop of the package.  The driver owns
save times, step-size control, ``max_steps``, detection of non-finite states, trackers
(progress bar, callbacks, recorders) and resume; the result is a
:class:`~wflow.solvers.result.Result` that turns into an :class:`xarray.Dataset`.

This module is where programs import these names from; the code lives in one module per job:

* :mod:`~wflow.solvers.contract`: :class:`~wflow.solvers.contract.Problem`,
  :class:`~wflow.solvers.contract.StepResult`, :class:`~wflow.solvers.contract.Solver` and the
  registry :data:`~wflow.solvers.contract.SOLVERS` (:func:`~wflow.solvers.contract.register_solver`,
  :func:`~wflow.solvers.contract.get_solver`);
* :mod:`~wflow.solvers.driver`: :func:`~wflow.solvers.driver.integrate` (the loop),
  :class:`~wflow.solvers.driver.ResumeState`, :func:`~wflow.solvers.driver.seed_entropy`,
  :func:`~wflow.solvers.driver.read_only`;
* :mod:`~wflow.solvers.control`: the step-size controllers (fixed steps on a grid, adaptive
  steps), each with ``init`` / ``propose`` / ``accept`` / ``unstable`` / ``advance``;
* :mod:`~wflow.solvers.saveat`: the save times (:class:`~wflow.solvers.saveat.SaveAt`,
  :func:`~wflow.solvers.saveat.check_save_at`) and the fixed-step grid they snap to;
* :mod:`~wflow.solvers.result`: the status codes (:class:`~wflow.solvers.result.Status`),
  :class:`~wflow.solvers.result.Result` and the kinds of results
  (:data:`~wflow.solvers.result.KINDS`, :func:`~wflow.solvers.result.register_kind`);
* :mod:`~wflow.solvers.trackers`: :class:`~wflow.solvers.trackers.Tracker`,
  :class:`~wflow.solvers.trackers.Snapshot`, :class:`~wflow.solvers.trackers.RunInfo` and the
  progress bar, callbacks and step logs.

Step-size control (fixed steps on the grid :math:`t_0 + k\,dt`, split to land on save times;
adaptive steps of Hairer, Nørsett & Wanner, II.4, capped by the solver's stability limit) is
described in ``docs/solvers.md``.  The noise of step ``k`` is drawn from
``default_rng(SeedSequence(seed, spawn_key=(k,)))``, so a run resumed after any saved snapshot
repeats the uninterrupted run bit for bit.
"""

from __future__ import annotations

# Re-exports (``name as name``, without an ``__all__``: the names are documented where they live).
from .contract import SOLVERS as SOLVERS
from .contract import Problem as Problem
from .contract import Solver as Solver
from .contract import StepResult as StepResult
from .contract import Variable as Variable
from .contract import get_solver as get_solver
from .contract import register_solver as register_solver
from .control import MAX_REJECTIONS as MAX_REJECTIONS
from .control import AdaptiveSteps as AdaptiveSteps
from .control import ConstantSteps as ConstantSteps
from .control import StepSizeController as StepSizeController
from .driver import ResumeState as ResumeState
from .driver import integrate as integrate
from .driver import read_only as read_only
from .driver import seed_entropy as seed_entropy
from .result import KINDS as KINDS
from .result import Kind as Kind
from .result import Result as Result
from .result import Status as Status
from .result import register_kind as register_kind
from .saveat import SaveAt as SaveAt
from .saveat import StepGrid as StepGrid
from .saveat import check_save_at as check_save_at
from .trackers import RunInfo as RunInfo
from .trackers import Snapshot as Snapshot
from .trackers import Tracker as Tracker
