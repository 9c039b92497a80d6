r"""The debiased Sinkhorn divergence :math:`S_\varepsilon` in the log domain (GeomLoss's loop).

:func:`sinkhorn` runs the symmetric :math:`\varepsilon`-scaling loop of Feydy et al.
(AISTATS 2019) on atoms; every pass is four soft-min reductions, streamed by KeOps
(:func:`keops_softmin`, one compiled formula per cost, p and d) or by NumPy in row blocks
(:func:`numpy_softmin`).  The front door is :func:`wflow.transport.sinkhorn_divergence`.
"""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import WflowError

__all__ = ["keops_formula", "keops_softmin", "numpy_softmin", "sinkhorn"]

_KEOPS_ROUTINES: dict[tuple, Any] = {}


def keops_formula(cost: str, p: float) -> str:
    if cost == "geodesic":
        base = "(IntCst(2) * Atan2(Norm2(x - y), Norm2(x + y)))"
        c = {1.0: base, 2.0: f"Square{base}"}.get(p, f"Powf({base}, P)")
    else:
        c = {1.0: "Norm2(x - y)", 2.0: "SqDist(x, y)"}.get(p, "Powf(SqDist(x, y), P / IntCst(2))")
    return f"h - {c} * ie"


def keops_softmin(x: np.ndarray, y: np.ndarray, cost: str, p: float) -> Callable:
    from ..kernels.keops_backend import compile_lock, import_pykeops, keops_cache_dir

    pykeops = import_pykeops()
    if pykeops is None:
        raise WflowError("pykeops cannot be imported; use sinkhorn with backend='numpy'")
    from pykeops.numpy import Genred

    d = x.shape[1]
    key = (cost, p if p in (1.0, 2.0) else "P", d)
    routine = _KEOPS_ROUTINES.get(key)
    if routine is None:
        aliases = [f"x = Vi({d})", f"y = Vj({d})", "h = Vj(1)", "ie = Pm(1)", "P = Pm(1)"]
        routine = Genred(keops_formula(cost, p), aliases, reduction_op="LogSumExp", axis=1)
    pvec = np.array([p])

    def softmin(eps: float, xs: np.ndarray, ys: np.ndarray, h: np.ndarray) -> np.ndarray:
        args = (xs, ys, np.ascontiguousarray(h[:, None]), np.array([1.0 / eps]), pvec)
        if key in _KEOPS_ROUTINES:
            out = routine(*args)
        else:  # first call compiles (10-25 s): hold the lock, silence KeOps' chatter
            try:
                with compile_lock(keops_cache_dir()), contextlib.redirect_stdout(io.StringIO()):
                    out = routine(*args)
            except Exception as exc:
                raise WflowError(
                    f"KeOps could not compile or run the Sinkhorn formula (cost={cost}, p={p}, d={d}): "
                    f"{type(exc).__name__}: {exc}; use backend='numpy'"
                ) from exc
            _KEOPS_ROUTINES[key] = routine
        return -eps * np.asarray(out)[:, 0]

    return softmin


