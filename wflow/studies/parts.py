"""Finished parts of a study survive an interruption: :class:`Parts` stores each part's arrays once computed.

A long study (``wflow validate papers`` without ``--quick``) is a list of parts -- one beta, one dimension,
one seed batch.  ``parts.get(key, compute)`` returns the stored result of ``key`` if an earlier run finished
it, and otherwise calls ``compute()`` and stores what it returns (a dict of arrays and numbers) in
``<out>/parts/<study>/<name>.npz``, written to a temporary file and renamed (atomic on POSIX), so a part is
either complete on disk or absent.  The key records the mode and every parameter of the part: a quick run
never hands its parts to a full one, and a part whose parameters changed is recomputed.

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

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np

__all__ = ["Parts"]


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
        self.folder = Path(out) / "parts" / study
        self.quick = bool(quick)
        self.reused = 0
        self.computed = 0

    def _name(self, key: dict[str, Any]) -> tuple[str, str]:
        text = json.dumps({"quick": self.quick, **key}, sort_keys=True, default=str)
        return hashlib.sha1(text.encode()).hexdigest()[:16], text

    def get(self, key: dict[str, Any], compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """The stored part ``key`` or ``compute()``'s result, stored before it is returned.

        ``compute`` returns a dict of names to arrays or numbers; they come back as arrays (numbers as
        0-d arrays converted back with ``.item()``)."""
        if not isinstance(key, dict):
            raise TypeError(f"key must be a dict of the part's parameters, got {type(key).__name__}")
        name, text = self._name(key)
        path = self.folder / f"{name}.npz"
        if path.exists():
            with np.load(path, allow_pickle=False) as z:
                if str(z["__key__"]) == text:
                    self.reused += 1
                    return {k: (z[k].item() if z[k].ndim == 0 else z[k]) for k in z.files if k != "__key__"}
        value = compute()
        if not isinstance(value, dict):
            raise TypeError(f"a part must return a dict of arrays, got {type(value).__name__}")
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{name}.{os.getpid()}.tmp.npz")
        np.savez(tmp, __key__=np.array(text), **{k: np.asarray(v) for k, v in value.items()})
        os.replace(tmp, path)
        self.computed += 1
        return {k: (np.asarray(v).item() if np.ndim(v) == 0 else np.asarray(v)) for k, v in value.items()}

    def note(self) -> str:
        """A line for the report: how many parts were reused from an earlier (interrupted) run."""
        return f"parts: {self.computed} computed, {self.reused} reused from an earlier run ({self.folder})"
