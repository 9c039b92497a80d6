"""Many small systems (the GLPR phase-diagram regime): one Euler step, and the save-time diagnostics.

Run ``python -m benchmarks.small_systems`` (about 5 minutes on 2 cores) or
``python -m benchmarks.small_systems --quick`` (d = 8 and 128, batch 256 only).  Prints
Markdown tables (copied into ``benchmarks/SMALL.md``).

Workload (issue 13): SA with Q = K = V = I, n = 32 tokens, beta = 5, batch of B independent
systems, d in {8, 128, 1024}, B in {256, 2048}.  One explicit Euler step of step eta = 0.1:

* "torch" (float64 and float32): a re-implementation of the authors' loop, written here
  from its description: ``A = softmax(beta x x^T)`` (``bmm``, ``softmax``), then
  ``x <- normalize(x + eta A x)`` (``bmm``), *not* projected on the tangent space; with
  PyTorch's default 2 threads and with 1 thread (the ratio column uses the faster);
* "numpy": the same in dense NumPy (``matmul``, row max, ``exp``, ``matmul``);
* "wflow": ``kernel_sums(backend="auto")`` (the numba backend's route in the ``route``
  column), then ``sphere.project(x, s.vector, scale=s.mass)`` (the SA velocity in one pass)
  and ``sphere.retract(x, v, step=eta)`` (one pass) -- wflow's projected Euler step.
  "wflow tol" passes ``tol=2e-4``, which lets float32 input use float32 logits.

The whole workload (``--e2e``): 300 steps to t = 30 and the pair fraction (cosine > 0.999)
at 200 save times, side by side, medians of 3 round-robin runs: "torch" (the loop above with
``torch.bmm`` for the pair fraction, at its faster thread count measured first on 10 steps);
"default call" (``simulate(SA(5), Atoms(x0), 30, save_at=times, method="euler-average", dt=0.1)``
and nothing else: the default diagnostics and every save's points kept, 839 MB at d = 8 with 2048
systems); "save spec" (the same with ``save_at=SaveAt(times, points=False,
diagnostics=("pair_fraction",))``: the pair fractions and the last points only), and the same in
``coordinates="cartesian"`` (the default picks span coordinates for d > n).  Both take the fused
small-system step (:class:`wflow.solvers.fused.FusedEuler`).  "fresh write" writes the default
call's kept bytes into fresh memory one save at a time: the machine's floor for keeping them.
Before timing, the final points are checked against each other and against the authors' loop.  At
d = 1024 a tenth of the workload (30 steps, 20 saves) is timed.

Save-time diagnostics for 256 systems: the fraction of pairs with cosine > 0.999 (torch,
and :func:`wflow.diagnostics.pair_fraction`) and the cluster count at threshold 0.1
(:func:`wflow.diagnostics.count_clusters`, batched, against the former loop of
:func:`wflow.diagnostics.cluster_labels` over systems).

Timing as in ``benchmarks/kernels.py``: every figure is the median of ``--repeat`` calls
after a warm-up, the implementations of a row timed round-robin, each call after 0.15 s
idle (OpenBLAS threads spin after a multithreaded GEMM).  A timed call of the step table
runs 10 consecutive steps (2 for the largest batches) (as a run does: threads stay awake between steps; PyTorch's two
threads took ~60 ms to wake for a single step after the idle time on the shared machine).  The machine is shared: the load
average is printed with each table, and the numbers are noisy (ratios within a row are
more reliable than absolute times).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

try:  # before wflow: wflow.kernels sets OMP_WAIT_POLICY=PASSIVE for numba's OpenMP threads, and
    # torch's own libgomp would read it too if loaded after (its threads then sleep between ops)
    import torch
except Exception:  # optional
    torch = None

from benchmarks.kernels import SETTLE_S, _interleaved_medians  # noqa: E402
from wflow import sphere  # noqa: E402
from wflow.diagnostics import cluster_labels, count_clusters, pair_fraction  # noqa: E402
from wflow.kernels import (
    kernel_sums,  # noqa: E402
    numba_backend,  # noqa: E402
)
from wflow.measure import Atoms  # noqa: E402
from wflow.models import SA  # noqa: E402
from wflow.solvers.particles import simulate  # noqa: E402
from wflow.solvers.saveat import SaveAt  # noqa: E402

BETA = 5.0
ETA = 0.1
N = 32


def _load() -> str:
    return "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def torch_step(x, beta=None):
    """The authors' Euler step, re-implemented: x <- normalize(x + eta softmax(beta x x^T) x)."""
    A = torch.softmax((BETA if beta is None else beta) * torch.bmm(x, x.transpose(1, 2)), dim=-1)
    y = x + ETA * torch.bmm(A, x)
    return y / torch.linalg.vector_norm(y, dim=-1, keepdim=True)


