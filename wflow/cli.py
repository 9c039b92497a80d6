"""The ``wflow`` command.

``wflow run [CONFIG.toml] [--set key=value ...] [--out DIR] [--resume]`` runs a
configuration (the embedded default without arguments), writes ``DIR/trajectory.zarr``
snapshot by snapshot, ``DIR/config.toml`` and ``DIR/summary.png``, and prints where
they are.  Bad input is reported in one line with a non-zero exit status.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import sys
import threading
import time
import warnings
from io import TextIOWrapper
from pathlib import Path
from typing import Any, cast

from ._version import __version__

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
    ]
    return "\n".join(lines)


def _parser(list_studies: bool = True) -> argparse.ArgumentParser:
    """The command line; ``list_studies=False`` leaves the study names out (listing imports every study)."""
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
    _add_set(r, "override a configuration key, e.g. --set model.beta=4 (repeatable)")
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
    _add_set(w, "override a key of the base configuration (repeatable)")
    w.add_argument("--out", default="sweep.zarr", help="the sweep's store (default: sweep.zarr)")
    w.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="a running Dask scheduler, e.g. tcp://host:8786 (default: a LocalCluster on this machine)",
    )
    w.add_argument("--workers", type=int, help="LocalCluster worker processes (default: the cores)")
    w.add_argument(
        "--observable",
        dest="observables",
        action="append",
        metavar="NAME",
        help="recorded at every save: pair_fraction, energy, log_energy, order_parameter, n_clusters "
        "(repeatable; default: pair_fraction, energy, order_parameter, n_clusters); for the "
        "continuum solvers the scalars they save (eulerian: mass, energy; lagrangian: energy; "
        "zonal: mass, mean_z, energy; jko: energy, free_energy; default: all of them)",
    )
    w.add_argument(
        "--batch-size", type=int, help="seeds per task (default: ~64 MB of state per task)"
    )
    w.add_argument(
        "--overwrite", action="store_true", help="replace a store that holds another sweep"
    )
    w.add_argument("--no-progress", action="store_true", help="no progress bar")
    rp = sub.add_parser(
        "repair",
        help="make the sound snapshots of a damaged store its committed ones (then --resume)",
        description="Check every snapshot of a wflow store (trajectory.zarr, density.zarr) and make "
        "the longest run of sound ones from the first its committed snapshots, so that it loads "
        "and resumes; prints what was kept and why the rest was dropped. Deletes nothing.",
    )
    rp.add_argument("store", help="the store, or a wflow run folder holding one")
    v = sub.add_parser(
        "validate",
        help="run validation studies and write a report folder",
        description="Run validation studies (all, or those named), write Markdown, CSV and PNG "
        "into --out, print a summary, exit 1 if an expectation fails, a study cannot run "
        "(it raises, or its module cannot be imported; the other studies still run) or a study "
        "is skipped (an optional package or data set is missing) without --allow-skips.",
    )
    names = ": " + ", ".join(_study_names()) if list_studies else ""
    v.add_argument("studies", nargs="*", help="studies to run (default: all)" + names)
    v.add_argument("--quick", action="store_true", help="a few minutes (what CI runs)")
    v.add_argument(
        "--out", default="wflow-validation", help="report folder (default: wflow-validation)"
    )
    v.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of the named studies, repeatable (perceptron: convention=code|poster, "
        "the descent's sign convention; default code)",
    )
    v.add_argument(
        "--allow-skips",
        action="store_true",
        help="exit 0 when studies are skipped for a missing optional package or data set "
        "(they are still reported as skipped)",
    )
    v.add_argument(
        "--workers",
        type=int,
        default=1,
        help="Dask worker processes for studies split into parts (phase-diagram, perceptron; "
        "default 1: in order, in this process)",
    )
    v.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress lines on stderr (the studies' phases)",
    )
    return p


def _add_set(parser: argparse.ArgumentParser, text: str) -> None:
    """The repeatable ``--set KEY=VALUE`` of ``run`` and ``sweep``."""
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=text
    )


def _study_names() -> list[str]:
    from .studies.report import GROUPS, STUDIES, load_all

    load_all()  # a module that cannot be imported is reported when the studies run
    return list(STUDIES) + [f"{g} (= {' '.join(names)})" for g, names in GROUPS.items()]


def _validate(args: argparse.Namespace) -> int:
    from .runfolder import claim_report_folder
    from .studies import STUDIES, load_all, run_studies
    from .studies.report import check_options, unknown_studies

    if args.workers < 1:
        raise ValueError(f"--workers must be an integer >= 1, got {args.workers}")
    unknown = unknown_studies(args.studies, load_all())  # (before the report folder is made)
    options = {}
    for item in args.option:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"--option must be KEY=VALUE, got {item!r}")
        options[key.strip()] = value.strip()
    if not unknown:
        check_options(args.studies or list(STUDIES), options)  # (before the report folder is made)
    out = claim_report_folder(args.out, list(STUDIES))  # wflow writes only into its own folders
    mode = "quick" if args.quick else "full"

    def start(name: str, k: int, total: int) -> None:  # a line before each study: where the run is
        print(f"[{k}/{total}] {name} ({mode}) ...", flush=True)

    def done(rep) -> None:  # and its verdict as soon as it is known
        report = out / (rep.name + ".md")
        if rep.error is not None:  # one line: the study could not run
            print(f"{rep.name}: FAILED, could not run: {rep.error} -> {report}", flush=True)
            return
        if rep.skipped is not None:  # one line: an optional package or data set is missing
            print(f"{rep.name}: skipped, {rep.skipped}", flush=True)
            return
        verdict = "passed" if rep.passed else "FAILED"
        print(f"{rep.name}: {verdict} ({rep.seconds:.0f} s) -> {report}")
        if not rep.expectations:
            print("  FAIL the study stated no expectation")
        width = max((len(e.name) for e in rep.expectations), default=20)
        for e in rep.expectations:
            print(
                f"  {'ok  ' if e.passed else 'FAIL'} {e.name:<{width}} {e.value:>11.4g}  {e.target}"
            )
        sys.stdout.flush()

    reports = run_studies(
        args.studies or None,
        out,
        args.quick,
        workers=args.workers,
        options=options,
        on_start=start,
        on_done=done,
        progress=not args.no_progress,
    )
    skipped = [rep.name for rep in reports if rep.skipped is not None and rep.error is None]
    failed = [rep.name for rep in reports if not rep.passed]
    passed = len(reports) - len(failed) - len(skipped)
    print(
        f"{passed} passed"
        + (f", {len(failed)} failed ({', '.join(failed)})" if failed else "")
        + (f", {len(skipped)} skipped ({', '.join(skipped)})" if skipped else "")
        + (" (skips allowed)" if skipped and args.allow_skips else "")
    )
    if skipped and not failed and not args.allow_skips:
        print(
            "wflow validate: studies were skipped; install what they name, or pass --allow-skips",
            file=sys.stderr,
        )
    return EXIT_FAILED if failed or (skipped and not args.allow_skips) else 0


def _run(args: argparse.Namespace) -> int:
    """``wflow run``: every solver through the driver with a recorder, validated before anything is written."""
    from .config import apply_overrides, load_config, start_run
    from .runfolder import RunFolder, check_resources

    folder = RunFolder(args.out)
    progress = not args.no_progress
    if args.resume:
        if args.config or args.overrides:
            raise ValueError(
                "--resume continues the stored configuration; do not pass a config file or --set"
            )
        if not folder.path.is_dir():
            raise FileNotFoundError(f"--resume: no interrupted run in {folder.path}")
        with folder.lock():
            return _resume(folder, progress)
    cfg = apply_overrides(load_config(args.config), args.overrides)  # (a FIFO there: refused)
    check_resources(cfg, folder.path)  # memory and disk, before anything is allocated
    # builds everything (and validates it) before anything is written or deleted
    run = start_run(cfg)
    with folder.lock():
        existing = folder.store
        if existing is not None and not args.overwrite:
            raise FileExistsError(
                f"{existing} exists; use --resume to continue it, --overwrite to replace it, "
                f"or another --out"
            )
        return _fresh(cfg, run, folder, progress, existing)


def _fresh(cfg: dict, run, folder, progress: bool, existing: Path | None) -> int:
    from . import io

    t_start = time.perf_counter()
    store = folder.store_for(cfg)
    # what an earlier run wrote is replaced at the first save: a run the driver refuses deletes nothing;
    # only what wflow wrote goes (anything else in a store is refused here, before the run)
    recorder = io.ZarrRecorder(store, overwrite=True, attrs={"run_config": cfg})
    trackers = [folder.replacing(cfg, existing), recorder]
    print(f"wflow {__version__}: {run.describe} -> {store}", flush=True)
    with _compile_notices():
        result = run.execute([*trackers, _interrupts()], progress=progress, out=folder.path)
    return _finish(result, store, folder.path, cfg, t_start)


def _compile_notices():
    """One line on stderr per numba kernel a run compiles (the progress bar's label says it instead)."""
    from .kernels.jit import compile_notices

    def announce(name: str, cached: bool, seconds: float | None) -> None:
        if seconds is None:
            once = " (first run only: cached for later runs)" if cached else ""
            print(f"wflow: compiling {name} with numba{once}", file=sys.stderr, flush=True)

    return compile_notices(announce)


def _resume(folder, progress: bool) -> int:
    """Continue the run in ``folder`` from its last committed snapshot (or afresh when none was committed)."""
    from .config import load_config, resume_run, start_run
    from .io.paths import refuse_special_file

    t_start = time.perf_counter()
    toml = folder.config_file
    refuse_special_file(toml)  # a FIFO is refused, never waited on
    store = folder.store
    committed = folder.committed()
    if store is None or committed == 0:
        if not toml.exists():
            raise FileNotFoundError(
                f"--resume: no interrupted run in {folder.path} (no committed snapshot, no config.toml)"
            )
        cfg = load_config(toml)
        print(
            f"wflow {__version__}: no committed snapshot in {folder.path}: starting afresh from {toml}",
            flush=True,
        )
        return _fresh(cfg, start_run(cfg), folder, progress, store)
    cfg = folder.stored_config()
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
    print(f"wflow {__version__}: resuming {store} ({committed} snapshots committed)", flush=True)
    with _compile_notices():
        result = resume_run(cfg, store, folder.path).execute([_interrupts()], progress=progress)
    return _finish(result, store, folder.path, cfg, t_start)


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
        if "n_eff" in res.data:
            c = res.data["n_eff"][1]
            line.append(f"effective clusters N_eff: {first(c, 0):.3g} -> {first(c, -1):.3g}")
        elif "n_clusters" in res.data:
            c = res.data["n_clusters"][1]
            line.append(f"clusters: {int(np.ravel(c[0])[0])} -> {int(np.ravel(c[-1])[0])}")
        print("; ".join(line))
    else:
        # density results save their mass; JKO results their weights
        mass = res.data["mass"][1] if "mass" in res.data else res.data["weights"][1].sum(axis=1)
        print(f"mass {mass[0]:.15g} -> {mass[-1]:.15g}")
    if cfg["output.figure"] and _writable(out / "summary.png"):
        from .plot import plot_trajectory

        plot_trajectory(res, out / "summary.png")
        print(f"figure: {out / 'summary.png'}")
    if cfg.get("output.animation") and _writable(out / "animation.gif"):
        from .plot import animate

        animate(res, out / "animation.gif")
        print(f"animation: {out / 'animation.gif'}")


def _writable(path: Path) -> bool:
    """Whether a run's figure may be written at ``path``: nothing there or a regular file (a link or a
    special file is left as it is, with a warning line)."""
    import stat

    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return True
    if stat.S_ISREG(mode):
        return True
    from .io.paths import kind_of

    print(f"wflow: no figure: {path} is {kind_of(mode)}; it is left as it is", file=sys.stderr)
    return False


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
    not_run = int(ds.attrs.get("not_run", 0))
    print(
        f"sweep: {args.out}: {ds.attrs['ok']} of {ds.attrs['points']} points reached t_end, "
        f"{ds.attrs['failed']} failed"
        + (f", {not_run} not run (run the same command again to finish them)" if not_run else "")
    )
    figure = sweep_figure(ds, Path(args.out))
    if figure is not None:
        print(f"figure: {figure}")
    return EXIT_FAILED if ds.attrs["failed"] or not_run else 0


def sweep_figure(ds: Any, store: Path) -> Path | None:
    """The sweep's figure (:func:`wflow.plot.plot_sweep`) beside its store, ``sweep.png`` for ``sweep.zarr``,
    marked as wflow's; None (a warning line) when there is nothing to draw or a file not wflow's is there."""
    import io as _io

    from .io.paths import write_figure
    from .plot import plot_sweep

    path = store.with_suffix(".png")
    png = _io.BytesIO()
    try:
        plot_sweep(ds, cast(Any, png))  # (savefig takes a file object as well as a path)
        write_figure(path, png.getvalue(), "sweep figure")
    except (ValueError, FileExistsError) as exc:
        print(f"wflow sweep: no figure: {exc}", file=sys.stderr)
        return None
    return path


def _repair(args: argparse.Namespace) -> int:
    """``wflow repair``: the sound snapshots of a damaged store become its committed ones."""
    from . import io
    from .runfolder import RunFolder

    if not args.store:
        raise ValueError("repair needs a store or a run folder, got ''")
    path = Path(args.store)
    if path.is_dir() and not (path / "zarr.json").exists():
        store = RunFolder(path).store
        if store is None:
            raise FileNotFoundError(f"no wflow store in {path}")
        path = store
    report = io.repair(path)
    print(
        f"{path}: {report['kept']} snapshots kept as committed (the record claimed "
        f"{report['claimed']}, {report['on_disk']} on disk): {report['reason']}"
    )
    return 0


#: errno -> (exit status, what happened, what to do): 2 when the user's paths cannot be used, 1 when the
#: machine failed during the run (what was committed is kept)
_OS_ERRORS = {
    errno.ENOSPC: (1, "the disk is full", "free space"),
    errno.EDQUOT: (1, "the disk quota is exceeded", "free space"),
    errno.EFBIG: (1, "a file outgrew the file size limit (ulimit -f)", "raise the limit"),
    errno.EIO: (1, "an input/output error of the disk", "check the disk"),
    errno.EROFS: (2, "the file system is read-only", "choose a writable --out"),
    errno.EACCES: (2, "permission denied", "choose a folder you may write"),
    errno.EPERM: (2, "operation not permitted", "choose a folder you may write"),
    errno.ENAMETOOLONG: (2, "a file name is too long", "choose a shorter --out"),
    errno.ENOTDIR: (2, "a path runs through a file", "choose another --out"),
    errno.EISDIR: (
        2,
        "a folder stands where wflow writes a file",
        "remove it or choose another --out",
    ),
}
#: how each command continues after the machine failed during it
_AGAIN = {
    "run": "then continue with wflow run --resume --out {out}",
    "sweep": "then run the same command again: finished points are kept",
    "validate": "then run the same command again: finished parts are kept",
    "repair": "then run it again",
}


def _machine_failure(exc: OSError, args: argparse.Namespace) -> tuple[int, str]:
    """The exit status and the one line for an ``OSError`` (every failure of the machine is one line)."""
    code, what, todo = _OS_ERRORS.get(
        exc.errno or 0, (EXIT_FAILED, exc.strerror or "an error of the system", "")
    )
    where = f": {exc.filename}" if exc.filename else ""
    if code == EXIT_FAILED:
        again = _AGAIN.get(args.command, "").format(out=getattr(args, "out", ""))
        todo = ", ".join(t for t in (todo, again) if t)
        if args.command in ("run", "sweep"):
            what += f"{where}; committed snapshots are kept"
            where = ""
    return code, f"{what}{where}" + (f" ({todo})" if todo else "")


def main(argv: list[str] | None = None) -> int:
    """The ``wflow`` command: ``run``, ``sweep``, ``validate``, ``repair``; returns the exit status.

    0 on success; 1 when a run or a validation expectation failed, or the machine failed during
    a run (disk full, file size limit, out of memory: what was committed is kept); 2 for bad
    input, a path that cannot be used (permissions, read-only, name too long) or a busy
    folder (one line on stderr, nothing written); 130 when interrupted (Ctrl-C).

    Examples
    --------
    >>> main(["validate", "no-such-study"])
    2
    """
    previous = signal.getsignal(signal.SIGINT)
    hook = sys.unraisablehook
    # a path or a value the terminal's encoding cannot show (PYTHONIOENCODING=ascii, a non-ASCII
    # --out) is printed escaped, never an error that stops the run after its folder is claimed
    streams = [(s, s.errors) for s in (sys.stdout, sys.stderr) if isinstance(s, TextIOWrapper)]
    for s, _ in streams:
        s.reconfigure(errors="backslashreplace")
    try:
        if (
            previous is signal.default_int_handler
        ):  # (a caller that ignores Ctrl-C keeps its choice)
            signal.signal(signal.SIGINT, _on_interrupt)
        sys.unraisablehook = _quiet_interrupts(hook)
        with warnings.catch_warnings():
            # a deprecated spelling in a config file or --set: one line, as every other message
            warnings.filterwarnings("default", category=DeprecationWarning, module=r"wflow(\.|$)")
            warnings.showwarning = _one_line_warning
            return _main(argv)
    except KeyboardInterrupt:  # before a command started: while Python imports the modules
        print("wflow: interrupted", file=sys.stderr)
        return 130
    finally:
        if previous is signal.default_int_handler:
            signal.signal(signal.SIGINT, previous)
        sys.unraisablehook = hook
        _INTERRUPTED.clear()
        for s, errors in streams:
            s.reconfigure(errors=errors)


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings as the command's other messages: ``wflow: warning: ...`` on one line of stderr."""
    print(f"wflow: warning: {message}", file=sys.stderr, flush=True)


#: set by Ctrl-C; the runs check it after every step (:class:`_Interrupts`)
_INTERRUPTED = threading.Event()


def _on_interrupt(signum, frame) -> None:
    # Ctrl-C raises KeyboardInterrupt where Python happens to be; inside a callback from C (numba's
    # compiler calls one while caching) the exception is swallowed, so it is remembered as well
    _INTERRUPTED.set()
    recorder = sys.modules.get("wflow.io.recorder")  # (not loaded: no snapshot is being written)
    if recorder is not None and recorder.writing_snapshot():
        recorder.defer_interrupt()  # raised once the snapshot being written is committed
        return
    if _in_compiler(frame):
        # an exception inside numba's compiler can leave LLVM's lock held (a thread compiling beside
        # it then waits forever): delivered again once the compiler is out
        threading.Timer(0.1, _redeliver).start()
        return
    raise KeyboardInterrupt


def _in_compiler(frame) -> bool:
    """Whether ``frame`` or one of its callers runs numba's or llvmlite's code."""
    marks = (f"{os.sep}numba{os.sep}", f"{os.sep}llvmlite{os.sep}")
    while frame is not None:
        if any(m in frame.f_code.co_filename for m in marks):
            return True
        frame = frame.f_back
    return False


def _redeliver() -> None:
    """Ctrl-C again, while :func:`main` still handles it and it was not yet acted on."""
    if _INTERRUPTED.is_set() and signal.getsignal(signal.SIGINT) is _on_interrupt:
        os.kill(os.getpid(), signal.SIGINT)


def _quiet_interrupts(hook):
    """``sys.unraisablehook`` that drops the KeyboardInterrupt a C callback swallowed (it is not lost:
    :data:`_INTERRUPTED` holds it) and passes every other unraisable exception on."""

    def quiet(unraisable):
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):
            hook(unraisable)

    return quiet


