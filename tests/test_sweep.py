"""Sweeps: grid parsing, bad input, the store's layout and atomicity, resume, failures, Dask clusters.

Most tests share one in-process Dask client (threads, no start-up cost); one runs on the
default LocalCluster, one on a scheduler and two workers started as separate processes on
127.0.0.1, one of which is killed mid-sweep.  Every process started here is torn down.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from wflow.sweep import (
    COMMIT,
    SchedulerError,
    coerce_value,
    load_sweep_config,
    open_sweep,
    parse_grid,
    parse_grid_arg,
    parse_grid_args,
    parse_values,
    point_config,
    sweep,
)

distributed = pytest.importorskip("distributed")

#: tiny systems on the numpy backend (no KeOps import in workers), fixed Euler steps
TINY = {
    "init.n": 8,
    "init.d": 3,
    "run.t_end": 1.0,
    "save.n": 3,
    "run.method": "euler",
    "run.dt": 0.1,
    "run.backend": "numpy",
}
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def client():
    from distributed import Client

    c = Client(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=None)
    yield c
    c.close()


# ------------------------------------------------------------------------------ grids
def test_parse_values_forms():
    assert parse_values("linspace(0.1, 9, 90)")[:3] == [0.1, 0.2, 0.3]
    assert len(parse_values("linspace(0.1, 9, 90)")) == 90
    assert parse_values("logspace(-1, 1, 3)") == [0.1, 1.0, 10.0]
    assert parse_values("range(3)") == [0, 1, 2]
    assert parse_values("range(2, 8, 3)") == [2, 5]
    assert parse_values("[1, 4, 9]") == [1, 4, 9]
    assert parse_values("euler") == ["euler"]
    assert parse_values(4.0) == [4.0]
    assert parse_values(np.arange(3)) == [0, 1, 2]
    assert parse_grid({"model.beta": "linspace(1,2,2)", "run.method": ["euler", "rk4"]}) == {
        "model.beta": [1.0, 2.0],
        "run.method": ["euler", "rk4"],
    }
    assert parse_grid_arg("model.beta=linspace(0.1,9,90)")[0] == "model.beta"
    assert parse_grid_args(["init.d=[8,128]", "init.seed=range(4)"]) == {
        "init.d": [8, 128],
        "init.seed": [0, 1, 2, 3],
    }


def test_module_is_callable():
    import wflow.sweep as module

    assert callable(module) and module.parse_grid is parse_grid  # wflow.sweep(...) is sweep(...)


@pytest.mark.parametrize(
    "bad, match",
    [
        ("linspace(0, 1)", "linspace"),
        ("linspace(0, 1, 2.5)", "linspace"),
        ("range(1.5)", "range"),
        ("range(0, 4, 0)", "step"),
        ("[]", "empty"),
        ("range(0)", "empty"),
        ("linspace(a, 1, 3)", "not a number"),
    ],
)
def test_parse_values_bad(bad, match):
    with pytest.raises(ValueError, match=match):
        parse_values(bad, "model.beta")


def test_parse_grid_args_bad():
    with pytest.raises(ValueError, match="KEY=VALUES"):
        parse_grid_arg("model.beta")
    with pytest.raises(ValueError, match="twice"):
        parse_grid_args(["model.beta=[1]", "model.beta=[2]"])


def test_coerce_value():
    assert coerce_value("model.beta", 4) == 4.0 and isinstance(coerce_value("model.beta", 4), float)
    assert coerce_value("init.d", 8.0) == 8
    for key, value in (
        ("init.d", 8.5),
        ("init.n", "8"),
        ("model.beta", "x"),
        ("run.method", "heun"),
    ):
        with pytest.raises(ValueError, match=key):
            coerce_value(key, value)


# ------------------------------------------------------------------------------ bad input: nothing written
@pytest.mark.parametrize(
    "grid, match",
    [
        ({"model.no_such_key": [1.0]}, "unknown config key 'model.no_such_key'"),
        ({}, "grid is empty"),
        ({"model.beta": []}, "empty"),
        ({"init.d": [3, 4.5]}, "init.d must be an integer"),
        ({"model.beta": ["hot"]}, "model.beta"),
        ({"model.beta": [1.0, -1.0]}, r"grid point model.beta=-1.0: config key model.beta"),
        ({"model.beta": [1.0, 1.0]}, "repeats"),
        ({"init.seed": [0, -1]}, "non-negative"),
    ],
)
def test_bad_grid_writes_nothing(tmp_path, grid, match):
    out = tmp_path / "s.zarr"
    with pytest.raises(ValueError, match=match):
        sweep(TINY, grid, out=out, scheduler="tcp://127.0.0.1:1", timeout=0.5, progress=False)
    assert not out.exists() and not list(tmp_path.iterdir())


def test_bad_config_and_observables(tmp_path):
    with pytest.raises(ValueError, match="config: unknown config key 'model.bta'"):
        sweep({"model.bta": 1.0}, {"model.beta": [1.0]}, out=tmp_path / "s.zarr")
    with pytest.raises(ValueError, match="unknown observable 'entropy'"):
        sweep(TINY, {"model.beta": [1.0]}, out=tmp_path / "s.zarr", observables=["entropy"])
    with pytest.raises(ValueError, match="grid problem: a sweep runs one kind of problem"):
        sweep(TINY, {"problem": ["particles", "eulerian"]}, out=tmp_path / "s.zarr")
    with (
        pytest.warns(DeprecationWarning, match="config key solver is deprecated; use problem"),
        pytest.raises(ValueError, match="grid problem: a sweep runs one kind of problem"),
    ):
        sweep(TINY, {"solver": ["particles", "eulerian"]}, out=tmp_path / "s.zarr")
    with pytest.raises(
        ValueError,
        match=r"unknown observable 'pair_fraction': built in for problem = eulerian are "
        r"\['mass', 'energy'\]",
    ):
        sweep(
            {"problem": "eulerian", "init.d": 2},
            {"model.beta": [1.0]},
            out=tmp_path / "s.zarr",
            observables=["pair_fraction"],
        )
    assert not list(tmp_path.iterdir())


def test_scheduler_that_does_not_answer(tmp_path):
    import socket

    with socket.socket() as s:  # a free port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"
    t0 = time.perf_counter()
    with pytest.raises(SchedulerError, match=f"no Dask scheduler answers at {address} within 1 s"):
        sweep(
            TINY,
            {"model.beta": [1.0]},
            out=tmp_path / "s.zarr",
            scheduler=address,
            timeout=1.0,
            progress=False,
        )
    assert time.perf_counter() - t0 < 10
    assert not list(tmp_path.iterdir())


# ------------------------------------------------------------------------------ the store
def test_store_layout_batches_and_point_config(tmp_path, client):
    import xarray as xr

    import wflow
    from wflow.config import build_run, default_config

    out = tmp_path / "s.zarr"
    grid = {"model.beta": [1.0, 4.0], "init.seed": "range(5)", "run.method": ["euler", "rk4"]}
    ds = sweep(TINY, grid, out=out, scheduler=client, batch_size=2, progress=False)
    assert dict(ds.sizes) == {"beta": 2, "seed": 5, "run_method": 2, "time": 3}
    assert ds.attrs["done"] == 20 and (ds.status.values == 0).all()
    assert ds["beta"].attrs["key"] == "model.beta" and ds["run_method"].attrs["key"] == "run.method"
    assert json.loads(ds.attrs["base_config"])["init.n"] == 8
    # 2 betas x 2 methods x ceil(5 / 2) seed batches = 12 tasks, committed
    assert len(json.loads((out / COMMIT).read_text())["done"]) == 12
    plain = xr.open_zarr(out)  # an ordinary xarray store
    np.testing.assert_array_equal(plain.time.values, [0.0, 0.5, 1.0])
    # a batched point equals the single run with its seed
    cfg = point_config(ds, beta=4.0, seed=3, run_method="rk4")
    assert cfg["init.seed"] == 3 and cfg["model.beta"] == 4.0 and cfg["run.method"] == "rk4"
    full = {**default_config(), **cfg}
    model, mu0, kw = build_run(full)
    ref = wflow.simulate(model, mu0, full["run.t_end"], **kw)
    got = ds.sel(beta=4.0, seed=3, run_method="rk4")
    np.testing.assert_allclose(
        got.order_parameter.values, ref.diagnostics["order_parameter"], rtol=1e-12
    )
    np.testing.assert_allclose(got.energy.values, ref.energy, rtol=1e-12)
    np.testing.assert_array_equal(got.n_clusters.values, ref.diagnostics["n_clusters"])
    np.testing.assert_allclose(ds.save_time.sel(beta=4.0, run_method="rk4").values, ref.times)


def test_toml_sweep_table(tmp_path, client):
    toml = tmp_path / "s.toml"
    toml.write_text(
        '[init]\nn = 8\nd = 3\n[run]\nt_end = 1.0\nmethod = "euler"\ndt = 0.1\n'
        'backend = "numpy"\n[save]\nn = 3\n[sweep]\n"model.beta" = "linspace(1, 2, 2)"\n[sweep.init]\nseed = [0, 1]\n'
    )
    cfg, grid = load_sweep_config(toml)
    assert cfg["init.n"] == 8 and grid == {"model.beta": [1.0, 2.0], "init.seed": [0, 1]}
    ds = sweep(
        toml,
        out=tmp_path / "s.zarr",
        scheduler=client,
        progress=False,
        observables=["pair_fraction"],
    )
    assert (
        dict(ds.sizes) == {"beta": 2, "seed": 2, "time": 3}
        and list(ds.data_vars).count("pair_fraction") == 1
    )
    assert ds.pair_fraction.sel(beta=2.0, seed=1).values[0] == 0.0


def test_user_observable_and_failed_point(tmp_path, client):
    def mean_first(mu):  # a user function of the measure: one number per system
        if np.any(mu.points[..., 0, 0] > 2):  # never
            return None
        return mu.points[..., 0].mean(axis=-1)

    def fragile(mu):
        if mu.n == 9:
            raise RuntimeError("nine tokens are unlucky")
        return np.zeros(mu.batch_shape)

    ds = sweep(
        TINY,
        {"init.n": [8, 9, 10]},
        out=tmp_path / "s.zarr",
        scheduler=client,
        progress=False,
        observables={"order_parameter": None, "mean_first": mean_first, "fragile": fragile},
    )
    assert ds.status.values.tolist() == [0, -1, 0]
    assert "RuntimeError: nine tokens are unlucky" in str(ds.message.sel(n=9).values)
    assert ds.attrs["failed"] == 1 and ds.attrs["done"] == 3
    assert (
        np.isfinite(ds.mean_first.sel(n=10).values).all()
        and (ds.fragile.sel(n=8).values == 0).all()
    )


#: small runs of the continuum solvers (a sweep runs each point as one run of the solver)
CONTINUUM = {
    "eulerian": {"init.d": 2, "mesh.resolution": 48, "run.t_end": 0.4, "save.n": 3},
    "zonal": {"init.d": 8, "mesh.resolution": 48, "run.t_end": 0.4, "save.n": 3},
    "lagrangian": {"init.d": 2, "mesh.resolution": 16, "run.t_end": 0.4, "save.n": 3},
    "jko": {
        "model.type": "USA",
        "init.d": 2,
        "mesh.resolution": 48,
        "jko.tau": 0.1,
        "run.t_end": 0.3,
        "save.n": 4,
    },
}


@pytest.mark.parametrize("solver", list(CONTINUUM))
def test_continuum_solvers_sweep(tmp_path, client, solver):
    """Every solver kind sweeps: each point is one run of the solver, its snapshots' scalars (all of them by
    default) and user functions of the snapshot stored per save; every stored number equals that of the
    single run with the point's configuration (``wflow run``'s path), and the finite-volume mass stays 1."""
    from wflow.config import default_config, start_run
    from wflow.solvers.trackers import Record
    from wflow.sweep import KIND_OBSERVABLES

    cfg = {**default_config(), "problem": solver, **CONTINUUM[solver]}
    out = tmp_path / "s.zarr"
    ds = sweep(
        cfg,
        {"model.beta": [1.0, 3.0], "init.seed": [0, 1]},
        out=out,
        scheduler=client,
        progress=False,
    )
    assert list(ds.attrs["observables"]) == list(KIND_OBSERVABLES[solver])
    assert (ds.status.values == 0).all() and ds.attrs["done"] == 4
    assert (
        len(json.loads((out / COMMIT).read_text())["done"]) == 4
    )  # continuum seeds are not batched
    cfg_p = point_config(ds, beta=3.0, seed=1)
    assert cfg_p["problem"] == solver and cfg_p["model.beta"] == 3.0 and cfg_p["init.seed"] == 1
    names = KIND_OBSERVABLES[solver] + (("density",) if solver == "eulerian" else ())
    rec = Record(*names)
    start_run({**default_config(), **cfg_p}).execute([rec], progress=False)
    assert ds.sizes["time"] == len(rec.times) and len(rec.times) >= 3
    np.testing.assert_allclose(ds.save_time.sel(beta=3.0, seed=1).values, rec.times, rtol=1e-12)
    for name in KIND_OBSERVABLES[solver]:
        np.testing.assert_allclose(
            ds[name].sel(beta=3.0, seed=1).values, rec.values[name], rtol=1e-12
        )
    assert np.isfinite(ds.energy.values).all()
    if "mass" in KIND_OBSERVABLES[solver]:
        np.testing.assert_allclose(ds.mass.values, 1.0, rtol=0, atol=1e-12)
    if solver == "eulerian":  # a user function of the snapshot: the largest cell density
        ds2 = sweep(
            cfg,
            {"model.beta": [3.0], "init.seed": [1]},
            out=tmp_path / "u.zarr",
            scheduler=client,
            progress=False,
            observables={"energy": None, "peak": lambda snap: snap.data["density"][1].max()},
        )
        np.testing.assert_allclose(
            ds2.peak.values.ravel(), np.max(rec.values["density"], axis=1), rtol=1e-12
        )
        np.testing.assert_array_equal(
            ds2.energy.values.ravel(), ds.energy.sel(beta=3.0, seed=1).values
        )


def test_a_failing_system_fails_alone_in_its_batch(tmp_path, client, monkeypatch):
    """One seed's system reaches a non-finite state (GLPR's step x + h A x at beta = 0, h = 3 puts a token with
    two antipodal neighbours on the origin): its batch is run again in halves, so that only that point is
    recorded as failed, with the driver's message, and the other points of the batch hold their own runs'
    numbers."""
    import wflow.config
    from wflow.measure import Atoms

    real = wflow.config.build_run

    def build_run(cfg):
        model, mu0, kwargs = real(cfg)
        if cfg["init.seed"] == 3:
            e = np.array([1.0, 0.0, 0.0])
            mu0 = Atoms(np.stack([e, -e, -e]))
        return model, mu0, kwargs

    monkeypatch.setattr(wflow.config, "build_run", build_run)
    cfg = {
        **TINY,
        "init.n": 3,
        "model.beta": 0.0,
        "run.method": "euler-average",
        "run.dt": 3.0,
        "run.t_end": 6.0,
    }
    ds = sweep(
        cfg,
        {"init.seed": "range(6)"},
        out=tmp_path / "s.zarr",
        scheduler=client,
        batch_size=6,
        progress=False,
        observables=["order_parameter"],
    )
    assert ds.status.values.tolist() == [0, 0, 0, -1, 0, 0]
    assert "non-finite" in str(ds.message.sel(seed=3).values) and "t_end" in str(
        ds.message.sel(seed=0).values
    )
    for seed in (0, 5):
        model, mu0, kw = real({**wflow.config.default_config(), **point_config(ds, seed=seed)})
        kw["save_at"] = dataclasses.replace(kw["save_at"], diagnostics=("order_parameter",))
        ref = wflow.simulate(model, mu0, cfg["run.t_end"], **kw)
        np.testing.assert_allclose(
            ds.order_parameter.sel(seed=seed).values, ref.diagnostics["order_parameter"], rtol=1e-12
        )
    # every system fails: the batch and its two halves run, no further splitting (a widespread failure)
    import wflow.solvers.particles as P

    calls = []
    simulate = P.simulate
    monkeypatch.setattr(
        P, "simulate", lambda *a, **k: calls.append(len(a[1].points)) or simulate(*a, **k)
    )
    monkeypatch.setattr(wflow.config, "build_run", lambda c: build_run({**c, "init.seed": 3}))
    ds = sweep(
        cfg,
        {"init.seed": "range(8)"},
        out=tmp_path / "all.zarr",
        scheduler=client,
        batch_size=8,
        progress=False,
        observables=["order_parameter"],
    )
    assert ds.status.values.tolist() == [-1] * 8 and calls == [8, 4, 4]


def test_resume_skips_committed_and_reruns_torn_points(tmp_path, client):
    out = tmp_path / "s.zarr"
    log = tmp_path / "calls.txt"  # tasks are pickled: count calls in a file
    log.write_text("")

    def counted(mu):
        with open(log, "a") as fh:
            fh.write(f"{mu.n}\n")
        return np.zeros(mu.batch_shape)

    def calls():
        return sorted({int(v) for v in log.read_text().split()})

    obs = {"order_parameter": None, "counted": counted}
    grid = {"init.n": [4, 5, 6, 7]}
    sweep(TINY, grid, out=out, scheduler=client, progress=False, observables=obs)
    assert calls() == [4, 5, 6, 7]
    log.write_text("")
    sweep(TINY, grid, out=out, scheduler=client, progress=False, observables=obs)
    assert calls() == []  # every point committed: nothing runs
    # a sweep killed while writing n=6: chunks written, not committed (and its status chunk torn)
    rec = json.loads((out / COMMIT).read_text())
    rec["done"].remove(2)
    (out / COMMIT).write_text(json.dumps(rec))
    (out / "status" / "c" / "2").write_bytes(b"\x00\x01")
    ds = sweep(TINY, grid, out=out, scheduler=client, progress=False, observables=obs)
    assert calls() == [6]
    assert (ds.status.values == 0).all()
    with pytest.raises(FileExistsError, match="resume=True"):
        sweep(TINY, grid, out=out, scheduler=client, progress=False, observables=obs, resume=False)


# ------------------------------------------------------------------------------ resume by coordinates
def _stop_after(monkeypatch, k):
    """Make the next sweep run only its first ``k`` tasks still to do (a sweep killed after k commits)."""
    import wflow.sweep as sw

    run = sw.run_tasks

    def first_k(client, plan, store, todo, *args):
        return run(client, plan, store, todo[:k], *args)

    monkeypatch.setattr(sw, "run_tasks", first_k)
    return lambda: monkeypatch.setattr(sw, "run_tasks", run)


def _counting(log: Path):
    """A user observable recording which points ran: (init.n, init.d) of every system it sees."""

    def counted(mu):
        with open(log, "a") as fh:
            fh.write(f"{mu.n},{mu.points.shape[-1]}\n")
        return np.zeros(mu.batch_shape)

    def calls():
        return {tuple(int(v) for v in line.split(",")) for line in log.read_text().split()}

    log.write_text("")
    return {"order_parameter": None, "counted": counted}, calls


def _counts(ds):
    return {k: ds.attrs[k] for k in ("points", "done", "ok", "failed", "not_run")}


@pytest.mark.parametrize("n_values", [[4, 5, 6], [6, 4, 5]])
def test_a_sweep_resumed_with_its_axes_in_the_other_order_runs_exactly_the_missing_points(
    tmp_path, client, monkeypatch, n_values
):
    """Killed after 2 of 6 tasks, run again with the grid's axes swapped (and the values of one in
    another order): the 4 missing points run, no other, every point ends filled, the values are
    those of an uninterrupted sweep and the counts come from the store."""
    out = tmp_path / "s.zarr"
    obs, calls = _counting(tmp_path / "calls.txt")
    resume = _stop_after(monkeypatch, 2)
    first = sweep(
        TINY,
        {"init.n": [4, 5, 6], "init.d": [2, 3]},
        out=out,
        scheduler=client,
        progress=False,
        observables=obs,
    )
    assert calls() == {(4, 2), (4, 3)}
    assert _counts(first) == {"points": 6, "done": 2, "ok": 2, "failed": 0, "not_run": 4}
    resume()
    obs, calls = _counting(tmp_path / "calls.txt")
    ds = sweep(
        TINY,
        {"init.d": [2, 3], "init.n": n_values},
        out=out,
        scheduler=client,
        progress=False,
        observables=obs,
    )
    assert calls() == {(5, 2), (5, 3), (6, 2), (6, 3)}
    assert ds.status.dims == ("n", "d") and ds.n.values.tolist() == [4, 5, 6]  # the store's layout
    assert (ds.status.values == 0).all() and np.isfinite(ds.order_parameter.values).all()
    assert _counts(ds) == {"points": 6, "done": 6, "ok": 6, "failed": 0, "not_run": 0}
    ref = sweep(
        TINY,
        {"init.n": [4, 5, 6], "init.d": [2, 3]},
        out=tmp_path / "ref.zarr",
        scheduler=client,
        progress=False,
        observables=["order_parameter"],
    )
    np.testing.assert_array_equal(ds.order_parameter.values, ref.order_parameter.values)
    for n in (4, 5, 6):
        for d in (2, 3):
            assert point_config(ds, n=n, d=d)["init.n"] == n
            assert json.loads(str(ds.config.sel(n=n, d=d).values))["init.d"] == d


@pytest.mark.parametrize("spelling", [{}, {"solver": "particles"}])
def test_a_sweep_store_written_with_the_key_solver_resumes_as_the_same_sweep(
    tmp_path, client, monkeypatch, spelling
):
    """A store of the release before `problem` (its base and its points' configurations say `solver`,
    its fingerprint hashes that base) is the same sweep: resumed with the key spelt either way, the
    missing points run and no other, and its points' configurations read with `problem`."""
    import hashlib

    import zarr

    from wflow.sweep.plan import FORMAT

    out = tmp_path / "s.zarr"
    obs, calls = _counting(tmp_path / "calls.txt")
    resume = _stop_after(monkeypatch, 1)
    sweep(TINY, {"init.n": [4, 5, 6]}, out=out, scheduler=client, progress=False, observables=obs)
    resume()
    meta = out / "zarr.json"
    root = json.loads(meta.read_text())
    attrs = root["attributes"]
    old = {
        ("solver" if k == "problem" else k): v for k, v in json.loads(attrs["base_config"]).items()
    }
    attrs["base_config"] = json.dumps(old)
    meta.write_text(json.dumps(root))
    points = zarr.open_array(out / "config", mode="r+")
    points[...] = np.vectorize(lambda c: c.replace('"problem"', '"solver"'), otypes=[object])(
        points[...]
    )
    # the fingerprint of that release: the hash of the base with the key `solver`
    counted = f"{obs['counted'].__module__}.{obs['counted'].__qualname__}"
    text = json.dumps(
        {
            "format": FORMAT,
            "base": old,
            "grid": {"init.n": [4, 5, 6]},
            "observables": {"order_parameter": None, "counted": counted},
            "batch_size": 1,
        },
        sort_keys=True,
    )
    assert attrs["fingerprint"] == hashlib.sha256(text.encode()).hexdigest()[:16]
    obs, calls = _counting(tmp_path / "calls.txt")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", DeprecationWarning)
        ds = sweep(
            {**TINY, **spelling},
            {"init.n": [4, 5, 6]},
            out=out,
            scheduler=client,
            progress=False,
            observables=obs,
        )
    assert [str(w.message) for w in said if w.category is DeprecationWarning] == (
        ["config key solver is deprecated; use problem"] if spelling else []
    )
    assert calls() == {(5, 3), (6, 3)}
    assert _counts(ds) == {"points": 3, "done": 3, "ok": 3, "failed": 0, "not_run": 0}
    cfg = point_config(ds, n=4)
    assert cfg["problem"] == "particles" and "solver" not in cfg and cfg["init.n"] == 4


