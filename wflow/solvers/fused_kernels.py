r"""The compiled passes of the fused SA step (:mod:`wflow.solvers.fused`): per system, the directions,
the Gram matrix, the softmax, the average, the projection and the retraction in one pass, and what a
save reads off the same Gram matrix (pair count, cluster count, energy sums, barycentre).

Every function here is one stage of that pass, inlined into it.  Every work array is a
:func:`~wflow.kernels.jit.scratch` array, so that the step is bit for bit the same wherever malloc puts
it.  Imported only when numba imports.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir as _ir
from numba import njit
from numba.core import types as _types
from numba.cpython.unsafe.numbers import trailing_zeros as _trailing_zeros
from numba.extending import intrinsic

from ..kernels.dense import count_off_diagonal, gemm, softmax_row
from ..kernels.jit import FM_SUM, exp_as, prefer_wide_vectors, scratch
from ..linkage import linked, squared_distance

__all__ = ["SA_STEP_TRANSPOSED_MAX_DIM", "sa_euler_blas", "gram_clusters"]

#: the fused pass keeps the directions and averages of systems of at most this many coordinates as
#: columns (r, n), so that norms, projections and retractions run across the n tokens; beyond, as rows
SA_STEP_TRANSPOSED_MAX_DIM = 16


@njit(cache=True, fastmath=FM_SUM, inline="always")
def _sa_directions(xk, T):  # pragma: no cover - compiled
    """T[:, :r] = the rows of xk (n, r) over their norms (formed in float64), in T's dtype; returns
    :func:`_off_sphere` of the squared norms."""
    n, r = xk.shape
    dl = 0.0
    for i in range(n):
        s = 0.0
        for l in range(r):
            v = np.float64(xk[i, l])
            s += v * v
        dl = max(dl, _off_sphere(s, r))
        inv = 1.0 / np.sqrt(s)
        for l in range(r):
            T[i, l] = np.float64(xk[i, l]) * inv
    return dl


@njit(cache=True, inline="always")
def _off_sphere(s, r):  # pragma: no cover - compiled
    """A bound of ||x| - 1| <= ||x|^2 - 1| from s, |x|^2 summed in float64 over r coordinates: |s - 1| plus
    the sum's rounding."""
    return abs(s - 1.0) + (r + 2) * 1.2e-16 * s


@njit(cache=True, inline="always")
def _pair_band(pb, dl, r):  # pragma: no cover - compiled
    """0.0 when pb is 0.0 (dl unused), else, for float32 points x (n, r), a bound of |P_ij - G_ij|, P_ij the
    float64 inner product :func:`~wflow.diagnostics.pair_counts` forms of the points and G_ij the step's of
    their directions, dl the maximum of :func:`_off_sphere`: P - G = <theta_i, theta_j> (|x_i||x_j| - 1),
    at most dl, plus the rounding of the directions and of both sums, (3r + 4) u (1 + dl)^2, and a margin."""
    if pb == 0.0:
        return 0.0
    return dl + (4.0 * r + 8.0) * 1.2e-16 * (1.0 + dl) * (1.0 + dl) + 1e-15


@njit(cache=True, fastmath=FM_SUM, inline="always")
def _near_pairs(G, c, eb):  # pragma: no cover - compiled
    """Whether some G_ij, i != j, lies within eb of c."""
    n = G.shape[0]
    m = 0
    for i in range(n):
        Gi = G[i]
        for j in range(n):
            m += abs(Gi[j] - c) <= eb
        m -= abs(Gi[i] - c) <= eb
    return m > 0


