"""What a run saves: the SaveAt specification, StepControl, the deprecated spellings, lazy points."""

import warnings

import numpy as np
import pytest

import wflow
from wflow import SA, SaveAt, StepControl, sphere
from wflow.solvers.base import Tracker


class _Steps(Tracker):
    """Counts the steps a run took (a bad specification must be refused before the first)."""

    def __init__(self):
        self.steps = 0

    def step(self, t, dt, res):
        self.steps += 1


def _run(save_at, x0=None, **kw):
    x0 = sphere.uniform(12, 3, seed=0, batch=(2,)) if x0 is None else x0
    return wflow.simulate(SA(4.0), x0, 1.0, dt=0.1, save_at=save_at, **kw)


def test_points_false_keeps_every_diagnostic_and_the_last_points():
    """points=False: the diagnostics of every save and the final points are those of the full run, bit for
    bit; the points of other saves are not held, and asking for them says how to keep them."""
    ts = np.linspace(0.0, 1.0, 6)
    full = _run(ts)
    lean = _run(SaveAt(ts, points=False))
    np.testing.assert_array_equal(lean.times, full.times)
    assert sorted(lean.diagnostics) == sorted(full.diagnostics)
    for name, values in full.diagnostics.items():
        np.testing.assert_array_equal(lean.diagnostics[name], values)
    np.testing.assert_array_equal(lean.final.points, full.points[-1])
    with pytest.raises(ValueError, match=r"points=False.*traj.final"):
        _ = lean.points
    with pytest.raises(ValueError, match="save 2"):
        lean.atoms(2)


@pytest.mark.parametrize("coordinates", ["cartesian", "span"])
def test_out_receives_every_save_and_dtype_casts_only_what_is_kept(coordinates):
    """out=: the result's points are the caller's array, holding every save's points (formed from span
    coordinates where the run took them); dtype=float32 keeps float32 points of the same run (the state
    and the diagnostics are computed as before)."""
    x0 = sphere.uniform(4, 6, seed=1, batch=(3,))  # d > n: the default is span coordinates
    ts = [0.0, 0.5, 1.0]
    ref = _run(ts, x0, coordinates=coordinates)
    out = np.full((3, 3, 4, 6), np.nan)
    got = _run(SaveAt(ts, out=out), x0, coordinates=coordinates)
    assert got.points is out
    np.testing.assert_allclose(out, np.asarray(ref.points), rtol=0, atol=1e-15)
    f32 = _run(SaveAt(ts, dtype=np.float32), x0, coordinates=coordinates)
    assert f32.points.dtype == np.float32
    np.testing.assert_array_equal(f32.points, np.asarray(ref.points).astype(np.float32))
    np.testing.assert_array_equal(f32.diagnostics["energy"], ref.diagnostics["energy"])
    out32 = np.empty((3, 3, 4, 6), np.float32)  # out's own dtype is the kept dtype
    assert _run(SaveAt(ts, out=out32), x0, coordinates=coordinates).points is out32
    np.testing.assert_array_equal(out32, f32.points)


@pytest.mark.parametrize(
    "spec, error, match",
    [
        (lambda: SaveAt([0, 1], diagnostics=("energy", "entropy")), ValueError, "entropy"),
        (lambda: SaveAt([0, 1], diagnostics="energy"), TypeError, "diagnostics"),
        (lambda: SaveAt([0, 1], fn={"spread": 3.0}), TypeError, r"fn\['spread'\]"),
        (lambda: SaveAt([0, 1], fn={"energy": lambda mu: 0.0}), ValueError, "energy"),
        (lambda: SaveAt([0, 1], fn={"not a name": lambda mu: 0.0}), ValueError, "identifiers"),
        (lambda: SaveAt([0, 1], dtype=np.int32), TypeError, "int32"),
        (lambda: SaveAt([0, 1], dtype=np.complex128), TypeError, "complex128"),
        (lambda: SaveAt([0, 1], dtype=object), TypeError, "object"),
        (lambda: SaveAt([0, 1], out=np.empty((3, 2, 12, 3))), ValueError, r"\(2, 2, 12, 3\)"),
        (lambda: SaveAt([0, 1], out=np.empty((2, 2, 12, 3), np.int64)), TypeError, "int64"),
        (
            lambda: SaveAt([0, 1], out=np.empty((2, 2, 12, 3)), dtype=np.float32),
            TypeError,
            "float32",
        ),
        (lambda: SaveAt([0, 1], out=np.empty((2, 2, 12, 3)), points=False), ValueError, "points"),
        (lambda: SaveAt([0, 1], points="yes"), TypeError, "points"),
    ],
)
def test_bad_specifications_are_named_before_any_step(spec, error, match):
    steps = _Steps()
    with pytest.raises(error, match=match):
        _run(spec(), trackers=[steps])
    assert steps.steps == 0


