"""`wflow validate`: its exit status when a study fails or cannot run, and studies that run from a wheel.

The studies live in the installed package (wflow.studies); nothing in it may reach for the source
checkout (the top-level validation/ folder holds entry points and reports only).
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from wflow.cli import main
from wflow.studies import report

PACKAGE = Path(report.__file__).resolve().parents[1]
CHECKOUT = Path(__file__).resolve().parents[1]

#: the studies wflow validate must always know (the CLI's help and docs/validation.md list them)
EXPECTED = {
    "mean-field",
    "eulerian",
    "jko",
    "mean-field-zonal",
    "perceptron",
    "staircase",
    "phase-diagram",
    "metastable",
    "dichotomy",
    "mean-shift",
    "normalization",
    "long-context",
}


def _passing(name):
    def study(out, quick):
        rep = report.StudyReport(name)
        rep.expect("one", 1.0, 1.0, 1.0)
        return rep

    return study


def test_a_study_that_raises_fails_the_run_and_the_others_still_run(tmp_path, monkeypatch, capsys):
    def broken(out, quick):
        raise RuntimeError("the solver diverged\nsecond line")

    monkeypatch.setitem(report.STUDIES, "broken", broken)
    monkeypatch.setitem(report.STUDIES, "fine", _passing("fine"))
    assert main(["validate", "broken", "fine", "--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        f"broken: FAILED, could not run: RuntimeError: the solver diverged -> {tmp_path / 'broken.md'}"
    )
    assert out[1].startswith("fine: passed")  # the next study ran
    md = (tmp_path / "broken.md").read_text()
    assert "FAILED in 0 s: could not run (RuntimeError: the solver diverged)" in md
    assert "test_validate.py" in md  # where it raised


def test_a_study_that_raises_a_value_error_is_a_failed_study_not_bad_input(
    tmp_path, monkeypatch, capsys
):
    def broken(out, quick):
        raise ValueError("beta must be positive, got -1")

    monkeypatch.setitem(report.STUDIES, "broken", broken)
    assert main(["validate", "broken", "--out", str(tmp_path)]) == 1
    assert "broken: FAILED, could not run: ValueError: beta must be" in capsys.readouterr().out


def test_a_failed_expectation_or_no_expectation_fails_the_run(tmp_path, monkeypatch, capsys):
    def failing(out, quick):
        rep = report.StudyReport("failing")
        rep.expect("order", 1.2, 1.8, 2.2)
        return rep

    monkeypatch.setitem(report.STUDIES, "failing", failing)
    monkeypatch.setitem(report.STUDIES, "empty", lambda out, quick: report.StudyReport("empty"))
    monkeypatch.setitem(report.STUDIES, "fine", _passing("fine"))
    assert main(["validate", "failing", "fine", "--out", str(tmp_path)]) == 1
    # a study that states nothing (what `eulerian` returned from a wheel) fails, and says why
    assert main(["validate", "empty", "fine", "--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "empty: FAILED" in out and "FAIL the study stated no expectation" in out
    assert main(["validate", "fine", "--out", str(tmp_path)]) == 0


def test_a_study_module_that_cannot_be_imported_fails_the_run(tmp_path, monkeypatch, capsys):
    broken = "wflow.studies.no_such_study_module"
    monkeypatch.setattr(report, "STUDY_MODULES", (*report.STUDY_MODULES, broken))
    monkeypatch.setitem(report.STUDIES, "fine", _passing("fine"))
    assert report.load_all() == {broken: f"ModuleNotFoundError: No module named '{broken}'"}
    assert main(["validate", "fine", "--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{broken}: FAILED, could not run: cannot be imported (Module")
    assert out[1].startswith("fine: passed")
    # a name that may live in the broken module: not "bad input" (exit 2), a study that cannot run
    assert main(["validate", "lost-study", "--out", str(tmp_path)]) == 1
    assert (
        f"lost-study: FAILED, could not run: not registered; study modules that could not be imported: {broken}"
        in capsys.readouterr().out
    )


def test_every_study_is_registered_by_a_listed_module_of_the_package():
    assert report.load_all() == {}
    assert EXPECTED <= set(report.STUDIES)
    for name, fn in report.STUDIES.items():
        assert fn.__module__ in report.STUDY_MODULES, (name, fn.__module__)
        assert Path(sys.modules[fn.__module__].__file__).resolve().is_relative_to(PACKAGE)


def test_every_study_registers_from_a_copy_of_the_package_alone(tmp_path):
    """Only a copy of wflow/ on the path (no checkout, no validation/): every study module imports."""
    site = tmp_path / "site"
    shutil.copytree(PACKAGE, site / "wflow", ignore=shutil.ignore_patterns("__pycache__"))
    code = (
        "import sys, wflow.studies as s\n"
        "errors = s.load_all()\n"
        "wflow_file = s.__file__\n"
        f"assert not errors and set(s.STUDIES) >= set({sorted(EXPECTED)!r})\n"
        "assert 'validation' not in sys.modules\n"
        f"assert wflow_file.startswith({str(site)!r})\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr
