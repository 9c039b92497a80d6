r"""Parameter sweeps: a configuration and a grid over its keys, run on Dask, recorded in one Zarr store.

A sweep is many driver runs (:func:`wflow.simulate`) scheduled by ``dask.distributed``;
it adds no time loop of its own.  The grid is a product over configuration keys
(:data:`wflow.config.KEYS`): ``{"model.beta": linspace(0.1, 9, 90), "init.seed": range(2048)}``.
Points that differ only in ``init.seed`` run as *one batched call*: their initial
conditions are stacked into one ``(systems, n, d)`` array (each system is exactly the
initial condition of the single run with that seed), in batches of at most
``batch_size`` systems.  Every other combination of values is its own task.

The store
---------
One Zarr (format 3) group, readable with ``xarray.open_zarr(out)``, whose dimensions are
the grid's keys, named by the key's last part (``beta``, ``seed``, ``d``; the full key is
in each coordinate's ``key`` attribute; a name that is ambiguous or clashes with
``xarray``'s ``sel`` keywords keeps its section, ``run_method``) and ``time`` (the save
times).  Variables:

* each observable, ``(*grid, time)``, float64, NaN where not computed;
* ``status`` (int8: 0 reached ``t_end``, 1 stopped, -1 failed, -2 not run yet),
  ``message``, ``seconds`` and ``cpu_seconds`` (wall and CPU time of the task that ran the
  point), ``worker``, per point;
* ``config`` (the flat configuration as JSON, with ``init.seed`` set to the first seed of
  the point's batch: a point's own configuration is that with its ``seed`` coordinate)
  and ``save_time`` (the times the solver saved, snapped to its step grid), per
  combination of the non-seed keys;
* attributes: ``base_config`` (JSON), ``grid``, ``observables``, ``fingerprint``.

Arrays are pre-sized when the sweep starts and chunked one task per chunk.  The client
writes a finished task's region (observables, then message and timing, then status)
and then *commits* it by atomically replacing ``wflow_sweep.json`` (the list of
finished tasks; write, ``fsync``, rename), like every wflow store: a sweep killed at any
instant never counts a half-written point as done, and running it again skips every
committed point.  Chunks carry CRC32C checksums.  One process writes a store at a time
(an OS lock next to it).

Tasks run on the workers and send their observables back to the client, which is
the only writer: workers need no shared file system (a cluster on other hosts, on
Kubernetes, on SLURM through dask-jobqueue), and a worker killed mid-task only costs
the task, which Dask runs again elsewhere.
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import math
import os
import re
import sys
import time
import tomllib
import types
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ._version import __version__
from .config import flatten, save_times
from .errors import WflowError, short_repr

__all__ = [
    "sweep",
    "parse_grid",
    "parse_grid_arg",
    "parse_grid_args",
    "parse_values",
    "load_sweep_config",
    "coerce_value",
    "open_sweep",
    "point_config",
    "SchedulerError",
    "OBSERVABLES",
    "DEFAULT_OBSERVABLES",
    "KIND_OBSERVABLES",
]

log = logging.getLogger(__name__)

FORMAT = "wflow.sweep/1"
COMMIT = "wflow_sweep.json"
BATCH_KEY = "init.seed"
#: status codes of a point (``status`` variable)
OK, STOPPED, FAILED, PENDING = 0, 1, -1, -2

#: observables a sweep can record at every save time, one number per system
OBSERVABLES: dict[str, str] = {
    "pair_fraction": "fraction of ordered token pairs with <x_i, x_j> > 0.999 (Geshkovski-Letrouit-Polyanskiy-"
    "Rigollet phase diagram)",
    "energy": "the ascended energy E_beta (gradient models; NaN otherwise)",
    "log_energy": "log E_beta (finite at any beta; gradient models)",
    "order_parameter": "|sum_i w_i x_i|",
    "n_clusters": "single-linkage clusters at run.cluster_threshold",
}
DEFAULT_OBSERVABLES = ("pair_fraction", "energy", "order_parameter", "n_clusters")
#: the observables of the continuum solvers: the scalars their snapshots hold (NaN where a run has none, e.g.
#: the energy of a model that is not a gradient flow); all of them by default
KIND_OBSERVABLES: dict[str, tuple[str, ...]] = {
    "lagrangian": ("energy",),
    "eulerian": ("mass", "energy"),
    "zonal": ("mass", "mean_z", "energy"),
    "jko": ("energy", "free_energy"),
}
_DRIVER_DIAGNOSTICS = ("energy", "log_energy", "order_parameter", "n_clusters", "pair_fraction")
#: dimension names that would clash with the store's variables or with ``Dataset.sel``'s keywords
_RESERVED = {
    "time",
    "status",
    "message",
    "seconds",
    "cpu_seconds",
    "worker",
    "config",
    "save_time",
    "method",
    "tolerance",
    "drop",
    "indexers",
}
#: bytes of initial state per task when ``batch_size`` is not given
_BATCH_BYTES = 1 << 26
#: environment of LocalCluster worker processes: one thread each for numba, BLAS and OpenMP (``threads_per_task``)
WORKER_ENV = {
    "NUMBA_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


class SchedulerError(ValueError, ConnectionError):
    """No Dask scheduler answers at the given address (bad input: the message names the address).

    Examples
    --------
    >>> from wflow.sweep import SchedulerError
    >>> issubclass(SchedulerError, ValueError), issubclass(SchedulerError, ConnectionError)
    (True, True)
    """


# ------------------------------------------------------------------------------ grids
_CALL = re.compile(r"^\s*(linspace|logspace|range)\s*\((.*)\)\s*$")


def _number(text: str, what: str) -> float | int:
    try:
        v = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError):
        v = None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{what}: {text.strip()!r} is not a number")
    return v


def _tidy(values: np.ndarray) -> list[float]:
    """Floats rounded to 12 significant digits, so that ``sel(beta=0.2)`` finds linspace's 0.2000000000000000111."""
    return [float(f"{v:.12g}") for v in values.tolist()]