def test_read_only_out_is_refused():
    out = np.empty((2, 2, 12, 3))
    out.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        SaveAt([0, 1], out=out)


def test_out_needs_a_run_whose_state_is_its_points():
    """Angles on the circle are not the points: dtype= and out= are refused there, naming the problem."""
    x0 = sphere.uniform(8, 2, seed=0)
    with pytest.raises(ValueError, match="CircleAngleProblem"):
        _run(SaveAt([0, 1], dtype=np.float32), x0, coordinates="angles")


@pytest.mark.parametrize(
    "old, new",
    [
        ({"rtol": 1e-8, "atol": 1e-10}, {"control": StepControl(rtol=1e-8, atol=1e-10)}),
        ({"max_steps": 5}, {"control": StepControl(max_steps=5)}),
        ({"diagnostics": ("energy",)}, {"save_at": SaveAt(diagnostics=("energy",))}),
        (
            {"extra_diagnostics": {"z": lambda mu: mu.points[..., 2].mean(-1)}},
            {"save_at": SaveAt(fn={"z": lambda mu: mu.points[..., 2].mean(-1)})},
        ),
        ({"cluster_threshold": 0.5}, {"save_at": SaveAt(cluster_threshold=0.5)}),
    ],
)
def test_deprecated_spellings_warn_and_run_as_the_new_ones(old, new):
    x0 = sphere.uniform(12, 3, seed=0)
    kw = {} if "rtol" in old else {"dt": 0.1, "method": "rk4"}
    with pytest.warns(DeprecationWarning, match=next(iter(old)) + "= is deprecated; use"):
        a = wflow.simulate(SA(4.0), x0, 1.0, throw=False, **kw, **old)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        b = wflow.simulate(SA(4.0), x0, 1.0, throw=False, **kw, **new)
    assert a.status == b.status and a.message == b.message
    np.testing.assert_array_equal(a.times, b.times)
    for name in b.data:
        np.testing.assert_array_equal(a[name], b[name])


def test_deprecated_writer_keep_and_callback_still_work(tmp_path):
    """writer=, keep=False and callback= as before: the store has every save, the result the last one, the
    callback saw each save's measure."""
    x0 = sphere.uniform(12, 3, seed=0)
    seen = []
    with pytest.warns(DeprecationWarning) as record:
        r = wflow.simulate(
            SA(4.0),
            x0,
            1.0,
            dt=0.1,
            writer=wflow.io.ZarrRecorder(tmp_path / "r.zarr"),
            keep=False,
            callback=lambda t, mu: seen.append((t, mu.points.shape)),
        )
    assert {str(w.message).split("=")[0].split()[-1] for w in record} == {
        "writer",
        "keep",
        "callback",
    }
    assert len(r.times) == 1 and len(wflow.load(tmp_path / "r.zarr").times) == 11
    assert len(seen) == 11 and seen[-1] == (1.0, (12, 3))
    with pytest.warns(
        DeprecationWarning, match="diagnostics="
    ):  # beside a SaveAt: it replaces its own
        r = wflow.simulate(SA(4.0), x0, 1.0, save_at=SaveAt([0, 1]), diagnostics=("energy",))
    assert sorted(r.diagnostics) == ["energy"]
    with pytest.raises(TypeError, match="unexpected keyword argument 'save_every'"):
        wflow.simulate(SA(4.0), x0, 1.0, save_every=2)