def test_the_cli_resumes_a_sweep_given_its_grid_options_in_the_other_order(
    tmp_path, client, monkeypatch, capsys
):
    import wflow.sweep as sw
    from wflow.cli import main

    monkeypatch.setattr(sw, "connect", lambda *a, **k: (client, None, False))
    out = tmp_path / "s.zarr"
    args = ["sweep", "--out", str(out), "--no-progress", "--observable", "order_parameter"]
    args += [f"--set={k}={v}" for k, v in TINY.items()]
    resume = _stop_after(monkeypatch, 3)
    main([*args, "--grid", "model.beta=[1, 2, 3]", "--grid", "init.n=[4, 5]"])
    assert capsys.readouterr().out.startswith(f"sweep: {out}: 3 of 6 points reached t_end")
    resume()
    assert main([*args, "--grid", "init.n=[4, 5]", "--grid", "model.beta=[1, 2, 3]"]) == 0
    assert capsys.readouterr().out.startswith(
        f"sweep: {out}: 6 of 6 points reached t_end, 0 failed"
    )
    ds = open_sweep(out)
    assert (ds.status.values == 0).all() and np.isfinite(ds.order_parameter.values).all()


@pytest.mark.parametrize(
    "grid, match",
    [
        (
            {"init.n": [4, 5, 7], "init.d": [3]},
            r"grid init\.n: the store has \[4, 5, 6\], given \[4, 5, 7\]",
        ),
        (
            {"init.n": [4, 5, 6], "init.d": [3], "model.beta": [1]},
            r"grid: model\.beta is not an axis",
        ),
        ({"init.n": [4, 5, 6]}, r"grid: the store's axis init\.d is missing"),
        (
            {"init.n": [4, 5, 6], "init.d": [3], "run.dt": 0.05},
            r"config run\.dt: the store has 0\.1, given 0\.05",
        ),
    ],
)
def test_a_grid_that_differs_from_the_stores_is_refused_naming_the_difference(
    tmp_path, client, monkeypatch, grid, match
):
    out = tmp_path / "s.zarr"
    resume = _stop_after(monkeypatch, 1)
    sweep(
        TINY,
        {"init.n": [4, 5, 6], "init.d": [3]},
        out=out,
        scheduler=client,
        progress=False,
        observables=["order_parameter"],
    )
    resume()
    config = {**TINY, "run.dt": grid.pop("run.dt", TINY["run.dt"])}
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    with pytest.raises(ValueError, match=f"^{out} holds a different sweep: {match}") as exc:
        sweep(
            config,
            grid,
            out=out,
            scheduler="tcp://127.0.0.1:1",
            timeout=0.5,
            progress=False,
            observables=["order_parameter"],
        )
    assert "\n" not in str(exc.value)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == before


