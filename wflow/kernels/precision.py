r"""When float32 logits are accurate enough: the rule the numba backend's direct route, the
tiny-systems route (:mod:`wflow.kernels.small`) and the fused step (:mod:`wflow.solvers.fused`) decide by.

With log-weights taken relative to their maximum, the rounding error of each exponent of float32
logits of dimension :math:`p`, bounded by ``size``, is at most
:math:`2^{-24}\big((p+2)\,\text{size} + 2\max_j|\log w_j - \max\log w|\big)`; when that is below
:data:`LOWP_LOGIT_ERROR` (a caller may allow ``tol / 3``) the logits may be formed in float32.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .jit import LOG_ZERO

__all__ = ["LOWP_LOGIT_ERROR", "float32_logits_bound"]

#: float32 logits are used when their rounding error is provably below this (relative, per term).
LOWP_LOGIT_ERROR = 3e-6


@njit(cache=True, nogil=True)
def _relative_log_weights(lw, lo, out, top):  # pragma: no cover - compiled
    """out[k] = max(lw[k] - max lw[k], -3e38) in out's dtype and top[k] = max lw[k], in one pass;
    returns the largest span max lw[k] - lw[k, j] over the log-weights whose relative value is
    above lo (zero weights left out)."""
    B, m = lw.shape
    span = 0.0
    if m == 0:
        return span
    for k in range(B):
        mx = lw[k, 0]
        for j in range(1, m):
            mx = max(mx, lw[k, j])
        top[k] = mx
        for j in range(m):
            v = lw[k, j] - mx
            if v > lo:
                span = max(span, -v)
            out[k, j] = max(v, -3e38)
    return span


def float32_logits_bound(
    p: int, size: float, logw: np.ndarray, floor: float, tol: float | None = None
) -> tuple[bool, np.ndarray, np.ndarray]:
    """The rule of the float32 logits (module docstring) for logits of dimension ``p`` bounded by ``size``:
    ``(ok, log-weights relative to each system's maximum as float32, at least -3e38, the maxima)``."""
    logw = np.ascontiguousarray(logw, dtype=np.float64)
    lw_rel = np.empty(logw.shape, np.float32)
    lw_max = np.empty(logw.shape[0])
    lw_span = float(_relative_log_weights(logw, LOG_ZERO / 2, lw_rel, lw_max))
    limit = max(LOWP_LOGIT_ERROR, tol / 3.0) if tol is not None else LOWP_LOGIT_ERROR
    ok = 2.0**-24 * ((p + 2) * size + 2.0 * min(lw_span, -floor)) <= limit
    return ok, lw_rel, lw_max