def test_a_plain_function_in_trackers_sees_the_measure_and_may_stop_the_run():
    x0 = sphere.uniform(12, 3, seed=0)
    r = wflow.simulate(
        SA(4.0), x0, 1.0, dt=0.1, trackers=[lambda t, mu: mu.points.shape == (12, 3) and t >= 0.5]
    )
    assert r.status == 1 and r.times[-1] == pytest.approx(0.5)


def test_step_control_refuses_what_it_cannot_honour():
    with pytest.raises(ValueError, match="rtol"):
        StepControl(rtol=0.0)
    with pytest.raises(ValueError, match="atol"):
        StepControl(atol=1e-300)
    with pytest.raises(TypeError, match="max_steps"):
        StepControl(max_steps=2.5)
    with pytest.raises(TypeError, match="control must be a wflow.StepControl"):
        wflow.simulate(SA(4.0), sphere.uniform(4, 3, seed=0), 1.0, control={"rtol": 1e-3})
    with pytest.raises(ValueError, match="rtol/atol apply to the adaptive method"):
        wflow.simulate(
            SA(4.0), sphere.uniform(4, 3, seed=0), 1.0, dt=0.1, control=StepControl(1e-3)
        )


def test_span_points_form_only_the_saves_asked_for_once_each():
    """In span coordinates the points are formed on demand: an index forms its saves once (the same array
    again on a second access), and every kind of index gives what the whole array gives."""
    x0 = sphere.uniform(5, 20, seed=2, batch=(3,))
    r = wflow.simulate(SA(3.0), x0, 1.0, dt=0.1)
    pts = r.points
    assert type(pts).__name__ == "SavedPoints" and "formed=0" in repr(pts)
    last = pts[-1]
    assert pts[-1] is last and "formed=1" in repr(pts)
    assert r.final.points is last
    ref = np.matmul(r["span"], r["span_basis"])
    for key in (-1, 3, slice(2, 9, 3), [0, 10], (4, 1), (slice(None), 0, 2), (-2, Ellipsis, 1)):
        np.testing.assert_array_equal(pts[key], ref[key])
    with pytest.raises(IndexError):
        pts[11]
    np.testing.assert_array_equal(np.asarray(pts), ref)
    assert pts.shape == ref.shape and pts.max() == ref.max()
    ds = r.to_dataset()
    np.testing.assert_array_equal(ds["points"].isel(time=-1).values, ref[-1])


def test_saves_of_a_fused_run_read_the_next_step_and_resume_bit_for_bit(tmp_path):
    """The fused Euler solver returns each save's diagnostics with the step that ends there; they equal a
    plain Euler run's to rounding, and a run resumed from its store repeats the uninterrupted one."""
    x0 = sphere.uniform(16, 5, seed=3, batch=(8,))
    spec = SaveAt(np.linspace(0, 2, 5), diagnostics=("pair_fraction", "energy", "n_clusters"))
    kw = dict(method="euler", dt=0.1, save_at=spec)
    fused = wflow.simulate(SA(5.0), x0, 2.0, **kw)
    plain = wflow.simulate(SA(5.0), x0, 2.0, backend="numpy", **kw)
    assert (fused.solver, plain.solver) == ("fused-euler", "euler")
    np.testing.assert_allclose(fused.points, plain.points, rtol=0, atol=1e-13)
    np.testing.assert_allclose(
        fused.diagnostics["energy"], plain.diagnostics["energy"], rtol=1e-13, atol=0
    )
    np.testing.assert_array_equal(fused.diagnostics["n_clusters"], plain.diagnostics["n_clusters"])
    np.testing.assert_array_equal(
        fused.diagnostics["pair_fraction"], plain.diagnostics["pair_fraction"]
    )
    path = tmp_path / "f.zarr"
    stop = wflow.simulate(
        SA(5.0),
        x0,
        2.0,
        trackers=[wflow.io.ZarrRecorder(path), lambda t, mu: t >= 1.0],
        **kw,
    )
    assert stop.status == 1
    again = wflow.resume(path)
    assert again.solver == "fused-euler"
    np.testing.assert_array_equal(again.times, fused.times)
    np.testing.assert_array_equal(again.points, fused.points)
    for name, values in fused.diagnostics.items():
        np.testing.assert_array_equal(again.diagnostics[name], values)


