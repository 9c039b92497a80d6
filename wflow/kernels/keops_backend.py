"""KeOps (pykeops) kernel sums: streaming, memory-free, compiled per formula; GPU when present.

The formula is KeOps' ``Max_SumShiftExpWeight`` reduction, which returns exactly the
row maximum :math:`c_i` of :math:`\\ell_{ij} + \\log w_j` and
:math:`\\sum_j e^{\\ell_{ij} + \\log w_j - c_i} (1, V y_j)` in one streamed pass.

Compiled formulas are cached in :func:`keops_cache_dir` (override with the environment
variable ``WFLOW_KEOPS_CACHE``), one folder per KeOps version.  The first use of each
(dimension, dtype) compiles with g++ for 10--25 s; a file lock keeps two processes from
compiling the same formula at once.

A compiler that crashes would kill the Python process, where no ``try`` catches it.  So on a
machine with an NVIDIA driver, before the first KeOps sum, :func:`keops_probe` compiles and
runs a small formula of the same family in a child process and records its verdict.  Where
the child crashed, failed or hung, ``backend="auto"`` does not pick KeOps on that machine (a
warning says so once) and ``backend="keops"`` raises that line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import json
import logging
import os
import pickle
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from ..errors import WflowError
from .sums import KernelProblem, KernelSums, register_backend

__all__ = [
    "KeopsBackend",
    "ProbeVerdict",
    "import_pykeops",
    "keops_cache_dir",
    "keops_probe",
    "nvidia_driver_present",
]

log = logging.getLogger(__name__)

_PYKEOPS = None
_IMPORT_ERROR: str | None = None


def keops_cache_dir() -> Path:
    """Folder holding KeOps' compiled formulas for wflow.

    Examples
    --------
    >>> import os
    >>> from pathlib import Path
    >>> from wflow.kernels.keops_backend import keops_cache_dir
    >>> folder = keops_cache_dir()  # $WFLOW_KEOPS_CACHE, else <cache>/wflow/keops-<pykeops version>
    >>> isinstance(folder, Path), folder.name.startswith("keops-") or "WFLOW_KEOPS_CACHE" in os.environ
    (True, True)
    """
    root = os.environ.get("WFLOW_KEOPS_CACHE")
    if root:
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "wflow" / f"keops-{_pykeops_version()}"


@functools.cache
def _pykeops_version() -> str:
    try:
        from importlib.metadata import version

        return version("pykeops")
    except Exception:
        return "unknown"


def _check_writable(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if not os.access(folder, os.W_OK):
        raise PermissionError(f"no write permission on {folder}")


def _unwritable(folder: Path, exc: OSError) -> str:
    return (
        f"the KeOps cache folder {folder} cannot be written ({type(exc).__name__}: {exc}): set "
        f"WFLOW_KEOPS_CACHE to a writable folder, or choose backend='torch' or 'numba'"
    )


def import_pykeops():
    """Import pykeops quietly with wflow's cache folder; ``None`` if it cannot be imported.

    Examples
    --------
    Importing pykeops may be slow (or fail) on a machine without a working KeOps install,
    so the example is not run:

    >>> from wflow.kernels.keops_backend import import_pykeops  # doctest: +SKIP
    >>> pykeops = import_pykeops()  # doctest: +SKIP
    >>> pykeops is None or hasattr(pykeops, "get_build_folder")  # doctest: +SKIP
    True
    """
    global _PYKEOPS, _IMPORT_ERROR
    if _PYKEOPS is not None or _IMPORT_ERROR is not None:
        return _PYKEOPS
    folder = keops_cache_dir()
    try:
        _check_writable(folder)
    except OSError as exc:
        _IMPORT_ERROR = _unwritable(folder, exc)
        return None
    for attempt in (1, 2):
        try:
            _PYKEOPS = _import_quietly(folder)
            break
        except (pickle.UnpicklingError, EOFError) as exc:
            # a truncated index of KeOps' cache (a process killed while KeOps saved it): drop it,
            # KeOps rebuilds it; the compiled formulas stay
            _IMPORT_ERROR = f"{type(exc).__name__}: {exc}"
            if attempt == 2:
                break
            log.warning("KeOps' cache index in %s is damaged (%s); rebuilding it", folder, exc)
            for f in folder.rglob("*_cache.pkl"):
                f.unlink(missing_ok=True)
            for name in [m for m in sys.modules if m.split(".")[0] in ("pykeops", "keopscore")]:
                del sys.modules[name]
            _IMPORT_ERROR = None
        except Exception as exc:  # ImportError, or a broken install
            _IMPORT_ERROR = f"{type(exc).__name__}: {exc}"
            break
    return _PYKEOPS


def _import_quietly(folder: Path):
    os.environ.setdefault("KEOPS_CACHE_FOLDER", str(folder))
    os.environ.setdefault("PYKEOPS_VERBOSE", "0")
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        import pykeops
        from pykeops.numpy import LazyTensor  # noqa: F401

        if (
            Path(pykeops.get_build_folder()).resolve() != folder.resolve()
            and "WFLOW_KEOPS_CACHE" in os.environ
        ):
            pykeops.set_build_folder(str(folder))
    log.debug(
        "pykeops imported; build folder %s; said: %s",
        pykeops.get_build_folder(),
        sink.getvalue().strip(),
    )
    return pykeops


@functools.cache
def nvidia_driver_present() -> bool:
    """Whether this machine has an NVIDIA driver at all (without importing pykeops)."""
    import shutil

    return os.path.exists("/proc/driver/nvidia/version") or shutil.which("nvidia-smi") is not None


def _gpu_available(pykeops) -> bool:
    try:
        return bool(pykeops.pykeopsconfig.pykeops_cuda.get_use_cuda())
    except Exception:
        return False


@contextlib.contextmanager
def compile_lock(folder: Path, name: str = "wflow-compile.lock"):
    """Hold the file lock ``folder / name`` (none where ``fcntl`` is missing)."""
    try:
        import fcntl
    except ImportError:  # not on POSIX: no lock
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / name, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# The probe: a KeOps formula compiled and run in a child process, whose crash cannot hurt.
#: Formula families the probe knows; the kernel sums' ``Max_SumShiftExpWeight`` reduction.
PROBE_FAMILIES = ("kernel_sums",)
#: Seconds the child may take (a first compile takes 10--25 s on a CPU) before it counts as hung.
PROBE_TIMEOUT = 300.0
#: Environment variable for tests: ``1`` makes the child abort at once, ``hang`` makes it sleep.
PROBE_CRASH_ENV = "WFLOW_KEOPS_PROBE_CRASH"
_CHILD = f"""
import os, sys, time
if os.environ.get("{PROBE_CRASH_ENV}") == "1":
    import resource
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a test's crash leaves no core file
    os.abort()
