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
from .errors import StoreBusyError, WflowError

__all__ = ["main"]

EXIT_USAGE = 2
EXIT_FAILED = 1


def _keys_help() -> str:
    from .config import KEYS

    lines = [
        "configuration keys (TOML sections [model], [init], ... or --set section.key=value):",
        "",
    ]
    for key, spec in KEYS.items():
        choices = f" {{{', '.join(spec.choices)}}}" if spec.choices else ""
        lines.append(f"  {key:<26} {spec.type.__name__:<5} default {spec.default!r}{choices}")
        lines.append(f"  {'':<26} {spec.help}")
    lines += [
        "",
        "The default runs SA on S^2 with 2000 uniform tokens at beta = 9 until t = 30:",
        "metastable clusters that later merge.",
        "",
        "Every solver runs through one contract (docs/solvers.md): a problem (what moves), a solver",
        "from wflow.solvers.SOLVERS (euler, rk4, dopri5, euler-maruyama, ssprk3, ros2, jko: how one",
        "step is taken) and one driver (when: saves, step control, failures, recorder, --resume).",
    ]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="wflow", description="Mean-field dynamics of Transformers on the sphere."
    )
    p.add_argument("--version", action="version", version=f"wflow {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="log solver details")
    sub = p.add_subparsers(dest="command")
    r = sub.add_parser(
        "run",
        help="run a configuration (the embedded default if none is given)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=_keys_help(),
        description="Run a configuration and write the trajectory, its config and a figure.",
    )
    r.add_argument("config", nargs="?", help="TOML file with configuration keys (see below)")
    r.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a configuration key, e.g. --set model.beta=4 (repeatable)",
    )
    r.add_argument("--out", default="wflow-out", help="output folder (default: wflow-out)")
    r.add_argument("--resume", action="store_true", help="continue the interrupted run in --out")
    r.add_argument("--overwrite", action="store_true", help="replace an existing result in --out")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    w = sub.add_parser(
        "sweep",
        help="run a configuration over a grid of its keys on Dask, into one Zarr store",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=_keys_help(),
        description="Run a configuration (TOML, with an optional [sweep] table) over a grid of "
        "configuration keys on dask.distributed; every point's observables go to one "
        "Zarr store with the grid keys as coordinates. Running it again continues.",
    )
    w.add_argument(
        "config", nargs="?", help="TOML file with configuration keys and an optional [sweep] table"
    )
    w.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="KEY=VALUES",
        help="a grid axis: a list [1,4,9], linspace(a,b,n), logspace(a,b,n), range(n) or range(a,b), "
        "e.g. --grid 'model.beta=linspace(0.1,9,90)' --grid 'init.seed=range(2048)' (repeatable)",
    )
    w.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a key of the base configuration (repeatable)",
    )
    w.add_argument("--out", default="sweep.zarr", help="the sweep's store (default: sweep.zarr)")
    w.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        default=None,
        help="a running Dask scheduler, e.g. tcp://host:8786 (default: a LocalCluster on this machine)",
    )
    w.add_argument(
        "--workers",
        type=int,
        default=None,
        help="LocalCluster worker processes (default: the cores)",
    )
    w.add_argument(
        "--observable",
        dest="observables",
        action="append",
        default=None,
        metavar="NAME",
        help="recorded at every save: pair_fraction, energy, log_energy, order_parameter, n_clusters "
        "(repeatable; default: pair_fraction, energy, order_parameter, n_clusters); for the "
        "continuum solvers the scalars they save (eulerian: mass, energy; lagrangian: energy; "
        "zonal: mass, mean_z, energy; jko: energy, free_energy; default: all of them)",
    )
    w.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="seeds per task (default: ~64 MB of state per task)",
    )
    w.add_argument(
        "--overwrite", action="store_true", help="replace a store that holds another sweep"
    )
    w.add_argument("--no-progress", action="store_true", help="no progress bar")
    v = sub.add_parser(
        "validate",
        help="run validation studies and write a report folder",
        description="Run validation studies (all, or those named), write Markdown, CSV and PNG "
        "into --out, print a summary, exit 1 if an expectation fails or a study cannot run "
        "(it raises, or its module cannot be imported; the other studies still run).",
    )
    v.add_argument(
        "studies", nargs="*", help="studies to run (default: all): " + ", ".join(_study_names())
    )
    v.add_argument("--quick", action="store_true", help="a few minutes (what CI runs)")
    v.add_argument(
        "--out", default="wflow-validation", help="report folder (default: wflow-validation)"
    )
    v.add_argument(
        "--workers",
        type=int,
        default=1,
        help="Dask worker processes for studies split into parts (phase-diagram, perceptron; "
        "default 1: in order, in this process)",
    )
    return p


def _study_names() -> list[str]:
    from .studies.report import GROUPS, STUDIES, load_all

    load_all()  # a module that cannot be imported is reported when the studies run
    return list(STUDIES) + [f"{g} (= {' '.join(names)})" for g, names in GROUPS.items()]


