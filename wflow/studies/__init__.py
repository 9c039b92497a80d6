"""Validation studies (``wflow validate``): the machinery in :mod:`~wflow.studies.report`, one study per
module listed in :data:`~wflow.studies.report.STUDY_MODULES` (:mod:`~wflow.studies.mean_field`,
:mod:`~wflow.studies.eulerian`, :mod:`~wflow.studies.jko`, :mod:`~wflow.studies.zonal`, the papers'
experiments ...), resumable parts in :mod:`~wflow.studies.parts`."""

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