if os.environ.get("{PROBE_CRASH_ENV}") == "hang":
    time.sleep(3600)
from wflow.kernels.keops_backend import _probe_child
_probe_child(sys.argv[1])
"""
_VERDICTS: dict[Path, ProbeVerdict] = {}  # this process's, by verdict file


@dataclasses.dataclass(frozen=True)
class ProbeVerdict:
    """What the KeOps probe found on this machine.

    Attributes
    ----------
    ok : bool
        The child compiled the formula, ran it and matched a NumPy sum.
    gpu : bool
        KeOps ran it on a GPU.
    line : str
        One line: what happened and, where it failed, what to use instead.
    path : Path
        The file where the verdict is recorded.
    fresh : bool
        Measured by this call (``False``: read from ``path`` or from this process's memory).
    """

    ok: bool
    gpu: bool
    line: str
    path: Path
    fresh: bool = False


@functools.cache
def _cuda_version() -> str:
    """The CUDA driver's version (``"13.0"``), ``"none"`` without one; asks no CUDA context."""
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(v)) == 0 and v.value > 0:
            return f"{v.value // 1000}.{v.value % 1000 // 10}"
    except (OSError, AttributeError):
        pass
    return "none"


def _verdict_path(family: str, folder: Path) -> Path:
    return folder / "probe" / f"{family}-keops{_pykeops_version()}-cuda{_cuda_version()}.json"


