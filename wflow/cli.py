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
from .errors import SolverError, WflowError

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


def _run(args: argparse.Namespace) -> int:
    import numpy as np

    from . import io
    from .config import apply_overrides, build_run, load_config, to_toml
    from .plot import plot_trajectory
    from .solvers.particles import simulate

    out = Path(args.out)
    store = out / "trajectory.zarr"
    t_start = time.perf_counter()
    if args.resume:
        if args.config or args.overrides:
            raise ValueError("--resume continues the stored configuration; do not pass a config file or --set")
        if (out / "density.zarr").exists():
            return _run_density(None, out, args, resume=True)
        if not store.exists():
            raise FileNotFoundError(f"--resume: no interrupted run at {store}")
        traj = io.resume(store, progress=not args.no_progress)
        figure = True
    else:
        cfg = apply_overrides(load_config(args.config), args.overrides)
        if cfg["solver"] != "particles":
            return _run_density(cfg, out, args)
        if store.exists() and not args.overwrite:
            raise FileExistsError(f"{store} exists; use --resume to continue it, --overwrite to replace it, "
                                  f"or another --out")
        model, mu0, kwargs = build_run(cfg)
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.toml").write_text(to_toml(cfg))
        print(f"wflow {__version__}: {model!r}, n={mu0.n}, d={mu0.d}, t_end={cfg['run.t_end']:g}, "
              f"method={cfg['run.method']} -> {store}", flush=True)
        writer = io.ZarrWriter(store, overwrite=args.overwrite)
        try:
            traj = simulate(model, mu0, cfg["run.t_end"], writer=writer, progress=not args.no_progress, **kwargs)
        except SolverError as exc:
            print(f"wflow: solver stopped: {exc} ({writer.count} snapshots kept in {store})", file=sys.stderr)
            return EXIT_FAILED
        figure = cfg["output.figure"]
    elapsed = time.perf_counter() - t_start
    print(f"trajectory: {store} ({len(traj.times)} snapshots, {int(traj.stats['steps'][-1])} steps, "
          f"{int(traj.stats['evaluations'][-1])} evaluations, {elapsed:.1f} s)")
    e = traj.diagnostics["energy"]
    if np.all(np.isfinite(e)):
        print(f"energy: {float(np.ravel(e[0])[0]):.6g} -> {float(np.ravel(e[-1])[0]):.6g}; "
              f"clusters: {int(np.ravel(traj.diagnostics['n_clusters'][0])[0])} -> "
              f"{int(np.ravel(traj.diagnostics['n_clusters'][-1])[0])}")
    if figure:
        fig_path = out / "summary.png"
        plot_trajectory(traj, fig_path)
        print(f"figure: {fig_path}")
    return 0