def parse_values(spec: Any, key: str = "value") -> list:
    """The list of values of one grid axis.

    ``spec`` is a list (or tuple, or 1-d array), a single value, or a string: ``linspace(a, b, n)``
    (``n`` values from ``a`` to ``b``), ``logspace(a, b, n)`` (``10**a`` to ``10**b``, NumPy's
    convention), ``range(n)`` / ``range(a, b)`` / ``range(a, b, step)`` (integers), or a TOML
    value (``[1, 4, 9]``, ``4``, ``"euler"``; a bare word is a string).  Floats made by
    ``linspace``/``logspace`` are rounded to 12 significant digits.

    Examples
    --------
    >>> parse_values("linspace(0.1, 0.5, 5)")
    [0.1, 0.2, 0.3, 0.4, 0.5]
    >>> parse_values("range(2, 5)"), parse_values("logspace(0, 2, 3)"), parse_values("[1, 4]")
    ([2, 3, 4], [1.0, 10.0, 100.0], [1, 4])
    """
    what = f"grid {key}"
    if isinstance(spec, np.ndarray):
        if spec.ndim != 1:
            raise ValueError(f"{what} must be a 1-d list of values, got {short_repr(spec)}")
        spec = spec.tolist()
    if isinstance(spec, range):
        spec = list(spec)
    if isinstance(spec, (list, tuple)):
        values = [v.item() if isinstance(v, np.generic) else v for v in spec]
    elif isinstance(spec, str):
        m = _CALL.match(spec)
        if m:
            name, args = m.group(1), [a for a in m.group(2).split(",")]
            if args == [""]:
                args = []
            nums = [_number(a, f"{what}={spec}") for a in args]
            if name in ("linspace", "logspace"):
                if len(nums) != 3 or not isinstance(nums[2], int) or nums[2] < 1:
                    raise ValueError(
                        f"{what}={spec!r}: {name}(a, b, n) needs two numbers and an integer n >= 1"
                    )
                f = np.linspace if name == "linspace" else np.logspace
                values = _tidy(f(float(nums[0]), float(nums[1]), nums[2]))
            else:
                if not 1 <= len(nums) <= 3 or not all(isinstance(v, int) for v in nums):
                    raise ValueError(
                        f"{what}={spec!r}: range takes 1 to 3 integers (range(n), range(a, b), "
                        f"range(a, b, step))"
                    )
                if len(nums) == 3 and nums[2] == 0:
                    raise ValueError(f"{what}={spec!r}: range step must not be zero")
                values = list(range(*nums))
        else:
            try:
                v = tomllib.loads(f"v = {spec}")["v"]
            except tomllib.TOMLDecodeError:
                v = spec.strip()  # a bare word: a string value
            values = v if isinstance(v, list) else [v]
    elif isinstance(spec, (bool, int, float, np.generic)):
        values = [spec.item() if isinstance(spec, np.generic) else spec]
    else:
        raise ValueError(
            f"{what} must be a list, a value or linspace/logspace/range(...), got {short_repr(spec)}"
        )
    if not values:
        raise ValueError(f"{what} is empty ({short_repr(spec)}): give at least one value")
    return values


def parse_grid(spec: Mapping[str, Any]) -> dict[str, list]:
    """A grid ``key -> list of values`` from ``key -> list | str`` (:func:`parse_values`; :func:`sweep` checks keys).

    Examples
    --------
    >>> parse_grid({"model.beta": "linspace(1, 3, 3)", "init.seed": "range(2)"})
    {'model.beta': [1.0, 2.0, 3.0], 'init.seed': [0, 1]}
    """
    if not isinstance(spec, Mapping):
        raise ValueError(
            f"grid must be a mapping of configuration keys to values, got {short_repr(spec)}"
        )
    return {str(k): parse_values(v, str(k)) for k, v in spec.items()}


def parse_grid_arg(item: str) -> tuple[str, list]:
    """One ``--grid KEY=VALUES`` argument: ``"model.beta=linspace(0.1,9,90)" -> ("model.beta", [0.1, ...])``.

    Examples
    --------
    >>> parse_grid_arg("init.d=[8, 128]")
    ('init.d', [8, 128])
    """
    if not isinstance(item, str) or "=" not in item:
        raise ValueError(
            f"--grid expects KEY=VALUES (e.g. model.beta=linspace(0.1,9,90)), got {item!r}"
        )
    key, raw = (s.strip() for s in item.split("=", 1))
    if not key:
        raise ValueError(f"--grid {item!r}: no key before '='")
    return key, parse_values(raw, key)


def parse_grid_args(items: Iterable[str]) -> dict[str, list]:
    """Several ``--grid`` arguments as one grid; a key given twice is an error.

    Examples
    --------
    >>> from wflow.sweep import parse_grid_args
    >>> parse_grid_args(["model.beta=linspace(1, 2, 3)", "init.seed=range(2)"])
    {'model.beta': [1.0, 1.5, 2.0], 'init.seed': [0, 1]}
    """
    grid: dict[str, list] = {}
    for item in items:
        key, values = parse_grid_arg(item)
        if key in grid:
            raise ValueError(f"--grid {key} is given twice")
        grid[key] = values
    return grid


def coerce_value(key: str, value: Any) -> Any:
    """A value of configuration key ``key`` with its type checked (ints accepted for floats, integral floats for ints).

    Raises ``ValueError`` naming the key and the value (the sweep's rule for bad grid values).

    Examples
    --------
    >>> from wflow.sweep import coerce_value
    >>> coerce_value("model.beta", 4), coerce_value("init.n", 8.0)  # int -> float, integral float -> int
    (4.0, 8)
    >>> try:
    ...     coerce_value("init.n", 8.5)
    ... except ValueError as exc:
    ...     print(exc)
    config key init.n must be an integer, got 8.5
    """
    from .config import KEYS, coerce

    if key in KEYS and KEYS[key].type is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    try:
        return coerce(key, value)
    except TypeError as exc:
        raise ValueError(str(exc)) from None


def _known(key: str, where: str) -> None:
    from .config import KEYS

    if key not in KEYS:
        raise ValueError(f"{where}: unknown config key {key!r}; known keys: {', '.join(KEYS)}")


def _base_config(config: Mapping[str, Any]) -> dict[str, Any]:
    from .config import default_config, validate_config

    cfg = default_config()
    for key, value in config.items():
        _known(key, "config")
        cfg[key] = coerce_value(key, value)
    return validate_config(cfg)


def load_sweep_config(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, list]]:
    """A TOML configuration with a ``[sweep]`` table: ``(flat config, grid)``.

    The ``[sweep]`` table holds ``key = [values]`` or ``key = "linspace(a, b, n)"`` (dotted
    keys, or sub-tables ``[sweep.model]``); the rest is an ordinary ``wflow run`` configuration.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> from wflow.sweep import load_sweep_config
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "sweep.toml"
    >>> _ = path.write_text('''
    ... [model]
    ... beta = 2.0
    ...
    ... [sweep]
    ... "init.seed" = "range(3)"
    ... model.beta = [1.0, 4.0]
    ... ''')
    >>> config, grid = load_sweep_config(path)
    >>> config["model.beta"], grid
    (2.0, {'init.seed': [0, 1, 2], 'model.beta': [1.0, 4.0]})
    """
    from .config import read_toml

    p = Path(path)
    table = read_toml(p)
    spec = table.pop("sweep", {})
    if not isinstance(spec, dict):
        raise ValueError(
            f"config file {p}: [sweep] must be a table of key = values, got {short_repr(spec)}"
        )
    return _base_config(flatten(table)), parse_grid(flatten(spec))


