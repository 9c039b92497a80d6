import json
import subprocess
import sys

import numpy as np
import pytest

import wflow
from wflow import SA, USA, Atoms, io, simulate, sphere
from wflow.cli import main
from wflow.errors import WflowError


class _StopAfter(wflow.solvers.base.Tracker):
    """A tracker that interrupts the run after k snapshots (like a killed process)."""

    def __init__(self, k):
        self.k = k
        self.count = 0

    def save(self, snap):
        self.count += 1
        if self.count == self.k:
            raise KeyboardInterrupt


@pytest.mark.parametrize(
    "kwargs",
    [dict(dt=0.05), dict(method="dopri5", rtol=1e-7), dict(kappa=3.0, dt=0.02, seed=11)],
    ids=["rk4", "dopri5", "noise"],
)
def test_resumed_run_equals_uninterrupted(kwargs, tmp_path, rng):
    mu0 = Atoms(sphere.uniform(24, 3, rng, batch=(2,)))
    full = simulate(SA(4.0), mu0, 2.0, **kwargs)
    with pytest.raises(KeyboardInterrupt):
        simulate(
            SA(4.0),
            mu0,
            2.0,
            writer=io.ZarrRecorder(tmp_path / "t.zarr"),
            trackers=[_StopAfter(4)],
            **kwargs,
        )
    part = wflow.load(tmp_path / "t.zarr")
    assert len(part.times) == 4
    resumed = wflow.resume(tmp_path / "t.zarr")
    on_disk = wflow.load(tmp_path / "t.zarr")
    for traj in (resumed, on_disk):
        np.testing.assert_array_equal(traj.times, full.times)
        np.testing.assert_array_equal(traj.points, full.points)
        np.testing.assert_array_equal(traj.stats["steps"], full.stats["steps"])
        np.testing.assert_array_equal(traj.diagnostics["energy"], full.diagnostics["energy"])


def test_dataset_round_trip_and_self_description(tmp_path, rng):
    traj = simulate(
        USA(1.0, V=-np.eye(3)),
        Atoms(sphere.uniform(10, 3, rng), rng.uniform(size=10)),
        1.0,
        dt=0.1,
        seed=3,
    )
    ds = traj.to_dataset()
    assert ds["points"].dims == ("time", "particle", "coord")
    cfg = json.loads(ds.attrs["config"])
    assert cfg["model"] == {"type": "USA", "beta": 1.0, "V": (-np.eye(3)).tolist()}
    assert (
        cfg["seed"] is None
        and cfg["solver"] == "rk4"
        and ds.attrs["wflow_version"] == wflow.__version__
    )
    wflow.save(traj, tmp_path / "r.zarr")
    back = wflow.load(tmp_path / "r.zarr")
    np.testing.assert_array_equal(back.points, traj.points)
    np.testing.assert_array_equal(back.weights, traj.weights)
    assert back.config == traj.config


def test_load_rejects_foreign_files(tmp_path):
    import xarray as xr

    xr.Dataset({"a": ("x", np.arange(3))}).to_zarr(tmp_path / "other.zarr", consolidated=False)
    with pytest.raises(WflowError, match="not a wflow result store"):
        wflow.load(tmp_path / "other.zarr")
    (tmp_path / "junk").mkdir()
    with pytest.raises(WflowError, match="has no zarr.json"):
        wflow.load(tmp_path / "junk")
    with pytest.raises(FileNotFoundError):
        wflow.load(tmp_path / "missing.zarr")