def test_counts_are_those_committed_in_the_store(tmp_path, client):
    """A point whose status chunk says 'reached t_end' but whose task was never committed (a sweep
    killed between the two) counts as not run, and its status reads -2."""
    out = tmp_path / "s.zarr"
    sweep(
        TINY,
        {"init.n": [4, 5, 6]},
        out=out,
        scheduler=client,
        progress=False,
        observables=["order_parameter"],
    )
    rec = json.loads((out / COMMIT).read_text())
    rec["done"].remove(1)
    (out / COMMIT).write_text(json.dumps(rec))
    ds = open_sweep(out)
    assert ds.status.values.tolist() == [0, -2, 0]
    assert _counts(ds) == {"points": 3, "done": 2, "ok": 2, "failed": 0, "not_run": 1}


@pytest.mark.parametrize(
    "mine, named",
    [
        ("notes.txt", "notes.txt"),
        ("plots/a.png", "plots"),
        ("status/notes.txt", "status/notes.txt"),
        ("order_parameter/c/mine", "order_parameter/c/mine"),
        ("link", "link"),
    ],
)
def test_overwrite_refuses_a_store_holding_files_of_the_users(tmp_path, client, mine, named):
    out = tmp_path / "s.zarr"
    sweep(
        TINY,
        {"init.n": [4, 5]},
        out=out,
        scheduler=client,
        progress=False,
        observables=["order_parameter"],
    )
    path = out / mine
    if mine == "link":
        (tmp_path / "target.txt").write_text("mine")
        path.symlink_to(tmp_path / "target.txt")
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("mine")
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    with pytest.raises(ValueError, match=re.escape(str(out / named))) as exc:
        sweep(
            TINY,
            {"init.n": [7]},
            out=out,
            scheduler="tcp://127.0.0.1:1",
            timeout=0.5,
            progress=False,
            overwrite=True,
            observables=["order_parameter"],
        )
    assert "\n" not in str(exc.value)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == before


