"""One owner per rule: the model decides whether float64 can integrate USA at a beta, and the library,
`wflow run` and `wflow sweep` give the same answer with the same words (issue 32, item 4)."""

import re

import numpy as np
import pytest

import wflow
from wflow.cli import main
from wflow.models import USA

WORDS = "USA at beta=400: the velocity is of size e^"


def _cli(capsys, argv):
    capsys.readouterr()
    code = main(argv)
    return code, capsys.readouterr().err


def test_plain_usa_beyond_float64_is_refused_alike_everywhere(tmp_path, capsys):
    x0 = wflow.sphere.uniform(12, 3, seed=0)
    with pytest.raises(wflow.WflowError, match=re.escape(WORDS)):
        wflow.simulate(USA(400.0), x0, 0.1, dt=0.01, method="rk4", backend="numpy")
    usa = ["--set", "model.type=USA", "--set", "init.n=12", "--no-progress"]
    code, err = _cli(capsys, ["run", *usa, "--set", "model.beta=400", "--out", str(tmp_path / "r")])
    assert code == 2 and WORDS in err and not (tmp_path / "r").exists()
    grid = ["--grid", "model.beta=[1,400]", "--set", "run.t_end=0.1", "--workers", "1"]
    code, err = _cli(capsys, ["sweep", *usa, *grid, "--out", str(tmp_path / "s.zarr")])
    assert code == 2 and WORDS in err and not (tmp_path / "s.zarr").exists()
    assert USA.integrable(400.0) is not None and USA.integrable(300.0) is None


def test_rescaled_usa_runs_at_any_beta_everywhere(tmp_path, capsys):
    x0 = wflow.sphere.uniform(12, 3, seed=0)
    traj = wflow.simulate(USA(400.0, kernel="rescaled"), x0, 0.1, dt=0.01, method="rk4")
    assert traj.status == 0 and np.all(np.isfinite(traj.points))
    usa = ["--set", "model.type=USA", "--set", "model.kernel=rescaled", "--set", "init.n=12"]
    small = ["--set", "run.t_end=0.1", "--set", "output.figure=false", "--no-progress"]
    code, err = _cli(
        capsys, ["run", *usa, *small, "--set", "model.beta=400", "--out", str(tmp_path / "r")]
    )
    assert code == 0, err
    assert USA.integrable(400.0, "rescaled") is None


def test_misspelt_names_get_a_did_you_mean(tmp_path, capsys):
    code, err = _cli(capsys, ["validate", "mean-feild", "--out", str(tmp_path / "v")])
    assert code == 2 and "did you mean 'mean-field'?" in err
    with pytest.raises(ValueError, match=r"got 'rk5' \(did you mean 'rk4'\?\)"):
        wflow.simulate(wflow.SA(1.0), wflow.sphere.uniform(5, 3, seed=0), 1.0, method="rk5")


def test_misspelt_config_keys_and_choices_get_a_did_you_mean(tmp_path, capsys):
    code, err = _cli(capsys, ["run", "--set", "model.bata=3", "--out", str(tmp_path / "r")])
    assert code == 2 and "did you mean 'model.beta'?" in err
    code, err = _cli(capsys, ["run", "--set", "problem=eulerain", "--out", str(tmp_path / "r")])
    assert code == 2 and "did you mean 'eulerian'?" in err


def test_wflow_run_takes_the_same_exact_coordinates_as_simulate(tmp_path, capsys):
    """run.coordinates = auto (the default): span for SA with more dimensions than tokens, the same
    points as the Cartesian run to 1e-12; cartesian where span is not exact (V = -I)."""
    small = ["--set", "init.n=6", "--set", "init.d=40", "--set", "run.t_end=2", "--no-progress"]
    small += ["--set", "output.figure=false"]
    assert main(["run", *small, "--out", str(tmp_path / "auto")]) == 0
    assert (
        main(["run", *small, "--set", "run.coordinates=cartesian", "--out", str(tmp_path / "c")])
        == 0
    )
    auto, cart = (wflow.load(tmp_path / k / "trajectory.zarr") for k in ("auto", "c"))
    assert "span" in auto.data and "points" in cart.data
    np.testing.assert_allclose(auto.points, cart.points, atol=1e-10)
    assert (
        main(["run", *small, "--set", "model.value=minus-identity", "--out", str(tmp_path / "m")])
        == 0
    )
    assert "points" in wflow.load(tmp_path / "m" / "trajectory.zarr").data


def test_the_key_solver_of_earlier_releases_reads_as_problem_with_a_warning(tmp_path, capsys):
    """`solver` named the kind of problem (run.method names the time stepper): in a TOML file, in --set
    and in a sweep's base it still works as `problem`, with a DeprecationWarning naming the new key; the
    command line says so in one line, runs, and writes the new key to the folder's config.toml."""
    from wflow.config import apply_overrides, default_config, load_config
    from wflow.sweep.grid import base_config

    toml = tmp_path / "old.toml"
    toml.write_text('solver = "jko"\n\n[jko]\ntau = 0.1\n')
    with pytest.warns(DeprecationWarning, match="config key solver is deprecated; use problem"):
        cfg = load_config(toml)
    assert (cfg["problem"], cfg["jko.tau"]) == ("jko", 0.1) and "solver" not in cfg
    with pytest.warns(DeprecationWarning, match="use problem"):
        assert apply_overrides(default_config(), ["solver=zonal"])["problem"] == "zonal"
    with pytest.warns(DeprecationWarning, match="use problem"):
        assert base_config({"solver": "eulerian", "init.d": 2})["problem"] == "eulerian"
    out = tmp_path / "r"
    sets = ["solver=eulerian", "init.d=2", "mesh.resolution=16", "run.t_end=0.2", "save.n=2"]
    argv = ["run", *(a for s in sets for a in ("--set", s)), "--set", "output.figure=false"]
    code, err = _cli(capsys, [*argv, "--no-progress", "--out", str(out)])
    assert code == 0 and "wflow: warning: config key solver is deprecated; use problem\n" in err
    assert len(wflow.load(out / "density.zarr").times) == 2
    assert 'problem = "eulerian"' in (out / "config.toml").read_text()
