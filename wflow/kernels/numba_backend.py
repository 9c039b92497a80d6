r"""Fast direct kernel sums on the CPU with numba: parallel rows, vectorized exponential.

The sums are those of :mod:`wflow.kernels` (shift :math:`c_i` = exact row maximum of
:math:`\ell_{ij} + \log w_j`), computed in one streamed pass per row with an online
maximum (as in "flash attention", Dao et al. 2022): columns are taken in blocks, and when a
block raises the running maximum of a row, its partial sums are rescaled by
:math:`e^{c_{old} - c_{new}}`.  The exponential is :func:`wflow.kernels.jit.exp64` /
``exp32``, plain arithmetic that LLVM vectorizes (``np.exp`` in a loop is a scalar libm
call); exponents are clamped at :func:`~wflow.kernels.exp_floor`.  The compiled passes live
in :mod:`wflow.kernels.numba_passes`; this module chooses the route and drives it.

Two routes:

* ``d`` (the row length of :math:`Qx`) below :data:`BLAS_MIN_DIM`: inner products in
  numba, tiles of :data:`TILE_ROWS` × :data:`TILE_COLS` kept in cache; ``prange`` over
  (system, row tile), so a batch of small systems is as parallel as one large one.
* larger ``d``: inner products and value sums by BLAS on blocks, numba for the exponential,
  the online maximum and the row sums.  One worker thread per core takes whole blocks, BLAS
  limited to one thread (:mod:`wflow.kernels.threads`); with few query rows the columns are
  split across tasks and the partial sums merged in a fixed order.

Accuracy: logits are formed in float64 even for float32 input (a float32 logit of size
:math:`\beta = 10^3` carries an absolute error of :math:`6\cdot 10^{-5}`), unless the direct
route proves float32 logits accurate enough (:mod:`wflow.kernels.precision`; small
:math:`\beta`, near-uniform weights), then the whole pass runs in float32.  Otherwise, for
float32 input, each float64 logit is rounded to float32 only after subtracting its row's
running shift :math:`c` (moved, and the block formed again, whenever a block's maximum lies
more than :data:`MIXED_JUMP` from it): a term's error is at most
:math:`2^{-24}(|\ell_{ij} - \max_j\ell_{ij}| + 8)`, and the relative error of the sums at most
:math:`2^{-24}(\log m + 8)` whatever :math:`\beta`.  Results agree with the exact sums to
about :math:`10^{-14}` (float64) and :math:`10^{-6}` (float32) relative.  For float32 the
returned ``log_scale`` is the row maximum rounded to float32 and ``mass``/``vector`` are
rescaled to match it.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from . import numba_passes
from .jit import LOG_ZERO
from .precision import float32_logits_bound
from .sums import KernelProblem, KernelSums, exp_floor, register_backend
from .threads import blas_threads, parallel

_FLOAT_MIN = float(np.finfo(np.float64).min)

__all__ = [
    "NumbaBackend",
    "choose_route",
    "TILE_ROWS",
    "TILE_COLS",
    "BLAS_MIN_DIM",
    "BLAS_BLOCK",
    "BLAS_TASKS",
    "SMALL_MIN_DIM",
]

#: Rows of one tile of the direct route (one task of the parallel loop).
TILE_ROWS = 16
#: Columns of one block of the direct route (logits and exponentials stay in L1).
TILE_COLS = 256
#: float32 input with float64 logits: how far a block's maximum may lie from its row's shift
#: before the shift moves (module docstring).
MIXED_JUMP = 8.0
#: Columns of one block of that mixed-precision kernel (its float32 buffers are half the size).
MIXED_TILE_COLS = 1024
#: From this dimension of :math:`Qx` on, inner products are computed by BLAS.
BLAS_MIN_DIM = 48
#: (rows, columns) of one block of the BLAS route (2 MB of float64 logits).
BLAS_BLOCK = (256, 1024)
#: The BLAS route splits the columns of a problem with fewer row blocks than this (a constant,
#: not the thread count: the same bits whatever the threads).
BLAS_TASKS = 32

#: Force one route ("direct", "blas" or "small"; None: :func:`choose_route`), for benchmarks and tests.
FORCE_ROUTE: str | None = None


def choose_route(B: int, n: int, m: int, p: int, dtype, q: int | None = None) -> str:
    """Which route of the numba backend computes ``B`` systems of ``n`` query rows, ``m`` sources, logit
    dimension ``p`` and value dimension ``q`` (default ``p``; 0 without values).

    * Tiny systems, ``n, m <=`` :data:`~wflow.kernels.small.SMALL_MAX` and ``p >=``
      :data:`SMALL_MIN_DIM`: the route with the least time predicted by the cost model of
      :mod:`wflow.kernels.cost`, ``"small"`` for either of the tiny-systems route's methods;
    * otherwise ``"direct"`` when ``p <`` :data:`BLAS_MIN_DIM`, else ``"blas"``.

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.kernels.numba_backend import choose_route
    >>> choose_route(1, 4, 4, 3, np.float64)  # a tiny system: the compiled pass of the small route
    'small'
    >>> choose_route(1, 10**5, 10**5, 3, np.float64)  # large, low logit dimension
    'direct'
    """
    if FORCE_ROUTE is not None:
        return FORCE_ROUTE
    from .small import SMALL_MAX

    if n <= SMALL_MAX and m <= SMALL_MAX and p >= SMALL_MIN_DIM:
        from . import cost

        route = cost.cheapest(B, n, m, p, p if q is None else q, dtype, cost.ROUTES)
        return "small" if route in ("fused", "gemm") else route
    return "direct" if p < BLAS_MIN_DIM else "blas"


#: Smallest logit dimension for which tiny systems take the "small" route (1: all of them;
#: raise it to send tiny low-dimensional systems to the direct route).
SMALL_MIN_DIM = 1


class NumbaBackend:
    """Direct kernel sums compiled with numba (see module docstring).

    Takes every problem (general Q, K, V, any batch, float32 and float64).  ``"auto"``
    picks it ahead of ``"numpy"``.

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.kernels import BACKENDS, KernelProblem
    >>> x = wflow.sphere.uniform(5, 3, seed=0)[None]
    >>> problem = KernelProblem(x=x, y=x, weights=np.full((1, 5), 0.2), beta=1.0, Q=None, K=None, V=None,
    ...                         values=True)
    >>> numba_backend = BACKENDS["numba"]
    >>> ours, ref = numba_backend(problem), BACKENDS["numpy"](problem)  # against the numpy reference
    >>> bool(np.allclose(np.exp(ours.log_scale) * ours.mass, np.exp(ref.log_scale) * ref.mass))
    True
    """

    name = "numba"
    reason = ""

    def available(self) -> bool:
        return True

    def accepts(self, problem: KernelProblem) -> bool:
        return True

    def __call__(self, problem: KernelProblem) -> KernelSums:
        dtype = problem.dtype
        x, y = problem.x, problem.y
        p = x.shape[-1] if problem.Q is None else problem.Q.shape[0]
        q = (y.shape[-1] if problem.V is None else problem.V.shape[0]) if problem.values else 0
        route = choose_route(x.shape[0], x.shape[1], y.shape[1], p, dtype, q)
        if route == "small":
            return self._small(problem)
        # logits in float64 even for float32 input; keys b stay in the input dtype (the
        # kernel's transposed copy upcasts them), values c in the working dtype
        a, b, logw, c = self._operands(problem)
        if problem.Q is None:
            a = np.multiply(x, problem.beta, dtype=np.float64)
        else:
            a *= problem.beta
        floor = exp_floor(dtype)
        zero = dtype.type(0)
        if route == "direct":
            shift, acc = self._direct(a, b, logw, c, floor, zero)
        else:
            shift, acc = self._blas(a, b, logw, c, floor, zero)
        if dtype != np.float64 and route != "direct":  # (the direct route does this itself)
            # the shift in the output dtype, mass and vector consistent with it
            c32 = shift.astype(dtype)
            acc *= np.exp(shift - c32.astype(np.float64))[..., None]
            shift = c32
        shift = shift.astype(dtype, copy=False)
        mass = acc[..., 0].astype(dtype)
        vec = acc[..., 1:].astype(dtype) if problem.values else None
        return KernelSums(shift, mass, vec, self.name)

    def _small(self, problem: KernelProblem) -> KernelSums:
        """The tiny-systems route (:mod:`wflow.kernels.small`), beta applied in its exponential pass."""
        from .small import small_sums

        a, b, logw, c = self._operands(problem)
        tol = problem.tol if problem.tol is not None and 0.0 < problem.tol < 1.0 else None
        shift, mass, vec = small_sums(
            a, b, logw, c, exp_floor(problem.dtype), problem.dtype, scale=problem.beta, tol=tol
        )
        return KernelSums(shift, mass, vec, self.name)

    @staticmethod
    def _operands(problem: KernelProblem):
        """``(Q x, K y, log w, V y or None)``, the products in float64 (``x``, ``y`` themselves for
        identities), ``log 0`` clamped at :data:`~wflow.kernels.jit.LOG_ZERO`."""
        f64 = np.float64
        x, y = problem.x, problem.y
        a = x if problem.Q is None else np.matmul(x, problem.Q.T.astype(f64), dtype=f64)
        b = y if problem.K is None else np.matmul(y, problem.K.T.astype(f64), dtype=f64)
        with np.errstate(divide="ignore"):
            logw = np.log(problem.weights, dtype=f64)
        logw = np.maximum(logw, LOG_ZERO, out=logw)
        c = None
        if problem.values:
            c = y if problem.V is None else y @ problem.V.T
        return a, b, logw, c

    @staticmethod
    def _direct(a, b, logw, c, floor, zero):
        B, n, p = a.shape
        m = b.shape[1]
        p4 = -(-p // 4) * 4
        # float32 input: float32 logits when provably accurate enough (module docstring), with
        # log-weights relative to their maximum (added back to the shift in float64)
        ldt = np.float64
        if type(zero) is np.float32:
            sq = lambda z: float(np.max(np.einsum("...i,...i->...", z, z), initial=0.0))  # noqa: E731
            # (b may be float32: the rounding of its squared norms)
            size = math.sqrt(sq(a) * sq(b)) * (1.0 + 1e-6)
            ok, lw_rel, lw_max = float32_logits_bound(p4, size, logw, floor)
            if ok:
                ldt = np.float32
                logw = lw_rel  # finite in float32 (at least -3e38): clamped at the floor anyway
        threads = numba.get_num_threads()
        # one column block (small systems): larger row tiles, fewer parallel tasks to set up
        rows = min(TILE_ROWS if m > TILE_COLS else 64, -(-n // 4) * 4)
        if B * -(-n // rows) < 8 * threads:  # few query rows: smaller tiles, work for every thread
            rows = max(4, min(rows, (n // (8 * threads * B)) // 4 * 4))
        n_pad = -(-n // rows) * rows
        if n_pad == n and p4 == p:
            a4 = np.ascontiguousarray(a, dtype=ldt)
        else:
            a4 = np.zeros((B, n_pad, p4), dtype=ldt)
            a4[:, :n, :p] = a
        bT = np.empty((B, p4, m), dtype=ldt)
        bT[:, :p, :] = np.swapaxes(b, 1, 2)
        bT[:, p:, :] = 0.0
        if c is None:
            gT = np.zeros((B, 0, m), dtype=type(zero))
        elif c is b and p4 == p and bT.dtype == type(zero):  # values = keys: share the transpose
            gT = bT
        else:
            gT = np.ascontiguousarray(np.swapaxes(c, 1, 2), dtype=type(zero))
        q = gT.shape[1]
        shift = np.empty((B, n_pad))
        acc = np.empty((B, n_pad, q + 1))
        cols = max(1, min(TILE_COLS, m))
        n_chunks = min(B * (n_pad // rows), 16 * threads)
        logw = np.ascontiguousarray(logw, dtype=ldt)
        if ldt is np.float64 and type(zero) is np.float32:
            # float64 logits, float32 everything after: each row's shift starts at a bound on
            # its logits, |a_i| max_j |b_j| + max_j log w_j (Cauchy-Schwarz)
            bn = np.sqrt(np.max(np.einsum("kpj,kpj->kj", bT, bT), axis=1, initial=0.0))
            upper = np.sqrt(np.einsum("kip,kip->ki", a4, a4)) * bn[:, None]
            upper += np.max(logw, axis=1, initial=LOG_ZERO)[:, None]
            cols = max(1, min(MIXED_TILE_COLS, m))
            numba_passes.direct_sums_mixed(
                a4, bT, logw, gT, upper, float(floor), MIXED_JUMP, rows, cols, n_chunks, shift, acc
            )
        else:
            numba_passes.direct_sums(
                a4, bT, logw, gT, float(floor), zero, rows, cols, n_chunks, shift, acc
            )
        shift = shift[:, :n]
        if ldt is np.float32:
            shift += lw_max[:, None]  # two float32 numbers, added exactly in float64
            # (the sum of two float32 numbers is not one)
            c32 = shift.astype(np.float32).astype(np.float64)
            acc[:, :n] *= np.exp(shift - c32)[..., None]
            shift = c32
        return shift, acc[:, :n]

    @staticmethod
    def _blas(a, b, logw, c, floor, zero):
        B, n, p = a.shape
        m = b.shape[1]
        q = 0 if c is None else c.shape[-1]
        cw = None if c is None else c.astype(type(zero), copy=False)
        convert = b.dtype != np.float64  # float32 keys: upcast block by block, in the workers
        threads = max(1, numba.get_num_threads())
        rows, cols = BLAS_BLOCK
        # tasks: (system, row block, column chunk), split by the shape alone (BLAS_TASKS)
        row_blocks = [(k, i0, min(i0 + rows, n)) for k in range(B) for i0 in range(0, n, rows)]
        n_split = (
            1
            if len(row_blocks) >= BLAS_TASKS
            else max(1, min(-(-BLAS_TASKS // len(row_blocks)), -(-m // cols)))
        )
        edges = [m * s // n_split for s in range(n_split + 1)]
        tasks = [
            (k, i0, i1, edges[s], edges[s + 1])
            for (k, i0, i1) in row_blocks
            for s in range(n_split)
        ]
        parts = [None] * len(tasks)

        def work(first: int) -> None:
            # one worker: every threads-th task, its own buffers, single-threaded BLAS
            L = np.empty((rows, cols))
            E = np.empty((rows, cols), dtype=type(zero))
            Bf = np.empty((cols, p)) if convert else None
            scale = np.empty(rows)
            for t in range(first, len(tasks), threads):
                k, i0, i1, ja, jb = tasks[t]
                R = i1 - i0
                mx = np.full(R, _FLOAT_MIN)
                mass = np.zeros(R)
                vec = np.zeros((R, q))
                for j0 in range(ja, jb, cols):
                    j1 = min(j0 + cols, jb)
                    J = j1 - j0
                    Lb = L.reshape(-1)[: R * J].reshape(R, J)  # contiguous views of the buffers
                    Eb = E.reshape(-1)[: R * J].reshape(R, J)
                    if Bf is not None:  # (convert)
                        bb = Bf[:J]
                        np.copyto(bb, b[k, j0:j1])
                    else:
                        bb = b[k, j0:j1]
                    np.matmul(a[k, i0:i1], bb.T, out=Lb)
                    numba_passes.exp_rows(
                        Lb, logw[k, j0:j1], Eb, mx, mass, scale[:R], float(floor), zero
                    )
                    if q:
                        vec *= scale[:R, None]
                        vec += Eb @ cw[k, j0:j1]
                parts[t] = (mx, mass, vec)

        with blas_threads(1):  # parallel over tasks, not inside each (small) GEMM
            parallel(work, min(threads, len(tasks)))
        shift = np.empty((B, n))
        acc = np.zeros((B, n, q + 1))
        for r, (k, i0, i1) in enumerate(row_blocks):
            ps = parts[r * n_split : (r + 1) * n_split]
            mx = np.max([pp[0] for pp in ps], axis=0)
            for pmx, pmass, pvec in ps:
                f = np.exp(np.maximum(pmx - mx, floor))
                acc[k, i0:i1, 0] += f * pmass
                acc[k, i0:i1, 1:] += f[:, None] * pvec
            shift[k, i0:i1] = mx
        return shift, acc


register_backend(NumbaBackend(), auto_priority=1)
