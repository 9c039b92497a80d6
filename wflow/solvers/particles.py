r"""Particle solver: the finite-N system :math:`\dot x_i = v[\mu_N](x_i)`, :math:`\mu_N = \sum_j w_j\delta_{x_j}`.

:func:`simulate` is the driver loop (the *when*: step, save, stop); the steppers in
:mod:`wflow.solvers.steppers` are the *how*; the model is the *what*; writers in
:mod:`wflow.io` record.  With ``kappa`` the particles follow the SDE
:math:`dX_i = v[\mu_N](X_i)\,dt + \sqrt{2/\kappa}\,P_{X_i}\circ dW_i`, whose mean-field
limit carries the diffusion :math:`\kappa^{-1}\Delta_S\mu`.

Time is cut at the save times: between two consecutive save times the fixed-step
methods take equal steps of size at most ``dt``, the adaptive one steps freely but
lands exactly on the save time, and the noise of interval ``k`` is drawn from the
generator ``SeedSequence(seed, spawn_key=(k,))``.  A run resumed from any saved
snapshot therefore repeats the uninterrupted run exactly.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import numpy as np

from .._version import __version__
from ..diagnostics import snapshot_diagnostics
from ..errors import SolverError, check_positive, short_repr
from ..measure import Atoms, as_atoms
from ..models import Model
from .steppers import STEPPERS

__all__ = ["simulate", "Trajectory", "SnapshotWriter", "default_dt"]

log = logging.getLogger(__name__)

DIAGNOSTICS = ("energy", "order_parameter", "n_clusters")


class SnapshotWriter(Protocol):
    """Receives each snapshot as soon as it is computed (see :mod:`wflow.io`)."""

    def write(self, snapshot: dict[str, Any]) -> None: ...


@dataclass
class Trajectory:
    """Result of :func:`simulate`.

    Attributes
    ----------
    times : ndarray, shape (k,)
    points : ndarray, shape (k, ..., n, d)
        Positions at the save times.
    weights : ndarray, shape (..., n)
    diagnostics : dict of ndarray, each shape (k, ...)
        ``energy`` (NaN where the model is not a gradient flow), ``order_parameter``
        :math:`|\\sum_i w_i x_i|`, ``n_clusters`` at ``config["cluster_threshold"]``.
    stats : dict
        Cumulative ``steps``, ``rejected`` steps and velocity ``evaluations``, shape (k,).
    config : dict
        Everything needed to repeat the run: model, method, dt, tolerances, kappa,
        seed, backend, save times, wflow version.
    status, message : int, str
        0 and ``"success"`` when ``t_end`` was reached.
    """

    times: np.ndarray
    points: np.ndarray
    weights: np.ndarray
    diagnostics: dict[str, np.ndarray]
    stats: dict[str, np.ndarray]
    config: dict[str, Any]
    dt_next: np.ndarray = field(default_factory=lambda: np.zeros(0))
    tracers: np.ndarray | None = None
    status: int = 0
    message: str = "success"

    def __len__(self) -> int:
        return len(self.times)

    def atoms(self, i: int = -1) -> Atoms:
        """The measure at save index ``i``."""
        return Atoms._trusted(self.points[i], self.weights)

    @property
    def final(self) -> Atoms:
        return self.atoms(-1)

    @property
    def energy(self) -> np.ndarray:
        return self.diagnostics["energy"]

    def to_dataset(self):
        """This trajectory as an :class:`xarray.Dataset` (see :mod:`wflow.io`)."""
        from ..io import trajectory_to_dataset

        return trajectory_to_dataset(self)

    def __repr__(self) -> str:
        shape = self.points.shape[1:]
        return (f"Trajectory({len(self)} snapshots, t={self.times[0]:g}..{self.times[-1]:g}, points {shape}, "
                f"steps={int(self.stats['steps'][-1])}, status={self.status}: {self.message})")


# ------------------------------------------------------------------------------ defaults
def default_dt(model: Model, method: str) -> float:
    """A default fixed step: ``0.5 / (1 + L)`` with ``L`` a rough rate bound of the model.

    The bound (:func:`rate_bound`) is crude; pass ``dt`` explicitly for accuracy studies.
    """
    return 0.5 / (1.0 + rate_bound(model))


def rate_bound(model: Model) -> float:
    """A rough bound on the Lipschitz constant of the velocity field (sets default steps)."""
    from ..models import SA, USA, Perceptron

    total = 0.0
    for p in model.parts:
        if isinstance(p, (SA, USA)):
            nq = 1.0 if p.Q is None else np.linalg.norm(p.Q, 2)
            nk = 1.0 if p.K is None else np.linalg.norm(p.K, 2)
            nv = 1.0 if p.V is None else np.linalg.norm(p.V, 2)
            b = p.beta * nq * nk
            total += nv * (1 + b) * (math.exp(min(b, 700.0)) if isinstance(p, USA) else 1.0)
        elif isinstance(p, Perceptron):
            total += np.linalg.norm(p.W, 2) * np.linalg.norm(p.A, 2)
        else:  # pragma: no cover - future blocks
            total += 1.0
    return float(total)


def _entropy(seed: Any) -> int:
    if seed is None:
        return int(np.random.SeedSequence().entropy % (2**63))
    if isinstance(seed, np.random.Generator):
        return int(seed.integers(2**63))
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) and seed >= 0:
        return int(seed)
    raise TypeError(f"seed must be None, a non-negative int or a numpy Generator, got {short_repr(seed)}")


def _save_times(save_at: Any, t0: float, t_end: float) -> np.ndarray:
    if save_at is None:
        return np.linspace(t0, t_end, 11)
    s = np.asarray(save_at, dtype=np.float64)
    if s.ndim != 1 or s.size == 0:
        raise ValueError(f"save_at must be a 1-d sequence of times, got {short_repr(save_at)}")
    if not np.all(np.isfinite(s)):
        raise ValueError(f"save_at contains non-finite times: {short_repr(s)}")
    if np.any(np.diff(s) <= 0):
        raise ValueError(f"save_at must be strictly increasing, got {short_repr(s)}")
    if s[0] < t0 - 1e-12 or s[-1] > t_end + 1e-12 * max(1.0, abs(t_end)):
        raise ValueError(f"save_at must lie in [t0, t_end] = [{t0:g}, {t_end:g}], got {s[0]:g}..{s[-1]:g}")
    if s[0] > t0:
        s = np.concatenate([[t0], s])
    return s


# ------------------------------------------------------------------------------ driver
def simulate(
    model: Model,
    mu0: Atoms | np.ndarray,
    t_end: float,
    *,
    save_at: Any = None,
    method: str | None = None,
    dt: float | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    kappa: float | None = None,
    seed: Any = None,
    backend: str = "auto",
    t0: float = 0.0,
    cluster_threshold: float = 0.1,
    writer: SnapshotWriter | None = None,
    progress: bool = False,
    max_steps: int = 10**7,
    callback: Callable[[float, Atoms], None] | None = None,
    tracers: np.ndarray | None = None,
    _resume: dict[str, Any] | None = None,
    _config_update: dict[str, Any] | None = None,
) -> Trajectory:
    r"""Evolve particles :math:`\dot x_i = v[\mu_N](x_i)` on the sphere.

    Parameters
    ----------
    model : Model
        Gives the velocity (``SA``, ``USA``, ``Perceptron`` or sums).
    mu0 : Atoms or ndarray, shape (..., n, d)
        Initial measure; leading axes are independent systems evolved together.
    t_end : float
        Final time (> ``t0``).
    save_at : array_like, optional
        Save times in ``[t0, t_end]`` (``t0`` is always saved); default 11 equally spaced.
    method : {"rk4", "dopri5", "euler", "euler-maruyama"}, optional
        Default ``"rk4"``, or ``"euler-maruyama"`` when ``kappa`` is given.
    dt : float, optional
        Fixed step (maximal step within each save interval), or the first trial step
        of ``"dopri5"``.  Default :func:`default_dt` for fixed-step methods.
    rtol, atol : float, optional
        Tolerances of ``"dopri5"`` (default 1e-6 and 1e-9); not accepted by fixed-step methods.
    kappa : float, optional
        Noise: diffusion :math:`\kappa^{-1}\Delta_S` (``sqrt(2/kappa) dW``).
    seed : int or numpy.random.Generator, optional
        Seed of the noise (recorded in ``config["seed"]``).
    backend : str
        Kernel-sum backend (see :mod:`wflow.kernels`).
    cluster_threshold : float
        Geodesic linkage distance of the cluster count.
    writer : SnapshotWriter, optional
        Receives each snapshot as soon as it is computed (e.g. :class:`wflow.io.ZarrWriter`).
    progress : bool
        Show a tqdm progress bar.
    callback : callable, optional
        ``callback(t, mu)`` after each save.
    tracers : ndarray, shape (..., m, d), optional
        Passive points carried by the flow of :math:`\mu_N` without mass of their own
        (e.g. to measure the flow map's Jacobian); returned in ``Trajectory.tracers`` and
        written with each snapshot.

    Returns
    -------
    Trajectory

    Raises
    ------
    SolverError
        A non-finite state (the snapshots already passed to ``writer`` are kept), a
        step size underflow or ``max_steps`` exceeded.

    Examples
    --------
    >>> import wflow
    >>> mu0 = wflow.Atoms(wflow.sphere.uniform(64, 3, seed=0))
    >>> traj = wflow.simulate(wflow.SA(beta=4.0), mu0, t_end=1.0, dt=0.05)
    >>> traj.points.shape
    (11, 64, 3)
    """
    if not isinstance(model, Model):
        raise TypeError(f"model must be a wflow Model (SA, USA, Perceptron, ...), got {short_repr(model)}")
    mu0 = as_atoms(mu0, "mu0")
    model.check_dimension(mu0.d)
    t0 = float(t0)
    if not isinstance(t_end, (int, float, np.floating, np.integer)) or isinstance(t_end, bool):
        raise TypeError(f"t_end must be a number, got {short_repr(t_end)}")
    t_end = float(t_end)
    if not np.isfinite(t_end) or t_end <= t0:
        raise ValueError(f"t_end must be a finite time > t0 = {t0:g}, got {t_end!r}")
    if kappa is not None:
        kappa = check_positive(kappa, "kappa")
    if method is None:
        method = "euler-maruyama" if kappa is not None else "rk4"
    if not isinstance(method, str) or method not in STEPPERS:
        raise ValueError(f"method must be one of {sorted(STEPPERS)}, got {method!r}")
    stepper = STEPPERS[method]
    if kappa is not None and not stepper.stochastic:
        raise ValueError(f"noise (kappa={kappa:g}) needs method='euler-maruyama', got method={method!r}")
    if kappa is None and stepper.stochastic:
        raise ValueError("method='euler-maruyama' needs a noise level kappa")
    if not stepper.adaptive and (rtol is not None or atol is not None):
        raise ValueError(f"rtol/atol apply to the adaptive method 'dopri5', not to method={method!r}")
    if dt is not None:
        dt = check_positive(dt, "dt")
    elif not stepper.adaptive:
        dt = default_dt(model, method)
    if stepper.adaptive:
        rtol = 1e-6 if rtol is None else check_positive(rtol, "rtol")
        atol = 1e-9 if atol is None else check_positive(atol, "atol")
    cluster_threshold = check_positive(cluster_threshold, "cluster_threshold")
    times = _save_times(save_at, t0, t_end)

    resume = _resume or {}
    entropy = resume.get("seed", None)
    if entropy is None:
        entropy = _entropy(seed)
    # when resuming, mu0 is the state at times[first_interval], already saved
    first_interval = int(resume.get("first_interval", 0))
    config = {
        "solver": "particles",
        "model": model.to_dict(),
        "method": method,
        "dt": dt,
        "rtol": rtol,
        "atol": atol,
        "kappa": kappa,
        "seed": entropy,
        "backend": backend,
        "t0": t0,
        "t_end": t_end,
        "save_at": [float(s) for s in times],
        "cluster_threshold": cluster_threshold,
        "n": mu0.n,
        "d": mu0.d,
        "batch_shape": list(mu0.batch_shape),
        "wflow_version": __version__,
        "n_tracers": 0 if tracers is None else int(tracers.shape[-2]),
    }
    config.update(_config_update or {})

    w = mu0.weights
    dtype = mu0.points.dtype
    n = mu0.n
    if tracers is not None:
        tracers = np.asarray(tracers, dtype=dtype)
        if tracers.ndim != mu0.points.ndim or tracers.shape[:-2] != mu0.batch_shape or tracers.shape[-1] != mu0.d:
            raise ValueError(f"tracers must have shape {mu0.batch_shape + ('m', mu0.d)}, got {tracers.shape}")

    def f(t: float, x: np.ndarray) -> np.ndarray:
        # The field is extended off the sphere by zero-homogeneity: every point, query and
        # source alike, is normalized before the velocity is evaluated.  The extension is
        # smooth near the product of spheres and leaves it invariant, so Runge--Kutta plus
        # projection keeps its order (Hairer-Lubich-Wanner, GNI IV.4), and the kernel sums
        # always see points on the sphere (their fast spectral path needs that).
        x = x / np.linalg.norm(x, axis=-1, keepdims=True)
        return model.velocity(x, Atoms._trusted(x[..., :n, :], w), backend=backend)

    stats = dict(resume.get("stats", {"steps": 0, "rejected": 0, "evaluations": 0}))
    dt_next = float(resume.get("dt_next", 0.0)) or None
    if stepper.adaptive and dt_next is None:
        dt_next = dt if dt is not None else _initial_step(f, t0, mu0.points, stepper.error_order, rtol, atol)
        stats["evaluations"] += 0 if dt is not None else 2

    out_t, out_x, out_dt = [], [], []
    out_diag: dict[str, list] = {k: [] for k in DIAGNOSTICS}
    out_stats: dict[str, list] = {k: [] for k in ("steps", "rejected", "evaluations")}

    out_tr: list[np.ndarray] = []

    def save(t: float, x: np.ndarray, dtn: float | None) -> None:
        tr = None
        if x.shape[-2] != n:
            tr = x[..., n:, :].copy()
            out_tr.append(tr)
            x = x[..., :n, :]
        mu = Atoms._trusted(x, w)
        diag = snapshot_diagnostics(model, mu, cluster_threshold=cluster_threshold, backend=backend)
        out_t.append(t)
        out_x.append(x.copy())
        out_dt.append(np.nan if dtn is None else dtn)
        for k in DIAGNOSTICS:
            out_diag[k].append(diag[k])
        for k in out_stats:
            out_stats[k].append(stats[k])
        if writer is not None:
            writer.write({"time": t, "points": x, "weights": w, "config": config, "tracers": tr,
                          "diagnostics": diag, "stats": dict(stats), "dt_next": out_dt[-1]})
        if callback is not None:
            callback(t, mu)

    x = mu0.points.copy() if tracers is None else np.concatenate([mu0.points, tracers], axis=-2)
    if first_interval == 0:
        save(times[0], x, dt_next)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=float(times[-1] - times[0]), unit="t", desc=f"{method}", dynamic_ncols=True,
                   bar_format="{l_bar}{bar}| t={n:.3g}/{total:.3g} [{elapsed}<{remaining}]")
    try:
        for k in range(max(first_interval, 0), len(times) - 1):
            a, b = float(times[k]), float(times[k + 1])
            rng = np.random.default_rng(np.random.SeedSequence(entropy, spawn_key=(k,))) if stepper.stochastic else None
            if stepper.adaptive:
                x, dt_next = _adaptive_interval(stepper, f, x, a, b, dt_next, rtol, atol, stats, max_steps, bar)
            else:
                nsteps = max(1, math.ceil((b - a) / dt - 1e-9))
                h = (b - a) / nsteps
                for i in range(nsteps):
                    t = a + i * h
                    st = stepper.step(f, t, x, h, kappa=kappa, rng=rng)
                    _check_finite(st.x, t, h, method)
                    x = st.x.astype(dtype, copy=False)
                    stats["steps"] += 1
                    stats["evaluations"] += st.evaluations
                    if stats["steps"] > max_steps:
                        raise SolverError(f"max_steps={max_steps} exceeded at t={t:g}; increase dt or max_steps")
                    if bar is not None:
                        bar.update(h)
            save(b, x, dt_next)
    finally:
        if bar is not None:
            bar.close()

    prefix = resume.get("previous")  # earlier snapshots, when resuming in memory
    traj = Trajectory(
        times=np.asarray(out_t),
        points=np.stack(out_x),
        weights=w,
        diagnostics={k: np.stack(v) for k, v in out_diag.items()},
        stats={k: np.asarray(v) for k, v in out_stats.items()},
        config=config,
        dt_next=np.asarray(out_dt),
        tracers=np.stack(out_tr) if out_tr else None,
    )
    if prefix is not None:
        traj = _concat(prefix, traj)
    return traj


def _concat(a: Trajectory, b: Trajectory) -> Trajectory:
    return Trajectory(
        times=np.concatenate([a.times, b.times]),
        points=np.concatenate([a.points, b.points]),
        weights=b.weights,
        diagnostics={k: np.concatenate([a.diagnostics[k], b.diagnostics[k]]) for k in b.diagnostics},
        stats={k: np.concatenate([a.stats[k], b.stats[k]]) for k in b.stats},
        config=b.config,
        dt_next=np.concatenate([a.dt_next, b.dt_next]),
        tracers=None if b.tracers is None else np.concatenate([a.tracers, b.tracers]),
    )


def _check_finite(x: np.ndarray, t: float, h: float, method: str) -> None:
    if not np.all(np.isfinite(x)):
        raise SolverError(
            f"the state became non-finite in the step from t={t:.6g} with dt={h:.3g} ({method}); "
            f"snapshots written so far are kept. Reduce dt (or rtol), or check the model's parameters"
        )


def _rms(v: np.ndarray) -> float:
    return float(np.sqrt(np.mean(v * v)))


def _initial_step(f, t0, x0, order, rtol, atol) -> float:
    """Hairer, Nørsett & Wanner (1993), II.4: a first step for an adaptive method."""
    scale = atol + rtol * np.abs(x0)
    f0 = f(t0, x0)
    d0, d1 = _rms(x0 / scale), _rms(f0 / scale)
    h0 = 1e-6 if d0 < 1e-5 or d1 < 1e-5 else 0.01 * d0 / d1
    f1 = f(t0 + h0, x0 + h0 * f0)
    d2 = _rms((f1 - f0) / scale) / h0
    h1 = max(1e-6, h0 * 1e-3) if max(d1, d2) <= 1e-15 else (0.01 / max(d1, d2)) ** (1.0 / (order + 1))
    return float(min(100 * h0, h1))


def _adaptive_interval(stepper, f, x, a, b, h, rtol, atol, stats, max_steps, bar):
    """Integrate from a to b with error control, landing exactly on b; returns (x, next step)."""
    t = a
    safety, min_factor, max_factor = 0.9, 0.2, 5.0
    expo = -1.0 / (stepper.error_order + 1)
    while t < b:
        h_try = min(h, b - t)
        last = h_try >= b - t
        if h_try <= 1e-14 * max(1.0, abs(t)):
            raise SolverError(f"step size underflow at t={t:.6g} (dt={h_try:.3g}); the problem may be stiff or "
                              f"the tolerances too tight (rtol={rtol:g}, atol={atol:g})")
        st = stepper.step(f, t, x, h_try, rtol=rtol, atol=atol)
        stats["evaluations"] += st.evaluations
        err = st.error
        if not np.isfinite(err):
            err = np.inf
        if err <= 1.0:
            _check_finite(st.x, t, h_try, stepper.name)
            x = st.x.astype(x.dtype, copy=False)
            t = b if last else t + h_try
            stats["steps"] += 1
            factor = max_factor if err == 0 else min(max_factor, safety * err**expo)
            h = h_try * factor
            if bar is not None:
                bar.update(h_try)
        else:
            stats["rejected"] += 1
            h = h_try * max(min_factor, safety * err**expo if np.isfinite(err) else min_factor)
        if stats["steps"] + stats["rejected"] > max_steps:
            raise SolverError(f"max_steps={max_steps} exceeded at t={t:g}")
    return x, h
