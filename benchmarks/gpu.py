"""Large particle counts on a GPU: the KeOps probe, direct kernel sums and particle runs, one run.

Run on a machine with a GPU::

    python -m benchmarks.gpu                        # N = 1e5, 1e6 sums; particles 1e4, 1e5 (< 8 min)
    python -m benchmarks.gpu --device cpu --quick   # small sizes, the CPU path (under a minute)

It prints, as Markdown:

1. the machine and the KeOps probe's verdict (:func:`wflow.kernels.keops_backend.keops_probe`;
   run only where an NVIDIA driver is present, as ``backend="auto"`` does);
2. one direct kernel sum (SA on S^2, beta = 9, uniform weights) at each N with each available
   backend: PyTorch on the device, KeOps where the probe passed on a GPU, and the numba and
   spectral CPU backends.  The direct CPU sum (numba) sums only ``rows`` query rows against all N
   sources and its full-N time is extrapolated; the others sum all N rows.  The error is the
   largest relative error of the softmax average against the NumPy backend in float64 on the
   first rows;
3. a particle run, ``wflow.simulate(wflow.SA(9.0), N tokens uniform on S^2, t = 0..30)`` with
   default tolerances, with each backend.  A run that would pass its time budget is stopped at
   the next of 60 save times (its last column says how far it got).

Each row gives wall seconds and the peak memory the call added: host (resident set, sampled
every 2 ms) and GPU (device memory in use, sampled likewise, so KeOps' allocations count too).
The whole run keeps to ``--budget`` seconds (default 420): rows that would start past it print
as skipped.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import wflow
from wflow.kernels import BACKENDS, kernel_sums
from wflow.kernels import keops_backend as kb
from wflow.kernels import torch_backend as tb

BETA = 9.0
T_END = 30.0
#: query rows of the direct CPU sums, and rows checked against the NumPy reference
ROWS = 2000
REF_ROWS = 200
#: (sum sizes, particle sizes, seconds a particle run may take)
FULL: tuple[tuple[int, ...], tuple[int, ...], float] = ((10**5, 10**6), (10**4, 10**5), 60.0)
QUICK: tuple[tuple[int, ...], tuple[int, ...], float] = ((1000, 3000), (64, 128), 30.0)
#: a particle run takes some 600 evaluations (dopri5 to t = 30); one whose evaluation, estimated from
#: the sums, would take more than its budget / SKIP_EVALUATIONS is not started
SKIP_EVALUATIONS = 30


class Sampler:
    """Peak host RSS and GPU memory in use while a block runs, above their levels before it."""

    def __init__(self, cuda: Any | None) -> None:
        self.cuda = cuda  # the torch module where a CUDA device is in use

    def _host(self) -> int:
        try:
            with open("/proc/self/statm") as fh:
                return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            return 0

    def _gpu(self) -> int:
        if self.cuda is None:
            return 0
        free, total = self.cuda.cuda.mem_get_info()
        return int(total - free)

    def run(self, f: Callable[[], Any]) -> tuple[Any, float, float, float]:
        """``(f(), seconds, host MB, GPU MB)``."""
        base = (self._host(), self._gpu())
        peak = list(base)
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.002):
                peak[0] = max(peak[0], self._host())
                peak[1] = max(peak[1], self._gpu())

        th = threading.Thread(target=sample, daemon=True)
        th.start()
        t0 = time.perf_counter()
        try:
            out = f()
        finally:
            seconds = time.perf_counter() - t0
            stop.set()
            th.join()
        return out, seconds, (peak[0] - base[0]) / 2**20, (peak[1] - base[1]) / 2**20


def _machine(device: str, torch: Any | None) -> list[str]:
    lines = [
        f"- python {platform.python_version()}, {os.cpu_count()} CPUs, wflow {wflow.__version__}"
    ]
    if torch is None:
        lines.append('- PyTorch: not installed (pip install ".[torch]"): no torch rows')
    else:
        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU visible"
        lines.append(f"- PyTorch {torch.__version__} (CUDA build {torch.version.cuda}): {gpu}")
    lines.append(
        f"- KeOps {kb._pykeops_version()}, CUDA driver {kb._cuda_version()}, "
        f"NVIDIA driver {'present' if kb.nvidia_driver_present() else 'absent'}; device {device}"
    )
    return lines


def _probe(timeout: float) -> tuple[str, bool]:
    """The probe's line, and whether KeOps rows are run (the probe passed on a GPU)."""
    if not kb.nvidia_driver_present():
        return "not run: no NVIDIA driver (backend='auto' never picks KeOps here)", False
    verdict = kb.keops_probe(timeout=timeout)
    return verdict.line, verdict.ok and verdict.gpu


def _backends(device: str, torch: Any | None, keops: bool) -> list[str]:
    names = []
    if torch is not None:
        names.append(f"torch:{device}")
    if keops:
        names.append("keops")
    return names + ["numba", "spectral"]


def _points(n: int, dtype: Any) -> np.ndarray:
    return wflow.sphere.uniform(n, 3, seed=0).astype(dtype)


