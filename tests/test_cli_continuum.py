import numpy as np
import pytest

import wflow
from wflow import io
from wflow.cli import main

BASE = [
    "--set",
    "init.d=2",
    "--set",
    "mesh.resolution=64",
    "--set",
    "run.t_end=2",
    "--set",
    "save.n=5",
    "--no-progress",
]


def _interrupt(monkeypatch, args, cut, store, k=3):
    """Run ``args`` into ``cut``, interrupted (Ctrl-C) after the k-th committed snapshot; check that
    the k snapshots are on disk and resume with ``wflow run --resume``."""
    orig = io.ZarrRecorder.save

    def save(self, snap):
        orig(self, snap)
        if self.count == k:
            raise KeyboardInterrupt

    monkeypatch.setattr(io.ZarrRecorder, "save", save)
    assert main([*args, "--out", str(cut)]) == 130
    monkeypatch.setattr(io.ZarrRecorder, "save", orig)
    assert len(wflow.load(cut / store).times) == k
    assert main(["run", "--resume", "--out", str(cut), "--no-progress"]) == 0
    return wflow.load(cut / store)


def _interrupt_and_resume(monkeypatch, args, cut):
    return _interrupt(monkeypatch, args, cut, "density.zarr")


def test_eulerian_run_writes_densities_and_resumes(tmp_path, monkeypatch):
    full = tmp_path / "full"
    assert main(["run", "--set", "problem=eulerian", *BASE, "--out", str(full)]) == 0
    ref = wflow.load(full / "density.zarr")
    assert ref.values.shape == (5, 64)
    np.testing.assert_allclose(ref.mass, 1, rtol=1e-13)
    assert np.all(np.diff(ref.energy) >= -1e-12 * ref.energy.max())
    assert (full / "summary.png").stat().st_size > 10_000
    # interrupt after the third snapshot, then resume
    back = _interrupt_and_resume(
        monkeypatch, ["run", "--set", "problem=eulerian", *BASE], tmp_path / "cut"
    )
    np.testing.assert_array_equal(back.times, ref.times)
    # restarting from cell averages (values * areas) instead of masses costs only round-off
    np.testing.assert_allclose(back.values, ref.values, rtol=1e-12, atol=1e-14)


def test_lagrangian_run_is_written_incrementally_and_resumes(tmp_path, monkeypatch):
    out = tmp_path / "lag"
    assert main(["run", "--set", "problem=lagrangian", *BASE, "--out", str(out)]) == 0
    traj = wflow.load(out / "trajectory.zarr")
    assert traj.points.shape == (5, 64, 2) and traj.kind == "lagrangian"
    assert traj.tracers.shape == (5, 128, 2)  # two Jacobian tracers per node on S^1
    assert np.all(np.diff(traj.energy) >= -1e-12 * traj.energy.max())
    back = _interrupt(
        monkeypatch,
        ["run", "--set", "problem=lagrangian", *BASE],
        tmp_path / "cut",
        "trajectory.zarr",
        k=2,
    )
    assert back.kind == "lagrangian"
    np.testing.assert_array_equal(back.points, traj.points)
    np.testing.assert_array_equal(back.tracers, traj.tracers)


@pytest.mark.parametrize(
    "extra,match",
    [
        (["--set", "init.d=4"], "init.d"),
        (["--set", "run.method=euler"], "run.method"),
        (["--set", "mesh.resolution=2"], "mesh.resolution"),
    ],
)
def test_continuum_bad_config(extra, match, tmp_path, capsys):
    assert (
        main(["run", "--set", "problem=eulerian", *BASE, *extra, "--out", str(tmp_path / "o")]) == 2
    )
    assert match in capsys.readouterr().err


