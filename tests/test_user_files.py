"""Nothing of the user's touched, special files refused (issue 51, items 1 and 6).

Every path wflow creates or removes (locks, stores, figures) is created without following symbolic
links and never over a file wflow did not write; an overwrite removes only what the store's own
record says wflow wrote.  A FIFO, socket or device in place of a file wflow reads is refused in one
line, never waited on.  Anything refused: one line naming the path, exit 2, nothing touched.
"""

from __future__ import annotations

import os
import socket
import threading

import numpy as np
import pytest

import wflow
from wflow import io, sphere
from wflow.cli import main

SMALL = ["--set", "init.n=10", "--set", "run.t_end=0.5", "--set", "save.n=3", "--no-progress"]
QUICK = [*SMALL, "--set", "output.figure=false"]
TINY = {
    "init.n": 8,
    "init.d": 3,
    "run.t_end": 1.0,
    "save.n": 3,
    "run.method": "euler",
    "run.dt": 0.1,
    "run.backend": "numpy",
}


def _one_line_error(capsys, code, argv):
    capsys.readouterr()
    assert main(argv) == code
    err = capsys.readouterr().err.strip()
    assert err.startswith("wflow: error:") and "\n" not in err, err
    return err


def _files(folder):
    """Every file and link under ``folder`` with its bytes (a link: where it points)."""
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_symlink():
            out[p.relative_to(folder)] = ("link", os.readlink(p))
        elif p.is_file():
            out[p.relative_to(folder)] = p.read_bytes()
    return out


def _traj():
    return wflow.simulate(wflow.SA(2.0), sphere.uniform(8, 3, seed=0), 0.5, dt=0.1, backend="numpy")


@pytest.fixture
def precious(tmp_path):
    f = tmp_path / "precious.txt"
    f.write_text("my notes")
    return f


@pytest.fixture(scope="module")
def client():
    distributed = pytest.importorskip("distributed")
    c = distributed.Client(
        processes=False, n_workers=1, threads_per_worker=1, dashboard_address=":0"
    )
    yield c
    c.close()


# ------------------------------------------------------------------------------ locks
@pytest.mark.parametrize("dangling", [False, True], ids=["to-a-file", "dangling"])
def test_a_link_at_the_run_folders_lock_is_not_followed(dangling, tmp_path, capsys, precious):
    out = tmp_path / "run"
    out.mkdir()
    target = tmp_path / "absent.txt" if dangling else precious
    (out / ".wflow.lock").symlink_to(target)
    err = _one_line_error(capsys, 2, ["run", *QUICK, "--out", str(out)])
    assert f"{out / '.wflow.lock'}" in err and "symbolic link" in err
    assert precious.read_text() == "my notes" and not (tmp_path / "absent.txt").exists()
    assert [p.name for p in out.iterdir()] == [".wflow.lock"]  # nothing written, the link kept
    assert os.readlink(out / ".wflow.lock") == str(target)


def test_a_link_at_a_stores_lock_is_not_followed_by_save(tmp_path, precious):
    path = tmp_path / "t.zarr"
    (tmp_path / "t.zarr.lock").symlink_to(precious)
    with pytest.raises(ValueError, match=r"t\.zarr\.lock is a symbolic link"):
        wflow.save(_traj(), path)
    assert precious.read_text() == "my notes" and not path.exists()
    assert (tmp_path / "t.zarr.lock").is_symlink()


def test_a_users_file_named_like_a_stores_lock_is_kept(tmp_path, capsys):
    """A regular file ``<store>.lock`` that wflow did not write is neither overwritten nor removed."""
    path = tmp_path / "t.zarr"
    mine = tmp_path / "t.zarr.lock"
    mine.write_text("my lock of my own tool")
    with pytest.raises(ValueError, match=r"t\.zarr\.lock .*not a lock wflow wrote"):
        wflow.save(_traj(), path)
    assert mine.read_text() == "my lock of my own tool" and not path.exists()
    # through the command line: the run folder's store lock, one line, exit 2
    out = tmp_path / "run"
    out.mkdir()
    (out / "trajectory.zarr.lock").write_text("mine")
    err = _one_line_error(capsys, 2, ["run", *QUICK, "--out", str(out)])
    assert str(out / "trajectory.zarr.lock") in err
    assert (out / "trajectory.zarr.lock").read_text() == "mine"
    assert os.listdir(out) == ["trajectory.zarr.lock"]  # nothing written beside it
    # a lock that wflow left behind (its process died) is still taken over and removed at the end
    (out / "trajectory.zarr.lock").write_text("process 999999999")
    assert main(["run", *QUICK, "--out", str(out)]) == 0
    assert not (out / "trajectory.zarr.lock").exists() and not (out / ".wflow.lock").exists()


