"""Validation studies (``wflow validate``): the machinery in :mod:`~wflow.studies.report`, the studies in
:mod:`wflow.validate` and the modules listed in :data:`~wflow.studies.report.STUDY_MODULES`."""

from .report import (
    STUDIES,
    Expectation,
    StudyReport,
    fit_slope,
    load_all,
    register,
    run_studies,
    write_report,
)

__all__ = [
    "STUDIES",
    "Expectation",
    "StudyReport",
    "fit_slope",
    "load_all",
    "register",
    "run_studies",
    "write_report",
]
