"""The KeOps probe: a formula compiled in a child process, whose crash the parent survives.

A crash is forced through ``WFLOW_KEOPS_PROBE_CRASH=1`` (the child calls ``os.abort()``).  The
selection is tested on this CPU-only machine by pretending an NVIDIA driver is present: that is
where ``backend="auto"`` asks the probe.
"""

from __future__ import annotations

import json
import re
import time
import warnings

import numpy as np
import pytest

from wflow.kernels import BACKENDS, kernel_sums
from wflow.kernels import keops_backend as kb


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh KeOps cache folder for wflow's verdicts, and no verdict in this process's memory."""
    monkeypatch.setenv("WFLOW_KEOPS_CACHE", str(tmp_path / "keops"))
    monkeypatch.setattr(kb, "_VERDICTS", {})
    return tmp_path / "keops"


@pytest.fixture
def crash(monkeypatch, cache):
    monkeypatch.setenv(kb.PROBE_CRASH_ENV, "1")
    return cache


def _no_warnings(f):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return f()


def test_a_crashing_child_is_survived_recorded_and_reported_once(crash, capfd):
    t0 = time.perf_counter()
    with pytest.warns(UserWarning) as said:
        verdict = kb.keops_probe()
    seconds = time.perf_counter() - t0
    assert capfd.readouterr() == ("", "")  # the child's crash prints nothing: no traceback, no core
    print(f"probe with a crashing child: {seconds:.3f} s")  # the parent's cost of a crash
    assert not verdict.ok and not verdict.gpu and verdict.fresh
    assert "crashed (SIGABRT) compiling the kernel-sum formula in a child process" in verdict.line
    assert "choose backend='torch'" in verdict.line and "\n" not in verdict.line
    assert [str(w.message) for w in said] == [verdict.line]  # one line, once
    # recorded in wflow's KeOps cache folder, per KeOps version, CUDA version and family
    assert verdict.path.parent == crash / "probe"
    assert (
        verdict.path.name
        == f"kernel_sums-keops{kb._pykeops_version()}-cuda{kb._cuda_version()}.json"
    )
    assert json.loads(verdict.path.read_text()) == {"ok": False, "gpu": False, "line": verdict.line}
    # asked again, in this process or in a new one (memory dropped): the record, no new warning
    again = _no_warnings(kb.keops_probe)
    assert again.line == verdict.line and not again.fresh
    kb._VERDICTS.clear()
    assert _no_warnings(kb.keops_probe) == again


def test_auto_falls_back_and_keops_named_raises_the_same_line(crash, monkeypatch):
    monkeypatch.setattr(kb, "nvidia_driver_present", lambda: True)  # where auto would pick KeOps
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1000, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    w = np.full(1000, 1e-3)
    with pytest.warns(UserWarning, match="crashed") as said:
        first = kernel_sums(x, x, w, 1.0, values=False)  # 10^6 pairs: KeOps' size
    assert first.backend != "keops" and len(said) == 1
    line = str(said[0].message)
    assert _no_warnings(lambda: kernel_sums(x, x, w, 1.0, values=False)).backend != "keops"
    with pytest.raises(ValueError, match=re.escape(line)):
        kernel_sums(x[:5], x[:5], w[:5], 1.0, backend="keops")
    assert not BACKENDS["keops"].available()


def test_a_hung_child_times_out(cache, monkeypatch):
    monkeypatch.setenv(kb.PROBE_CRASH_ENV, "hang")
    with pytest.warns(UserWarning, match="did not compile and run the kernel-sum formula in 1 s"):
        assert not kb.keops_probe(timeout=1.0).ok


def test_a_cache_folder_that_cannot_be_written(tmp_path, monkeypatch):
    monkeypatch.setattr(kb, "_VERDICTS", {})
    (tmp_path / "file").write_text("")
    folder = tmp_path / "file" / "keops"  # below a file: no folder can be made there
    with pytest.warns(UserWarning) as said:
        verdict = kb.keops_probe(folder=folder)
    assert not verdict.ok
    assert verdict.line.startswith(f"the KeOps cache folder {folder} cannot be written (")
    assert verdict.line.endswith(
        "set WFLOW_KEOPS_CACHE to a writable folder, or choose backend='torch' or 'numba'"
    )
    assert [str(w.message) for w in said] == [verdict.line]


def test_without_an_nvidia_driver_a_recorded_verdict_alone_counts(cache, monkeypatch):
    """On a CPU-only machine nothing is probed: KeOps stays available until a failure is recorded."""
    monkeypatch.setattr(kb, "nvidia_driver_present", lambda: False)
    monkeypatch.setattr(kb, "keops_probe", lambda *a, **k: pytest.fail("probed without a GPU"))
    assert BACKENDS["keops"].probe_failure() == ""
    path = kb._verdict_path("kernel_sums", cache)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"ok": False, "gpu": False, "line": "KeOps crashed here"}))
    assert BACKENDS["keops"].probe_failure() == "KeOps crashed here"


def test_the_probe_passes_where_keops_works(tmp_path, monkeypatch):
    """The child really compiles and runs the formula (the default cache folder keeps the build)."""
    if kb.import_pykeops() is None:
        pytest.skip(f"pykeops unavailable: {kb._IMPORT_ERROR}")
    monkeypatch.setattr(kb, "_VERDICTS", {})
    verdict = _no_warnings(lambda: kb.keops_probe(folder=tmp_path, refresh=True))
    assert verdict.ok and verdict.fresh, verdict.line
    assert verdict.gpu == kb._gpu_available(kb.import_pykeops())
    assert re.fullmatch(
        r"KeOps \S+ \(CUDA \S+\) compiled and ran the kernel-sum formula on (a GPU|the CPU) in [0-9.]+ s",
        verdict.line,
    )


def test_backend_keops_with_a_cache_folder_that_cannot_be_written(tmp_path):
    """In a fresh process (pykeops is imported once per process): one line naming the folder."""
    import os
    import subprocess
    import sys

    (tmp_path / "file").write_text("")
    folder = tmp_path / "file" / "keops"
    code = (
        "import numpy as np\n"
        "from wflow.kernels import kernel_sums\n"
        "try:\n"
        "    kernel_sums(np.eye(3), np.eye(3), np.ones(3) / 3, 1.0, backend='keops')\n"
        "except ValueError as e:\n"
        "    print(e)\n"
    )
    env = {**os.environ, "WFLOW_KEOPS_CACHE": str(folder)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    head = f"backend 'keops' is not available on this machine: the KeOps cache folder {folder} cannot be written ("
    tail = "): set WFLOW_KEOPS_CACHE to a writable folder, or choose backend='torch' or 'numba'\n"
    assert done.stdout.startswith(head) and done.stdout.endswith(tail), done.stdout