@pytest.mark.parametrize("kind", ["link", "file"])
def test_a_sweeps_lock_is_neither_followed_nor_taken_from_the_user(
    kind, tmp_path, client, precious
):
    from wflow.sweep import sweep

    out = tmp_path / "s.zarr"
    lock = tmp_path / "s.zarr.lock"
    if kind == "link":
        lock.symlink_to(precious)
    else:
        lock.write_text("my notes")
    with pytest.raises(ValueError, match=r"s\.zarr\.lock"):
        sweep(TINY, {"init.n": [4, 5]}, out=out, scheduler=client, progress=False)
    assert precious.read_text() == "my notes" and lock.exists()
    assert lock.is_symlink() == (kind == "link")
    assert kind == "link" or lock.read_text() == "my notes"


def test_folder_lock_creates_without_following_and_removes_only_its_own(tmp_path):
    path = tmp_path / "x.lock"
    lock = io.FolderLock(path).acquire()
    assert path.read_text() == f"process {os.getpid()}"
    path.unlink()  # someone removes it and puts a file of theirs there: the release leaves it
    path.write_text("theirs")
    lock.release()
    assert path.read_text() == "theirs"


# ------------------------------------------------------------------------------ figures
def test_a_sweep_keeps_the_users_figure_beside_its_store(tmp_path, client, capsys):
    import matplotlib.pyplot as plt

    out = tmp_path / "mine.zarr"
    mine = tmp_path / "mine.png"
    plt.imsave(mine, np.eye(4))  # a real PNG of the user's
    before = mine.read_bytes()
    argv = ["sweep", "--grid", "model.beta=[1,4]", "--no-progress", "--out", str(out)]
    argv += [f"--set={k}={v}" for k, v in TINY.items()]
    argv += ["--scheduler", client.scheduler.address]
    capsys.readouterr()
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert mine.read_bytes() == before
    warning = [line for line in captured.err.splitlines() if str(mine) in line]
    assert len(warning) == 1 and "not written by wflow" in warning[0], captured.err
    assert "figure:" not in captured.out
    # without the user's figure, wflow writes its own, and replaces it when run again
    mine.unlink()
    assert main(argv) == 0
    assert "figure:" in capsys.readouterr().out and mine.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    first = mine.stat().st_mtime_ns
    os.utime(mine, ns=(first - 10**9, first - 10**9))
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "figure:" in captured.out and "not written by wflow" not in captured.err
    assert mine.stat().st_mtime_ns > first - 10**9


def test_a_link_in_place_of_the_sweeps_figure_is_not_followed(tmp_path, precious, capsys):
    import json

    import xarray as xr

    from wflow.cli import sweep_figure

    t, beta = np.linspace(0, 1, 3), [1.0, 4.0]
    ds = xr.Dataset(
        {"pair_fraction": (("beta", "time"), np.tile(t, (2, 1)))},
        coords={"beta": beta, "time": t},
        attrs={"dims": json.dumps({"model.beta": "beta"}), "base_config": json.dumps({})},
    )
    (tmp_path / "s.png").symlink_to(precious)
    capsys.readouterr()
    assert sweep_figure(ds, tmp_path / "s.zarr") is None
    assert str(tmp_path / "s.png") in capsys.readouterr().err
    assert precious.read_text() == "my notes" and (tmp_path / "s.png").is_symlink()
    (tmp_path / "s.png").unlink()
    assert sweep_figure(ds, tmp_path / "s.zarr") == tmp_path / "s.png"
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"


