"""Grids of a sweep: values of one axis (``linspace``, ``logspace``, ``range``, TOML), grids, ``--grid`` arguments.

Keys and values are checked with the configuration's own rules (:func:`coerce_value`).
"""

from __future__ import annotations

import ast
import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..config import KEYS, coerce, current_key, default_config, flatten, read_toml, validate_config
from ..errors import short_repr

__all__ = [
    "parse_values",
    "parse_grid",
    "parse_grid_arg",
    "parse_grid_args",
    "coerce_value",
    "check_key",
    "base_config",
    "load_sweep_config",
]

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
        values = _parse_string(spec, what)
    elif isinstance(spec, (bool, int, float, np.generic)):
        values = [spec.item() if isinstance(spec, np.generic) else spec]
    else:
        raise ValueError(
            f"{what} must be a list, a value or linspace/logspace/range(...), got {short_repr(spec)}"
        )
    if not values:
        raise ValueError(f"{what} is empty ({short_repr(spec)}): give at least one value")
    return values


def _parse_string(spec: str, what: str) -> list:
    """The values a string gives: a ``linspace``/``logspace``/``range`` call, else a TOML value."""
    m = _CALL.match(spec)
    if not m:
        try:
            v = tomllib.loads(f"v = {spec}")["v"]
        except tomllib.TOMLDecodeError:
            v = spec.strip()  # a bare word: a string value
        return v if isinstance(v, list) else [v]
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
        with np.errstate(over="ignore"):  # 10**400: inf, refused below in one line
            values = f(float(nums[0]), float(nums[1]), nums[2])
        if not np.all(np.isfinite(values)):
            raise ValueError(
                f"{what}={spec!r}: {name} gives values beyond float64 (10**{max(nums[:2])} overflows)"
                if name == "logspace"
                else f"{what}={spec!r}: linspace needs finite ends"
            )
        return _tidy(values)
    ints = [v for v in nums if isinstance(v, int)]
    if not 1 <= len(nums) <= 3 or len(ints) != len(nums):
        raise ValueError(
            f"{what}={spec!r}: range takes 1 to 3 integers (range(n), range(a, b), "
            f"range(a, b, step))"
        )
    if len(ints) == 3 and ints[2] == 0:
        raise ValueError(f"{what}={spec!r}: range step must not be zero")
    return list(range(*ints))


def parse_grid(spec: Mapping[str, Any]) -> dict[str, list]:
    """A grid ``key -> list of values`` from ``key -> list | str`` (:func:`parse_values`; :func:`~wflow.sweep.sweep` checks keys).

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
    if key in KEYS and KEYS[key].type is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    try:
        return coerce(key, value)
    except TypeError as exc:
        raise ValueError(str(exc)) from None


def check_key(key: str, where: str) -> None:
    """Raise ``ValueError`` naming ``where`` and the known keys when ``key`` is not a configuration key.

    Examples
    --------
    >>> from wflow.sweep.grid import check_key
    >>> check_key("model.beta", "grid")
    >>> try:
    ...     check_key("model.bta", "grid")
    ... except ValueError as exc:
    ...     print(str(exc).split(";")[0])
    grid: unknown config key 'model.bta'
    """
    if key not in KEYS:
        raise ValueError(f"{where}: unknown config key {key!r}; known keys: {', '.join(KEYS)}")


def base_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The full, validated configuration of a sweep from a flat dict of some keys (the others default).

    Examples
    --------
    >>> from wflow.sweep.grid import base_config
    >>> cfg = base_config({"model.beta": 4, "init.n": 8})
    >>> cfg["model.beta"], cfg["init.n"], cfg["problem"]
    (4.0, 8, 'particles')
    """
    cfg = default_config()
    for key, value in config.items():
        key = current_key(key)
        check_key(key, "config")
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
    p = Path(path)
    table = read_toml(p)
    spec = table.pop("sweep", {})
    if not isinstance(spec, dict):
        raise ValueError(
            f"config file {p}: [sweep] must be a table of key = values, got {short_repr(spec)}"
        )
    return base_config(flatten(table)), parse_grid(flatten(spec))
