"""A first run says what numba compiles while it compiles, and only when it compiles (issue 34, item 3)."""

import os
import subprocess
import sys

import numpy as np
from numba import njit

from wflow.kernels.jit import compile_notices


def _heard():
    heard = []
    return heard, lambda name, cached, seconds: heard.append((name, cached, seconds))


def test_compile_notices_name_the_called_function_once_per_compilation():
    @njit
    def inner(x):
        return x + 1.0

    @njit
    def outer(x):
        return inner(x) * 2.0

    heard, sink = _heard()
    with compile_notices(sink):
        assert outer(1.0) == 4.0  # compiles outer, and inner inside it
        assert outer(2.0) == 6.0  # the float64 signature exists: no compilation
    assert [(name, cached) for name, cached, _ in heard] == [("outer", False), ("outer", False)]
    assert heard[0][2] is None and heard[1][2] >= 0.0  # start, then end with its seconds
    with compile_notices(sink):
        outer(np.int64(3))  # a new signature is a new compilation
    assert len(heard) == 4 and heard[2][:2] == ("outer", False) and heard[2][2] is None
    outer(
        np.float32(1.0)
    )  # outside a block: the block is not told (nor stderr: not a wflow kernel)
    assert len(heard) == 4


def test_compile_notices_tell_only_the_innermost_block():
    @njit
    def f(x):
        return x * 3.0

    @njit
    def g(x):
        return x * 5.0

    heard_out, sink_out = _heard()
    heard_in, sink_in = _heard()
    with compile_notices(sink_out):
        with compile_notices(sink_in):
            f(1.0)
        g(1.0)
    assert [h[0] for h in heard_in] == ["f", "f"]
    assert [h[0] for h in heard_out] == ["g", "g"]


def test_a_failing_sink_does_not_stop_the_compilation():
    @njit
    def h(x):
        return x - 1.0

    def sink(name, cached, seconds):
        raise RuntimeError("broken terminal")

    with compile_notices(sink):
        assert h(3.0) == 2.0


def test_the_progress_bar_label_says_what_is_compiling(capsys):
    from wflow.solvers.base import Problem, integrate
    from wflow.solvers.trackers import ProgressBar

    @njit
    def decay_rate(y):
        return -y

    class Decay(Problem):
        def rhs(self, t, y):
            return decay_rate(y)

    bar = ProgressBar("decay")
    res = integrate(Decay(), "rk4", np.array([1.0]), 0.0, 1.0, dt=0.1, trackers=[bar])
    assert abs(res["state"][-1][0] - np.exp(-1.0)) < 1e-6  # (rk4 at dt = 0.1: error ~ 1e-7)
    err = capsys.readouterr().err
    # (no ", first run only": a function without cache=True compiles in every process)
    assert "decay [compiling decay_rate]" in err
    assert bar.bar.desc == "decay"  # the label is back once it is compiled


def _run(tmp_path, out: str, cache) -> subprocess.CompletedProcess:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache))
    args = ["init.n=40", "run.t_end=0.2", "save.n=2", "output.figure=false"]
    cmd = [sys.executable, "-m", "wflow.cli", "run", "--no-progress", "--out", str(tmp_path / out)]
    for a in args:
        cmd += ["--set", a]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def test_wflow_run_says_what_it_compiles_on_a_cold_cache_and_nothing_after(tmp_path):
    """A cold numba cache (an empty NUMBA_CACHE_DIR, as after pip install): the run names each kernel it
    compiles on stderr, once; the second run loads them from the cache and says nothing."""
    cache = tmp_path / "numba-cache"
    cache.mkdir()
    first = _run(tmp_path, "a", cache)
    assert first.returncode == 0, first.stderr[-2000:]
    lines = [s for s in first.stderr.splitlines() if "compiling" in s]
    assert lines, first.stderr[-2000:]
    for line in lines:
        assert line.startswith("wflow: compiling ") and line.endswith(
            "with numba (first run only: cached for later runs)"
        ), line
    names = [line.split()[2] for line in lines]
    assert len(names) == len(set(names)), names  # one compilation per kernel (one signature)
    assert any(p.suffix == ".nbi" for p in cache.rglob("*"))  # numba wrote into NUMBA_CACHE_DIR
    second = _run(tmp_path, "b", cache)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "compiling" not in second.stderr, second.stderr[-2000:]
    # (the same run: the same numbers)
    assert first.stdout.splitlines()[-1] == second.stdout.splitlines()[-1]


def test_outside_any_block_wflows_own_kernels_are_announced_on_stderr(capsys, monkeypatch):
    """The multiscale example compiled for 36 s from an empty cache with nothing printed (issue 52,
    item 6): a kernel of wflow's that numba starts compiling outside any block prints one line; a
    user's own numba function prints nothing, and WFLOW_NOTICES=0 silences wflow's."""

    def make(module):
        def kernel(x):
            return x * 7.0

        kernel.__module__ = module
        return njit(kernel)

    mine, ours, quiet = make("my_project"), make("wflow.fake"), make("wflow.fake")
    capsys.readouterr()
    mine(1.0)
    assert capsys.readouterr().err == ""
    ours(1.0)
    ours(2.0)  # compiled: nothing more
    assert capsys.readouterr().err == "wflow: compiling kernel with numba\n"
    monkeypatch.setenv("WFLOW_NOTICES", "0")
    quiet(1.0)
    assert capsys.readouterr().err == ""
