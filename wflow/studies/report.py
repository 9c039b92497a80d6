"""The study machinery of ``wflow validate``: stated expectations, reports, and the registry of studies.

A study is a function ``study(out: Path, quick: bool) -> StudyReport`` registered under a name
with :func:`register`; it states its expectations (each passes or fails), writes figures into
``out`` and returns its rows for a CSV table.  ``wflow validate NAME`` runs it and writes
``NAME.md`` and ``NAME.csv``; the command exits 1 when an expectation fails (a study with no
expectations fails too), and when a study cannot run: its module cannot be imported
(:func:`load_all`) or it raises (:func:`run_studies` records the error and runs the others).
"""

from __future__ import annotations

import csv
import importlib
import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from scipy import stats

from ..errors import did_you_mean

__all__ = [
    "Expectation",
    "StudyReport",
    "STUDIES",
    "register",
    "write_report",
    "run_studies",
    "load_all",
    "fit_slope",
    "RateFit",
    "fit_rate_models",
    "STUDY_MODULES",
    "GROUPS",
    "OPTIONS",
    "check_options",
    "unknown_studies",
    "subplots",
    "save_figure",
]

log = logging.getLogger(__name__)

#: every study, by name (filled by :func:`register`)
STUDIES: dict[str, Callable[[Path, bool], StudyReport]] = {}

#: the modules whose import registers the studies (:func:`load_all`)
STUDY_MODULES = (
    "wflow.studies.mean_field",
    "wflow.studies.eulerian",
    "wflow.studies.jko",
    "wflow.studies.stationary",
    "wflow.studies.zonal",
    "wflow.studies.perceptron",
    "wflow.studies.staircase",
    "wflow.studies.phase_diagram",
    "wflow.studies.metastable",
    "wflow.studies.dichotomy",
    "wflow.studies.mean_shift",
    "wflow.studies.normalization",
    "wflow.studies.long_context",
    "wflow.studies.real_transformer",
)

#: names that stand for several studies (``wflow validate papers``), filled by :func:`register`'s ``group``
GROUPS: dict[str, list[str]] = {}

#: the options a study takes (``wflow validate NAME --option KEY=VALUE``): study -> option -> allowed values
#: (the first is the default), filled by :func:`register`'s ``options``
OPTIONS: dict[str, dict[str, tuple[str, ...]]] = {}


