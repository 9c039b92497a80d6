"""KeOps (pykeops) kernel sums: streaming, memory-free, compiled per formula; GPU when present.

The formula is KeOps' ``Max_SumShiftExpWeight`` reduction, which returns exactly the
row maximum :math:`c_i` of :math:`\\ell_{ij} + \\log w_j` and
:math:`\\sum_j e^{\\ell_{ij} + \\log w_j - c_i} (1, V y_j)` in one streamed pass.

Compiled formulas are cached in :func:`keops_cache_dir` (override with
the environment variable ``WFLOW_KEOPS_CACHE``), one folder per KeOps version, so a
new machine or a new host name does not silently recompile into ``~/.cache``.  The
first use of each (dimension, dtype) compiles with g++ for 10--25 s; a file lock
keeps two processes from compiling the same formula at once.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import pickle
import sys
from pathlib import Path

import numpy as np

from ..errors import WflowError
from .sums import KernelProblem, KernelSums, register_backend

__all__ = ["KeopsBackend", "import_pykeops", "keops_cache_dir", "nvidia_driver_present"]

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
    try:
        from importlib.metadata import version

        v = version("pykeops")
    except Exception:
        v = "unknown"
    return Path(base) / "wflow" / f"keops-{v}"


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
    for attempt in (1, 2):
        try:
            _PYKEOPS = _import_quietly(folder)
            break
        except (pickle.UnpicklingError, EOFError) as exc:
            # a truncated index of KeOps' cache (a process killed, or stopped by a full disk or a file
            # size limit, while KeOps saved it at exit): the index is only a cache, so wflow's folder
            # drops it and KeOps rebuilds it; the compiled formulas stay
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
    folder.mkdir(parents=True, exist_ok=True)
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


def nvidia_driver_present() -> bool:
    """Whether this machine has an NVIDIA driver at all (without importing pykeops, which takes seconds,
    prints CUDA warnings on a CPU machine and leaves a cache writer to run at exit)."""
    import shutil

    return os.path.exists("/proc/driver/nvidia/version") or shutil.which("nvidia-smi") is not None


def _gpu_available(pykeops) -> bool:
    try:
        return bool(pykeops.pykeopsconfig.pykeops_cuda.get_use_cuda())
    except Exception:
        return False


@contextlib.contextmanager
def compile_lock(folder: Path):
    try:
        import fcntl
    except ImportError:  # not on POSIX: no lock
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "wflow-compile.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class KeopsBackend:
    """Kernel sums with pykeops ``LazyTensor`` (see module docstring).

    ``"auto"`` picks it only when a GPU is present and the problem has at least
    ``min_pairs_auto`` pairs; on a CPU the dense and fast CPU backends are faster.

    Examples
    --------
    ``available()`` and a kernel sum import pykeops (and the first sum compiles a formula,
    which takes minutes), so the example is not run:

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
        import_pykeops()
        return _IMPORT_ERROR or ""

    def available(self) -> bool:
        return import_pykeops() is not None

    def gpu(self) -> bool:
        if not nvidia_driver_present():
            return False
        pk = import_pykeops()
        return pk is not None and _gpu_available(pk)

    def accepts(self, problem: KernelProblem) -> bool:
        return True

    def accepts_auto(self, problem: KernelProblem) -> bool:
        return problem.pairs >= self.min_pairs_auto and self.gpu()

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
