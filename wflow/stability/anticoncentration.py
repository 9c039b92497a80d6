r"""The perceptron paper's bound on the mass of a cluster of a stable critical point."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._typing import ArrayLike
from ..errors import short_repr

#: :math:`\lim_{\beta\to\infty}` of :func:`anticoncentration_bound`,
#: :math:`2e^{-3/2}/(2e^{-3/2} + \tfrac38 e^{-1/8}) = 0.5742\ldots`
ANTICONCENTRATION_LIMIT = float(2 * np.exp(-1.5) / (2 * np.exp(-1.5) + 0.375 * np.exp(-0.125)))


def anticoncentration_bound(beta: Any, omega: ArrayLike, A: ArrayLike) -> np.ndarray | float:
    r"""The perceptron paper's bound on the mass of a cluster of a stable critical point (d = 2, descent).

    For repulsive attention ("descent") plus a conservative perceptron with a 1-Lipschitz
    activation, :math:`\sigma(0) = 0`, on :math:`S^1`, the atoms of a stable atomic critical point
    lying in a set of pairwise distances at most :math:`1/(2\sqrt\beta)` carry a total mass

    .. math::

        \sum_{i\in S} m_i \le \frac{2e^{\beta-3/2} + C_\vartheta}{2e^{\beta-3/2} + \tfrac38 e^{\beta-1/8}},
        \qquad C_\vartheta = 2\sum_j|\omega_j|\,\|a_j\|^2,

    in the rescaled kernel :math:`e^{\beta(\langle x,y\rangle-1)}` of the paper's code
    (Álvarez-López, Geshkovski & Ruiz-Balet, ICML 2026, Thm 4).  It tends to
    :data:`ANTICONCENTRATION_LIMIT` :math:`\approx 0.5742` as :math:`\beta\to\infty`; values
    :math:`\ge 1` say nothing.  Computed as
    :math:`(2e^{-3/2} + C_\vartheta e^{-\beta})/(2e^{-3/2} + \tfrac38 e^{-1/8})`, finite at any beta.

    Parameters
    ----------
    beta : float or array_like
        Inverse temperature(s), ``>= 0``.
    omega : array_like, shape (m,)
        The perceptron's output weights (:math:`W = A^\top\mathrm{diag}(\omega)`).
    A : array_like, shape (m, d)
        Its input weights, rows :math:`a_j`.

    Returns
    -------
    float or ndarray
        The bound, shaped like ``beta``.

    Examples
    --------
    >>> round(anticoncentration_bound(10.0, [1.0, -0.5], [[1.0, 0.0], [0.0, 1.0]]), 4)
    0.5744
    >>> round(ANTICONCENTRATION_LIMIT, 4)
    0.5742
    """
    b = np.asarray(beta, dtype=float) if not isinstance(beta, (str, bytes)) else None
    if b is None or b.dtype == object or not np.all(np.isfinite(b)) or np.any(b < 0):
        raise ValueError(f"beta must be finite and >= 0, got {short_repr(beta)}")
    try:
        w = np.asarray(omega, dtype=float)
        a = np.asarray(A, dtype=float)
    except (TypeError, ValueError):
        raise TypeError(
            f"omega and A must be real arrays, got omega={short_repr(omega)}, A={short_repr(A)}"
        ) from None
    if w.ndim != 1 or w.size == 0:
        raise ValueError(f"omega must have shape (m,) with m >= 1, got shape {w.shape}")
    if a.ndim != 2 or a.shape[0] != w.size:
        raise ValueError(
            f"A must have shape (m, d) = ({w.size}, d) to match omega, got shape {a.shape}"
        )
    if not np.all(np.isfinite(w)):
        raise ValueError(f"omega contains non-finite values: {short_repr(w)}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"A contains non-finite values: {short_repr(a)}")
    c_theta = 2.0 * float(np.sum(np.abs(w) * np.sum(a * a, axis=1)))
    top = 2 * np.exp(-1.5)
    out = (top + c_theta * np.exp(-b)) / (top + 0.375 * np.exp(-0.125))
    return float(out) if out.ndim == 0 else out