def register(
    name: str, group: str | None = None, options: dict[str, tuple[str, ...]] | None = None
):
    """Decorator: list a study under ``name`` (the name ``wflow validate`` takes), and in ``group`` if given.

    ``options`` names the keyword arguments the study takes beyond ``(out, quick)`` and their
    allowed values, the first the default (:func:`check_options`).

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

    def deco(fn: Callable[..., StudyReport]):
        STUDIES[name] = fn
        if options:
            OPTIONS[name] = {k: tuple(v) for k, v in options.items()}
        if group is not None and name not in GROUPS.setdefault(group, []):
            GROUPS[group].append(name)
        return fn

    return deco


def check_options(names: list[str], options: dict[str, str] | None) -> dict[str, dict[str, str]]:
    """The options of each named study (names may be groups): ``options`` checked against :data:`OPTIONS`.

    An option that none of the named studies takes, or a value it does not allow, is a one-line
    ``ValueError`` naming them.

    Examples
    --------
    >>> load_all()
    {}
    >>> check_options(["perceptron"], {"convention": "poster"})
    {'perceptron': {'convention': 'poster'}}
    >>> check_options(["perceptron"], {"convention": "paper"})
    Traceback (most recent call last):
    ...
    ValueError: unknown convention 'paper' for study perceptron; known: code, poster
    >>> check_options(["mean-shift"], {"convention": "code"})
    Traceback (most recent call last):
    ...
    ValueError: no study among mean-shift takes the option 'convention' (options: mean-field: s2_max_n; perceptron: convention)
    """
    studies = list(dict.fromkeys(m for n in names for m in GROUPS.get(n, [n])))
    out: dict[str, dict[str, str]] = {}
    for key, value in (options or {}).items():
        takers = [n for n in studies if key in OPTIONS.get(n, {})]
        if not takers:
            known = "; ".join(f"{n}: {', '.join(o)}" for n, o in sorted(OPTIONS.items())) or "none"
            raise ValueError(
                f"no study among {', '.join(studies)} takes the option {key!r} (options: {known})"
            )
        for n in takers:
            if value not in OPTIONS[n][key]:
                raise ValueError(
                    f"unknown {key} {value!r} for study {n}; known: {', '.join(OPTIONS[n][key])}"
                )
            out.setdefault(n, {})[key] = value
    return out


def load_all() -> dict[str, str]:
    """Import every module of :data:`STUDY_MODULES`; returns those that failed, name -> ``"Type: message"``.

    Examples
    --------
    >>> load_all()
    {}
    >>> "mean-field" in STUDIES and "eulerian" in STUDIES and "papers" in GROUPS
    True
    """
    failed = {}
    for mod in STUDY_MODULES:
        try:
            importlib.import_module(mod)
        except Exception as exc:  # any error: the study cannot run, the others still can
            log.debug("importing %s failed", mod, exc_info=True)
            failed[mod] = _one_line(exc)
    return failed


def unknown_studies(names: list[str], import_errors: dict[str, str]) -> list[str]:
    """The names that are neither a study nor a group: a ``ValueError`` when every study module
    imported (the registry is complete), else returned (they may live in a module that failed)."""
    unknown = [n for n in names if n not in STUDIES and n not in GROUPS]
    if unknown and not import_errors:
        raise ValueError(
            f"unknown validation study {unknown[0]!r}"
            f"{did_you_mean(unknown[0], [*STUDIES, *GROUPS])}; known: {', '.join([*STUDIES, *GROUPS])}"
        )
    return unknown


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def subplots(*args: Any, **kwargs: Any) -> Any:
    """``matplotlib.pyplot.subplots(*args, **kwargs)`` on the Agg backend (a study only writes files)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)


def save_figure(fig: Any, path: Path, dpi: int = 110) -> Path:
    """Write ``fig`` to ``path`` at ``dpi`` and close it; returns ``path``."""
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def fit_slope(N: np.ndarray, err: np.ndarray, level: float = 0.99) -> tuple[float, float]:
    """OLS slope of ``log err`` against ``log N``, with the half-width of its ``level`` confidence interval.

    Student's t quantile times the slope's standard error (``inf`` with two points).

    Examples
    --------
    >>> N = np.array([100.0, 400.0, 1600.0, 6400.0])
    >>> slope, half = fit_slope(N, 3.0 * N**-0.5 * np.array([1.02, 0.97, 1.01, 0.99]))
    >>> round(slope, 3), bool(0 < half < 0.1)
    (-0.504, True)
    """
    res = stats.linregress(np.log(N), np.log(err))
    half = stats.t.ppf(0.5 + level / 2, len(N) - 2) * res.stderr if len(N) > 2 else np.inf
    return float(res.slope), float(half)


class RateFit(NamedTuple):
    """What :func:`fit_rate_models` returns: the free slope and the two one-constant rate models."""

    #: OLS slope of ``log err`` against ``log N``
    slope: float
    #: half-width of its ``level`` confidence interval (``inf`` with two points: no interval)
    half: float
    #: ``C`` of ``err ~ C N^{-1/2}`` and the RMS of its log residuals
    C_sqrt: float
    rms_sqrt: float
    #: ``C`` of ``err ~ C (log N / N)^{1/2}`` and the RMS of its log residuals
    C_log: float
    rms_log: float
    #: the model with the smaller RMS: ``"N^-1/2"`` or ``"sqrt(log N/N)"`` (``"N^-1/2"`` on a tie)
    better: str


