"""wflow writes and deletes only in its own folders, and only once every check that can refuse the run
has passed (issue 33, item 1)."""

import numpy as np
import pytest

import wflow
from wflow.cli import main
from wflow.runfolder import MARKER, RunFolder

SMALL = ["--set", "init.n=10", "--set", "run.t_end=0.5", "--set", "save.n=3", "--no-progress"]


def _files(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _one_line_error(capsys, code, argv):
    capsys.readouterr()
    assert main(argv) == code
    err = capsys.readouterr().err.strip()
    assert err.startswith("wflow: error:") and "\n" not in err, err
    return err


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_a_folder_of_the_users_own_files_is_refused(overwrite, tmp_path, capsys):
    out = tmp_path / "thesis"
    out.mkdir()
    for name, text in (("config.toml", "mine"), ("summary.png", "my figure"), ("steps.csv", "1,2")):
        (out / name).write_text(text)
    before = _files(out)
    err = _one_line_error(capsys, 2, ["run", *SMALL, *overwrite, "--out", str(out)])
    assert "holds files wflow did not write" in err and "config.toml" in err
    assert _files(out) == before  # nothing written, nothing deleted (no lock, no marker either)


@pytest.mark.parametrize("out", ["", "  "])
def test_an_empty_out_is_an_error(out, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    err = _one_line_error(capsys, 2, ["run", *SMALL, "--out", out])
    assert "--out must name a folder" in err
    assert list(tmp_path.iterdir()) == []


def test_a_file_as_out_is_an_error(tmp_path, capsys):
    f = tmp_path / "notes.txt"
    f.write_text("keep me")
    assert "is a file, not a folder" in _one_line_error(capsys, 2, ["run", *SMALL, "--out", str(f)])
    assert f.read_text() == "keep me"


def test_overwrite_deletes_nothing_when_the_driver_refuses_the_run(tmp_path, capsys):
    bad = ["--set", "run.method=rk4", "--set", "run.dt=1e-300"]  # a step below the times' rounding
    out = tmp_path / "run"
    assert main(["run", *SMALL, "--out", str(out)]) == 0
    before = _files(out)
    assert main(["run", *SMALL, *bad, "--overwrite", "--out", str(out)]) == 2
    after = _files(out)
    assert {k: v for k, v in after.items() if k.suffix != ".lock"} == {
        k: v for k, v in before.items() if k.suffix != ".lock"
    }
    assert len(wflow.load(out / "trajectory.zarr").times) == 3


def test_a_refused_run_in_a_new_folder_writes_no_config(tmp_path, capsys):
    out = tmp_path / "new"
    assert main(
        ["run", *SMALL, "--set", "run.method=rk4", "--set", "run.dt=1e-300", "--out", str(out)]
    )
    assert not (out / "config.toml").exists()


def test_a_run_folder_is_marked_and_overwrite_replaces_only_wflows_files(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", *SMALL, "--out", str(out)]) == 0
    assert (out / MARKER).is_file()
    (out / "notes.md").write_text("my notes on this run")
    assert main(["run", *SMALL, "--set", "model.beta=2", "--overwrite", "--out", str(out)]) == 0
    assert (out / "notes.md").read_text() == "my notes on this run"
    assert "beta = 2.0" in (out / "config.toml").read_text()
    # another kind of problem: the old store goes, the new one comes
    density = ["--set", "problem=eulerian", "--set", "init.d=2", "--set", "mesh.resolution=16"]
    assert main(["run", *SMALL, *density, "--overwrite", "--out", str(out)]) == 0
    assert not (out / "trajectory.zarr").exists() and (out / "density.zarr").is_dir()


def test_a_folder_from_before_the_marker_is_still_wflows(tmp_path, capsys):
    out = tmp_path / "old"
    assert main(["run", *SMALL, "--out", str(out)]) == 0
    (out / MARKER).unlink()
    RunFolder(out).check_ours()  # a wflow store and the run's files: accepted
    assert main(["run", *SMALL, "--overwrite", "--out", str(out)]) == 0
    (out / MARKER).unlink()
    (out / "mine.txt").write_text("x")
    with pytest.raises(ValueError, match="mine.txt"):
        RunFolder(out).check_ours()


def test_save_with_overwrite_replaces_only_a_wflow_store(tmp_path):
    traj = wflow.simulate(wflow.SA(2.0), wflow.sphere.uniform(6, 3, seed=0), 0.2, dt=0.1)
    thesis = tmp_path / "thesis"
    thesis.mkdir()
    (thesis / "chapter1.tex").write_text("precious")
    with pytest.raises(ValueError, match="not a wflow result store"):
        wflow.save(traj, thesis, overwrite=True)
    assert (thesis / "chapter1.tex").read_text() == "precious"
    store = wflow.save(traj, tmp_path / "t.zarr")
    wflow.save(traj, store, overwrite=True)  # its own store: replaced
    np.testing.assert_array_equal(wflow.load(store).points, traj.points)
    empty = tmp_path / "empty"
    empty.mkdir()
    wflow.save(traj, empty, overwrite=True)  # an empty folder: used
    assert len(wflow.load(empty)) == len(traj)


@pytest.mark.parametrize("delay", [0.2, 0.8, 2.0, 4.0])
def test_ctrl_c_at_any_moment_is_one_line_and_exit_130(delay, tmp_path):
    """Ctrl-C while Python imports wflow, while numba compiles (a cold cache: its compiler's callbacks
    would swallow the interrupt) or while the run steps: one line, status 130, no traceback, and the
    folder resumes.  ``delay`` counts from the moment ``wflow.cli.main`` is about to run (the child
    says so on stderr): before it, in the interpreter's own start-up (about 0.2 s, longer under
    load), no code of wflow's can catch Ctrl-C -- a fixed delay from the process's start made
    the 0.2 s case land there on a loaded machine."""
    import os
    import signal
    import subprocess
    import sys
    import time

    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"), PYTHONUNBUFFERED="1")
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-c",
        # Ctrl-C as a terminal delivers it, also where this test runs with SIGINT ignored (a
        # background job inherits SIG_IGN, and wflow then keeps its caller's choice)
        "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from wflow.cli import main; print('main', file=sys.stderr, flush=True); sys.exit(main())",
    ]
    p = subprocess.Popen(
        [*cmd, "run", "--out", str(out), "--no-progress", "--set", "run.t_end=5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert p.stderr is not None and p.stderr.readline() == "main\n"
    time.sleep(delay)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=600)
    assert p.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "Exception ignored" not in err, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("wflow: interrupted")
    if (out / "config.toml").exists():  # the run had started: it continues
        assert main(["run", "--resume", "--out", str(out), "--no-progress"]) == 0


@pytest.mark.parametrize("write", [3, 12, 30])
def test_ctrl_c_inside_a_zarr_write_is_one_line_and_exit_130(write, tmp_path):
    """Ctrl-C delivered from inside Zarr's asynchronous write of a store file (the ``write``-th, through a
    hook on the store's ``set`` that then waits 0.2 s): the snapshot being written is completed and
    committed first (an interrupt inside the write left a torn snapshot and Zarr's coroutines to be
    collected after their event loop closed), then one line, status 130, and the folder resumes to the
    uninterrupted run's end."""
    import os
    import subprocess
    import sys

    from wflow.io.commit import committed_length, stored_snapshots

    hook = (
        "import asyncio, os, signal, sys, zarr.storage\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "orig, n = zarr.storage.LocalStore.set, [0]\n"
        "async def set_(self, key, value, *a, **k):\n"
        "    n[0] += 1\n"
        f"    if n[0] == {write}:\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "        await asyncio.sleep(0.2)\n"
        "    return await orig(self, key, value, *a, **k)\n"
        "zarr.storage.LocalStore.set = set_\n"
        "from wflow.cli import main; sys.exit(main())\n"
    )
    out = tmp_path / "run"
    args = ["run", "--out", str(out), "--no-progress", "--set", "init.n=16", "--set", "run.t_end=2"]
    p = subprocess.run(
        [sys.executable, "-c", hook, *args, "--set", "output.figure=false"],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
        timeout=600,
    )
    assert p.returncode == 130, p.stderr[-2000:]
    assert "Traceback" not in p.stderr and "Exception ignored" not in p.stderr, p.stderr[-2000:]
    assert p.stderr.strip().splitlines()[-1].startswith("wflow: interrupted")
    store = out / "trajectory.zarr"
    assert committed_length(store) == stored_snapshots(store) >= 1  # no torn snapshot
    assert main(["run", "--resume", "--out", str(out), "--no-progress"]) == 0
    full = tmp_path / "full"
    assert main([*args[:1], "--out", str(full), *args[3:], "--set", "output.figure=false"]) == 0
    a, b = wflow.load(out / "trajectory.zarr"), wflow.load(full / "trajectory.zarr")
    np.testing.assert_array_equal(a.points, b.points)


def test_ctrl_c_inside_numbas_compiler_is_recorded_and_delivered_after_it():
    """A KeyboardInterrupt raised inside numba's compiler can leave LLVM's lock held, and a worker
    thread compiling beside it then waits forever: 1 in 25 Ctrl-Cs of a cold-cache run hung in
    ``parallel``'s wait.  There the handler records the interrupt and sends it again 0.1 s later
    (only while ``wflow.cli.main`` still handles Ctrl-C); elsewhere it raises at once."""
    import os
    import signal
    import sys

    import wflow.cli as cli

    ns: dict = {}
    fake = os.path.join(os.sep, "site-packages", "numba", "core", "compiler.py")
    exec(compile("import sys\nframe = sys._getframe()", fake, "exec"), ns)
    here = sys._getframe()
    assert cli._in_compiler(ns["frame"]) and not cli._in_compiler(here)
    cli._INTERRUPTED.clear()
    try:
        cli._on_interrupt(signal.SIGINT, ns["frame"])  # recorded, not raised
        assert cli._INTERRUPTED.is_set()
        with pytest.raises(KeyboardInterrupt):
            cli._on_interrupt(signal.SIGINT, here)
    finally:
        cli._INTERRUPTED.clear()


def test_config_and_weights_files_that_cannot_be_read_say_why(tmp_path, capsys):
    folder = tmp_path / "a-folder.toml"
    folder.mkdir()
    assert "is a folder, not a TOML file" in _one_line_error(capsys, 2, ["run", str(folder)])
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes("[model]\n# b\xeata\nbeta = 2.0\n".encode("latin-1"))
    err = _one_line_error(capsys, 2, ["run", str(latin1)])
    assert f"config file {latin1} is not UTF-8 text (byte 0xea" in err
    text = tmp_path / "weights.txt"
    text.write_text("Q = 1\n")
    err = _one_line_error(
        capsys, 2, ["run", "--set", f"model.weights={text}", "--out", str(tmp_path / "o")]
    )
    assert "model.weights" in err and "not an .npz archive" in err and "pickle" not in err


def test_a_store_without_its_root_metadata_is_named_as_such(tmp_path):
    traj = wflow.simulate(wflow.SA(2.0), wflow.sphere.uniform(6, 3, seed=0), 0.2, dt=0.1)
    store = wflow.save(traj, tmp_path / "t.zarr")
    (store / "zarr.json").unlink()
    with pytest.raises(wflow.WflowError, match="has no zarr.json"):
        wflow.load(store)


def test_a_name_too_long_is_one_line(tmp_path, capsys):
    err = _one_line_error(capsys, 2, ["run", *SMALL, "--out", str(tmp_path / ("a" * 300))])
    assert "a file name is too long" in err


@pytest.mark.parametrize(
    "err, code, words",
    [
        (28, 1, "the disk is full"),
        (27, 1, "file size limit"),
        (30, 2, "read-only"),
        (13, 2, "permission denied"),
    ],
)
def test_a_failure_of_the_machine_is_one_line(err, code, words, tmp_path, capsys, monkeypatch):
    """The recorder's first write fails as the machine would make it fail (simulated: this suite runs as
    root on some machines, where permissions and read-only folders cannot be staged)."""
    import os

    from wflow import io

    def fail(self, snap):
        raise OSError(err, os.strerror(err), str(self.path / "points"))

    monkeypatch.setattr(io.ZarrRecorder, "_create", fail)
    line = _one_line_error(capsys, code, ["run", *SMALL, "--out", str(tmp_path / "run")])
    assert words in line and "points" in line


def test_a_file_size_limit_in_a_real_process_is_one_line_and_resumable(tmp_path):
    import resource
    import subprocess
    import sys

    out = tmp_path / "run"
    limit = 30_000  # bytes per file: the store's metadata fits (20 kB), its snapshot digests (46 kB) outgrow it

    def cap():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    cmd = [
        sys.executable,
        "-c",
        # Ctrl-C as a terminal delivers it, also where this test runs with SIGINT ignored (a
        # background job inherits SIG_IGN, and wflow then keeps its caller's choice)
        "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from wflow.cli import main; print('main', file=sys.stderr, flush=True); sys.exit(main())",
    ]
    run = ["run", "--no-progress", "--set", "init.n=10", "--set", "save.n=101"]
    # the same run without the limit first, so that the limited one compiles nothing (numba's cache
    # files would outgrow the limit in a fresh environment) and writes only its store
    warm = subprocess.run(
        [*cmd, *run, "--out", str(tmp_path / "warm")], capture_output=True, timeout=900
    )
    assert warm.returncode == 0, warm.stderr[-2000:]
    p = subprocess.run(
        [*cmd, *run, "--out", str(out)],
        capture_output=True,
        text=True,
        preexec_fn=cap,
        timeout=600,
    )
    err = p.stderr.strip()
    assert p.returncode == 1 and "Traceback" not in err, err[-2000:]
    assert err.splitlines()[-1].startswith("wflow: error: a file outgrew the file size limit")
    assert "committed snapshots are kept" in err
    kept = wflow.io.committed_length(out / "trajectory.zarr")
    assert 0 < kept < 101
    assert main(["run", "--resume", "--out", str(out), "--no-progress"]) == 0
    assert len(wflow.load(out / "trajectory.zarr")) == 101


def test_validate_writes_only_into_its_own_report_folders(tmp_path, capsys):
    thesis = tmp_path / "thesis"
    thesis.mkdir()
    (thesis / "chapter.tex").write_text("precious")
    assert "holds files wflow did not write" in _one_line_error(
        capsys, 2, ["validate", "mean-shift", "--quick", "--out", str(thesis)]
    )
    assert sorted(p.name for p in thesis.iterdir()) == ["chapter.tex"]
    f = tmp_path / "report.txt"
    f.write_text("x")
    assert "is a file, not a folder" in _one_line_error(capsys, 2, ["validate", "--out", str(f)])
    new = tmp_path / "new"
    assert "unknown validation study" in _one_line_error(
        capsys, 2, ["validate", "nope", "--out", str(new)]
    )
    assert not new.exists()


def test_a_lock_path_that_is_a_folder_is_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    (out / ".wflow.lock").mkdir(parents=True)
    assert "(Is a directory)" in _one_line_error(capsys, 2, ["run", *SMALL, "--out", str(out)])
    out2 = tmp_path / "run2"
    assert main(["run", *SMALL, "--set", "output.figure=false", "--out", str(out2)]) == 0
    lock = out2 / "trajectory.zarr.lock"
    lock.unlink(missing_ok=True)
    lock.mkdir()
    err = _one_line_error(capsys, 2, ["run", *SMALL, "--overwrite", "--out", str(out2)])
    assert "a folder stands where wflow writes a file" in err and "trajectory.zarr.lock" in err
    assert len(wflow.load(out2 / "trajectory.zarr")) == 3  # the old run is intact


@pytest.mark.parametrize("command", ["sweep", "resume"])
def test_an_unwritable_lock_or_read_only_store_is_one_line(command, tmp_path, capsys, monkeypatch):
    """Permission denied on a sweep's lock, a read-only file system under --resume (simulated: as root
    the suite cannot stage them)."""
    import errno
    import os

    from wflow import io

    out = tmp_path / "run"
    if command == "resume":
        assert main(["run", *SMALL, "--set", "output.figure=false", "--out", str(out)]) == 0
        (out / "trajectory.zarr" / io.COMMIT).write_text('{"length": 2}')  # as if interrupted
        code = errno.EROFS
        argv = ["run", "--resume", "--out", str(out), "--no-progress"]
    else:
        code = errno.EACCES
        argv = ["sweep", "--grid", "model.beta=[1,2]", *SMALL, "--out", str(tmp_path / "s.zarr")]

    def refuse(self):
        raise OSError(code, os.strerror(code), str(self.path))

    monkeypatch.setattr(io.FolderLock, "acquire", refuse)
    line = _one_line_error(capsys, 2, argv)
    assert ("read-only" if command == "resume" else "permission denied") in line.lower()


def test_a_clean_exit_leaves_no_lock_files_and_a_killed_runs_lock_is_taken_over(tmp_path, capsys):
    import os
    import signal
    import subprocess
    import sys
    import time

    from wflow import io

    out = tmp_path / "run"
    assert main(["run", *SMALL, "--set", "output.figure=false", "--out", str(out)]) == 0
    assert not [p.name for p in out.iterdir() if p.name.endswith(".lock")]
    # a lock file whose process died (SIGKILL: no release) is left in place and taken over
    code = "import sys, time; from wflow.io import FolderLock; lock = FolderLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(60)"
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(out / ".wflow.lock")], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(wflow.errors.StoreBusyError):
        io.FolderLock(out / ".wflow.lock").acquire()
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    time.sleep(0.1)
    assert (out / ".wflow.lock").exists()
    assert (
        main(["run", *SMALL, "--set", "output.figure=false", "--overwrite", "--out", str(out)]) == 0
    )
    assert not (out / ".wflow.lock").exists()


def test_a_path_the_terminal_cannot_encode_does_not_stop_the_run(tmp_path):
    """PYTHONIOENCODING=ascii with a non-ASCII --out: the banner's codec error aborted the run after its
    folder was claimed; now the path is printed escaped and the run completes."""
    import os
    import subprocess
    import sys

    out = tmp_path / "étude"
    p = subprocess.run(
        [sys.executable, "-m", "wflow.cli", "run", "--out", str(out), "--no-progress"]
        + ["--set", "init.n=8", "--set", "run.t_end=0.1", "--set", "output.figure=false"],
        capture_output=True,
        env=dict(os.environ, PYTHONIOENCODING="ascii"),
        timeout=600,
    )
    assert p.returncode == 0, p.stderr.decode("ascii", "replace")[-2000:]
    assert b"\\xe9tude" in p.stdout
    assert len(wflow.load(out / "trajectory.zarr")) >= 2


def test_a_run_folder_written_with_the_key_solver_resumes(tmp_path, capsys, monkeypatch):
    """A run folder of the release before `problem` (its store's run_config and its config.toml say
    `solver`) resumes where it stopped, as the same run: the saves of an uninterrupted one."""
    import json

    from wflow import io

    sets = ["problem=eulerian", "init.d=2", "mesh.resolution=16", "run.t_end=0.4", "save.n=4"]
    argv = ["run", *(a for s in sets for a in ("--set", s)), "--set", "output.figure=false"]
    assert main([*argv, "--no-progress", "--out", str(tmp_path / "full")]) == 0
    ref = wflow.load(tmp_path / "full" / "density.zarr")
    out = tmp_path / "old"
    save = io.ZarrRecorder.save

    def stop_after_two(self, snap):
        save(self, snap)
        if self.count == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(io.ZarrRecorder, "save", stop_after_two)
    assert main([*argv, "--no-progress", "--out", str(out)]) == 130
    monkeypatch.undo()
    meta = out / "density.zarr" / "zarr.json"
    root = json.loads(meta.read_text())
    cfg = json.loads(root["attributes"]["run_config"])
    old = {("solver" if k == "problem" else k): v for k, v in cfg.items()}
    root["attributes"]["run_config"] = json.dumps(old)
    meta.write_text(json.dumps(root))
    toml = out / "config.toml"
    toml.write_text(toml.read_text().replace('problem = "eulerian"', 'solver = "eulerian"'))
    assert RunFolder(out).stored_config() == cfg
    capsys.readouterr()
    assert main(["run", "--resume", "--no-progress", "--out", str(out)]) == 0
    assert "(2 snapshots committed)" in capsys.readouterr().out
    back = wflow.load(out / "density.zarr")
    np.testing.assert_array_equal(back.times, ref.times)
    np.testing.assert_allclose(back.values, ref.values, rtol=1e-12, atol=1e-14)
