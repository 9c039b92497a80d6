r"""The driver: :func:`integrate`, the one time loop of wflow (the *when*).

The loop asks a step-size controller (:mod:`~wflow.solvers.control`) for each trial step and the
solver for the step, and saves at the times of a :class:`~wflow.solvers.saveat.SaveAt`; it owns
``max_steps``, the detection of non-finite states, the trackers and resume.  Import these names from
:mod:`wflow.solvers.base`.  The noise of step ``k`` is drawn from
``default_rng(SeedSequence(seed, spawn_key=(k,)))``, so a run resumed after any saved snapshot repeats
the uninterrupted run bit for bit.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._version import __version__
from ..errors import SolverError, check_int, short_repr
from .contract import Problem, Solver, StepResult, Variable, get_solver
from .control import StepSizeController, make_controller
from .result import Result, Status
from .saveat import SaveAt, SaveTimes
from .trackers import RunInfo, Snapshot, Tracker

__all__ = ["integrate", "ResumeState", "seed_entropy", "read_only"]

# the channel the driver logged on before it moved here from base.py (filters on it keep working)
log = logging.getLogger("wflow.solvers.base")


@dataclass
class ResumeState:
    """Where a resumed run starts: the index of the last saved snapshot, its state and the counters.

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.solvers.base import Problem, ResumeState, integrate
    >>> class Decay(Problem):
    ...     def rhs(self, t, y):
    ...         return -y
    >>> full = integrate(Decay(), "rk4", np.array([1.0]), 0.0, 1.0, dt=0.1)
    >>> state = ResumeState(index=5, t=0.5, y=full["state"][5], dt_next=0.1,
    ...                     stats={"steps": 5, "rejected": 0, "evaluations": 0})
    >>> rest = integrate(Decay(), "rk4", np.array([1.0]), 0.0, 1.0, dt=0.1, resume=state)
    >>> round(float(rest.times[0]), 12), bool((rest["state"][-1] == full["state"][-1]).all())  # bit for bit
    (0.6, True)
    """

    index: int
    t: float
    y: np.ndarray
    stats: dict[str, int]
    dt_next: float
    checkpoint: dict[str, np.ndarray] = field(default_factory=dict)


def seed_entropy(seed: Any) -> int:
    """A non-negative integer seed from ``None`` (fresh entropy), an int or a Generator.

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.solvers.base import seed_entropy
    >>> seed_entropy(7), isinstance(seed_entropy(np.random.default_rng(0)), int)
    (7, True)
    """
    if seed is None:
        entropy = np.random.SeedSequence().entropy
        assert isinstance(entropy, int)  # (fresh entropy: 128 random bits)
        return int(entropy % (2**63))
    if isinstance(seed, np.random.Generator):
        return int(seed.integers(2**63))
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) and seed >= 0:
        return int(seed)
    raise TypeError(
        f"seed must be None, a non-negative int or a numpy Generator, got {short_repr(seed)}"
    )


def read_only(y: Any) -> Any:
    """A read-only view of an array state (what trackers are shown), other states as they are."""
    if isinstance(y, np.ndarray):
        y = y.view()
        y.flags.writeable = False
    return y


def _finite(y: np.ndarray) -> bool:
    with np.errstate(invalid="ignore", over="ignore"):
        return math.isfinite(float(np.sum(y)))


def integrate(
    problem: Problem,
    solver: Solver | str,
    y0: np.ndarray,
    t0: float,
    t_end: float,
    *,
    save_at: Any = None,
    dt: float | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    adaptive: bool | None = None,
    max_steps: int = 10**7,
    seed: Any = None,
    trackers: Sequence[Tracker] = (),
    keep: bool = True,
    throw: bool = True,
    resume: ResumeState | None = None,
    config: dict[str, Any] | None = None,
    result_class: type[Result] = Result,
) -> Result:
    r"""Integrate ``problem`` from ``(t0, y0)`` to ``t_end`` with ``solver``: the one time loop of wflow.

    Parameters
    ----------
    problem : Problem
        The state space and its right-hand side.
    solver : Solver or str
        A :class:`Solver` or a name in :data:`SOLVERS`.
    y0 : ndarray
        Initial state.
    t0, t_end : float
        The interval, ``t_end > t0``.
    save_at : array_like or SaveAt, optional
        Save times in ``[t0, t_end]`` (``t0`` is always saved; default 11, on the grid with fixed
        steps), which steps land on, or a :class:`~wflow.solvers.saveat.SaveAt` (its ``points``,
        ``dtype`` and ``out`` apply to a problem whose snapshots hold points).
    dt : float, optional
        Fixed step, or the first trial step of an adaptive solver (default: Hairer's estimate).
    rtol, atol : float, optional
        Tolerances of adaptive solvers (default ``problem.default_tolerances()``).
    adaptive : bool, optional
        Error-controlled steps (default: whenever the solver has an error estimate);
        ``False`` with ``dt`` takes fixed steps with an adaptive solver.
    max_steps : int
        Attempted steps (accepted + rejected) before the run fails.
    seed : int or Generator, optional
        Seed of the noise of stochastic solvers (recorded in the configuration).
    trackers : sequence of Tracker
        Progress bars, callbacks, recorders (e.g. :class:`wflow.io.ZarrRecorder`).
    keep : bool
        Keep every snapshot in memory (default), or the last one only.
    throw : bool
        Raise :class:`~wflow.errors.SolverError` on failure (default), or return a result with
        ``status = -1``.
    resume : ResumeState, optional
        Continue a stored run from its last snapshot (see :func:`wflow.resume`).
    config : dict, optional
        Extra configuration recorded with the result (a front door's arguments).

    Returns
    -------
    Result
        ``result_class`` (a subclass of :class:`Result` for the problem's kind).

    Raises
    ------
    ValueError
        Bad arguments (named in the message), before anything is written.
    SolverError
        With ``throw=True``: non-finite state, step size underflow, ``max_steps`` exceeded or a step
        that missed its own tolerance (snapshots given to trackers are kept).

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.solvers.base import Problem, integrate
    >>> class Decay(Problem):  # y' = -y
    ...     def rhs(self, t, y):
    ...         return -y
    >>> res = integrate(Decay(), "dopri5", np.array([1.0]), 0.0, 1.0, rtol=1e-10, atol=1e-12)
    >>> res.status, len(res), bool(abs(res["state"][-1, 0] - np.exp(-1.0)) < 1e-9)
    (0, 11, True)
    """
    if not isinstance(problem, Problem):
        raise TypeError(f"problem must be a wflow Problem, got {short_repr(problem)}")
    solver = get_solver(solver)
    t0, t_end = _check_interval(t0, t_end)
    max_steps = check_int(max_steps, "max_steps")
    _check_noise(problem, solver)
    control = make_controller(problem, solver, t0, t_end, dt, rtol, atol, adaptive)
    spec = SaveAt.of(save_at)
    saves = SaveTimes.make(spec.ts, t0, t_end, control.grid)
    _check_points_spec(problem, spec, len(saves.times), y0)
    entropy = seed_entropy(seed) if solver.stochastic else None
    cfg = _run_config(problem, solver, control, saves, config, entropy, t0, t_end, max_steps)

    # ---- state at the first saved time of this call
    if resume is None:
        first = 0
        t, y = t0, np.array(y0, copy=True)
        stats = {"steps": 0, "rejected": 0, "evaluations": 0}
        state = solver.init(problem, t, y)
        h = control.dt
    else:
        first = int(resume.index)
        t, y = float(resume.t), np.array(resume.y, copy=True)
        stats = dict(resume.stats)
        state = solver.restore(problem, t, y, resume.checkpoint)
        h = resume.dt_next if resume.dt_next > 0 else control.dt
    ev0 = problem.evaluations  # work before this point (solver.init) is not counted
    control.init(problem, solver, saves, t, y, h)

    static = problem.static()
    started: list = []
    try:
        run = RunInfo(problem, solver, cfg, static, saves.times, t0, t_end, first)
        for tr in trackers:
            tr.start(run)
            started.append(tr)
        saved = _Saved(problem, solver, control, trackers, keep, spec, capacity=len(saves.times))
        try:
            status, message = _loop(
                saved,
                saves,
                t,
                y,
                state,
                stats,
                ev0,
                first=first,
                fresh=resume is None,
                max_steps=max_steps,
                entropy=entropy,
            )
        except SolverError as exc:
            if throw:
                raise
            status, message = int(Status.FAILED), str(exc)
        result = saved.result(result_class, cfg, static, status, message)
        for tr in trackers:
            tr.finish(result)
        log.debug("integrate: %s", result)
        return result
    finally:
        # trackers release what they hold (a recorder's lock) whatever ended the run, an interrupt included
        for tr in started:
            close = getattr(tr, "close", None)
            if close is not None:
                close()


def _loop(
    saved: _Saved,
    saves: SaveTimes,
    t: float,
    y: np.ndarray,
    state: Any,
    stats: dict[str, int],
    ev0: int,
    *,
    first: int,
    fresh: bool,
    max_steps: int,
    entropy: int | None,
) -> tuple[int, str]:
    """Step from ``(t, y)`` through the save times after ``first``: ``(status, message)``; a
    :class:`~wflow.errors.SolverError` when the run fails (what was saved is kept)."""
    problem, solver, control, trackers = saved.problem, saved.solver, saved.control, saved.trackers
    times = saves.times
    n_saves = len(times)
    stats_base_ev = stats["evaluations"]

    def save(index: int, t: float, y: np.ndarray, state: Any, known: Any = None) -> bool:
        stats["evaluations"] = stats_base_ev + problem.evaluations - ev0
        return saved.save(index, t, y, state, stats, known)

    stopped_by = None
    if fresh and save(0, t, y, state):
        stopped_by = "a tracker"
    k_save = first + 1
    step_no = stats["steps"]
    while stopped_by is None and k_save < n_saves:
        target = float(times[k_save])
        # ---- one attempted step
        _check_budget(stats, max_steps, t)
        h_try, land, stop = control.propose(problem, solver, t, y, state, step_no, k_save)
        if h_try is None:  # the previous step ended within rounding of the stop: it is the stop
            t = stop
            if stop == target:
                if save(k_save, t, y, state):
                    stopped_by = "a tracker"
                k_save += 1
            continue
        at_save = land and stop == target
        attempt = _attempt(problem, solver, control, t, y, state, h_try, at_save, step_no, entropy)
        stats["evaluations"] = stats_base_ev + problem.evaluations - ev0
        if attempt is None:
            stats["rejected"] += 1
            continue
        res, new_state = attempt
        # ---- the step is kept
        y = res.y
        state = new_state
        stats["steps"] += 1
        step_no += 1
        t = control.advance(t, h_try, land, stop, step_no)
        if res.info:
            saved.step_info.append({"step": step_no, "t": t, "dt": h_try, **res.info})
        stopped_by = stopped_by or _shown_step(trackers, t, h_try, res)
        if res.failure is not None:
            if at_save:
                save(k_save, t, y, state, res.diagnostics)
            raise SolverError(f"{res.failure} (step {step_no}, t={t:.6g})")
        if at_save:
            if save(k_save, t, y, state, res.diagnostics):
                stopped_by = stopped_by or "a tracker"
            k_save += 1
        elif stopped_by is not None:
            save(k_save, t, y, state)
    if stopped_by is not None and k_save < n_saves:
        return int(Status.STOPPED), Status.stopped(stopped_by, t)
    return int(Status.SUCCESS), Status.SUCCESS.message


def _check_budget(stats: dict[str, int], max_steps: int, t: float) -> None:
    if stats["steps"] + stats["rejected"] >= max_steps:
        raise SolverError(
            f"max_steps={max_steps} exceeded at t={t:.6g}; raise max_steps or the step size"
        )


def _attempt(
    problem: Problem,
    solver: Solver,
    control: StepSizeController,
    t: float,
    y: np.ndarray,
    state: Any,
    h: float,
    at_save: bool,
    step_no: int,
    entropy: int | None,
) -> tuple[StepResult, Any] | None:
    """One attempted step of size ``h`` from ``(t, y)``: the solver's result and new state, or ``None`` when
    the solver or the controller rejects it; a :class:`~wflow.errors.SolverError` for a non-finite state."""
    rng = None
    if solver.stochastic:
        rng = np.random.default_rng(np.random.SeedSequence(entropy, spawn_key=(step_no,)))
    # a solver that forms the saved state's diagnostics on its way is told when the step ends on a save
    kw = {"save": at_save} if solver.forms_diagnostics else {}
    rtol, atol = control.rtol or 0.0, control.atol or 0.0
    # every stage of the step sees the piece (layer) of the model the step lies in: a step that ends on a
    # layer boundary does not evaluate its last stage with the next layer
    with problem.stepping(t, h):
        res, new_state = solver.step(problem, t, y, h, state, rtol=rtol, atol=atol, rng=rng, **kw)
    if not res.ok:
        control.unstable(t, h, res.limit)
        return None
    if not control.accept(h, res.error):
        return None
    if not (res.finite if res.finite is not None else _finite(res.y)):
        raise SolverError(
            f"the state became non-finite in the step from t={t:.6g} with dt={h:.3g} "
            f"({solver.name}); snapshots written so far are kept. Reduce dt (or rtol), or "
            f"check the model's parameters (e.g. USA at large beta overflows: use the "
            f"rescaled kernel or SA)"
        )
    return res, new_state


def _shown_step(trackers: Sequence[Tracker], t: float, h: float, res: StepResult) -> str | None:
    """Show every tracker the kept step; the name of the first that asks to stop, if one does."""
    stopped_by: str | None = None
    for tr in trackers:
        if tr.step(t, h, res) and stopped_by is None:
            stopped_by = str(getattr(tr, "name", "a tracker"))
    return stopped_by


#: kept variables of at least this many bytes a snapshot go into one array for every save (smaller ones
#: are stacked at the end)
_BUFFER_BYTES = 1 << 16


class _Saved:
    """The snapshots a run keeps in memory and shows its trackers: the last one only (``keep=False``), or
    as the :class:`~wflow.solvers.saveat.SaveAt` says."""

    def __init__(
        self,
        problem: Problem,
        solver: Solver,
        control: StepSizeController,
        trackers: Sequence[Tracker],
        keep: bool,
        spec: SaveAt,
        capacity: int = 0,
    ) -> None:
        self.problem, self.solver, self.control = problem, solver, control
        self.trackers, self.keep, self.spec, self.capacity = trackers, keep, spec, capacity
        self.times: list[float] = []
        self.kept: list[dict[str, Variable]] = []
        #: the state variables of the last save, when the spec keeps them for the last save only
        self.last_state: dict[str, Variable] = {}
        # name -> array of shape (capacity, ...): the large kept variables, written in place
        self.buffers: dict[str, np.ndarray] = {}
        if spec.out is not None:
            self.buffers["points"] = spec.out
        self.stats: dict[str, list] = {
            k: [] for k in ("steps", "rejected", "evaluations", "dt_next")
        }
        self.step_info: list[dict[str, Any]] = []
        self.last: Snapshot | None = None

    def save(
        self,
        index: int,
        t: float,
        y: np.ndarray,
        state: Any,
        stats: dict[str, int],
        known: dict[str, np.ndarray] | None = None,
    ) -> bool:
        """Save snapshot ``index`` at ``(t, y)``; ``known``: the diagnostics of ``y`` the step formed.  True when
        a tracker asks to stop."""
        problem = self.problem
        extra: dict[str, Any] = {} if known is None else {"known": known}
        ev = problem.evaluations
        data = problem.snapshot(t, y, **extra)
        # a save's diagnostics are not counted: a resumed run, which loads the snapshot, counts the same
        problem.evaluations = ev
        snap = Snapshot(
            index,
            t,
            data,
            dict(stats),
            {"dt_next": self.control.dt_next},
            self.solver.checkpoint(state),
            read_only(y),
        )
        kept_stats = self.stats
        if self.keep or not self.kept:
            self.times.append(t)
            self.kept.append(self._keep(snap.data) if self.keep else snap.data)
            for k in ("steps", "rejected", "evaluations"):
                kept_stats[k].append(stats[k])
            kept_stats["dt_next"].append(snap.control["dt_next"])
        else:
            self.times[-1] = t
            self.kept[-1] = snap.data
            for k in ("steps", "rejected", "evaluations"):
                kept_stats[k][-1] = stats[k]
            kept_stats["dt_next"][-1] = snap.control["dt_next"]
        self.last = snap
        stop = False
        for tr in self.trackers:
            stop = bool(tr.save(snap)) or stop
        return stop

    def _keep(self, data: dict[str, Variable]) -> dict[str, Variable]:
        """What is kept of a snapshot's ``data``: large arrays as rows of their buffers, the points as the spec
        asks; a variable whose shape or dtype changes between saves goes back to stacking."""
        spec, k = self.spec, len(self.kept)
        out = dict(data)
        if not spec.points:
            state = self.problem.state_variables
            self.last_state = {name: v for name, v in data.items() if name in state}
            out = {name: v for name, v in data.items() if name not in state}
        elif spec.out is not None or spec.dtype is not None:
            dims, points = self.problem.saved_points(data)
            buf = self.buffers.get("points")
            if buf is None:
                buf = self.buffers["points"] = _buffer(
                    "points", self.capacity, points.shape, spec.dtype
                )
            buf[k] = points
            out["points"] = (dims, read_only(buf[k]))
            return out
        for name, (dims, value) in out.items():
            arr = np.asarray(value)
            buf = self.buffers.get(name)
            if buf is None and k == 0 and arr.nbytes >= _BUFFER_BYTES and k < self.capacity:
                buf = self.buffers[name] = _buffer(name, self.capacity, arr.shape, arr.dtype)
            if buf is None:
                continue
            if k < len(buf) and arr.shape == buf.shape[1:] and arr.dtype == buf.dtype:
                buf[k] = arr
                out[name] = (dims, read_only(buf[k]))
            else:  # unlike the earlier saves: the rows kept so far become separate arrays again
                del self.buffers[name]
                for j, snap in enumerate(self.kept):
                    snap[name] = (snap[name][0], np.array(buf[j]))
        return out

    def result(
        self,
        cls: type[Result],
        cfg: dict[str, Any],
        static: dict[str, Variable],
        status: int,
        message: str,
    ) -> Result:
        """The run's result: the kept snapshots stacked along time."""
        problem, solver = self.problem, self.solver
        data: dict[str, Variable] = {}
        if self.kept:
            n = len(self.kept)
            for name, (dims, _) in self.kept[0].items():
                buf = self.buffers.get(name)
                if buf is not None and n == len(buf) and buf is self.spec.out:
                    data[name] = (dims, buf)  # the caller's own array, whole
                elif buf is not None:
                    data[name] = (dims, buf[:n])
                else:
                    data[name] = (dims, np.stack([np.asarray(s[name][1]) for s in self.kept]))
        stats = {
            k: np.asarray(v, dtype=np.float64 if k == "dt_next" else np.int64)
            for k, v in self.stats.items()
        }
        return cls(
            kind=problem.kind,
            times=np.asarray(self.times, dtype=np.float64),
            data=data,
            static=static,
            stats=stats,
            status=status,
            message=message,
            config=cfg,
            solver=solver.name,
            order=solver.order,
            checkpoint=self.last.checkpoint if self.last is not None else {},
            step_info=self.step_info,
            last_state=self.last_state,
        )


def _buffer(name: str, capacity: int, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An empty array for ``capacity`` saves of a variable, or a ``MemoryError`` that says what to do."""
    try:
        return np.empty((capacity, *shape), dtype)
    except (MemoryError, ValueError):
        need = capacity * math.prod(shape) * np.dtype(dtype).itemsize
        raise MemoryError(
            f"keeping {capacity} saves of {name!r} (shape {shape}, {np.dtype(dtype)}) needs "
            f"{need / 2**30:.3g} GiB, more than this machine can allocate: keep the points of the last "
            f"save only (save_at=wflow.SaveAt(ts, points=False)) with a recorder (wflow.io.ZarrRecorder) "
            f"in trackers to hold the saves on disk, or save fewer times"
        ) from None


def _check_points_spec(problem: Problem, spec: SaveAt, n_saves: int, y0: np.ndarray) -> None:
    """Raise before any step when ``spec`` asks of the points what this run cannot give."""
    if spec.out is None and spec.dtype is None:
        return
    shape = problem.points_shape(y0)
    if shape is None:
        raise ValueError(
            f"SaveAt: dtype= and out= apply to runs whose snapshots hold points on the sphere; this "
            f"{problem.kind} problem ({type(problem).__name__}) holds none"
        )
    spec.check_out(n_saves, shape)


def _check_interval(t0: Any, t_end: Any) -> tuple[float, float]:
    t0 = float(t0)
    if isinstance(t_end, bool) or not isinstance(t_end, (int, float, np.integer, np.floating)):
        raise TypeError(f"t_end must be a number, got {short_repr(t_end)}")
    t_end = float(t_end)
    if not math.isfinite(t0):
        raise ValueError(f"t0 must be finite, got {t0!r}")
    if not math.isfinite(t_end) or t_end <= t0:
        raise ValueError(f"t_end must be a finite time > t0 = {t0:g}, got {t_end!r}")
    return t0, t_end


def _check_noise(problem: Problem, solver: Solver) -> None:
    if solver.stochastic != problem.stochastic:
        if solver.stochastic:
            raise ValueError(
                f"solver {solver.name!r} is for noisy problems; this {problem.kind} problem has no "
                f"noise (give kappa, or choose a deterministic solver)"
            )
        raise ValueError(
            f"this {problem.kind} problem has noise; solver {solver.name!r} is deterministic "
            f"(use 'euler-maruyama')"
        )


def _run_config(
    problem: Problem,
    solver: Solver,
    control: StepSizeController,
    saves: SaveTimes,
    config: dict[str, Any] | None,
    entropy: int | None,
    t0: float,
    t_end: float,
    max_steps: int,
) -> dict[str, Any]:
    """Everything needed to repeat the run (recorded with the result and in its store)."""
    cfg = dict(problem.config())
    cfg.update(config or {})
    cfg.update(
        {
            "solver": solver.name,
            "solver_options": solver.options(),
            "order": solver.order,
            "adaptive": bool(control.adaptive),
            "dt": control.dt,
            "rtol": control.rtol,
            "atol": control.atol,
            "seed": entropy,
            "t0": t0,
            "t_end": t_end,
            "save_at": [float(s) for s in saves.times],
            "save_mode": saves.mode,
            "max_steps": max_steps,
            "wflow_version": __version__,
        }
    )
    return cfg