def test_cli_default_with_small_overrides(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(
        [
            "run",
            "--set",
            "init.n=60",
            "--set",
            "run.t_end=2",
            "--set",
            "save.n=5",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert str(out / "trajectory.zarr") in text and str(out / "summary.png") in text
    assert "effective clusters N_eff: " in text
    assert (out / "summary.png").stat().st_size > 10_000
    traj = wflow.load(out / "trajectory.zarr")
    assert traj.points.shape == (5, 60, 3)
    assert traj.config["model"] == {"type": "SA", "beta": 9.0}
    assert np.all(np.diff(traj.energy) >= -1e-12 * traj.energy.max())
    # the written config reproduces the run
    rc = main(["run", str(out / "config.toml"), "--out", str(tmp_path / "again"), "--no-progress"])
    assert rc == 0
    np.testing.assert_array_equal(
        wflow.load(tmp_path / "again" / "trajectory.zarr").points, traj.points
    )


def test_cli_resume_completes_interrupted_run(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    args = [
        "--set",
        "init.n=30",
        "--set",
        "run.t_end=1",
        "--set",
        "save.n=6",
        "--set",
        "run.method=rk4",
        "--set",
        "run.dt=0.05",
        "--out",
        str(out),
        "--no-progress",
    ]
    assert main(["run", *args, "--set", "output.figure=false"]) == 0
    full = wflow.load(out / "trajectory.zarr")
    # an interruption (Ctrl-C) after the third committed snapshot, then resume
    out2 = tmp_path / "cut"
    orig = io.ZarrRecorder.save

    def save(self, snap):
        orig(self, snap)
        if self.count == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(io.ZarrRecorder, "save", save)
    assert main(["run", *args[:-3], "--out", str(out2), "--no-progress"]) == 130
    monkeypatch.setattr(io.ZarrRecorder, "save", orig)
    assert len(wflow.load(out2 / "trajectory.zarr").times) == 3
    assert main(["run", "--resume", "--out", str(out2), "--no-progress"]) == 0
    np.testing.assert_array_equal(wflow.load(out2 / "trajectory.zarr").points, full.points)


@pytest.mark.parametrize(
    "argv,match",
    [
        (["run", "--set", "model.beta=-2"], "model.beta"),
        (["run", "--set", "init.n=ten"], "init.n"),
        (["run", "--set", "model.kind=SA"], "unknown config key"),
        (["run", "--set", "run.dt"], "key=value"),
        (["run", "--set", "run.method=rk5"], "run.method"),
        (["run", "--set", "run.t_end=0"], "run.t_end"),
        (["run", "--set", "run.kappa=1", "--set", "run.method=rk4"], "euler-maruyama"),
        (["run", "missing.toml"], "not found"),
        (["run", "--resume"], "no interrupted run"),
    ],
)
def test_cli_bad_input_one_line(argv, match, tmp_path, capsys):
    rc = main([*argv, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2
    assert match in err and err.count("\n") == 1 and err.startswith("wflow: error:")


def test_cli_rejects_unknown_toml_keys(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[model]\ntype = "SA"\ntemperature = 3\n')
    assert main(["run", str(cfg), "--out", str(tmp_path / "o")]) == 2
    assert "model.temperature" in capsys.readouterr().err


def test_console_script_version_and_help():
    r = subprocess.run(
        [sys.executable, "-m", "wflow.cli", "--version"], capture_output=True, text=True
    )
    assert r.returncode == 0 and r.stdout.strip() == f"wflow {wflow.__version__}"
    r = subprocess.run(
        [sys.executable, "-m", "wflow.cli", "run", "--help"], capture_output=True, text=True
    )
    from wflow.config import KEYS

    assert r.returncode == 0 and all(k in r.stdout for k in KEYS)


def test_validate_rejects_unknown_study(tmp_path, capsys):
    assert main(["validate", "no-such-study", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no-such-study" in err and "mean-field" in err


def test_validate_rejects_zero_workers_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "v"
    assert main(["validate", "mean-shift", "--quick", "--workers", "0", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert (
        "--workers must be an integer >= 1, got 0" in err
        and err.count("\n") == 1
        and not out.exists()
    )


def test_validate_report_and_exit_status(tmp_path, monkeypatch, capsys):
    """A failed expectation makes `wflow validate` exit 1 and is marked in the Markdown report."""
    from wflow import studies

    def fake(out, quick):
        rep = studies.StudyReport("fake")
        rep.rows.append({"N": 10, "err": 0.1})
        rep.expect("slope", -0.2, -0.6, -0.4)
        rep.expect("order", 2.0, 1.8, 2.2)
        return rep

    monkeypatch.setitem(studies.STUDIES, "fake", fake)
    assert main(["validate", "fake", "--out", str(tmp_path)]) == 1
    text = (tmp_path / "fake.md").read_text()
    assert (
        "FAILED" in text
        and "| slope | -0.2 |" in text
        and (tmp_path / "fake.csv").read_text().startswith("N,err")
    )
    out = capsys.readouterr().out.splitlines()
    # a line before the study runs, its verdict, then the tally
    assert out[0] == "[1/1] fake (full) ..." and out[1].startswith("fake: FAILED (")
    assert any(line.startswith("  FAIL slope") for line in out)
    assert out[-1] == "0 passed, 1 failed (fake)"


def test_a_group_runs_its_studies_and_an_interrupted_study_keeps_its_finished_parts(
    tmp_path, monkeypatch, capsys
):
    """`wflow validate GROUP` runs every study of the group; a study interrupted after two of its three parts
    recomputes only the third when run again (wflow.studies.parts.Parts), and a quick part is not reused by
    the full mode."""
    from wflow.studies import report
    from wflow.studies.parts import Parts

    calls = []

    def part_study(out, quick):
        parts = Parts(out, "parted", quick)
        rep = report.StudyReport("parted")
        for beta in (1.0, 2.0, 3.0):

            def compute(beta=beta):
                if beta == 3.0 and not calls.count("ok-to-finish"):
                    raise KeyboardInterrupt
                calls.append(beta)
                return {"value": np.arange(3) * beta, "rate": beta / 2}

            got = parts.get({"beta": beta}, compute)
            rep.rows.append({"beta": beta, "rate": got["rate"]})
        rep.expect("parts", len(rep.rows), 3, 3)
        return rep

    def other(out, quick):
        rep = report.StudyReport("other")
        rep.expect("one", 1.0, 1, 1)
        return rep

    monkeypatch.setitem(report.STUDIES, "parted", part_study)
    monkeypatch.setitem(report.STUDIES, "other", other)
    monkeypatch.setitem(report.GROUPS, "grp", ["parted", "other"])
    assert main(["validate", "grp", "--quick", "--out", str(tmp_path)]) == 130  # Ctrl-C: one line
    assert calls == [1.0, 2.0] and "interrupted" in capsys.readouterr().err
    calls.append("ok-to-finish")
    assert main(["validate", "grp", "--quick", "--out", str(tmp_path)]) == 0
    assert calls == [1.0, 2.0, "ok-to-finish", 3.0]  # only the unfinished part ran again
    assert (tmp_path / "parted.md").exists() and (tmp_path / "other.md").exists()
    assert main(["validate", "parted", "--out", str(tmp_path)]) == 0  # full mode: its own parts
    assert calls[-3:] == [1.0, 2.0, 3.0]


def test_cli_sweep_runs_a_grid_into_one_store_and_continues(tmp_path, capsys):
    """wflow sweep: a grid of beta x seeds on a LocalCluster, one store with the grid as coordinates; running
    it again finds every point done; a key that does not exist is one line and exit 2, nothing written."""
    import xarray as xr

    out = tmp_path / "sw.zarr"
    argv = [
        "sweep",
        "--set",
        "init.n=8",
        "--set",
        "run.t_end=1",
        "--set",
        "save.n=3",
        "--grid",
        "model.beta=[1,4]",
        "--grid",
        "init.seed=range(3)",
        "--workers",
        "1",
        "--out",
        str(out),
        "--no-progress",
    ]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "6 of 6 points reached t_end" in text
    # its default figure, the phase diagram's heat map, beside the store
    assert (
        f"figure: {tmp_path / 'sw.png'}" in text and (tmp_path / "sw.png").stat().st_size > 10_000
    )
    ds = xr.open_zarr(out)
    assert (
        ds["pair_fraction"].sel(beta=4.0).shape[:1] == (3,) and int((ds["status"] == 0).sum()) == 6
    )
    assert main(argv) == 0
    assert main(["sweep", "--grid", "model.nope=[1]", "--out", str(tmp_path / "bad.zarr")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        err[-1].startswith("wflow: error:")
        and "model.nope" in err[-1]
        and not (tmp_path / "bad.zarr").exists()
    )


# ------------------------------------------------------------------ stores that explain themselves
def test_density_store_names_its_variable_density_with_cell_angles(tmp_path):
    """A density store: ``density`` (not ``values``, which Dataset.values shadows), cell angles on S^1 exactly
    those of the centres ((i + 1/2) 2 pi / M on a CircleMesh), the equation and the energy's definition."""
    import xarray as xr

    rho0 = wflow.Density.from_function(wflow.CircleMesh(16), lambda x: 1 + 0.5 * x[:, 0])
    res = wflow.solve_density(USA(1.0), rho0, 0.5, save_at=[0.0, 0.25, 0.5], backend="numpy")
    path = wflow.save(res, tmp_path / "d.zarr")
    for ds in (res.to_dataset(), xr.open_zarr(path)):
        assert "density" in ds.data_vars and "values" not in ds.data_vars
        np.testing.assert_array_equal(ds["density"].values, res.values)
        c = res.mesh.centers
        np.testing.assert_array_equal(
            ds["angle"].values, np.mod(np.arctan2(c[:, 1], c[:, 0]), 2 * np.pi)
        )
        np.testing.assert_allclose(
            ds["angle"].values, (np.arange(16) + 0.5) * 2 * np.pi / 16, rtol=0, atol=1e-15
        )
        assert ds["angle"].dims == ("cell",) and ds["angle"].attrs["units"] == "radian"
        assert "angle" in ds["density"].coords
        assert ds.attrs["equation"].startswith("d_t rho + div_S(rho v[rho]) = 0")
        assert (
            ds.attrs["velocity"] == "USA: v[mu](x) = P_x( int e^(beta <x,y>) y dmu(y) ), beta = 1"
        )
        e = ds["energy"].attrs
        assert e["definition"] == (
            "E_beta(mu) = (1 / (2 beta)) sum_i sum_j w_i w_j exp(beta <x_i, x_j>)"
        )
        assert e["beta"] == 1.0 and e["kernel"] == "plain" and "summing to 1" in e["normalization"]
    back = wflow.load(path)
    np.testing.assert_array_equal(back.values, res.values)


def test_sphere_density_store_has_longitude_and_latitude(tmp_path):
    import xarray as xr

    rho0 = wflow.Density.from_function(wflow.SphereMesh(2), lambda x: 1 + 0.3 * x[:, 2])
    res = wflow.solve_density(USA(1.0), rho0, 0.1, save_at=[0.0, 0.1], backend="numpy")
    ds = xr.open_zarr(wflow.save(res, tmp_path / "s.zarr"))
    lon, lat = np.radians(ds["longitude"].values), np.radians(ds["latitude"].values)
    back = np.stack([np.cos(lat) * np.cos(lon), np.cos(lat) * np.sin(lon), np.sin(lat)], axis=1)
    c = res.mesh.centers
    np.testing.assert_allclose(back, c / np.linalg.norm(c, axis=1, keepdims=True), atol=1e-14)
    assert ds["longitude"].attrs["units"] == "degrees_east"
    assert ds["latitude"].attrs["units"] == "degrees_north"
    assert {"longitude", "latitude"} <= set(ds["density"].coords)
    assert np.all(np.abs(ds["latitude"].values) <= 90) and np.all(
        np.abs(ds["longitude"].values) <= 180
    )


def test_older_density_store_with_values_loads_and_resumes(tmp_path, monkeypatch):
    """A store written with the old name ``values`` loads, and resumes in its own layout to the numbers of an
    uninterrupted run."""
    import xarray as xr

    from wflow.solvers.eulerian import FiniteVolume

    rho0 = wflow.Density.from_function(wflow.CircleMesh(24), lambda x: 1 + 0.4 * x[:, 1])
    kw = dict(save_at=np.linspace(0, 0.6, 7), backend="numpy")
    full = wflow.solve_density(SA(3.0), rho0, 0.6, **kw)
    path = tmp_path / "old.zarr"
    with monkeypatch.context() as m:
        m.setattr(FiniteVolume, "density_name", "values")  # as wflow 0.1 wrote it
        with pytest.raises(KeyboardInterrupt):
            wflow.solve_density(
                SA(3.0), rho0, 0.6, trackers=[io.ZarrRecorder(path), _StopAfter(3)], **kw
            )
    assert "values" in xr.open_zarr(path).data_vars
    part = wflow.load(path)
    assert len(part.times) == 3
    np.testing.assert_array_equal(part.values, full.values[:3])
    resumed = wflow.resume(path)
    np.testing.assert_array_equal(resumed.values, full.values)
    np.testing.assert_array_equal(wflow.load(path).values, full.values)
    assert "density" not in xr.open_zarr(path).data_vars


def test_particle_store_states_each_diagnostic_and_its_parameters(tmp_path):
    import xarray as xr

    traj = simulate(
        SA(9.0), sphere.uniform(12, 3, seed=0), 0.5, dt=0.1, cluster_threshold=0.2, backend="numpy"
    )
    for ds in (traj.to_dataset(), xr.open_zarr(wflow.save(traj, tmp_path / "t.zarr"))):
        assert ds["n_clusters"].attrs["threshold_rad"] == 0.2
        assert "single linkage" in ds["n_clusters"].attrs["long_name"]
        assert ds["n_eff"].attrs["beta"] == 9.0
        assert (
            ds["n_eff"]
            .attrs["definition"]
            .startswith("N_eff = 1 / sum_i sum_j w_i w_j exp(beta (<x_i, x_j> - 1))")
        )
        assert (
            ds["energy"].attrs["beta"] == 9.0
            and "non-decreasing" in ds["energy"].attrs["long_name"]
        )
        assert ds.attrs["equation"].startswith("dx_i/dt = v[mu_N](x_i)")
        assert ds.attrs["velocity"].startswith("SA: v[mu](x) = P_x( int e^(beta <x,y>) y dmu(y) /")
        assert ds.attrs["velocity"].endswith("beta = 9")


def test_a_saved_run_that_stopped_early_resumes_to_the_uninterrupted_run(tmp_path):
    """wflow.save of a run a tracker stopped keeps room for every configured save, so wflow.resume continues
    it into the same store and ends where the uninterrupted run ends, bit for bit (it raised zarr's
    BoundsCheckError: the store had exactly the saves made)."""
    x0 = wflow.sphere.uniform(8, 3, seed=0)
    kw = dict(dt=0.1, save_at=np.linspace(0, 2, 11), backend="numpy")
    stopped = wflow.simulate(wflow.SA(4.0), x0, 2.0, trackers=[lambda t, mu: t >= 0.6], **kw)
    assert stopped.status == 1 and len(stopped) == 4
    path = wflow.save(stopped, tmp_path / "s.zarr")
    back = wflow.resume(path)
    full = wflow.simulate(wflow.SA(4.0), x0, 2.0, **kw)
    assert back.status == 0
    np.testing.assert_array_equal(back.times, full.times)
    np.testing.assert_array_equal(back.points, full.points)
    np.testing.assert_array_equal(wflow.load(path).points, full.points)
