"""Exceptions raised by wflow and the argument checks shared by every module.

Bad input raises :class:`ValueError` or :class:`TypeError` naming the argument and
the value received (never ``assert``: it vanishes under ``python -O``).  Failures
during a computation raise :class:`WflowError` or one of its subclasses with a
message that says what to change.
"""

from __future__ import annotations

import numbers
import os
import sys
from typing import Any

import numpy as np

__all__ = [
    "WflowError",
    "NotAGradientFlowError",
    "SolverError",
    "StoreBusyError",
    "as_points",
    "check_positive",
    "check_nonnegative",
    "check_finite",
    "did_you_mean",
    "check_int",
    "short_repr",
    "real_float_dtype",
    "notice",
]


class WflowError(RuntimeError):
    """Base class for errors raised while wflow computes.

    Examples
    --------
    >>> from wflow.errors import WflowError, SolverError, NotAGradientFlowError
    >>> issubclass(SolverError, WflowError), issubclass(NotAGradientFlowError, WflowError)
    (True, True)
    """


class NotAGradientFlowError(WflowError, ValueError):
    """The model has no energy: it is not a gradient flow (the message says why).

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.errors import NotAGradientFlowError
    >>> try:
    ...     (wflow.SA(1.0) + wflow.USA(1.0)).energy(wflow.Atoms(np.eye(3)))
    ... except NotAGradientFlowError:
    ...     print("no energy")
    no energy
    >>> issubclass(NotAGradientFlowError, ValueError)
    True
    """


class StoreBusyError(WflowError):
    """Another process is writing to this output folder or store (it holds the lock).

    Examples
    --------
    >>> from wflow.errors import StoreBusyError, WflowError
    >>> issubclass(StoreBusyError, WflowError)  # raised by wflow.io.FolderLock
    True
    """


class SolverError(WflowError):
    """A solver could not continue (non-finite state, step size underflow, ...).

    Examples
    --------
    >>> from wflow.errors import SolverError, WflowError
    >>> issubclass(SolverError, WflowError), issubclass(SolverError, RuntimeError)
    (True, True)
    """


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr`` of a value, shortened for error messages (arrays by shape and dtype).

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.errors import short_repr
    >>> short_repr(np.zeros((100, 3))), short_repr(np.array([1.0, 2.0]))
    ('array(shape=(100, 3), dtype=float64)', 'array([1., 2.], dtype=float64)')
    >>> len(short_repr("x" * 1000))
    80
    """
    if isinstance(value, np.ndarray):
        if value.size <= 6:
            text = np.array2string(value, precision=4, separator=", ")
            return f"array({text}, dtype={value.dtype})"
        return f"array(shape={value.shape}, dtype={value.dtype})"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def as_points(
    x: Any, name: str = "x", *, normalize: bool = False, atol: float = 1e-6
) -> np.ndarray:
    """Validate an array of points ``(..., n, d)`` with ``d >= 2``.

    Returns a floating array (float32 kept, everything else float64), projected onto the sphere
    with ``normalize=True``, else with norms checked within ``atol`` of one.

    Examples
    --------
    >>> from wflow.errors import as_points
    >>> as_points([[3.0, 4.0]], normalize=True)
    array([[0.6, 0.8]])
    >>> try:
    ...     as_points([[3.0, 4.0]], "mu0")
    ... except ValueError as exc:
    ...     print(exc)
    mu0 must lie on the unit sphere; point (0,) has norm 5 (use wflow.sphere.normalize first)
    """
    if isinstance(x, (str, bytes)) or x is None:
        raise TypeError(
            f"{name} must be an array of points of shape (..., n, d), got {short_repr(x)}"
        )
    try:
        arr = np.asarray(x)
    except Exception as exc:  # pragma: no cover - numpy raises varied errors
        raise TypeError(f"{name} must be an array of points, got {short_repr(x)}") from exc
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise TypeError(f"{name} must be a numeric array, got dtype {arr.dtype}")
    if np.iscomplexobj(arr):
        raise TypeError(f"{name} must be real, got complex dtype {arr.dtype}")
    if arr.dtype != np.float32:
        arr = arr.astype(np.float64, copy=False)
    if arr.ndim < 2:
        raise ValueError(
            f"{name} must have shape (..., n, d) with at least 2 axes, got shape {arr.shape}"
        )
    if arr.shape[-1] < 2:
        raise ValueError(f"{name} must have dimension d >= 2 (last axis), got shape {arr.shape}")
    if arr.shape[-2] < 1:
        raise ValueError(f"{name} must hold at least one point, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains non-finite values (NaN or inf): {short_repr(arr)}")
    norms = np.linalg.norm(arr, axis=-1)
    if normalize:
        if np.any(norms == 0):
            i = np.unravel_index(int(np.argmin(norms)), norms.shape)
            raise ValueError(
                f"{name} contains a zero vector (index {tuple(int(k) for k in i)}), which has no direction"
            )
        return arr / norms[..., None]
    bad = np.abs(norms - 1) > atol
    if np.any(bad):
        i = np.unravel_index(int(np.argmax(np.abs(norms - 1))), norms.shape)
        raise ValueError(
            f"{name} must lie on the unit sphere; point {tuple(int(k) for k in i)} has norm {float(norms[i]):.6g} "
            f"(use wflow.sphere.normalize first)"
        )
    return arr


def real_float_dtype(dtype: Any, name: str, *, integers: bool = False) -> np.dtype:
    """``np.dtype(dtype)`` when it is a real floating type, else a TypeError naming ``name`` and the dtype:
    the one dtype rule of every public entry (complex and object refused); ``integers=True`` also takes
    integer and boolean dtypes.

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.errors import real_float_dtype
    >>> real_float_dtype(np.float32, "SaveAt: dtype"), real_float_dtype(np.int64, "x", integers=True)
    (dtype('float32'), dtype('int64'))
    >>> real_float_dtype(np.asarray([1j]).dtype, "x", integers=True)
    Traceback (most recent call last):
        ...
    TypeError: x must be real (a float or integer dtype), got complex128
    """
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"{name} must be a real floating dtype, got {short_repr(dtype)}") from None
    if integers and dt.kind in "biu":
        return dt
    if dt.kind != "f":
        if integers:
            raise TypeError(f"{name} must be real (a float or integer dtype), got {dt}")
        raise TypeError(
            f"{name} must be a real floating dtype (float32 or float64), got {dt} ({short_repr(dtype)})"
        )
    return dt


def _real(value: Any, name: str) -> float:
    """``float(value)`` of a real number (not a bool), else a TypeError naming ``name``."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"{name} must be a real number, got {short_repr(value)}")
    return float(value)


