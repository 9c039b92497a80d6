"""The names the theory functions accept and the argument checks they share."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from ..errors import short_repr

#: Normalization schemes (conventions page), by the names every function here accepts.
SCHEMES = ("post-ln", "pre-ln", "peri-ln", "mix-ln", "ngpt", "sqrt")
#: other names accepted for a scheme (any case)
SCHEME_ALIASES = {
    "sqrt-scaling": "sqrt",
    "post": "post-ln",
    "pre": "pre-ln",
    "peri": "peri-ln",
    "mix": "mix-ln",
}
_MODELS = ("SA", "USA")


def check_model(model: Any) -> str:
    """``model`` if it is ``'SA'`` or ``'USA'``; a ``ValueError`` otherwise."""
    if model not in _MODELS:
        raise ValueError(f"model must be 'SA' or 'USA', got {short_repr(model)}")
    return model


def check_scheme(scheme: Any) -> str:
    """The canonical name in :data:`SCHEMES` of ``scheme`` (case and :data:`SCHEME_ALIASES` allowed)."""
    if not isinstance(scheme, str):
        raise TypeError(f"scheme must be a string, one of {SCHEMES}, got {short_repr(scheme)}")
    name = SCHEME_ALIASES.get(scheme.lower(), scheme.lower())
    if name not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {short_repr(scheme)}")
    return name


def check_real(value: Any, name: str) -> float:
    """``value`` as a finite float (not a bool); the messages name the argument ``name``."""
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, np.floating, np.integer)):
        raise TypeError(f"{name} must be a real number, got {short_repr(value)}")
    v = float(value)
    if not np.isfinite(v):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return v


def check_rho(rho: Any, n: int, name: str, *, closed: bool = True) -> float:
    """A common cosine of ``n`` tokens in :math:`[-1/(n-1), 1]` (``closed=False``: the open interval)."""
    rho = check_real(rho, name)
    lo = -1.0 / (n - 1)
    ok = (lo <= rho <= 1) if closed else (lo < rho < 1)
    if not ok:
        brackets = "[{:.6g}, 1]" if closed else "({:.6g}, 1)"
        raise ValueError(
            f"{name} must lie in {brackets.format(lo)} (-1/(n-1) with n = {n}), got {rho!r}"
        )
    return rho