@njit(cache=True, fastmath=FM_SUM, inline="always")
def _sa_exps(G, lwk, bw, fw, spread, zero, inv_s, c, want_e):  # pragma: no cover - compiled
    """G (n, n) inner products of directions -> the exponentials e^(bw G_ij + lw_j - shift) in place,
    inv_s = 1 / row sums (float64): one shift |bw| + max lw when the log-weights span at most ``spread``
    (less 2|bw| when bw < 0), else each row's maximum.  Returns ``(count, lse, sym)``: #{(i, j): i != j,
    G_ij > c}; when ``want_e``, log sum_i w_i sum_j w_j e^(bw G_ij) (else 0.0); and whether the
    exponentials are symmetric whenever G is (one shift, equal log-weights)."""
    n = G.shape[0]
    cnt = 0
    lse = 0.0
    hi = lwk[0]
    lo = lwk[0]
    for j in range(1, n):
        hi = max(hi, lwk[j])
        lo = min(lo, lwk[j])
    sym = False
    if hi - lo + max(-2.0 * bw, 0.0) <= spread:
        # one shift |beta| + max log-weight >= every logit: the diagonal term keeps every row sum normal
        sh = abs(bw) + hi
        sym = hi == lo
        acc = 0.0  # sum_i w_i e^sh t_i = e^(sh + hi) sum_i e^(lw_i - hi) t_i, each e^(lw_i - hi) >= e^-spread
        for i in range(n):
            Gi = G[i]
            cnt -= Gi[i] > c
            t = 0.0
            for j in range(n):
                g = Gi[j]
                cnt += g > c
                e = exp_as(max(bw * g + lwk[j] - sh, fw), zero)
                Gi[j] = e
                t += e
            inv_s[i] = 1.0 / t
            if want_e:
                acc += t if sym else np.exp(np.float64(lwk[i] - hi)) * t
        if want_e:
            lse = np.float64(sh) + np.float64(hi) + np.log(acc)
    else:
        cnt = count_off_diagonal(G, c)
        top = -1e308  # the running log-sum-exp of lw_i + m_i + log t_i (m_i the row's shift)
        acc = 0.0
        for i in range(n):
            mx, t = softmax_row(G[i], G[i], bw, lwk, fw, zero)
            inv_s[i] = 1.0 / t
            if want_e:
                a = np.float64(lwk[i]) + np.float64(mx) + np.log(t)
                if a > top:
                    acc = acc * np.exp(top - a) + 1.0
                    top = a
                else:
                    acc += np.exp(a - top)
        if want_e:
            lse = top + np.log(acc)
    return cnt, lse, sym


def _compare8(op):
    @intrinsic
    def compare(typingctx, row, j, c):
        """Bit k of the result (k = 0..7): row[j + k] op c (op '>' or '>='), for a C-contiguous float
        row and j + 8 <= len(row): one vector compare of eight numbers, its mask read as a byte."""
        if not (
            isinstance(row, _types.Array)
            and row.ndim == 1
            and row.layout == "C"
            and row.dtype in (_types.float32, _types.float64)
        ):
            return None

        def codegen(context, builder, signature, args):
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            ety = signature.args[0].dtype
            vty = _ir.VectorType(context.get_data_type(ety), 8)
            v = builder.load(
                builder.bitcast(builder.gep(ary.data, [args[1]]), vty.as_pointer()),
                align=ety.bitwidth // 8,
            )
            c = context.cast(builder, args[2], _types.float64, ety)
            cv = builder.insert_element(
                _ir.Constant(vty, _ir.Undefined), c, _ir.Constant(_ir.IntType(32), 0)
            )
            cv = builder.shuffle_vector(
                cv,
                _ir.Constant(vty, _ir.Undefined),
                _ir.Constant(_ir.VectorType(_ir.IntType(32), 8), [0] * 8),
            )
            bits = builder.bitcast(builder.fcmp_ordered(op, v, cv), _ir.IntType(8))
            return builder.zext(bits, _ir.IntType(64))

        return _types.uint64(row, _types.intp, _types.float64), codegen

    return compare


_above8 = _compare8(">")
_from8 = _compare8(">=")


@njit(cache=True, inline="always")
def _cluster_buffers(n):  # pragma: no cover - compiled
    """The work arrays of :func:`gram_clusters` for n points."""
    W = (n + 63) // 64
    return scratch((n, W), np.uint64), scratch((W,), np.uint64), scratch((n,), np.int64)