def _run_density(cfg, out: Path, args: argparse.Namespace, *, resume: bool = False) -> int:
    """Continuum runs: ``eulerian`` (written density by density, resumable) and ``lagrangian``."""
    import json

    import numpy as np

    from . import io
    from .config import build_mesh, build_model, initial_density, to_toml
    from .plot import plot_trajectory

    t_start = time.perf_counter()
    store = out / "density.zarr"
    if resume:
        prev = io.load_density(store)
        cfg = prev["config"]["run_config"]
        t_last = float(prev["times"][-1])
    else:
        for name in ("density.zarr", "trajectory.zarr"):
            if (out / name).exists() and not args.overwrite:
                raise FileExistsError(f"{out / name} exists; use --resume to continue it, --overwrite to replace it, "
                                      f"or another --out")
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.toml").write_text(to_toml(cfg))
    model = build_model(cfg)
    saves = np.linspace(0.0, cfg["run.t_end"], cfg["run.n_saves"])
    if cfg["solver"] == "lagrangian":
        from .solvers.lagrangian import solve_lagrangian

        print(f"wflow {__version__}: lagrangian, {model!r}, d={cfg['init.d']}, nodes={cfg['mesh.resolution']}",
              flush=True)
        path = out / "trajectory.zarr"
        sol = solve_lagrangian(model, initial_density(cfg), cfg["run.t_end"], d=cfg["init.d"],
                               nodes=cfg["mesh.resolution"], save_at=saves, rtol=cfg["run.rtol"],
                               atol=cfg["run.atol"], backend=cfg["run.backend"], progress=not args.no_progress,
                               writer=io.ZarrWriter(path, overwrite=args.overwrite))
        traj = sol.trajectory
        print(f"trajectory: {path} ({len(traj.times)} snapshots of {traj.points.shape[-2]} quadrature nodes "
              f"and their Jacobian tracers, {time.perf_counter() - t_start:.1f} s)")
        if cfg["output.figure"]:
            plot_trajectory(traj, out / "summary.png")
            print(f"figure: {out / 'summary.png'}")
        return 0

    from .density import Density
    from .solvers.eulerian import solve_density

    if cfg["solver"] == "jko":
        return _run_jko(cfg, out, args, model, saves, t_start, prev=prev if resume else None)
    mesh = build_mesh(cfg)
    spec = {"solver": "eulerian", "model": model.to_dict(), "kappa": cfg["run.kappa"] or None,
            "cfl": cfg["mesh.cfl"], "mesh": repr(mesh), "run_config": cfg, "save_at": saves.tolist()}
    if resume:
        rho = Density(mesh, prev["values"][-1])
        writer = io.DensityZarrWriter(store, mesh, spec, append=True)
    else:
        rho = Density.from_function(mesh, initial_density(cfg))
        writer = io.DensityZarrWriter(store, mesh, spec, overwrite=args.overwrite)
        t_last = 0.0
    gradient = model.is_gradient

    def energy(r: Density) -> float:
        return float(model.energy(r.to_atoms(), backend=cfg["run.backend"])) if gradient else float("nan")

    if not resume:
        writer.write(0.0, rho.values, energy(rho))
    remaining = saves[saves > t_last + 1e-12 * max(1.0, cfg["run.t_end"])] - t_last
    targets = set(remaining.tolist())
    print(f"wflow {__version__}: eulerian, {model!r}, {mesh!r} -> {store}", flush=True)
    bar = None
    if not args.no_progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=float(remaining[-1]) if remaining.size else 0.0, unit="t", dynamic_ncols=True,
                   bar_format="{l_bar}{bar}| t={n:.3g}/{total:.3g} [{elapsed}<{remaining}]")

    def on_step(t: float, r: Density) -> bool:
        if bar is not None:
            bar.update(t - bar.n)
        if t in targets:
            writer.write(t_last + t, r.values, energy(r))
        return False

    try:
        if remaining.size:
            res = solve_density(model, rho, float(remaining[-1]), save_at=np.concatenate([[0.0], remaining]),
                                cfl=cfg["mesh.cfl"], kappa=cfg["run.kappa"] or None, backend=cfg["run.backend"],
                                callback=on_step)
            steps = res.stats.get("steps")
        else:
            steps = 0
    finally:
        if bar is not None:
            bar.close()
    return _finish_density(store, out, cfg, f"{steps} steps this run", t_start,
                           f"{json.dumps(spec['model'])} on {spec['mesh']}")


def _finish_density(store: Path, out: Path, cfg, what: str, t_start: float, title: str) -> int:
    """Summary line and figure of a continuum run whose densities are in ``store``."""
    from . import io
    from .plot import plot_density

    done = io.load_density(store)
    print(f"density: {store} ({len(done['times'])} snapshots, {what}, mass {done['mass'][0]:.15g} -> "
          f"{done['mass'][-1]:.15g}, {time.perf_counter() - t_start:.1f} s)")
    if cfg["output.figure"]:
        plot_density(done["times"], done["values"], done["centers"], out / "summary.png", energy=done["energy"],
                     title=title)
        print(f"figure: {out / 'summary.png'}")
    return 0