# ------------------------------------------------------------------------------ the plan
@dataclass
class _Axis:
    key: str
    dim: str
    values: list


@dataclass
class _Plan:
    """Axes, tasks and the store's layout of a sweep, all checked before anything is written."""

    base: dict[str, Any]
    axes: list[_Axis]
    observables: dict[str, Callable | None]
    batch_size: int
    n_time: int
    times: np.ndarray
    fingerprint: str

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(a.values) for a in self.axes)

    @property
    def batch_axis(self) -> int | None:
        """The seed axis of a particle sweep (its seeds run as one batched call per ``batch_size``), else None."""
        keys = [a.key for a in self.axes]
        return (
            keys.index(BATCH_KEY)
            if BATCH_KEY in keys and self.base["solver"] == "particles"
            else None
        )

    def task_shape(self) -> tuple[int, ...]:
        shape = list(self.shape)
        b = self.batch_axis
        if b is not None:
            shape[b] = math.ceil(shape[b] / self.batch_size)
        return tuple(shape)

    def chunks(self) -> tuple[int, ...]:
        return tuple(self.batch_size if i == self.batch_axis else 1 for i in range(len(self.axes)))

    def region(self, task: int) -> tuple[slice, ...]:
        idx = np.unravel_index(task, self.task_shape())
        out = []
        for i, k in enumerate(idx):
            k = int(k)
            if i == self.batch_axis:
                out.append(
                    slice(k * self.batch_size, min((k + 1) * self.batch_size, self.shape[i]))
                )
            else:
                out.append(slice(k, k + 1))
        return tuple(out)

    def task_config(self, task: int) -> tuple[dict[str, Any], list[int] | None]:
        reg = self.region(task)
        cfg = dict(self.base)
        seeds = None
        for i, (ax, sl) in enumerate(zip(self.axes, reg)):
            if i == self.batch_axis:
                seeds = [int(s) for s in ax.values[sl]]
                cfg[ax.key] = seeds[0]
            else:
                cfg[ax.key] = ax.values[sl.start]
        return cfg, seeds

    @property
    def n_tasks(self) -> int:
        return int(np.prod(self.task_shape()))

    def points(self, task: int) -> int:
        return int(np.prod([s.stop - s.start for s in self.region(task)]))


def _dims(keys: Sequence[str]) -> list[str]:
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return [
        k.replace(".", "_") if (last.count(s) > 1 or s in _RESERVED) else s
        for k, s in zip(keys, last)
    ]


def _observables(observables: Any, solver: str = "particles") -> dict[str, Callable | None]:
    """``name -> None`` (built in) or ``name -> f(mu)`` (user function, one value per system; ``f(snapshot)``,
    one value, for the continuum solvers)."""
    particles = solver == "particles"
    builtin = list(OBSERVABLES) if particles else list(KIND_OBSERVABLES[solver])
    arg = "f(mu) -> one value per system" if particles else "f(snapshot) -> one value"
    if observables is None:
        observables = DEFAULT_OBSERVABLES if particles else KIND_OBSERVABLES[solver]
    if isinstance(observables, str):
        observables = (observables,)
    if isinstance(observables, Mapping):
        items = list(observables.items())
    elif isinstance(observables, Iterable):
        items = [(o, None) for o in observables]
    else:
        raise ValueError(
            f"observables must be names from {builtin} or a mapping name -> {arg.split(' ->')[0]}, got "
            f"{short_repr(observables)}"
        )
    out: dict[str, Callable | None] = {}
    for name, f in items:
        if not isinstance(name, str) or not name.isidentifier() or name in _RESERVED:
            raise ValueError(
                f"observable names must be identifiers other than {sorted(_RESERVED)}, got {name!r}"
            )
        if f is None and name not in builtin:
            raise ValueError(
                f"unknown observable {name!r}: built in for solver = {solver} are {builtin}; pass a "
                f"function as observables={{{name!r}: f}} ({arg})"
            )
        if f is not None and not callable(f):
            raise ValueError(f"observables[{name!r}] must be callable {arg}, got {short_repr(f)}")
        out[name] = f
    if not out:
        raise ValueError("observables is empty: name at least one (e.g. 'pair_fraction')")
    return out


