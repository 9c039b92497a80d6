r"""The model contract: :class:`Model` (a velocity field that depends on a measure, and for gradient
flows its energy), sums of models, what a solver needs to fuse a step (:class:`FusedAttention`), and
the registry that turns a model's description back into the model (:func:`model_from_dict`), where
every model type registers itself (:func:`register_model`).
"""

from __future__ import annotations

import importlib
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from .._typing import ArrayLike
from ..errors import NotAGradientFlowError, short_repr
from ..measure import Atoms, as_atoms

__all__ = [
    "Model",
    "SumModel",
    "FusedAttention",
    "WASSERSTEIN",
    "REWEIGHTED",
    "MODEL_TYPES",
    "register_model",
    "model_from_dict",
    "as_matrix",
]

#: Metric in which a gradient model ascends its energy.
WASSERSTEIN = "wasserstein"
REWEIGHTED = "sa-reweighted"


@dataclass(frozen=True)
class FusedAttention:
    r"""What a solver needs to fuse a model's step: softmax attention with :math:`Q = K = V = I`,

    .. math::

        v[\mu](x) = P_x\Big(\frac{\int e^{\beta\langle x, y\rangle} y\,d\mu(y)}{\int e^{\beta\langle x, y\rangle}d\mu(y)}\Big),

    at inverse temperature ``beta`` on the ``n`` tokens it was asked for (:meth:`Model.fused_attention`),
    and the log of its kernel's scale ``offset`` (0, or ``beta`` for the rescaled kernel), which turns
    the double sums of a fused step into the model's energy (:meth:`log_energy`).

    Examples
    --------
    >>> import math, wflow
    >>> spec = wflow.SA(2.0).fused_attention(16)
    >>> spec.beta, spec.offset, math.isclose(spec.log_energy(math.log(4.0)), math.log(4.0 / (2 * 2.0)))
    (2.0, 0.0, True)
    >>> wflow.USA(2.0).fused_attention(16) is None  # only SA's step is fused
    True
    """

    beta: float
    offset: float = 0.0

    def log_energy(self, log_double_sums: Any) -> Any:
        r""":math:`\log E_\beta = \log\sum_i w_i\sum_j w_j e^{\beta\langle x_i, x_j\rangle} - \log 2\beta - o`
        from the double sums' logarithm, for ``beta > 0``."""
        return log_double_sums - math.log(2 * self.beta) - self.offset