def _sums_rows(
    sizes: Sequence[int],
    names: Sequence[str],
    sampler: Sampler,
    deadline: float,
    per_sum: dict[str, tuple[int, float]],
) -> list[str]:
    """The sums table; ``per_sum[name] = (N, full-N seconds)`` of the largest float64 sum."""
    rows = [
        "| N | backend | dtype | rows summed | seconds | full-N seconds | pairs/s | host MB | GPU MB | rel. error |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n in sizes:
        for dtype in (np.float32, np.float64):
            y = _points(n, dtype)
            w = np.full(n, 1.0 / n, dtype=dtype)
            ref = kernel_sums(
                y[:REF_ROWS].astype(np.float64), y.astype(np.float64), w.astype(np.float64), BETA,
                backend="numpy",
            ).softmax_average()  # fmt: skip
            for name in names:
                label = f"| {n} | {name} | {np.dtype(dtype).name} "
                if time.perf_counter() > deadline:
                    rows.append(label + "| skipped (time budget) | | | | | | |")
                    continue
                m = min(n, ROWS) if name == "numba" else n  # the direct CPU sum: some rows
                x = y[:m]
                kernel_sums(x[:1000], y, w, BETA, backend=name)  # compile, warm up: the same route
                out, sec, host, gpu = sampler.run(lambda: kernel_sums(x, y, w, BETA, backend=name))
                k = min(REF_ROWS, m)
                err = np.max(np.abs(out.softmax_average()[:k] - ref[:k])) / np.max(np.abs(ref[:k]))
                full = sec * n / m
                if dtype == np.float64:
                    per_sum[name] = (n, full)
                rows.append(
                    label + f"| {m} | {sec:.3g} | {full:.3g} | {m * n / sec:.3g} | {host:.0f} | "
                    f"{gpu:.0f} | {err:.1e} |"
                )
    return rows


def _particle_rows(
    sizes: Sequence[int],
    names: Sequence[str],
    sampler: Sampler,
    budget: float,
    deadline: float,
    per_sum: dict[str, tuple[int, float]],
) -> list[str]:
    rows = [
        "| N | backend | seconds | steps | evaluations | host MB | GPU MB | t reached |",
        "|---|---|---|---|---|---|---|---|",
    ]
    ts = np.linspace(0.0, T_END, 61)
    for n in sizes:
        mu0 = _points(n, np.float64)
        for name in names:
            label = f"| {n} | {name} "
            left = deadline - time.perf_counter()
            if left < 1.0:
                rows.append(label + "| skipped (time budget) | | | | | |")
                continue
            if name in per_sum:  # one evaluation: quadratic in N, linear for the spectral sums
                n_sum, sec_sum = per_sum[name]
                guess = sec_sum * (n / n_sum) ** (1 if name == "spectral" else 2)
                if guess * SKIP_EVALUATIONS > min(budget, left):
                    rows.append(label + f"| skipped: ~{guess:.2g} s an evaluation | | | | | |")
                    continue
            stop_at = time.perf_counter() + min(budget, left)
            reached = [0.0]

            def run() -> Any:
                def callback(t: float, mu: Any) -> bool:
                    reached[0] = t
                    return time.perf_counter() > stop_at

                options = _save_options(ts, callback)
                return wflow.simulate(wflow.SA(BETA), mu0, T_END, backend=name, **options)

            traj, sec, host, gpu = sampler.run(run)
            stats = traj.stats
            rows.append(
                label
                + f"| {sec:.3g} | {int(stats['steps'][-1])} | {int(stats['evaluations'][-1])} | "
                f"{host:.0f} | {gpu:.0f} | {reached[0]:g}{'' if reached[0] >= T_END else ' (budget)'} |"
            )
    return rows


def _save_options(ts: np.ndarray, callback: Callable[[float, Any], bool]) -> dict[str, Any]:
    """Save times with no diagnostics, only the last points kept, and the budget's callback."""
    if hasattr(wflow, "SaveAt"):
        save_at = wflow.SaveAt(ts, points=False, diagnostics=())
        return {"save_at": save_at, "trackers": [callback]}
    return {"save_at": ts, "diagnostics": (), "keep": False, "callback": callback}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu", description=__doc__.splitlines()[0]
    )
    p.add_argument("--device", choices=("cuda", "cpu"), default=None,
                   help="where the torch rows run (default: cuda when PyTorch sees a GPU, else cpu)")  # fmt: skip
    p.add_argument("--quick", action="store_true", help="small sizes (for a test of the script)")
    p.add_argument("--budget", type=float, default=420.0, help="seconds for the whole run")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    deadline = t0 + args.budget
    torch: Any = None
    if tb._torch_installed():
        import torch
    device = args.device or ("cuda" if torch is not None and torch.cuda.is_available() else "cpu")
    if device == "cuda":
        why = BACKENDS["torch"].on_device("cuda").reason  # type: ignore[attr-defined]
        if why:
            print(f"--device cuda: {why}", file=sys.stderr)
            return 2
    sizes = QUICK if args.quick else FULL
    sampler = Sampler(torch if device == "cuda" else None)
    print("## Machine\n")
    print("\n".join(_machine(device, torch)))
    line, keops = _probe(timeout=args.budget / 4)
    print(f"\n## KeOps probe\n\n{line}\n", flush=True)
    names = _backends(device, torch, keops)
    print(f"## Direct kernel sums, SA on S^2, beta = {BETA:g}\n")
    per_sum: dict[str, tuple[int, float]] = {}
    print("\n".join(_sums_rows(sizes[0], names, sampler, deadline, per_sum)), flush=True)
    print(f"\n## Particle runs, SA on S^2, beta = {BETA:g}, t = 0..{T_END:g} (dopri5, defaults)\n")
    rows = _particle_rows(sizes[1], names, sampler, sizes[2], deadline, per_sum)
    print("\n".join(rows))
    print(f"\nTotal: {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
