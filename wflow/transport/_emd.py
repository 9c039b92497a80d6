"""Exact :math:`W_p^p` by the linear program (POT ``emd2``), any dimension and cost.

The result code of ``ot.emd2`` is checked: a plan that is not optimal (too few
iterations, a degenerate problem) raises instead of returning a wrong number.
"""

from __future__ import annotations

from ..errors import WflowError
from ..sphere import cost_matrix
from ._common import import_pot

__all__ = ["emd_wpp"]


def emd_wpp(x, a, y, b, p: float, cost: str) -> tuple[float, dict]:
    ot = import_pot()

    M = cost_matrix(x, y, cost=cost, p=p)
    n, m = M.shape
    # PITFALLS: the default numItermax=1e5 silently returns a non-optimal plan at n = 5000.
    num_iter_max = max(10**7, 50 * n * m)
    value, lg = ot.emd2(a, b, M, numItermax=num_iter_max, log=True)
    if lg.get("result_code", 1) != 1 or lg.get("warning"):
        raise WflowError(
            f"ot.emd2 did not reach an optimal plan (result_code={lg.get('result_code')}, "
            f"warning={lg.get('warning')!r}) for n={n}, m={m}; use method='sinkhorn' or 'sliced' for measures this large"
        )
    return float(value), {"num_iter_max": num_iter_max}