@njit(cache=True, fastmath=FM_SUM)
def gram_clusters(G, xk, dl, cl, adj, U, stack):  # pragma: no cover  # noqa: C901, PLR0912, PLR0915 - one compiled kernel
    """The number of single-linkage clusters of the points xk (n, r) -- i and j linked when
    |x_i - x_j| < chord -- read off the Gram matrix G (n, n, float64) of their directions, with
    cl = (chord, 1 - chord^2 / 2, lo, hi) (:func:`wflow.linkage.link_bounds`), dl >= max_i ||x_i| - 1|;
    buffers adj (n, W) and U (W) uint64, W = ceil(n / 64), stack (n) int64.  Exactly
    :func:`wflow.diagnostics.count_clusters`' count: a pair is decided by G_ij when 2 - 2 G_ij is further
    from chord^2 than a bound of the rounding and of dl, else by :func:`~wflow.linkage.squared_distance`
    as count_clusters decides it.  The links of each point are a bit mask, the components a search over
    the masks."""
    n, r = xk.shape
    chord, cth, lo, hi = cl[0], cl[1], cl[2], cl[3]
    e = 0.5 * (
        (16.0 * r + 64.0) * 1.2e-16 + 16.0 * dl * (1.0 + dl) + 1e-13
    )  # (in units of G: half of e)
    up = cth + e
    dn = cth - e
    W = U.shape[0]
    one = np.uint64(1)
    band = np.uint64(0)  # nonzero when some entry is within the bound of the threshold
    for i in range(n):
        Gi = G[i]
        for w in range(W):
            j0 = 64 * w
            j1 = min(j0 + 64, n)
            j8 = j1 - (j1 - j0) % 8
            m = np.uint64(0)
            for j in range(j0, j8, 8):  # eight compares, eight bits
                gt = _above8(Gi, j, up)
                m |= gt << np.uint64(j - j0)
                band |= _from8(Gi, j, dn) ^ gt
            for j in range(j8, j1):
                g = Gi[j]
                m |= np.uint64(g > up) << np.uint64(j - j0)
                band |= np.uint64((g >= dn) & (g <= up))
            adj[i, w] = m
    if band:  # pairs within rounding of the threshold (rare): both bits as count_clusters decides the pair
        for i in range(n):
            for j in range(n):
                g = G[i, j]
                if i != j and dn <= g <= up:
                    bi = one << np.uint64(i & 63)
                    bj = one << np.uint64(j & 63)
                    if linked(squared_distance(xk, i, j), chord, lo, hi):
                        adj[i, j >> 6] |= bj
                        adj[j, i >> 6] |= bi
                    else:
                        adj[i, j >> 6] &= ~bj
                        adj[j, i >> 6] &= ~bi
    for w in range(W):
        m = n - 64 * w
        U[w] = ~np.uint64(0) if m >= 64 else (one << np.uint64(m)) - one
    count = 0
    left = n
    for i in range(n):
        if left == 0:
            break
        bi = one << np.uint64(i & 63)
        if U[i >> 6] & bi == 0:
            continue
        U[i >> 6] &= ~bi  # a new component from i: take every point reachable from it
        left -= 1
        count += 1
        stack[0] = i
        top = 1
        while top:
            top -= 1
            u = stack[top]
            for w in range(W):
                new = adj[u, w] & U[w]
                U[w] &= ~new
                while new:
                    stack[top] = 64 * w + np.int64(_trailing_zeros(new))
                    top += 1
                    left -= 1
                    new &= new - one
    return count


@njit(cache=True, fastmath=FM_SUM, inline="always")
def _sa_stats_at(G, x, k, dl, cl, bufs, nclust, w, means):  # pragma: no cover - compiled
    """What a save of system k's input needs from its Gram matrix G before the step overwrites it: nclust[k]
    (:func:`gram_clusters`) and means[k] = sum_i w[k, i] x[k, i], each when its array is not empty."""
    if nclust.shape[0]:
        nclust[k] = gram_clusters(G, x[k], dl, cl, bufs[0], bufs[1], bufs[2])
    if means.shape[0]:
        xk = x[k]
        mk = means[k]
        for a in range(mk.shape[0]):
            mk[a] = 0.0
        for i in range(xk.shape[0]):
            wi = w[k, i]
            for a in range(mk.shape[0]):
                mk[a] += wi * np.float64(xk[i, a])