def check_positive(value: Any, name: str, *, allow_inf: bool = False) -> float:
    """Return ``float(value)`` after checking it is a finite real number > 0.

    Examples
    --------
    >>> from wflow.errors import check_positive
    >>> check_positive(2, "tau")
    2.0
    >>> try:
    ...     check_positive(0, "tau")
    ... except ValueError as exc:
    ...     print(exc)
    tau must be a finite number > 0, got 0
    """
    v = _real(value, name)
    if np.isnan(v) or (np.isinf(v) and not allow_inf) or v <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return v


def check_nonnegative(value: Any, name: str) -> float:
    """Return ``float(value)`` after checking it is a finite real number >= 0.

    Examples
    --------
    >>> from wflow.errors import check_nonnegative
    >>> check_nonnegative(0, "kappa")
    0.0
    >>> try:
    ...     check_nonnegative(-1, "kappa")
    ... except ValueError as exc:
    ...     print(exc)
    kappa must be a finite number >= 0, got -1
    """
    v = _real(value, name)
    if not np.isfinite(v) or v < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return v


def did_you_mean(name: Any, choices: Any) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices`` to a misspelt ``name``, or ``""``.

    Examples
    --------
    >>> from wflow.errors import did_you_mean
    >>> did_you_mean("model.bata", ["model.beta", "model.type"]), did_you_mean("zzz", ["rk4"])
    (" (did you mean 'model.beta'?)", '')
    """
    import difflib

    if not isinstance(name, str):
        return ""
    close = difflib.get_close_matches(name, [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_finite(value: Any, name: str) -> float:
    """Return ``float(value)`` after checking it is a finite real number (of any sign).

    Examples
    --------
    >>> from wflow.errors import check_finite
    >>> check_finite(-0.5, "offset")
    -0.5
    >>> try:
    ...     check_finite(float("nan"), "offset")
    ... except ValueError as exc:
    ...     print(exc)
    offset must be a finite number, got nan
    """
    v = _real(value, name)
    if not np.isfinite(v):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return v


def check_int(value: Any, name: str, *, minimum: int = 1) -> int:
    """Return ``int(value)`` after checking it is an integer >= ``minimum``.

    Examples
    --------
    >>> from wflow.errors import check_int
    >>> check_int(3, "n", minimum=1)
    3
    >>> try:
    ...     check_int(2.5, "n")
    ... except TypeError as exc:
    ...     print(exc)
    n must be an integer, got 2.5
    """
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, np.integer)):
        raise TypeError(f"{name} must be an integer, got {short_repr(value)}")
    v = int(value)
    if v < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {v}")
    return v


def available_memory() -> float:
    """Bytes of memory available now (``MemAvailable``), or the physical memory where unknown."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def notice(text: str) -> None:
    """One line ``wflow: text`` on stderr as a step of seconds starts; ``WFLOW_NOTICES=0`` silences them."""
    if os.environ.get("WFLOW_NOTICES", "1") != "0":
        print(f"wflow: {text}", file=sys.stderr, flush=True)
