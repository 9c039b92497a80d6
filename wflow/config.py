"""Run configuration for ``wflow run``: a flat table of documented, typed keys.

A config is TOML with sections (``[model]``, ``[init]``, ``[run]``, ...); on the
command line a key is written with a dot, ``--set model.beta=4``.  Unknown keys and
wrong types are rejected with the key and the value received.  The objects a
configuration describes are built by :mod:`wflow.build` (importable from here as well).
"""

from __future__ import annotations

import tomllib
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .build import (  # the objects built from a configuration, importable from here as before
    STEP_LOG,
    Run,
    build_mesh,  # noqa: F401
    build_model,  # noqa: F401
    build_run,
    initial_density,  # noqa: F401
    resume_run,
    save_times,
    start_run,
)
from .errors import did_you_mean, short_repr

__all__ = [
    "resume_run",
    "STEP_LOG",
    "KEYS",
    "RENAMED",
    "current_key",
    "current_config",
    "default_config",
    "load_config",
    "apply_overrides",
    "validate_config",
    "to_toml",
    "build_run",
    "save_times",
    "start_run",
    "Run",
]


@dataclass(frozen=True)
class Key:
    type: type
    default: Any
    help: str
    choices: tuple[str, ...] | None = None


KEYS: dict[str, Key] = {
    "problem": Key(
        str,
        "particles",
        "what is solved: particles (the finite-N system), or the density by eulerian (finite volume), "
        "lagrangian (characteristics), jko (implicit Wasserstein steps) or zonal (densities of <x, e>, "
        "any init.d); run.method is the time stepper",
        ("particles", "eulerian", "lagrangian", "jko", "zonal"),
    ),
    "mesh.resolution": Key(
        int,
        512,
        "eulerian: cells on S^1 (d=2), or icosahedral refinement on S^2 (d=3, "
        "about 10 r^2 cells); lagrangian: trapezoid nodes on S^1 or Gauss latitudes on S^2",
    ),
    "mesh.cfl": Key(float, 0.4, "eulerian: fraction of the positivity (CFL) step limit"),
    "jko.tau": Key(float, 0.05, "jko: time step tau (run.t_end / tau steps)"),
    "jko.eps": Key(
        float, 0.0, "jko: entropic regularization epsilon; 0: the solver's default (2 h^2)"
    ),
    "jko.method": Key(str, "sinkhorn", "jko: transport solver", ("sinkhorn", "emd")),
    "model.type": Key(
        str, "SA", "attention block: SA (softmax) or USA (unnormalized)", ("SA", "USA")
    ),
    "model.beta": Key(float, 9.0, "inverse temperature beta >= 0"),
    "model.value": Key(
        str,
        "identity",
        "value matrix V: identity (attraction) or minus-identity (repulsion)",
        ("identity", "minus-identity"),
    ),
    "model.kernel": Key(
        str,
        "plain",
        "kernel convention: e^(beta<x,y>) or e^(beta(<x,y>-1)) (rescaled: USA at "
        "large beta, a time change t' = e^beta t)",
        ("plain", "rescaled"),
    ),
    "model.gamma": Key(float, 0.0, "long context: beta = gamma log n on n tokens (0: model.beta)"),
    "model.scheme": Key(
        str,
        "post-ln",
        "normalization scheme (pre-ln, peri-ln, mix-ln carry radii: particles only)",
        ("post-ln", "pre-ln", "peri-ln", "mix-ln", "ngpt", "sqrt"),
    ),
    "model.tau": Key(float, 1.0, "mix-ln: the switch time from Post-LN to Pre-LN"),
    "model.alpha": Key(float, 1.0, "ngpt: the step alpha"),
    "model.layers": Key(
        int,
        0,
        "layer-dependent weights: this many layers of random Q, K, V (N(0, 1/d) entries, "
        "seed perceptron.seed), one per model.period (0: Q = K = I)",
    ),
    "model.period": Key(float, 1.0, "depth of one layer (model.layers or model.weights)"),
    "model.weights": Key(
        str,
        "",
        "layer-dependent weights from an .npz file: arrays Q, K, V of shape (L, d, d) "
        "(and beta of shape (L,)), one layer per model.period",
    ),
    "perceptron.m": Key(
        int, 0, "hidden width m of a perceptron block added to the model (0: no perceptron)"
    ),
    "perceptron.activation": Key(
        str, "relu", "perceptron activation", ("relu", "gelu", "tanh", "identity")
    ),
    "perceptron.conservative": Key(
        bool, True, "W = A^T diag(omega) (a gradient flow) instead of a general W"
    ),
    "perceptron.scale": Key(
        float, 1.0, "entries of A, W, b are N(0, scale^2 / m) (omega ~ N(0, scale^2))"
    ),
    "perceptron.seed": Key(int, 0, "seed of the perceptron's random weights"),
    "init.kind": Key(
        str,
        "uniform",
        "initial tokens: uniform on the sphere, or a von Mises-Fisher mixture",
        ("uniform", "vmf-mixture"),
    ),
    "init.n": Key(int, 2000, "number of tokens n"),
    "init.d": Key(int, 3, "ambient dimension d (tokens on S^{d-1})"),
    "init.seed": Key(int, 0, "seed of the initial tokens"),
    "init.components": Key(int, 3, "vmf-mixture: number of components (random mean directions)"),
    "init.kappa": Key(float, 10.0, "vmf-mixture: concentration of each component"),
    "init.zonal": Key(
        str,
        "exp",
        "zonal: initial density of z = <x, e>: exp (e^(init.kappa z)) or hemisphere "
        "(uniform on z > 0)",
        ("exp", "hemisphere"),
    ),
    "init.perturbation": Key(
        float,
        0.01,
        "eulerian/lagrangian with init.kind=uniform: the density is "
        "(1-p) + p * (vMF-mixture density), p = init.perturbation",
    ),
    "run.t_end": Key(float, 30.0, "final time (depth)"),
    "run.method": Key(
        str,
        "auto",
        "time stepper (auto: error-controlled dopri5, rk4 when run.dt is set, euler-maruyama "
        "with noise -- the library's rule; euler-average: GLPR's unprojected phase-diagram "
        "scheme; ros2: L-stable Rosenbrock, particles with coordinates angles or gaps)",
        ("auto", "dopri5", "rk4", "euler", "euler-average", "euler-maruyama", "ros2"),
    ),
    "run.dt": Key(
        float,
        0.0,
        "fixed step (rk4, euler, euler-maruyama; with method auto it selects rk4) or first "
        "trial step (dopri5); 0: default",
    ),
    "run.kappa": Key(
        float, 0.0, "noise: diffusion kappa^{-1} Laplacian (needs method euler-maruyama); 0: none"
    ),
    "run.seed": Key(int, 0, "seed of the noise"),
    "run.backend": Key(str, "auto", "kernel-sum backend (auto, numpy, keops, ...)"),
    "run.coordinates": Key(
        str,
        "auto",
        "particles: the state's coordinates (auto: span where it is exact and smaller, else "
        "cartesian; span: the n coordinates of the initial tokens' span, exact for SA/USA with "
        "Q = K = V = I, d > n, no noise; angles, gaps: S^1)",
        ("auto", "cartesian", "span", "angles", "gaps"),
    ),
    "save.n": Key(int, 31, "number of snapshots saved, equally spaced in [0, run.t_end]"),
    "save.cluster_threshold": Key(
        float, 0.1, "geodesic linkage distance of the n_clusters diagnostic"
    ),
    "control.rtol": Key(float, 1e-6, "relative tolerance of error-controlled steps (dopri5)"),
    "control.atol": Key(float, 1e-9, "absolute tolerance of error-controlled steps (dopri5)"),
    "output.figure": Key(bool, True, "write summary.png"),
    "output.animation": Key(
        bool, False, "write animation.gif (one frame per save; particles on S^1/S^2, densities)"
    ),
}


