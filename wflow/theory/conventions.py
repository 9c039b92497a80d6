r"""Ways of writing the same dynamics: the two kernel conventions (:math:`e^{\beta\langle x,y\rangle}`
and :math:`e^{\beta(\langle x,y\rangle-1)}`) and the Kuramoto form."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import check_nonnegative
from .checks import check_model


def _exp_factor(beta: Any, sign: float, value: Any, name: str) -> np.ndarray | float:
    beta = check_nonnegative(beta, "beta")
    value = np.asarray(value, dtype=float)
    with np.errstate(over="ignore"):
        out = value * np.exp(sign * beta)
    if np.any(np.isinf(out) & np.isfinite(value)):
        raise ValueError(
            f"converting {name} overflows at beta = {beta!r}: e^{sign * beta:g} is beyond float64; "
            f"stay in the rescaled convention"
        )
    return out if out.ndim else float(out)


def rescaled_time(t, beta: float, model: str = "USA"):
    r"""Time in the rescaled kernel :math:`e^{\beta(\langle x,y\rangle-1)}` of a plain-kernel time ``t``.

    USA's velocity carries the factor :math:`e^{\beta}`: :math:`v_{\rm plain} = e^{\beta}v_{\rm rescaled}`,
    so :math:`t_{\rm rescaled} = e^{\beta}t`.  SA's normalization cancels the factor: times agree.

    Examples
    --------
    >>> bool(rescaled_time(1.0, 2.0) == np.exp(2.0)), rescaled_time(1.0, 2.0, "SA")
    (True, 1.0)
    """
    if check_model(model) == "SA":
        return np.asarray(t, dtype=float) if np.ndim(t) else float(t)
    return _exp_factor(beta, 1.0, t, "t")


def plain_time(t_rescaled, beta: float, model: str = "USA"):
    r"""Inverse of :func:`rescaled_time`: :math:`t = e^{-\beta}t_{\rm rescaled}` (USA), unchanged (SA).

    Examples
    --------
    >>> plain_time(rescaled_time(0.3, 5.0), 5.0) == 0.3
    True
    """
    if check_model(model) == "SA":
        return np.asarray(t_rescaled, dtype=float) if np.ndim(t_rescaled) else float(t_rescaled)
    return _exp_factor(beta, -1.0, t_rescaled, "t_rescaled")


def rescaled_energy(energy, beta: float):
    r"""Energy in the rescaled kernel of a plain-kernel energy: :math:`E^{\rm resc}_\beta = e^{-\beta}E_\beta`.

    :math:`\frac1{2\beta}\iint e^{\beta(\langle x,y\rangle-1)}d\mu\,d\mu = e^{-\beta}E_\beta(\mu)`, for
    SA and USA alike (the functional is the same; only SA's clock ignores the factor).

    Examples
    --------
    >>> rescaled_energy(np.exp(3.0), 3.0)
    1.0
    """
    return _exp_factor(beta, -1.0, energy, "energy")


def plain_energy(energy_rescaled, beta: float):
    r"""Inverse of :func:`rescaled_energy`: :math:`E_\beta = e^{\beta}E^{\rm resc}_\beta`.

    Examples
    --------
    >>> plain_energy(1.0, 0.0)
    1.0
    """
    return _exp_factor(beta, 1.0, energy_rescaled, "energy_rescaled")


def kuramoto_velocity(theta, beta: float) -> np.ndarray:
    r"""USA on the circle in angles: :math:`\theta_i' = -\frac1n\sum_j e^{\beta\cos(\theta_i-\theta_j)}\sin(\theta_i-\theta_j)`.

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.theory import kuramoto_velocity
    >>> v = kuramoto_velocity(np.array([0.0, 0.5, 2.0]), 1.0)
    >>> v.round(6).tolist(), round(float(v.sum()), 12)  # odd coupling: the mean angle is at rest
    ([0.584271, -0.027482, -0.556789], 0.0)
    """
    theta = np.asarray(theta, dtype=float)
    diff = theta[:, None] - theta[None, :]
    return -np.mean(np.exp(beta * np.cos(diff)) * np.sin(diff), axis=1)