class Model(ABC):
    """Base class: a velocity field on the sphere that depends on a measure.

    Subclasses implement :meth:`velocity` and, for gradient flows, :meth:`energy` and
    :meth:`first_variation`.  :attr:`dim` is the ambient dimension ``d`` the model's
    matrices fix, or ``None`` if it works in any dimension.

    Examples
    --------
    >>> import wflow
    >>> from wflow.models import Model
    >>> isinstance(wflow.SA(1.0), Model), wflow.USA(1.0).is_gradient, wflow.SA(1.0).metric
    (True, True, 'sa-reweighted')
    """

    dim: int | None = None
    #: ``"sphere"``: points on :math:`S^{d-1}`, tangent velocities; ``"free"``: tokens :math:`x = r\theta` in
    #: :math:`\mathbb{R}^d` (normalization schemes with radii, :mod:`wflow.schemes`)
    space: str = "sphere"

    @abstractmethod
    def velocity(self, x: ArrayLike, mu: Atoms, *, backend: str = "auto") -> np.ndarray:
        r"""Velocity :math:`v[\mu](x)` at query points ``x`` of shape ``(..., n, d)``; tangent at ``x``."""

    # -- time ------------------------------------------------------------------
    @property
    def time_dependent(self) -> bool:
        """True when the model changes with time (layers, schedules, time-dependent speeds)."""
        return False

    def at(self, t: float, *, piece: float | None = None) -> Model:
        """The model acting at time ``t`` (a time-independent one: itself).

        ``piece``: a time in the same piece (between two :meth:`breakpoints`) as the one wanted, which
        side of a breakpoint ``t`` is on (solvers pass a step's midpoint); None: ``t`` itself.
        """
        return self

    def breakpoints(self, t0: float, t_end: float) -> np.ndarray:
        """Times in ``(t0, t_end)`` where the model jumps (layer boundaries); adaptive steps land on them."""
        return np.empty(0)

    @property
    def ordered(self) -> bool:
        """True when the velocity depends on the tokens' order, not on the measure alone (causal
        masking): the mean-field solvers refuse it."""
        return False

    # -- fused steps -------------------------------------------------------------
    def fused_attention(self, n: int) -> FusedAttention | None:
        """A :class:`FusedAttention` when a solver may fuse this model's step on systems of ``n``
        tokens (SA with :math:`Q = K = V = I`), else ``None``.  A subclass that changes the velocity
        of such a model must return ``None``."""
        return None

    # -- gradient structure ----------------------------------------------------
    def gradient_obstruction(self) -> str | None:
        """``None`` if the model is a gradient flow, else the condition that fails."""
        return f"{type(self).__name__} has no gradient structure"

    @property
    def is_gradient(self) -> bool:
        return self.gradient_obstruction() is None

    @property
    def metric(self) -> str:
        """``"wasserstein"`` (plain W2) or ``"sa-reweighted"`` (W2 weighted by Z_mu)."""
        return WASSERSTEIN

    def _require_gradient(self) -> None:
        why = self.gradient_obstruction()
        if why is not None:
            raise NotAGradientFlowError(
                f"{self!r} is not a gradient flow, so it has no energy: {why}"
            )

    def energy(self, mu: Atoms, *, backend: str = "auto") -> np.ndarray:
        r"""The functional :math:`F(\mu)` the flow ascends (module docstring), shape ``batch``."""
        self._require_gradient()
        mu = as_atoms(mu)
        return self._energy(mu, backend)

    def first_variation(self, x: ArrayLike, mu: Atoms, *, backend: str = "auto") -> np.ndarray:
        r""":math:`\delta F/\delta\mu(x)` at points ``x`` of shape ``(..., n, d)``, shape ``(..., n)``."""
        self._require_gradient()
        mu = as_atoms(mu)
        x = self._check_query(x, mu)
        return self._first_variation(x, mu, backend)

    def _energy(self, mu: Atoms, backend: str) -> np.ndarray:  # pragma: no cover
        raise NotAGradientFlowError(f"{self!r} defines no energy")

    def _first_variation(self, x: np.ndarray, mu: Atoms, backend: str) -> np.ndarray:
        raise NotAGradientFlowError(f"{self!r} defines no first variation")

    # -- composition and serialisation ----------------------------------------
    def __add__(self, other: Model) -> SumModel:
        if not isinstance(other, Model):
            return NotImplemented
        return SumModel([*self.parts, *other.parts])

    @property
    def parts(self) -> list[Model]:
        return [self]

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable description; :func:`model_from_dict` inverts it."""

    def _check_query(self, x: ArrayLike, mu: Atoms) -> np.ndarray:
        x = np.asarray(x)
        if x.ndim < 2:
            raise ValueError(f"x must have shape (..., n, d), got shape {x.shape}")
        if x.shape[-1] != mu.d:
            raise ValueError(f"x has dimension d={x.shape[-1]} but the measure has d={mu.d}")
        self.check_dimension(mu.d)
        return x

    def rate_bound(self) -> float:
        """A rough bound on the Lipschitz constant of the velocity field (sets default fixed steps)."""
        return 1.0

    def check_dimension(self, d: int) -> None:
        """Raise ``ValueError`` if the model cannot act on points of dimension ``d``."""
        if self.dim is not None and d != self.dim:
            raise ValueError(f"{self!r} works in dimension d={self.dim}, but the measure has d={d}")


def as_matrix(M: Any, name: str, ndim: int = 2) -> np.ndarray | None:
    """``M`` as a finite real float64 array of ``ndim`` axes (``None`` stays ``None``); a TypeError or
    ValueError naming ``name`` otherwise."""
    if M is None:
        return None
    A = np.asarray(M)
    if A.dtype == object or not (np.issubdtype(A.dtype, np.number)) or np.iscomplexobj(A):
        what = "matrix" if ndim == 2 else "array"
        raise TypeError(f"{name} must be a real {what}, got {short_repr(M)}")
    A = A.astype(np.float64)
    if A.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} axes, got shape {A.shape}")
    if not np.all(np.isfinite(A)):
        raise ValueError(f"{name} contains non-finite values: {short_repr(A)}")
    return A


class SumModel(Model):
    """Sum of blocks: the velocity is the sum of the blocks' velocities.

    It is a gradient flow when every block is one in the plain Wasserstein metric
    (USA with V = +-I, conservative perceptrons), or when it has a single block.

    Examples
    --------
    >>> import numpy as np, wflow
    >>> rng = np.random.default_rng(0)
    >>> A = rng.standard_normal((4, 3))
    >>> usa, block = wflow.USA(1.0), wflow.Perceptron(A.T, A)
    >>> model = usa + block  # a SumModel
    >>> type(model).__name__, len(model.parts), model.is_gradient
    ('SumModel', 2, True)
    >>> x = wflow.sphere.uniform(5, 3, seed=0)
    >>> mu = wflow.Atoms(x)
    >>> v = model.velocity(x, mu, backend="numpy")
    >>> bool(np.allclose(v, usa.velocity(x, mu, backend="numpy") + block.velocity(x, mu)))
    True
    """

    def __init__(self, parts: list[Model]):
        if not parts:
            raise ValueError("a SumModel needs at least one block")
        dims = {p.dim for p in parts if p.dim is not None}
        if len(dims) > 1:
            raise ValueError(f"blocks act on different dimensions: {sorted(dims)}")
        if any(p.space != "sphere" for p in parts):
            raise ValueError(
                "blocks of a sum act on the sphere; a scheme with radii (pre-ln, peri-ln, mix-ln) takes its "
                "perceptron as Normalized(attention, scheme, perceptron=...)"
            )
        self._parts = list(parts)
        self.dim = dims.pop() if dims else None

    @property
    def parts(self) -> list[Model]:
        return list(self._parts)

    def rate_bound(self) -> float:
        return float(sum(p.rate_bound() for p in self._parts))

    @property
    def ordered(self) -> bool:
        return any(p.ordered for p in self._parts)

    @property
    def time_dependent(self) -> bool:
        return any(p.time_dependent for p in self._parts)

    def at(self, t: float, *, piece: float | None = None) -> Model:
        return (
            SumModel([p.at(t, piece=piece) for p in self._parts]) if self.time_dependent else self
        )

    def breakpoints(self, t0: float, t_end: float) -> np.ndarray:
        return np.unique(
            np.concatenate([np.empty(0)] + [p.breakpoints(t0, t_end) for p in self._parts])
        )

    def velocity(self, x: ArrayLike, mu: Atoms, *, backend: str = "auto") -> np.ndarray:
        x = self._check_query(x, mu)
        out = self._parts[0].velocity(x, mu, backend=backend)
        for p in self._parts[1:]:
            out = out + p.velocity(x, mu, backend=backend)
        return out

    def gradient_obstruction(self) -> str | None:
        for p in self._parts:
            why = p.gradient_obstruction()
            if why is not None:
                return f"block {p!r}: {why}"
        if len(self._parts) > 1 and any(p.metric != WASSERSTEIN for p in self._parts):
            return (
                "SA ascends its energy in a metric reweighted by Z_mu, other blocks in the plain Wasserstein "
                "metric: their sum is not the gradient flow of one energy (use USA for a gradient sum)"
            )
        return None

    @property
    def metric(self) -> str:
        return self._parts[0].metric if len(self._parts) == 1 else WASSERSTEIN

    def _energy(self, mu: Atoms, backend: str) -> np.ndarray:
        return cast(np.ndarray, sum(p._energy(mu, backend) for p in self._parts))

    def _first_variation(self, x: np.ndarray, mu: Atoms, backend: str) -> np.ndarray:
        return cast(np.ndarray, sum(p._first_variation(x, mu, backend) for p in self._parts))

    def to_dict(self) -> dict[str, Any]:
        return {"type": "Sum", "parts": [p.to_dict() for p in self._parts]}

    def __repr__(self) -> str:
        return " + ".join(repr(p) for p in self._parts)


#: model type (``to_dict()["type"]``) -> (the keys its description may have, its builder)
MODEL_TYPES: dict[str, tuple[frozenset[str], Callable[[dict[str, Any]], Model]]] = {}


def register_model(
    name: str, keys: Iterable[str], build: Callable[[dict[str, Any]], Model]
) -> None:
    """Make :func:`model_from_dict` build descriptions of type ``name`` (whose keys are among ``keys``,
    ``"type"`` included) by ``build(spec)``; the modules defining models call it at import."""
    MODEL_TYPES[name] = (frozenset(keys), build)


#: model types registered outside wflow.models, by their module (imported when such a model is read)
_MODEL_MODULES = {"Normalized": "wflow.schemes", "Layered": "wflow.schemes"}


def model_from_dict(spec: dict[str, Any]) -> Model:
    """Inverse of :meth:`Model.to_dict`; rejects unknown types and keys.

    Examples
    --------
    >>> import wflow
    >>> from wflow.models import model_from_dict
    >>> spec = wflow.SA(2.0).to_dict()
    >>> spec
    {'type': 'SA', 'beta': 2.0}
    >>> model_from_dict(spec)
    SA(beta=2)
    """
    if not isinstance(spec, dict):
        raise TypeError(f"a model description must be a dict, got {short_repr(spec)}")
    kind = spec.get("type")
    if kind not in MODEL_TYPES and kind in _MODEL_MODULES:  # its module not yet imported
        importlib.import_module(_MODEL_MODULES[kind])
    if kind not in MODEL_TYPES:
        raise ValueError(
            f"model type must be one of {sorted(MODEL_TYPES.keys() | _MODEL_MODULES.keys())}, "
            f"got {kind!r}"
        )
    keys, build = MODEL_TYPES[kind]
    unknown = set(spec) - keys
    if unknown:
        raise ValueError(
            f"unknown keys for a {kind} model: {sorted(unknown)} (allowed: {sorted(keys)})"
        )
    return build(spec)


register_model(
    "Sum", {"type", "parts"}, lambda spec: SumModel([model_from_dict(p) for p in spec["parts"]])
)