#: configuration keys of earlier releases and their names now: accepted, with a DeprecationWarning, for
#: one release (saving and step control are grouped as in :func:`wflow.simulate`: ``SaveAt``, ``StepControl``;
#: ``solver`` named the kind of problem, not the time stepper ``run.method``)
RENAMED = {
    "solver": "problem",
    "run.n_saves": "save.n",
    "run.cluster_threshold": "save.cluster_threshold",
    "run.rtol": "control.rtol",
    "run.atol": "control.atol",
}


def current_key(key: str) -> str:
    """``key``'s name now: itself, or for a key of an earlier release (:data:`RENAMED`) its new name, with a
    ``DeprecationWarning`` naming it.

    Examples
    --------
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as w:
    ...     warnings.simplefilter("always")
    ...     current_key("run.n_saves"), current_key("model.beta"), str(w[0].message)
    ('save.n', 'model.beta', 'config key run.n_saves is deprecated; use save.n')
    """
    new = RENAMED.get(key)
    if new is None:
        return key
    warnings.warn(f"config key {key} is deprecated; use {new}", DeprecationWarning, stacklevel=3)
    return new


def current_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """A configuration that wflow stored (a run folder's store, a sweep store) with every key under its
    name now (:data:`RENAMED`), silently: a store written by an earlier release reads and resumes as it was.

    Examples
    --------
    >>> current_config({"solver": "jko", "run.n_saves": 5})
    {'problem': 'jko', 'save.n': 5}
    """
    return {RENAMED.get(k, k): v for k, v in cfg.items()}


