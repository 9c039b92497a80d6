"""The ``wflow`` command.

``wflow run [CONFIG.toml] [--set key=value ...] [--out DIR] [--resume]`` runs a
configuration (the embedded default without arguments), writes ``DIR/trajectory.zarr``
snapshot by snapshot, ``DIR/config.toml`` and ``DIR/summary.png``, and prints where
they are.  Bad input is reported in one line with a non-zero exit status.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from ._version import __version__
from .errors import WflowError

__all__ = ["main"]

EXIT_USAGE = 2
EXIT_FAILED = 1


def _keys_help() -> str:
    from .config import KEYS

    lines = ["configuration keys (TOML sections [model], [init], ... or --set section.key=value):", ""]
    for key, spec in KEYS.items():
        choices = f" {{{', '.join(spec.choices)}}}" if spec.choices else ""
        lines.append(f"  {key:<26} {spec.type.__name__:<5} default {spec.default!r}{choices}")
        lines.append(f"  {'':<26} {spec.help}")
    lines += ["", "The default runs SA on S^2 with 2000 uniform tokens at beta = 9 until t = 30:",
              "metastable clusters that later merge."]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="wflow", description="Mean-field dynamics of Transformers on the sphere.")
    p.add_argument("--version", action="version", version=f"wflow {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="log solver details")
    sub = p.add_subparsers(dest="command")
    r = sub.add_parser("run", help="run a configuration (the embedded default if none is given)",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_keys_help(),
                       description="Run a configuration and write the trajectory, its config and a figure.")
    r.add_argument("config", nargs="?", help="TOML file with configuration keys (see below)")
    r.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a configuration key, e.g. --set model.beta=4 (repeatable)")
    r.add_argument("--out", default="wflow-out", help="output folder (default: wflow-out)")
    r.add_argument("--resume", action="store_true", help="continue the interrupted run in --out")
    r.add_argument("--overwrite", action="store_true", help="replace an existing result in --out")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    v = sub.add_parser("validate", help="run validation studies and write a report folder",
                       description="Run validation studies (all, or those named), write Markdown, CSV and PNG "
                                   "into --out, print a summary, exit 1 if an expectation fails.")
    v.add_argument("studies", nargs="*", help="studies to run (default: all): " + ", ".join(_study_names()))
    v.add_argument("--quick", action="store_true", help="a few minutes (what CI runs)")
    v.add_argument("--out", default="wflow-validation", help="report folder (default: wflow-validation)")
    return p


def _study_names() -> list[str]:
    from .validate import STUDIES

    return list(STUDIES)


def _validate(args: argparse.Namespace) -> int:
    from .validate import run_studies

    out = Path(args.out)
    reports = run_studies(args.studies or None, out, args.quick)
    width = max(len(e.name) for r in reports for e in r.expectations) if reports else 20
    failed = 0
    for rep in reports:
        print(f"{rep.name}: {'passed' if rep.passed else 'FAILED'} ({rep.seconds:.0f} s) -> {out / (rep.name + '.md')}")
        for e in rep.expectations:
            failed += not e.passed
            print(f"  {'ok  ' if e.passed else 'FAIL'} {e.name:<{width}} {e.value:>11.4g}  {e.target}")
    return EXIT_FAILED if failed else 0


STORES = {"particles": "trajectory.zarr", "lagrangian": "trajectory.zarr", "eulerian": "density.zarr",
          "jko": "density.zarr"}


def _store_of(out: Path) -> Path | None:
    for name in ("trajectory.zarr", "density.zarr"):
        if (out / name).exists():
            return out / name
    return None


def _run(args: argparse.Namespace) -> int:
    """``wflow run``: build the configuration's problem, run it through the driver with a recorder.

    Every solver takes the same path: one store, one recorder, one resume (:func:`wflow.resume`).
    """
    from . import io
    from .config import apply_overrides, load_config, start_run, to_toml
    from .solvers.runs import resume

    out = Path(args.out)
    t_start = time.perf_counter()
    progress = not args.no_progress
    if args.resume:
        if args.config or args.overrides:
            raise ValueError("--resume continues the stored configuration; do not pass a config file or --set")
        store = _store_of(out)
        if store is None:
            raise FileNotFoundError(f"--resume: no interrupted run in {out} (no trajectory.zarr or density.zarr)")
        cfg = _stored_run_config(store)
        trackers = []
        if cfg["solver"] == "jko":
            from .solvers.trackers import StepLog

            trackers.append(StepLog(out / "steps.csv", append=True))
        print(f"wflow {__version__}: resuming {store} ({io.committed_length(store)} snapshots committed)", flush=True)
        result = resume(store, progress=progress, trackers=trackers, keep=False)
    else:
        cfg = apply_overrides(load_config(args.config), args.overrides)
        store = out / STORES[cfg["solver"]]
        existing = _store_of(out)
        if existing is not None and not args.overwrite:
            raise FileExistsError(f"{existing} exists; use --resume to continue it, --overwrite to replace it, "
                                  f"or another --out")
        run = start_run(cfg)  # builds everything (and validates) before anything is written or deleted
        out.mkdir(parents=True, exist_ok=True)
        if existing is not None and existing != store:
            import shutil

            shutil.rmtree(existing)
        (out / "config.toml").write_text(to_toml(cfg))
        print(f"wflow {__version__}: {run.describe} -> {store}", flush=True)
        recorder = io.ZarrRecorder(store, overwrite=args.overwrite, attrs={"run_config": cfg})
        result = run.execute([recorder], progress=progress, out=out)
    if result.status < 0:
        kept = io.committed_length(store)
        print(f"wflow: solver stopped: {result.message} ({kept} snapshots kept in {store})", file=sys.stderr)
        return EXIT_FAILED
    _summary(store, out, cfg, time.perf_counter() - t_start)
    return 0


def _stored_run_config(store: Path) -> dict:
    import json

    import zarr

    attrs = dict(zarr.open_group(store, mode="r").attrs)
    if "run_config" not in attrs:
        raise WflowError(f"{store} was not written by `wflow run` (no run_config); resume it with wflow.resume()")
    rc = attrs["run_config"]
    return json.loads(rc) if isinstance(rc, str) else rc


def _summary(store: Path, out: Path, cfg: dict, elapsed: float) -> None:
    """One summary line and the figure of a finished run, read back from its store."""
    import numpy as np

    from .solvers.runs import load

    res = load(store)
    steps, evals = int(res.stats["steps"][-1]), int(res.stats["evaluations"][-1])
    print(f"{res.kind}: {store} ({len(res.times)} snapshots, {steps} steps, {evals} evaluations, {elapsed:.1f} s)")
    if res.kind in ("particles", "lagrangian"):
        e = res.data.get("energy", (None, np.array([np.nan])))[1]
        line = []
        if np.all(np.isfinite(e)):
            line.append(f"energy: {float(np.ravel(e[0])[0]):.6g} -> {float(np.ravel(e[-1])[0]):.6g}")
        else:
            line.append("energy: absent (" + ("the model is not a gradient flow" if not _is_gradient(res.config)
                                              else "not representable in floating point at this beta") + ")")
        if "n_clusters" in res.data:
            c = res.data["n_clusters"][1]
            line.append(f"clusters: {int(np.ravel(c[0])[0])} -> {int(np.ravel(c[-1])[0])}")
        print("; ".join(line))
    else:
        mass = res.data["mass"][1] if "mass" in res.data else res.weights.sum(axis=1)
        print(f"mass {mass[0]:.15g} -> {mass[-1]:.15g}")
    if cfg["output.figure"]:
        from .plot import plot_trajectory

        plot_trajectory(res, out / "summary.png")
        print(f"figure: {out / 'summary.png'}")
    if cfg.get("output.animation"):
        from .plot import animate

        animate(res, out / "animation.gif")
        print(f"animation: {out / 'animation.gif'}")


def _is_gradient(config: dict) -> bool:
    from .models import model_from_dict

    return model_from_dict(config["model"]).is_gradient


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "validate":
            return _validate(args)
    except (ValueError, TypeError, FileExistsError, FileNotFoundError) as exc:
        print(f"wflow: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except WflowError as exc:
        print(f"wflow: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("wflow: interrupted; committed snapshots are kept (continue with wflow run --resume)", file=sys.stderr)
        return 130
    return EXIT_USAGE  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
