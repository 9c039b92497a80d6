"""Results that survive: a process killed at any file write leaves a store that resumes to the
uninterrupted run; damaged stores are errors naming the store, the variable and the snapshot;
one writer per store; bad input refused before anything is written."""

import contextlib
import json
import shutil

import numpy as np
import pytest
import zarr

import wflow
from wflow import SA, USA, CircleMesh, Density, io, sphere
from wflow.cli import main
from wflow.errors import StoreBusyError, WflowError
from wflow.io import recorder

BK = "numpy"


class Killed(BaseException):
    """The process dies here (a BaseException: nothing catches it on the way out)."""


@contextlib.contextmanager
def kill_at(k: int | None):
    """Count every file write of the storage layer (Zarr chunks and metadata, the commit record) and die
    at the k-th (1-based); ``k=None`` only counts.  Yields the counter."""
    counter = {"n": 0, "dead": False}
    orig_set = zarr.storage.LocalStore.set
    orig_commit = recorder._write_commit

    def tick():
        if counter[
            "dead"
        ]:  # a dead process writes nothing more (Zarr may have writes in flight on its IO thread)
            raise Killed
        counter["n"] += 1
        if k is not None and counter["n"] == k:
            counter["dead"] = True
            raise Killed

    async def set_(self, key, value):
        tick()
        return await orig_set(self, key, value)

    def commit(path, length, *chain):
        tick()
        return orig_commit(path, length, *chain)

    zarr.storage.LocalStore.set = set_
    recorder._write_commit = commit
    try:
        yield counter
    finally:
        if counter["dead"]:
            import time

            time.sleep(
                0.2
            )  # let writes already in flight on Zarr's IO thread end before the next run
        zarr.storage.LocalStore.set = orig_set
        recorder._write_commit = orig_commit


def _kinds():
    x0 = sphere.uniform(10, 3, np.random.default_rng(3))
    m = CircleMesh(32)
    rho0 = Density.from_function(m, lambda x: 1 + 0.6 * x[:, 0] + 0.3 * x[:, 1] ** 2)
    return {
        "particles": lambda tr: wflow.simulate(
            SA(3.0),
            x0,
            0.6,
            save_at=np.linspace(0, 0.6, 5),
            method="dopri5",
            rtol=1e-8,
            backend=BK,
            trackers=tr,
        ),
        "noise": lambda tr: wflow.simulate(
            SA(3.0),
            x0,
            0.6,
            save_at=np.linspace(0, 0.6, 5),
            kappa=4.0,
            dt=0.02,
            seed=1,
            backend=BK,
            trackers=tr,
        ),
        "lagrangian": lambda tr: wflow.solve_lagrangian(
            SA(2.0),
            lambda x: 1 + 0.3 * x[:, 0],
            0.6,
            nodes=16,
            save_at=np.linspace(0, 0.6, 5),
            backend=BK,
            trackers=tr,
        ),
        "density": lambda tr: wflow.solve_density(
            USA(2.0), rho0, 0.6, save_at=np.linspace(0, 0.6, 5), backend=BK, trackers=tr
        ),
        "jko": lambda tr: wflow.solvers.jko.jko(
            USA(2.0), rho0, 0.15, 4, kappa=4.0, backend=BK, trackers=tr
        ),
    }


@pytest.mark.parametrize("kind", ["particles", "noise", "lagrangian", "density", "jko"])
def test_a_kill_at_every_write_of_a_snapshot_resumes_to_the_uninterrupted_run(kind, tmp_path):
    """For each file write of the third snapshot's append (every chunk, then the commit record):
    die there, resume, and get the uninterrupted run bit for bit, step statistics included."""
    run = _kinds()[kind]
    full = run([])
    # how many writes the first two snapshots (store creation included) and the third take
    with kill_at(None) as c:
        rec = io.ZarrRecorder(tmp_path / "count.zarr")
        stops = []

        class Mark(wflow.solvers.base.Tracker):
            def save(self, snap):
                stops.append(c["n"])

        run([rec, Mark()])
    before, after = stops[1], stops[2]
    assert after - before >= 8  # every variable of the snapshot, then the commit
    for k in range(before + 1, after + 1):
        path = tmp_path / f"k{k}.zarr"
        with pytest.raises(Killed), kill_at(k):
            run([io.ZarrRecorder(path)])
        assert io.committed_length(path) == 2, k  # the commit record is the snapshot's last write
        back = wflow.resume(path)
        for res in (back, wflow.load(path)):
            np.testing.assert_array_equal(res.times, full.times)
            for name, (_, v) in full.data.items():
                np.testing.assert_array_equal(res[name], v, err_msg=f"{name} k={k}")
            for name in ("steps", "rejected", "evaluations", "dt_next"):
                np.testing.assert_array_equal(res.stats[name], full.stats[name], err_msg=name)