def test_jko_run_writes_densities_and_step_statistics(tmp_path, capsys):
    out = tmp_path / "jko"
    args = [
        "run",
        "--set",
        "problem=jko",
        "--set",
        "model.type=USA",
        "--set",
        "model.beta=2",
        *BASE,
        "--set",
        "jko.tau=0.25",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    res = wflow.load(out / "density.zarr")
    assert res.values.shape == (5, 64)
    np.testing.assert_allclose(res.weights.sum(axis=1), 1, rtol=1e-12)
    assert np.all(res.values >= 0)
    assert np.all(np.diff(res.energy) >= -1e-12 * np.abs(res.energy).max())  # USA ascends E
    lines = (out / "steps.csv").read_text().splitlines()
    assert len(lines) == 1 + 8 and lines[0].startswith("step,t,dt,error,iterations")
    # SA is not a Wasserstein gradient flow
    assert main(["run", "--set", "problem=jko", *BASE, "--out", str(tmp_path / "sa")]) == 2
    assert "reweighted by Z_mu" in capsys.readouterr().err


@pytest.mark.parametrize("kappa", ["0", "4"])
def test_jko_run_resumes_from_its_warm_start(kappa, tmp_path, monkeypatch):
    args = [
        "run",
        "--set",
        "problem=jko",
        "--set",
        "model.type=USA",
        "--set",
        "model.beta=2",
        *BASE,
        "--set",
        "jko.tau=0.25",
        "--set",
        f"run.kappa={kappa}",
        "--set",
        "output.figure=false",
    ]
    assert main([*args, "--out", str(tmp_path / "full")]) == 0
    ref = wflow.load(tmp_path / "full" / "density.zarr")
    ck = io.read_store(tmp_path / "full" / "density.zarr")["checkpoint"]
    assert ck["gbar"][1].shape == (5, 64) and np.isnan(ck["L"][1][0]) and np.all(ck["v"][1][1:] > 0)
    cut = tmp_path / "cut"
    back = _interrupt_and_resume(monkeypatch, args, cut)
    np.testing.assert_array_equal(back.times, ref.times)
    # the inner solver restarts from the stored warm start and the weights are the stored state:
    # the resumed run repeats the uninterrupted one exactly
    np.testing.assert_array_equal(back.weights, ref.weights)
    steps = (cut / "steps.csv").read_text().splitlines()
    assert [int(line.split(",")[0]) for line in steps[1:]] == list(range(1, 9))
    assert (
        steps[-1].split(",")[4:6]
        == (tmp_path / "full" / "steps.csv").read_text().splitlines()[-1].split(",")[4:6]
    )


def test_zonal_scheme_and_layered_runs_from_the_cli(tmp_path):
    """problem=zonal in d = 128, a Pre-LN scheme, random layers in the rescaled kernel: each runs, resumes
    through the one path, and writes its figure."""
    runs = {
        "zonal": [
            "--set",
            "problem=zonal",
            "--set",
            "init.d=128",
            "--set",
            "model.beta=4",
            "--set",
            "mesh.resolution=128",
            "--set",
            "run.t_end=1",
        ],
        "pre-ln": ["--set", "model.scheme=pre-ln", "--set", "init.n=30", "--set", "run.t_end=1"],
        "layers": [
            "--set",
            "model.layers=2",
            "--set",
            "model.kernel=rescaled",
            "--set",
            "model.type=USA",
            "--set",
            "model.beta=50",
            "--set",
            "init.n=20",
            "--set",
            "init.d=2",
            "--set",
            "run.t_end=2",
        ],
    }
    for name, args in runs.items():
        out = tmp_path / name
        assert main(["run", *args, "--set", "save.n=3", "--no-progress", "--out", str(out)]) == 0, (
            name
        )
        assert (out / "summary.png").stat().st_size > 5_000
        res = wflow.load(next(out.glob("*.zarr")))
        assert len(res.times) == 3
    assert wflow.load(tmp_path / "pre-ln" / "trajectory.zarr").radii.shape == (3, 30)
    assert (
        main(
            [
                "run",
                "--set",
                "model.scheme=pre-ln",
                "--set",
                "problem=eulerian",
                "--set",
                "init.d=2",
                "--out",
                str(tmp_path / "bad"),
            ]
        )
        == 2
    )
