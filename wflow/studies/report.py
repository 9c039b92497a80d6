"""The study machinery of ``wflow validate``: stated expectations, reports, and the registry of studies.

A study is a function ``study(out: Path, quick: bool) -> StudyReport`` registered under a name
with :func:`register`; it states its expectations (each passes or fails), writes figures into
``out`` and returns its rows for a CSV table.  ``wflow validate NAME`` runs it and writes
``NAME.md`` and ``NAME.csv``; the command exits 1 when an expectation fails (a study with no
expectations fails too).
"""

from __future__ import annotations

import csv
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "Expectation",
    "StudyReport",
    "STUDIES",
    "register",
    "write_report",
    "run_studies",
    "STUDY_MODULES",
    "GROUPS",
]

#: every study, by name (filled by :func:`register`)
STUDIES: dict[str, Callable[[Path, bool], StudyReport]] = {}

#: modules whose import registers further studies (``wflow.validate`` holds mean-field, eulerian, jko)
STUDY_MODULES = (
    "wflow.validate",
    "wflow.studies.zonal",
    "wflow.studies.perceptron",
    "wflow.studies.staircase",
    "wflow.studies.phase_diagram",
    "wflow.studies.metastable",
    "wflow.studies.dichotomy",
    "wflow.studies.mean_shift",
    "wflow.studies.normalization",
    "wflow.studies.long_context",
)

#: names that stand for several studies (``wflow validate papers``), filled by :func:`register`'s ``group``
GROUPS: dict[str, list[str]] = {}


def register(name: str, group: str | None = None):
    """Decorator: list a study under ``name`` (the name ``wflow validate`` takes), and in ``group`` if given.

    Examples
    --------
    >>> @register("demo-study", group="demo-group")
    ... def demo(out, quick):
    ...     rep = StudyReport("demo-study")
    ...     rep.expect("one", 1.0, 0.5, 1.5)
    ...     return rep
    >>> STUDIES["demo-study"] is demo, GROUPS["demo-group"]
    (True, ['demo-study'])
    >>> del STUDIES["demo-study"], GROUPS["demo-group"]
    """

    def deco(fn: Callable[[Path, bool], StudyReport]):
        STUDIES[name] = fn
        if group is not None and name not in GROUPS.setdefault(group, []):
            GROUPS[group].append(name)
        return fn

    return deco


def _load_all() -> None:
    for mod in STUDY_MODULES:
        importlib.import_module(mod)


@dataclass
class Expectation:
    """A stated expectation of a study and whether it held.

    Examples
    --------
    >>> Expectation("slope", -0.51, "in [-0.6, -0.4]", True).passed
    True
    """

    name: str
    value: float
    target: str
    passed: bool


@dataclass
class StudyReport:
    """What a study returns: its CSV rows, its expectations (each passes or fails), figures and notes.

    Examples
    --------
    >>> rep = StudyReport("demo")
    >>> rep.expect("growth rate / theory", 1.0004, 0.99, 1.01)
    >>> rep.expect_slope("W2 against N", -0.52, 0.04, -0.5)
    >>> rep.passed, [e.passed for e in rep.expectations]
    (True, [True, True])
    >>> StudyReport("no expectations").passed   # a study that states nothing fails
    False
    """

    name: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    expectations: list[Expectation] = field(default_factory=list)
    figures: list[Path] = field(default_factory=list)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """True when the study stated expectations and all of them held (a study with none fails)."""
        return bool(self.expectations) and all(e.passed for e in self.expectations)

    def expect_slope(
        self, name: str, slope: float, half: float, target: float, max_half: float = 0.25
    ) -> None:
        """The confidence interval ``slope +- half`` contains ``target`` and is narrower than ``max_half``."""
        ok = bool(np.isfinite(slope) and abs(slope - target) <= half and half <= max_half)
        self.expectations.append(
            Expectation(
                f"{name} ({slope:.3f} ± {half:.3f})",
                float(slope),
                f"99% CI contains {target:g}, half-width <= {max_half:g}",
                ok,
            )
        )

    def expect(self, name: str, value: float, lo: float, hi: float) -> None:
        ok = bool(np.isfinite(value) and lo <= value <= hi)
        self.expectations.append(Expectation(name, float(value), f"in [{lo:g}, {hi:g}]", ok))


def write_report(rep: StudyReport, out: Path) -> Path:
    """CSV of rows and a Markdown page with the expectations and figures.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> rep = StudyReport("demo", rows=[{"N": 100, "W2": 0.1}])
    >>> rep.expect("slope", -0.2, -0.6, -0.4)
    >>> md = write_report(rep, pathlib.Path(tempfile.mkdtemp()))
    >>> md.read_text().splitlines()[2], (md.parent / "demo.csv").read_text().splitlines()[0]
    ('FAILED in 0 s', 'N,W2')
    """
    out.mkdir(parents=True, exist_ok=True)
    keys = sorted({k for r in rep.rows for k in r})
    with open(out / f"{rep.name}.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        for r in rep.rows:
            w.writerow(r)
    lines = [
        f"# {rep.name}",
        "",
        f"{'PASSED' if rep.passed else 'FAILED'} in {rep.seconds:.0f} s",
        "",
        "| expectation | value | target | result |",
        "|---|---|---|---|",
    ]
    for e in rep.expectations:
        lines.append(
            f"| {e.name} | {e.value:.4g} | {e.target} | {'ok' if e.passed else 'FAILED'} |"
        )
    lines += (
        [""]
        + [f"![{f.stem}]({f.name})" for f in rep.figures]
        + ["", "## Notes", ""]
        + [f"- {n}" for n in rep.notes]
    )
    md = out / f"{rep.name}.md"
    md.write_text("\n".join(lines) + "\n")
    return md


def run_studies(
    names: list[str] | None, out: Path, quick: bool, workers: int = 1
) -> list[StudyReport]:
    """Run the named studies (all when ``None``), writing each report into ``out``.

    Names may be groups (``"papers"``); an unknown name is a ``ValueError`` listing the known ones.
    ``workers > 1``: studies split into parts compute them on that many Dask worker processes
    (:meth:`wflow.studies.parts.Parts.prefetch`).

    Examples
    --------
    >>> import pathlib, tempfile
    >>> out = pathlib.Path(tempfile.mkdtemp())
    >>> [r.name for r in run_studies(["mean-shift"], out, quick=True)]  # doctest: +SKIP
    ['mean-shift']
    >>> run_studies(["no-such-study"], out, quick=True)
    Traceback (most recent call last):
    ...
    ValueError: unknown validation study 'no-such-study'; known: ...
    """
    _load_all()
    names = list(STUDIES) if not names else names
    unknown = [n for n in names if n not in STUDIES and n not in GROUPS]
    if unknown:
        raise ValueError(
            f"unknown validation study {unknown[0]!r}; known: {', '.join(list(STUDIES) + list(GROUPS))}"
        )
    names = list(dict.fromkeys(m for n in names for m in GROUPS.get(n, [n])))
    from .parts import workers as _workers

    with _workers(workers):
        out.mkdir(parents=True, exist_ok=True)
        reports = []
        for n in names:
            rep = STUDIES[n](out, quick)
            write_report(rep, out)
            reports.append(rep)
    return reports