def test_overwrite_replaces_what_wflow_wrote(tmp_path, client):
    out = tmp_path / "s.zarr"
    sweep(
        TINY,
        {"init.n": [4, 5], "init.seed": [0, 1]},
        out=out,
        scheduler=client,
        progress=False,
        observables=["order_parameter", "energy"],
    )
    (out / (COMMIT + ".tmp")).write_text("{}")  # a commit record left half-written by a kill
    (out / "status" / "c" / "0" / f"0.{'ab' * 16}.partial").write_bytes(
        b"\x00"
    )  # and a chunk, by Zarr
    ds = sweep(
        TINY,
        {"model.beta": [2.0]},
        out=out,
        scheduler=client,
        progress=False,
        overwrite=True,
        observables=["order_parameter"],
    )
    assert ds.beta.values.tolist() == [2.0] and ds.attrs["ok"] == 1
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [
            "zarr.json",
            COMMIT,
            "beta",
            "time",
            "order_parameter",
            "status",
            "message",
            "seconds",
            "cpu_seconds",
            "worker",
            "config",
            "save_time",
        ]
    )


def test_store_with_another_sweep(tmp_path, client):
    out = tmp_path / "s.zarr"
    sweep(
        TINY,
        {"model.beta": [1.0]},
        out=out,
        scheduler=client,
        progress=False,
        observables=["order_parameter"],
    )
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(
        ValueError, match=f"^{out} holds a different sweep"
    ):  # found before connecting to a cluster
        sweep(
            TINY,
            {"model.beta": [2.0]},
            out=out,
            scheduler="tcp://127.0.0.1:1",
            timeout=0.5,
            progress=False,
            observables=["order_parameter"],
        )
    assert sorted(p.name for p in out.iterdir()) == before
    ds = sweep(
        TINY,
        {"model.beta": [2.0]},
        out=out,
        scheduler=client,
        progress=False,
        overwrite=True,
        observables=["order_parameter"],
    )
    assert ds.beta.values.tolist() == [2.0]
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x").write_text("x")
    with pytest.raises(ValueError, match="not a wflow sweep store"):
        sweep(TINY, {"model.beta": [2.0]}, out=tmp_path / "other", scheduler=client, progress=False)