def recorded_verdict(
    family: str = "kernel_sums", folder: Path | None = None
) -> ProbeVerdict | None:
    """The verdict recorded for this machine, or ``None``; runs nothing."""
    path = _verdict_path(family, keops_cache_dir() if folder is None else Path(folder))
    if path not in _VERDICTS:
        try:
            data = json.loads(path.read_text())
            _VERDICTS[path] = ProbeVerdict(
                bool(data["ok"]), bool(data["gpu"]), str(data["line"]), path
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None  # none yet (not remembered: another process may write it)
    return _VERDICTS[path]


def keops_probe(
    family: str = "kernel_sums",
    *,
    folder: Path | str | None = None,
    refresh: bool = False,
    timeout: float = PROBE_TIMEOUT,
) -> ProbeVerdict:
    """Whether KeOps compiles and runs a formula of ``family`` here, tried once in a child process.

    The verdict is recorded in ``folder / "probe"`` (default :func:`keops_cache_dir`), one file per
    KeOps version, CUDA version and family, and read from there by later calls and processes.
    Where the child crashed, failed or hung, a :class:`UserWarning` says so once.

    Parameters
    ----------
    family : str
        A formula family of :data:`PROBE_FAMILIES`.
    folder : path, optional
        Where the verdict is recorded (the child compiles into :func:`keops_cache_dir`).
    refresh : bool
        Probe again even where a verdict is recorded.
    timeout : float
        Seconds the child may take.

    Returns
    -------
    ProbeVerdict

    Examples
    --------
    Not run (the child may compile a formula for minutes; ``tests/test_keops_probe.py`` runs it):

    >>> from wflow.kernels.keops_backend import keops_probe  # doctest: +SKIP
    >>> verdict = keops_probe()  # doctest: +SKIP
    >>> verdict.ok, verdict.path.parent.name  # doctest: +SKIP
    (True, 'probe')
    """
    if family not in PROBE_FAMILIES:
        raise ValueError(f"family must be one of {PROBE_FAMILIES}, got {family!r}")
    root = keops_cache_dir() if folder is None else Path(folder)
    path = _verdict_path(family, root)
    if not refresh and (known := recorded_verdict(family, root)) is not None:
        return known
    try:
        _check_writable(path.parent)
        with compile_lock(path.parent, "wflow-probe.lock"):
            known = None if refresh else recorded_verdict(family, root)  # probed meanwhile?
            verdict = known or _run_child(family, path, timeout)
            if known is None:
                tmp = path.with_suffix(f".{os.getpid()}.tmp")
                record = {"ok": verdict.ok, "gpu": verdict.gpu, "line": verdict.line}
                tmp.write_text(json.dumps(record, indent=1) + "\n")
                os.replace(tmp, path)
    except OSError as exc:
        verdict = ProbeVerdict(False, False, _unwritable(root, exc), path, fresh=True)
    _VERDICTS[path] = dataclasses.replace(verdict, fresh=False)
    if verdict.fresh and not verdict.ok:
        warnings.warn(verdict.line, UserWarning, stacklevel=2)
    return verdict


def _run_child(family: str, path: Path, timeout: float) -> ProbeVerdict:
    """Run :data:`_CHILD` once and read its verdict."""
    env = dict(os.environ)  # the child imports this same wflow and compiles into the same folder
    here = str(Path(__file__).resolve().parents[2])  # the folder holding wflow/
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    env.setdefault("WFLOW_KEOPS_CACHE", str(keops_cache_dir()))
    who = f"KeOps {_pykeops_version()} (CUDA {_cuda_version()})"
    what = "the kernel-sum formula" if family == "kernel_sums" else f"a {family} formula"
    t0 = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, family],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            cwd=path.parent,  # where a crash's core file, if any, lands
        )
    except subprocess.TimeoutExpired:
        found = f"did not compile and run {what} in {timeout:g} s"
        return _failed(who, found, path)
    seconds = time.perf_counter() - t0
    if done.returncode < 0:
        try:
            sig = signal.Signals(-done.returncode).name
        except ValueError:
            sig = f"signal {-done.returncode}"
        return _failed(who, f"crashed ({sig}) compiling {what} in a child process", path)
    said = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    try:
        report = json.loads(said[-1])
    except (IndexError, ValueError):
        last = (done.stderr.strip().splitlines() or ["no output"])[-1][:200]
        return _failed(
            who, f"failed on {what} in a child process (exit {done.returncode}: {last})", path
        )
    if not report.get("ok"):
        return _failed(who, f"failed on {what}: {report.get('error', '?')}", path)
    where = "a GPU" if report.get("gpu") else "the CPU"
    line = f"{who} compiled and ran {what} on {where} in {seconds:.1f} s"
    return ProbeVerdict(True, bool(report.get("gpu")), line, path, fresh=True)


