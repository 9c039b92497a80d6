r"""Fast direct kernel sums on the CPU with numba: parallel rows, vectorized exponential.

The sums are those of :mod:`wflow.kernels` (shift :math:`c_i` = exact row maximum of
:math:`\ell_{ij} + \log w_j`), computed in one streamed pass per row with an online
maximum (as in "flash attention", Dao et al. 2022): columns are taken in blocks,
and when a block raises the running maximum of a row the partial sums of that row
are rescaled by :math:`e^{c_{old} - c_{new}}`.  The final shift is the exact row
maximum; no array larger than a fixed block is ever held.

Why it is fast (see ``PITFALLS.md``): numba has no SVML here, so ``np.exp`` inside
a loop is a scalar libm call.  :func:`_exp64` and :func:`_exp32` write the
exponential with plain arithmetic — Cody–Waite range reduction
:math:`e^x = 2^k e^r`, :math:`|r| \le \tfrac12\log 2`, a near-minimax (Chebyshev
interpolation) polynomial for :math:`e^r` of degree 10 (float64, relative error
:math:`2\cdot 10^{-15}`) or 6 (float32, :math:`3\cdot 10^{-9}`), and :math:`2^k` built
from the exponent bits — so LLVM vectorizes the loop over columns (AVX2: 4 float64
or 8 float32 lanes).  Exponents are clamped at :func:`~wflow.kernels.exp_floor`, so
:math:`k` stays in the normal range and no subnormal number appears.

Two routes:

* ``d`` (the row length of :math:`Qx`) up to :data:`BLAS_MIN_DIM` - 1: inner
  products in numba, tiles of :data:`TILE_ROWS` rows × :data:`TILE_COLS` columns
  kept in L1/L2 cache; ``prange`` over (system, row tile), so a batch of many small
  systems is as parallel as one large one.
* larger ``d``: inner products by BLAS on blocks, numba only for the
  exponential, the online maximum and the row sums; the value sums
  :math:`\sum_j e_{ij} V y_j` by BLAS as well.  One worker thread per core takes
  whole blocks (numpy's matmul and the numba kernel release the GIL) with BLAS
  limited to one thread (threadpoolctl): small GEMMs split across a 2-core machine's
  OpenBLAS threads are slow and, when the machine is shared, erratic.  With few query
  rows the columns are split across workers and the partial sums merged.

Accuracy: logits are formed in float64 even for float32 input (a float32 logit of
size :math:`\beta = 10^3` carries an absolute error of :math:`6\cdot 10^{-5}`, which
would be a relative error of the sum) — unless the direct route can prove that float32
logits are accurate enough: with log-weights taken relative to their maximum, the
rounding error of each exponent is at most
:math:`2^{-24}\big((p+2)\max_i|a_i|\max_j|b_j| + 2\max_j|\log w_j - \max\log w|\big)`,
and when that is below :data:`LOWP_LOGIT_ERROR` (3e-6; small :math:`\beta`, near-uniform
weights) the whole pass runs in float32, twice the SIMD lanes.  Otherwise (float32 input,
float64 logits) the direct route rounds each logit to float32 only after subtracting its
row's running shift :math:`c` (which starts at the bound :math:`|a_i|\max_j|b_j| + \max_j\log w_j`
and moves, the block being formed again, whenever a block's maximum lies more than
:data:`MIXED_JUMP` away from it): the error of a term is then at most
:math:`2^{-24}(|\ell_{ij} - \max_j\ell_{ij}| + 8)`, and since the terms' softmax weights
:math:`\pi_j` satisfy :math:`\sum_j \pi_j(\max\ell - \ell_j) \le \log m`, the relative error
of the sums from it is at most :math:`2^{-24}(\log m + 8)`, 1.2e-6 at :math:`m = 10^5` —
whatever :math:`\beta`.  The exponentials, the maxima and the value sums then all run in
float32.  The exponential and the value sums run in the input precision, partial sums of
each block are added in float64.  Results
agree with the exact sums to about :math:`10^{-14}` (float64) and :math:`10^{-6}`
(float32) relative, at any :math:`\beta`.  For float32 the returned ``log_scale`` is
the row maximum rounded to float32 and ``mass``/``vector`` are rescaled to match it,
so ``exp(log_scale) * mass`` keeps float64-level consistency.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from . import KernelProblem, KernelSums, exp_floor, register_backend

__all__ = [
    "NumbaBackend",
    "choose_route",
    "TILE_ROWS",
    "TILE_COLS",
    "BLAS_MIN_DIM",
    "BLAS_BLOCK",
    "SMALL_MIN_DIM",
]

#: Rows of one tile of the direct route (one task of the parallel loop).
TILE_ROWS = 16
#: Columns of one block of the direct route (logits and exponentials stay in L1).
TILE_COLS = 256
#: float32 input: the direct route forms its logits in float32 when their rounding error is
#: provably below this (relative, per term; a third of the 1e-5 float32 results are held to),
#: else in float64 (module docstring).
LOWP_LOGIT_ERROR = 3e-6
#: float32 input with float64 logits (direct route): each logit is rounded to float32 after
#: subtracting its row's running shift, which is moved (and the block formed again) when a
#: block's maximum lies more than this above it; the rounding error of a term is at most
#: ``2^-24 (|l - max l| + MIXED_JUMP)``.
MIXED_JUMP = 8.0
#: Columns of one block of that mixed-precision kernel (its float32 buffers are half the size;
#: 1024 ran 7 % (d = 3) and 15 % (d = 16) faster than 256, measured side by side).
MIXED_TILE_COLS = 1024
#: From this dimension of :math:`Qx` on, inner products are computed by BLAS.
BLAS_MIN_DIM = 48
#: (rows, columns) of one block of the BLAS route (2 MB of float64 logits, one block per
#: thread at a time; each thread runs single-threaded GEMMs on its own blocks).
BLAS_BLOCK = (256, 1024)

_FLOAT_MIN = float(np.finfo(np.float64).min)
#: Stands for log(0) so that every number the kernels see is finite (they are
#: compiled with the no-inf/no-nan fast-math flags); e^(-1e300 - c) is clamped to
#: e^floor exactly as the numpy backend clamps e^(-inf).
_LOG_ZERO = -1e300

try:  # numba is optional: without it the backend reports itself unavailable
    import numba
    from llvmlite import ir as _ir
    from numba import njit, prange
    from numba.core import types as _types
    from numba.extending import intrinsic, overload

    _NUMBA_ERROR = ""
except Exception as exc:  # ImportError, or a numba/llvmlite mismatch
    numba = None
    _NUMBA_ERROR = f"numba cannot be imported ({type(exc).__name__}: {exc}); install numba"


if numba is not None:
    # Fast-math flags.  The exponential must not get "reassoc": it would fold the
    # round-to-integer trick (x*log2e + S) - S into x*log2e and merge the two
    # Cody-Waite steps.  The summing loops need "reassoc" to vectorize reductions.
    _FM_EXP = {"nnan", "ninf", "nsz", "contract"}
    _FM_SUM = {"nnan", "ninf", "nsz", "contract", "reassoc"}

    @intrinsic
    def _pow2_of_shifted64(typingctx, t):
        """``2**k`` for ``t = k + 1.5 * 2**52`` exactly (k in the normal exponent range)."""

        def codegen(context, builder, signature, args):
            i = builder.bitcast(args[0], _ir.IntType(64))
            # the shifter's own bits leave through the top; k lands in the exponent field
            i = builder.shl(i, _ir.Constant(_ir.IntType(64), 52))
            i = builder.add(i, _ir.Constant(_ir.IntType(64), 1023 << 52))
            return builder.bitcast(i, _ir.DoubleType())

        return _types.float64(_types.float64), codegen

    @intrinsic
    def _pow2_of_shifted32(typingctx, t):
        """``2**k`` for ``t = k + 1.5 * 2**23`` exactly (k in the normal exponent range)."""

        def codegen(context, builder, signature, args):
            i = builder.bitcast(args[0], _ir.IntType(32))
            i = builder.shl(i, _ir.Constant(_ir.IntType(32), 23))
            i = builder.add(i, _ir.Constant(_ir.IntType(32), 127 << 23))
            return builder.bitcast(i, _ir.FloatType())

        return _types.float32(_types.float32), codegen

    #: the LLVM function attribute that lets the loop vectorizer use 512-bit registers: LLVM's default
    #: for AVX-512 cores is 256 (the "prefer-256-bit" tuning), under which the exponential loops of the
    #: fused SA step run 4 float64 lanes instead of 8 (0.56 against 1.07 ns per e^x, one core, 1024
    #: exponentials in L1; no effect on cores without AVX-512)
    _WIDE_VECTORS = '"prefer-vector-width"="512"'

    @intrinsic
    def _prefer_wide_vectors(typingctx):
        """Called first in a compiled function: its loops may be vectorized 512 bits wide (see
        :data:`_WIDE_VECTORS`); the calling function is marked (functions LLVM inlines into it follow
        it), the numbers unchanged to rounding (reductions may split into more partial sums).  A no-op
        when llvmlite refuses the attribute."""

        def codegen(context, builder, signature, args):
            attrs = builder.function.attributes
            try:  # llvmlite checks attributes against a list of keywords: add the string one past it
                set.add(attrs, _WIDE_VECTORS)
            except Exception:  # pragma: no cover - a different llvmlite
                pass
            return context.get_dummy_value()

        return _types.void(), codegen

    @njit(cache=True, fastmath=_FM_EXP)
    def _exp64(x):
        """e^x for float64 x in [-708, 0.3]: relative error about 2e-15."""
        t = x * 1.4426950408889634 + 6755399441055744.0  # k + 1.5*2^52, k = round(x/log 2)
        k = t - 6755399441055744.0
        r = x - k * 6.93147180369123816490e-01  # Cody-Waite: log 2 = hi + lo, k*hi exact
        r = r - k * 1.90821492927058770002e-10
        # Chebyshev interpolant of e^r on |r| <= log(2)/2 + 1e-3, degree 10
        p = 2.654918910414338e-07
        p = p * r + 2.7634529673057688e-06
        p = p * r + 2.4804475315593808e-05
        p = p * r + 0.00019841184597455588
        p = p * r + 0.001388888610320244
        p = p * r + 0.008333333373576392
        p = p * r + 0.041666666677520954
        p = p * r + 0.1666666666659264
        p = p * r + 0.499999999999845
        p = p * r + 1.0000000000000033
        p = p * r + 1.0000000000000004
        return p * _pow2_of_shifted64(t)

    @njit(cache=True, fastmath=_FM_EXP)
    def _exp32(x):
        """e^x for float32 x in [-87, 0.3]: relative error about 1e-7."""
        t = x * np.float32(1.4426950408889634) + np.float32(12582912.0)  # k + 1.5*2^23
        k = t - np.float32(12582912.0)
        r = x - k * np.float32(0.693145751953125)
        r = r - k * np.float32(1.428606765330187045e-06)
        p = np.float32(0.0013941411161795259)
        p = p * r + np.float32(0.00837536808103323)
        p = p * r + np.float32(0.04166634753346443)
        p = p * r + np.float32(0.16666412353515625)
        p = p * r + np.float32(0.5)
        p = p * r + np.float32(1.0)
        p = p * r + np.float32(1.0)
        return p * _pow2_of_shifted32(t)

    def _exp(x):  # pragma: no cover - replaced by the overload inside numba
        return np.exp(x)

    @overload(_exp, inline="never")
    def _exp_overload(x):
        if x == _types.float32:
            return lambda x: _exp32(x)
        return lambda x: _exp64(x)

    def _round_as(x, zero):  # pragma: no cover - replaced by the overload inside numba
        return x

    @overload(_round_as)
    def _round_as_overload(x, zero):
        """float64 x rounded to the dtype of ``zero`` (returned as float64)."""
        if zero == _types.float32:
            return lambda x, zero: np.float64(np.float32(x))
        return lambda x, zero: x

    def _exp_as(x, zero):  # pragma: no cover - replaced by the overload inside numba
        return np.exp(x)

    @overload(_exp_as, inline="never")
    def _exp_as_overload(x, zero):
        """e^x in the dtype of ``zero`` (x is converted first: float32 runs 8 lanes, not 4)."""
        if zero == _types.float32:
            return lambda x, zero: _exp32(np.float32(x))
        return lambda x, zero: _exp64(np.float64(x))

    @njit(inline="always", cache=True, fastmath=_FM_SUM)
    def _value_sums4(gTk, j0, j1, e, acc, r4, zero):
        """acc[r4 + s, 1 + l] += sum_j e[s, j] g_l(j) for the 4 rows s of one block: each value
        load feeds 4 FMAs; partial sums in the dtype of ``zero``."""
        e0, e1, e2, e3 = e[0], e[1], e[2], e[3]
        for l in range(gTk.shape[0]):
            g = gTk[l, j0:j1]
            t0 = zero
            t1 = zero
            t2 = zero
            t3 = zero
            for jj in range(j1 - j0):
                gj = g[jj]
                t0 += e0[jj] * gj
                t1 += e1[jj] * gj
                t2 += e2[jj] * gj
                t3 += e3[jj] * gj
            acc[r4, l + 1] += t0
            acc[r4 + 1, l + 1] += t1
            acc[r4 + 2, l + 1] += t2
            acc[r4 + 3, l + 1] += t3

    @njit(parallel=True, cache=True, fastmath=_FM_SUM)
    def _direct_sums(a, bT, logw, gT, floor, zero, rows, cols, n_chunks, shift, acc_out):
        """a (B, n, p) with n a multiple of rows, rows and p multiples of 4, bT (B, p, m),
        logw (B, m) finite, all float64; gT (B, q, m) values in the working dtype (that of
        zero).  Writes shift (B, n) and acc_out (B, n, 1 + q) = (mass, vector), float64.

        The B * n / rows tiles are split into n_chunks contiguous runs, one parallel task
        each, so that the work buffers are allocated once per task, not once per tile
        (thousands of tiny systems would otherwise spend most of their time in malloc)."""
        B, n, p = a.shape
        m = bT.shape[2]
        q = gT.shape[1]
        ntile = n // rows
        n_tasks = B * ntile
        for chunk in prange(n_chunks):
            buf = np.empty(
                (4, cols), a.dtype
            )  # logits: float64, or float32 when that is accurate enough
            cf = np.empty(2, a.dtype)  # the row's shift and the floor in the logits' dtype
            e = np.empty((4, cols), gT.dtype)
            mx = np.empty(rows)
            acc = np.empty((rows, q + 1))
            for task in range(chunk * n_tasks // n_chunks, (chunk + 1) * n_tasks // n_chunks):
                k = task // ntile
                i0 = (task % ntile) * rows
                mx[:] = _FLOAT_MIN
                acc[:] = 0.0
                for j0 in range(0, m, cols):
                    j1 = min(j0 + cols, m)
                    J = j1 - j0
                    lw = logw[k, j0:j1]
                    x0, x1, x2, x3 = buf[0], buf[1], buf[2], buf[3]
                    for r4 in range(0, rows, 4):
                        A = a[k, i0 + r4 : i0 + r4 + 4]
                        # logits <a_i, b_j> + log w_j for 4 rows at once: each b load feeds 4 FMAs
                        for l in range(0, p, 4):
                            b0 = bT[k, l, j0:j1]
                            b1 = bT[k, l + 1, j0:j1]
                            b2 = bT[k, l + 2, j0:j1]
                            b3 = bT[k, l + 3, j0:j1]
                            a00, a01, a02, a03 = A[0, l], A[0, l + 1], A[0, l + 2], A[0, l + 3]
                            a10, a11, a12, a13 = A[1, l], A[1, l + 1], A[1, l + 2], A[1, l + 3]
                            a20, a21, a22, a23 = A[2, l], A[2, l + 1], A[2, l + 2], A[2, l + 3]
                            a30, a31, a32, a33 = A[3, l], A[3, l + 1], A[3, l + 2], A[3, l + 3]
                            if l == 0:
                                for jj in range(J):
                                    x0[jj] = (
                                        lw[jj]
                                        + a00 * b0[jj]
                                        + a01 * b1[jj]
                                        + a02 * b2[jj]
                                        + a03 * b3[jj]
                                    )
                                    x1[jj] = (
                                        lw[jj]
                                        + a10 * b0[jj]
                                        + a11 * b1[jj]
                                        + a12 * b2[jj]
                                        + a13 * b3[jj]
                                    )
                                    x2[jj] = (
                                        lw[jj]
                                        + a20 * b0[jj]
                                        + a21 * b1[jj]
                                        + a22 * b2[jj]
                                        + a23 * b3[jj]
                                    )
                                    x3[jj] = (
                                        lw[jj]
                                        + a30 * b0[jj]
                                        + a31 * b1[jj]
                                        + a32 * b2[jj]
                                        + a33 * b3[jj]
                                    )
                            else:
                                for jj in range(J):
                                    x0[jj] += (
                                        a00 * b0[jj] + a01 * b1[jj] + a02 * b2[jj] + a03 * b3[jj]
                                    )
                                    x1[jj] += (
                                        a10 * b0[jj] + a11 * b1[jj] + a12 * b2[jj] + a13 * b3[jj]
                                    )
                                    x2[jj] += (
                                        a20 * b0[jj] + a21 * b1[jj] + a22 * b2[jj] + a23 * b3[jj]
                                    )
                                    x3[jj] += (
                                        a30 * b0[jj] + a31 * b1[jj] + a32 * b2[jj] + a33 * b3[jj]
                                    )
                        # block maxima of the 4 rows in one pass
                        m0 = x0[0]
                        m1 = x1[0]
                        m2 = x2[0]
                        m3 = x3[0]
                        for jj in range(J):
                            m0 = max(m0, x0[jj])
                            m1 = max(m1, x1[jj])
                            m2 = max(m2, x2[jj])
                            m3 = max(m3, x3[jj])
                        for s in range(4):
                            r = r4 + s
                            bm = m0 if s == 0 else (m1 if s == 1 else (m2 if s == 2 else m3))
                            if (
                                bm > mx[r]
                            ):  # online maximum: rescale what this row has summed so far
                                sc = _exp64(max(mx[r] - bm, floor))
                                for l in range(q + 1):
                                    acc[r, l] *= sc
                                mx[r] = bm
                            cf[0] = mx[r]
                            cf[1] = floor
                            c = cf[0]
                            fl = cf[1]
                            xs = buf[s]
                            es = e[s]
                            t = zero
                            for jj in range(J):
                                v = _exp_as(max(xs[jj] - c, fl), zero)
                                es[jj] = v
                                t += v
                            acc[r, 0] += t
                        _value_sums4(gT[k], j0, j1, e, acc, r4, zero)
                for r in range(rows):
                    # report the shift in the working dtype, and the sums consistent with it
                    c = _round_as(mx[r], zero)
                    f = _exp64(max(mx[r] - c, floor)) if c != mx[r] else 1.0
                    shift[k, i0 + r] = c
                    for l in range(q + 1):
                        acc_out[k, i0 + r, l] = acc[r, l] * f

    @njit(cache=True, fastmath=_FM_SUM)
    def _block_max(ai, bTk, lw, j0, J):
        """max_j (<ai, b_j> + lw_j) over the block's J columns from j0, in float64."""
        mx = _FLOAT_MIN
        for jj in range(J):
            t = lw[jj]
            for l in range(ai.shape[0]):
                t += ai[l] * bTk[l, j0 + jj]
            mx = max(mx, t)
        return mx

    @njit(parallel=True, cache=True, fastmath=_FM_SUM)
    def _direct_sums_mixed(
        a, bT, logw, gT, upper, floor, jump, rows, cols, n_chunks, shift, acc_out
    ):
        """float32 input whose logits need float64: as :func:`_direct_sums` (same arguments,
        and ``upper`` (B, n) a bound on each row's logits), but each logit leaves the float64
        FMA loop already shifted, ``l - c`` rounded to float32, so that the exponentials, the
        sums and the value sums run in float32 on 8 lanes from a half-size buffer.

        The shift ``c`` of a row must be known before its block is formed: the row's running
        shift, at first ``upper``.  The exact float64 maximum of the block comes out of the
        same loop; when it lies more than ``jump`` above the shift (or, in a row's first
        block, more than ``jump`` below it), the shift moves to it and the block is formed
        again.  So every stored value ``l - c`` with ``l`` above ``c - jump`` is at most
        ``jump`` in size and rounds with an absolute error below ``2^-24 (|l - c_final| + jump)``."""
        B, n, p = a.shape
        m = bT.shape[2]
        q = gT.shape[1]
        ntile = n // rows
        n_tasks = B * ntile
        lastl = p - 4
        for chunk in prange(n_chunks):
            buf = np.empty((4, cols))  # float64 partial logits (p > 4)
            xv = np.empty((4, cols), np.float32)  # l - c, then e^(l - c')
            mx = np.empty(rows)  # the rows' shifts (float64)
            acc = np.empty((rows, q + 1))
            cs = np.empty(4)
            bmax = np.empty(4, np.float32)
            best = np.empty(rows)  # the rows' maxima (to float32 accuracy): the reported shifts
            for task in range(chunk * n_tasks // n_chunks, (chunk + 1) * n_tasks // n_chunks):
                k = task // ntile
                i0 = (task % ntile) * rows
                for r in range(rows):
                    mx[r] = upper[k, i0 + r]
                best[:] = _FLOAT_MIN
                acc[:] = 0.0
                first = True
                for j0 in range(0, m, cols):
                    j1 = min(j0 + cols, m)
                    J = j1 - j0
                    lw = logw[k, j0:j1]
                    x0, x1, x2, x3 = buf[0], buf[1], buf[2], buf[3]
                    v0, v1, v2, v3 = xv[0], xv[1], xv[2], xv[3]
                    for r4 in range(0, rows, 4):
                        A = a[k, i0 + r4 : i0 + r4 + 4]
                        for s in range(4):
                            cs[s] = mx[r4 + s]
                        for attempt in range(2):
                            c0, c1, c2, c3 = cs[0], cs[1], cs[2], cs[3]
                            for l in range(0, p, 4):
                                b0 = bT[k, l, j0:j1]
                                b1 = bT[k, l + 1, j0:j1]
                                b2 = bT[k, l + 2, j0:j1]
                                b3 = bT[k, l + 3, j0:j1]
                                a00, a01, a02, a03 = A[0, l], A[0, l + 1], A[0, l + 2], A[0, l + 3]
                                a10, a11, a12, a13 = A[1, l], A[1, l + 1], A[1, l + 2], A[1, l + 3]
                                a20, a21, a22, a23 = A[2, l], A[2, l + 1], A[2, l + 2], A[2, l + 3]
                                a30, a31, a32, a33 = A[3, l], A[3, l + 1], A[3, l + 2], A[3, l + 3]
                                if l == lastl:
                                    # last 4 components: finish the logit, shift, round to float32
                                    if l == 0:  # p = 4: the logits start from the log-weights
                                        for jj in range(J):
                                            v0[jj] = np.float32(
                                                max(
                                                    lw[jj]
                                                    + a00 * b0[jj]
                                                    + a01 * b1[jj]
                                                    + a02 * b2[jj]
                                                    + a03 * b3[jj]
                                                    - c0,
                                                    floor,
                                                )
                                            )
                                            v1[jj] = np.float32(
                                                max(
                                                    lw[jj]
                                                    + a10 * b0[jj]
                                                    + a11 * b1[jj]
                                                    + a12 * b2[jj]
                                                    + a13 * b3[jj]
                                                    - c1,
                                                    floor,
                                                )
                                            )
                                            v2[jj] = np.float32(
                                                max(
                                                    lw[jj]
                                                    + a20 * b0[jj]
                                                    + a21 * b1[jj]
                                                    + a22 * b2[jj]
                                                    + a23 * b3[jj]
                                                    - c2,
                                                    floor,
                                                )
                                            )
                                            v3[jj] = np.float32(
                                                max(
                                                    lw[jj]
                                                    + a30 * b0[jj]
                                                    + a31 * b1[jj]
                                                    + a32 * b2[jj]
                                                    + a33 * b3[jj]
                                                    - c3,
                                                    floor,
                                                )
                                            )
                                    else:
                                        for jj in range(J):
                                            v0[jj] = np.float32(
                                                max(
                                                    x0[jj]
                                                    + a00 * b0[jj]
                                                    + a01 * b1[jj]
                                                    + a02 * b2[jj]
                                                    + a03 * b3[jj]
                                                    - c0,
                                                    floor,
                                                )
                                            )
                                            v1[jj] = np.float32(
                                                max(
                                                    x1[jj]
                                                    + a10 * b0[jj]
                                                    + a11 * b1[jj]
                                                    + a12 * b2[jj]
                                                    + a13 * b3[jj]
                                                    - c1,
                                                    floor,
                                                )
                                            )
                                            v2[jj] = np.float32(
                                                max(
                                                    x2[jj]
                                                    + a20 * b0[jj]
                                                    + a21 * b1[jj]
                                                    + a22 * b2[jj]
                                                    + a23 * b3[jj]
                                                    - c2,
                                                    floor,
                                                )
                                            )
                                            v3[jj] = np.float32(
                                                max(
                                                    x3[jj]
                                                    + a30 * b0[jj]
                                                    + a31 * b1[jj]
                                                    + a32 * b2[jj]
                                                    + a33 * b3[jj]
                                                    - c3,
                                                    floor,
                                                )
                                            )
                                    # the block's maxima relative to the shifts (float32, 8 lanes)
                                    m0 = v0[0]
                                    m1 = v1[0]
                                    m2 = v2[0]
                                    m3 = v3[0]
                                    for jj in range(J):
                                        m0 = max(m0, v0[jj])
                                        m1 = max(m1, v1[jj])
                                        m2 = max(m2, v2[jj])
                                        m3 = max(m3, v3[jj])
                                    bmax[0] = m0
                                    bmax[1] = m1
                                    bmax[2] = m2
                                    bmax[3] = m3
                                elif l == 0:
                                    for jj in range(J):
                                        x0[jj] = (
                                            lw[jj]
                                            + a00 * b0[jj]
                                            + a01 * b1[jj]
                                            + a02 * b2[jj]
                                            + a03 * b3[jj]
                                        )
                                        x1[jj] = (
                                            lw[jj]
                                            + a10 * b0[jj]
                                            + a11 * b1[jj]
                                            + a12 * b2[jj]
                                            + a13 * b3[jj]
                                        )
                                        x2[jj] = (
                                            lw[jj]
                                            + a20 * b0[jj]
                                            + a21 * b1[jj]
                                            + a22 * b2[jj]
                                            + a23 * b3[jj]
                                        )
                                        x3[jj] = (
                                            lw[jj]
                                            + a30 * b0[jj]
                                            + a31 * b1[jj]
                                            + a32 * b2[jj]
                                            + a33 * b3[jj]
                                        )
                                else:
                                    for jj in range(J):
                                        x0[jj] += (
                                            a00 * b0[jj]
                                            + a01 * b1[jj]
                                            + a02 * b2[jj]
                                            + a03 * b3[jj]
                                        )
                                        x1[jj] += (
                                            a10 * b0[jj]
                                            + a11 * b1[jj]
                                            + a12 * b2[jj]
                                            + a13 * b3[jj]
                                        )
                                        x2[jj] += (
                                            a20 * b0[jj]
                                            + a21 * b1[jj]
                                            + a22 * b2[jj]
                                            + a23 * b3[jj]
                                        )
                                        x3[jj] += (
                                            a30 * b0[jj]
                                            + a31 * b1[jj]
                                            + a32 * b2[jj]
                                            + a33 * b3[jj]
                                        )
                            again = False
                            for s in range(4):
                                if bmax[s] > jump or (first and bmax[s] < -jump):
                                    # the values must be formed again against the block's maximum
                                    if bmax[s] > floor:
                                        cs[s] += bmax[s]
                                    else:  # all clamped: that maximum is not in the float32 values
                                        cs[s] = _block_max(A[s], bT[k], lw, j0, J)
                                    again = True
                            if not again:
                                break
                        # move the shifts up to the block maxima (by at most jump), rescaling the sums
                        for s in range(4):
                            r = r4 + s
                            if bmax[s] > floor:
                                best[r] = max(best[r], cs[s] + bmax[s])
                            up = max(bmax[s], 0.0)
                            cnew = cs[s] + up
                            if first:  # nothing summed yet: the shift may also move down
                                mx[r] = cnew
                            elif cnew > mx[r]:
                                sc = _exp64(max(mx[r] - cnew, floor))
                                for l in range(q + 1):
                                    acc[r, l] *= sc
                                mx[r] = cnew
                            d = np.float32(up)
                            fl = np.float32(floor)
                            vs = xv[s]
                            t = np.float32(0.0)
                            for jj in range(J):
                                e = _exp32(max(vs[jj] - d, fl))
                                vs[jj] = e
                                t += e
                            acc[r, 0] += t
                        _value_sums4(gT[k], j0, j1, xv, acc, r4, np.float32(0.0))
                    first = False
                for r in range(rows):
                    # report the row's maximum (as the other routes do), rounded to float32
                    c = np.float64(np.float32(best[r] if best[r] > _FLOAT_MIN else mx[r]))
                    f = (
                        math.exp(mx[r] - c) if c != mx[r] else 1.0
                    )  # mx >= the maximum, by at most jump
                    shift[k, i0 + r] = c
                    for l in range(q + 1):
                        acc_out[k, i0 + r, l] = acc[r, l] * f

    @njit(cache=True, nogil=True, fastmath=_FM_SUM)
    def _exp_rows(L, lw, E, mx, mass, scale, floor, zero):
        """BLAS route, one block, serially.  L (R, J) float64 logits, lw (J,) log-weights;
        E (R, J) working dtype.  Updates the running maxima mx and masses (R,) in place,
        writes the exponentials e^(L + lw - mx) to E and the factor by which each row's
        earlier value sums must be rescaled to scale.

        Serial and GIL-free: the BLAS route runs one such worker per core (Python threads,
        single-threaded BLAS); an OpenMP team spinning beside OpenBLAS's own threads on a
        small, shared machine slows both by 10-50x."""
        R, J = L.shape
        for r in range(R):
            Lr = L[r]
            Er = E[r]
            bm = _FLOAT_MIN
            for jj in range(J):
                bm = max(bm, Lr[jj] + lw[jj])
            sc = 1.0
            if bm > mx[r]:
                sc = _exp64(max(mx[r] - bm, floor))
                mx[r] = bm
            c = mx[r]
            t = zero
            for jj in range(J):
                v = _exp_as(max(Lr[jj] + lw[jj] - c, floor), zero)
                Er[jj] = v
                t += v
            mass[r] = mass[r] * sc + t
            scale[r] = sc

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


#: Force one route of the numba backend ("direct", "blas" or "small"; None: :func:`choose_route`).
#: For benchmarks and tests.
FORCE_ROUTE: str | None = None


def _float32_logits_bound(
    p: int, size: float, logw: np.ndarray, floor: float, tol: float | None = None
) -> tuple[bool, np.ndarray, np.ndarray]:
    """The rule of the float32 logits (module docstring) for logits of dimension ``p`` bounded by ``size``:
    ``(ok, log-weights relative to each system's maximum as float32, at least -3e38, the maxima)``
    (one compiled pass: 0.17 ms against 0.41 ms in NumPy for 2048 x 32 log-weights).  The direct route
    and the tiny-systems route (:mod:`wflow.kernels.small`) both decide by it."""
    logw = np.ascontiguousarray(logw, dtype=np.float64)
    lw_rel = np.empty(logw.shape, np.float32)
    lw_max = np.empty(logw.shape[0])
    lw_span = float(_relative_log_weights(logw, _LOG_ZERO / 2, lw_rel, lw_max))
    limit = max(LOWP_LOGIT_ERROR, tol / 3.0) if tol is not None else LOWP_LOGIT_ERROR
    ok = 2.0**-24 * ((p + 2) * size + 2.0 * min(lw_span, -floor)) <= limit
    return ok, lw_rel, lw_max


def choose_route(B: int, n: int, m: int, p: int, dtype, q: int | None = None) -> str:
    """Which route of the numba backend computes ``B`` systems of ``n`` query rows, ``m`` sources, logit
    dimension ``p`` and value dimension ``q`` (default ``p``; 0 without values).

    * Tiny systems, ``n, m <=`` :data:`~wflow.kernels.small.SMALL_MAX` and ``p >=``
      :data:`SMALL_MIN_DIM`: the route with the least time predicted by the cost model of
      :mod:`wflow.kernels.cost` (fitted to measured times of the four routes on this machine, and
      checked on other shapes: ``python -m benchmarks.small_systems --costs``), ``"small"`` when
      that is one of the tiny-systems route's two methods (:func:`wflow.kernels.small.choose_method`
      then picks the same one);
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
    from .small import SMALL_MAX, _fused_sums

    if n <= SMALL_MAX and m <= SMALL_MAX and p >= SMALL_MIN_DIM:
        from . import cost

        routes = (
            cost.ROUTES
            if _fused_sums is not None
            else tuple(r for r in cost.ROUTES if r != "fused")
        )
        route = cost.cheapest(B, n, m, p, p if q is None else q, dtype, routes)
        return "small" if route in ("fused", "gemm") else route
    return "direct" if p < BLAS_MIN_DIM else "blas"


#: Smallest logit dimension for which tiny systems take the "small" route (1: all of them;
#: raise it to send tiny low-dimensional systems to the direct route).
SMALL_MIN_DIM = 1


class NumbaBackend:
    """Direct kernel sums compiled with numba (see module docstring).

    Takes every problem (general Q, K, V, any batch, float32 and float64).  ``"auto"``
    picks it ahead of ``"numpy"`` whenever numba imports; KeOps stays ahead of it
    but is auto-selected only on a GPU.

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.kernels import BACKENDS, KernelProblem
    >>> x = wflow.sphere.uniform(5, 3, seed=0)[None]
    >>> problem = KernelProblem(x=x, y=x, weights=np.full((1, 5), 0.2), beta=1.0, Q=None, K=None, V=None,
    ...                         values=True)
    >>> numba_backend = BACKENDS["numba"]
    >>> if numba_backend.available():  # compare with the numpy reference
    ...     ours, ref = numba_backend(problem), BACKENDS["numpy"](problem)
    ...     same = np.allclose(np.exp(ours.log_scale) * ours.mass, np.exp(ref.log_scale) * ref.mass)
    ... else:
    ...     same = True
    >>> same
    True
    """

    name = "numba"

    @property
    def reason(self) -> str:
        return _NUMBA_ERROR

    def available(self) -> bool:
        return numba is not None

    def accepts(self, problem: KernelProblem) -> bool:
        return True

    def __call__(self, problem: KernelProblem) -> KernelSums:
        if numba is None:
            from ..errors import WflowError

            raise WflowError(
                f"the numba backend is unavailable: {_NUMBA_ERROR}; use backend='numpy'"
            )
        dtype = problem.dtype
        f64 = np.float64
        x, y = problem.x, problem.y
        p = x.shape[-1] if problem.Q is None else problem.Q.shape[0]
        q = (y.shape[-1] if problem.V is None else problem.V.shape[0]) if problem.values else 0
        route = choose_route(x.shape[0], x.shape[1], y.shape[1], p, dtype, q)
        if route == "small":
            return self._small(problem)
        # logits in float64 even for float32 input: a float32 logit of size beta carries an
        # error beta * 6e-8.  Keys b stay in the input dtype (the kernel's transposed copy
        # upcasts them in the same pass); values c stay in the working dtype.
        if problem.Q is None:
            a = np.multiply(x, problem.beta, dtype=f64)
        else:
            a = np.matmul(x, problem.Q.T.astype(f64), dtype=f64)
            a *= problem.beta
        b = y if problem.K is None else np.matmul(y, problem.K.T.astype(f64), dtype=f64)
        with np.errstate(divide="ignore"):
            logw = np.log(problem.weights, dtype=f64)
        c = None
        if problem.values:
            c = y if problem.V is None else y @ problem.V.T
        logw = np.maximum(logw, _LOG_ZERO, out=logw)  # log 0 = -inf -> finite stand-in
        floor = exp_floor(dtype)
        zero = dtype.type(0)
        if route == "direct":
            shift, acc = self._direct(a, b, logw, c, floor, zero)
        else:
            shift, acc = self._blas(a, b, logw, c, floor, zero)
        if dtype != np.float64 and route != "direct":  # (the direct route does this in its kernel)
            # report the shift in the output dtype and make mass and vector consistent with it
            c32 = shift.astype(dtype)
            acc *= np.exp(shift - c32.astype(np.float64))[..., None]
            shift = c32
        shift = shift.astype(dtype, copy=False)
        mass = acc[..., 0].astype(dtype)
        vec = acc[..., 1:].astype(dtype) if problem.values else None
        return KernelSums(shift, mass, vec, self.name)

    def _small(self, problem: KernelProblem) -> KernelSums:
        """The tiny-systems route (:mod:`wflow.kernels.small`): beta is applied in its exponential
        pass, so that Q = K = I needs no scaled copy of the points."""
        from .small import small_sums

        f64 = np.float64
        x, y = problem.x, problem.y
        a = x if problem.Q is None else np.matmul(x, problem.Q.T.astype(f64), dtype=f64)
        b = y if problem.K is None else np.matmul(y, problem.K.T.astype(f64), dtype=f64)
        with np.errstate(divide="ignore"):
            logw = np.log(problem.weights, dtype=f64)
        logw = np.maximum(logw, _LOG_ZERO, out=logw)
        c = None
        if problem.values:
            c = y if problem.V is None else y @ problem.V.T
        tol = problem.tol if problem.tol is not None and 0.0 < problem.tol < 1.0 else None
        shift, mass, vec = small_sums(
            a, b, logw, c, exp_floor(problem.dtype), problem.dtype, scale=problem.beta, tol=tol
        )
        return KernelSums(shift, mass, vec, self.name)

    @staticmethod
    def _direct(a, b, logw, c, floor, zero):
        B, n, p = a.shape
        m = b.shape[1]
        p4 = -(-p // 4) * 4
        # float32 input: logits in float32 too when their rounding provably stays below
        # LOWP_LOGIT_ERROR relative per term (small beta), else in float64.  Log-weights are
        # taken relative to their maximum (added back to the shift in float64), so that
        # uniform weights 1/N do not inflate the logits' size.
        ldt = np.float64
        if type(zero) is np.float32:
            sq = lambda z: float(np.max(np.einsum("...i,...i->...", z, z), initial=0.0))  # noqa: E731
            size = math.sqrt(sq(a) * sq(b)) * (
                1.0 + 1e-6
            )  # (b may be float32: its squared norms' rounding)
            ok, lw_rel, lw_max = _float32_logits_bound(p4, size, logw, floor)
            if ok:
                ldt = np.float32
                logw = lw_rel  # finite in float32 (at least -3e38): clamped at the floor anyway
        threads = numba.get_num_threads()
        # one column block (small systems): larger row tiles, fewer parallel tasks to set up
        rows = min(TILE_ROWS if m > TILE_COLS else 64, -(-n // 4) * 4)
        if (
            B * -(-n // rows) < 8 * threads
        ):  # few query rows: smaller tiles, so every thread has work
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
        elif (
            c is b and p4 == p and bT.dtype == type(zero)
        ):  # values = keys (Q = K = V = I): share the transpose
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
            upper += np.max(logw, axis=1, initial=_LOG_ZERO)[:, None]
            cols = max(1, min(MIXED_TILE_COLS, m))
            _direct_sums_mixed(
                a4, bT, logw, gT, upper, float(floor), MIXED_JUMP, rows, cols, n_chunks, shift, acc
            )
        else:
            _direct_sums(a4, bT, logw, gT, float(floor), zero, rows, cols, n_chunks, shift, acc)
        shift = shift[:, :n]
        if ldt is np.float32:
            shift += lw_max[:, None]  # exact: both parts are float32 numbers, added in float64
            # the shift was rounded to float32 in the kernel; the sum of two float32 numbers is not
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
        # tasks: (system, row block, column chunk); columns are split only when there are
        # too few row blocks to keep every thread busy, and the partial sums merged after
        row_blocks = [(k, i0, min(i0 + rows, n)) for k in range(B) for i0 in range(0, n, rows)]
        n_split = (
            1
            if len(row_blocks) >= 4 * threads
            else max(1, min(-(-4 * threads // len(row_blocks)), -(-m // cols)))
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
                    if convert:
                        bb = Bf[:J]
                        np.copyto(bb, b[k, j0:j1])
                    else:
                        bb = b[k, j0:j1]
                    np.matmul(a[k, i0:i1], bb.T, out=Lb)
                    _exp_rows(Lb, logw[k, j0:j1], Eb, mx, mass, scale[:R], float(floor), zero)
                    if q:
                        vec *= scale[:R, None]
                        vec += Eb @ cw[k, j0:j1]
                parts[t] = (mx, mass, vec)

        with _blas_threads(1):  # parallel over tasks, not inside each (small) GEMM
            _parallel(work, min(threads, len(tasks)))
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


_EXECUTOR = None
_EXECUTOR_SIZE = 0
_EXECUTOR_LOCK = threading.Lock()
_BLAS_CONTROLLER = None


def _executor(threads: int):
    """A persistent pool of at least ``threads`` threads for the BLAS route and the fused step (numpy's matmul
    and the numba kernels release the GIL).  It only grows: callers ask for as many workers as they have
    shares, which changes from call to call, and a pool rebuilt each time costs about 0.2 ms; a replaced
    pool finishes the tasks it holds."""
    global _EXECUTOR, _EXECUTOR_SIZE
    with _EXECUTOR_LOCK:
        if _EXECUTOR is None or _EXECUTOR_SIZE < threads:
            from concurrent.futures import ThreadPoolExecutor

            old = _EXECUTOR
            _EXECUTOR = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="wflow-blas")
            _EXECUTOR_SIZE = threads
            if old is not None:
                old.shutdown(wait=False)
        return _EXECUTOR


def _parallel(work, workers: int) -> None:
    """``work(t)`` for t = 0..workers-1 at once: t = 0 in the calling thread, the others on :func:`_executor`'s
    pool (a step of 2048 tiny systems takes 1-2 ms; handing every share to the pool and waiting for it
    costs a thread wake-up more per call).  Returns when every share has finished; raises the first
    error, the caller's own first."""
    if workers <= 1:
        if workers == 1:
            work(0)
        return
    from concurrent.futures import wait

    pool = _executor(workers)
    futures = []
    try:
        for t in range(1, workers):
            futures.append(pool.submit(work, t))
        work(0)
    finally:
        wait(futures)
    for f in futures:
        f.result()


def _blas_threads(n: int):
    """Limit BLAS to ``n`` threads inside a ``with`` block (threadpoolctl; no-op without it)."""
    global _BLAS_CONTROLLER
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # pragma: no cover - threadpoolctl is a dependency
        import contextlib

        return contextlib.nullcontext()
    if _BLAS_CONTROLLER is None:
        _BLAS_CONTROLLER = ThreadpoolController()
    return _BLAS_CONTROLLER.limit(limits=n, user_api="blas")


register_backend(NumbaBackend(), auto_priority=1)