# ------------------------------------------------------------------------------ real clusters
def test_local_cluster_default(tmp_path):
    """The default scheduler: a LocalCluster of one-thread worker processes (benchmarks/sweep.py times 100 points)."""
    t0 = time.perf_counter()
    ds = sweep(
        {**TINY, "run.t_end": 1.0, "save.n": 2},
        {"model.beta": "linspace(0.1, 10, 20)"},
        out=tmp_path / "s.zarr",
        workers=2,
        progress=False,
        observables=["pair_fraction", "order_parameter"],
    )
    elapsed = time.perf_counter() - t0
    assert ds.attrs["done"] == 20 and (ds.status.values == 0).all()
    assert len(set(ds.worker.values.tolist())) == 2  # both worker processes ran points
    print(
        f"20 points on a new 2-worker LocalCluster: {elapsed:.1f} s (benchmarks/sweep.py times 100)"
    )


def test_local_cluster_leaves_cores_to_threaded_tasks():
    """With threads_per_task = 2 the default LocalCluster starts cores // 2 workers (at least one), so that the
    tasks' numba/BLAS threads do not oversubscribe the cores; each worker's environment allows 2 threads."""
    from wflow.sweep import connect, cores

    client, cluster, owned = connect(None, None, 10.0, threads=2)
    try:
        info = client.scheduler_info()["workers"]
        assert len(info) == max(1, cores() // 2) and all(w["nthreads"] == 1 for w in info.values())
        env = client.run(lambda: os.environ.get("NUMBA_NUM_THREADS"))
        assert set(env.values()) == {"2"}
    finally:
        client.close()
        cluster.close()


def _start(args, **kw):
    env = {
        **os.environ,
        "NUMBA_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
    }
    return subprocess.Popen(
        [sys.executable, "-m", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        **kw,
    )


@pytest.fixture
def processes():
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:  # every process this test started, by its own handle
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)


def test_external_scheduler_and_a_killed_worker(tmp_path, processes):
    """A scheduler and two workers as separate processes on 127.0.0.1; one worker is killed mid-sweep."""
    sfile = tmp_path / "scheduler.json"
    processes.append(
        _start(
            [
                "distributed.cli.dask_scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--no-dashboard",
                "--scheduler-file",
                str(sfile),
            ]
        )
    )
    for _ in range(300):
        if sfile.exists() and sfile.stat().st_size:
            break
        time.sleep(0.1)
    address = json.loads(sfile.read_text())["address"]
    assert address.startswith("tcp://127.0.0.1:")
    for name in ("w0", "w1"):
        processes.append(
            _start(
                [
                    "distributed.cli.dask_worker",
                    address,
                    "--nthreads",
                    "1",
                    "--no-nanny",
                    "--name",
                    name,
                    "--no-dashboard",
                    "--host",
                    "127.0.0.1",
                ]
            )
        )
    from distributed import Client

    with Client(address, timeout=30) as c:  # the workers' addresses, by name
        c.wait_for_workers(2, timeout=60)
        addr = {w["name"]: a for a, w in c.scheduler_info()["workers"].items()}
    out = tmp_path / "s.zarr"
    victim = processes[1]
    in_flight = []  # the tasks w0 was running when it was killed

    def kill_after_first_commit():
        with Client(address, timeout=30, set_as_default=False) as watch:
            while victim.poll() is None:
                try:
                    done = len(json.loads((out / COMMIT).read_text())["done"])
                except (OSError, ValueError):
                    done = 0
                busy = [str(k) for k in watch.processing().get(addr["w0"], ())] if done >= 1 else []
                if busy:
                    in_flight.extend(busy)
                    victim.send_signal(signal.SIGKILL)
                    return
                time.sleep(0.02)

    killer = threading.Thread(target=kill_after_first_commit, daemon=True)
    killer.start()
    cfg = {**TINY, "init.n": 32, "init.d": 16, "run.t_end": 2.0, "run.dt": 0.01, "save.n": 5}
    ds = sweep(
        cfg,
        {"model.beta": "linspace(1, 8, 8)", "init.seed": "range(4)"},
        out=out,
        scheduler=address,
        batch_size=4,
        progress=False,
        observables=["pair_fraction", "order_parameter"],
    )
    killer.join(timeout=5)
    assert (
        victim.poll() is not None and in_flight
    )  # the worker was killed during the sweep, running a task
    messages = sorted({str(m) for m in np.asarray(ds.message.values).ravel() if str(m)})
    assert ds.attrs["done"] == 32 and (ds.status.values == 0).all(), (
        messages
    )  # (the messages say why not)
    assert np.isfinite(ds.pair_fraction.values).all()
    ran = ds.worker.values.ravel().tolist()
    assert set(ran) <= {addr["w0"], addr["w1"]}
    assert (
        ran.count(addr["w1"]) > 0 and ran.count(addr["w0"]) < 32
    )  # w0 died; its task ran again on w1
    plan = [json.loads(ds.attrs["grid"])[k] for k in ("model.beta", "init.seed")]
    # a task w0 was running when killed was run again, on w1 (one task per beta: a seed batch of 4; w0 may
    # have delivered one of the tasks it held in the moment before the kill, hence "any")
    rerun = [
        set(ds.worker.sel(beta=plan[0][int(k.rsplit("-", 1)[1])]).values.tolist())
        for k in in_flight
    ]
    assert any(w == {addr["w1"]} for w in rerun), (in_flight, rerun)


def test_open_sweep_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        open_sweep(tmp_path / "none.zarr")


def test_phase_diagram_small(tmp_path, client):
    """The GLPR entry point on a tiny grid: SA, Euler 0.1, pair fraction only; the heat map is written."""
    from wflow.studies.glpr import GLPR_CONFIG, phase_diagram

    fig = tmp_path / "phase.png"
    ds = phase_diagram(
        tmp_path / "p.zarr",
        d=[4, 8],
        betas="linspace(1, 9, 3)",
        systems=6,
        scheduler=client,
        progress=False,
        figure=fig,
        config={"run.t_end": 6.0, "save.n": 4},
    )
    assert dict(ds.sizes) == {"d": 2, "beta": 3, "seed": 6, "time": 4} and list(ds.data_vars).count(
        "pair_fraction"
    )
    cfg = point_config(ds, d=8, beta=1.0, seed=5)
    assert {k: cfg[k] for k in ("model.type", "run.method", "run.dt", "init.n")} == {
        k: GLPR_CONFIG[k] for k in ("model.type", "run.method", "run.dt", "init.n")
    }
    np.testing.assert_allclose(ds.save_time.sel(d=8, beta=1.0).values, [0.0, 2.0, 4.0, 6.0])
    pf = ds.pair_fraction.values
    assert (pf[..., 0] == 0).all() and (0 <= pf).all() and (pf <= 1).all()
    assert fig.stat().st_size > 10_000
    # the point against an independent run: Cartesian coordinates, GLPR's step unfused (numpy backend), the
    # fraction counted from the final points (the sweep ran in span coordinates with the fused step)
    assert (cfg["run.method"], cfg["run.coordinates"]) == ("euler-average", "span")
    from wflow import simulate
    from wflow.config import build_run

    model, mu0, kw = build_run(cfg)
    res = simulate(
        model,
        mu0,
        cfg["run.t_end"],
        **{
            **kw,
            "coordinates": "cartesian",
            "backend": "numpy",
            "save_at": dataclasses.replace(kw["save_at"], diagnostics=()),
        },
    )
    x = res.points[-1]
    G = x @ x.T
    n = cfg["init.n"]
    direct = ((G > 0.999).sum() - (np.diag(G) > 0.999).sum()) / (n * (n - 1))
    assert ds.pair_fraction.sel(d=8, beta=1.0, seed=5).values[-1] == direct > 0


_COMPILES_IN_WORKER = '''
import json
import os
import sys

os.environ["NUMBA_NUM_THREADS"] = "2"  # this process's numba (and each spawned worker's, which imports this module
import numba  # noqa: E402            # as __mp_main__ before the nanny applies WORKER_ENV) starts with 2 threads
import numpy as np  # noqa: E402

from wflow.sweep import sweep  # noqa: E402


def compiled_in_worker(mu):
    """Compiled afresh in the worker (no cache): numba re-reads its configuration as it compiles."""
    total = numba.njit(lambda x: x.sum())
    return np.array([total(p) for p in mu.points.reshape(-1, mu.n * mu.d)])


def pool_size(mu):
    """The size of the worker's numba thread pool."""
    return np.full(mu.batch_shape, numba.config.NUMBA_NUM_THREADS)


if __name__ == "__main__":
    ds = sweep({"init.n": 8, "init.d": 3, "run.t_end": 0.5, "save.n": 2, "run.method": "euler", "run.dt": 0.1,
                "run.backend": "numpy"}, {"model.beta": [1.0, 2.0]}, out=sys.argv[1], workers=1, progress=False,
               observables={"total": compiled_in_worker, "pool": pool_size})
    print(json.dumps({"status": ds.status.values.ravel().tolist(), "pool": ds.pool.values[..., -1].ravel().tolist(),
                      "messages": sorted(set(ds.message.values.ravel().tolist()))}))
'''


def test_local_cluster_workers_compile_after_numba_was_imported(tmp_path):
    """A LocalCluster worker imports the client's main module before its environment (NUMBA_NUM_THREADS=1)
    is set: its numba read another thread count at import, and any compilation in the worker (numba re-reads
    its configuration) raised "Cannot set NUMBA_NUM_THREADS to a different value once the threads have been
    launched" -- every task of a CLI sweep with a cold numba cache failed so.  The points now run, and the
    worker's numba pool has the one thread WORKER_ENV asks for (not the count the main module's import read)."""
    script = tmp_path / "run_sweep.py"
    script.write_text(_COMPILES_IN_WORKER)
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "s.zarr")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["status"] == [0, 0], got["messages"]
    assert got["pool"] == [1, 1]