def _failed(who: str, found: str, path: Path) -> ProbeVerdict:
    line = (
        f"{who} {found}: wflow does not use KeOps on this machine; choose backend='torch' "
        f"(pip install \".[torch]\") or 'numba' (verdict in {path}; delete it to probe again)"
    )
    return ProbeVerdict(False, False, line, path, fresh=True)


def _probe_child(family: str) -> None:
    """In the child: compile and run a small formula of ``family``; print one JSON line."""
    report: dict[str, object] = {"ok": False, "gpu": False}
    try:
        pykeops = import_pykeops()
        if pykeops is None:
            report["error"] = f"pykeops cannot be imported ({_IMPORT_ERROR})"
        else:
            report["gpu"] = _gpu_available(pykeops)
            rng = np.random.default_rng(0)
            x = rng.standard_normal((1, 20, 3))
            x /= np.linalg.norm(x, axis=-1, keepdims=True)
            w = np.full((1, 20), 1 / 20)
            problem = KernelProblem(
                x=x, y=x, weights=w, beta=3.0, Q=None, K=None, V=None, values=True
            )
            got = _backend(problem)
            assert got.vector is not None  # values=True
            dense = np.exp(3.0 * x[0] @ x[0].T) / 20  # the sums, unshifted
            s0 = np.exp(got.log_scale[0]) * got.mass[0]
            s1 = np.exp(got.log_scale[0])[:, None] * got.vector[0]
            err = max(
                float(np.max(np.abs(s0 / dense.sum(axis=1) - 1))),
                float(np.max(np.abs(s1 - dense @ x[0]) / dense.sum(axis=1)[:, None])),
            )
            report["ok"] = bool(err < 1e-10)
            if not report["ok"]:
                report["error"] = f"its sums differ from NumPy's by {err:.2g} relative"
    except Exception as exc:
        report["error"] = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:300]
    print(json.dumps(report))