@njit(cache=True, fastmath=FM_SUM, inline="always")
def _sa_exps_at(
    G, lw, k, bw, fw, spread, zero, inv_s, c, eb, counts, lses
):  # pragma: no cover - compiled
    """:func:`_sa_exps` for system k: its pair count into counts[k] and its energy sum into lses[k] when
    those arrays are not empty (counts[k] = -1 when some |G_ij - c| <= eb > 0); returns ``sym``."""
    near = False
    if eb > 0.0 and counts.shape[0]:
        near = _near_pairs(G, c, eb)
    cnt, lse, sym = _sa_exps(G, lw[k], bw, fw, spread, zero, inv_s, c, lses.shape[0] > 0)
    if counts.shape[0]:
        counts[k] = -1 if near else cnt
    if lses.shape[0]:
        lses[k] = lse
    return sym


@njit(cache=True, fastmath=FM_SUM, inline="always")
def _sa_move(xk, T, A, inv_s, dt, proj, y, outk):  # pragma: no cover - compiled
    """outk = (xk + dt P (A / s)) / |xk + dt P (A / s)| in float64, P the tangent projection at T (proj 1.0)
    or the identity (proj 0.0); y a float64 buffer of r numbers.  Returns the sum over rows of
    |y|^2 + 1/|y| (y before normalization): finite exactly when every row of outk is."""
    n, r = xk.shape
    health = 0.0
    for i in range(n):
        w = inv_s[i]
        xa = 0.0
        for l in range(r):
            a = np.float64(A[i, l]) * w
            y[l] = a
            xa += np.float64(T[i, l]) * a
        xa *= proj
        s = 0.0
        for l in range(r):
            v = np.float64(xk[i, l]) + dt * (y[l] - xa * np.float64(T[i, l]))
            y[l] = v
            s += v * v
        inv = 1.0 / np.sqrt(s)
        health += s + inv
        for l in range(r):
            outk[i, l] = y[l] * inv
    return health


@njit(cache=True, fastmath=FM_SUM, inline="always")
def _sa_directions_t(xk, X, TT, nrm):  # pragma: no cover - compiled
    """:func:`_sa_directions` in the transposed layout (r <= :data:`SA_STEP_TRANSPOSED_MAX_DIM`): X (r, n)
    = xk^T in float64, TT (r, n) the directions as columns, nrm (n) a float64 buffer."""
    n, r = xk.shape
    for i in range(n):
        for l in range(r):
            X[l, i] = np.float64(xk[i, l])
    for i in range(n):
        nrm[i] = 0.0
    for l in range(r):
        for i in range(n):
            nrm[i] += X[l, i] * X[l, i]
    dl = 0.0
    for i in range(n):
        dl = max(dl, _off_sphere(nrm[i], r))
        nrm[i] = 1.0 / np.sqrt(nrm[i])
    for l in range(r):
        for i in range(n):
            TT[l, i] = X[l, i] * nrm[i]
    return dl


@njit(cache=True, fastmath=FM_SUM, inline="always")
def _sa_move_t(X, TT, AT, inv_s, dt, proj, Y, nrm, xa, outk):  # pragma: no cover - compiled
    """:func:`_sa_move` in the transposed layout: the averages AT (r, n) as columns, X and TT from
    :func:`_sa_directions_t`; Y (r, n), nrm and xa (n) float64 buffers.  Returns the same finiteness
    measure as :func:`_sa_move`."""
    r, n = X.shape
    for i in range(n):
        xa[i] = 0.0
    for l in range(r):
        for i in range(n):
            a = np.float64(AT[l, i]) * inv_s[i]
            Y[l, i] = a
            xa[i] += np.float64(TT[l, i]) * a
    for i in range(n):
        xa[i] *= proj
        nrm[i] = 0.0
    for l in range(r):
        for i in range(n):
            v = X[l, i] + dt * (Y[l, i] - xa[i] * np.float64(TT[l, i]))
            Y[l, i] = v
            nrm[i] += v * v
    health = 0.0
    for i in range(n):
        s = nrm[i]
        inv = 1.0 / np.sqrt(s)
        health += s + inv
        nrm[i] = inv
    for i in range(n):
        for l in range(r):
            outk[i, l] = Y[l, i] * nrm[i]
    return health


