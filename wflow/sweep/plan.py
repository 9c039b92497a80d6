"""The plan of a sweep: its axes, observables and tasks (seeds batched), and the store's layout.

:func:`make_plan` checks everything a sweep is given before anything is written or any cluster
starts; a :class:`Plan` maps task numbers to configurations and to regions of the store.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import save_times
from ..errors import short_repr
from .grid import base_config, check_key, coerce_value, current_key, load_sweep_config, parse_grid

__all__ = [
    "FORMAT",
    "BATCH_KEY",
    "OK",
    "STOPPED",
    "FAILED",
    "PENDING",
    "OBSERVABLES",
    "DEFAULT_OBSERVABLES",
    "KIND_OBSERVABLES",
    "DRIVER_DIAGNOSTICS",
    "Axis",
    "Plan",
    "make_plan",
    "grid_difference",
]

#: the ``wflow_format`` attribute of a sweep store (part of every sweep's fingerprint)
FORMAT = "wflow.sweep/1"
#: the key whose values run as one batched call (particle sweeps)
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
    "n_clusters": "single-linkage clusters at save.cluster_threshold",
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
DRIVER_DIAGNOSTICS = ("energy", "log_energy", "order_parameter", "n_clusters", "pair_fraction")
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


@dataclass
class Axis:
    """One axis of the grid: its configuration key, its dimension name in the store, its values."""

    key: str
    dim: str
    values: list


@dataclass
class Plan:
    """Axes, tasks and the store's layout of a sweep, all checked before anything is written."""

    base: dict[str, Any]
    axes: list[Axis]
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
            if BATCH_KEY in keys and self.base["problem"] == "particles"
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
        for i, ki in enumerate(idx):
            k = int(ki)
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

    def point_mask(self, tasks: Iterable[int]) -> np.ndarray:
        """The points of ``tasks``: bool, shape :attr:`shape` (task numbers outside the plan are ignored).

        Examples
        --------
        >>> from wflow.sweep.plan import make_plan
        >>> plan = make_plan({"init.n": 8, "init.d": 3, "run.backend": "numpy"},
        ...                  {"model.beta": [1.0, 4.0], "init.seed": "range(5)"}, ["order_parameter"], 2)
        >>> plan.point_mask([1, 5]).astype(int)  # task 1: beta 1, seeds 2 and 3; task 5: beta 4, seed 4
        array([[0, 0, 1, 1, 0],
               [0, 0, 0, 0, 1]])
        """
        mask = np.zeros(self.task_shape(), dtype=bool)
        idx = np.fromiter(tasks, dtype=np.int64)
        mask.flat[idx[(idx >= 0) & (idx < mask.size)]] = True
        b = self.batch_axis
        if b is not None:  # a task holds batch_size seeds along the seed axis
            mask = np.repeat(mask, self.batch_size, axis=b).take(range(self.shape[b]), axis=b)
        return mask

    def in_layout(self, grid: Mapping[str, list]) -> Plan:
        """This plan with its axes and their values in the order of ``grid`` (a store's), which holds the
        same points (:func:`grid_difference` is None): task numbers and regions then are the store's."""
        by_key = {a.key: a for a in self.axes}
        axes = []
        for key, stored in grid.items():
            ax = by_key[key]
            rank = {v: i for i, v in enumerate(stored)}
            axes.append(Axis(key, ax.dim, sorted(ax.values, key=rank.__getitem__)))
        plan = dataclasses.replace(self, axes=axes)
        plan.fingerprint = _fingerprint(plan)
        return plan

    def store_bytes(self) -> int:
        """About how many bytes the store's observables take (float64, uncompressed), for the disk check."""
        return int(
            np.prod(self.shape, dtype=float) * self.n_time * max(1, len(self.observables)) * 8
        )


def _dims(keys: Sequence[str]) -> list[str]:
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return [
        k.replace(".", "_") if (last.count(s) > 1 or s in _RESERVED) else s
        for k, s in zip(keys, last)
    ]


