"""Run validation studies of the installed package and head each report with its provenance.

``python -m validation STUDY [STUDY ...] [--quick] [--out DIR] [--workers N]`` (and
``python -m validation.<study> [OUT] [--quick]`` for one study) runs ``wflow validate`` with the
same arguments (groups such as ``papers`` included), then writes at the
top of every report it produced the command, the git commit of the checkout it ran from (and
whether the package differed from that commit), the wflow version, the date, the machine's CPU
count and its load average.  Full runs go to ``validation/reports/`` by default, quick runs to
``wflow-validation/`` (the CLI's default), so a quick run never overwrites a full report.
The exit status is ``wflow validate``'s: non-zero when a study failed or could not run.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import wflow
from wflow.cli import main as wflow_main

REPORTS = Path(__file__).resolve().parent / "reports"


def _git(*args: str) -> str:
    try:
        res = subprocess.run(
            ["git", *args], capture_output=True, text=True, check=True, cwd=REPORTS.parent
        )
    except (OSError, subprocess.CalledProcessError):
        return ""
    return res.stdout.rstrip()  # not strip(): porcelain lines start with a status column


def source() -> str:
    """The commit of the checkout and whether the imported package differs from it (read at the start)."""
    commit = _git("rev-parse", "--short=12", "HEAD")
    top = Path(_git("rev-parse", "--show-toplevel") or "/nonexistent")
    package = Path(wflow.__file__).resolve().parent
    if not commit:
        state = "not run from a git checkout"
    elif top not in package.parents:
        state = f"but wflow was imported from {package}, outside this checkout"
    else:
        changed = _git("status", "--porcelain", "--", str(package))
        state = (
            "the package's files as committed"
            if not changed
            else "with uncommitted changes to: "
            + ", ".join(line[3:] for line in changed.splitlines())
        )
    # inside the checkout the path relative to it (the commit says which files; no machine path in a
    # kept report); outside it the absolute path is the information
    where = package.relative_to(top) if top in package.parents else package
    return f"Commit: `{commit or 'unknown'}` ({state}); wflow {wflow.__version__} from `{where}`"


def provenance(command: str, origin: str, seconds: float, load: tuple[float, float]) -> list[str]:
    """Markdown lines: the command, where the code came from (:func:`source`), the machine, the time."""
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return [
        f"Command: `{command}`",
        "",
        f"{origin}; "
        f"Python {platform.python_version()}; {os.cpu_count()} CPU cores, load average "
        f"{load[0]:.1f} at the start and {load[1]:.1f} at the end; finished {when}; "
        f"wall time of the command {seconds:.0f} s.",
        "",
    ]


def main(
    argv: list[str] | None = None, prog: str = "python -m validation", study: str | None = None
) -> int:
    """The command line of ``python -m validation`` (``study=None``) and of one study's script."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    if study is None:
        p.add_argument("studies", nargs="+", help="studies or groups (wflow validate --help)")
    else:
        p.add_argument(
            "out", nargs="?", type=Path, default=None, metavar="DIR", help="report folder"
        )
    p.add_argument("--quick", action="store_true", help="the CI mode")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        dest="out_option",
        metavar="DIR",
        help="report folder (default: validation/reports/, with --quick wflow-validation/)",
    )
    p.add_argument("--workers", type=int, default=1, help="Dask worker processes")
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a study's option, as wflow validate --option (perceptron: convention=code|poster)",
    )
    args = p.parse_args(argv)
    studies = args.studies if study is None else [study]
    out = args.out_option or getattr(args, "out", None)
    out = out or (Path("wflow-validation") if args.quick else REPORTS)
    cli = ["validate", *studies, "--out", str(out), "--workers", str(args.workers)]
    cli += ["--quick"] if args.quick else []
    cli += [a for item in args.option for a in ("--option", item)]
    command = " ".join([prog, *(argv if argv is not None else sys.argv[1:])])
    origin, start, load0 = source(), time.time(), os.getloadavg()[0]
    status = wflow_main(cli)
    lines = provenance(command, origin, time.time() - start, (load0, os.getloadavg()[0]))
    for md in sorted(out.glob("*.md")):
        if md.stat().st_mtime >= start:  # written by this run
            text = md.read_text().splitlines()
            md.write_text("\n".join(text[:2] + lines + text[2:]) + "\n")
    return status
