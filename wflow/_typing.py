"""Shared type aliases."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["Array", "ArrayLike", "SeedLike", "FloatArray"]

Array = NDArray[np.floating]
FloatArray = NDArray[np.float64]
SeedLike = None | int | np.random.Generator | np.random.SeedSequence