def _validate(args: argparse.Namespace) -> int:
    from .studies import run_studies

    out = Path(args.out)
    if args.workers < 1:
        raise ValueError(f"--workers must be an integer >= 1, got {args.workers}")
    reports = run_studies(args.studies or None, out, args.quick, workers=args.workers)
    width = max((len(e.name) for r in reports for e in r.expectations), default=20)
    for rep in reports:
        if rep.error is not None:  # one line: the study could not run
            print(f"{rep.name}: FAILED, could not run: {rep.error} -> {out / (rep.name + '.md')}")
            continue
        print(
            f"{rep.name}: {'passed' if rep.passed else 'FAILED'} ({rep.seconds:.0f} s) -> {out / (rep.name + '.md')}"
        )
        if not rep.expectations:
            print("  FAIL the study stated no expectation")
        for e in rep.expectations:
            print(
                f"  {'ok  ' if e.passed else 'FAIL'} {e.name:<{width}} {e.value:>11.4g}  {e.target}"
            )
    return EXIT_FAILED if any(not rep.passed for rep in reports) else 0


STORES = {
    "particles": "trajectory.zarr",
    "lagrangian": "trajectory.zarr",
    "eulerian": "density.zarr",
    "jko": "density.zarr",
    "zonal": "density.zarr",
}


def _store_of(out: Path) -> Path | None:
    for name in ("trajectory.zarr", "density.zarr"):
        if (out / name).exists():
            return out / name
    return None


def _run(args: argparse.Namespace) -> int:
    """``wflow run``: build the configuration's problem, run it through the driver with a recorder.

    Every solver takes the same path: one store, one recorder, one resume (:func:`wflow.resume`).
    Everything is validated before anything is written or deleted; the output folder is locked
    (one writer) for the whole run.
    """
    from .config import apply_overrides, check_resources, load_config, start_run

    out = Path(args.out)
    progress = not args.no_progress
    if args.resume:
        if args.config or args.overrides:
            raise ValueError(
                "--resume continues the stored configuration; do not pass a config file or --set"
            )
        if not out.is_dir():
            raise FileNotFoundError(f"--resume: no interrupted run in {out}")
        with _locked(out):
            return _resume(out, progress)
    cfg = apply_overrides(load_config(args.config), args.overrides)
    check_resources(cfg, out)  # memory and disk, before anything is allocated
    run = start_run(
        cfg
    )  # builds everything (and validates it) before anything is written or deleted
    with _locked(out):
        existing = _store_of(out)
        if existing is not None and not args.overwrite:
            raise FileExistsError(
                f"{existing} exists; use --resume to continue it, --overwrite to replace it, "
                f"or another --out"
            )
        return _fresh(cfg, run, out, progress, existing)


def _locked(out: Path):
    """The output folder's lock (created with the folder); one line and exit 2 when it cannot be had."""
    from . import io

    try:
        out.mkdir(parents=True, exist_ok=True)
        return io.FolderLock(out / ".wflow.lock", f"output folder {out}").acquire()
    except OSError as exc:
        raise ValueError(
            f"--out {out}: cannot create or write the folder ({exc.strerror or exc})"
        ) from None


def _fresh(cfg: dict, run, out: Path, progress: bool, existing: Path | None) -> int:
    from . import io
    from .config import to_toml

    t_start = time.perf_counter()
    store = out / STORES[cfg["solver"]]
    if existing is not None:
        import shutil

        shutil.rmtree(existing)
    for name in ("steps.csv", "summary.png", "animation.gif"):
        (out / name).unlink(missing_ok=True)
    (out / "config.toml").write_text(to_toml(cfg))
    print(f"wflow {__version__}: {run.describe} -> {store}", flush=True)
    recorder = io.ZarrRecorder(store, overwrite=True, attrs={"run_config": cfg})
    result = run.execute([recorder], progress=progress, out=out)
    return _finish(result, store, out, cfg, t_start)


def _resume(out: Path, progress: bool) -> int:
    """Continue the run in ``out`` from its last committed snapshot (or afresh when none was committed)."""
    from . import io
    from .config import load_config, start_run
    from .solvers.runs import resume

    t_start = time.perf_counter()
    toml = out / "config.toml"
    store = _store_of(out)
    committed = io.committed_length(store) if store is not None else 0
    if committed == 0:
        if not toml.exists():
            raise FileNotFoundError(
                f"--resume: no interrupted run in {out} (no committed snapshot, no config.toml)"
            )
        cfg = load_config(toml)
        print(
            f"wflow {__version__}: no committed snapshot in {out}: starting afresh from {toml}",
            flush=True,
        )
        return _fresh(cfg, start_run(cfg), out, progress, store)
    cfg = _stored_run_config(store)
    if toml.exists():
        edited = load_config(toml)
        diff = sorted(k for k in set(cfg) | set(edited) if cfg.get(k) != edited.get(k))
        if diff:
            what = ", ".join(
                f"{k} (stored {cfg.get(k)!r}, config.toml {edited.get(k)!r})" for k in diff
            )
            raise ValueError(
                f"--resume: {toml} differs from the stored run in {what}; a resumed run continues the "
                f"stored configuration: undo the edit, or start a new run (--overwrite or another --out)"
            )
    trackers = []
    if cfg["solver"] == "jko":
        from .solvers.trackers import StepLog

        trackers.append(StepLog(out / "steps.csv", append=True))
    print(f"wflow {__version__}: resuming {store} ({committed} snapshots committed)", flush=True)
    result = resume(store, progress=progress, trackers=trackers, keep=False)
    return _finish(result, store, out, cfg, t_start)


