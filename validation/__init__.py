"""Entry points of the validation studies and the reports of their full runs.

The studies themselves live in the installed package (:mod:`wflow.studies`, run by
``wflow validate``); the modules here only call them and record where a report came from.
``python -m validation STUDY ...`` runs any registered study; ``python -m validation.eulerian``,
``validation.jko`` and ``validation.mean_field`` run one each.  ``validation/reports/`` holds the
full runs' reports (Markdown, CSV, PNG), each headed by the command and the commit that produced it.
"""