def default_config() -> dict[str, Any]:
    """The embedded default: SA on S^2, 2000 uniform tokens, beta = 9, t_end = 30.

    Examples
    --------
    >>> cfg = default_config()
    >>> cfg["problem"], cfg["model.beta"], cfg["init.n"], cfg["init.d"]
    ('particles', 9.0, 2000, 3)
    """
    return {k: v.default for k, v in KEYS.items()}


def flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A TOML table with sections as flat ``section.key`` keys."""
    out: dict[str, Any] = {}
    for k, v in table.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def coerce(key: str, value: Any) -> Any:
    """``value`` as configuration key ``key`` takes it (unknown keys, wrong types and choices are errors)."""
    key = current_key(key)
    if key not in KEYS:
        raise ValueError(
            f"unknown config key {key!r}{did_you_mean(key, KEYS)}; known keys: {', '.join(KEYS)}"
        )
    spec = KEYS[key]
    if spec.type is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if spec.type is bool and not isinstance(value, bool):
        raise TypeError(f"config key {key} must be true or false, got {short_repr(value)}")
    if spec.type is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise TypeError(f"config key {key} must be an integer, got {short_repr(value)}")
    if not isinstance(value, spec.type):
        raise TypeError(
            f"config key {key} must be of type {spec.type.__name__}, got {short_repr(value)}"
        )
    if spec.choices is not None and value not in spec.choices:
        raise ValueError(
            f"config key {key} must be one of {list(spec.choices)}, got {value!r}"
            + did_you_mean(value, spec.choices)
        )
    return value


def read_toml(path: str | Path) -> dict[str, Any]:
    """The table of a TOML file; one-line errors for a missing file or invalid TOML."""
    from .io.paths import read_regular

    p = Path(path)
    if p.is_dir():
        raise ValueError(f"config file {p} is a folder, not a TOML file")
    try:
        data = read_regular(p)  # a FIFO or device is refused, never waited on
        if data is None:
            raise FileNotFoundError(f"config file not found: {p}")
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"config file {p} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset "
            f"{exc.start}): TOML files are UTF-8"
        ) from None
    except OSError as exc:
        raise ValueError(f"config file {p} cannot be read ({exc.strerror or exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"config file {p} is not valid TOML: {exc}") from None


def load_config(path: str | Path | None) -> dict[str, Any]:
    """Defaults updated by a TOML file (if given); validated.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "run.toml"
    >>> _ = path.write_text("[model]\\nbeta = 4.0\\n")
    >>> load_config(path)["model.beta"], load_config(None)["model.beta"]
    (4.0, 9.0)
    """
    cfg = default_config()
    if path is not None:
        for key, value in flatten(read_toml(path)).items():
            key = current_key(key)
            cfg[key] = coerce(key, value)
    return validate_config(cfg)


def apply_overrides(cfg: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key=value`` strings (values in TOML syntax; bare words are strings).

    Examples
    --------
    >>> cfg = apply_overrides(default_config(), ["model.beta=4", "init.n=100"])
    >>> cfg["model.beta"], cfg["init.n"]
    (4.0, 100)
    >>> apply_overrides(cfg, ["model.beta=-1"])
    Traceback (most recent call last):
    ...
    ValueError: config key model.beta must be a finite number >= 0, got -1.0
    """
    cfg = dict(cfg)
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"--set expects key=value, got {item!r}")
        key, raw = (s.strip() for s in item.split("=", 1))
        key = current_key(key)
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        cfg[key] = coerce(key, value)
    return validate_config(cfg)