# ------------------------------------------------------------------------------ inside stores
@pytest.mark.parametrize("extra", ["notes.txt", "plots/fig.png", "points/mine.txt"])
def test_run_overwrite_keeps_the_users_files_inside_the_store(extra, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", *QUICK, "--out", str(out)]) == 0
    f = out / "trajectory.zarr" / extra
    f.parent.mkdir(exist_ok=True)
    f.write_text("mine")
    before = _files(out)
    argv = ["run", *QUICK, "--set", "init.n=12", "--overwrite", "--out", str(out)]
    err = _one_line_error(capsys, 2, argv)
    assert (
        str(out / "trajectory.zarr" / extra.split("/")[0]) in err and "wflow did not write" in err
    )
    assert _files(out) == before  # nothing touched
    assert len(wflow.load(out / "trajectory.zarr").times) == 3


def test_run_overwrite_with_another_store_keeps_the_users_files(tmp_path, capsys):
    """A run whose store has another name (density.zarr for trajectory.zarr) refuses up front too."""
    out = tmp_path / "run"
    assert main(["run", *QUICK, "--out", str(out)]) == 0
    (out / "trajectory.zarr" / "notes.txt").write_text("mine")
    before = _files(out)
    argv = ["run", *QUICK, "--set", "problem=zonal", "--set", "mesh.resolution=16", "--overwrite"]
    err = _one_line_error(capsys, 2, [*argv, "--out", str(out)])
    assert str(out / "trajectory.zarr" / "notes.txt") in err
    assert _files(out) == before


def test_save_overwrite_removes_only_what_wflow_wrote(tmp_path):
    traj = _traj()
    path = wflow.save(traj, tmp_path / "t.zarr")
    (path / "plots").mkdir()
    (path / "plots" / "a.png").write_text("mine")
    before = _files(path)
    with pytest.raises(ValueError, match=r"t\.zarr/plots: wflow did not write"):
        wflow.save(traj, path, overwrite=True)
    assert _files(path) == before
    # a link inside the store is not followed: refused, its target kept
    (path / "plots" / "a.png").unlink()
    (path / "plots").rmdir()
    (path / "notes").symlink_to(tmp_path)
    with pytest.raises(ValueError, match=r"t\.zarr/notes is a symbolic link"):
        wflow.save(traj, path, overwrite=True)
    (path / "notes").unlink()
    # what wflow and Zarr write (a commit record's temporary, a chunk Zarr left half-written) goes
    (path / (io.COMMIT + ".tmp")).write_text("{}")
    (path / "points" / "c" / "0" / "0.0123456789abcdef0123456789abcdef.partial").write_bytes(b"x")
    path2 = wflow.save(traj, path, overwrite=True)
    assert sorted(p.name for p in path2.iterdir() if not p.is_dir()) == [
        io.COMMIT,
        io.DIGESTS,
        "zarr.json",
    ]
    np.testing.assert_array_equal(wflow.load(path).points, traj.points)


def test_a_store_that_is_a_link_is_not_replaced(tmp_path):
    traj = _traj()
    real = wflow.save(traj, tmp_path / "real.zarr")
    (tmp_path / "t.zarr").symlink_to(real)
    before = _files(real)
    with pytest.raises(ValueError, match=r"t\.zarr is a symbolic link"):
        wflow.save(traj, tmp_path / "t.zarr", overwrite=True)
    assert _files(real) == before


def test_remove_store_is_the_one_helper(tmp_path):
    path = wflow.save(_traj(), tmp_path / "t.zarr")
    (path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="notes.txt"):
        io.remove_store(path)
    assert (path / "notes.txt").read_text() == "mine" and (path / "zarr.json").is_file()
    (path / "notes.txt").unlink()
    io.remove_store(path)
    assert not path.exists()


# ------------------------------------------------------------------------------ special files
class _Watchdog:
    """Makes FIFOs and frees, after a grace of seconds, a reader blocked on one (as a writer that opens
    and closes it); ``freed`` lists the FIFOs on which a reader had to be freed (it was waited on)."""

    def __init__(self, grace: float = 8.0):
        self.grace, self.freed, self.stop = grace, [], threading.Event()

    def fifo(self, path):
        os.mkfifo(path)
        threading.Thread(target=self._watch, args=(path,), daemon=True).start()
        return path

    def _watch(self, path):
        if self.stop.wait(self.grace):
            return
        while not self.stop.wait(0.1):
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # no reader (ENXIO), or the FIFO is gone
                continue
            os.close(fd)
            self.freed.append(str(path))


@pytest.fixture
def watchdog():
    w = _Watchdog()
    yield w
    w.stop.set()


def _special(kind, path, watchdog, monkeypatch):
    if kind == "fifo":
        return watchdog.fifo(path)
    monkeypatch.chdir(path.parent)  # (a socket's path is limited to about 100 bytes)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path.name)
    s.close()
    return path


@pytest.mark.parametrize("kind", ["fifo", "socket"])
@pytest.mark.parametrize("how", ["load", "repair", "resume"])
def test_a_special_commit_record_is_refused_not_waited_on(
    how, kind, tmp_path, capsys, watchdog, monkeypatch
):
    out = tmp_path / "run"
    assert main(["run", *QUICK, "--out", str(out)]) == 0
    store = out / "trajectory.zarr"
    (store / io.COMMIT).unlink()
    _special(kind, store / io.COMMIT, watchdog, monkeypatch)
    if how == "load":
        with pytest.raises(ValueError, match=r"wflow_commit\.json is a (FIFO|socket)"):
            wflow.load(store)
    else:
        argv = ["repair", str(out)] if how == "repair" else ["run", "--resume", "--out", str(out)]
        err = _one_line_error(capsys, 2, [*argv, "--no-progress"] if how == "resume" else argv)
        assert f"{store / io.COMMIT} is a {'FIFO' if kind == 'fifo' else 'socket'}" in err
    assert watchdog.freed == []
    assert not (store / io.COMMIT).is_file()  # left as it is


@pytest.mark.parametrize("name", ["zarr.json", "points/zarr.json", "wflow_digests.jsonl"])
def test_special_metadata_in_a_store_is_refused(name, tmp_path, watchdog):
    path = wflow.save(_traj(), tmp_path / "t.zarr")
    (path / name).unlink()
    watchdog.fifo(path / name)
    with pytest.raises(ValueError, match=f"{name} is a FIFO"):
        wflow.load(path)
    with pytest.raises(ValueError, match=f"{name} is a FIFO"):
        wflow.save(_traj(), path, overwrite=True)
    assert watchdog.freed == []


def test_special_files_in_a_run_folder_are_refused(tmp_path, capsys, watchdog):
    # a FIFO as the configuration file
    fifo = watchdog.fifo(tmp_path / "config.toml")
    err = _one_line_error(capsys, 2, ["run", str(fifo), *QUICK, "--out", str(tmp_path / "a")])
    assert f"{fifo} is a FIFO" in err
    # a FIFO as a run folder's lock
    out = tmp_path / "run"
    out.mkdir()
    watchdog.fifo(out / ".wflow.lock")
    err = _one_line_error(capsys, 2, ["run", *QUICK, "--out", str(out)])
    assert f"{out / '.wflow.lock'} is a FIFO" in err
    # a FIFO as the config.toml of an interrupted run
    out = tmp_path / "run2"
    assert main(["run", *QUICK, "--out", str(out)]) == 0
    (out / "config.toml").unlink()
    watchdog.fifo(out / "config.toml")
    err = _one_line_error(capsys, 2, ["run", "--resume", "--no-progress", "--out", str(out)])
    assert f"{out / 'config.toml'} is a FIFO" in err
    assert watchdog.freed == []


def test_a_special_chunk_of_a_static_variable_is_refused(tmp_path, watchdog):
    path = wflow.save(_traj(), tmp_path / "t.zarr")
    chunk = path / "weights" / "c" / "0"
    chunk.unlink()
    watchdog.fifo(chunk)
    with pytest.raises(ValueError, match=r"weights/c/0 is a FIFO"):
        wflow.load(path)
    assert watchdog.freed == []


def test_a_dangling_link_as_out_is_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    out.symlink_to(tmp_path / "nowhere")
    err = _one_line_error(capsys, 2, ["run", *QUICK, "--out", str(out)])
    assert f"--out {out} is a symbolic link to nothing" in err
    assert not (tmp_path / "nowhere").exists() and out.is_symlink()


def test_a_link_in_place_of_a_runs_figure_is_not_followed(tmp_path, capsys, precious):
    out = tmp_path / "run"
    assert main(["run", *SMALL, "--set", "init.d=2", "--out", str(out)]) == 0
    (out / "summary.png").unlink()
    (out / "summary.png").symlink_to(precious)
    capsys.readouterr()
    assert main(["run", "--resume", "--no-progress", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"{out / 'summary.png'} is a symbolic link" in err
    assert precious.read_text() == "my notes" and (out / "summary.png").is_symlink()


def test_a_figure_torn_while_written_over_is_still_wflows(tmp_path):
    from wflow.io.paths import png_is_wflows, write_figure

    png = tmp_path / "s.png"
    old = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\x0dIHDR" + bytes(17) + b"\x00" * 50
    write_figure(png, old + b"\x00\x00\x00\x00IEND\xaeB`\x82", "sweep figure")
    first = png.read_bytes()
    # a process killed while writing a new figure over it leaves the new start and the old tail
    assert png_is_wflows(first[:60] + b"torn") and png_is_wflows(first)
    png.write_bytes(first[:60] + b"torn")
    write_figure(png, old + b"\x00\x00\x00\x00IEND\xaeB`\x82", "sweep figure")
    assert png.read_bytes() == first


def test_a_link_as_a_report_folders_marker_is_not_followed(tmp_path, precious):
    from wflow.runfolder import claim_report_folder

    out = tmp_path / "reports"
    out.mkdir()
    (out / ".wflow-validation").symlink_to(precious)
    with pytest.raises(ValueError, match="holds files wflow did not write"):
        claim_report_folder(out, ["dichotomy"])
    assert precious.read_text() == "my notes"
