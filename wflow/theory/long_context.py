r"""Long context: one attention layer at :math:`\beta = \gamma\log n`, its limit and its finite-:math:`n` value."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import check_positive, short_repr
from .checks import SCHEME_ALIASES, check_real

_LAYERS = ("pre-ln", "post-ln")


def _check_layer(scheme: Any) -> str:
    name = SCHEME_ALIASES.get(scheme, scheme) if isinstance(scheme, str) else scheme
    if name not in _LAYERS:
        raise ValueError(
            f"scheme must be 'pre-ln' or 'post-ln' for one long-context layer, got {short_repr(scheme)}"
        )
    return name


def long_context_limit(
    rho: float, gamma: float, *, scheme: str = "pre-ln", eta: float = 1.0
) -> float:
    r"""Limit :math:`n\to\infty` of the output cosine of one SA layer with :math:`\beta = \gamma\log n`.

    Input: :math:`n` equiangular unit tokens of cosine :math:`\rho\in(0,1)`; the self weight tends
    to 0, 1/2, 1 as :math:`\gamma` is below, at or above :math:`\gamma_c = 1/(1-\rho)`.
    ``'pre-ln'``: the block's output :math:`A_i`, limits 1, :math:`4\rho/(1+3\rho)`, :math:`\rho`;
    ``'post-ln'``: the layer :math:`\theta_i + \eta A_i` (``docs/theory.md``, "Long context").

    Examples
    --------
    >>> long_context_limit(0.5, 2.0)  # at gamma_c = 1/(1 - rho): 4 rho / (1 + 3 rho)
    0.8
    >>> long_context_limit(0.5, 2.0, scheme="post-ln")  # theta + A at gamma_c: 16 rho / (9 + 7 rho)
    0.64
    """
    rho = check_real(rho, "rho")
    if not 0.0 < rho < 1.0:
        raise ValueError(f"rho must lie in (0, 1), got {rho!r}")
    gamma = check_positive(gamma, "gamma")
    scheme = _check_layer(scheme)
    eta = check_positive(eta, "eta")
    crit = 1.0 / (1.0 - rho)
    if np.isclose(gamma, crit, rtol=1e-12, atol=0):
        a = 0.5
    else:
        a = 0.0 if gamma < crit else 1.0
    if scheme == "pre-ln" and a == 0.0:
        return 1.0
    p, q = (a, 1.0 - a) if scheme == "pre-ln" else (1.0 + eta * a, eta * (1.0 - a))
    return float(rho * (p + q) ** 2 / (p * p + (2 * p * q + q * q) * rho))


def long_context_gap(
    rho, gamma, n, *, scheme: str = "pre-ln", eta: float = 1.0
) -> np.ndarray | float:
    r""":math:`1-\cos` of the outputs of one SA layer on :math:`n` equiangular tokens, :math:`\beta = \gamma\log n`.

    The output of token :math:`i` is :math:`y_i = p\,\theta_i + q\sum_{j\ne i}\theta_j`, :math:`(p, q) = (a, b)`
    for Pre-LN and :math:`(1+\eta a, \eta b)` for Post-LN, and

    .. math::

        1 - \cos(y_i, y_k) = \frac{(1-\rho)(p-q)^2}
        {(p-q)^2 + 2(p-q)q(1+(n-1)\rho) + q^2 n(1+(n-1)\rho)},

    with :math:`q/p` formed in log scale (no overflow for :math:`n = 10^{12}`, :math:`\gamma = 100`).

    Parameters
    ----------
    rho : float or array_like
        Input cosine in :math:`(-1/(n-1), 1)`.
    gamma : float or array_like
        :math:`\beta/\log n`, >= 0.
    n : float or array_like
        Number of tokens, >= 2 (a float is accepted: ``1e12``).
    scheme : {'pre-ln', 'post-ln'}
    eta : float
        Post-LN step (the layer is :math:`\theta + \eta A`).

    Returns
    -------
    ndarray
        Broadcast shape of ``rho``, ``gamma``, ``n``.

    Examples
    --------
    >>> round(float(long_context_gap(0.5, 2.0, 1e12)), 9)  # -> 1 - 4 rho/(1+3 rho) = 0.2
    0.2
    """
    scheme = _check_layer(scheme)
    eta = check_positive(eta, "eta")
    rho, gamma, n = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (rho, gamma, n)))
    if not np.all(np.isfinite(n)) or np.any(n < 2):
        raise ValueError(f"n must be finite and >= 2, got {short_repr(n)}")
    if not np.all(np.isfinite(gamma)) or np.any(gamma < 0):
        raise ValueError(f"gamma must be finite and >= 0, got {short_repr(gamma)}")
    if not np.all(np.isfinite(rho)) or np.any(rho <= -1.0 / (n - 1)) or np.any(rho >= 1):
        raise ValueError(f"rho must lie in (-1/(n-1), 1), got {short_repr(rho)}")
    log_n = np.log(n)
    log_ratio = -gamma * log_n * (1.0 - rho)  # log(b / a)
    total = 1.0 + (n - 1) * rho  # <theta_i, sum_j theta_j>
    if scheme == "pre-ln":
        p, q = np.ones_like(rho), np.exp(log_ratio)  # divided by a
    else:
        log_a = -np.logaddexp(0.0, np.log(n - 1) + log_ratio)  # a = 1 / (1 + (n-1) b/a)
        p, q = 1.0 + eta * np.exp(log_a), eta * np.exp(log_a + log_ratio)
    d = p - q
    gap = (1.0 - rho) * d * d / (d * d + 2 * d * q * total + q * q * n * total)
    return gap if gap.ndim else float(gap)


def long_context_cosine(
    rho, gamma, n, *, scheme: str = "pre-ln", eta: float = 1.0
) -> np.ndarray | float:
    r"""Output cosine :math:`1 -` :func:`long_context_gap` of one layer at :math:`\beta = \gamma\log n`.

    Tends to :func:`long_context_limit` as :math:`n\to\infty` (rates: ``docs/theory.md``).

    Examples
    --------
    >>> [round(float(long_context_cosine(0.5, g, 1e12)), 4) for g in (1.0, 2.0, 3.0)]
    [1.0, 0.8, 0.5]
    """
    return 1.0 - long_context_gap(rho, gamma, n, scheme=scheme, eta=eta)
