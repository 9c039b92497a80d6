"""Where a running study is: one line on stderr per phase that may take seconds, a bar for long loops.

Studies announce their phases through :func:`phase` and loops of many similar items through
:func:`steps` (a tqdm bar when stderr is a terminal, else one line); :func:`shown` turns both off
within a block.  Results stay on stdout.

>>> import contextlib, io
>>> err = io.StringIO()
>>> with contextlib.redirect_stderr(err):
...     phase("demo", "a phase that takes seconds")
...     items = [k for k in steps("demo", "three items", range(3))]  # a bar on a terminal
>>> items, err.getvalue().splitlines()
([0, 1, 2], ['demo: a phase that takes seconds', 'demo: three items (3)'])
"""

from __future__ import annotations

import contextlib
import itertools
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

__all__ = ["phase", "steps", "shown", "numbered"]

T = TypeVar("T")

#: whether :func:`phase` and :func:`steps` write (set by :func:`shown`)
_SHOWN = True


@contextlib.contextmanager
def shown(flag: bool) -> Iterator[None]:
    """Within the block, study progress lines and bars are written (``True``) or not (``False``).

    Examples
    --------
    >>> import contextlib, io
    >>> err = io.StringIO()
    >>> with contextlib.redirect_stderr(err):
    ...     phase("demo", "written")
    ...     with shown(False):
    ...         phase("demo", "not written")
    ...         _ = list(steps("demo", "nor this", range(3)))
    >>> err.getvalue().splitlines()
    ['demo: written']
    """
    global _SHOWN
    if not isinstance(flag, bool):
        raise TypeError(f"progress must be True or False, got {flag!r}")
    before, _SHOWN = _SHOWN, flag
    try:
        yield
    finally:
        _SHOWN = before


def phase(study: str, what: str) -> None:
    """One line on stderr, ``"{study}: {what}"``: what the study starts now (a step that may take seconds)."""
    if _SHOWN:
        print(f"{study}: {what}", file=sys.stderr, flush=True)


def numbered(total: int) -> Callable[[str], str]:
    """Labels for a study's ``total`` phases, counted: each call adds the next ``(k/total)``.

    Examples
    --------
    >>> label = numbered(3)
    >>> label("S1 SA: 102 particle runs"), label("S1 SA: finite-volume check")
    ('S1 SA: 102 particle runs (1/3)', 'S1 SA: finite-volume check (2/3)')
    """
    count = itertools.count(1)
    return lambda what: f"{what} ({next(count)}/{total})"


def steps(
    study: str, what: str, items: Iterable[T], total: int | None = None, *, announced: bool = False
) -> Iterator[T]:
    """Iterate over ``items`` (a loop of many similar steps) with a tqdm bar ``"{study}: {what}"`` on
    stderr when it is a terminal, else one :func:`phase` line ``"{study}: {what} ({total})"``.

    ``total`` defaults to ``len(items)``.  ``announced``: the phase's line is written already (the bar
    only, on a terminal).  While the bar is drawn, numba compilations show in its label.
    """
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    if not _SHOWN:
        yield from items
        return
    if not getattr(sys.stderr, "isatty", lambda: False)():
        if not announced:
            phase(study, what if total is None else f"{what} ({total})")
        yield from items
        return
    from tqdm import tqdm

    from ..kernels.jit import compile_notices

    desc = f"{study}: {what}"
    with tqdm(total=total, desc=desc, file=sys.stderr, dynamic_ncols=True) as bar:

        def compiling(name: str, cached: bool, seconds: float | None) -> None:
            bar.set_description_str(f"{desc} [compiling {name}]" if seconds is None else desc)

        with compile_notices(compiling):
            for item in items:
                yield item
                bar.update()
