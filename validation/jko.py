"""JKO against the finite-volume solver as tau -> 0, and against the heat equation.

``python -m validation.jko [OUT] [--quick]`` runs ``wflow validate jko`` (the study
:mod:`wflow.studies.jko` of the installed package) and heads its report with the command and
the commit (:mod:`validation.run`).  Full runs write into ``validation/reports/``, quick runs
into ``wflow-validation/``; what is computed and expected: docs/validation.md.
"""

import sys

from validation.run import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m validation.jko", study="jko"))
