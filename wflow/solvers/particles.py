r"""Particle solver: the finite-N system :math:`\dot x_i = v[\mu_N](x_i)`, :math:`\mu_N = \sum_j w_j\delta_{x_j}`.

:func:`simulate` is the front door: it builds the problem and calls the one driver,
:func:`wflow.solvers.base.integrate`, and returns a :class:`Trajectory`.  The problems
(:class:`ParticleProblem`, :class:`SpanProblem` of :mod:`wflow.solvers.particle_problem`,
:class:`CircleAngleProblem`, :class:`CircleGapProblem` of :mod:`wflow.solvers.circle_problems`) are
importable from here.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from ..errors import check_positive, did_you_mean, short_repr
from ..measure import Atoms, as_atoms
from ..models import Model
from .base import Result, Tracker, check_save_at, get_solver, integrate, read_only, register_kind
from .circle_problems import CircleAngleProblem, CircleGapProblem
from .control import StepControl
from .fused import FusedEuler
from .particle_problem import DIAGNOSTICS, ParticleProblem, SpanProblem
from .saveat import SaveAt
from .trackers import Callback, ProgressBar

__all__ = [
    "span_is_exact",
    "simulate",
    "Trajectory",
    "ParticleProblem",
    "CircleAngleProblem",
    "CircleGapProblem",
    "SpanProblem",
    "default_dt",
    "default_method",
    "DIAGNOSTICS",
    "SavedPoints",
]


class Trajectory(Result):
    """Result of :func:`simulate` (a :class:`~wflow.solvers.base.Result` of kind ``particles``).

    Attributes
    ----------
    times : ndarray, shape (k,)
    points : ndarray, shape (k, ..., n, d)
        Positions at the save times.
    weights : ndarray, shape (..., n)
    diagnostics : dict of ndarray, each shape (k, ...)
        ``energy`` and ``log_energy`` (gradient models), ``order_parameter``
        :math:`|\\sum_i w_i x_i|`, ``n_eff`` the effective number of clusters at ``config["n_eff_beta"]``
        (:func:`wflow.diagnostics.effective_clusters`), ``n_clusters`` at ``config["cluster_threshold"]``.
    tracers : ndarray, shape (k, ..., m, d) or None
    stats, config, status, message
        As for every :class:`~wflow.solvers.base.Result`.

    Examples
    --------
    >>> import numpy as np, wflow
    >>> traj = wflow.simulate(wflow.USA(2.0), wflow.sphere.uniform(16, 3, seed=0), 1.0, dt=0.1, backend="numpy")
    >>> traj.points.shape, traj.weights.shape, traj.tracers
    ((11, 16, 3), (16,), None)
    >>> sorted(traj.diagnostics)
    ['energy', 'log_energy', 'n_clusters', 'n_eff', 'order_parameter']
    >>> bool(np.all(np.diff(traj.diagnostics["energy"]) > 0))  # USA ascends its energy
    True
    """

    #: the points of a run in span coordinates, formed on demand (:class:`SavedPoints`)
    _span_points: SavedPoints | None = None

    @property
    def points(self) -> np.ndarray | SavedPoints:
        """Positions on the sphere (the directions, for a scheme with radii), shape ``(k, ..., n, d)``; a
        :class:`SavedPoints` for a run in span coordinates."""
        if "points" in self.data:
            return self.data["points"][1]
        if "span" in self.data:
            if self._span_points is None:
                self._span_points = SavedPoints(self.data["span"][1], self.static["span_basis"][1])
            return self._span_points
        if "positions" in self.data:
            x = self.data["positions"][1]
            return x / np.linalg.norm(x, axis=-1, keepdims=True)
        raise ValueError(
            "this run kept the points of its last save only (SaveAt(points=False)): use traj.final, "
            "or save_at=wflow.SaveAt(ts, points=True) to keep every save's points"
        )

    @property
    def positions(self) -> np.ndarray | SavedPoints:
        """The tokens :math:`x = r\theta` (free space) or the points (sphere), shape ``(k, ..., n, d)``."""
        return self.data["positions"][1] if "positions" in self.data else self.points

    @property
    def radii(self) -> np.ndarray:
        """Token radii :math:`r_i`, shape ``(k, ..., n)`` (all 1 on the sphere)."""
        if "radii" in self.data:
            return self.data["radii"][1]
        return np.ones(self.points.shape[:-1])

    @property
    def weights(self) -> np.ndarray:
        return self.static["weights"][1]

    @property
    def tracers(self) -> np.ndarray | None:
        return self.data["tracers"][1] if "tracers" in self.data else None

    @property
    def diagnostics(self) -> dict[str, np.ndarray]:
        return {k: v for k, (_, v) in self.data.items() if k not in ParticleProblem.state_variables}

    @property
    def energy(self) -> np.ndarray | None:
        """The ascended energy per save; None when not recorded (the model is not a gradient flow)."""
        return self.data["energy"][1] if "energy" in self.data else None

    @property
    def dt_next(self) -> np.ndarray:
        return self.stats["dt_next"]

    def points_at(self, i: int = -1) -> np.ndarray:
        """The points of save index ``i``, shape ``(..., n, d)`` (with ``SaveAt(points=False)``, the last)."""
        if self.last_state and not any(k in self.data for k in ("points", "span", "positions")):
            if i not in (-1, len(self) - 1):
                raise ValueError(
                    f"this run kept the points of its last save only (SaveAt(points=False)), not of "
                    f"save {i}; keep them all with save_at=wflow.SaveAt(ts, points=True)"
                )
            last = self.last_state
            if "span" in last:
                return np.matmul(last["span"][1], self.static["span_basis"][1])
            if "positions" in last:
                x = last["positions"][1]
                return x / np.linalg.norm(x, axis=-1, keepdims=True)
            return last["points"][1]
        return np.asarray(self.points[i])

    def atoms(self, i: int = -1) -> Atoms:
        """The measure at save index ``i``."""
        return Atoms._trusted(self.points_at(i), self.weights)

    @property
    def final(self) -> Atoms:
        return self.atoms(-1)

    def to_dataset(self) -> Any:
        """This result as an :class:`xarray.Dataset`; a run in span coordinates also gets ``points`` as a
        lazy (dask) variable, formed only where it is read."""
        ds = super().to_dataset()
        if "span" in self.data and "points" not in ds:
            import dask.array as da

            pts = self.points
            chunks = (1,) + pts.shape[1:]
            dims = ("time",) + self.data["span"][0][:-1] + ("coord",)
            ds["points"] = (dims, da.from_array(pts, chunks=chunks, asarray=False))
        return ds


class SavedPoints:
    r"""The points :math:`x = yU` of every save of a run in span coordinates, formed where an index asks.

    A read-only array of shape ``(k, ..., n, d)``: save indices first (``points[-1]``, ``points[::10]``)
    form only those saves, each once; anything else, and ``np.asarray(points)``, the whole array once.

    Examples
    --------
    >>> import numpy as np, wflow
    >>> x0 = wflow.sphere.uniform(4, 16, seed=0, batch=(3,))
    >>> traj = wflow.simulate(wflow.SA(2.0), x0, 1.0, dt=0.1)
    >>> type(traj.points).__name__, traj.points.shape, traj.points[-1].shape
    ('SavedPoints', (11, 3, 4, 16), (3, 4, 16))
    >>> bool(np.allclose(np.asarray(traj.points)[0], x0))
    True
    """

    def __init__(self, span: np.ndarray, basis: np.ndarray) -> None:
        self._span, self._basis = span, basis
        self._rows: dict[int, np.ndarray] = {}
        self._whole: np.ndarray | None = None
        self.shape: tuple[int, ...] = tuple(span.shape[:-1]) + (basis.shape[-1],)
        self.dtype = np.result_type(span.dtype, basis.dtype)
        self.ndim = len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return (
            f"SavedPoints(shape={self.shape}, dtype={self.dtype}, formed={len(self._rows)} saves)"
        )

    def _row(self, i: int) -> np.ndarray:
        i = range(len(self))[i]  # (negative indices, and an IndexError past the end)
        row = self._rows.get(i)
        if row is None:
            row = self._rows[i] = read_only(np.matmul(self._span[i], self._basis))
        return row

    def __getitem__(self, key: Any) -> np.ndarray:
        if self._whole is not None:
            return self._whole[key]
        first, rest = (key[0], key[1:]) if isinstance(key, tuple) and key else (key, ())
        if isinstance(first, (int, np.integer)):
            row = self._row(int(first))
            return row[rest] if rest else row
        if isinstance(first, slice) or (
            isinstance(first, (list, np.ndarray)) and np.asarray(first).dtype.kind in "iu"
        ):
            idx = np.arange(len(self))[first]
            rows = np.stack([self._row(int(i)) for i in idx.ravel()]) if idx.size else None
            if rows is None:
                rows = np.empty((0,) + self.shape[1:], self.dtype)
            rows = rows.reshape(idx.shape + self.shape[1:])
            return rows[(slice(None),) * idx.ndim + rest] if rest else rows
        return np.asarray(self)[key]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        if self._whole is None:
            self._whole = read_only(np.matmul(self._span, self._basis))
            self._rows.clear()
        whole = self._whole
        if dtype is not None and np.dtype(dtype) != whole.dtype:
            return whole.astype(dtype)
        return np.array(whole) if copy else whole

    def __getattr__(self, name: str) -> Any:
        """ndarray methods (``max``, ``reshape``, ...) on the whole array."""
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(np.asarray(self), name)


# ------------------------------------------------------------------------------ defaults
def default_method(*, kappa: float | None = None, dt: float | None = None) -> str:
    """The method :func:`simulate` and ``wflow run`` use when none is named: error-controlled
    ``"dopri5"``, ``"rk4"`` with a fixed ``dt``, ``"euler-maruyama"`` with noise (``kappa``).

    Examples
    --------
    >>> from wflow.solvers.particles import default_method
    >>> default_method(), default_method(dt=0.1), default_method(kappa=4.0)
    ('dopri5', 'rk4', 'euler-maruyama')
    """
    if kappa is not None:
        return "euler-maruyama"
    return "dopri5" if dt is None else "rk4"


def default_dt(model: Model, method: str | None = None, save_at: Any = None) -> float:
    """A default fixed step: ``0.5 / (1 + L)`` with ``L = model.rate_bound()`` (a crude bound), shortened to
    divide equal save intervals.

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.solvers.particles import default_dt
    >>> round(default_dt(wflow.SA(4.0)), 6)  # 0.5 / (1 + L), L = rate_bound() = 5
    0.083333
    >>> default_dt(wflow.SA(4.0), save_at=np.linspace(0.0, 1.0, 11))  # two steps per save interval
    0.05
    """
    dt = 0.5 / (1.0 + model.rate_bound())
    if save_at is not None:
        gaps = np.diff(np.asarray(save_at, dtype=float))
        if gaps.size and np.ptp(gaps) <= 1e-9 * gaps.max():
            dt = gaps[0] / max(1, math.ceil(gaps[0] / dt - 1e-9))  # (t_end = 1e-300: one step)
    return float(dt)


def span_is_exact(model: Model, *, kappa: float | None = None, tracers: int = 0) -> str | None:
    r"""``None`` when ``coordinates="span"`` integrates the flow exactly, else why not.

    That holds for SA and USA with :math:`Q = K = V = I` on the sphere (every velocity is a combination
    of the tokens, and the flow commutes with rotations), without noise or tracers.

    Examples
    --------
    >>> import numpy as np, wflow
    >>> span_is_exact(wflow.SA(4.0)) is None, span_is_exact(wflow.SA(4.0), kappa=2.0)
    (True, 'noise (kappa) moves the tokens out of their span')
    >>> span_is_exact(wflow.SA(4.0, V=-np.eye(3)))[:37]
    'the model is not SA or USA with Q = K'
    """
    if kappa is not None:
        return "noise (kappa) moves the tokens out of their span"
    if tracers:
        return "tracers need not lie in the tokens' span"
    plain = getattr(model, "plain_attention", None)
    if model.space != "sphere" or plain is None or not plain():
        return f"the model is not SA or USA with Q = K = V = I on the sphere: {model!r}"
    return None


def simulate(
    model: Model,
    mu0: Atoms | np.ndarray,
    t_end: float,
    *,
    save_at: Any = None,
    method: str | None = None,
    dt: float | None = None,
    control: StepControl | None = None,
    kappa: float | None = None,
    seed: Any = None,
    backend: str = "auto",
    t0: float = 0.0,
    tracers: np.ndarray | None = None,
    trackers: Sequence[Tracker | Callable[[float, Atoms], Any]] = (),
    progress: bool = False,
    throw: bool = True,
    coordinates: str = "auto",
    **deprecated: Any,
) -> Trajectory:
    r"""Evolve particles :math:`\dot x_i = v[\mu_N](x_i)` on the sphere.

    Parameters
    ----------
    model : Model
        Gives the velocity (``SA``, ``USA``, ``Perceptron`` or sums).
    mu0 : Atoms or ndarray, shape (..., n, d)
        Initial measure; leading axes are independent systems.  For a scheme with radii
        (:mod:`wflow.schemes`) an array holds the tokens :math:`x = r\theta`.
    t_end : float
        Final time (> ``t0``).
    save_at : array_like or SaveAt, optional
        Save times in ``[t0, t_end]`` (``t0`` is always saved; default 11 equally spaced), or a
        :class:`~wflow.solvers.saveat.SaveAt` that also says what is saved (points, diagnostics,
        functions of the measure, dtype, ``out``).  Steps land on the save times.
    method : str, optional
        A solver of :data:`wflow.solvers.base.SOLVERS`: ``"dopri5"``, ``"rk4"``, ``"euler"``,
        ``"euler-average"``, ``"euler-maruyama"``, ``"ros2"``; default :func:`default_method`.
        ``"euler"`` and ``"euler-average"`` of SA with :math:`Q = K = V = I` on systems of at most
        256 tokens run fused (:class:`~wflow.solvers.fused.FusedEuler`, recorded as ``"fused-euler"``).
    dt : float, optional
        Fixed step, or the first trial step of ``"dopri5"``; default :func:`default_dt` for fixed steps.
    control : StepControl, optional
        Tolerances of ``"dopri5"`` and ``max_steps`` (:class:`~wflow.solvers.control.StepControl`).
    kappa : float, optional
        Noise: diffusion :math:`\kappa^{-1}\Delta_S` (``sqrt(2/kappa) dW``).
    seed : int or numpy.random.Generator, optional
        Seed of the noise (recorded in ``config["seed"]``).
    backend : str
        Kernel-sum backend (see :mod:`wflow.kernels`).
    t0 : float
        Initial time.
    tracers : ndarray, shape (..., m, d), optional
        Passive points carried by the flow of :math:`\mu_N` (``Trajectory.tracers``).
    trackers : sequence of Tracker or callable
        Recorders (:class:`wflow.io.ZarrRecorder`) and other trackers (:mod:`wflow.solvers.trackers`); a
        plain function ``f(t, mu)`` is called after each save (``mu`` read-only) and stops the run
        (status 1) when it returns a true value.
    progress : bool
        Show a progress bar.
    throw : bool
        Raise :class:`~wflow.errors.SolverError` on failure (default), or return ``status = -1``.
    coordinates : {"auto", "cartesian", "angles", "gaps", "span"}
        ``"auto"`` (default): ``"span"`` where it is exact (:func:`span_is_exact`) and there are more
        dimensions than tokens, else ``"cartesian"``.  ``"angles"``: on :math:`S^1`, the Kuramoto form
        (:class:`CircleAngleProblem`).  ``"gaps"``: the gaps between sorted tokens on :math:`S^1`
        (:class:`CircleGapProblem`; with ``method="ros2"`` for metastable staircases at large beta).
        ``"span"``: the n coordinates of the initial tokens' span (:class:`SpanProblem`), exact for
        SA/USA with Q = K = V = I; a step's cost no longer grows with d.
    **deprecated
        The spellings of earlier releases, each with a ``DeprecationWarning`` naming its successor:
        ``rtol``, ``atol``, ``max_steps`` (``control=StepControl(...)``); ``diagnostics``,
        ``extra_diagnostics``, ``cluster_threshold``, ``keep`` (``save_at=SaveAt(...)``); ``writer``,
        ``callback`` (``trackers=[...]``).

    Returns
    -------
    Trajectory

    Raises
    ------
    SolverError
        A non-finite state, a step size underflow or ``max_steps`` exceeded (with ``throw=True``).

    Examples
    --------
    >>> import wflow
    >>> mu0 = wflow.Atoms(wflow.sphere.uniform(64, 3, seed=0))
    >>> traj = wflow.simulate(wflow.SA(beta=4.0), mu0, t_end=1.0, dt=0.05)
    >>> traj.points.shape
    (11, 64, 3)
    >>> traj.status, int(traj.stats["steps"][-1])
    (0, 20)
    """
    if not isinstance(model, Model):
        raise TypeError(
            f"model must be a wflow Model (SA, USA, Perceptron, ...), got {short_repr(model)}"
        )
    spec, control, trackers, keep = _upgrade(save_at, control, trackers, deprecated)
    x_free = None
    if model.space == "free" and not isinstance(mu0, Atoms):
        x_free = np.asarray(mu0, dtype=np.float64)
        if x_free.ndim < 2 or x_free.shape[-1] < 2 or not np.all(np.isfinite(x_free)):
            raise ValueError(
                f"mu0 must be finite tokens of shape (..., n, d), d >= 2, got {short_repr(mu0)}"
            )
        r = np.linalg.norm(x_free, axis=-1)
        if np.any(r <= 0):
            raise ValueError(
                "mu0: every token of a scheme with radii needs a radius > 0 (a direction)"
            )
        mu0 = Atoms._trusted(
            x_free / r[..., None], np.full(x_free.shape[:-1], 1.0 / x_free.shape[-2])
        )
    mu0 = as_atoms(mu0, "mu0")
    if kappa is not None:
        kappa = check_positive(kappa, "kappa")
    if method is None:
        method = default_method(kappa=kappa, dt=dt)
    solver = get_solver(method)
    _check_method(model, solver, method, kappa, tracers, coordinates, control)
    t0 = float(t0)
    if dt is None and not solver.adaptive:
        if (
            isinstance(t_end, (int, float, np.integer, np.floating))
            and not isinstance(t_end, bool)
            and math.isfinite(float(t_end))
            and float(t_end) > t0
        ):
            dt = default_dt(model, method, check_save_at(spec.ts, t0, float(t_end)))
    x = mu0.points if x_free is None else x_free
    n_tr = 0
    if tracers is not None:
        tracers = _check_tracers(tracers, x, mu0)
        n_tr = tracers.shape[-2]
        x = np.concatenate([x, tracers], axis=-2)
    if x.dtype != np.float64 and method in FLOAT64_SOLVERS:
        x = x.astype(np.float64)
    problem, x = _problem(model, mu0, x, n_tr, kappa, backend, spec, coordinates)
    if method in ("euler", "euler-average") and problem.fused_spec(t0, x) is not None:
        solver = FusedEuler(projected=method == "euler")
    trs = [_tracker(tr, problem) for tr in trackers]
    if progress:
        trs.append(ProgressBar(method))
    traj = integrate(
        problem,
        solver,
        x,
        t0,
        t_end,
        save_at=spec,
        dt=dt,
        rtol=control.rtol,
        atol=control.atol,
        max_steps=control.max_steps,
        seed=seed,
        trackers=trs,
        keep=keep,
        throw=throw,
        result_class=Trajectory,
    )
    assert isinstance(traj, Trajectory)
    return traj


#: particle solvers whose steps compute in float64 whatever the points' dtype, and why: :func:`simulate`
#: starts them from float64 points, so that every snapshot (and a store) holds that precision
FLOAT64_SOLVERS = {
    "dopri5": "its error control (the default atol 1e-9 lies below float32's resolution)",
    "euler-maruyama": "its noise increments are drawn in float64",
}

#: the deprecated arguments of :func:`simulate` and where each went
_DEPRECATED = {
    "rtol": "control=wflow.StepControl(rtol=...)",
    "atol": "control=wflow.StepControl(atol=...)",
    "max_steps": "control=wflow.StepControl(max_steps=...)",
    "diagnostics": "save_at=wflow.SaveAt(ts, diagnostics=...)",
    "extra_diagnostics": "save_at=wflow.SaveAt(ts, fn=...)",
    "cluster_threshold": "save_at=wflow.SaveAt(ts, cluster_threshold=...)",
    "keep": "save_at=wflow.SaveAt(ts, points=False)",
    "writer": "trackers=[writer]",
    "callback": "trackers=[callback]",
}


def _upgrade(
    save_at: Any, control: Any, trackers: Any, old: dict[str, Any]
) -> tuple[SaveAt, StepControl, list[Any], bool]:
    """:func:`simulate`'s save specification, step control and trackers with the deprecated spellings
    ``old`` folded in, and whether every snapshot is kept."""
    unknown = sorted(set(old) - set(_DEPRECATED))
    if unknown:
        raise TypeError(
            f"simulate() got an unexpected keyword argument {unknown[0]!r}"
            + did_you_mean(unknown[0], list(inspect.signature(simulate).parameters))
        )
    for name in old:
        warnings.warn(
            f"simulate: {name}= is deprecated; use {_DEPRECATED[name]}",
            DeprecationWarning,
            stacklevel=3,
        )
    if control is not None and not isinstance(control, StepControl):
        raise TypeError(f"control must be a wflow.StepControl, got {short_repr(control)}")
    control = control or StepControl()
    steps = {k: old[k] for k in ("rtol", "atol", "max_steps") if k in old}
    if steps:
        control = dataclasses.replace(control, **steps)
    spec = SaveAt.of(save_at)
    saving = {
        ("fn" if k == "extra_diagnostics" else k): old[k]
        for k in ("diagnostics", "extra_diagnostics", "cluster_threshold")
        if k in old
    }
    if saving:  # (beside a SaveAt too: what they name replaces the SaveAt's own)
        spec = dataclasses.replace(spec, **saving)
    if isinstance(trackers, (str, bytes)) or not isinstance(trackers, Iterable):
        raise TypeError(f"trackers must be a sequence of trackers, got {short_repr(trackers)}")
    trs = list(trackers)
    if old.get("writer") is not None:
        trs.insert(0, old["writer"])
    if old.get("callback") is not None:
        trs.append(old["callback"])
    return spec, control, trs, bool(old.get("keep", True))


def _tracker(tr: Any, problem: ParticleProblem) -> Tracker:
    """A tracker of the driver: ``tr`` itself, or a plain function ``f(t, mu)`` called after each save."""
    if all(callable(getattr(tr, m, None)) for m in ("start", "save", "step", "finish")):
        return tr
    if callable(tr):
        return Callback(lambda t, y: tr(t, problem.measure(y)))
    raise TypeError(
        f"trackers must hold wflow Trackers (e.g. wflow.io.ZarrRecorder) or functions f(t, mu), "
        f"got {short_repr(tr)}"
    )


def _check_method(
    model: Model,
    solver: Any,
    method: str,
    kappa: float | None,
    tracers: Any,
    coordinates: str,
    control: StepControl,
) -> None:
    """Refuse a method that does not fit the model, the noise, the tracers or the tolerances."""
    if solver.stochastic and kappa is None:
        raise ValueError(f"method={method!r} needs a noise level kappa")
    if kappa is not None and not solver.stochastic:
        raise ValueError(
            f"noise (kappa={kappa:g}) needs method='euler-maruyama', got method={method!r}"
        )
    if model.ordered and kappa is not None:
        raise ValueError(
            f"{model!r} is causal (its velocity depends on the tokens' order): noise (kappa={kappa:g}) "
            f"is not supported with a causal mask; drop kappa or the mask"
        )
    if model.ordered and (tracers is not None or coordinates in ("angles", "gaps")):
        raise ValueError(
            f"{model!r} is causal: tracers and coordinates={coordinates!r} (which reorder or add tokens) "
            f"cannot serve it; use the default cartesian coordinates without tracers"
        )
    if not solver.adaptive and (control.rtol is not None or control.atol is not None):
        raise ValueError(
            f"rtol/atol apply to the adaptive method 'dopri5', not to method={method!r}"
        )


def _check_tracers(tracers: Any, x: np.ndarray, mu0: Atoms) -> np.ndarray:
    tracers = np.asarray(tracers, dtype=x.dtype)
    if (
        tracers.ndim != x.ndim
        or tracers.shape[:-2] != mu0.batch_shape
        or tracers.shape[-1] != mu0.d
    ):
        raise ValueError(
            f"tracers must have shape {mu0.batch_shape + ('m', mu0.d)}, got {tracers.shape}"
        )
    if (
        not np.all(np.isfinite(tracers))
        or np.abs(np.linalg.norm(tracers, axis=-1) - 1).max() > 1e-6
    ):
        raise ValueError(
            "tracers must be finite points on the unit sphere (norms within 1e-6 of 1)"
        )
    return tracers


def _problem(
    model: Model,
    mu0: Atoms,
    x: np.ndarray,
    n_tr: int,
    kappa: float | None,
    backend: str,
    spec: SaveAt,
    coordinates: str,
) -> tuple[ParticleProblem, np.ndarray]:
    """The particle problem in the coordinates asked for and its initial state."""
    if coordinates not in ("auto", "cartesian", "angles", "gaps", "span"):
        raise ValueError(
            f"coordinates must be 'auto', 'cartesian', 'angles', 'gaps' or 'span', got {coordinates!r}"
        )
    if coordinates == "auto":
        exact = span_is_exact(model, kappa=kappa, tracers=n_tr) is None
        coordinates = "span" if exact and x.shape[-1] > x.shape[-2] else "cartesian"
    elif coordinates == "span":
        why = span_is_exact(model, kappa=kappa, tracers=n_tr)
        if why is not None:
            raise ValueError(f"coordinates='span' is not exact for this run: {why}")
    kw: dict[str, Any] = dict(
        kappa=kappa,
        backend=backend,
        diagnostics=DIAGNOSTICS if spec.diagnostics is None else spec.diagnostics,
        cluster_threshold=spec.cluster_threshold,
        extra_diagnostics=spec.fn,
        n_tracers=n_tr,
    )
    if coordinates == "span":
        from ..kernels.small import span_coordinates

        y_span, basis = span_coordinates(x)
        if basis is not None:  # else d <= n: the tokens' own coordinates already
            return SpanProblem(model, mu0.weights, basis, **kw), np.ascontiguousarray(y_span)
    elif coordinates in ("angles", "gaps"):
        if mu0.d != 2 or model.space != "sphere":
            raise ValueError(
                f"coordinates={coordinates!r} is for the circle S^1 (d = 2), got d = {mu0.d}"
            )
        theta = np.arctan2(mu0.points[..., 1], mu0.points[..., 0])
        if coordinates == "angles":
            return CircleAngleProblem(model, mu0.weights, **kw), theta
        order, gaps = CircleGapProblem.from_angles(theta)
        return CircleGapProblem(model, mu0.weights, order, **kw), gaps
    return ParticleProblem(model, mu0.weights, mu0.d, **kw), x


def _rebuild(
    cfg: dict[str, Any], stored: dict[str, Any]
) -> tuple[ParticleProblem, Any, np.ndarray]:
    """Problem, solver and last state of a stored particle run (for :func:`wflow.resume`)."""
    from ..models import model_from_dict

    model, weights = model_from_dict(cfg["model"]), stored["static"]["weights"][1]
    kw = {k: cfg[k] for k in ("kappa", "backend", "diagnostics", "cluster_threshold")}
    data, static = stored["data"], stored["static"]
    solver = get_solver(cfg["solver"], **cfg["solver_options"])
    coordinates = cfg.get("coordinates")
    problem: ParticleProblem
    if coordinates == "span":
        problem = SpanProblem(model, weights, static["span_basis"][1], **kw)
        return problem, solver, data["span"][1][-1]
    if coordinates == "gaps":
        problem = CircleGapProblem(model, weights, static["order"][1], **kw)
        return problem, solver, data["gaps"][1][-1]
    if coordinates == "angles":
        return CircleAngleProblem(model, weights, **kw), solver, data["angles"][1][-1]
    problem = ParticleProblem(model, weights, cfg["d"], n_tracers=cfg["n_tracers"], **kw)
    y = data["positions" if "positions" in data else "points"][1][-1]
    if cfg["n_tracers"]:
        y = np.concatenate([y, data["tracers"][1][-1]], axis=-2)
    return problem, solver, y


register_kind("particles", Trajectory, _rebuild)