def fit_rate_models(N: np.ndarray, err: np.ndarray, level: float = 0.95) -> RateFit:
    r"""The slope of ``err`` against ``N`` with its confidence interval, and the fits of two rate models.

    The slope is :func:`fit_slope`'s.  Each model :math:`e_i \approx C f(N_i)`, with
    :math:`f(N) = N^{-1/2}` (i.i.d. rate in dimension 1) or :math:`(\log N / N)^{1/2}`
    (Ajtai--Komlós--Tusnády on a 2-sphere), has :math:`\log C = \overline{\log e_i - \log f(N_i)}`
    and the RMS of :math:`\log e_i - \log(C f(N_i))` as its residual.

    Parameters
    ----------
    N : ndarray, shape (n,)
        Sizes, each > 1 (at least two distinct values).
    err : ndarray, shape (n,)
        Errors at those sizes, positive and finite.
    level : float
        Confidence level of the slope's interval, in (0, 1).

    Examples
    --------
    >>> N = np.array([100.0, 1000.0, 10_000.0, 100_000.0])
    >>> fit = fit_rate_models(N, 0.3 * np.sqrt(np.log(N) / N))
    >>> fit.better, round(fit.C_log, 6), round(fit.rms_log, 12), round(fit.rms_sqrt, 4)
    ('sqrt(log N/N)', 0.3, 0.0, 0.1713)
    >>> round(fit.slope, 3), bool(0 < fit.half < 0.05)
    (-0.434, True)
    """
    N = np.asarray(N, dtype=float)
    err = np.asarray(err, dtype=float)
    if N.ndim != 1 or N.shape != err.shape:
        raise ValueError(
            f"N and err must be 1-D of the same length, got shapes N={N.shape}, err={err.shape}"
        )
    if len(np.unique(N)) < 2 or not np.all(np.isfinite(N) & (N > 1)):
        raise ValueError(f"N must hold finite sizes > 1, at least two distinct, got N={N}")
    if not np.all(np.isfinite(err) & (err > 0)):
        raise ValueError(f"err must be positive and finite, got err={err}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got level={level!r}")
    slope, half = fit_slope(N, err, level)
    fitted = []
    for log_f in (-0.5 * np.log(N), 0.5 * np.log(np.log(N) / N)):
        r = np.log(err) - log_f
        fitted.append((float(np.exp(r.mean())), float(np.sqrt(np.mean((r - r.mean()) ** 2)))))
    (C_sqrt, rms_sqrt), (C_log, rms_log) = fitted
    better = "N^-1/2" if rms_sqrt <= rms_log else "sqrt(log N/N)"
    return RateFit(slope, half, C_sqrt, rms_sqrt, C_log, rms_log, better)


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
    """What a study returns: its CSV rows, its expectations (each passes or fails), figures, notes and tables.

    ``sections`` are Markdown blocks (a heading and a table of every measured value, say) that
    :func:`write_report` writes after the expectations and figures.

    Examples
    --------
    >>> rep = StudyReport("demo")
    >>> rep.expect("growth rate / theory", 1.0004, 0.99, 1.01)
    >>> rep.expect_slope("W2 against N", -0.52, 0.04, -0.5)
    >>> rep.passed, [e.passed for e in rep.expectations]
    (True, [True, True])
    >>> StudyReport("no expectations").passed   # a study that states nothing fails
    False
    >>> StudyReport("broken", error="ZeroDivisionError: division by zero").passed
    False
    """

    name: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    expectations: list[Expectation] = field(default_factory=list)
    figures: list[Path] = field(default_factory=list)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    sections: list[str] = field(default_factory=list)
    #: why the study could not run (it raised, or its module could not be imported); ``None`` if it ran
    error: str | None = None
    #: why the study was skipped (an optional package or data set is not installed: the line names the
    #: install command); a skipped study does not fail
    skipped: str | None = None

    @property
    def passed(self) -> bool:
        """Ran and stated expectations that all held (a study with none fails), or was skipped."""
        if self.skipped is not None and self.error is None:
            return True
        return (
            self.error is None
            and bool(self.expectations)
            and all(e.passed for e in self.expectations)
        )

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
        (
            f"SKIPPED: {rep.skipped}"
            if rep.skipped is not None and rep.error is None
            else f"{'PASSED' if rep.passed else 'FAILED'} in {rep.seconds:.0f} s"
            + (f": could not run ({rep.error})" if rep.error else "")
        ),
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
        + [line for block in rep.sections for line in ("", block)]
        + ["", "## Notes", ""]
        + [f"- {n}" for n in rep.notes]
    )
    md = out / f"{rep.name}.md"
    md.write_text("\n".join(lines) + "\n")
    return md


