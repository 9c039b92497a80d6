r"""The linear theory around the uniform measure: Funk--Hecke eigenvalues and growth rates."""

from __future__ import annotations

import numpy as np
from scipy import special

from ..errors import check_int, check_nonnegative, check_positive


def funk_hecke(ell, beta: float, d: int) -> np.ndarray:
    r"""Funk--Hecke eigenvalue :math:`c_\ell(\beta) = \Gamma(d/2)(2/\beta)^{d/2-1} I_{\ell+d/2-1}(\beta)`.

    At :math:`\beta = 0` this is the limit (1 for :math:`\ell = 0`, else 0).  On the circle
    (:math:`d = 2`) it is :math:`I_\ell(\beta)`.

    Examples
    --------
    >>> import numpy as np
    >>> from scipy.special import iv
    >>> from wflow.theory import funk_hecke
    >>> bool(np.allclose(funk_hecke([0, 1, 2], 2.0, 2), iv([0, 1, 2], 2.0)))  # circle: I_l(beta)
    True
    >>> funk_hecke([0, 1], 0.0, 3).tolist()  # the beta = 0 limit
    [1.0, 0.0]
    """
    d = check_int(d, "d", minimum=2)
    beta = check_nonnegative(beta, "beta")
    ell = np.asarray(ell, dtype=float)
    nu = ell + d / 2 - 1
    if beta == 0:
        return np.where(ell == 0, 1.0, 0.0)
    # log form avoids overflow for large beta: ive(nu, b) = I_nu(b) e^{-b}
    with np.errstate(divide="ignore"):  # ive underflows to 0 for degrees far beyond beta: c = 0
        log_c = (
            special.gammaln(d / 2)
            + (d / 2 - 1) * np.log(2 / beta)
            + np.log(special.ive(nu, beta))
            + beta
        )
    return np.exp(log_c)


def growth_rate(ell, beta: float, d: int, model: str = "USA") -> np.ndarray:
    r"""Growth rate of mode :math:`\ell` around the uniform measure on :math:`S^{d-1}` (V = I).

    USA :math:`\ell(\ell+d-2)c_\ell(\beta)/\beta`; SA :math:`\ell(\ell+d-2)c_\ell(\beta)/(\beta c_0(\beta))`.
    On the circle: USA :math:`k^2 I_k(\beta)/\beta`, SA :math:`k^2 I_k(\beta)/(\beta I_0(\beta))`.
    For V = -I the rates change sign.  At :math:`\beta = 0` the limit :math:`\ell(\ell+d-2)c'_\ell(0)`
    is used (nonzero for :math:`\ell = 1` only: rate :math:`(d-1)/d`).

    Examples
    --------
    >>> import numpy as np
    >>> from scipy.special import iv
    >>> from wflow.theory import growth_rate
    >>> bool(np.isclose(growth_rate(2, 4.0, 2, "USA"), 2**2 * iv(2, 4.0) / 4.0))  # k^2 I_k(beta) / beta
    True
    >>> round(float(growth_rate(1, 0.0, 3)), 6)  # beta = 0: (d - 1) / d
    0.666667
    """
    if model not in ("SA", "USA"):
        raise ValueError(f"model must be 'SA' or 'USA', got {model!r}")
    ell = np.asarray(ell, dtype=float)
    beta = check_nonnegative(beta, "beta")
    lap = ell * (ell + d - 2)
    if beta == 0:
        return np.where(ell == 1, (d - 1) / d, 0.0)
    c = funk_hecke(ell, beta, d)
    rate = lap * c / beta
    if model == "SA":
        rate = rate / funk_hecke(0, beta, d)
    return rate


def most_unstable_mode(beta: float, d: int, model: str = "SA", ell_max: int = 200) -> int:
    """The degree of largest growth rate (ties to the smaller degree).

    Examples
    --------
    >>> from wflow.theory import most_unstable_mode
    >>> most_unstable_mode(1.0, 3), most_unstable_mode(9.0, 3)
    (1, 4)
    """
    ells = np.arange(1, ell_max + 1)
    return int(ells[np.argmax(growth_rate(ells, beta, d, model))])


def heat_decay_rate(ell, d: int, kappa: float) -> np.ndarray:
    r"""Decay rate of degree-:math:`\ell` harmonics under :math:`\kappa^{-1}\Delta_S`: :math:`\ell(\ell+d-2)/\kappa`.

    Examples
    --------
    >>> from wflow.theory import heat_decay_rate
    >>> heat_decay_rate([0, 1, 2], 3, 2.0).tolist()  # l (l + 1) / kappa on S^2
    [0.0, 1.0, 3.0]
    """
    ell = np.asarray(ell, dtype=float)
    return ell * (ell + d - 2) / check_positive(kappa, "kappa")
