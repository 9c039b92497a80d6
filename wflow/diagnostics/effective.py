r"""The effective number of clusters of a measure at inverse temperature :math:`\beta`.

.. math::

    N_{\mathrm{eff}}(\mu; \beta) = \Big(\iint e^{\beta(\langle x, y\rangle - 1)}\,d\mu(x)\,d\mu(y)\Big)^{-1}
    = \frac{e^{\beta}}{2\beta E_\beta(\mu)}, \qquad E_\beta(\mu) = \frac{1}{2\beta}\iint e^{\beta\langle x,y\rangle}d\mu\,d\mu .

It is :math:`k` for :math:`k` separated clusters of equal mass much narrower than
:math:`1/\sqrt\beta`, and has a closed form for the uniform measure (:func:`uniform_effective_clusters`).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import gammaln, ive

from ..errors import check_nonnegative
from ..kernels import kernel_sums
from .batch import as_batch

__all__ = [
    "kernel_beta",
    "effective_clusters",
    "effective_clusters_from_log_sums",
    "uniform_effective_clusters",
]


def kernel_beta(model, n: int) -> float | None:
    r"""The inverse temperature of a model's attention on ``n`` tokens (``beta``, or ``gamma log n``), the
    :math:`\beta` of its :math:`N_{\mathrm{eff}}`; ``None`` for a model without attention (a perceptron).

    A sum of blocks or a normalization scheme answers for its attention block.

    Examples
    --------
    >>> import wflow
    >>> kernel_beta(wflow.SA(4.0), 10), bool(kernel_beta(wflow.SA(gamma=1.0), 100) == np.log(100))
    (4.0, True)
    """
    if hasattr(model, "beta_for"):
        return float(model.beta_for(n))
    inner = getattr(model, "attention", None)
    if inner is not None and inner is not model:
        return kernel_beta(inner, n)
    for part in getattr(model, "parts", ()):
        if part is model:  # (a single block is its own part)
            continue
        beta = kernel_beta(part, n)
        if beta is not None:
            return beta
    return None


def effective_clusters_from_log_sums(log_double_sums, beta: float) -> np.ndarray:
    r""":math:`N_{\mathrm{eff}} = e^{\beta - L}` from :math:`L = \log\sum_i w_i\sum_j w_j e^{\beta\langle x_i, x_j\rangle}`
    (the plain kernel's double sums, as a fused step forms them for the energy).

    Examples
    --------
    >>> float(effective_clusters_from_log_sums(2.0, 2.0))  # a single atom: e^beta / e^beta
    1.0
    """
    with np.errstate(over="ignore"):
        return np.exp(float(beta) - np.asarray(log_double_sums, dtype=np.float64))


def effective_clusters(
    points, weights=None, beta: float = 1.0, *, backend: str = "auto"
) -> np.ndarray:
    r"""Effective number of clusters :math:`N_{\mathrm{eff}} = 1/\sum_{i,j} w_i w_j e^{\beta(\langle x_i, x_j\rangle - 1)}`.

    Between 1 and :math:`1/\sum_i w_i^2` (module docstring).

    Parameters
    ----------
    points : array_like, shape (..., n, d)
        Points on the sphere; leading axes are independent systems.
    weights : array_like, shape (..., n), optional
        Non-negative masses summing to 1 per system (default :math:`1/n` each).
    beta : float
        Inverse temperature :math:`\beta \ge 0` of the kernel (at 0 every measure reads 1).
    backend : str
        Kernel-sum backend (:func:`wflow.kernels.kernel_sums`).

    Returns
    -------
    ndarray of float64, shape (...)

    Examples
    --------
    Six atoms at :math:`\pm e_1, \pm e_2, \pm e_3` are six clusters at large :math:`\beta`, one at
    :math:`\beta = 0`:

    >>> import numpy as np
    >>> x = np.vstack([np.eye(3), -np.eye(3)])
    >>> round(float(effective_clusters(x, beta=50.0)), 12), float(effective_clusters(x, beta=0.0))
    (6.0, 1.0)
    """
    x = as_batch(points).astype(np.float64, copy=False)
    n = x.shape[-2]
    if weights is None:
        w = np.full(x.shape[:-1], 1.0 / n)
    else:
        w = np.broadcast_to(np.asarray(weights, dtype=np.float64), x.shape[:-1])
        if not np.all(np.isfinite(w)) or np.any(w < 0):
            raise ValueError("weights must be finite and non-negative")
    beta = check_nonnegative(beta, "beta")
    if beta == 0:
        return np.ones(x.shape[:-2])  # (the double sum of a probability measure's weights)
    s = kernel_sums(x, x, w, beta, values=False, backend=backend)
    with np.errstate(divide="ignore"):
        terms = np.log(w) + np.log(s.mass) + s.log_scale
    top = np.max(terms, axis=-1, keepdims=True)
    log_sums = top[..., 0] + np.log(np.sum(np.exp(terms - top), axis=-1))
    return effective_clusters_from_log_sums(log_sums, beta)


def uniform_effective_clusters(beta: float, d: int) -> float:
    r""":math:`N_{\mathrm{eff}}` of the uniform measure on :math:`S^{d-1}` (closed form).

    .. math::

        N_{\mathrm{eff}} = \frac{e^{\beta}}{\Gamma(d/2)(2/\beta)^{d/2-1} I_{d/2-1}(\beta)} ,

    :math:`e^\beta/I_0(\beta)` on :math:`S^1` and :math:`2\beta/(1-e^{-2\beta})` on :math:`S^2`;
    about :math:`\sqrt{2\pi\beta}` and :math:`2\beta` at large :math:`\beta`.

    Examples
    --------
    >>> bool(np.isclose(uniform_effective_clusters(9.0, 3), 18 / (1 - np.exp(-18)), rtol=1e-14))
    True
    >>> uniform_effective_clusters(0.0, 5)
    1.0
    """
    beta = check_nonnegative(beta, "beta")
    if not isinstance(d, (int, np.integer)) or d < 2:
        raise ValueError(f"d must be an integer >= 2, got {d!r}")
    if beta == 0:
        return 1.0
    nu = d / 2 - 1
    # log of Gamma(d/2) (2/beta)^nu I_nu(beta) e^-beta, with ive = I e^-beta
    log_mean = gammaln(d / 2) + nu * math.log(2 / beta) + math.log(ive(nu, beta))
    return float(math.exp(-log_mean))