def validate_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """Range checks that do not depend on types alone.

    Examples
    --------
    >>> validate_config(default_config())["run.t_end"]
    30.0
    """
    _check_ranges(cfg)
    _check_problem(cfg)
    return cfg


def _need(cfg: dict[str, Any], cond: bool, key: str, what: str) -> None:
    """ValueError naming ``key``, what it must be and the value received, unless ``cond``."""
    if not cond:
        raise ValueError(f"config key {key} must be {what}, got {cfg[key]!r}")


def _check_ranges(cfg: dict[str, Any]) -> None:
    """The values' ranges (and the weights file, the schemes with radii, USA's integrability)."""
    for key in ("model.beta", "run.dt", "run.kappa", "jko.eps", "model.gamma", "model.tau"):
        _need(cfg, np.isfinite(cfg[key]) and cfg[key] >= 0, key, "a finite number >= 0")
    for key in ("model.alpha", "model.period"):
        _need(cfg, np.isfinite(cfg[key]) and cfg[key] > 0, key, "a finite number > 0")
    _need(cfg, cfg["model.layers"] >= 0, "model.layers", "an integer >= 0")
    if cfg["model.weights"]:
        _need(cfg, Path(cfg["model.weights"]).is_file(), "model.weights", "an existing .npz file")
    if cfg["model.scheme"] in ("pre-ln", "peri-ln", "mix-ln"):
        what = f"post-ln, ngpt or sqrt for problem {cfg['problem']!r} ({cfg['model.scheme']} carries radii: particles only)"
        _need(cfg, cfg["problem"] == "particles", "model.scheme", what)
    for key in (
        "run.t_end",
        "control.rtol",
        "control.atol",
        "save.cluster_threshold",
        "init.kappa",
        "perceptron.scale",
        "mesh.cfl",
        "jko.tau",
    ):
        _need(cfg, np.isfinite(cfg[key]) and cfg[key] > 0, key, "a finite number > 0")
    what = ">= 1e-15 (below double-precision rounding nothing can be resolved)"
    _need(cfg, cfg["control.rtol"] >= 1e-15, "control.rtol", what)
    what = (
        "<= 1e8 (a von Mises-Fisher concentration beyond that is a "
        "point mass at double precision: use fewer components or init.kind=uniform)"
    )
    _need(cfg, cfg["init.kappa"] <= 1e8, "init.kappa", what)
    if cfg["model.type"] == "USA" and cfg["model.gamma"] == 0:  # the model owns the rule
        from .models import USA

        why = USA.integrable(cfg["model.beta"], cfg["model.kernel"])
        if why is not None:
            raise ValueError(f"config key model.beta = {cfg['model.beta']!r}: {why}")
    for key, lo in (
        ("init.n", 1),
        ("init.d", 2),
        ("save.n", 2),
        ("init.components", 1),
        ("perceptron.m", 0),
    ):
        _need(cfg, cfg[key] >= lo, key, f"an integer >= {lo}")
    for key in ("init.seed", "run.seed", "perceptron.seed"):
        _need(cfg, cfg[key] >= 0, key, "a non-negative integer")
    _need(cfg, 0 <= cfg["init.perturbation"] <= 1, "init.perturbation", "a number in [0, 1]")
    _need(cfg, cfg["mesh.resolution"] >= 4, "mesh.resolution", "an integer >= 4")
    _need(cfg, cfg["mesh.cfl"] <= 1, "mesh.cfl", "in (0, 1]")