class KeopsBackend:
    """Kernel sums with pykeops ``LazyTensor`` (see module docstring).

    ``"auto"`` picks it only when a GPU is present, the problem has at least
    ``min_pairs_auto`` pairs and :func:`keops_probe` found KeOps working on this machine.  It is
    not :meth:`available` where the probe failed (its line is the :attr:`reason`).

    Examples
    --------
    Not run (the first sum compiles a formula for minutes):

    >>> import numpy as np, wflow  # doctest: +SKIP
    >>> from wflow.kernels import kernel_sums  # doctest: +SKIP
    >>> x = wflow.sphere.uniform(4, 3, seed=0)  # doctest: +SKIP
    >>> s = kernel_sums(x, x, np.full(4, 0.25), 2.0, backend="keops")  # doctest: +SKIP
    >>> bool(np.allclose(np.exp(s.log_scale) * s.mass, np.exp(2.0 * x @ x.T).mean(axis=1)))  # doctest: +SKIP
    True
    """

    name = "keops"
    min_pairs_auto = 10**6

    def __init__(self) -> None:
        self._compiled: set[tuple] = set()

    @property
    def reason(self) -> str:
        failure = self.probe_failure()
        if failure:
            return failure
        import_pykeops()
        return _IMPORT_ERROR or ""

    def available(self) -> bool:
        return not self.probe_failure() and import_pykeops() is not None

    def probe_failure(self) -> str:
        """The failed probe's line, or ``""``.  With an NVIDIA driver the probe runs (once per
        machine); without one only a verdict already recorded counts."""
        verdict = keops_probe() if nvidia_driver_present() else recorded_verdict()
        return "" if verdict is None or verdict.ok else verdict.line

    def gpu(self) -> bool:
        if not nvidia_driver_present():
            return False
        pk = import_pykeops()
        return pk is not None and _gpu_available(pk)

    def accepts(self, problem: KernelProblem) -> bool:
        return True

    def accepts_auto(self, problem: KernelProblem) -> bool:
        if problem.pairs < self.min_pairs_auto or not nvidia_driver_present():
            return False
        verdict = keops_probe()  # before pykeops compiles anything in this process
        return verdict.ok and verdict.gpu and self.gpu()

    def __call__(self, problem: KernelProblem) -> KernelSums:
        pykeops = import_pykeops()
        if pykeops is None:
            raise WflowError(f"pykeops cannot be imported ({_IMPORT_ERROR}); use backend='numpy'")
        from pykeops.numpy import LazyTensor

        a, b, logw, c = problem.dense_operands()
        B, n, _ = a.shape
        dtype = a.dtype
        q = 0 if c is None else c.shape[-1]
        shift = np.empty((B, n), dtype=dtype)
        s0 = np.empty((B, n), dtype=dtype)
        s1 = None if c is None else np.empty((B, n, q), dtype=dtype)
        key = (a.shape[-1], q, dtype.name)
        for k in range(B):
            ones = np.ones((b.shape[1], 1), dtype=dtype)
            g = ones if c is None else np.concatenate([ones, c[k]], axis=1)
            ai = LazyTensor(np.ascontiguousarray(a[k])[:, None, :])
            bj = LazyTensor(np.ascontiguousarray(b[k])[None, :, :])
            lw = LazyTensor(np.ascontiguousarray(logw[k])[None, :, None])
            gj = LazyTensor(np.ascontiguousarray(g)[None, :, :])
            F = (ai | bj) + lw
            try:
                if key in self._compiled:
                    out = F.reduction("Max_SumShiftExpWeight", other=gj, axis=1)
                else:
                    sink = io.StringIO()
                    with compile_lock(keops_cache_dir()), contextlib.redirect_stdout(sink):
                        out = F.reduction("Max_SumShiftExpWeight", other=gj, axis=1)
                    self._compiled.add(key)
            except Exception as exc:
                raise WflowError(
                    f"KeOps could not compile or run the kernel-sum formula (d={a.shape[-1]}, values={q}, {dtype}): "
                    f"{type(exc).__name__}: {exc}. Check that g++ works and that {keops_cache_dir()} is writable, "
                    f"or use backend='numpy'"
                ) from exc
            out = np.asarray(out)
            shift[k] = out[:, 0]
            s0[k] = out[:, 1]
            if s1 is not None:
                s1[k] = out[:, 2:]
        return KernelSums(shift, s0, s1, self.name)


_backend = KeopsBackend()
register_backend(_backend, auto_priority=0)
