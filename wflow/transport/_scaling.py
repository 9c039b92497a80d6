"""Sinkhorn scaling on a fixed sparse pattern: the passes of :mod:`wflow.transport.multiscale`.

:class:`Scaling` runs them with numba on the host; :class:`wflow.transport._cuda.CudaScaling`
runs the same passes on a GPU.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from .sparse_kernels import absorb, gibbs_into, scale_cols, scale_rows

__all__ = ["FAR", "Scaling"]

# the solver's debug log: one logger for the whole multiscale solver
log = logging.getLogger("wflow.transport.multiscale")


#: a scaling u_i / a_i outside [1/FAR, FAR] is absorbed into its potential
FAR = math.exp(30)


class Scaling:
    """Sinkhorn scaling on a fixed pattern: ``pi_ij = u_i K_ij v_j``, ``K = e^{(f+g-c)/eps}``.

    The passes run with numba on the host's arrays; :class:`wflow.transport._cuda.CudaScaling`
    overrides the engine primitives (``_kernel``, ``_pass``, ``_far``, ``_save``, ``_restore``,
    ``absorb``, ``_finish``).  ``f``, ``g`` (the caller's arrays, updated in place), ``u``,
    ``v``, ``kv`` and ``err`` are the host's after :meth:`run`.
    """

    def __init__(self, pat, c, c_csc, a, b, f, g, eps, omega, state):
        self.pat, self.c, self.c_csc, self.a, self.b = pat, c, c_csc, a, b
        self.f, self.g, self.eps, self.omega, self.state = f, g, eps, omega, state
        self.err = np.inf
        self.relax, self.backoffs = omega, 0  # the relaxation in use, and how often it was halved
        self._kernel()

    def _kernel(self):
        pat = self.pat
        # float32 kernel values (the passes are bound by memory traffic): u K v is a plan whatever
        # K's rounding, and the marginals' float64 sums reach ~1e-7, far below the errors sought
        self.kv = gibbs_into(
            pat.ptr, pat.cols, self.c, self.f, self.g, self.eps, np.empty(pat.nnz, np.float32)
        )
        # potentials absorbed from a diverging iterate can overflow float32: clipped, any
        # nonnegative kernel still gives a plan
        np.minimum(self.kv, np.finfo(np.float32).max, out=self.kv)
        self.kv_csc = self.kv[pat.perm]
        self.u, self.v = self.a.copy(), self.b.copy()

    def _pass(self, w):
        """One over-relaxed pass (rows, then columns); the row marginals' L1 error before it."""
        pat = self.pat
        err = scale_rows(pat.ptr, pat.cols, self.kv, self.v, self.a, self.u, w)
        scale_cols(pat.cptr, pat.crows, self.kv_csc, self.u, self.b, self.v, w)
        return err

    def _far(self):
        """Whether some scaling ``u_i / a_i`` or ``v_j / b_j`` lies outside ``[1/FAR, FAR]``."""
        return any(r.max() > FAR or r.min() < 1.0 / FAR for r in (self.u / self.a, self.v / self.b))

    def _save(self):
        return (self.f.copy(), self.g.copy(), self.u.copy(), self.v.copy())

    def _restore(self, saved):
        self.f[:], self.g[:] = saved[0], saved[1]
        self._kernel()
        self.u[:], self.v[:] = saved[2], saved[3]

    def _finish(self):
        """Leave ``u``, ``v`` on the host (they are)."""

    def absorb(self):
        """Move the scalings into the potentials (the plan is unchanged)."""
        absorb(self.f, self.u, self.a, self.eps)
        absorb(self.g, self.v, self.b, self.eps)
        self._kernel()

    def run(self, need, it_max):
        """Returns ``"ok"`` (error <= need), ``"stalled"`` (less than 10 % gained in 200 passes) or ``"budget"``.

        The relaxation ramps up from 1 to ``omega`` over the first 20 passes.  Over-relaxed
        Sinkhorn converges only near its fixed point: a window of 20 passes whose smallest
        error is 10 times the best before it (or not finite) sends the scalings back to the
        best ones and halves the relaxation towards 1; it doubles back towards ``omega`` each
        time the error has fallen tenfold since.
        """
        try:
            return self._run(need, it_max)
        finally:
            self._finish()

    def _run(self, need, it_max):
        best, mark, window, since = np.inf, np.inf, np.inf, np.inf
        saved = None
        for it in range(it_max):
            w = 1.0 + (self.relax - 1.0) * min(1.0, (it + 1) / 20.0)
            self.err = self._pass(w)
            self.state["passes"] += 1
            if self.err <= need:
                return "ok"
            finite = math.isfinite(self.err)
            window = min(window, self.err) if finite else np.nan
            if not finite or it % 20 == 19:
                if not window <= 10 * best:  # diverging: back to the best scalings, relax less
                    self.relax = 1.0 + 0.5 * (self.relax - 1.0)
                    self.backoffs += 1
                    log.debug(
                        "pass %d: err %.3g, best %.3g, omega -> %.3g", it, window, best, self.relax
                    )
                    if saved is None:
                        raise FloatingPointError(
                            f"the Sinkhorn scaling at eps={self.eps:.3g} diverged on its first passes"
                        )
                    self._restore(saved)
                    since = best
                elif window <= best:
                    best = window
                    saved = self._save()
                    if best < 0.1 * since and self.relax < self.omega:
                        self.relax = min(self.omega, 1.0 + 2.0 * (self.relax - 1.0))
                        since = best
                window = np.inf
            if it % 200 == 199:
                if best > 0.9 * mark:
                    return "stalled"
                mark = best
            if self._far():  # checked every pass: a scaling can leave float64's range
                self.absorb()  # within a few (a saved state stays valid)
        return "budget"
