import numpy as np
import pytest

from wflow import io
from wflow.cli import main

BASE = ["--set", "init.d=2", "--set", "mesh.resolution=64", "--set", "run.t_end=2", "--set", "run.n_saves=5",
        "--no-progress"]


def _interrupt_and_resume(monkeypatch, args, cut):
    """Run ``args`` into ``cut``, interrupted (Ctrl-C) after the third density snapshot; check that
    the three are on disk, resume with ``wflow run --resume`` and return the resumed density store."""
    orig = io.DensityZarrWriter.write

    def write(self, *a, **k):
        orig(self, *a, **k)
        if self.count == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(io.DensityZarrWriter, "write", write)
    assert main([*args, "--out", str(cut)]) == 130
    monkeypatch.setattr(io.DensityZarrWriter, "write", orig)
    assert len(io.load_density(cut / "density.zarr")["times"]) == 3
    assert main(["run", "--resume", "--out", str(cut), "--no-progress"]) == 0
    return io.load_density(cut / "density.zarr")


def test_eulerian_run_writes_densities_and_resumes(tmp_path, monkeypatch):
    full = tmp_path / "full"
    assert main(["run", "--set", "solver=eulerian", *BASE, "--out", str(full)]) == 0
    ref = io.load_density(full / "density.zarr")
    assert ref["values"].shape == (5, 64)
    np.testing.assert_allclose(ref["mass"], 1, rtol=1e-13)
    assert np.all(np.diff(ref["energy"]) >= -1e-12 * ref["energy"].max())
    assert (full / "summary.png").stat().st_size > 10_000
    # interrupt after the third snapshot, then resume
    back = _interrupt_and_resume(monkeypatch, ["run", "--set", "solver=eulerian", *BASE], tmp_path / "cut")
    np.testing.assert_array_equal(back["times"], ref["times"])
    # restarting from cell averages (values * areas) instead of masses costs only round-off
    np.testing.assert_allclose(back["values"], ref["values"], rtol=1e-12, atol=1e-14)


def test_lagrangian_run_is_written_incrementally_and_resumes(tmp_path, monkeypatch):
    out = tmp_path / "lag"
    assert main(["run", "--set", "solver=lagrangian", *BASE, "--out", str(out)]) == 0
    traj = io.load(out / "trajectory.zarr")
    assert traj.points.shape == (5, 64, 2) and traj.config["solver"] == "lagrangian"
    assert traj.tracers.shape == (5, 128, 2)  # two Jacobian tracers per node on S^1
    assert np.all(np.diff(traj.energy) >= -1e-12 * traj.energy.max())
    cut = tmp_path / "cut"
    orig = io.ZarrWriter.write

    def write(self, snapshot):
        orig(self, snapshot)
        if self.count == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(io.ZarrWriter, "write", write)
    assert main(["run", "--set", "solver=lagrangian", *BASE, "--out", str(cut)]) == 130
    monkeypatch.setattr(io.ZarrWriter, "write", orig)
    assert main(["run", "--resume", "--out", str(cut), "--no-progress"]) == 0
    back = io.load(cut / "trajectory.zarr")
    assert back.config["solver"] == "lagrangian"
    np.testing.assert_array_equal(back.points, traj.points)
    np.testing.assert_array_equal(back.tracers, traj.tracers)


@pytest.mark.parametrize("extra,match", [(["--set", "init.d=4"], "init.d"),
                                         (["--set", "run.method=euler"], "run.method"),
                                         (["--set", "mesh.resolution=2"], "mesh.resolution")])
def test_continuum_bad_config(extra, match, tmp_path, capsys):
    assert main(["run", "--set", "solver=eulerian", *BASE, *extra, "--out", str(tmp_path / "o")]) == 2
    assert match in capsys.readouterr().err


def test_jko_run_writes_densities_and_step_statistics(tmp_path, capsys):
    out = tmp_path / "jko"
    args = ["run", "--set", "solver=jko", "--set", "model.type=USA", "--set", "model.beta=2", *BASE,
            "--set", "jko.tau=0.25", "--out", str(out)]
    assert main(args) == 0
    res = io.load_density(out / "density.zarr")
    assert res["values"].shape == (5, 64)
    np.testing.assert_allclose(res["mass"], 1, rtol=1e-12)
    assert np.all(res["values"] >= 0)
    assert np.all(np.diff(res["energy"]) >= -1e-12 * np.abs(res["energy"]).max())  # USA ascends E
    lines = (out / "steps.csv").read_text().splitlines()
    assert len(lines) == 1 + 8 and lines[0].startswith("step,t,iterations")
    # SA is not a Wasserstein gradient flow
    assert main(["run", "--set", "solver=jko", *BASE, "--out", str(tmp_path / "sa")]) == 2
    assert "SA-reweighted" in capsys.readouterr().err


@pytest.mark.parametrize("kappa", ["0", "4"])
def test_jko_run_resumes_from_its_warm_start(kappa, tmp_path, monkeypatch):
    args = ["run", "--set", "solver=jko", "--set", "model.type=USA", "--set", "model.beta=2", *BASE,
            "--set", "jko.tau=0.25", "--set", f"run.kappa={kappa}", "--set", "output.figure=false"]
    assert main([*args, "--out", str(tmp_path / "full")]) == 0
    ref = io.load_density(tmp_path / "full" / "density.zarr")
    assert ref["jko_gbar"].shape == (5, 64) and np.isnan(ref["jko_L"][0]) and np.all(ref["jko_v"][1:] > 0)
    cut = tmp_path / "cut"
    back = _interrupt_and_resume(monkeypatch, args, cut)
    np.testing.assert_array_equal(back["times"], ref["times"])
    # the inner solver restarts from the stored warm start: the resumed run repeats the uninterrupted
    # one's iterations, from masses that round-trip through cell averages (round-off only)
    np.testing.assert_allclose(back["values"], ref["values"], rtol=1e-12, atol=1e-14)
    steps = (cut / "steps.csv").read_text().splitlines()
    assert [int(line.split(",")[0]) for line in steps[1:]] == list(range(1, 9))
    assert steps[-1].split(",")[2:4] == (tmp_path / "full" / "steps.csv").read_text().splitlines()[-1].split(",")[2:4]