def test_a_kill_while_the_store_is_created_restarts_afresh(tmp_path):
    """`wflow run --resume` after a death at any write before the first commit starts the run afresh and
    ends equal to the uninterrupted run."""
    args = [
        "run",
        "--set",
        "init.n=12",
        "--set",
        "run.t_end=0.5",
        "--set",
        "save.n=3",
        "--set",
        "run.backend=numpy",
        "--set",
        "output.figure=false",
        "--no-progress",
    ]
    assert main([*args, "--out", str(tmp_path / "full")]) == 0
    full = wflow.load(tmp_path / "full" / "trajectory.zarr")
    with kill_at(None) as c:
        assert main([*args, "--out", str(tmp_path / "count")]) == 0
    first_commit = None
    for k in range(
        1, c["n"] + 1
    ):  # find the first commit: the first k after which one snapshot is kept
        out = tmp_path / f"k{k}"
        with pytest.raises(Killed), kill_at(k):
            main([*args, "--out", str(out)])
        if io.committed_length(out / "trajectory.zarr"):
            first_commit = k
            break
        assert main(["run", "--resume", "--out", str(out), "--no-progress"]) == 0
        np.testing.assert_array_equal(wflow.load(out / "trajectory.zarr").points, full.points)
    assert first_commit is not None and first_commit > 10


def _store(tmp_path):
    x0 = sphere.uniform(30, 3, np.random.default_rng(0))
    path = tmp_path / "t.zarr"
    wflow.simulate(SA(2.0), x0, 1.0, dt=0.1, backend=BK, writer=io.ZarrRecorder(path))
    return path