def numpy_softmin(
    x: np.ndarray, y: np.ndarray, cost: str, p: float, block: int = 2**22
) -> Callable:
    from scipy.special import logsumexp

    dense: dict[tuple[int, int], np.ndarray] = {}

    def cost_block(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
        # |x - y|^2 = 2 - 2<x, y>: round-off 1e-16 in the squared chord, ample next to eps.
        g = np.clip(xs @ ys.T, -1.0, 1.0)
        if cost == "geodesic":
            c = 2.0 * np.arctan2(np.sqrt(2.0 - 2.0 * g), np.sqrt(2.0 + 2.0 * g))
            return c if p == 1 else c**p
        c2 = 2.0 - 2.0 * g
        return c2 if p == 2 else np.sqrt(c2) ** p

    def softmin(eps: float, xs: np.ndarray, ys: np.ndarray, h: np.ndarray) -> np.ndarray:
        n, m = xs.shape[0], ys.shape[0]
        k = (id(xs), id(ys))
        if n * m <= block:  # small: keep the four cost matrices
            if k not in dense:
                dense[k] = cost_block(xs, ys)
            return -eps * logsumexp(h[None, :] - dense[k] / eps, axis=1)
        out = np.empty(n)
        rows = max(1, block // m)
        for i in range(0, n, rows):
            out[i : i + rows] = -eps * logsumexp(
                h[None, :] - cost_block(xs[i : i + rows], ys) / eps, axis=1
            )
        return out

    return softmin


def sinkhorn(x, a, y, b, p, cost, reg, scaling, tol, max_iter, backend) -> tuple[float, dict]:
    r"""Debiased Sinkhorn divergence :math:`S_\varepsilon` (GeomLoss's symmetric loop, Feydy et al. 2019)."""
    if backend in ("auto", "keops"):
        # KeOps only where its probe passed (a compiler crash in a child, not in this process)
        from ..kernels import BACKENDS

        keops = BACKENDS["keops"]
        failure = keops.probe_failure()  # type: ignore[attr-defined]
        if backend == "keops" and failure:
            raise ValueError(failure)
        backend = "keops" if backend == "keops" or keops.available() else "numpy"
    softmin = (keops_softmin if backend == "keops" else numpy_softmin)(x, y, cost, p)
    a_log, b_log = np.log(a), np.log(b)
    diam_p = (np.pi if cost == "geodesic" else 2.0) ** p
    # eps-scaling (annealing): eps_k = diam^p * scaling^(p k) down to reg.
    n_steps = (
        max(0, int(math.ceil(math.log(reg / diam_p) / (p * math.log(scaling)))))
        if reg < diam_p
        else 0
    )
    eps_list = [diam_p * scaling ** (p * k) for k in range(n_steps)] + [reg]

    # f_ba, g_ab of OT_eps(mu, nu) by alternating Sinkhorn steps; f_aa, g_bb of OT_eps(mu, mu),
    # OT_eps(nu, nu) by averaged symmetric steps, which converge fast (Feydy et al. 2019, Sec. 3)
    f_ba, g_ab = np.zeros(x.shape[0]), np.zeros(y.shape[0])
    f_aa, g_bb = np.zeros(x.shape[0]), np.zeros(y.shape[0])

    def step(eps, f_ba, g_ab, f_aa, g_bb):
        f_new = softmin(eps, x, y, b_log + g_ab / eps)
        g_new = softmin(eps, y, x, a_log + f_new / eps)
        faa_new = 0.5 * (f_aa + softmin(eps, x, x, a_log + f_aa / eps))
        gbb_new = 0.5 * (g_bb + softmin(eps, y, y, b_log + g_bb / eps))
        return f_new, g_new, faa_new, gbb_new

    for eps in eps_list[:-1]:  # annealing: one step per eps
        f_ba, g_ab, f_aa, g_bb = step(eps, f_ba, g_ab, f_aa, g_bb)
    n_iter, converged, residual = len(eps_list) - 1, False, np.inf
    for _ in range(max(1, max_iter)):  # iterate at reg until the residual is below tol
        new = step(reg, f_ba, g_ab, f_aa, g_bb)
        # |f_new - f_old| / eps = |log of the row-marginal ratio| of the current plan
        residual = max(float(np.max(np.abs(t - o))) for o, t in zip((f_ba, g_ab, f_aa, g_bb), new))
        f_ba, g_ab, f_aa, g_bb = new
        n_iter += 1
        if residual <= tol:
            converged = True
            break
    div = float(a @ (f_ba - f_aa) + b @ (g_ab - g_bb))
    ent = lambda w: float(-(w @ np.log(w)))  # noqa: E731 - Shannon entropy of the weights
    bias = reg * 0.5 * (ent(a) + ent(b))
    info = {
        "reg": reg,
        "divergence": div,
        "bias_bound_pth_power": bias,
        "n_iter": n_iter,
        "converged": converged,
        "residual": residual,
        "backend": backend,
        "eps_schedule": len(eps_list),
    }
    return div, info
