"""Mean-field convergence: finite-N particle systems against the continuum, on S^1 and S^2.

``python -m validation.mean_field [OUT] [--quick]`` runs ``wflow validate mean-field`` (the study
:mod:`wflow.studies.mean_field` of the installed package) and heads its report with the command and
the commit (:mod:`validation.run`).  Full runs write into ``validation/reports/``, quick runs
into ``wflow-validation/``; what is computed and expected: docs/validation.md.
"""

import sys

from validation.run import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m validation.mean_field", study="mean-field"))
