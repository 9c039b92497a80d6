r"""The solver contract: problems say *what* moves, solvers *how* one step is taken, one driver *when*.

Every time-dependent computation in wflow is a :class:`~wflow.solvers.contract.Problem`, a
:class:`~wflow.solvers.contract.Solver` and one call of :func:`~wflow.solvers.driver.integrate`, the
only time loop of the package; the result is a :class:`~wflow.solvers.result.Result`.  Programs import
these names from here; the code lives in :mod:`~wflow.solvers.contract`, :mod:`~wflow.solvers.driver`,
:mod:`~wflow.solvers.control`, :mod:`~wflow.solvers.saveat`, :mod:`~wflow.solvers.result` and
:mod:`~wflow.solvers.trackers` (``docs/solvers.md`` says what each holds).
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