def _plan(config: Any, grid: Any, observables: Any, batch_size: int | None) -> _Plan:
    from .config import start_run, validate_config

    if isinstance(config, (str, os.PathLike)):
        base, toml_grid = load_sweep_config(config)
    elif isinstance(config, Mapping):
        base, toml_grid = _base_config(config), {}
    else:
        raise ValueError(
            f"config must be a flat configuration dict or a TOML path, got {short_repr(config)}"
        )
    if grid is None:
        grid = {}
    spec = {**toml_grid, **parse_grid(grid)}
    if not spec:
        raise ValueError(
            "the grid is empty: give at least one key with values (grid={'model.beta': [1, 4, 9]} or "
            "a [sweep] table)"
        )
    axes: list[_Axis] = []
    for key, values in spec.items():
        _known(key, "grid")
        vals = [coerce_value(key, v) for v in values]
        if len(set(vals)) != len(vals):
            raise ValueError(
                f"grid {key} repeats a value ({short_repr(values)}): coordinates must be distinct"
            )
        axes.append(_Axis(key, "", vals))
    for ax, dim in zip(axes, _dims([a.key for a in axes])):
        ax.dim = dim
    if "solver" in [a.key for a in axes]:
        raise ValueError(
            "grid solver: a sweep runs one solver (its observables and store differ between solvers); "
            "run one sweep per solver"
        )
    solver = base["solver"]
    obs = _observables(observables, solver)
    clash = sorted(set(obs) & {a.dim for a in axes})
    if clash:
        raise ValueError(f"observables {clash} have the names of grid dimensions; rename them")
    keys = [a.key for a in axes]
    if BATCH_KEY in keys and solver == "particles":
        seeds = axes[keys.index(BATCH_KEY)].values
        if min(seeds) < 0:
            raise ValueError(f"grid init.seed must be non-negative integers, got {min(seeds)}")
        if batch_size is None:
            n = max(
                [base["init.n"]] + (axes[keys.index("init.n")].values if "init.n" in keys else [])
            )
            d = max(
                [base["init.d"]] + (axes[keys.index("init.d")].values if "init.d" in keys else [])
            )
            batch_size = max(1, _BATCH_BYTES // (8 * n * d))
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {short_repr(batch_size)}")
        batch_size = min(batch_size, len(seeds))
    else:
        batch_size = 1
    plan = _Plan(base, axes, obs, batch_size, 0, np.zeros(0), "")
    # every task's configuration is valid (the seeds checked above), before anything is written
    saves = set()
    for task in range(plan.n_tasks):
        cfg, _ = plan.task_config(task)
        try:
            validate_config(cfg)
        except (ValueError, TypeError) as exc:
            where = ", ".join(f"{a.key}={cfg[a.key]!r}" for a in axes if a.key != BATCH_KEY)
            raise ValueError(f"grid point {where}: {exc}") from None
        saves.add(tuple(save_times(cfg)))
    start_run(
        plan.task_config(0)[0]
    )  # builds the first task's model and state: backend and the like
    plan.n_time = max(len(t) for t in saves)
    plan.times = (
        np.array(next(iter(saves))) if len(saves) == 1 else np.arange(plan.n_time, dtype=float)
    )
    plan.fingerprint = _fingerprint(plan)
    return plan


def _fingerprint(plan: _Plan) -> str:
    obs = {
        k: (
            None
            if f is None
            else f"{getattr(f, '__module__', '')}.{getattr(f, '__qualname__', repr(f))}"
        )
        for k, f in plan.observables.items()
    }
    text = json.dumps(
        {
            "format": FORMAT,
            "base": plan.base,
            "grid": {a.key: a.values for a in plan.axes},
            "observables": obs,
            "batch_size": plan.batch_size,
        },
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------ one task (on a worker)
class _Collect:
    """The tracker of a sweep task: keeps the observables of every save, one value per system (no states).

    ``functions``: user observables computed here from the snapshot (continuum solvers; a particle
    run's user functions are the driver's ``extra_diagnostics``)."""

    name = "sweep"

    def __init__(
        self,
        names: Sequence[str],
        systems: int,
        n_time: int,
        functions: Mapping[str, Callable] | None = None,
    ):
        self.values = {k: np.full((systems, n_time), np.nan) for k in names}
        self.times = np.full(n_time, np.nan)
        self.steps = 0
        self.functions = dict(functions or {})

    def start(self, run) -> None:
        return None

    def save(self, snap) -> None:
        self.times[snap.index] = snap.t
        self.steps = int(snap.stats["steps"])
        for name, out in self.values.items():
            if name in self.functions:
                v = np.asarray(self.functions[name](snap), dtype=np.float64).reshape(-1)
            elif name not in snap.data:
                continue  # e.g. the energy of a model that is not a gradient flow
            else:
                v = np.asarray(snap.data[name][1], dtype=np.float64).reshape(
                    -1
                )  # a continuum run's scalars: (1,)
            if v.shape != out.shape[:1]:
                raise ValueError(
                    f"observable {name!r} must give one number per system, shape ({out.shape[0]},), "
                    f"got shape {v.shape}"
                )
            out[:, snap.index] = v

    def step(self, t, dt, step) -> None:
        return None

    def finish(self, result) -> None:
        return None


_CONTROLLER = None


def _blas_limit(threads: int):
    """BLAS and OpenMP limited to ``threads`` inside a ``with`` block (one library scan per process)."""
    global _CONTROLLER
    from threadpoolctl import ThreadpoolController

    if _CONTROLLER is None:
        _CONTROLLER = ThreadpoolController()
    return _CONTROLLER.limit(limits=threads)


def _limit_threads(threads: int) -> None:
    """numba's threads limited to ``threads`` in this process (a worker).

    A LocalCluster worker process imports the client's main module (the ``wflow`` CLI: numba among
    its imports) before the nanny sets its environment (:data:`WORKER_ENV`), so numba may have read
    another ``NUMBA_NUM_THREADS`` than the one now set.  numba re-reads its configuration whenever it
    compiles, and once its threads run a changed count there is an error ("Cannot set
    NUMBA_NUM_THREADS to a different value once the threads have been launched": every task of a
    sweep with a cold compilation cache failed so).  So: before numba's threads start, its
    configuration is re-read (the pool gets the worker's count, not the machine's); after, the
    environment is made to agree with the count it started with.  ``numba.set_num_threads`` then
    limits the threads a task uses."""
    import numba

    try:
        from numba.np.ufunc import parallel

        started = getattr(
            parallel, "_is_initialized", True
        )  # (unknown: assume started, the safe side)
    except ImportError:  # pragma: no cover - a numba without that module
        started = True
    if not started:
        numba.config.reload_config()
    elif os.environ.get("NUMBA_NUM_THREADS") != str(numba.config.NUMBA_NUM_THREADS):
        os.environ["NUMBA_NUM_THREADS"] = str(numba.config.NUMBA_NUM_THREADS)
    numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))


def _worker_name() -> str:
    try:
        from distributed import get_worker

        return str(get_worker().address)
    except Exception:  # noqa: BLE001 - not on a Dask worker
        return f"pid {os.getpid()}"


def run_task(task: dict[str, Any]) -> dict[str, Any]:
    """Run one task of a sweep (on a Dask worker): a batched :func:`wflow.simulate` call, observables only.

    Never raises for a failure of the computation: the result carries ``status`` -1 and the
    message, so one bad point does not stop the others.
    """
    t_start, c_start = time.perf_counter(), time.process_time()
    cfg, seeds, names = task["config"], task["seeds"], list(task["observables"])
    systems = 1 if seeds is None else len(seeds)
    particles = cfg["solver"] == "particles"
    coll = _Collect(
        names,
        systems,
        task["n_time"],
        None if particles else {k: f for k, f in task["observables"].items() if f is not None},
    )
    status, message = FAILED, ""
    try:
        try:
            _limit_threads(task["threads"])
        except ImportError:  # pragma: no cover - numba missing: the NumPy paths
            pass
        with _blas_limit(task["threads"]):
            if not particles:  # a continuum solver: one run, its snapshots' scalars
                from .config import start_run

                res = start_run(cfg).execute([coll], progress=False)
                return _task_result(task, coll, int(res.status), str(res.message), t_start, c_start)
            status, message, coll = _run_particles(cfg, seeds, task["observables"], task["n_time"])
    except Exception as exc:  # noqa: BLE001 - recorded with the point, the sweep goes on
        message = f"{type(exc).__name__}: {exc}"
    return _task_result(task, coll, status, message, t_start, c_start)


def _run_particles(
    cfg: dict[str, Any],
    seeds: list[int] | None,
    observables: Mapping[str, Callable | None],
    n_time: int,
) -> tuple[Any, Any, _Collect]:
    """One batched :func:`wflow.simulate` call over ``seeds`` (``None``: the configuration's own), observables
    only: ``(status, message, collected)``; a failed batch is split (:func:`_split_failed`)."""
    status, message, coll = _simulate_batch(cfg, seeds, observables, n_time)
    if status != FAILED or seeds is None or len(seeds) == 1:
        return status, message, coll
    return _split_failed(cfg, seeds, observables, n_time)


