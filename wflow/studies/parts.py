"""Finished parts of a study survive an interruption: :class:`Parts` stores each part's arrays once computed.

A long study is a list of parts (one beta, one dimension, one seed batch).  ``parts.get(key, compute)``
returns the stored result of ``key`` if an earlier run finished it, else calls ``compute()`` and stores
its dict of arrays in ``<out>/parts/<study>/<name>.npz`` atomically (a temporary file renamed).  The key
records the mode and every parameter of the part: a quick run never hands its parts to a full one, and
a part whose parameters changed is recomputed.  :meth:`Parts.prefetch` computes missing parts on Dask
worker processes (``wflow validate --workers N``).

>>> import tempfile, pathlib
>>> parts = Parts(pathlib.Path(tempfile.mkdtemp()), "demo", quick=True)
>>> calls = []
>>> def compute():
...     calls.append(1)
...     return {"x": np.arange(3), "rate": 0.5}
>>> parts.get({"beta": 1.0}, compute)["rate"], parts.get({"beta": 1.0}, compute)["rate"], len(calls)
(0.5, 0.5, 1)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .progress import phase, shown, steps

__all__ = ["Parts", "workers"]

#: worker processes for :meth:`Parts.prefetch` (set by :func:`workers`; 1: compute in order, in this process)
_WORKERS = 1


@contextlib.contextmanager
def workers(n: int) -> Iterator[None]:
    """Within the block, :meth:`Parts.prefetch` computes missing parts on ``n`` Dask worker processes.

    Examples
    --------
    >>> from wflow.studies import parts
    >>> with parts.workers(2):
    ...     parts._WORKERS
    2
    >>> parts._WORKERS
    1
    """
    global _WORKERS
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"workers must be an integer >= 1, got {n!r}")
    before, _WORKERS = _WORKERS, n
    try:
        yield
    finally:
        _WORKERS = before


def _compute_part(
    out: str, study: str, quick: bool, key: dict[str, Any], fn: Callable, args: tuple
) -> float:
    """On a worker: compute and store one part (unless another run stored it meanwhile); returns the seconds."""
    import time

    start = time.perf_counter()
    with shown(False):  # (the parent process shows a bar over the parts)
        Parts(Path(out), study, quick).get(key, lambda: fn(*args))
    return time.perf_counter() - start


class Parts:
    """The finished parts of one study in ``out/parts/<study>/`` (see the module docstring).

    Parameters
    ----------
    out : Path
        The report folder of ``wflow validate``.
    study : str
        The study's name.
    quick : bool
        The mode; part of every key.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> out = pathlib.Path(tempfile.mkdtemp())
    >>> Parts(out, "demo", quick=True).get({"beta": 2.0}, lambda: {"rate": 1.5})["rate"]
    1.5
    >>> again = Parts(out, "demo", quick=True)           # a later run: the part is on disk
    >>> again.get({"beta": 2.0}, lambda: {"rate": -1.0})["rate"], again.note().split(" (")[0]
    (1.5, 'parts: 0 computed, 1 reused from an earlier run')
    >>> Parts(out, "demo", quick=False).get({"beta": 2.0}, lambda: {"rate": 2.5})["rate"]  # full mode: its own
    2.5
    """

    def __init__(self, out: Path, study: str, quick: bool):
        self.out, self.study = Path(out), study
        self.folder = Path(out) / "parts" / study
        self.quick = bool(quick)
        self.reused = 0
        self.computed = 0

    def _name(self, key: dict[str, Any]) -> tuple[str, str]:
        text = json.dumps({"quick": self.quick, **key}, sort_keys=True, default=str)
        return hashlib.sha1(text.encode()).hexdigest()[:16], text

    def get(
        self, key: dict[str, Any], compute: Callable[[], dict[str, Any]], what: str | None = None
    ) -> dict[str, Any]:
        """The stored part ``key`` or ``compute()``'s result (a dict of arrays or numbers), stored first.

        ``what`` is announced on stderr (:func:`wflow.studies.progress.phase`) before ``compute`` runs."""
        if not isinstance(key, dict):
            raise TypeError(
                f"key must be a dict of the part's parameters, got {type(key).__name__}"
            )
        name, text = self._name(key)
        path = self.folder / f"{name}.npz"
        if path.exists():
            with np.load(path, allow_pickle=False) as z:
                if str(z["__key__"]) == text:
                    self.reused += 1
                    return {
                        k: (z[k].item() if z[k].ndim == 0 else z[k])
                        for k in z.files
                        if k != "__key__"
                    }
        if what is not None:
            phase(self.study, what)
        value = compute()
        if not isinstance(value, dict):
            raise TypeError(f"a part must return a dict of arrays, got {type(value).__name__}")
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{name}.{os.getpid()}.tmp.npz")
        # Any: savez's signature types its other keywords (allow_pickle) beside **arrays
        arrays: dict[str, Any] = {k: np.asarray(v) for k, v in value.items()}
        np.savez(tmp, __key__=np.array(text), **arrays)
        os.replace(tmp, path)
        self.computed += 1
        return {
            k: (np.asarray(v).item() if np.ndim(v) == 0 else np.asarray(v))
            for k, v in value.items()
        }

    def has(self, key: dict[str, Any]) -> bool:
        """Whether part ``key`` is stored (by this run or an earlier one)."""
        name, text = self._name(key)
        path = self.folder / f"{name}.npz"
        if not path.exists():
            return False
        try:
            with np.load(path, allow_pickle=False) as z:
                return str(z["__key__"]) == text
        except (OSError, ValueError, KeyError):
            return False

    def prefetch(self, jobs: Sequence[tuple[dict[str, Any], Callable, tuple]]) -> int:
        """Compute the missing parts among ``jobs`` on Dask worker processes; returns how many it computed.

        ``jobs`` are ``(key, function, args)``, ``function(*args)`` a module-level function returning the
        part.  With one worker or fewer than two missing parts nothing starts (:meth:`get` computes them
        in order).  A part that fails raises here, after the others are stored.
        """
        missing = [(k, f, a) for k, f, a in jobs if not self.has(k)]
        if _WORKERS <= 1 or len(missing) < 2:
            return 0
        from distributed import as_completed

        from ..sweep import connect, disconnect

        client, cluster, _ = connect(None, min(_WORKERS, len(missing)), timeout=30.0)
        log = logging.getLogger(__name__)
        errors = []
        try:
            where = (str(self.out), self.study, self.quick)
            futures = [
                client.submit(_compute_part, *where, k, f, a, pure=False, retries=2)
                for k, f, a in missing
            ]
            running = f"{len(missing)} parts on {min(_WORKERS, len(missing))} worker processes"
            for fut in steps(self.study, running, as_completed(futures), total=len(futures)):
                try:
                    fut.result()
                except Exception as exc:  # noqa: BLE001 - the other parts go on; the first error is raised
                    errors.append(exc)
            done = len(missing) - len(errors)
            log.info("%s: %d parts computed on %d workers", self.study, done, _WORKERS)
        finally:
            disconnect(client, cluster, True)
        if errors:
            raise errors[0]
        return len(missing)

    def note(self) -> str:
        """A line for the report: parts computed and reused, and their folder relative to the report's."""
        where = Path("parts") / self.folder.name
        return (
            f"parts: {self.computed} computed, {self.reused} reused from an earlier run ({where})"
        )