def test_a_grid_too_large_for_the_disk_is_one_line_before_anything_starts(tmp_path, capsys):
    """A grid whose store cannot fit (here 1e7 points x 2e4 saves, ~6 TB; the issue's 1e9-point grid
    started and was killed for memory) is refused in one line, nothing written."""
    from wflow.cli import main

    argv = ["sweep", "--out", str(tmp_path / "huge.zarr"), "--set", "init.n=8", "--no-progress"]
    grid = ["--grid", "model.beta=linspace(0.1,9,1000)", "--grid", "init.seed=range(10000)"]
    capsys.readouterr()
    assert main([*argv, *grid, "--set", "save.n=20000"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "1e+07 points x 20000 saves" in err and "GiB is free" in err
    assert not (tmp_path / "huge.zarr").exists()


def test_the_automatic_batch_bounds_a_tasks_results_too():
    """A task's observables (batch x saves x observables, float64) stay within the state's budget."""
    from wflow.sweep.plan import _BATCH_BYTES, make_plan

    cfg = {"init.n": 4, "init.d": 3, "run.backend": "numpy", "save.n": 2001, "run.t_end": 1.0}
    plan = make_plan(cfg, {"init.seed": "range(100000)"}, None, None)
    assert plan.batch_size * plan.n_time * len(plan.observables) * 8 <= _BATCH_BYTES
    assert plan.batch_size == _BATCH_BYTES // (8 * 2001 * len(plan.observables))


def test_a_finished_sweep_run_again_starts_no_cluster(tmp_path, monkeypatch):
    import wflow.sweep as sw

    cfg = {"init.n": 6, "init.d": 3, "run.backend": "numpy", "run.t_end": 0.2, "save.n": 3}
    out = tmp_path / "s.zarr"
    first = sw.sweep(cfg, {"model.beta": [1.0, 2.0]}, out=out, workers=1, progress=False)

    def no_cluster(*a, **k):
        raise AssertionError("a finished sweep started a cluster")

    monkeypatch.setattr(sw, "connect", no_cluster)
    again = sw.sweep(cfg, {"model.beta": [1.0, 2.0]}, out=out, workers=1, progress=False)
    assert again.attrs["ok"] == first.attrs["ok"] == 2
    np.testing.assert_array_equal(again.order_parameter.values, first.order_parameter.values)


def test_the_clusters_shutdown_is_quiet_and_restores_the_loggers(caplog):
    """A LocalCluster's nanny logs 'Worker process still alive after 4.0 seconds, killing' at
    WARNING while a slow worker is shut down, after the sweep has committed everything; the
    shutdown shows errors only, and leaves the loggers' levels as it found them."""
    import logging

    from wflow.sweep import disconnect

    class SlowCluster:
        def close(self):
            logging.getLogger("distributed.nanny").warning("Worker process still alive, killing")
            logging.getLogger("distributed.nanny").error("a real error")

    nanny = logging.getLogger("distributed.nanny")
    nanny.setLevel(logging.INFO)
    with caplog.at_level(logging.INFO):
        disconnect(None, SlowCluster(), False)
    assert [r.levelname for r in caplog.records] == ["ERROR"]
    assert nanny.level == logging.INFO
    nanny.setLevel(logging.NOTSET)


def test_a_grid_beyond_float64_and_an_out_under_a_file_are_one_line(tmp_path, capsys):
    """'logspace(0,400,2)' printed NumPy's overflow warning before the error; '--out /dev/null/x' said
    "[Errno 17] File exists: '/dev/null'". Each is now one line naming what was given, exit 2."""
    from wflow.cli import main

    grid = ["--grid", "model.beta=logspace(0,400,2)"]
    assert main(["sweep", "--out", str(tmp_path / "s.zarr"), *grid]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "wflow: error: grid model.beta='logspace(0,400,2)': logspace gives values beyond float64 "
        "(10**400 overflows)"
    ]
    blocker = tmp_path / "a-file"
    blocker.write_text("mine")
    out = blocker / "x.zarr"
    assert main(["sweep", "--out", str(out), "--grid", "model.beta=[1,2]"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"wflow: error: {blocker} is not a folder: nothing can be written under it"]
    assert blocker.read_text() == "mine"