def _split_failed(
    cfg: dict[str, Any], seeds: list[int], observables: Mapping[str, Callable | None], n_time: int
) -> tuple[Any, Any, _Collect]:
    """Seeds whose batched run failed (a non-finite state, a step-size underflow, ``max_steps``: one system
    can end the run of all), run again in two halves.  When one half fails and the other does not, the
    failing half is split again, and so on down to single seeds: a rare failing system fails alone, for
    about twice the batch's work more.  When both halves fail, both are recorded as failed (a failure
    common to many systems; splitting on would cost log2(systems) times the batch).  Status and message
    are arrays, one entry per system."""
    half = len(seeds) // 2
    parts = [
        _simulate_batch(cfg, seeds[:half], observables, n_time),
        _simulate_batch(cfg, seeds[half:], observables, n_time),
    ]
    failed = [p[0] == FAILED for p in parts]
    for k, part in enumerate((seeds[:half], seeds[half:])):
        if failed[k] and not failed[1 - k] and len(part) > 1:
            parts[k] = _split_failed(cfg, part, observables, n_time)
    names = list(observables)
    out = _Collect(names, len(seeds), n_time)
    out.values = {k: np.concatenate([c.values[k] for _, _, c in parts]) for k in names}
    out.times = np.where(np.isnan(parts[0][2].times), parts[1][2].times, parts[0][2].times)
    out.steps = max(c.steps for _, _, c in parts)
    sizes = (half, len(seeds) - half)
    status = np.concatenate([np.broadcast_to(st, (m,)) for (st, _, _), m in zip(parts, sizes)])
    message = np.concatenate(
        [np.broadcast_to(np.array(msg, dtype=object), (m,)) for (_, msg, _), m in zip(parts, sizes)]
    )
    return status, message, out


def _simulate_batch(
    cfg: dict[str, Any],
    seeds: list[int] | None,
    observables: Mapping[str, Callable | None],
    n_time: int,
) -> tuple[int, str, _Collect]:
    """The systems of ``seeds`` stacked into one :func:`wflow.simulate` call (keep=False, the observables only)."""
    from .config import build_run
    from .measure import Atoms
    from .solvers.particles import simulate

    names = list(observables)
    systems = 1 if seeds is None else len(seeds)
    coll = _Collect(names, systems, n_time)
    if seeds is None:
        model, mu0, kwargs = build_run(cfg)
        x = mu0.points[None]
    else:
        x = None
        for i, s in enumerate(seeds):
            model, mu0, kwargs = build_run({**cfg, BATCH_KEY: s})
            if x is None:
                x = np.empty((systems,) + mu0.points.shape, dtype=mu0.points.dtype)
            x[i] = mu0.points
    extra = {k: f for k, f in observables.items() if f is not None}
    diagnostics = tuple(k for k in names if k in _DRIVER_DIAGNOSTICS and observables[k] is None)
    res = simulate(
        model,
        Atoms(x),
        cfg["run.t_end"],
        diagnostics=diagnostics,
        extra_diagnostics=extra,
        keep=False,
        throw=False,
        trackers=[coll],
        **kwargs,
    )
    return int(res.status), str(res.message), coll


def _task_result(
    task, coll: _Collect, status: int, message: str, t_start: float, c_start: float
) -> dict[str, Any]:
    return {
        "task": task["task"],
        "values": coll.values,
        "times": coll.times,
        "steps": coll.steps,
        "status": status,
        "message": message,
        "seconds": time.perf_counter() - t_start,
        "cpu_seconds": time.process_time() - c_start,
        "worker": _worker_name(),
    }


# ------------------------------------------------------------------------------ the store (on the client)
def _per_point(value: Any, shape: tuple[int, ...], dtype) -> np.ndarray:
    """A task's status or message over its region: one value for all its points, or one per system (a
    batch run again in parts, :func:`_run_particles`), laid along the region's seed axis."""
    v = np.asarray(value, dtype=dtype)
    return np.full(shape, v, dtype=dtype) if v.ndim == 0 else v.reshape(shape)


