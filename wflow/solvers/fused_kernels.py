r"""The compiled passes of the fused SA step (:mod:`wflow.solvers.fused`): per system, the directions,
the Gram matrix, the softmax, the average, the projection and the retraction in one pass, and what a
save reads off the same Gram matrix (pair count, cluster count, energy sums, barycentre).

One idea, many loops: every function here is one stage of that pass, inlined into it; the products come from
:mod:`wflow.kernels.dense`, the exponential from :mod:`wflow.kernels.jit` and the link rule of the
cluster count from :mod:`wflow.linkage`.  Every work array is a :func:`~wflow.kernels.jit.scratch`
array, apart from all others, so that the vectorized loops run whatever the heap (bit for bit the
same step wherever malloc puts them).  Imported only when numba imports.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir as _ir
from numba import njit
from numba.core import types as _types
from numba.cpython.unsafe.numbers import trailing_zeros as _trailing_zeros
from numba.extending import intrinsic

from ..kernels.dense import (
    count_off_diagonal,
    gemm,
    softmax_row,
)
from ..kernels.jit import FM_SUM, exp_as, prefer_wide_vectors, scratch
from ..linkage import linked, squared_distance

__all__ = [
    "SA_STEP_TRANSPOSED_MAX_DIM",
    "sa_euler_blas",
    "gram_clusters",
]

#: :func:`~wflow.solvers.fused.sa_euler_step`'s BLAS pass keeps the directions and averages of systems of at most this many
#: coordinates as columns (r, n), so that norms, projections and retractions run across the n tokens;
#: beyond, as rows (n, r).  Step times, n = 32, one thread, min of 80 round-robin calls, rows against
#: columns: 2048 systems r = 3 3.77 against 3.22 ms, r = 4 3.63/2.92, r = 8 6.10/5.66, r = 12 8.02/7.23;
#: 256 systems r = 16 0.95/0.89, r = 32 1.13/1.36
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
    """A bound of ||x| - 1| <= ||x|^2 - 1| from s, |x|^2 summed in float64 over the r coordinates (in any
    order): |s - 1| plus the sum's rounding.  Its maximum over the rows is the delta of
    :func:`gram_clusters`."""
    return abs(s - 1.0) + (r + 2) * 1.2e-16 * s


@njit(cache=True, inline="always")
def _pair_band(pb, dl, r):  # pragma: no cover - compiled
    """0.0 when pb is 0.0 (no band: dl is not used, and may be infinite or NaN), else, for float32 points
    x (n, r), a bound of |P_ij - G_ij|, P_ij the float64 inner product
    :func:`~wflow.diagnostics.pair_counts` forms of the points (exact products, summed in any order) and G_ij the step's
    of their directions theta (formed in float64), dl the maximum of :func:`_off_sphere` over the rows
    (>= ||x_i|^2 - 1|): exactly, P - G = <theta_i, theta_j> (|x_i||x_j| - 1), and |ab - 1| <=
    max(|a^2 - 1|, |b^2 - 1|) for a, b >= 0, so at most dl; plus the rounding of the directions and of
    both sums, under (3r + 4) u (1 + dl)^2 with u = 2^-53, plus a margin.  Valid at any norm (far from
    the sphere every pair is near: the system is counted by pair_counts)."""
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
    inv_s = 1 / row sums (float64): one shift |bw| + max lw for the system when the log-weights span
    at most ``spread`` (less 2|bw| when bw < 0), else each row's maximum.  Returns ``(count, lse, sym)``:
    #{(i, j): i != j, G_ij > c} counted on the way (the pair count of :func:`~wflow.solvers.fused.sa_euler_step`; c = 2
    when not wanted); when ``want_e``, log sum_i w_i sum_j w_j e^(bw G_ij) from the row sums and
    their shifts (the energy's double sum, :meth:`wflow.models.SA.log_energy`; 0.0 otherwise); and
    whether the exponentials are symmetric whenever G is (one shift and equal log-weights: E_ij a
    function of G_ij alone), so that E^T may stand for E in the average."""
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
        # one shift for every row, |beta| + max log-weight >= every logit (|<theta_i, theta_j>| <= 1):
        # the diagonal term e^(beta + lw_i - |beta| - hi) >= e^-spread keeps every row sum normal, so
        # no row maximum is needed and the normalization folds into the average
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
        row and j + 8 <= len(row) (c rounded to the row's dtype): one vector compare of eight numbers,
        its mask read as a byte (what LLVM's loop vectorizer does not make of
        ``m |= (row[j] > c) << j``: 1.6x faster, 2x in the loop of :func:`gram_clusters`)."""
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
    cl = (chord, 1 - chord^2 / 2, lo, hi) (lo, hi of :func:`wflow.linkage.link_bounds`) and dl >= max_i ||x_i| - 1|
    (the maximum of :func:`_off_sphere` over the rows, which the directions return); buffers adj (n, W) and U
    (W) uint64, W = ceil(n / 64), stack (n) int64.  Exactly :func:`wflow.diagnostics.count_clusters`'
    count: a pair is decided by G_ij when 2 - 2 G_ij is further from chord^2 than a bound e of
    |2 - 2 G_ij - d_ij| (d_ij the squared distance count_clusters forms, :func:`~wflow.linkage.squared_distance`: the rounding of G, of the
    directions and of d_ij, and delta = dl, for |x_i - x_j|^2 = (1 + delta_i)(1 + delta_j)
    (2 - 2 <theta_i, theta_j>) + (delta_i - delta_j)^2), and otherwise by d_ij itself, as count_clusters
    decides it (:func:`squared_distance`).  The links of each point are a bit mask (a compare per entry of G, no
    branch), the components a search over the masks, each point taken once: about 0.5 us per system
    at n = 32 (a union-find over the pairs: 1-1.6 us)."""
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
    """What a save of system k's input needs from its Gram matrix G before the step overwrites it:
    nclust[k] its cluster count (:func:`gram_clusters`, dl what the directions returned) when nclust is
    not empty, means[k] = sum_i w[k, i] x[k, i] (the order parameter's barycentre) when means is not
    empty."""
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
    those arrays are not empty; returns whether the exponentials are symmetric when G is.  With eb > 0
    (float32 points, :func:`_pair_band`), counts[k] = -1 instead when some pair i != j has |G_ij - c| <= eb:
    one the count on G might decide otherwise than :func:`~wflow.diagnostics.pair_counts` does."""
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
    """outk = (xk + dt P (A / s)) / |xk + dt P (A / s)| in float64, with P the tangent projection at the
    directions T when proj is 1.0 and the identity when it is 0.0; y a float64 buffer of r numbers.
    Returns the sum over rows of |y|^2 + 1/|y| (y the stepped row before normalization): finite
    exactly when every row of outk is (a row |y| = 0, infinite or NaN makes it infinite or NaN), so
    that the caller need not scan the output for non-finite numbers."""
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
    """The transposed layout of :func:`sa_euler_blas` (r <= :data:`SA_STEP_TRANSPOSED_MAX_DIM`): X (r, n)
    = xk^T in float64, TT (r, n) the directions x_i / |x_i| as columns, nrm (n) a float64 buffer.  The
    norms and the scaling run across the n tokens (vectors of tokens, not of r < 16 coordinates).  Returns
    :func:`_off_sphere` of the squared norms, as :func:`_sa_directions` does."""
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
    """One Euler step of SA (Q = K = V = I) for each system k0 <= k < k1, serially and without the GIL, in
    L1/L2 (see :func:`~wflow.solvers.fused.sa_euler_step`): the directions theta = x/|x| (norms in float64),
    the Gram matrix, the exponentials (:func:`_sa_exps`), the averages A = E theta / s, then
    out = (x + dt P A) / |x + dt P A| in float64 (:func:`_sa_move`), written in out's dtype, with P the
    tangent projection at theta when proj is 1.0 and the identity when proj is 0.0 (GLPR's scheme).  The
    directions, the Gram matrix, the exponentials and the averages are in the dtype of lw (float64, or
    float32 when the caller has checked that float32 logits are accurate enough); row sums in float64.
    counts[k] (when counts is not empty) = the ordered pairs i != j of the input's directions with
    <theta_i, theta_j> > c, from the same Gram matrix; health[k] finite exactly when out[k] is
    (:func:`_sa_move`); lses[k] (when lses is not empty) log sum_i w_i sum_j w_j e^(beta <theta_i, theta_j>)
    of the input (:func:`_sa_exps`); nclust[k] and means[k] the input's cluster count and barycentre when
    those arrays are not empty (:func:`_sa_stats_at`).

    The two products of each system are BLAS's (``fn`` the address of dgemm, or sgemm for float32 logits):
    the row-major directions T (n, r) are T^T in BLAS's column-major terms, so G = T T^T is
    gemm('T', 'N', n, n, r) of T with itself (exactly symmetric: the same products in the same order for
    G_ij and G_ji) and the averages A = E T, row-major (n, r), are A^T = T^T E^T = gemm('N', 'N', r, n, n)
    of T and E (OpenBLAS's small-matrix kernels).  Up to r = :data:`SA_STEP_TRANSPOSED_MAX_DIM` the
    directions and averages are kept as columns (:func:`_sa_directions_t`, :func:`_sa_move_t`).  Its loops are vectorized 512 bits wide where the
    core has AVX-512 (:func:`~wflow.kernels.numba_backend._prefer_wide_vectors`)."""
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
        # the transposed layout: the directions and averages as columns TT, AT (r, n), which BLAS reads
        # as the n x r matrices T and A; G = T T^T = gemm('N', 'T', n, n, r) (exactly symmetric, as
        # below), A = E T = gemm('T', 'N', n, r, n) of the row-major E and T
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
            # A = E T; when E is symmetric (G is: see above) E^T T, gemm('N', 'N'), which OpenBLAS does
            # 1.7x faster than its 'T', 'N' for n = 32, r = 8
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