def test_a_missing_chunk_is_an_error_naming_store_variable_and_snapshot(tmp_path):
    path = _store(tmp_path)
    (path / "points" / "c" / "4" / "0" / "0").unlink()
    with pytest.raises(WflowError, match=r"t.zarr: variable 'points' has no data for snapshot 4"):
        wflow.load(path)
    # --resume of a finished but damaged store is refused too (never a silent success)
    with pytest.raises(WflowError, match="snapshot 4"):
        wflow.resume(path)


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_chunk_fails_its_checksum_with_the_path(damage, tmp_path):
    path = _store(tmp_path)
    chunk = path / "points" / "c" / "3" / "0" / "0"
    data = bytearray(chunk.read_bytes())
    if damage == "flip":
        for i in range(8):
            data[len(data) // 2 + i] ^= 0xFF
    else:
        data = data[: len(data) // 2]
    chunk.write_bytes(bytes(data))
    with pytest.raises(WflowError, match=r"t.zarr: variable 'points' snapshot 3: .*damaged"):
        wflow.load(path)


def test_uncommitted_snapshots_are_invisible(tmp_path):
    """Chunks beyond the commit record (a dying writer's tail) are not read."""
    path = _store(tmp_path)
    (path / io.COMMIT).write_text(json.dumps({"length": 4}))
    res = wflow.load(path)
    assert len(res.times) == 4 and np.all(np.isfinite(res.points))


def _committed_files(path):
    return {f.relative_to(path): f.read_bytes() for f in sorted(path.rglob("*")) if f.is_file()}


@pytest.mark.parametrize("length", [-1, 12, "x"])
def test_a_commit_record_outside_the_stored_snapshots_is_refused(length, tmp_path):
    """A length below 0 or beyond the snapshots on disk (11) is damage, never a shorter or longer load,
    and --resume does not rewrite a committed snapshot."""
    path = _store(tmp_path)
    (path / io.COMMIT).write_text(json.dumps({"length": length}))
    before = _committed_files(path)
    with pytest.raises(WflowError, match=r"t.zarr: (the commit record|unreadable commit record)"):
        wflow.load(path)
    with pytest.raises(WflowError, match=r"t.zarr"):
        wflow.resume(path)
    assert _committed_files(path) == before  # nothing rewritten


def test_a_lost_commit_record_is_damage_not_an_empty_store(tmp_path):
    path = _store(tmp_path)
    (path / io.COMMIT).unlink()
    with pytest.raises(WflowError, match=r"record wflow_commit.json is missing but 11 snapshot"):
        wflow.load(path)
    with pytest.raises(WflowError, match="missing"):
        wflow.resume(path)
    assert len(list((path / "points" / "c").iterdir())) == 11  # nothing discarded
    report = io.repair(path)
    assert report["kept"] == 11 and report["claimed"] is None
    np.testing.assert_array_equal(
        wflow.load(path).points, wflow.load(_store(tmp_path / "b")).points
    )


def test_a_chunk_that_is_a_directory_is_an_error(tmp_path):
    path = _store(tmp_path)
    chunk = path / "points" / "c" / "5" / "0" / "0"
    chunk.unlink()
    chunk.mkdir()
    with pytest.raises(
        WflowError, match=r"variable 'points' snapshot 5: its chunk .* is not a file"
    ):
        wflow.load(path)


@pytest.mark.parametrize("name", ["points", "energy", "time"])
def test_a_chunk_copied_into_another_place_is_detected(name, tmp_path):
    """Its CRC32C is valid (the bytes are a sound chunk), but not of this snapshot: the digest keyed by
    variable and snapshot tells."""
    path = _store(tmp_path)
    tail = ["0"] * (name == "points") * 2
    src, dst = (path.joinpath(name, "c", str(i), *tail) for i in (2, 6))
    shutil.copyfile(src, dst)
    with pytest.raises(
        WflowError, match=rf"variable '{name}' snapshot 6: its chunk is not the one"
    ):
        wflow.load(path)
    res = pytest.warns(UserWarning, match="recovered 6 snapshots")
    with res:
        back = wflow.load(path, recover=True)
    assert len(back.times) == 6 and "snapshot 6" in back.message


def test_a_flipped_byte_in_a_scalar_names_variable_and_snapshot(tmp_path):
    path = _store(tmp_path)
    chunk = path / "energy" / "c" / "7"
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x01
    chunk.write_bytes(bytes(data))
    with pytest.raises(WflowError, match=r"variable 'energy' snapshot 7"):
        wflow.load(path)


def test_repair_keeps_the_sound_snapshots_and_the_run_resumes_bit_for_bit(tmp_path):
    x0 = sphere.uniform(30, 3, np.random.default_rng(0))
    full = wflow.simulate(SA(2.0), x0, 1.0, dt=0.1, backend=BK)
    path = _store(tmp_path)
    (path / "points" / "c" / "4" / "0" / "0").write_bytes(b"not a chunk")
    report = io.repair(path)
    assert (report["kept"], report["claimed"], report["on_disk"]) == (4, 11, 11)
    assert "variable 'points' snapshot 4" in report["reason"]
    assert io.committed_length(path) == 4
    back = wflow.resume(path)
    np.testing.assert_array_equal(back.times, full.times)
    np.testing.assert_array_equal(back.points, full.points)
    np.testing.assert_array_equal(wflow.load(path).points, full.points)


def test_wflow_repair_makes_a_run_folder_resumable(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["--set", "init.n=12", "--set", "run.t_end=0.5", "--set", "save.n=6"]
    assert (
        main(["run", *args, "--set", "output.figure=false", "--out", str(out), "--no-progress"])
        == 0
    )
    full = wflow.load(out / "trajectory.zarr")
    (out / "trajectory.zarr" / io.COMMIT).write_text(json.dumps({"length": 3}))
    (out / "trajectory.zarr" / "points" / "c" / "2" / "0" / "0").write_bytes(b"damaged")
    capsys.readouterr()
    assert main(["run", "--resume", "--out", str(out), "--no-progress"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "wflow repair" in err and "snapshot 2" in err
    assert main(["repair", str(out)]) == 0
    assert "2 snapshots kept" in capsys.readouterr().out
    assert main(["run", "--resume", "--out", str(out), "--no-progress"]) == 0
    np.testing.assert_array_equal(wflow.load(out / "trajectory.zarr").points, full.points)


def test_one_writer_per_store_and_per_output_folder(tmp_path, capsys):
    path = tmp_path / "t.zarr"
    with io.FolderLock(path.with_name(path.name + ".lock")):
        with pytest.raises(StoreBusyError, match=r"t.zarr is in use by process \d+"):
            wflow.simulate(
                SA(2.0), sphere.uniform(5, 3, seed=0), 0.2, dt=0.1, writer=io.ZarrRecorder(path)
            )
    assert not path.exists()
    out = tmp_path / "run"
    with io.FolderLock(out / ".wflow.lock"):
        rc = main(["run", "--set", "init.n=10", "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and f"output folder {out} is in use by process" in err
    # nothing written: the holder's lock file, the folder's only file, went with its release
    assert sorted(p.name for p in out.iterdir()) == []
    # the lock is released when the run ends, however it ends: the same process can write again
    wflow.simulate(SA(2.0), sphere.uniform(5, 3, seed=0), 0.2, dt=0.1, writer=io.ZarrRecorder(path))
    assert len(wflow.load(path).times) == 3


def test_resume_refuses_an_edited_config(tmp_path, capsys):
    out = tmp_path / "run"
    args = [
        "--set",
        "init.n=12",
        "--set",
        "run.t_end=0.5",
        "--set",
        "save.n=3",
        "--set",
        "output.figure=false",
        "--no-progress",
        "--out",
        str(out),
    ]
    assert main(["run", *args]) == 0
    toml = (out / "config.toml").read_text()
    (out / "config.toml").write_text(toml.replace("beta = 9.0", "beta = 4.0"))
    capsys.readouterr()
    assert main(["run", "--resume", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "model.beta (stored 9.0, config.toml 4.0)" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "sets,match",
    [
        (["init.n=100000000000"], "need about"),
        (["save.n=1000000000000"], "need about"),
        (["init.kappa=1e308"], "init.kappa"),
        (["control.rtol=1e-300"], "control.rtol"),
        (["model.type=USA", "model.beta=700"], "model.beta"),
        (["run.backend=foo"], "run.backend"),
        (["run.coordinates=polar"], "run.coordinates"),
        (["problem=eulerian", "run.coordinates=span"], "run.coordinates"),
        (["problem=eulerian", "run.method=euler-average"], "run.method"),
    ],
)
def test_bad_input_leaves_nothing_behind(sets, match, tmp_path, capsys):
    out = tmp_path / "o"
    argv = ["run", "--out", str(out), "--no-progress"]
    for s in sets:
        argv += ["--set", s]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1 and err.startswith("wflow: error:")
    assert not out.exists()


def test_overwrite_validates_before_deleting(tmp_path, capsys):
    out = tmp_path / "run"
    base = [
        "run",
        "--set",
        "init.n=12",
        "--set",
        "run.t_end=0.3",
        "--set",
        "save.n=2",
        "--set",
        "output.figure=false",
        "--no-progress",
        "--out",
        str(out),
    ]
    assert main(base) == 0
    before = wflow.load(out / "trajectory.zarr").points
    assert main([*base, "--overwrite", "--set", "run.backend=foo"]) == 2
    np.testing.assert_array_equal(wflow.load(out / "trajectory.zarr").points, before)
    # a folder holding another kind of result is refused without --overwrite
    capsys.readouterr()
    assert (
        main(
            [*base, "--set", "problem=eulerian", "--set", "init.d=2", "--set", "mesh.resolution=32"]
        )
        == 2
    )
    assert "trajectory.zarr exists" in capsys.readouterr().err


def test_usa_at_large_beta_says_why(tmp_path):
    x0 = sphere.uniform(8, 3, seed=0)
    for method in ("rk4", "dopri5"):
        with pytest.raises(WflowError, match="rescaled kernel"):
            wflow.simulate(USA(700.0), x0, 1.0, method=method)


def test_large_beta_energy_stays_finite_in_log_scale():
    """SA at beta = 1e3 and 1e4: the energy overflows float64 (NaN, said so) but log_energy is finite
    and non-decreasing."""
    x0 = sphere.uniform(40, 3, np.random.default_rng(0))
    for beta in (1e3, 1e4):
        traj = wflow.simulate(SA(beta), x0, 0.5, dt=0.05, backend=BK)
        le = traj.diagnostics["log_energy"]
        assert np.all(np.isfinite(le)) and np.all(np.diff(le) >= -1e-12 * np.abs(le).max())
        assert np.all(np.isnan(traj.energy))
        np.testing.assert_allclose(
            le[0],
            beta * 1.0
            - np.log(2 * beta)
            + np.log(np.mean(np.exp(beta * (x0 @ x0.T - 1)).sum(axis=1) / 40)),
            rtol=1e-12,
        )


def test_step_log_drops_a_torn_last_row(tmp_path):
    from wflow.solvers.trackers import StepLog

    rho0 = Density.from_function(CircleMesh(32), lambda x: 1 + 0.5 * x[:, 0])
    path = tmp_path / "steps.csv"
    run = lambda tr: wflow.solvers.jko.jko(USA(2.0), rho0, 0.15, 4, backend=BK, trackers=tr)  # noqa: E731
    run([io.ZarrRecorder(tmp_path / "j.zarr"), StepLog(path)])
    full = path.read_text().splitlines()
    # a store cut back to its third snapshot and a log whose last row was torn by the kill
    (tmp_path / "j.zarr" / io.COMMIT).write_text(json.dumps({"length": 3}))
    path.write_text("\n".join(full[:4]) + "\n" + full[4][: len(full[4]) // 2])
    wflow.resume(tmp_path / "j.zarr", trackers=[StepLog(path, append=True)])
    untimed = lambda rows: [r.rsplit(",", 2)[0] for r in rows]  # noqa: E731 - the last two columns are timings
    assert untimed(path.read_text().splitlines()) == untimed(full) and len(full) == 5


def test_save_refuses_to_overwrite_and_copies_are_independent(tmp_path):
    path = _store(tmp_path)
    res = wflow.load(path)
    with pytest.raises(FileExistsError):
        wflow.save(res, path)
    shutil.copytree(path, tmp_path / "copy.zarr")
    np.testing.assert_array_equal(wflow.load(tmp_path / "copy.zarr").points, res.points)


def test_ctrl_c_prints_one_line_and_the_run_resumes(tmp_path):
    """SIGINT in the middle of a run: exit 130, one line on stderr (no asyncio noise), and --resume finishes."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "run"
    # rk4 at a fixed small step: slow enough (1000 steps of 300 tokens, seconds on an idle machine) that the
    # signal lands mid-run however fast the machine is; the test resumes the same run afterwards
    argv = [
        sys.executable,
        "-m",
        "wflow.cli",
        "run",
        "--set",
        "init.n=300",
        "--set",
        "run.t_end=20",
        "--set",
        "save.n=200",
        "--set",
        "run.method=rk4",
        "--set",
        "run.dt=0.02",
        "--set",
        "run.backend=numpy",
        "--set",
        "output.figure=false",
        "--no-progress",
        "--out",
        str(out),
    ]
    # SIGINT back to its default in the child: a test run started in the background by a non-interactive shell
    # inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler (the run would finish)
    p = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 120
    while (
        io.committed_length(out / "trajectory.zarr") < 3
        and time.monotonic() < deadline
        and p.poll() is None
    ):
        time.sleep(0.05)
    running, seen = p.poll() is None, io.committed_length(out / "trajectory.zarr")
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert running, (
        f"the run ended before the signal (exit {p.returncode}, {seen} snapshots committed): {err}"
    )
    assert p.returncode == 130, (seen, err)
    # a first run from a cold numba cache also names what it compiles (one line each, before)
    lines = [line for line in err.splitlines() if not line.startswith("wflow: compiling ")]
    assert lines == [
        "wflow: interrupted; committed snapshots are kept (continue with wflow run --resume)"
    ], err
    kept = io.committed_length(out / "trajectory.zarr")
    assert 3 <= kept < 200
    assert main(["run", "--resume", "--out", str(out), "--no-progress"]) == 0
    assert len(wflow.load(out / "trajectory.zarr").times) == 200


def test_kernel_sums_bad_input_and_huge_beta():
    x = sphere.uniform(10, 3, seed=0)
    w = np.full(10, 0.1)
    with pytest.raises(ValueError, match="at least one point"):
        wflow.kernel_sums(x[:0], x, w, 1.0)
    with pytest.raises(ValueError, match="at least one point"):
        wflow.kernel_sums(x, x[:0], w[:0], 1.0)
    with pytest.raises(TypeError, match="beta must be a real number, got '2'"):
        wflow.kernel_sums(x, x, w, "2")
    # beta = 1e10 with backend auto: the spectral series is not attempted (it allocated 74.5 GiB), the direct
    # sums take it, and SA runs with a finite log-energy
    for beta in (1e10, 1e20):
        r = wflow.simulate(SA(beta), x, 0.1, dt=0.05)
        assert (
            r.status == 0
            and np.all(np.isfinite(r.points))
            and np.all(np.isfinite(r.diagnostics["log_energy"]))
        )


def test_tracers_must_be_finite_points_on_the_sphere():
    x0 = sphere.uniform(6, 3, seed=0)
    for bad in (np.full((2, 3), np.nan), 2.0 * sphere.uniform(2, 3, seed=1)):
        with pytest.raises(ValueError, match="tracers must be finite points on the unit sphere"):
            wflow.simulate(SA(1.0), x0, 0.1, dt=0.05, tracers=bad)


def test_stores_open_with_xarray_without_warnings_and_describe_their_variables(tmp_path):
    import warnings

    import xarray as xr

    path = _store(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # consolidated metadata: no warning from xarray or zarr
        ds = xr.open_zarr(path)
    assert ds["points"].attrs["long_name"] == "token positions on the unit sphere"
    assert ds["time"].attrs["standard_name"] == "time" and ds.attrs["kind"] == "particles"
    assert wflow.load(path).to_dataset()["energy"].attrs["long_name"] == (
        "interaction energy E_beta the flow ascends (non-decreasing along the flow)"
    )
    # every dimension has a coordinate, the configuration is also attributes, and reading skips the indices
    np.testing.assert_array_equal(ds["particle"].values, np.arange(ds.sizes["particle"]))
    assert set(ds.coords) >= {"time", "particle", "coord"}
    cfg = json.loads(ds.attrs["config"])
    assert (
        ds.attrs["config.model.type"] == cfg["model"]["type"]
        and ds.attrs["config.t_end"] == cfg["t_end"]
    )
    np.testing.assert_array_equal(
        ds.sel(particle=2)["points"].values, wflow.load(path).points[:, 2]
    )
    assert "particle" not in wflow.load(path).static and set(
        wflow.load(path).to_dataset().coords
    ) >= {"particle"}


def test_density_stores_hold_the_mesh_as_arrays(tmp_path):
    """A density store can be re-plotted without wflow: centres, areas, and each edge's two cells."""
    import xarray as xr

    m = wflow.SphereMesh(2)
    rho = wflow.Density.from_function(m, lambda x: 1 + 0.5 * x[:, 2])
    res = wflow.solve_density(SA(2.0), rho, 0.1, save_at=[0, 0.1])
    ds = xr.open_zarr(wflow.save(res, tmp_path / "d.zarr"))
    pairs = ds["cell_pairs"].values
    assert pairs.shape == (m.n_edges, 2) and np.all(pairs[:, 0] != pairs[:, 1])
    # every cell's neighbours from the pairs are the mesh's, and the masses sum to one with the stored areas
    nb = {i: set() for i in range(m.n_cells)}
    for a, b in pairs:
        nb[a].add(b), nb[b].add(a)
    assert all(nb[i] == set(m.cell_neighbors[i][m.cell_edges[i] >= 0]) for i in range(m.n_cells))
    assert abs(float((ds["density"][-1] * ds["areas"]).sum()) - 1) < 1e-12


_DENSITY_RUN = [
    "run",
    "--set",
    "problem=eulerian",
    "--set",
    "init.d=2",
    "--set",
    "mesh.resolution=256",
    "--set",
    "run.t_end=30",
    "--set",
    "save.n=61",
    "--set",
    "run.backend=numpy",
    "--set",
    "output.figure=false",
    "--no-progress",
]


def _signal_trials(tmp_path, trials: int, seed: int) -> int:
    """Finite-volume runs killed by SIGINT, SIGTERM or SIGKILL at random moments, resumed, against the
    uninterrupted run: equal bit for bit (values, masses, times, step statistics).  Returns how many of
    the trials the signal interrupted."""
    import signal
    import subprocess
    import sys
    import time

    assert main([*_DENSITY_RUN, "--out", str(tmp_path / "full")]) == 0
    full = wflow.load(tmp_path / "full" / "density.zarr")
    rng = np.random.default_rng(seed)
    interrupted = 0
    for k in range(trials):
        out = tmp_path / f"t{k}"
        sig = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)[k % 3]
        p = subprocess.Popen(
            [sys.executable, "-m", "wflow.cli", *_DENSITY_RUN, "--out", str(out)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        time.sleep(float(rng.uniform(1.0, 5.0)))
        p.send_signal(sig)
        _, err = p.communicate(timeout=300)
        assert "Traceback" not in err, err[-2000:]
        if p.returncode == 0:
            continue  # finished before the signal
        interrupted += 1
        store = out / "density.zarr"
        if (out / "config.toml").exists():
            assert main(["run", "--resume", "--out", str(out), "--no-progress"]) == 0, k
            back = wflow.load(store)
            np.testing.assert_array_equal(back.times, full.times)
            for name in ("density", "masses", "mass"):
                np.testing.assert_array_equal(back[name], full[name], err_msg=f"{name}, trial {k}")
            for name in ("steps", "rejected", "evaluations", "dt_next"):
                np.testing.assert_array_equal(back.stats[name], full.stats[name], err_msg=name)
    return interrupted


def test_density_runs_resume_bit_for_bit_after_a_signal(tmp_path):
    """Three trials, one per signal (the finite-volume resume was 4.3e-13 off: it restarted from
    values * areas and lost the step controller's state)."""
    assert _signal_trials(tmp_path, 3, seed=1) >= 2


@pytest.mark.slow
def test_density_runs_resume_bit_for_bit_after_twenty_signals(tmp_path):
    assert _signal_trials(tmp_path, 20, seed=2) >= 15


def test_a_death_while_a_snapshots_digests_are_written_loses_nothing_committed(
    tmp_path, monkeypatch
):
    """The digests file was rewritten whole for every snapshot: a process killed between emptying it and
    writing it back lost the digests of every committed snapshot ('0 lines for 35 committed snapshots').
    Now the committed lines are never rewritten: a death there resumes to the uninterrupted run."""
    import os

    x0 = sphere.uniform(30, 3, np.random.default_rng(0))
    full = wflow.simulate(SA(2.0), x0, 1.0, dt=0.1, backend=BK)
    path = tmp_path / "t.zarr"
    real, calls = os.ftruncate, {"n": 0}

    def die_after_the_fourth(fd, length):
        real(fd, length)
        calls["n"] += 1
        if calls["n"] == 5:  # the fifth snapshot's line: the four committed ones must survive
            raise Killed

    monkeypatch.setattr(os, "ftruncate", die_after_the_fourth)
    with pytest.raises(Killed):
        wflow.simulate(SA(2.0), x0, 1.0, dt=0.1, backend=BK, writer=io.ZarrRecorder(path))
    monkeypatch.setattr(os, "ftruncate", real)
    assert io.committed_length(path) == 4
    back = wflow.resume(path)
    np.testing.assert_array_equal(back.points, full.points)
    np.testing.assert_array_equal(wflow.load(path).points, full.points)
