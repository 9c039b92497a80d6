"""Finite volume against theory: growth rates, orders, heat equation, cluster formation.

``python -m validation.eulerian [OUT] [--quick]`` runs ``wflow validate eulerian`` (the study
:mod:`wflow.studies.eulerian` of the installed package) and heads its report with the command and
the commit (:mod:`validation.run`).  Full runs write into ``validation/reports/``, quick runs
into ``wflow-validation/``; what is computed and expected: docs/validation.md.
"""

import sys

from validation.run import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m validation.eulerian", study="eulerian"))