def _interrupts():
    """A tracker that ends the run with KeyboardInterrupt after a step when Ctrl-C was pressed."""
    from .solvers.base import Tracker

    class _Interrupts(Tracker):
        name = "interrupts"

        def step(self, t, dt, step):
            if _INTERRUPTED.is_set():
                raise KeyboardInterrupt

        def save(self, snap):
            return self.step(snap.t, 0.0, 0)

    return _Interrupts()


def _main(argv: list[str] | None) -> int:
    from .errors import StoreBusyError, WflowError  # (imports numpy: inside main's Ctrl-C guard)

    words = sys.argv[1:] if argv is None else list(argv)
    parser = _parser(list_studies="validate" in words)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING, format="%(name)s: %(message)s"
    )
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        try:
            commands = {"run": _run, "validate": _validate, "sweep": _sweep, "repair": _repair}
            return commands[args.command](args)
        except Exception:
            if _INTERRUPTED.is_set():  # a Ctrl-C that numba's compiler swallowed left this error
                raise KeyboardInterrupt from None  # (a half-compiled kernel): it is the interrupt
            raise
    except (ValueError, TypeError, FileExistsError, FileNotFoundError, StoreBusyError) as exc:
        print(f"wflow: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except WflowError as exc:
        print(f"wflow: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as exc:  # the machine: disk full, file size limit, permissions, names, read-only
        code, line = _machine_failure(exc, args)
        logging.getLogger("asyncio").disabled = True
        print(f"wflow: error: {line}", file=sys.stderr)
        return code
    except MemoryError:
        logging.getLogger("asyncio").disabled = True
        print(
            "wflow: error: out of memory; committed snapshots are kept (a smaller init.n, "
            "mesh.resolution or save.n needs less)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    except KeyboardInterrupt:
        # a write in flight on Zarr's IO thread was not committed: asyncio's report of it at exit is noise
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