def _observables(observables: Any, problem: str = "particles") -> dict[str, Callable | None]:
    """``name -> None`` (built in) or ``name -> f(mu)`` (user function, one value per system; ``f(snapshot)``,
    one value, for the continuum problems)."""
    particles = problem == "particles"
    builtin = list(OBSERVABLES) if particles else list(KIND_OBSERVABLES[problem])
    arg = "f(mu) -> one value per system" if particles else "f(snapshot) -> one value"
    if observables is None:
        observables = DEFAULT_OBSERVABLES if particles else KIND_OBSERVABLES[problem]
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
                f"unknown observable {name!r}: built in for problem = {problem} are {builtin}; pass a "
                f"function as observables={{{name!r}: f}} ({arg})"
            )
        if f is not None and not callable(f):
            raise ValueError(f"observables[{name!r}] must be callable {arg}, got {short_repr(f)}")
        out[name] = f
    if not out:
        raise ValueError("observables is empty: name at least one (e.g. 'pair_fraction')")
    return out


def make_plan(config: Any, grid: Any, observables: Any, batch_size: int | None) -> Plan:
    """The plan of a sweep (the arguments of :func:`~wflow.sweep.sweep`), every input checked.

    Raises ``ValueError`` naming the input (an unknown key, an empty grid, a bad value, an invalid
    grid point, a bad observable or batch size) before anything is written.

    Examples
    --------
    >>> from wflow.sweep.plan import make_plan
    >>> plan = make_plan({"init.n": 8, "init.d": 3, "run.backend": "numpy"},
    ...                  {"model.beta": [1.0, 4.0], "init.seed": "range(5)"}, ["order_parameter"], 2)
    >>> plan.shape, plan.n_tasks, plan.task_config(1)[1]  # two betas x three batches of seeds
    ((2, 5), 6, [2, 3])
    """
    from ..config import start_run

    base, spec = _base_and_grid(config, grid)
    axes = _axes(spec)
    obs = _observables(observables, base["problem"])
    clash = sorted(set(obs) & {a.dim for a in axes})
    if clash:
        raise ValueError(f"observables {clash} have the names of grid dimensions; rename them")
    auto_batch = batch_size is None
    batch_size = _batch_size(base, axes, batch_size)
    plan = Plan(base, axes, obs, batch_size, 0, np.zeros(0), "")
    saves = _check_tasks(plan)
    start_run(plan.task_config(0)[0])  # the first task's model and state: backend and the like
    plan.n_time = max(len(t) for t in saves)
    plan.times = (
        np.array(next(iter(saves))) if len(saves) == 1 else np.arange(plan.n_time, dtype=float)
    )
    # a task's results (batch x saves x observables) are held in memory by the worker and the client:
    # the automatic batch keeps them within the same budget as the state
    per_point = 8 * plan.n_time * max(1, len(obs))
    if plan.batch_axis is not None and auto_batch:
        plan.batch_size = max(1, min(plan.batch_size, _BATCH_BYTES // per_point))
    plan.fingerprint = _fingerprint(plan)
    return plan


def _base_and_grid(config: Any, grid: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The base configuration and the grid's ``key -> values``, those of a TOML file's [sweep]
    table first; ValueError for a configuration that is neither, or an empty grid."""
    if isinstance(config, (str, os.PathLike)):
        base, toml_grid = load_sweep_config(config)
    elif isinstance(config, Mapping):
        base, toml_grid = base_config(config), {}
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
    return base, spec


def _axes(spec: dict[str, Any]) -> list[Axis]:
    """The grid's axes: current keys, values coerced and distinct, dimension names; no problem axis."""
    axes: list[Axis] = []
    for key, values in spec.items():
        key = current_key(key)
        check_key(key, "grid")
        vals = [coerce_value(key, v) for v in values]
        if len(set(vals)) != len(vals):
            raise ValueError(
                f"grid {key} repeats a value ({short_repr(values)}): coordinates must be distinct"
            )
        axes.append(Axis(key, "", vals))
    for ax, dim in zip(axes, _dims([a.key for a in axes])):
        ax.dim = dim
    if "problem" in [a.key for a in axes]:
        raise ValueError(
            "grid problem: a sweep runs one kind of problem (their observables and stores differ); "
            "run one sweep per problem"
        )
    return axes


def _batch_size(base: dict[str, Any], axes: list[Axis], batch_size: Any) -> int:
    """Seeds per task: with a seed axis of a particle sweep, ``batch_size`` checked (default: as
    many systems as fit the state's memory budget) and at most the seeds; else 1."""
    keys = [a.key for a in axes]
    if BATCH_KEY not in keys or base["problem"] != "particles":
        return 1
    seeds = axes[keys.index(BATCH_KEY)].values
    if min(seeds) < 0:
        raise ValueError(f"grid init.seed must be non-negative integers, got {min(seeds)}")
    if batch_size is None:
        n = max([base["init.n"]] + (axes[keys.index("init.n")].values if "init.n" in keys else []))
        d = max([base["init.d"]] + (axes[keys.index("init.d")].values if "init.d" in keys else []))
        batch_size = max(1, _BATCH_BYTES // (8 * n * d))
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {short_repr(batch_size)}")
    return min(batch_size, len(seeds))


def _check_tasks(plan: Plan) -> set[tuple]:
    """Every task's configuration is valid (ValueError naming the grid point), before anything is
    written; returns the save times of the tasks."""
    from ..config import validate_config

    saves = set()
    # the tasks along the seed axis differ only in their seeds (checked above): one of each suffices
    shape, b = plan.task_shape(), plan.batch_axis
    for task in range(plan.n_tasks):
        if b is not None and np.unravel_index(task, shape)[b] != 0:
            continue
        cfg, _ = plan.task_config(task)
        try:
            validate_config(cfg)
        except (ValueError, TypeError) as exc:
            where = ", ".join(f"{a.key}={cfg[a.key]!r}" for a in plan.axes if a.key != BATCH_KEY)
            raise ValueError(f"grid point {where}: {exc}") from None
        saves.add(tuple(save_times(cfg)))
    return saves


def grid_difference(stored: Mapping[str, list], axes: Sequence[Axis]) -> str | None:
    """How the grid of ``axes`` differs from a store's grid ``stored`` (key -> values), in one phrase;
    None when both hold the same points, whatever the order of their axes and of their values.

    Examples
    --------
    >>> from wflow.sweep.plan import Axis, grid_difference
    >>> axes = [Axis("init.d", "d", [2, 3]), Axis("init.n", "n", [6, 4])]
    >>> grid_difference({"init.n": [4, 6], "init.d": [2, 3]}, axes) is None
    True
    >>> grid_difference({"init.n": [4, 5], "init.d": [2, 3]}, axes)
    'grid init.n: the store has [4, 5], given [6, 4] (not in the store: [6]; missing: [5])'
    """
    given = {a.key: a.values for a in axes}
    extra = [k for k in given if k not in stored]
    if extra:
        return f"grid: {extra[0]} is not an axis of the store (its axes: {', '.join(stored)})"
    missing = [k for k in stored if k not in given]
    if missing:
        return f"grid: the store's axis {missing[0]} is missing (its axes: {', '.join(stored)})"
    for key, values in stored.items():
        new = [v for v in given[key] if v not in values]
        gone = [v for v in values if v not in given[key]]
        if new or gone:
            return (
                f"grid {key}: the store has {short_repr(values)}, given {short_repr(given[key])} "
                f"(not in the store: {short_repr(new)}; missing: {short_repr(gone)})"
            )
    return None


#: keys the fingerprint hashes under the name of the release that wrote the first sweep stores, so that a
#: renamed key (:data:`wflow.config.RENAMED`) leaves a stored sweep the same sweep: it resumes
_HASHED_AS = {"problem": "solver"}


def _fingerprint(plan: Plan) -> str:
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
            "base": {_HASHED_AS.get(k, k): v for k, v in plan.base.items()},
            "grid": {a.key: a.values for a in plan.axes},
            "observables": obs,
            "batch_size": plan.batch_size,
        },
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]
