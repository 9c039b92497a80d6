"""Sweeps on Dask: the overhead of many tiny points, parallel efficiency over workers, the GLPR phase diagram.

Run ``python -m benchmarks.sweep [overhead] [efficiency] [glpr] [--workers 1 2] [--json FILE]``
(all three by default).  Every measurement starts a fresh ``LocalCluster`` of one-thread
worker processes, as :func:`wflow.sweep.sweep` does by default, and prints the load average
before and after, because the machine is shared.

* ``overhead``: a grid of 100 tiny points (n = 8, d = 3, 10 Euler steps, pair fraction and
  order parameter), one task each, on 2 workers: wall time of the whole call, cluster start-up
  and worker imports included, with the configuration's default kernel backend ``auto`` and
  with ``numpy`` (``auto`` imports pykeops, hence torch, in every worker to ask for a GPU).
* ``efficiency``: a d = 128 slice of the phase diagram (n = 32, Euler eta = 0.1 to t = 30:
  300 steps, 200 checkpoints, the pair fraction), ``--betas`` values x ``--systems`` seeds in
  tasks of 256 systems, on each worker count of ``--workers``; the clock starts when the
  workers have imported wflow and run one task (the steady state of a long sweep).
  Efficiency = T(1) / (w T(w)).
* ``glpr``: the reduced phase diagram (d in {8, 128, 1024}, ``--betas`` values, ``--systems``
  seeds) on the largest worker count, its seconds per task of 256 systems for each d, and the
  full diagram (90 betas x 2048 systems) extrapolated from them (labelled as such).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

TINY = {
    "init.n": 8,
    "init.d": 3,
    "run.t_end": 1.0,
    "save.n": 2,
    "run.method": "euler",
    "run.dt": 0.1,
}


def _load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def _cluster(workers: int):
    from distributed import Client, LocalCluster

    from wflow.sweep import WORKER_ENV

    cluster = LocalCluster(
        n_workers=workers,
        threads_per_worker=1,
        processes=True,
        dashboard_address=":0",
        silence_logs=logging.ERROR,
        env=dict(WORKER_ENV),
    )
    return cluster, Client(cluster)


def overhead(folder: Path) -> list[dict]:
    from wflow.sweep import sweep

    rows = []
    # where the fixed cost goes: starting the cluster, then importing wflow (and, for backend auto, pykeops with
    # torch, to ask whether there is a GPU) in the worker processes
    load0 = _load()
    t0 = time.perf_counter()
    cluster, client = _cluster(2)
    t1 = time.perf_counter()
    client.run(lambda: __import__("wflow.sweep") and None)
    t2 = time.perf_counter()
    client.run(
        lambda: __import__("wflow.kernels.keops_backend", fromlist=["x"]).import_pykeops() and None
    )
    t3 = time.perf_counter()
    client.close()
    cluster.close()
    for what, v in (
        ("LocalCluster start, 2 workers", t1 - t0),
        ("import wflow in the workers", t2 - t1),
        ("import pykeops (torch) in the workers (backend auto)", t3 - t2),
    ):
        rows.append(
            {
                "what": what,
                "workers": 2,
                "wall_s": round(v, 2),
                "load_before": load0,
                "load_after": _load(),
            }
        )
        print(rows[-1], flush=True)
    for backend in ("auto", "numpy"):
        load0 = _load()
        t0 = time.perf_counter()
        ds = sweep(
            {**TINY, "run.backend": backend},
            {"model.beta": "linspace(0.1, 10, 100)"},
            out=folder / f"tiny-{backend}.zarr",
            workers=2,
            progress=False,
            overwrite=True,
            observables=["pair_fraction", "order_parameter"],
        )
        wall = time.perf_counter() - t0
        rows.append(
            {
                "what": f"100 tiny points, backend {backend}",
                "workers": 2,
                "wall_s": round(wall, 2),
                "ok": ds.attrs["ok"],
                "task_median_s": round(float(np.nanmedian(ds.seconds.values)), 4),
                "load_before": load0,
                "load_after": _load(),
            }
        )
        print(rows[-1], flush=True)
    return rows


def _slice_config():
    from wflow.studies.glpr import GLPR_CONFIG

    return {**GLPR_CONFIG, "run.backend": "auto"}


def _timed_sweep(client, cfg, grid, out: Path, batch: int) -> tuple[float, object]:
    from wflow.sweep import sweep

    # warm-up: every worker imports wflow and compiles/loads its kernels on short runs of the same shapes
    nw = len(client.scheduler_info()["workers"])
    warm = {
        k: (list(range(nw)) if k == "init.seed" else (v if k == "init.d" else v[:1]))
        for k, v in grid.items()
    }
    sweep(
        {**cfg, "run.t_end": 0.3, "save.n": 2},
        warm,
        out=out.with_name(out.name + "-warm"),
        scheduler=client,
        progress=False,
        overwrite=True,
        batch_size=1,
        observables=["pair_fraction"],
    )
    t0 = time.perf_counter()
    ds = sweep(
        cfg,
        grid,
        out=out,
        scheduler=client,
        progress=False,
        overwrite=True,
        batch_size=batch,
        observables=["pair_fraction"],
    )
    return time.perf_counter() - t0, ds


def efficiency(folder: Path, workers: list[int], betas: int, systems: int) -> list[dict]:
    from wflow.sweep import parse_values

    cfg = {**_slice_config(), "init.d": 128}
    grid = {
        "model.beta": parse_values(f"linspace(0.1, 9, {betas})"),
        "init.seed": list(range(systems)),
    }
    rows, base = [], None
    for w in workers:
        cluster, client = _cluster(w)
        try:
            load0 = _load()
            wall, ds = _timed_sweep(client, cfg, grid, folder / f"eff-{w}.zarr", 256)
        finally:
            client.close()
            cluster.close()
        base = base or wall * w
        rows.append(
            {
                "what": f"d=128 slice: {betas} betas x {systems} systems (tasks of 256)",
                "workers": w,
                "wall_s": round(wall, 2),
                "efficiency": round(base / (w * wall), 3),
                "ok": ds.attrs["ok"],
                "task_median_s": round(float(np.nanmedian(ds.seconds.values)), 3),
                "task_cpu_median_s": round(float(np.nanmedian(ds.cpu_seconds.values)), 3),
                "busy": round(float(np.sum(np.unique(ds.seconds.values)) / (w * wall)), 3),
                "load_before": load0,
                "load_after": _load(),
            }
        )
        print(rows[-1], flush=True)
    return rows


def glpr(folder: Path, workers: int, betas: int, systems: int) -> list[dict]:
    import numpy as np

    from wflow.studies.glpr import glpr_grid

    cfg = _slice_config()
    grid = glpr_grid((8, 128, 1024), f"linspace(0.1, 9, {betas})", systems)
    cluster, client = _cluster(workers)
    try:
        load0 = _load()
        wall, ds = _timed_sweep(client, cfg, grid, folder / "glpr.zarr", 256)
    finally:
        client.close()
        cluster.close()
    rows = [
        {
            "what": f"GLPR reduced: d in (8, 128, 1024) x {betas} betas x {systems} systems",
            "workers": workers,
            "wall_s": round(wall, 2),
            "ok": ds.attrs["ok"],
            "load_before": load0,
            "load_after": _load(),
        }
    ]
    # one task = 256 systems of one (d, beta): the full diagram has 90 x 2048 / 256 = 720 tasks per d
    total = cpu = 0.0
    for d in (8, 128, 1024):
        per_task = float(
            np.nanmedian(ds.seconds.sel(d=d).values)
        )  # a task's wall time, on one worker
        per_cpu = float(
            np.nanmedian(ds.cpu_seconds.sel(d=d).values)
        )  # its CPU time (what a quiet core needs)
        total += 720 * per_task
        cpu += 720 * per_cpu
        rows.append(
            {
                "what": f"d={d}: per task of 256 systems (median): wall s, CPU s",
                "value": [round(per_task, 2), round(per_cpu, 2)],
            }
        )
    rows.append(
        {
            "what": "full diagram, extrapolated: task-seconds (3 x 720 tasks) wall as measured, CPU",
            "value": [round(total), round(cpu)],
        }
    )
    rows.append(
        {
            "what": f"full diagram, extrapolated: wall on {workers} workers (wall as measured, quiet cores)",
            "value": [round(total / workers), round(cpu / workers)],
        }
    )
    for r in rows:
        print(r, flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", nargs="*", default=["overhead", "efficiency", "glpr"])
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--betas", type=int, default=4)
    p.add_argument("--systems", type=int, default=512)
    p.add_argument("--glpr-betas", type=int, default=2)
    p.add_argument("--glpr-systems", type=int, default=256)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="wflow-sweep-bench-"))
    rows: list[dict] = []
    print(f"cores {len(os.sched_getaffinity(0))}, load {_load()}", flush=True)
    try:
        if "overhead" in args.what:
            rows += overhead(folder)
        if "efficiency" in args.what:
            rows += efficiency(folder, args.workers, args.betas, args.systems)
        if "glpr" in args.what:
            rows += glpr(folder, max(args.workers), args.glpr_betas, args.glpr_systems)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
