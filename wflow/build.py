"""The objects a checked run configuration (:mod:`wflow.config`) describes: model, mesh, initial state, run.

:func:`start_run` and :func:`resume_run` return the :class:`Run` that ``wflow run`` and
:mod:`wflow.sweep` execute; :mod:`wflow.config` re-exports every name.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "STEP_LOG",
    "initial_density",
    "build_mesh",
    "build_model",
    "build_run",
    "run_method",
    "save_times",
    "start_run",
    "resume_run",
    "Run",
]

#: the step log a JKO run writes beside its store (one line per step: residuals, iterations)
STEP_LOG = "steps.csv"


def initial_density(cfg: dict[str, Any]):
    """The initial density (a callable of points, plain surface measure, unnormalized) of a continuum run."""
    from . import sphere

    d = cfg["init.d"]
    rng = np.random.default_rng(cfg["init.seed"])
    k = cfg["init.components"]
    means = sphere.uniform(k, d, rng)
    kap = cfg["init.kappa"]
    p = 1.0 if cfg["init.kind"] == "vmf-mixture" else cfg["init.perturbation"]

    def rho0(x: np.ndarray) -> np.ndarray:
        mix = np.mean(np.exp(kap * (x @ means.T - 1.0)), axis=1)
        # normalize the mixture to mean 1 over the sphere (each component's normalizer)
        from scipy import special

        norm = special.ive(d / 2 - 1, kap) * special.gamma(d / 2) * (2 / kap) ** (d / 2 - 1)
        return (1 - p) + p * mix / norm

    return rho0


def build_mesh(cfg: dict[str, Any]):
    """The mesh of an eulerian run."""
    from .mesh import CircleMesh, SphereMesh

    r = cfg["mesh.resolution"]
    return CircleMesh(r) if cfg["init.d"] == 2 else SphereMesh(r)


def _read_weights(path: str, beta: float) -> tuple[np.ndarray, ...]:
    """``(Q, K, V, beta)`` of a ``model.weights`` file: an ``.npz`` archive of plain arrays."""
    import zipfile

    try:
        with np.load(path, allow_pickle=False) as f:
            if not hasattr(f, "files"):
                raise ValueError("it holds one array, not an .npz archive")
            missing = [k for k in ("Q", "K", "V") if k not in f.files]
            if missing:
                raise ValueError(f"it has no array {', '.join(missing)} (it has {f.files})")
            Qs, Ks, Vs = (np.asarray(f[k], dtype=float) for k in ("Q", "K", "V"))
            betas = np.asarray(f["beta"], dtype=float) if "beta" in f.files else None
    except (ValueError, TypeError, OSError, EOFError, zipfile.BadZipFile) as exc:
        why = str(exc) if isinstance(exc, ValueError) and str(exc).startswith("it ") else None
        raise ValueError(
            f"config key model.weights: {path} is not an .npz archive of arrays Q, K, V "
            f"(numpy.savez): {why or 'not a NumPy archive'}"
        ) from None
    return Qs, Ks, Vs, (betas if betas is not None else np.full(len(Qs), beta))


def build_model(cfg: dict[str, Any]):
    """The model of a config: attention (kernel convention, long context), a perceptron when perceptron.m > 0,
    layer-dependent weights (model.layers, model.weights) and a normalization scheme (model.scheme)."""
    from .models import SA, USA, Model, Perceptron

    d = cfg["init.d"]
    att_cls = SA if cfg["model.type"] == "SA" else USA
    V = None if cfg["model.value"] == "identity" else -np.eye(d)
    temp = {"gamma": cfg["model.gamma"]} if cfg["model.gamma"] > 0 else {"beta": cfg["model.beta"]}
    m = cfg["perceptron.m"]
    perceptron = None
    if m > 0:
        rng = np.random.default_rng(cfg["perceptron.seed"])
        s = cfg["perceptron.scale"]
        A = rng.normal(0, s / np.sqrt(m), (m, d))
        b = rng.normal(0, s / np.sqrt(m), m)
        if cfg["perceptron.conservative"]:
            perceptron = Perceptron.conservative(
                A, rng.normal(0, s, m), b, cfg["perceptron.activation"]
            )
        else:
            perceptron = Perceptron(
                rng.normal(0, s / np.sqrt(m), (d, m)), A, b, cfg["perceptron.activation"]
            )
    attentions: list[Model] = [att_cls(V=V, kernel=cfg["model.kernel"], **temp)]
    if cfg["model.weights"]:
        Qs, Ks, Vs, betas = _read_weights(cfg["model.weights"], cfg["model.beta"])
        if not (
            Qs.ndim == Ks.ndim == Vs.ndim == 3
            and Qs.shape[0] == Ks.shape[0] == Vs.shape[0] == len(betas)
            and Vs.shape[1:] == (d, d)
            and Qs.shape[2] == d
            and Ks.shape[2] == d
        ):
            raise ValueError(
                f"config key model.weights: {cfg['model.weights']} must hold Q, K of shape (L, p, d) and "
                f"V of shape (L, d, d) with d = init.d = {d} (and beta of shape (L,)); got Q {Qs.shape}, "
                f"K {Ks.shape}, V {Vs.shape}"
            )
        attentions = [
            att_cls(b, Q=q, K=k, V=v, kernel=cfg["model.kernel"])
            for q, k, v, b in zip(Qs, Ks, Vs, betas)
        ]
    elif cfg["model.layers"] > 0:
        from .schemes import Layered

        lay = Layered.random(
            d,
            cfg["model.layers"],
            beta=cfg["model.beta"],
            period=cfg["model.period"],
            attention=cfg["model.type"],
            seed=cfg["perceptron.seed"],
            kernel=cfg["model.kernel"],
        )
        attentions = lay.layers
    scheme = cfg["model.scheme"]
    if scheme != "post-ln" or (perceptron is not None and cfg["model.kernel"] == "rescaled"):
        from .schemes import Normalized

        options = {"mix-ln": {"tau": cfg["model.tau"]}, "ngpt": {"alpha": cfg["model.alpha"]}}
        kw = options.get(scheme, {})
        models: list[Model] = [
            Normalized(a, scheme, perceptron=perceptron, **kw) for a in attentions
        ]
    else:
        models = [a if perceptron is None else a + perceptron for a in attentions]
    if len(models) == 1:
        return models[0]
    from .schemes import Layered

    return Layered(models, period=cfg["model.period"])


def build_run(cfg: dict[str, Any]):
    """Model, initial measure and keyword arguments of :func:`wflow.simulate` for a config.

    Examples
    --------
    >>> from wflow.config import apply_overrides, default_config
    >>> model, mu0, kwargs = build_run(apply_overrides(default_config(), ["init.n=10"]))
    >>> model, mu0.n, kwargs["method"]
    (SA(beta=9), 10, 'dopri5')
    """
    from . import sphere
    from .measure import Atoms

    d = cfg["init.d"]
    model = build_model(cfg)
    rng = np.random.default_rng(cfg["init.seed"])
    if cfg["init.kind"] == "uniform":
        x = sphere.uniform(cfg["init.n"], d, rng)
    else:
        k = cfg["init.components"]
        x = sphere.vmf_mixture(
            cfg["init.n"], sphere.uniform(k, d, rng), np.full(k, cfg["init.kappa"]), seed=rng
        )
    from .solvers.control import StepControl
    from .solvers.saveat import SaveAt

    method = run_method(cfg)
    kwargs: dict[str, Any] = dict(
        save_at=SaveAt(
            np.linspace(0.0, cfg["run.t_end"], cfg["save.n"]),
            cluster_threshold=cfg["save.cluster_threshold"],
        ),
        method=method,
        dt=cfg["run.dt"] or None,
        kappa=cfg["run.kappa"] or None,
        seed=cfg["run.seed"],
        backend=cfg["run.backend"],
        coordinates=cfg["run.coordinates"],
    )
    if method == "dopri5":
        kwargs["control"] = StepControl(rtol=cfg["control.rtol"], atol=cfg["control.atol"])
    return model, Atoms(x), kwargs


def run_method(cfg: dict[str, Any]) -> str:
    """The particle method a configuration runs: ``run.method``, with ``"auto"`` resolved by
    the library's rule (:func:`wflow.solvers.particles.default_method`).

    Examples
    --------
    >>> from wflow.config import apply_overrides, default_config
    >>> run_method(default_config()), run_method(apply_overrides(default_config(), ["run.dt=0.1"]))
    ('dopri5', 'rk4')
    """
    from .solvers.particles import default_method

    if cfg["run.method"] != "auto":
        return str(cfg["run.method"])
    return default_method(kappa=cfg["run.kappa"] or None, dt=cfg["run.dt"] or None)


class Run:
    """A configuration turned into objects: ``describe`` for the log line, ``execute`` to run it.

    Built by :func:`start_run`, which validates everything a run needs (model, mesh, backend,
    initial state) before anything is written.

    Examples
    --------
    >>> from wflow.config import apply_overrides, default_config
    >>> run = start_run(apply_overrides(default_config(), ["init.n=8", "run.t_end=0.5"]))
    >>> res = run.execute([], progress=False)
    >>> res.status, res.final.points.shape, len(res.times)  # every save's diagnostics, the last points
    (0, (8, 3), 31)
    """

    def __init__(self, cfg: dict[str, Any], describe: str, call):
        self.cfg, self.describe, self._call = cfg, describe, call

    def execute(self, trackers: list, *, progress: bool = True, out: Path | None = None):
        """Run through the driver with ``trackers`` (a recorder); returns the result, which holds the last
        state only (the recorder holds every save)."""
        return self._call(list(trackers), progress, out)


def _quiet(trackers: list, progress: bool) -> dict[str, Any]:
    """The driver keywords of every ``wflow run`` solver: the recorder among ``trackers`` keeps the saves
    (none in memory), and a failure is returned in the result, not raised."""
    return {"trackers": trackers, "progress": progress, "keep": False, "throw": False}


def _check_backend(name: str) -> None:
    from .kernels import BACKENDS

    if name != "auto" and name.partition(":")[0] not in BACKENDS:  # ("torch:cuda": a device too)
        raise ValueError(
            f"config key run.backend must be 'auto' or one of {sorted(BACKENDS)}, got {name!r}"
        )


def _jko_schedule(cfg: dict[str, Any]) -> tuple[float, int, int]:
    """``(tau, n_steps, save_every)`` of a JKO configuration: steps of ``jko.tau`` to ``run.t_end``, about
    ``save.n`` of them saved."""
    tau = cfg["jko.tau"]
    n_steps = max(1, int(np.ceil(cfg["run.t_end"] / tau - 1e-9)))
    return tau, n_steps, max(1, n_steps // max(1, cfg["save.n"] - 1))


def save_times(cfg: dict[str, Any]) -> np.ndarray:
    """The times a configuration's run saves at: ``save.n`` from 0 to ``run.t_end``, or for ``problem = jko``
    every ``save_every``-th step of ``jko.tau`` and the last one.

    Examples
    --------
    >>> from wflow.config import apply_overrides, default_config
    >>> save_times(apply_overrides(default_config(), ["run.t_end=1", "save.n=3"]))
    array([0. , 0.5, 1. ])
    >>> save_times(apply_overrides(default_config(), ["problem=jko", "jko.tau=0.3", "run.t_end=1", "save.n=3"]))
    array([0. , 0.6, 1.2])
    """
    if cfg["problem"] == "jko":
        tau, n_steps, every = _jko_schedule(cfg)
        return tau * np.array(sorted(set(range(0, n_steps + 1, every)) | {n_steps}), dtype=float)
    return np.linspace(0.0, cfg["run.t_end"], cfg["save.n"])


def start_run(cfg: dict[str, Any]) -> Run:
    """The objects of a configuration (model, initial state, solver arguments), validated; nothing is written.

    Examples
    --------
    >>> from wflow.config import apply_overrides, default_config
    >>> run = start_run(apply_overrides(default_config(), ["init.n=10"]))
    >>> run.describe
    'SA(beta=9), n=10, d=3, t_end=30, method=dopri5'
    """
    from .density import Density

    _check_backend(cfg["run.backend"])
    problem = cfg["problem"]
    model = build_model(cfg)
    saves = np.linspace(0.0, cfg["run.t_end"], cfg["save.n"])
    backend = cfg["run.backend"]
    if problem == "particles":
        from .solvers.particles import simulate

        _, mu0, kwargs = build_run(cfg)
        # the recorder holds every save: in memory, the diagnostics and the last points only
        kwargs["save_at"] = dataclasses.replace(kwargs["save_at"], points=False)

        def run_particles(trackers, progress, out):
            return simulate(
                model,
                mu0,
                cfg["run.t_end"],
                trackers=trackers,
                progress=progress,
                throw=False,
                **kwargs,
            )

        what = f"{model!r}, n={mu0.n}, d={mu0.d}, t_end={cfg['run.t_end']:g}, method={kwargs['method']}"
        return Run(cfg, what, run_particles)
    if problem == "lagrangian":
        from .solvers.lagrangian import solve_lagrangian

        def run_lagrangian(trackers, progress, out):
            return solve_lagrangian(
                model,
                initial_density(cfg),
                cfg["run.t_end"],
                d=cfg["init.d"],
                nodes=cfg["mesh.resolution"],
                save_at=saves,
                rtol=cfg["control.rtol"],
                atol=cfg["control.atol"],
                backend=backend,
                **_quiet(trackers, progress),
            )

        what = f"lagrangian, {model!r}, d={cfg['init.d']}, nodes={cfg['mesh.resolution']}"
        return Run(cfg, what, run_lagrangian)
    kappa = cfg["run.kappa"] or None
    if problem == "zonal":
        from .solvers.zonal import solve_zonal

        kap = cfg["init.kappa"]
        f0 = (
            (lambda z: np.exp(kap * (z - 1.0)))
            if cfg["init.zonal"] == "exp"
            else (lambda z: (z > 0).astype(float))
        )

        def run_zonal(trackers, progress, out):
            return solve_zonal(
                model,
                f0,
                cfg["run.t_end"],
                d=cfg["init.d"],
                n_cells=cfg["mesh.resolution"],
                save_at=saves,
                kappa=kappa,
                kernel=cfg["model.kernel"],
                **_quiet(trackers, progress),
            )

        what = f"zonal, {model!r}, d={cfg['init.d']}, {cfg['mesh.resolution']} bands in z"
        return Run(cfg, what, run_zonal)
    mesh = build_mesh(cfg)
    rho = Density.from_function(mesh, initial_density(cfg))
    if problem == "eulerian":
        from .solvers.eulerian import solve_density

        def run_eulerian(trackers, progress, out):
            return solve_density(
                model,
                rho,
                cfg["run.t_end"],
                save_at=saves,
                cfl=cfg["mesh.cfl"],
                kappa=kappa,
                backend=backend,
                **_quiet(trackers, progress),
            )

        return Run(cfg, f"eulerian, {model!r}, {mesh!r}", run_eulerian)
    from .solvers.jko import check_gradient_model, jko
    from .solvers.trackers import StepLog

    check_gradient_model(model, mesh.d)
    tau, n_steps, save_every = _jko_schedule(cfg)
    from .solvers.jko.stepper import check_eps, check_tau

    # what float64 cannot honour is refused before the run starts (the step checks it again)
    if cfg["jko.method"] == "sinkhorn" and cfg["jko.eps"]:
        try:
            check_eps(cfg["jko.eps"], mesh.centers, mesh.areas)
        except ValueError as err:
            raise ValueError(f"config key jko.eps: {err}") from None
    try:  # with the geodesic cost's largest value and jko's default tol
        check_tau(tau, float(np.pi) ** 2, 1e-6)
    except ValueError as err:
        raise ValueError(f"config key jko.tau: {err}") from None

    def run_jko(trackers, progress, out):
        log = [StepLog(out / STEP_LOG)] if out is not None else []
        return jko(
            model,
            rho,
            tau,
            n_steps,
            eps=cfg["jko.eps"] or None,
            kappa=kappa,
            method=cfg["jko.method"],
            backend=backend,
            save_every=save_every,
            **_quiet([*trackers, *log], progress),
        )

    return Run(cfg, f"jko, {model!r}, {mesh!r}, tau={tau:g}, {n_steps} steps", run_jko)


def resume_run(cfg: dict[str, Any], store: str | Path, out: Path | None = None) -> Run:
    """The interrupted run of ``cfg`` whose store is ``store``, continued from its last committed snapshot
    (:func:`wflow.resume`); a JKO run in the folder ``out`` appends to its step log there.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> from wflow.config import apply_overrides, default_config
    >>> from wflow.io import ZarrRecorder
    >>> cfg = apply_overrides(default_config(), ["init.n=8", "run.t_end=0.5", "save.n=3"])
    >>> store = Path(tempfile.mkdtemp()) / "t.zarr"
    >>> _ = start_run(cfg).execute([ZarrRecorder(store)], progress=False)
    >>> resume_run(cfg, store).execute([], progress=False).times.tolist()  # nothing left to do
    [0.0, 0.25, 0.5]
    """
    from .solvers.runs import resume

    store = Path(store)

    def call(trackers, progress, out_):
        if cfg["problem"] == "jko" and out is not None:
            from .solvers.trackers import StepLog

            trackers = [*trackers, StepLog(out / STEP_LOG, append=True)]
        return resume(store, progress=progress, trackers=trackers, keep=False)

    return Run(cfg, f"resuming {store}", call)
