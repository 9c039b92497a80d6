"""Batches of systems: the check of a batch of points and its chunks, shared by the batched diagnostics."""

from __future__ import annotations

import numpy as np

__all__ = ["as_batch", "batch_chunks", "BATCH_ELEMENTS"]

#: Entries of the ``(systems, n, n)`` temporaries held at once (about 32 MB of float64).
BATCH_ELEMENTS = 1 << 22


def as_batch(points, name: str = "points") -> np.ndarray:
    """``points`` as a float32 or float64 array of shape (..., n, d), n >= 1, d >= 2, checked finite."""
    x = np.asarray(points)
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float64)
    if x.ndim < 2 or x.shape[-1] < 2 or x.shape[-2] < 1:
        raise ValueError(
            f"{name} must have shape (..., n, d) with n >= 1 and d >= 2, got shape {x.shape}"
        )
    if not np.isfinite(x).all():
        raise ValueError(f"{name} contains non-finite values (NaN or inf)")
    return x


def batch_chunks(B: int, n: int):
    """Slices of B systems of n points whose (systems, n, n) temporaries hold about :data:`BATCH_ELEMENTS` numbers."""
    step = max(1, BATCH_ELEMENTS // max(1, n * n))
    for b0 in range(0, B, step):
        yield slice(b0, min(B, b0 + step))