def numpy_step(x):
    L = np.matmul(x, np.swapaxes(x, 1, 2))
    L *= BETA
    L -= L.max(axis=-1, keepdims=True)
    np.exp(L, out=L)
    L /= L.sum(axis=-1, keepdims=True)
    y = x + ETA * np.matmul(L, x)
    return y / np.linalg.norm(y, axis=-1, keepdims=True)


def wflow_step(x, w, tol=None):
    """wflow's projected Euler step: v = P_x(s1/s0) in one pass, then x <- (x + eta v)/|x + eta v| in one pass."""
    s = kernel_sums(x, x, w, BETA, backend="auto", tol=tol)
    return sphere.retract(x, sphere.project(x, s.vector, scale=s.mass), step=ETA)


#: Consecutive Euler steps per timed call (as in a run: threads stay awake between steps),
#: fewer (down to 2) for the largest batches so that a run stays short.
STEPS = 10


def _n_steps(B: int, d: int) -> int:
    return int(min(STEPS, max(2, STEPS * 256 * 128 // (B * d))))


def _steps(step, x0, *args):
    steps = _n_steps(x0.shape[0], x0.shape[-1])

    def run():
        x = x0
        for _ in range(steps):
            x = step(x, *args)
        return x

    return run


def _round_robin(fns: dict, repeat: int) -> dict:
    """Like ``benchmarks.kernels._interleaved_medians``, for ``(setup, f)`` pairs: ``setup()``
    runs untimed before the idle time (it sets PyTorch's thread count)."""
    for setup, f in fns.values():
        setup()
        f()
    times = {k: [] for k in fns}
    for _ in range(repeat):
        for k, (setup, f) in fns.items():
            setup()
            time.sleep(SETTLE_S)
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def _threads(n):
    return (lambda: torch.set_num_threads(n)) if torch is not None else (lambda: None)


def step_table(dims, batches, repeat):
    rows = []
    print(f"<!-- step table: start {_load()} -->", flush=True)
    both = _threads(os.cpu_count() or 1)
    for d in dims:
        for B in batches:
            for dtype in (np.float64, np.float32):
                x = sphere.uniform(N, d, 0, batch=(B,)).astype(dtype)
                w = np.full((B, N), 1.0 / N, dtype=dtype)
                fns = {}
                if torch is not None:
                    tx = torch.from_numpy(x)
                    fns["torch"] = (both, _steps(torch_step, tx))
                    fns["torch 1 thread"] = (_threads(1), _steps(torch_step, tx))
                fns["numpy"] = (both, _steps(numpy_step, x))
                fns["wflow"] = (both, _steps(wflow_step, x, w))
                if dtype == np.float32:
                    fns["wflow tol"] = (both, _steps(wflow_step, x, w, 2e-4))
                r = repeat if B * d <= 256 * 1024 else max(3, repeat // 2)
                t = {k: v / _n_steps(B, d) for k, v in _round_robin(fns, r).items()}
                route = numba_backend.choose_route(B, N, N, d, np.dtype(dtype))
                rows.append((d, B, np.dtype(dtype).name, route, t))
                cells = " | ".join(f"{k} {1e3 * v:.2f}" for k, v in t.items())
                print(f"<!-- d={d} B={B} {np.dtype(dtype).name}: {cells} ms -->", flush=True)
    print(f"<!-- step table: end {_load()} -->", flush=True)
    return rows


def print_step_table(rows):
    print(
        f"\n### One Euler step (ms per step, median of runs of {STEPS} consecutive steps, 2 from B d = 2^18 on), "
        "n = 32, beta = 5, eta = 0.1\n"
    )
    print(
        "| d | batch | dtype | torch 2 threads | torch 1 thread | numpy | wflow (route) | wflow tol=2e-4 | best torch / wflow |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for d, B, dt, route, t in rows:
        best = min((t[k] for k in ("torch", "torch 1 thread") if k in t), default=None)
        ratio = f"{best / t['wflow']:.2f}" if best else "-"
        print(
            f"| {d} | {B} | {dt} | {_ms(t.get('torch'))} | {_ms(t.get('torch 1 thread'))} | {_ms(t['numpy'])} | "
            f"{_ms(t['wflow'])} ({route}) | {_ms(t.get('wflow tol'))} | {ratio} |"
        )


def _ms(t):
    return "-" if t is None else f"{1e3 * t:.2f}"


def diagnostics_table(dims, repeat):
    rows = []
    print(f"<!-- diagnostics table: start {_load()} -->", flush=True)
    B = 256
    rng = np.random.default_rng(1)
    for d in dims:
        # half-clustered systems: tokens near 4 centres each (a mid-run state)
        c = sphere.uniform(4, d, rng, batch=(B,))
        x = np.take_along_axis(c, rng.integers(0, 4, (B, N))[..., None], axis=1)
        x = x + 0.05 / np.sqrt(d) * rng.standard_normal(x.shape)
        x /= np.linalg.norm(x, axis=-1, keepdims=True)
        mu = Atoms(x)
        fns = {
            "pair fraction (wflow)": lambda: pair_fraction(x, 0.999),
            "clusters (wflow, batched)": lambda: count_clusters(mu, 0.1),
            "clusters (loop of cluster_labels)": lambda: [cluster_labels(xx, 0.1) for xx in x],
        }
        if torch is not None:
            tx = torch.from_numpy(x)

            def torch_pf(tx=tx):
                G = torch.bmm(tx, tx.transpose(1, 2))
                eye = torch.eye(N, dtype=torch.bool)
                return ((G > 0.999) & ~eye).sum(dim=(1, 2)) / (N * (N - 1))

            fns = {"pair fraction (torch)": torch_pf, **fns}
        t = _interleaved_medians(fns, repeat)
        rows.append((d, t))
        print(
            f"<!-- d={d}: " + " | ".join(f"{k} {1e3 * v:.2f}" for k, v in t.items()) + " ms -->",
            flush=True,
        )
    print(f"<!-- diagnostics table: end {_load()} -->", flush=True)
    return rows


def print_diagnostics_table(rows):
    print("\n### Save-time diagnostics, 256 systems of 32 tokens (ms, median)\n")
    names = list(rows[0][1])
    print("| d | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for d, t in rows:
        print(f"| {d} | " + " | ".join(_ms(t[k]) for k in names) + " |")


ROUTE_SHAPES = [
    (3, 1, 256),
    (128, 1, 256),
    (3, 16, 64),
    (128, 16, 64),
    (8, 256, 32),
    (32, 256, 32),
    (128, 256, 32),
    (1024, 256, 32),
    (128, 2048, 32),
]


def route_table(repeat, quick=False):
    """Kernel sums alone through each route of the numba backend, against what choose_route picks."""
    shapes = [s for s in ROUTE_SHAPES if not quick or (s[0] <= 128 and s[1] <= 256)]
    rows = []
    print(f"<!-- route table: start {_load()} -->", flush=True)
    for d, B, n in shapes:
        for dtype in (np.float64, np.float32):
            x = sphere.uniform(n, d, 3, batch=(B,)).astype(dtype)
            w = np.full((B, n), 1.0 / n, dtype=dtype)
            fns = {r: _forced(r, x, w) for r in ("small", "direct", "blas")}
            fns["numpy backend"] = lambda x=x, w=w: kernel_sums(x, x, w, BETA, backend="numpy")
            r = repeat if B * d * n <= 256 * 128 * 32 else max(3, repeat // 2)
            t = _interleaved_medians(fns, r)
            pick = numba_backend.choose_route(B, n, n, d, np.dtype(dtype))
            rows.append((d, B, n, np.dtype(dtype).name, pick, t))
            print(
                f"<!-- d={d} B={B} n={n} {np.dtype(dtype).name}: "
                + " | ".join(f"{k} {1e3 * v:.2f}" for k, v in t.items())
                + " ms -->",
                flush=True,
            )
    print(f"<!-- route table: end {_load()} -->", flush=True)
    print("\n### Kernel sums alone by route of the numba backend (ms, median), beta = 5\n")
    print(
        "| d | batch | n = m | dtype | small | direct | blas | numpy backend | choose_route | fastest route |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for d, B, n, dt, pick, t in rows:
        best = min(("small", "direct", "blas"), key=t.get)
        print(
            f"| {d} | {B} | {n} | {dt} | {_ms(t['small'])} | {_ms(t['direct'])} | {_ms(t['blas'])} | "
            f"{_ms(t['numpy backend'])} | {pick} | {best} |"
        )


#: shapes (d, B, n = m) on which ``--costs`` fits the cost model (disjoint from ROUTE_SHAPES, on which it is checked)
COST_FIT_SHAPES = [
    (d, B, n)
    for d in (2, 6, 24, 64, 256)
    for B, n in ((1, 200), (1, 48), (8, 96), (64, 24), (128, 48))
]
#: and the shapes on which it is checked: the route table's, and some between the fitted ones
COST_CHECK_SHAPES = ROUTE_SHAPES + [
    (48, 1, 40),
    (20, 100, 20),
    (12, 32, 128),
    (40, 4, 200),
    (16, 512, 16),
]


def _forced(route, x, w):
    """kernel_sums of (x, x, w) by one route of the numba backend (``fused`` and ``gemm``: the small route's
    methods; ``small``: that route, its method chosen as usual)."""
    from wflow.kernels import small

    def f():
        numba_backend.FORCE_ROUTE = "small" if route in ("fused", "gemm") else route
        small.FORCE_METHOD = route if route in ("fused", "gemm") else None
        try:
            return kernel_sums(x, x, w, BETA, backend="numba")
        finally:
            numba_backend.FORCE_ROUTE = None
            small.FORCE_METHOD = None

    return f


def _route_times(shapes, repeat):
    """``{(d, B, n, dtype): {route: seconds}}``: means of ``repeat`` round-robin timings, each timing
    enough consecutive calls for 5 ms (at least one), 20 ms apart.  Means, not medians: a route that
    hands work to sleeping threads pays, now and then, milliseconds for a thread to be scheduled on
    this shared machine (the direct route's times of one shape are 0.15 or 7 ms), and the mean is what
    a run pays."""
    from wflow.kernels import cost

    out = {}
    for d, B, n in shapes:
        for dtype in (np.float64, np.float32):
            x = sphere.uniform(n, d, 3, batch=(B,)).astype(dtype)
            w = np.full((B, n), 1.0 / n, dtype=dtype)
            fns = {r: _forced(r, x, w) for r in cost.ROUTES}
            reps = {}
            for r, f in fns.items():
                f()
                t0 = time.perf_counter()
                f()
                reps[r] = max(1, min(50, int(0.005 / max(time.perf_counter() - t0, 1e-7))))
            times = {r: [] for r in fns}
            for _ in range(repeat):
                for r, f in fns.items():
                    time.sleep(0.02)
                    t0 = time.perf_counter()
                    for _ in range(reps[r]):
                        f()
                    times[r].append((time.perf_counter() - t0) / reps[r])
            out[(d, B, n, np.dtype(dtype).name)] = {
                r: statistics.fmean(v) for r, v in times.items()
            }
            print(
                f"<!-- d={d} B={B} n={n} {np.dtype(dtype).name}: "
                + " | ".join(
                    f"{r} {1e3 * v:.3f}" for r, v in out[(d, B, n, np.dtype(dtype).name)].items()
                )
                + " ms -->",
                flush=True,
            )
    return out


def cost_table(repeat):
    """Fit the cost model of ``wflow.kernels.cost`` on COST_FIT_SHAPES, then check it on COST_CHECK_SHAPES:
    measured and predicted times of the four routes, the model's pick, the fastest route and how much
    slower the pick is; also what the shipped coefficients (``cost.COSTS``) pick."""
    from wflow.kernels import cost

    print(f"<!-- cost table: start {_load()} -->", flush=True)
    fit_times = _route_times(COST_FIT_SHAPES, repeat)
    samples = [
        (r, dt, B, n, n, d, d, t)
        for (d, B, n, dt), row in fit_times.items()
        for r, t in row.items()
    ]
    fitted = cost.fit(samples)
    print(
        "\n### Fitted coefficients (c0 s, c1 s per system, c2 s per pair, c3 s per multiply-add)\n"
    )
    print("```\nCOSTS = {")
    for key in sorted(fitted):
        print(f"    {key!r}: ({', '.join(f'{v:.3e}' for v in fitted[key])}),")
    print("}\n```")
    err = [
        abs(cost.predict(r, B, n, n, d, d, dt, fitted) / t - 1)
        for r, dt, B, n, _, d, _, t in samples
    ]
    print(
        f"\nOn the {len(samples)} fitted timings: relative error median {np.median(err):.2f}, "
        f"90th percentile {np.quantile(err, 0.9):.2f}"
    )
    check = _route_times(COST_CHECK_SHAPES, repeat)
    print(f"<!-- cost table: end {_load()} -->", flush=True)
    print("\n### Checked on other shapes (ms, mean): measured / predicted by the fitted model\n")
    print(
        "| d | batch | n = m | dtype | "
        + " | ".join(cost.ROUTES)
        + " | fastest | model picks (x fastest) "
        "| shipped COSTS (x) | size rule (x) |"
    )
    print("|---|---|---|---|" + "---|" * len(cost.ROUTES) + "---|---|---|---|")
    regrets = {"model": [], "shipped": [], "rule": []}
    for (d, B, n, dt), row in check.items():
        best = min(row, key=row.get)
        picks = {
            "model": cost.cheapest(B, n, n, d, d, dt, costs=fitted),
            "shipped": cost.cheapest(B, n, n, d, d, dt),
            "rule": "fused" if d <= 16 else "gemm",
        }  # the rule cost.py replaced (FUSED_MAX_DIM = 16)
        for k, r in picks.items():
            regrets[k].append(row[r] / row[best])
        cells = " | ".join(
            f"{1e3 * row[r]:.2f} / {1e3 * cost.predict(r, B, n, n, d, d, dt, fitted):.2f}"
            for r in cost.ROUTES
        )
        print(
            f"| {d} | {B} | {n} | {dt} | {cells} | {best} | "
            + " | ".join(f"{r} ({row[r] / row[best]:.2f})" for r in picks.values())
            + " |"
        )
    for k, v in regrets.items():
        v = np.array(v)
        print(
            f"\n{k}: the fastest route in {int(np.sum(v == 1.0))} of {len(v)} shapes, within 10 % of it in "
            f"{int(np.sum(v <= 1.1))}; worst {v.max():.2f}x the fastest, geometric mean {np.exp(np.log(v).mean()):.3f}x."
        )
    return fitted, check


def projection_table(repeat):
    print(f"<!-- projection table: start {_load()} -->", flush=True)
    rows = []
    for dtype in (np.float64, np.float32):
        rng = np.random.default_rng(2)
        x = sphere.uniform(N, 128, rng, batch=(256,)).astype(dtype)  # 10^6 numbers
        v = rng.standard_normal(x.shape).astype(dtype)
        fns = {
            "project (old: v - sum(x*v) x)": lambda: v - np.sum(x * v, axis=-1, keepdims=True) * x,
            "sphere.project": lambda: sphere.project(x, v),
            "normalize (old: x / norm)": lambda: v / np.linalg.norm(v, axis=-1, keepdims=True),
            "sphere.normalize": lambda: sphere.normalize(v),
            "sphere.normalize(check=False)": lambda: sphere.normalize(v, check=False),
        }
        rows.append((np.dtype(dtype).name, _interleaved_medians(fns, repeat)))
    print(f"<!-- projection table: end {_load()} -->", flush=True)
    print("\n### Projection and normalization of 256 x 32 x 128 numbers (ms, median)\n")
    names = list(rows[0][1])
    print("| dtype | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for dt, t in rows:
        print(f"| {dt} | " + " | ".join(_ms(t[k]) for k in names) + " |")


def e2e_torch(x0, steps, save_steps, beta=BETA):
    """The authors' loop: ``steps`` Euler steps, the pair fraction at ``save_steps`` (step 0 included)."""
    x = x0
    eye = torch.eye(x0.shape[1], dtype=torch.bool)
    out = []

    def pf(x):
        G = torch.bmm(x, x.transpose(1, 2))
        return ((G > 0.999) & ~eye).sum(dim=(1, 2)) / (N * (N - 1))

    save = set(int(k) for k in save_steps)
    if 0 in save:
        out.append(pf(x))
    for k in range(1, steps + 1):
        x = torch_step(x, beta)
        if k in save:
            out.append(pf(x))
    return x, torch.stack(out)


def e2e_spec(x0, t_end, save_at, coordinates="auto", beta=BETA, diagnostics=("pair_fraction",)):
    """``simulate(SA(beta), Atoms(x0), t_end, method="euler-average", dt=0.1, save_at=SaveAt(save_at,
    points=False, diagnostics=diagnostics))``: the diagnostics of every save, the points of the last.
    Returns the final points and the pair fractions."""
    spec = SaveAt(save_at, points=False, diagnostics=diagnostics)
    tr = simulate(
        SA(beta),
        Atoms(x0),
        t_end,
        method="euler-average",
        dt=ETA,
        save_at=spec,
        coordinates=coordinates,
    )
    return tr.final.points, tr.diagnostics["pair_fraction"]


def e2e_default(x0, t_end, save_at, beta=BETA):
    """The call a new user writes: ``simulate(SA(beta), Atoms(x0), t_end, save_at=save_at,
    method="euler-average", dt=0.1)`` and nothing else -- the default diagnostics, coordinates
    (``"auto"``), backend, and every save's points kept.  Returns the final points, the saved
    diagnostics and the bytes kept."""
    tr = simulate(SA(beta), Atoms(x0), t_end, save_at=save_at, method="euler-average", dt=ETA)
    return tr.final.points, tr.diagnostics, kept_bytes(tr)


def kept_bytes(tr) -> int:
    """Bytes of the saved variables a trajectory holds (the kept points, in span coordinates where
    the run took them, and the diagnostics)."""
    return int(sum(np.asarray(v).nbytes for _, v in tr.data.values()))


def fresh_write(nbytes: int, n_saves: int) -> None:
    """The machine's floor for keeping ``nbytes``: write them into fresh memory (``np.empty``, as the
    driver allocates kept saves), one save's share at a time, as a run that keeps its points does."""
    src = np.ones(max(1, nbytes // 8 // n_saves))
    buf = np.empty((n_saves, src.size))
    for k in range(n_saves):
        buf[k] = src


#: ``--diagnostics default``: what a sweep records by default (``wflow.sweep.DEFAULT_OBSERVABLES``)
SWEEP_DIAGNOSTICS = ("pair_fraction", "energy", "order_parameter", "n_clusters")


#: the issue's workload: 300 steps of 0.1 to t = 30, 200 saves
E2E_T, E2E_SAVES = 30.0, 200


def e2e_table(
    dims,
    repeat,
    short_dims=(1024,),
    B=256,
    dtypes=(np.float64, np.float32),
    betas=(BETA,),
    diagnostics=("pair_fraction",),
):
    """The whole workload side by side (round-robin medians): torch (its faster thread count, picked
    on 10 steps first), wflow.simulate, and wflow.simulate in span coordinates; each timed call runs the
    workload once per value of ``betas``, wflow with ``diagnostics`` at every save."""
    rows = []
    print(f"<!-- e2e table: start {_load()} -->", flush=True)
    for d in dims:
        frac = (
            10 if d in short_dims else 1
        )  # d = 1024: a tenth of the workload (30 steps, 20 saves)
        t_end, n_saves = E2E_T / frac, E2E_SAVES // frac
        steps = int(round(t_end / ETA))
        # the published loop records the step nearest each of linspace(0, t_end, n_saves): both save there
        save_steps = np.round(np.linspace(0.0, t_end, n_saves) / ETA).astype(int)
        save_at = save_steps * ETA
        for dtype in dtypes:
            x0 = sphere.uniform(N, d, 0, batch=(B,)).astype(dtype)
            fns = {}
            if torch is not None:
                tx = torch.from_numpy(x0)
                probe = _round_robin(
                    {k: (_threads(k), _steps(torch_step, tx)) for k in (1, os.cpu_count() or 1)}, 3
                )
                nt = min(probe, key=probe.get)
                fns["torch"] = (
                    _threads(nt),
                    lambda tx=tx: [e2e_torch(tx, steps, save_steps, b) for b in betas],
                )
            fns["default call"] = (
                _threads(1),
                lambda x0=x0: [e2e_default(x0, t_end, save_at, b) for b in betas],
            )
            fns["save spec"] = (
                _threads(1),
                lambda x0=x0: [e2e_spec(x0, t_end, save_at, "auto", b, diagnostics) for b in betas],
            )
            fns["save spec, cartesian"] = (
                _threads(1),
                lambda x0=x0: [
                    e2e_spec(x0, t_end, save_at, "cartesian", b, diagnostics) for b in betas
                ],
            )
            # the same answer: final points of every wflow call against each other and the authors' loop
            yd, _, nbytes = fns["default call"][1]()[0]
            ys, pf = fns["save spec"][1]()[0]
            yc, pfc = fns["save spec, cartesian"][1]()[0]
            tol = 1e-9 if dtype == np.float64 else 1e-3
            assert float(np.max(np.abs(ys - yd))) < tol and float(np.max(np.abs(yc - yd))) < tol
            assert pf.shape == pfc.shape == (n_saves, B)
            fns["fresh write"] = (
                _threads(1),
                lambda nbytes=nbytes, n_saves=n_saves: fresh_write(nbytes, n_saves),
            )
            if torch is not None:
                yt = e2e_torch(torch.from_numpy(x0), steps, save_steps, betas[0])[0].numpy()
                err = float(np.max(np.abs(yd - yt)))
                assert err < tol, ("default", err)
            t = _round_robin_once(fns, repeat)
            rows.append(
                (
                    d,
                    B,
                    np.dtype(dtype).name,
                    steps,
                    n_saves,
                    nt if torch is not None else None,
                    t,
                    nbytes,
                )
            )
            print(
                f"<!-- e2e d={d} B={B} {np.dtype(dtype).name} ({steps} steps, {n_saves} saves, {len(betas)} beta, "
                f"{len(diagnostics)} diagnostics, torch {nt} threads): "
                + " | ".join(f"{k} {v:.2f}" for k, v in t.items())
                + f" s; {_load()} -->",
                flush=True,
            )
    print(f"<!-- e2e table: end {_load()} -->", flush=True)
    what = "pair fraction" if tuple(diagnostics) == ("pair_fraction",) else ", ".join(diagnostics)
    print(
        f"\n### The whole workload: Euler 0.1, {what} at each save (s, median of "
        f"{repeat} round-robin runs), n = 32, beta = {', '.join(f'{b:g}' for b in betas)}, batch {B}\n"
    )
    print(
        "| d | dtype | steps / saves | torch (threads) | default call | torch / default | "
        "save spec | torch / spec | save spec, cartesian | torch / cartesian | "
        "kept MB: fresh write |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for d, B_, dt, steps, n_saves, nt, t, nbytes in rows:
        tt = t.get("torch")

        def ratio(k):
            return f"{tt / t[k]:.2f}" if tt else "-"

        torch_cell = f"{tt:.2f} ({nt})" if tt else "-"
        print(
            f"| {d} | {dt} | {steps} / {n_saves} | {torch_cell} | {t['default call']:.2f} | "
            f"{ratio('default call')} | {t['save spec']:.2f} | {ratio('save spec')} | "
            f"{t['save spec, cartesian']:.2f} | {ratio('save spec, cartesian')} | "
            f"{nbytes / 1e6:.0f}: {t['fresh write']:.2f} |"
        )
    return rows


def _round_robin_once(fns: dict, repeat: int) -> dict:
    """Round-robin medians of whole runs (no warm-up run: each run is seconds long; the step
    kernels were compiled by the correctness check before)."""
    times = {k: [] for k in fns}
    for _ in range(repeat):
        for k, (setup, f) in fns.items():
            setup()
            time.sleep(SETTLE_S)
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="d = 8 and 128, batch 256 only")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument(
        "--e2e",
        action="store_true",
        help="only the whole workload (d = 8, 128 and a tenth of it at "
        "d = 1024; with --quick d = 8, 128), medians of 3",
    )
    ap.add_argument(
        "--dims",
        type=int,
        nargs="+",
        help="--e2e: these dimensions, each the whole workload "
        "(e.g. --dims 8 1024 --batch 2048 --e2e-repeat 1: the issue's large-batch rows)",
    )
    ap.add_argument("--batch", type=int, default=256, help="--e2e: systems per run (default 256)")
    ap.add_argument(
        "--e2e-repeat", type=int, default=3, help="--e2e: round-robin runs per row (default 3)"
    )
    ap.add_argument(
        "--dtypes",
        nargs="+",
        choices=("float64", "float32"),
        default=("float64", "float32"),
        help="--e2e: these dtypes only (default both)",
    )
    ap.add_argument(
        "--betas",
        type=float,
        nargs="+",
        default=[BETA],
        help="--e2e: the workload once per beta in "
        "each timed run (the issue's workload: five values; default 5)",
    )
    ap.add_argument(
        "--diagnostics",
        choices=("pair_fraction", "default"),
        default="pair_fraction",
        help="--e2e: what wflow records at each save: the pair fraction (as the authors' loop) or a "
        "sweep's default observables (pair fraction, energy, order parameter, cluster count)",
    )
    ap.add_argument(
        "--costs",
        action="store_true",
        help="only the cost model of wflow.kernels.cost: fit it on "
        "one grid of shapes, check it on another (~5 minutes)",
    )
    args = ap.parse_args(argv)
    if args.costs:
        print(
            f"# small systems, cost model: numpy {np.__version__}, {os.cpu_count()} cpus, {_load()}",
            flush=True,
        )
        t0 = time.perf_counter()
        cost_table(args.repeat)
        print(f"\n({time.perf_counter() - t0:.0f} s; {_load()})")
        return 0
    if args.e2e:
        dtypes = tuple(np.dtype(t).type for t in args.dtypes)
        print(
            f"# small systems, whole workload: python {sys.version.split()[0]}, numpy {np.__version__}, torch "
            f"{getattr(torch, '__version__', 'not installed')}, {os.cpu_count()} cpus, {_load()}",
            flush=True,
        )
        t0 = time.perf_counter()
        diags = SWEEP_DIAGNOSTICS if args.diagnostics == "default" else ("pair_fraction",)
        kw = dict(B=args.batch, dtypes=dtypes, betas=tuple(args.betas), diagnostics=diags)
        if args.dims:
            e2e_table(tuple(args.dims), args.e2e_repeat, short_dims=(), **kw)
        else:
            e2e_table((8, 128) if args.quick else (8, 128, 1024), args.e2e_repeat, **kw)
        print(f"\n({time.perf_counter() - t0:.0f} s; {_load()})")
        return 0
    dims = (8, 128) if args.quick else (8, 128, 1024)
    batches = (256,) if args.quick else (256, 2048)
    print(
        f"# small systems: python {sys.version.split()[0]}, numpy {np.__version__}, "
        f"torch {getattr(torch, '__version__', 'not installed')} ({torch.get_num_threads() if torch else 0} threads), "
        f"{os.cpu_count()} cpus, {_load()}",
        flush=True,
    )
    t0 = time.perf_counter()
    steps = step_table(dims, batches, args.repeat)
    diags = diagnostics_table(dims, args.repeat)
    print_step_table(steps)
    print_diagnostics_table(diags)
    projection_table(args.repeat)
    route_table(args.repeat, args.quick)
    print(f"\n({time.perf_counter() - t0:.0f} s; {_load()})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