def test_config_keys_of_earlier_releases_are_renamed_with_a_warning(tmp_path):
    """run.n_saves, run.rtol, run.atol and run.cluster_threshold became save.n, control.rtol, control.atol and
    save.cluster_threshold (the grouping of SaveAt and StepControl): in a TOML file, in --set and in a
    sweep's grid the old names still work, each with a DeprecationWarning naming the new one."""
    from wflow.config import apply_overrides, default_config, load_config
    from wflow.sweep.grid import base_config

    toml = tmp_path / "old.toml"
    toml.write_text("[run]\nn_saves = 5\nrtol = 1e-7\n")
    with pytest.warns(DeprecationWarning, match="run.n_saves is deprecated; use save.n"):
        cfg = load_config(toml)
    assert (cfg["save.n"], cfg["control.rtol"]) == (5, 1e-7)
    assert "run.n_saves" not in cfg and "run.rtol" not in cfg
    with pytest.warns(DeprecationWarning, match="use save.cluster_threshold"):
        cfg = apply_overrides(default_config(), ["run.cluster_threshold=0.2", "run.atol=1e-11"])
    assert (cfg["save.cluster_threshold"], cfg["control.atol"]) == (0.2, 1e-11)
    with pytest.warns(DeprecationWarning, match="use control.atol"):
        assert base_config({"run.atol": 1e-8})["control.atol"] == 1e-8
    with pytest.raises(ValueError, match="unknown config key 'run.nsaves'"):
        apply_overrides(default_config(), ["run.nsaves=3"])


def test_cli_says_a_deprecated_key_in_one_line(tmp_path, capsys):
    from wflow.cli import main

    code = main(
        [
            "run",
            "--set",
            "init.n=8",
            "--set",
            "run.t_end=0.2",
            "--set",
            "run.n_saves=2",
            "--set",
            "output.figure=false",
            "--out",
            str(tmp_path / "r"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 0
    assert "wflow: warning: config key run.n_saves is deprecated; use save.n\n" in err
    assert len(wflow.load(tmp_path / "r" / "trajectory.zarr").times) == 2


def test_results_are_selected_by_saved_time():
    """save_index finds a saved time up to rounding (0.1 * 3 is 0.30000000000000004) and refuses any other
    time, naming its nearest saves; a density result selects by time with density(t=...)."""
    x0 = sphere.uniform(6, 3, seed=1)
    traj = wflow.simulate(SA(2.0), x0, 0.6, dt=0.1, save_at=[0.0, 0.1 * 3, 0.6])
    assert traj.save_index(0.3) == 1 and traj.save_index(0.6) == 2
    with pytest.raises(ValueError, match=r"t=0.45 is not a saved time .* nearest are 0.3 and 0.6"):
        traj.save_index(0.45)
    with pytest.raises(TypeError, match="t must be a real number"):
        traj.save_index("0.3")
    mesh = wflow.mesh.CircleMesh(32)
    rho = wflow.density.Density.from_function(mesh, lambda x: 1 + 0.5 * x[:, 0])
    sol = wflow.solve_density(SA(1.0), rho, 0.5, save_at=[0.25, 0.5])
    np.testing.assert_array_equal(sol.density(t=0.25).values, sol.values[1])
    with pytest.raises(ValueError, match="nearest are 0.25 and 0.5"):
        sol.density(t=0.3)