def _finish(result, store: Path, out: Path, cfg: dict, t_start: float) -> int:
    from . import io

    if result.status < 0:
        kept = io.committed_length(store)
        print(
            f"wflow: solver stopped: {result.message} ({kept} snapshots kept in {store})",
            file=sys.stderr,
        )
        return EXIT_FAILED
    _summary(store, out, cfg, time.perf_counter() - t_start)
    return 0


def _stored_run_config(store: Path) -> dict:
    import json

    import zarr

    attrs = dict(zarr.open_group(store, mode="r").attrs)
    if "run_config" not in attrs:
        raise WflowError(
            f"{store} was not written by `wflow run` (no run_config); resume it with wflow.resume()"
        )
    rc = attrs["run_config"]
    return json.loads(rc) if isinstance(rc, str) else rc


def _summary(store: Path, out: Path, cfg: dict, elapsed: float) -> None:
    """One summary line and the figure of a finished run, read back from its store."""
    import numpy as np

    from .solvers.runs import load

    res = load(store)
    steps, evals = int(res.stats["steps"][-1]), int(res.stats["evaluations"][-1])
    print(
        f"{res.kind}: {store} ({len(res.times)} snapshots, {steps} steps, {evals} evaluations, {elapsed:.1f} s)"
    )
    if res.kind in ("particles", "lagrangian"):
        line = []
        first = lambda a, i: float(np.ravel(a[i])[0])  # noqa: E731 - system 0
        if "energy" not in res.data:
            line.append("energy: absent (the model is not a gradient flow)")
        elif np.all(np.isfinite(res.data["energy"][1])):
            e = res.data["energy"][1]
            line.append(f"energy: {first(e, 0):.6g} -> {first(e, -1):.6g}")
        elif "log_energy" in res.data:
            le = res.data["log_energy"][1]
            line.append(
                f"energy: beyond float64 at this beta; log energy: {first(le, 0):.6g} -> {first(le, -1):.6g}"
            )
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


def _sweep(args: argparse.Namespace) -> int:
    """``wflow sweep``: a configuration over a grid, on Dask, into one store (docs: sweeps)."""
    from .config import apply_overrides, default_config
    from .sweep import load_sweep_config, parse_grid_args, sweep

    if not args.verbose:  # dask.distributed logs every worker's start and stop at INFO
        for name in (
            "distributed",
            "distributed.scheduler",
            "distributed.nanny",
            "distributed.core",
            "distributed.http.proxy",
            "distributed.diskutils",
        ):
            logging.getLogger(name).setLevel(logging.WARNING)
    cfg, grid = load_sweep_config(args.config) if args.config else (default_config(), {})
    cfg = apply_overrides(cfg, args.overrides)
    grid.update(parse_grid_args(args.grid))
    ds = sweep(
        cfg,
        grid,
        out=args.out,
        scheduler=args.scheduler,
        workers=args.workers,
        observables=args.observables,
        batch_size=args.batch_size,
        overwrite=args.overwrite,
        progress=not args.no_progress,
    )
    print(
        f"sweep: {args.out}: {ds.attrs['ok']} of {ds.attrs['points']} points reached t_end, "
        f"{ds.attrs['failed']} failed"
    )
    return EXIT_FAILED if ds.attrs["failed"] else 0


def main(argv: list[str] | None = None) -> int:
    """The ``wflow`` command: ``run``, ``sweep``, ``validate``; returns the exit status.

    0 on success, 1 when a validation expectation failed, 2 for bad input (one line on stderr,
    nothing written), 130 when interrupted.

    Examples
    --------
    >>> main(["validate", "no-such-study"])
    2
    """
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING, format="%(name)s: %(message)s"
    )
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "validate":
            return _validate(args)
        if args.command == "sweep":
            return _sweep(args)
    except (ValueError, TypeError, FileExistsError, FileNotFoundError) as exc:
        print(f"wflow: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except StoreBusyError as exc:
        print(f"wflow: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except WflowError as exc:
        print(f"wflow: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        # a write in flight on Zarr's IO thread is abandoned (it was not committed): asyncio would report its
        # pending task at exit; the store is consistent, so the one line below is all there is to say
        logging.getLogger("asyncio").disabled = True
        if args.command == "validate":
            print(
                "wflow: interrupted; finished parts of the studies are kept (run the same command again)",
                file=sys.stderr,
            )
        else:
            again = (
                "run it again" if args.command == "sweep" else "continue with wflow run --resume"
            )
            print(f"wflow: interrupted; committed snapshots are kept ({again})", file=sys.stderr)
        return 130
    return EXIT_USAGE  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