@njit(cache=True, nogil=True, fastmath=FM_SUM, error_model="numpy")
def sa_euler_blas(
    x,
    lw,
    beta,
    dt,
    floor,
    spread,
    proj,
    c,
    pb,
    k0,
    k1,
    out,
    counts,
    health,
    lses,
    cl,
    nclust,
    w,
    means,
    fn,
):  # pragma: no cover - compiled
    """One Euler step of SA (Q = K = V = I) for each system k0 <= k < k1, without the GIL
    (:func:`~wflow.solvers.fused.sa_euler_step`): the directions theta = x/|x|, the Gram matrix, the
    exponentials (:func:`_sa_exps`), the averages A = E theta / s, then out = (x + dt P A) / |x + dt P A|
    in float64 (:func:`_sa_move`).  Directions, Gram matrix, exponentials and averages are in lw's dtype;
    row sums in float64.  counts[k], lses[k], nclust[k], means[k] (when not empty): the input's pair
    count, energy sum, cluster count and barycentre; health[k] finite exactly when out[k] is.

    Both products are BLAS's gemm (``fn`` the address of dgemm or sgemm): G = T T^T (exactly symmetric)
    and A = E T, with T (n, r) row-major, which BLAS reads as T^T."""
    prefer_wide_vectors()
    B, n, r = x.shape
    wdt = lw.dtype
    zero = wdt.type(0)
    bw = wdt.type(beta)
    fw = wdt.type(floor)
    G = scratch((n, n), wdt)
    inv_s = scratch((n,), np.float64)
    bufs = _cluster_buffers(n)
    ints = np.empty(6, np.int32)  # (gemm's arguments: read by BLAS only)
    chars = np.empty(2, np.uint8)
    chars[0] = 78  # 'N'
    chars[1] = 84  # 'T'
    scal = np.empty(2, wdt)
    scal[0] = 1
    scal[1] = 0
    if r <= SA_STEP_TRANSPOSED_MAX_DIM:
        # the directions and averages as columns TT, AT (r, n), which BLAS reads as T and A (n x r)
        X = scratch((r, n), np.float64)
        TT = scratch((r, n), wdt)
        AT = scratch((r, n), wdt)
        Y = scratch((r, n), np.float64)
        nrm = scratch((n,), np.float64)
        xa = scratch((n,), np.float64)
        for k in range(k0, k1):
            dl = _sa_directions_t(x[k], X, TT, nrm)
            gemm(fn, 0, 1, n, n, r, TT, n, TT, n, G, n, ints, chars, scal)
            _sa_stats_at(G, x, k, dl, cl, bufs, nclust, w, means)
            sym = _sa_exps_at(
                G, lw, k, bw, fw, spread, zero, inv_s, c, _pair_band(pb, dl, r), counts, lses
            )
            # A = E T; when E is symmetric, E^T T: gemm('N', 'N') is faster than 'T', 'N'
            gemm(fn, 0 if sym else 1, 0, n, r, n, G, n, TT, n, AT, n, ints, chars, scal)
            health[k] = _sa_move_t(X, TT, AT, inv_s, dt, proj, Y, nrm, xa, out[k])
        return
    T = scratch((n, r), wdt)
    A = scratch((n, r), wdt)
    y = scratch((r,), np.float64)
    for k in range(k0, k1):
        xk = x[k]
        dl = _sa_directions(xk, T)
        gemm(fn, 1, 0, n, n, r, T, r, T, r, G, n, ints, chars, scal)
        _sa_stats_at(G, x, k, dl, cl, bufs, nclust, w, means)
        _sa_exps_at(G, lw, k, bw, fw, spread, zero, inv_s, c, _pair_band(pb, dl, r), counts, lses)
        gemm(fn, 0, 0, r, n, n, T, r, G, n, A, r, ints, chars, scal)
        health[k] = _sa_move(xk, T, A, inv_s, dt, proj, y, out[k])
