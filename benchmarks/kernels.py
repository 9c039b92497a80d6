"""Kernel-sum throughput: wflow backends beside dense NumPy, PyTorch, and this machine's limits.

Run ``python -m benchmarks.kernels`` (full table, under ~10 minutes on 2 cores) or
``python -m benchmarks.kernels --quick``.  Prints Markdown tables (see README.md).

What is measured, for points on S^{d-1} and uniform weights:

* pairs per second of one kernel sum, ``pairs = (query rows) x N``.  SA and USA need
  the same sums (SA: s^1/s^0, USA: e^c s^1), so one timing serves both columns.
  At N = 10^4 and 10^5 only a subset of query rows is summed against all N
  sources (stated in the ``rows`` column); the cost is linear in the rows.
* "dense numpy" / "torch" are what a user writes: ``L = beta * x @ y.T``, subtract
  the row max, ``exp``, ``E.sum`` and ``E @ y`` (no clamp: float32 underflows to
  subnormals at large beta, as it would for the user).
* limits of this machine: the pair rate if a pair cost one exp plus its 2(d+1+d) GEMM
  flops, ``limit = 1 / (1/exp rate + 2(2d+1)/GEMM rate)``, with both rates timed in each
  row's own round-robin beside the implementations (wflow's numba exponential in one
  parallel region, each thread on a cache-resident chunk; a 1000^3 matmul), so that the
  row's load hits the limit too.  For reference the machine-wide limits are also measured
  before and after all rows (best of ``--repeat`` runs: GEMM 2000^3; exp by NumPy, PyTorch
  and wflow's numba loop).

Every figure is the median of ``--repeat`` runs after one warm-up; the implementations
of one row are timed round-robin, so that load from other jobs on the shared machine
hits them alike (their ratios are more reliable than the absolute rates).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from wflow.kernels import BACKENDS, kernel_sums

try:
    import torch
except Exception:  # optional
    torch = None


#: Idle time before each timed call of a round-robin: OpenBLAS's worker threads spin for
#: about 0.1 s after a multithreaded GEMM (GOTO/OPENBLAS thread timeout) and would take a
#: core from whichever implementation runs next (measured: 30 % on the d = 64 sums).
SETTLE_S = 0.15


def _interleaved_medians(fns: dict, repeat: int) -> dict:
    """Median time of each callable, timed round-robin (one warm-up each first), so that a
    burst of load from other jobs on the shared machine hits every implementation alike.
    Each timed call starts after :data:`SETTLE_S` idle seconds, so that no implementation
    pays for the spinning threads of the one before it."""
    for f in fns.values():
        f()
    times = {k: [] for k in fns}
    for _ in range(repeat):
        for k, f in fns.items():
            time.sleep(SETTLE_S)
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def _sphere(rng, shape, dtype):
    x = rng.standard_normal(shape)
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(dtype)


# ---------------------------------------------------------------- machine limits
def _best_time(f, repeat: int) -> float:
    """Shortest of ``repeat`` runs after a warm-up: a machine limit is what it can reach."""
    f()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return min(times)


def gemm_rate(dtype, repeat: int) -> float:
    a = np.random.default_rng(0).standard_normal((2000, 2000)).astype(dtype)
    return 2 * 2000**3 / _best_time(lambda: a @ a, repeat)


def exp_rate(dtype, repeat: int) -> tuple[float, str]:
    """Fastest exp per second over all cores, and who achieved it.

    NumPy and PyTorch: many calls on one cache-resident array (256 KB).  wflow's numba
    exponential: one parallel region in which every thread evaluates its own
    cache-resident chunk many times (accumulating, with arguments that change each
    pass, so that nothing can be hoisted or dropped) -- the rate the kernels' exp
    passes could reach without the fork/join cost of a parallel loop per call.
    """
    x = -np.random.default_rng(0).uniform(0, 50, 32768).astype(dtype)
    out = np.empty_like(x)
    calls = 200

    def rate(f, n=x.size):
        def many():
            f()

        return n / _best_time(many, repeat)

    def calls_of(f):
        def g():
            for _ in range(calls):
                f()

        return g

    rates = {"numpy": rate(calls_of(lambda: np.exp(x, out=out)), calls * x.size)}
    if torch is not None:
        tx, to = torch.from_numpy(x), torch.from_numpy(out)
        rates["torch"] = rate(calls_of(lambda: torch.exp(tx, out=to)), calls * x.size)
    if BACKENDS["numba"].available():
        import numba

        f = _numba_exp_loop()
        chunks = x[: 4096 * (x.size // 4096)].reshape(-1, 4096)[: numba.get_num_threads()].copy()
        acc = np.zeros_like(chunks)
        passes = 2000
        f(chunks, acc, dtype.type(-80.0), 1)  # compile
        rates["wflow numba"] = rate(
            lambda: f(chunks, acc, dtype.type(-80.0), passes), passes * chunks.size
        )
        if not np.isfinite(acc).all():
            raise RuntimeError("numba exp loop produced non-finite values")
    best = max(rates, key=rates.get)
    return rates[best], best


_EXP_LOOP = None


def _numba_exp_loop():
    global _EXP_LOOP
    if _EXP_LOOP is None:
        from numba import njit, prange

        from wflow.kernels.jit import FM_EXP, exp

        @njit(parallel=True, fastmath=FM_EXP)
        def loop(x, acc, floor, passes):
            for t in prange(x.shape[0]):  # one chunk per thread
                for c in range(passes):
                    shift = x.dtype.type(c) * x.dtype.type(1e-4)
                    for i in range(x.shape[1]):
                        acc[t, i] += exp(max(x[t, i] - shift, floor))

        _EXP_LOOP = loop
    return _EXP_LOOP


# ---------------------------------------------------------------- implementations
def dense_numpy(x, y, beta, block=1000):
    """SA/USA sums as a user writes them (row blocks to bound memory)."""
    out = np.empty_like(x)
    mass = np.empty(x.shape[0], x.dtype)
    for i in range(0, x.shape[0], block):
        L = beta * (x[i : i + block] @ y.T)
        c = L.max(axis=1, keepdims=True)
        E = np.exp(L - c)
        mass[i : i + block] = E.sum(axis=1)
        out[i : i + block] = E @ y
    return mass, out


def dense_torch(x, y, beta, block=1000):
    out = torch.empty_like(x)
    mass = torch.empty(x.shape[0], dtype=x.dtype)
    for i in range(0, x.shape[0], block):
        L = beta * (x[i : i + block] @ y.T)
        E = torch.exp(L - L.amax(dim=1, keepdim=True))
        mass[i : i + block] = E.sum(dim=1)
        out[i : i + block] = E @ y
    return mass, out


def implementations(keops: bool):
    impls = {"numpy": None, "numba": None}
    if keops and BACKENDS["keops"].available():
        impls["keops"] = None
    impls["dense numpy"] = None
    if torch is not None:
        impls["torch"] = None
    return list(impls)


def _sum_call(name, x, y, w, beta):
    if name == "dense numpy":
        return lambda: dense_numpy(x, y, x.dtype.type(beta))
    if name == "torch":
        tx, ty = torch.from_numpy(x), torch.from_numpy(y)
        return lambda: dense_torch(tx, ty, beta)
    return lambda: kernel_sums(x, y, w, beta, backend=name)


_LIMIT_GEMM = 1000  # the limit's GEMM: 1000^3 (2 GFLOP), near the 2000^3 rate on this machine


def _limit_calls(pairs: int, d: int, dtype) -> tuple[dict, float, float]:
    """Two callables timed in the same round-robin as the implementations: wflow's numba
    exponential in one parallel region (``E`` exps, each thread on a cache-resident chunk) and a
    ``_LIMIT_GEMM``^3 matmul (``F`` flops).  The row's limit is then
    ``1 / (t_exp / E + 2 (2d + 1) t_gemm / F)`` pairs/s, under the load its implementations saw."""
    import numba

    f = _numba_exp_loop()
    chunk = 4096
    threads = numba.get_num_threads()
    src = -np.random.default_rng(1).uniform(0, 50, (threads, chunk)).astype(dtype)
    acc = np.zeros_like(src)
    passes = max(1, round(pairs / (threads * chunk)))
    floor = np.dtype(dtype).type(-80.0)
    g = np.random.default_rng(2).standard_normal((_LIMIT_GEMM, _LIMIT_GEMM)).astype(dtype)
    calls = {"limit: exp": lambda: f(src, acc, floor, passes), "limit: gemm": lambda: g @ g}
    return calls, passes * threads * chunk, 2.0 * _LIMIT_GEMM**3


def pair_rates(names, x, y, w, beta, repeat) -> dict:
    """Pairs per second of each implementation and of the machine's limit for this row, all timed
    side by side (interleaved, so that load from other jobs hits them alike)."""
    pairs = x.shape[0] * y.shape[0]
    calls = {n: _sum_call(n, x, y, w, beta) for n in names}
    limit_calls, n_exp, n_flop = _limit_calls(pairs, x.shape[-1], x.dtype)
    t = _interleaved_medians({**calls, **limit_calls}, repeat)
    rates = {n: pairs / t[n] for n in names}
    rates["exp/s"] = n_exp / t["limit: exp"]
    rates["gemm flop/s"] = n_flop / t["limit: gemm"]
    rates["limit"] = 1.0 / (1.0 / rates["exp/s"] + 2 * (2 * x.shape[-1] + 1) / rates["gemm flop/s"])
    return rates


def _limits(dtypes, repeat) -> dict:
    out = {}
    for dt in dtypes:
        dt = np.dtype(dt)
        e, who = exp_rate(dt, repeat)
        out[dt.name] = (gemm_rate(dt, repeat), e, who)
    return out


def kernel_table(dims, sizes, dtypes, betas, repeat, keops, target_pairs):
    """Rows of pairs/s; the machine's limits are measured before and after them and the better
    of the two is used (a limit is what the machine can reach; load from other jobs lowers it)."""
    rng = np.random.default_rng(0)
    names = implementations(keops)
    before = _limits(dtypes, repeat)
    rows = []
    for d in dims:
        for N in sizes:
            n_rows = min(N, max(200, target_pairs // N))
            for dt in dtypes:
                dt = np.dtype(dt)
                y = _sphere(rng, (N, d), dt)
                x = y[:n_rows].copy()
                w = np.full(N, 1.0 / N, dt)
                for beta in betas:
                    rows.append(
                        (d, N, n_rows, dt.name, beta, pair_rates(names, x, y, w, beta, repeat))
                    )
                    print(
                        f"  measured d={d} N={N} {dt.name} beta={beta:g}",
                        file=sys.stderr,
                        flush=True,
                    )
    after = _limits(dtypes, repeat)
    limits = {
        k: (max(before[k][0], after[k][0]), *max(before[k][1:], after[k][1:])) for k in before
    }
    print(
        "\n### Machine limits (before and after the rows, for reference; each row's own limit is timed beside it)\n"
    )
    print(
        "| dtype | GEMM GFLOP/s (before / after) | exp/s (before / after, best by) | in the rows: GEMM GFLOP/s, exp/s (median, min-max) |"
    )
    print("|---|---|---|---|")
    for k, (g, e, who) in limits.items():
        gs = [r["gemm flop/s"] for *_, dtn, _, r in rows if dtn == k]
        es = [r["exp/s"] for *_, dtn, _, r in rows if dtn == k]
        print(
            f"| {k} | {before[k][0] / 1e9:.1f} / {after[k][0] / 1e9:.1f} | "
            f"{before[k][1]:.3g} / {after[k][1]:.3g} ({who}) | {statistics.median(gs) / 1e9:.1f} "
            f"({min(gs) / 1e9:.0f}-{max(gs) / 1e9:.0f}), {statistics.median(es):.3g} "
            f"({min(es):.2g}-{max(es):.2g}) |"
        )
    print("\n### SA / USA kernel sums, pairs per second (median)\n")
    print(
        "`limit` = 1 / (1/exp rate + 2(2d+1)/GEMM rate) with both rates timed in the row's own round-robin.\n"
    )
    head = (
        "| d | N | rows | dtype | beta | "
        + " | ".join(names)
        + " | limit | numba/dense numpy | numba/keops | numba/torch | numba/limit |"
    )
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for d, N, n_rows, dtn, beta, r in rows:
        ratio = lambda a, b: f"{r[a] / r[b]:.1f}" if a in r and b in r else "-"  # noqa: E731
        cells = " | ".join(f"{r[n]:.3g}" for n in names)
        print(
            f"| {d} | {N} | {n_rows} | {dtn} | {beta:g} | {cells} | {r['limit']:.3g} | "
            f"{ratio('numba', 'dense numpy')} | {ratio('numba', 'keops')} | {ratio('numba', 'torch')} | "
            f"{r['numba'] / r['limit']:.2f} |",
            flush=True,
        )


# ---------------------------------------------------------------- batched small systems
def _proj(x, v):
    return v - (x * v).sum(-1, keepdims=True) * x


def velocity_dense_numpy(x, beta):
    L = beta * (x @ np.swapaxes(x, -1, -2))
    E = np.exp(L - L.max(-1, keepdims=True))
    return _proj(x, (E @ x) / E.sum(-1)[..., None])


def velocity_torch(x, beta):
    A = torch.softmax(beta * (x @ x.transpose(-1, -2)), dim=-1)
    v = A @ x
    return v - (x * v).sum(-1, keepdim=True) * x


def velocity_wflow(x, beta, backend):
    w = np.full(x.shape[:-1], 1.0 / x.shape[-2], x.dtype)
    s = kernel_sums(x, x, w, beta, backend=backend)
    return _proj(x, s.softmax_average())


def rk4_step(v, x, h, normalize):
    k1 = v(x)
    k2 = v(x + 0.5 * h * k1)
    k3 = v(x + 0.5 * h * k2)
    k4 = v(x + h * k3)
    return normalize(x + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4))


def batched_table(repeat, B=2048, n=32, d=8, beta=4.0, h=0.1):
    print(f"\n### Batched small systems: {B} systems x {n} tokens, d = {d}, SA, beta = {beta:g}\n")
    print(
        "| dtype | implementation | one kernel sum (ms) | one RK4 step, 4 evaluations (ms) | pairs/s |"
    )
    print("|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for dt in (np.float32, np.float64):
        x = _sphere(rng, (B, n, d), dt)
        nrm = lambda z: z / np.linalg.norm(z, axis=-1, keepdims=True)  # noqa: E731
        cases = {
            "wflow numba": (lambda z: velocity_wflow(z, beta, "numba"), x, nrm),
            "wflow numpy": (lambda z: velocity_wflow(z, beta, "numpy"), x, nrm),
            "dense batched numpy": (lambda z: velocity_dense_numpy(z, dt(beta)), x, nrm),
        }
        if torch is not None:
            tnrm = lambda z: z / torch.linalg.norm(z, dim=-1, keepdim=True)  # noqa: E731
            cases["torch (bmm + softmax)"] = (
                lambda z: velocity_torch(z, beta),
                torch.from_numpy(x),
                tnrm,
            )
        one = _interleaved_medians(
            {k: (lambda v=v, x0=x0: v(x0)) for k, (v, x0, _) in cases.items()}, repeat
        )
        step = _interleaved_medians(
            {
                k: (lambda v=v, x0=x0, nrm=nrm: rk4_step(v, x0, h, nrm))
                for k, (v, x0, nrm) in cases.items()
            },
            repeat,
        )
        for name in cases:
            t1, t4 = one[name], step[name]
            print(
                f"| {np.dtype(dt).name} | {name} | {t1 * 1e3:.2f} | {t4 * 1e3:.2f} | {B * n * n / t1:.3g} |",
                flush=True,
            )


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="d in {3, 64}, N = 10^4, beta = 100 only")
    ap.add_argument("--repeat", type=int, default=None, help="timed runs per figure (median)")
    ap.add_argument(
        "--no-keops", action="store_true", help="skip KeOps (it compiles 10-25 s per d and dtype)"
    )
    args = ap.parse_args(argv)
    repeat = args.repeat or 5
    t0 = time.perf_counter()
    print(
        f"python -m benchmarks.kernels {' '.join(argv if argv is not None else sys.argv[1:])}".rstrip()
    )
    print(
        f"numpy {np.__version__}, torch {getattr(torch, '__version__', 'absent')}, "
        f"backends available: {[n for n, b in BACKENDS.items() if b.available()]}"
    )
    if args.quick:
        kernel_table(
            [3, 64],
            [10_000],
            [np.float32, np.float64],
            [100.0],
            repeat,
            not args.no_keops,
            2 * 10**7,
        )
    else:
        kernel_table(
            [2, 3, 16, 64],
            [1_000, 10_000, 100_000],
            [np.float32, np.float64],
            [1.0, 100.0],
            repeat,
            not args.no_keops,
            10**7,
        )
    batched_table(repeat)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
