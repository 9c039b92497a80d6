"""What the atomic commit and the checksums cost per snapshot: today's recorder against the writer it replaced.

Run ``python -m benchmarks.store [--old PATH]``.  Writes 20 snapshots of N particles on S^2
(points, the default diagnostics, statistics) for N = 1e4 and 1e5 and prints the median time per
snapshot of:

* ``recorder``: :class:`wflow.io.ZarrRecorder` as it is (chunks with zstd + CRC32C, the
  snapshot's digests keyed by variable and snapshot, then the commit record: temporary file,
  fsync, rename, fsync of the folder);
* ``no commit, no crc``: the same chunk writes with zstd only, no digests and no commit record
  (what the atomicity and the checks add is the difference);
* ``old writer`` (with ``--old``, a checkout before the contract): xarray ``to_zarr`` appends, one
  per snapshot, as wflow wrote stores before (no atomicity, no checksums), timed in that checkout.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np


def _snapshots(n: int, k: int):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    for i in range(k):
        yield SimpleNamespace(
            index=i,
            t=0.1 * i,
            data={
                "points": (("particle", "coord"), x + 1e-3 * i),
                "energy": ((), np.float64(1.0 + i)),
                "log_energy": ((), np.float64(0.1 * i)),
                "order_parameter": ((), np.float64(0.5)),
                "n_clusters": ((), np.int64(3)),
            },
            stats={"steps": i, "rejected": 0, "evaluations": 7 * i},
            control={"dt_next": 0.01},
            checkpoint={},
        )


def time_recorder(n: int, k: int, plain: bool) -> float:
    from wflow import io
    from wflow.io import recorder

    folder = Path(tempfile.mkdtemp())
    saved = (recorder._codecs, recorder._write_commit)
    if plain:
        import zarr

        recorder._codecs = lambda: (zarr.codecs.ZstdCodec(level=1),)
        recorder._write_commit = lambda path, length, *chain: None
    try:
        rec = io.ZarrRecorder(folder / "t.zarr")
        if plain:
            rec._chain = None  # no snapshot digests either
        rec.start(
            SimpleNamespace(
                save_times=np.arange(k),
                problem=SimpleNamespace(kind="particles"),
                solver=SimpleNamespace(name="rk4"),
                config={"n": n},
                static={"weights": (("particle",), np.full(n, 1 / n))},
            )
        )
        times = []
        for snap in _snapshots(n, k):
            t0 = time.perf_counter()
            rec.save(snap)
            times.append(time.perf_counter() - t0)
        rec.close()
        return float(np.median(times[1:]))  # the first snapshot creates the store
    finally:
        recorder._codecs, recorder._write_commit = saved
        shutil.rmtree(folder)


OLD = """
import json, tempfile, time, shutil, numpy as np
from pathlib import Path
from wflow import io
n, k = {n}, {k}
rng = np.random.default_rng(0)
x = rng.normal(size=(n, 3)); x /= np.linalg.norm(x, axis=1, keepdims=True)
cfg = {{"batch_shape": [], "n": n, "d": 3, "solver": "particles"}}
folder = Path(tempfile.mkdtemp())
w = io.ZarrWriter(folder / "t.zarr")
times = []
for i in range(k):
    snap = {{"time": 0.1 * i, "points": x + 1e-3 * i, "weights": np.full(n, 1 / n), "config": cfg,
            "diagnostics": {{"energy": 1.0 + i, "order_parameter": 0.5, "n_clusters": 3}},
            "stats": {{"steps": i, "rejected": 0, "evaluations": 7 * i}}, "dt_next": 0.01}}
    t0 = time.perf_counter(); w.write(snap); times.append(time.perf_counter() - t0)
shutil.rmtree(folder)
print(json.dumps(float(np.median(times[1:]))))
"""


def time_old(tree: str, n: int, k: int) -> float:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(OLD.format(n=n, k=k))],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=tree),
        cwd=tree,
    )
    if out.returncode:
        raise RuntimeError(out.stderr[-1500:])
    return float(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--old", default=None, help="checkout of the code before the contract (its ZarrWriter)"
    )
    p.add_argument("--snapshots", type=int, default=20)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    print(
        f"python -m benchmarks.store{' --old ' + args.old if args.old else ''}  (load {os.getloadavg()[0]:.1f}; "
        f"medians over {args.snapshots - 1} snapshots, then over {args.repeat} rounds)"
    )
    print(
        "| N | recorder (ms) | no commit, no crc (ms) | overhead | old writer (ms) | recorder / old |"
    )
    print("|---|---|---|---|---|---|")
    for n in (10_000, 100_000):
        rec, plain, old = [], [], []
        for _ in range(args.repeat):  # round robin: the machine is shared
            rec.append(time_recorder(n, args.snapshots, plain=False))
            plain.append(time_recorder(n, args.snapshots, plain=True))
            if args.old:
                old.append(time_old(args.old, n, args.snapshots))
        r, q = np.median(rec), np.median(plain)
        o = np.median(old) if old else np.nan
        print(
            f"| {n:.0e} | {1e3 * r:.2f} | {1e3 * q:.2f} | {100 * (r - q) / r:+.0f} % | {1e3 * o:.2f} | "
            f"{r / o:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
