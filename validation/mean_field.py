"""Mean-field convergence: finite-N particle systems against the continuum, on S^1 and S^2.

Run: ``python -m validation.mean_field [OUTDIR] [--quick]`` (the same study as
``wflow validate mean-field``; the code lives in :func:`wflow.validate.mean_field` so that an
installed package can run it).  Writes ``OUTDIR/mean-field.md``, ``.csv`` and figures, prints
one line per stated expectation and exits with status 1 when one fails.  What is computed,
what is expected and the measured run times: docs/validation.md ("mean-field").
"""

from __future__ import annotations

import argparse
import sys

from wflow.cli import main as wflow_main


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", default="validation-report", help="report folder")
    p.add_argument("--quick", action="store_true", help="the CI mode (a few minutes)")
    args = p.parse_args(argv)
    return wflow_main(
        ["validate", "mean-field", "--out", args.out] + (["--quick"] if args.quick else [])
    )


if __name__ == "__main__":
    sys.exit(main())
