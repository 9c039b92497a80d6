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
            "run.n_saves=5",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert str(out / "trajectory.zarr") in text and str(out / "summary.png") in text
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
        "run.n_saves=6",
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
    assert out[-1] == "0 of 1 studies passed; failed: fake"


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
        "run.n_saves=3",
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
    assert "6 of 6 points reached t_end" in capsys.readouterr().out
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