def _check_problem(cfg: dict[str, Any]) -> None:
    """What each kind of problem admits: the keys the zonal solver leaves at their defaults, the dimensions,
    schemes, methods and coordinates of the continuum solvers, noise only with euler-maruyama."""
    problem, method = cfg["problem"], cfg["run.method"]
    if problem == "zonal":
        for key, default in (
            ("model.scheme", "post-ln"),
            ("model.layers", 0),
            ("model.weights", ""),
            ("perceptron.m", 0),
            ("model.gamma", 0.0),
        ):
            what = f"left at {default!r} for the zonal solver (Q = K = V = +-I attention)"
            _need(cfg, cfg[key] == default, key, what)
    elif problem != "particles":
        _need(
            cfg, cfg["init.d"] in (2, 3), "init.d", f"2 or 3 for problem {problem!r} (S^1 or S^2)"
        )
        if problem == "jko":
            what = "post-ln for the jko solver (a Wasserstein gradient flow)"
            _need(cfg, cfg["model.scheme"] == "post-ln", "model.scheme", what)
        if problem in ("eulerian", "jko"):
            what = f"left at its default for the {problem} solver (it has its own time stepping)"
            _need(cfg, method in ("auto", "dopri5", "rk4"), "run.method", what)
        if cfg["run.kappa"] > 0 and problem == "lagrangian":
            raise ValueError(
                "config key run.kappa must be 0 for the lagrangian solver (characteristics carry no noise)"
            )
    if problem != "particles":
        what = f"auto or cartesian for the {problem} solver (other coordinates are for particles)"
        _need(cfg, cfg["run.coordinates"] in ("auto", "cartesian"), "run.coordinates", what)
        what = f"one of dopri5, rk4, euler, euler-maruyama for the {problem} solver"
        _need(cfg, method not in ("euler-average", "ros2"), "run.method", what)
    noise = cfg["run.kappa"] > 0
    if problem == "particles" and method != "auto" and noise != (method == "euler-maruyama"):
        raise ValueError(
            f"run.kappa = {cfg['run.kappa']!r} and run.method = {method!r} do not fit: "
            f"noise (kappa > 0) goes with method euler-maruyama and only with it"
        )


def to_toml(cfg: dict[str, Any]) -> str:
    """Write a flat config back as TOML with sections.

    Examples
    --------
    >>> print("\\n".join(to_toml(default_config()).splitlines()[:4]))
    problem = "particles"
    <BLANKLINE>
    [mesh]
    resolution = 512
    """
    lines: list[str] = []
    sections: dict[str, list[str]] = {}
    for key, value in cfg.items():
        v = (
            ("true" if value else "false")
            if isinstance(value, bool)
            else (f'"{value}"' if isinstance(value, str) else repr(value))
        )
        if "." in key:
            sec, name = key.split(".", 1)
            sections.setdefault(sec, []).append(f"{name} = {v}")
        else:
            lines.append(f"{key} = {v}")
    for sec, body in sections.items():
        lines += ["", f"[{sec}]", *body]
    return "\n".join(lines) + "\n"