def _replace_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(obj, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _committed(path: Path) -> tuple[str | None, set[int]]:
    p = path / COMMIT
    if not p.exists():
        return None, set()
    try:
        rec = json.loads(p.read_text())
        return rec["fingerprint"], set(int(i) for i in rec["done"])
    except (ValueError, KeyError, TypeError) as exc:
        raise WflowError(f"{path}: unreadable commit record {COMMIT}: {exc}") from None


class _Store:
    """The sweep's Zarr group: created pre-sized, written task by task, each task committed atomically."""

    def __init__(self, path: Path, plan: _Plan):
        self.path, self.plan = path, plan
        self.done: set[int] = set()
        self.arrays: dict[str, Any] = {}
        self._pool = None

    def check(self, resume: bool, overwrite: bool) -> str:
        """What opening the store will do (``"create"``, ``"replace"`` or ``"resume"``); errors change nothing."""
        import zarr

        p = self.path
        if not p.exists():
            return "create"
        attrs = {}
        try:
            attrs = dict(zarr.open_group(p, mode="r").attrs)
        except Exception:  # noqa: BLE001 - not a Zarr group: reported below
            pass
        ours = attrs.get("wflow_format") == FORMAT
        if overwrite:
            if not ours and not (
                p.is_dir() and not any(p.iterdir())
            ):  # only an empty folder or our own store
                raise ValueError(
                    f"{p} exists and is not a wflow sweep store; refusing to overwrite it"
                )
            return "replace"
        if not ours:
            raise ValueError(f"{p} exists and is not a wflow sweep store; choose another out")
        if attrs.get("fingerprint") != self.plan.fingerprint:
            raise ValueError(
                f"{p} holds a different sweep (other configuration, grid, observables or batch size); "
                f"choose another out, or pass overwrite=True (--overwrite) to replace it"
            )
        if not resume:
            raise FileExistsError(
                f"{p} holds this sweep already; pass resume=True to finish it or overwrite=True "
                f"(--overwrite) to start afresh"
            )
        fp, _ = _committed(p)
        if fp not in (None, self.plan.fingerprint):
            raise ValueError(
                f"{p}: its commit record belongs to a different sweep; the store is damaged"
            )
        return "resume"

    def open(self, resume: bool, overwrite: bool) -> None:
        import zarr

        what = self.check(resume, overwrite)
        if what == "resume":
            _, self.done = _committed(self.path)
            group = zarr.open_group(self.path, mode="r+")
            self.arrays = {
                k: a.with_config({"write_empty_chunks": True}) for k, a in group.arrays()
            }
            return
        if what == "replace":
            import shutil

            shutil.rmtree(self.path)
        self._create()

    def _create(self) -> None:
        import zarr

        plan = self.plan
        codecs = (zarr.codecs.ZstdCodec(level=1), zarr.codecs.Crc32cCodec())
        attrs = {
            "wflow_format": FORMAT,
            "wflow_version": __version__,
            "fingerprint": plan.fingerprint,
            "base_config": json.dumps(plan.base),
            "grid": json.dumps({a.key: a.values for a in plan.axes}),
            "dims": json.dumps({a.key: a.dim for a in plan.axes}),
            "observables": list(plan.observables),
            "batch_key": BATCH_KEY,
            "batch_size": plan.batch_size,
            "status_codes": "0 reached t_end, 1 stopped, -1 failed, -2 not run yet",
        }
        group = zarr.open_group(self.path, mode="w", zarr_format=3, attributes=attrs)
        from .config import KEYS

        def array(name, shape, chunks, dtype, fill, dims, **at):
            a = group.create_array(
                name,
                shape=shape,
                chunks=chunks,
                dtype=dtype,
                fill_value=fill,
                compressors=codecs,
                dimension_names=dims,
                config={"write_empty_chunks": True},
                attributes=at,
            )
            self.arrays[name] = a
            return a

        for ax in plan.axes:
            vals = np.array(ax.values, dtype=str if isinstance(ax.values[0], str) else None)
            a = array(
                ax.dim,
                (len(vals),),
                (len(vals),),
                vals.dtype if vals.dtype.kind != "U" else str,
                "" if vals.dtype.kind == "U" else 0,
                (ax.dim,),
                key=ax.key,
                description=KEYS[ax.key].help,
            )
            a[:] = vals
        a = array(
            "time",
            (plan.n_time,),
            (plan.n_time,),
            np.float64,
            np.nan,
            ("time",),
            description="save times (nominal; save_time holds the solver's step times)",
        )
        a[:] = plan.times
        dims = tuple(a.dim for a in plan.axes)
        shape, chunks = plan.shape, plan.chunks()
        solver = plan.base["solver"]
        for name, f in plan.observables.items():
            if f is not None:
                desc = f"user observable {getattr(f, '__qualname__', name)}"
            else:
                desc = (
                    OBSERVABLES[name]
                    if solver == "particles"
                    else f"the {solver} run's {name} at each save"
                )
            array(
                name,
                shape + (plan.n_time,),
                chunks + (plan.n_time,),
                np.float64,
                np.nan,
                dims + ("time",),
                description=desc,
            )
        array("status", shape, chunks, np.int8, PENDING, dims, description=attrs["status_codes"])
        array(
            "message",
            shape,
            chunks,
            str,
            "",
            dims,
            description="the solver's message, or the error",
        )
        array(
            "seconds",
            shape,
            chunks,
            np.float64,
            np.nan,
            dims,
            description="wall time of the task (batch) that ran the point",
        )
        array(
            "cpu_seconds",
            shape,
            chunks,
            np.float64,
            np.nan,
            dims,
            description="CPU time of the worker process "
            "during the task (wall time well above it: the cores were shared)",
        )
        array(
            "worker", shape, chunks, str, "", dims, description="the Dask worker that ran the point"
        )
        task_dims = tuple(a.dim for i, a in enumerate(plan.axes) if i != plan.batch_axis)
        task_shape = tuple(len(a.values) for i, a in enumerate(plan.axes) if i != plan.batch_axis)
        ones = tuple(1 for _ in task_dims)
        array(
            "config",
            task_shape,
            ones,
            str,
            "",
            task_dims,
            description=f"flat configuration (JSON); a point's own has {BATCH_KEY} = its seed coordinate",
        )
        array(
            "save_time",
            task_shape + (plan.n_time,),
            ones + (plan.n_time,),
            np.float64,
            np.nan,
            task_dims + ("time",),
            description="times the solver saved (snapped to its step grid)",
        )
        with warnings.catch_warnings():  # consolidated metadata is not in the Zarr v3 spec (yet)
            warnings.simplefilter("ignore")
            zarr.consolidate_metadata(self.path)
        _replace_json(self.path / COMMIT, {"fingerprint": plan.fingerprint, "done": []})

    def write(self, results: Sequence[dict[str, Any]], commit: Sequence[bool]) -> None:
        """Write finished tasks' regions (in parallel), then their status, then commit them in one record."""
        plan = self.plan
        b = plan.batch_axis
        data, status = [], []
        for r in results:
            task = int(r["task"])
            reg = plan.region(task)
            shape = tuple(s.stop - s.start for s in reg)
            for name in plan.observables:  # (systems, n_time): the systems run along the batch axis
                data.append(
                    (name, reg + (slice(None),), r["values"][name].reshape(shape + (plan.n_time,)))
                )
            task_reg = tuple(s for i, s in enumerate(reg) if i != b)
            ones = tuple(1 for _ in task_reg)
            cfg, _ = plan.task_config(task)
            data += [
                ("config", task_reg, np.full(ones, json.dumps(cfg), dtype=object)),
                ("save_time", task_reg + (slice(None),), r["times"].reshape(ones + (plan.n_time,))),
                ("message", reg, _per_point(r["message"], shape, object)),
                ("seconds", reg, np.full(shape, r["seconds"])),
                ("cpu_seconds", reg, np.full(shape, r["cpu_seconds"])),
                ("worker", reg, np.full(shape, r["worker"], dtype=object)),
            ]
            status.append(("status", reg, _per_point(r["status"], shape, np.int8)))
        self._put(data)
        self._put(status)  # a point is complete once its status is written: after all its data
        new = [int(r["task"]) for r, c in zip(results, commit) if c]
        if new:
            self.done.update(new)
            _replace_json(
                self.path / COMMIT, {"fingerprint": plan.fingerprint, "done": sorted(self.done)}
            )

    def _put(self, items: list[tuple[str, tuple, np.ndarray]]) -> None:
        if len(items) <= 1:
            for name, sel, value in items:
                self.arrays[name][sel] = value
            return
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(4, thread_name_prefix="wflow-sweep-write")

        def put(item):
            name, sel, value = item
            self.arrays[name][sel] = value

        for f in [self._pool.submit(put, it) for it in items]:
            f.result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


# ------------------------------------------------------------------------------ Dask
def _cores() -> int:
    return (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )


def _connect(scheduler: Any, workers: int | None, timeout: float, threads: int = 1):
    """``(client, cluster_to_close)``: a new LocalCluster, or a client of an existing scheduler."""
    from distributed import Client, LocalCluster

    if isinstance(scheduler, Client):
        return scheduler, None, False
    if scheduler is None:
        # by default as many workers as the cores hold tasks of `threads` threads each: no oversubscription
        n = max(1, _cores() // threads) if workers is None else workers
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"workers must be an integer >= 1, got {short_repr(workers)}")
        # the dashboard on a free port (two sweeps on one host do not collide); its page needs bokeh
        cluster = LocalCluster(
            n_workers=n,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            silence_logs=logging.ERROR,
            env={k: str(threads) for k in WORKER_ENV},
        )
        return Client(cluster), cluster, True
    address = getattr(
        scheduler, "scheduler_address", scheduler
    )  # a Cluster object (dask-jobqueue, ...)
    if not isinstance(address, str):
        raise ValueError(
            f"scheduler must be None, an address like 'tcp://host:8786', a distributed.Client or a "
            f"Dask cluster, got {short_repr(scheduler)}"
        )
    try:
        return Client(address, timeout=timeout), None, True
    except Exception as exc:  # noqa: BLE001 - any failure to connect is reported with the address
        raise SchedulerError(
            f"no Dask scheduler answers at {address} within {timeout:g} s ({type(exc).__name__}); "
            f"start one (`dask scheduler`, docs: sweeps) or check the address"
        ) from None


def sweep(
    config: Mapping[str, Any] | str | os.PathLike,
    grid: Mapping[str, Any] | None = None,
    *,
    out: str | os.PathLike,
    scheduler: Any = None,
    workers: int | None = None,
    observables: Sequence[str] | Mapping[str, Callable | None] | None = None,
    resume: bool = True,
    overwrite: bool = False,
    batch_size: int | None = None,
    threads_per_task: int = 1,
    retries: int = 1,
    progress: bool = True,
    timeout: float = 10.0,
):
    r"""Run a configuration over a grid of its keys on Dask and record the observables in one Zarr store.

    Parameters
    ----------
    config : dict or path
        The base configuration: a flat dict of :data:`wflow.config.KEYS` (missing keys take
        their defaults), or a TOML file, whose ``[sweep]`` table may hold the grid.
    grid : dict, optional
        ``key -> values`` over configuration keys: a list, or ``"linspace(a, b, n)"``,
        ``"logspace(a, b, n)"``, ``"range(n)"``, ``"range(a, b)"`` (:func:`parse_values`);
        added to (and overriding) the TOML's ``[sweep]`` table.  Values of ``init.seed`` run
        as one batched call per ``batch_size`` seeds.
    out : path
        The store (a folder, conventionally ``*.zarr``).
    scheduler : str, distributed.Client or cluster, optional
        ``None``: a ``LocalCluster`` of ``workers`` processes with one thread each (numba,
        BLAS and OpenMP limited to one thread, :data:`WORKER_ENV`); ``"tcp://host:port"``: a
        running scheduler (docs: sweeps); a ``Client`` or a cluster object (dask-jobqueue).
    workers : int, optional
        Worker processes of the LocalCluster (default: the usable cores over ``threads_per_task``).
    observables : sequence of str or dict, optional
        Recorded at every save time, one number per system: names from :data:`OBSERVABLES`
        and/or ``name -> f(mu)`` (an :class:`~wflow.measure.Atoms` with a batch axis ->
        array, shape ``(systems,)``); default :data:`DEFAULT_OBSERVABLES`.  For the continuum
        solvers (``solver`` = ``eulerian``, ``lagrangian``, ``zonal``, ``jko``: one run per point)
        the names of :data:`KIND_OBSERVABLES` (the scalars their snapshots hold; all of them by
        default) and/or ``name -> f(snapshot)`` (the save's
        :class:`~wflow.solvers.base.Snapshot`: ``snapshot.data[name] = (dims, array)``, e.g. the
        cell densities ``snapshot.data["values"][1]`` of ``eulerian``) -> one number.  States are
        not stored.
    resume : bool
        Continue a store of the same sweep, skipping its committed points (default).
    overwrite : bool
        Replace an existing sweep store.
    batch_size : int, optional
        Seeds per task (default: as many as keep a task's state near 64 MB).
    threads_per_task : int
        numba/BLAS threads of a task (1: parallelism comes from workers).
    retries : int
        Dask retries of a task whose worker raised (a killed worker's task is always rerun).
    progress : bool
        A progress bar over points (and the dashboard's address when there is one).
    timeout : float
        Seconds to wait for a scheduler at ``scheduler``.

    Returns
    -------
    xarray.Dataset
        The store, opened lazily (:func:`open_sweep`).

    Raises
    ------
    ValueError
        Before anything is written: an unknown key, an empty grid, a value of the wrong type,
        an invalid combination (naming the point), a store holding a different sweep, a
        scheduler that does not answer (:class:`SchedulerError`).

    Examples
    --------
    >>> import tempfile, pathlib
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "s.zarr"
    >>> cfg = {"init.n": 8, "init.d": 3, "run.t_end": 1.0, "run.n_saves": 3, "run.method": "euler",
    ...        "run.dt": 0.1}
    >>> ds = sweep(cfg, {"model.beta": [1, 4]}, out=out, workers=1, progress=False,
    ...            observables=["order_parameter"])  # doctest: +SKIP
    >>> ds.order_parameter.sel(beta=4.0).shape  # doctest: +SKIP
    (3,)
    """
    plan = _plan(config, grid, observables, batch_size)
    if (
        isinstance(threads_per_task, bool)
        or not isinstance(threads_per_task, int)
        or threads_per_task < 1
    ):
        raise ValueError(
            f"threads_per_task must be an integer >= 1, got {short_repr(threads_per_task)}"
        )
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries must be an integer >= 0, got {short_repr(retries)}")
    out = Path(out)
    from .io import FolderLock

    _Store(out, plan).check(
        resume, overwrite
    )  # a store of another sweep: before any cluster starts
    client, cluster, owned = _connect(
        scheduler, workers, timeout, threads_per_task
    )  # before anything is written
    lock = None
    try:
        lock = FolderLock(out.with_name(out.name + ".lock"), f"sweep store {out}").acquire()
        store = _Store(out, plan)
        store.open(resume, overwrite)
        todo = [t for t in range(plan.n_tasks) if t not in store.done]
        _run(client, plan, store, todo, threads_per_task, retries, progress)
    finally:
        if owned:
            client.close()
        if cluster is not None:
            cluster.close()
        if lock is not None:
            lock.release()
    return open_sweep(out)


def _has_bokeh() -> bool:
    try:
        import bokeh  # noqa: F401 - the dashboard's pages need it

        return True
    except ImportError:
        return False


def _run(
    client, plan: _Plan, store: _Store, todo: list[int], threads: int, retries: int, progress: bool
) -> None:
    from distributed import as_completed
    from tqdm.auto import tqdm

    if not todo:
        log.info("%s: every point is committed", store.path)
        return
    total = sum(plan.points(t) for t in todo)
    if progress and "dashboard" in client.scheduler_info().get("services", {}) and _has_bokeh():
        print(f"wflow sweep: Dask dashboard at {client.dashboard_link}", file=sys.stderr)
    obs = plan.observables
    futures = []
    for t in todo:
        cfg, seeds = plan.task_config(t)
        spec = {
            "task": t,
            "config": cfg,
            "seeds": seeds,
            "observables": obs,
            "n_time": plan.n_time,
            "threads": threads,
        }
        futures.append(
            client.submit(
                run_task,
                spec,
                key=f"wflow-sweep-{plan.fingerprint}-{t}",
                pure=False,
                retries=retries,
            )
        )
    failed = 0
    bar = tqdm(total=total, unit="point", desc="sweep", disable=not progress, dynamic_ncols=True)
    try:
        done_iter = as_completed(futures)
        for batch in done_iter.batches():
            # a future whose worker died after it finished is back to pending (Dask recomputes its lost
            # result): wait for it again instead of recording it as failed
            states = [(f, f.status) for f in batch]  # read once: a status can change while we look
            for f, st in states:
                if st in ("pending", "lost"):
                    done_iter.add(f)
            states = [(f, st) for f, st in states if st not in ("pending", "lost")]
            batch = [f for f, _ in states]
            if not batch:
                continue
            finished = [f for f, st in states if st == "finished"]
            results = client.gather(finished) if finished else []
            commit = [True] * len(results)
            for fut, st in states:
                if st == "finished":
                    continue
                # the cluster could not run it (e.g. KilledWorker after repeated deaths): recorded, not committed
                t = int(str(fut.key).rsplit("-", 1)[1])
                try:
                    exc = fut.exception()
                except BaseException as e:  # noqa: BLE001 - a cancelled future raises
                    exc = e
                results.append(
                    {
                        "task": t,
                        "values": {k: np.full((plan.points(t), plan.n_time), np.nan) for k in obs},
                        "times": np.full(plan.n_time, np.nan),
                        "status": FAILED,
                        "steps": 0,
                        "seconds": math.nan,
                        "cpu_seconds": math.nan,
                        "worker": "",
                        "message": f"{type(exc).__name__}: {exc} (not committed: run the sweep again to "
                        f"retry)",
                    }
                )
                commit.append(False)
            store.write(results, commit)
            for fut in batch:
                fut.release()
            failed += sum(bool(np.any(np.asarray(r["status"]) < 0)) for r in results)
            bar.update(sum(plan.points(r["task"]) for r in results))
            if failed:
                bar.set_postfix_str(f"failed tasks {failed}")
    finally:
        bar.close()
        store.close()
        for f in futures:
            if not f.done():
                f.cancel()


# ------------------------------------------------------------------------------ reading
def open_sweep(path: str | os.PathLike):
    """The store of a sweep as a lazy :class:`xarray.Dataset` (``ds.sel(beta=4.0)``).

    ``attrs`` count the ``points``, those ``done`` (run, whatever their status), ``ok``
    (reached ``t_end``) and ``failed``.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> import wflow
    >>> from wflow.sweep import open_sweep
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "s.zarr"
    >>> cfg = {"init.n": 8, "init.d": 3, "run.t_end": 1.0, "run.n_saves": 3, "run.method": "euler", "run.dt": 0.1}
    >>> _ = wflow.sweep(cfg, {"model.beta": [1, 4]}, out=out, workers=1, progress=False)  # doctest: +SKIP
    >>> ds = open_sweep(out)  # doctest: +SKIP
    >>> ds.attrs["points"], ds.attrs["ok"], ds.order_parameter.sel(beta=4.0).shape  # doctest: +SKIP
    (2, 2, (3,))

    Not run as a doctest: a sweep starts a Dask cluster (seconds).
    """
    import xarray as xr
    import zarr

    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no sweep store at {p}")
    attrs = dict(zarr.open_group(p, mode="r").attrs)
    if attrs.get("wflow_format") != FORMAT:
        raise WflowError(
            f"{p} is not a wflow sweep store (wflow_format={attrs.get('wflow_format')!r})"
        )
    ds = xr.open_zarr(p, consolidated=True)
    status = np.asarray(
        zarr.open_array(p / "status", mode="r")[...]
    )  # read here, not on a Dask cluster
    ds.attrs["points"] = int(status.size)
    ds.attrs["done"] = int(np.count_nonzero(status != PENDING))
    ds.attrs["ok"] = int(np.count_nonzero(status == OK))
    ds.attrs["failed"] = int(np.count_nonzero(status == FAILED))
    return ds


def point_config(ds, **coords) -> dict[str, Any]:
    """The full flat configuration of one point of a sweep: ``point_config(ds, beta=4.0, seed=3)``.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> import wflow
    >>> from wflow.sweep import point_config
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "s.zarr"
    >>> cfg = {"init.n": 8, "init.d": 3, "run.t_end": 1.0, "run.n_saves": 3, "run.method": "euler", "run.dt": 0.1}
    >>> ds = wflow.sweep(cfg, {"model.beta": [1, 4]}, out=out, workers=1, progress=False)  # doctest: +SKIP
    >>> c = point_config(ds, beta=4.0)  # doctest: +SKIP
    >>> c["model.beta"], c["init.n"]  # doctest: +SKIP
    (4.0, 8)

    Not run as a doctest: a sweep starts a Dask cluster (seconds).
    """
    dims = json.loads(ds.attrs["dims"])
    key_of = {v: k for k, v in dims.items()}
    unknown = set(coords) - set(key_of)
    if unknown:
        raise ValueError(
            f"point_config: {sorted(unknown)} are not dimensions of this sweep ({sorted(key_of)})"
        )
    missing = set(key_of) - set(coords)
    if missing:
        raise ValueError(
            f"point_config: give a value for every dimension; missing {sorted(missing)}"
        )
    task = {
        k: v for k, v in coords.items() if k in ds["config"].dims
    }  # (a batched seed axis is not one)
    cfg = json.loads(str(ds["config"].sel(task).values))
    for dim, v in coords.items():
        cfg[key_of[dim]] = v.item() if isinstance(v, np.generic) else v
    return cfg


class _CallableModule(types.ModuleType):
    """``wflow.sweep(...)`` calls :func:`sweep` while ``wflow.sweep.parse_grid`` and the rest stay reachable."""

    def __call__(self, *args, **kwargs):
        return sweep(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