def run_studies(
    names: list[str] | None,
    out: Path,
    quick: bool,
    workers: int = 1,
    options: dict[str, str] | None = None,
    *,
    on_start: Callable[[str, int, int], Any] | None = None,
    on_done: Callable[[StudyReport], Any] | None = None,
    progress: bool = True,
) -> list[StudyReport]:
    """Run the named studies (all when ``None``; names may be groups), writing each report into ``out``.

    ``options`` go to the studies that take them (:func:`check_options`).  ``on_start(name, k,
    total)`` is called before the ``k``-th of ``total`` studies runs, ``on_done(report)`` as soon as
    each report is written.  ``progress=False`` silences the studies' lines on stderr
    (:mod:`wflow.studies.progress`); ``workers > 1`` computes parts on that many Dask worker
    processes (:meth:`wflow.studies.parts.Parts.prefetch`).

    An unknown name is a ``ValueError`` listing the known ones.  A study that raises (any
    ``Exception``) gets a report with its :attr:`~StudyReport.error` and the next study runs; a
    module of :data:`STUDY_MODULES` that cannot be imported is reported as a study that could not
    run, and so is an unknown name while such a module exists.

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
    >>> @register("demo-broken")
    ... def broken(out, quick):
    ...     return 1 / 0
    >>> [(r.name, r.passed, r.error) for r in run_studies(["demo-broken"], out, quick=True)]
    [('demo-broken', False, 'ZeroDivisionError: division by zero')]
    >>> del STUDIES["demo-broken"]
    """
    import_errors = load_all()
    names = list(STUDIES) if not names else names
    unknown = unknown_studies(names, import_errors)
    per_study = check_options(names, options)
    from .parts import workers as _workers
    from .progress import shown

    with _workers(workers), shown(progress):
        out.mkdir(parents=True, exist_ok=True)
        reports = [
            StudyReport(mod, error=f"cannot be imported ({why})")
            for mod, why in import_errors.items()
        ]
        why = "not registered; study modules that could not be imported: " + ", ".join(
            import_errors
        )
        reports += [StudyReport(n, error=why) for n in unknown]
        for rep in reports:
            write_report(rep, out)
            if on_done is not None:
                on_done(rep)
        known = [name for name in names if name not in unknown]
        todo = list(dict.fromkeys(m for name in known for m in GROUPS.get(name, [name])))
        for k, n in enumerate(todo, 1):
            if on_start is not None:
                on_start(n, k, len(todo))
            start = time.perf_counter()
            try:
                rep = STUDIES[n](out, quick, **per_study.get(n, {}))
                rep.seconds = time.perf_counter() - start
            except Exception as exc:  # this study cannot run; the next one still can
                log.debug("study %s raised", n, exc_info=True)
                frame = traceback.extract_tb(exc.__traceback__)[-1]
                rep = StudyReport(
                    n,
                    error=_one_line(exc),
                    seconds=time.perf_counter() - start,
                    notes=[
                        f"raised in {frame.filename}:{frame.lineno} ({frame.name}); "
                        "`wflow -v validate` logs the traceback"
                    ],
                )
            write_report(rep, out)
            reports.append(rep)
            if on_done is not None:
                on_done(rep)
    return reports