def _run_jko(cfg, out: Path, args: argparse.Namespace, model, saves, t_start: float, *, prev=None) -> int:
    """JKO runs: densities and the inner solver's warm start written at the save steps, one CSV line of
    statistics per step; ``prev`` (the stored run) continues it from its last saved step."""
    import csv
    import math

    import numpy as np

    from . import io
    from .config import build_mesh, initial_density
    from .density import Density
    from .solvers.jko import WarmStart, jko

    if model.gradient_obstruction() is None and model.metric != "wasserstein":
        raise ValueError(f"solver jko needs a Wasserstein gradient flow (USA with V = +-I, conservative "
                         f"perceptrons); {model!r} ascends its energy in the SA-reweighted metric")
    mesh = build_mesh(cfg)
    tau = cfg["jko.tau"]
    n_steps = max(1, math.ceil(cfg["run.t_end"] / tau - 1e-9))
    save_every = max(1, n_steps // max(1, len(saves) - 1))
    spec = {"solver": "jko", "model": model.to_dict(), "tau": tau, "eps": cfg["jko.eps"] or None,
            "kappa": cfg["run.kappa"] or None, "mesh": repr(mesh), "run_config": cfg}
    store = out / "density.zarr"
    fields = ["step", "t", "iterations", "sinkhorn", "residual", "residual_max", "eps", "converged", "time_ot",
              "time_energy"]
    warm = None
    if prev is None:
        writer = io.DensityZarrWriter(store, mesh, spec, overwrite=args.overwrite)
        rho = Density.from_function(mesh, initial_density(cfg))
        done = 0
        kept: list[dict] = []
    else:
        writer = io.DensityZarrWriter(store, mesh, spec, append=True)
        rho = Density(mesh, prev["values"][-1])
        done = int(round(float(prev["times"][-1]) / tau))
        if "jko_gbar" in prev and np.isfinite(prev["jko_L"][-1]):
            warm = WarmStart(prev["jko_gbar"][-1], prev["jko_v"][-1], float(prev["jko_L"][-1]),
                             float(prev["jko_eps"][-1]))
        with open(out / "steps.csv", newline="") as fh:  # statistics of steps after the last save are redone
            kept = [row for row in csv.DictReader(fh) if int(row["step"]) <= done]
    gradient = model.is_gradient

    def energy(masses: np.ndarray) -> float:
        from .measure import Atoms

        return float(model.energy(Atoms._trusted(mesh.centers, masses), backend=cfg["run.backend"]))

    def state(ws) -> dict:
        if ws is None:  # method emd: nothing to warm-start
            return {"jko_gbar": np.full(mesh.n_cells, np.nan), "jko_v": np.full(mesh.n_cells, np.nan),
                    "jko_L": np.nan, "jko_eps": np.nan}
        return {"jko_gbar": ws.gbar, "jko_v": ws.v, "jko_L": ws.L, "jko_eps": ws.eps}

    if prev is None:
        writer.write(0.0, rho.values, energy(rho.masses()) if gradient else float("nan"), extra=state(None))
    with open(out / "steps.csv", "w", newline="") as fh:
        rows = csv.DictWriter(fh, fieldnames=fields)
        rows.writeheader()
        rows.writerows(kept)
        step = [done]

        def on_step(t: float, w: np.ndarray, st) -> bool:
            step[0] += 1
            t = step[0] * tau
            rows.writerow({"step": step[0], "t": t, **{k: getattr(st, k) for k in fields[2:]}})
            fh.flush()
            if step[0] % save_every == 0 or step[0] == n_steps:
                writer.write(t, w / mesh.areas, energy(w), extra=state(st.warm_start))
            return False

        what = (f"resumed at step {done} ({'warm start' if warm is not None else 'cold start'}), "
                if prev is not None else "")
        print(f"wflow {__version__}: jko, {model!r}, {mesh!r}, tau={tau:g}, {what}{n_steps} steps -> {store}",
              flush=True)
        if n_steps > done:
            res = jko(model, rho, tau, n_steps - done, eps=cfg["jko.eps"] or None, kappa=cfg["run.kappa"] or None,
                      method=cfg["jko.method"], backend=cfg["run.backend"], callback=on_step, save_every=save_every,
                      warm_start=warm, progress=not args.no_progress)
            stats = res.stats
        else:
            stats = []
    n_conv = sum(row["converged"] == "True" for row in kept) + sum(bool(s.converged) for s in stats)
    print(f"per-step statistics: {out / 'steps.csv'}")
    return _finish_density(store, out, cfg, f"{n_steps} steps, {n_conv} converged", t_start,
                           f"JKO tau={tau:g}: {model!r} on {mesh!r}")


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
        print("wflow: interrupted; snapshots written so far are kept (continue with --resume)", file=sys.stderr)
        return 130
    return EXIT_USAGE  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
