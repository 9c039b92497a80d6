"""``python -m validation STUDY [STUDY ...] [--quick] [--out DIR] [--workers N] [--option KEY=VALUE]``: see :mod:`validation.run`."""

import sys

from validation.run import main

if __name__ == "__main__":
    sys.exit(main())
