r"""Normalization schemes and layer-dependent parameters: models whose speed, space or weights change.

A token is :math:`x_i = r_i\theta_i`; every scheme moves the directions by
:math:`\theta_i' = P_{\theta_i}U_i / s_i(t)`, :math:`U_i` the block's update from the directions,
and the radii by its own law (Rigollet 2025, §5; Karagodin, Geshkovski, Polyanskiy & Rigollet
2025; the table: ``docs/schemes.md``).  Pre-, Peri- and Mix-LN carry radii (``space = "free"``).

:class:`Layered` and :class:`TimeDependent`: parameters that change with depth; solvers evaluate
``model.at(t)`` (every stage of a step sees the layer the step lies in).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ._typing import ArrayLike
from .errors import check_nonnegative, check_positive, short_repr
from .measure import Atoms
from .models import SA, USA, Attention, Model, Perceptron, model_from_dict, register_model
from .sphere import project

__all__ = ["SCHEMES", "Normalized", "Layered", "TimeDependent", "layer_map"]

#: normalization schemes by name
SCHEMES = ("post-ln", "pre-ln", "peri-ln", "mix-ln", "ngpt", "sqrt")
_FREE = ("pre-ln", "peri-ln", "mix-ln")


def _norm(u: np.ndarray) -> np.ndarray:
    return np.sqrt(np.einsum("...i,...i->...", u, u))


class Normalized(Model):
    r"""An attention block (and optionally a perceptron) under a normalization scheme (module docstring).

    Parameters
    ----------
    attention : SA or USA
        The attention block (any Q, K, V, kernel convention, long-context scaling).
    scheme : {"post-ln", "pre-ln", "peri-ln", "mix-ln", "ngpt", "sqrt"}
    tau : float, optional
        Mix-LN: the switch time from Post-LN to Pre-LN (``>= 0``).
    alpha : float, callable or array_like, optional
        nGPT step :math:`\alpha(t) > 0`: a constant (default 1), a function of t, or values at
        ``alpha_times`` (linear in between, constant beyond the ends).
    alpha_times : array_like, optional
        Increasing times of the ``alpha`` values.
    perceptron : Perceptron, optional
        Added to the update before the scheme acts (:math:`U = A + W\sigma(A\theta + b)`).

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.schemes import Normalized
    >>> x0 = 1.5 * wflow.sphere.uniform(8, 3, seed=0)          # tokens with radius 1.5
    >>> traj = wflow.simulate(Normalized(wflow.SA(1.0), "pre-ln"), x0, 1.0, dt=0.05)
    >>> traj.radii.shape, bool(np.allclose(np.linalg.norm(traj.points, axis=-1), 1))
    ((11, 8), True)
    """

    def __init__(
        self,
        attention: Model,
        scheme: str = "post-ln",
        *,
        tau: float | None = None,
        alpha: Any = None,
        alpha_times: ArrayLike | None = None,
        perceptron: Model | None = None,
    ):
        if not isinstance(attention, Attention):
            raise TypeError(f"attention must be an SA or USA block, got {short_repr(attention)}")
        if scheme not in SCHEMES:
            raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
        if perceptron is not None and not isinstance(perceptron, Perceptron):
            raise TypeError(
                f"perceptron must be a wflow Perceptron or None, got {short_repr(perceptron)}"
            )
        self.attention, self.scheme, self.perceptron = attention, scheme, perceptron
        dims = {m.dim for m in (attention, perceptron) if m is not None and m.dim is not None}
        if len(dims) > 1:
            raise ValueError(
                f"attention and perceptron act on different dimensions: {sorted(dims)}"
            )
        self.dim = dims.pop() if dims else None
        self.space = "free" if scheme in _FREE else "sphere"
        self.tau: float | None = None
        if scheme == "mix-ln":
            if tau is None:
                raise ValueError("scheme 'mix-ln' needs the switch time tau")
            self.tau = check_nonnegative(tau, "tau")
        elif tau is not None:
            raise ValueError(f"tau is the switch time of 'mix-ln', not of {scheme!r}")
        #: nGPT's step: a number, values at alpha_times, or a function of time
        self.alpha: float | np.ndarray | Callable[[float], float] | None = None
        self.alpha_times: np.ndarray | None = None
        if scheme == "ngpt":
            self._set_alpha(1.0 if alpha is None else alpha, alpha_times)
        elif alpha is not None:
            raise ValueError(f"alpha is the step of 'ngpt', not of {scheme!r}")
        self.t = 0.0
        self._pre = self.tau is not None and 0.0 < self.tau  # Mix-LN before its switch (at())

    def _set_alpha(self, alpha: Any, times: ArrayLike | None) -> None:
        if callable(alpha):
            if times is not None:
                raise ValueError("alpha_times goes with alpha given as values, not as a function")
            self.alpha = alpha
            return
        a = np.atleast_1d(np.asarray(alpha, dtype=float))
        if a.ndim != 1 or not np.all(np.isfinite(a)) or np.any(a <= 0):
            raise ValueError(f"alpha must be positive and finite, got {short_repr(alpha)}")
        if a.size == 1 and times is None:
            self.alpha = float(a[0])
            return
        tt = None if times is None else np.asarray(times, dtype=float)
        if (
            tt is None
            or tt.shape != a.shape
            or np.any(np.diff(tt) <= 0)
            or not np.all(np.isfinite(tt))
        ):
            raise ValueError(
                f"alpha_times must be increasing finite times, one per alpha value ({a.size}), "
                f"got {short_repr(times)}"
            )
        self.alpha, self.alpha_times = a, tt

    def alpha_at(self, t: float) -> float:
        """nGPT's step :math:`\\alpha(t)`."""
        if callable(self.alpha):
            a = float(self.alpha(t))
            if not np.isfinite(a) or a <= 0:
                raise ValueError(f"alpha(t) must be positive and finite, got alpha({t:g}) = {a!r}")
            return a
        if self.alpha is None:
            raise ValueError(f"alpha is the step of 'ngpt', not of {self.scheme!r}")
        if self.alpha_times is None:
            return float(self.alpha)
        return float(np.interp(t, self.alpha_times, self.alpha))

    # -- time -------------------------------------------------------------------
    @property
    def time_dependent(self) -> bool:
        return self.scheme in ("sqrt", "mix-ln") or (
            self.scheme == "ngpt" and not isinstance(self.alpha, float)
        )

    def at(self, t: float, *, piece: float | None = None) -> Normalized:
        if not self.time_dependent:
            return self
        m = copy.copy(self)
        m.t = float(t)
        # Mix-LN's switch at tau: the side of tau is that of the piece (a step ending on tau is Pre-LN)
        m._pre = self.tau is not None and (m.t if piece is None else float(piece)) < self.tau
        return m

    def breakpoints(self, t0: float, t_end: float) -> np.ndarray:
        pts: list[float] = []
        if self.tau is not None:  # Mix-LN's switch
            pts = [self.tau]
        elif self.scheme == "ngpt" and self.alpha_times is not None:
            pts = list(self.alpha_times)
        return np.array([p for p in pts if t0 < p < t_end], dtype=float)

    # -- the field ---------------------------------------------------------------
    def update(self, theta: np.ndarray, mu: Atoms, backend: str = "auto") -> np.ndarray:
        """:math:`U(\\theta)`: the attention output (plus the perceptron's) before any projection."""
        u = self.attention.average(theta, mu, backend=backend)
        if self.perceptron is not None:
            u = u + self.perceptron.raw(theta)
        return u

    def velocity(self, x: ArrayLike, mu: Atoms, *, backend: str = "auto") -> np.ndarray:
        """The scheme's velocity at tokens ``x`` (on the sphere, or :math:`x = r\\theta` in free space); ``mu`` holds directions."""
        x = self._check_query(x, mu)
        if self.space == "sphere":
            u = self.update(x, mu, backend)
            v = project(x, u)
            if self.scheme == "sqrt":
                return v / np.sqrt(self.t + 1.0)
            if self.scheme == "ngpt":
                return self.alpha_at(self.t) * v / _norm(u)[..., None]
            return v
        r = _norm(x)
        theta = x / r[..., None]
        u = self.update(theta, mu, backend)
        if self.scheme == "peri-ln":
            return u / _norm(u)[..., None]
        if self.scheme == "mix-ln" and self._pre:
            return r[..., None] * project(theta, u)
        return u

    def plain_attention(self) -> bool:
        """True for the sphere schemes (Post-LN, nGPT, sqrt-scaling) of attention with :math:`Q = K = V = I`
        and no perceptron: fields that commute with rotations and keep tokens in the span of the initial
        ones (``coordinates="span"`` applies)."""
        return (
            self.space == "sphere"
            and self.perceptron is None
            and hasattr(self.attention, "plain_attention")
            and self.attention.plain_attention()
        )

    def sphere_jacobian(
        self, theta: np.ndarray, weights: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        r"""``(dU, dv)``: the exact Jacobians (shape ``(n, n, d, d)``) of the update and of the scheme's velocity
        on the sphere, for the sphere schemes of attention with :math:`Q = K = I`, :math:`V = \pm I` and no
        perceptron (:meth:`wflow.models.SA.sphere_jacobian`); other schemes: ``ValueError``.

        Examples
        --------
        >>> import numpy as np, wflow
        >>> from wflow.schemes import Normalized
        >>> theta, w = wflow.sphere.uniform(3, 3, seed=0), np.full(3, 1 / 3)
        >>> m = Normalized(wflow.SA(1.0), "ngpt", alpha=0.5)
        >>> v = lambda th: m.velocity(th, wflow.Atoms(th, w), backend="numpy")
        >>> e = np.zeros((3, 3)); e[0, 1] = 1e-6
        >>> bool(np.allclose((v(theta + e) - v(theta - e)) / 2e-6, m.sphere_jacobian(theta, w)[1][:, 0, :, 1], atol=1e-8))
        True
        """
        if (
            self.space != "sphere"
            or self.perceptron is not None
            or not hasattr(self.attention, "sphere_jacobian")
        ):
            raise ValueError(
                f"sphere_jacobian covers the sphere schemes of attention without a perceptron, got {self!r}"
            )
        dA, dv = self.attention.sphere_jacobian(theta, weights)
        if self.scheme == "sqrt":
            return dA, dv / np.sqrt(self.t + 1.0)
        if self.scheme == "ngpt":
            theta = np.asarray(theta, dtype=np.float64)
            A = self.attention.average(
                theta, Atoms._trusted(theta, np.asarray(weights, dtype=np.float64)), backend="numpy"
            )
            a = _norm(A)
            v = project(theta, A) / a[:, None]  # P A / |A|
            dv = (dv - v[:, None, :, None] * np.matmul((A / a[:, None])[:, None, None, :], dA)) / a[
                :, None, None, None
            ]
            return dA, self.alpha_at(self.t) * dv
        return dA, dv

    # -- energy (a Lyapunov function of the directions) ----------------------------
    def gradient_obstruction(self) -> str | None:
        why = self.attention.gradient_obstruction()
        if why is not None:
            return why
        if self.perceptron is not None:
            return (
                f"the {self.scheme} scheme with a perceptron has no known Lyapunov function "
                "(without one: the attention energy of the directions)"
            )
        return None

    @property
    def metric(self) -> str:
        """Post-LN: the attention's own; other schemes move at their own speed, no Wasserstein metric."""
        return self.attention.metric if self.scheme == "post-ln" else f"{self.scheme} speed"

    def _energy(self, mu: Atoms, backend: str) -> np.ndarray:
        return self.attention._energy(mu, backend)

    def _first_variation(self, x: np.ndarray, mu: Atoms, backend: str) -> np.ndarray:
        return self.attention._first_variation(x, mu, backend)

    def log_energy(self, mu: Atoms, *, backend: str = "auto") -> np.ndarray:
        self._require_gradient()
        return self.attention.log_energy(mu, backend=backend)

    @property
    def sign(self) -> int:
        return self.attention.sign

    def rate_bound(self) -> float:
        rate = self.attention.rate_bound() + (
            0.0 if self.perceptron is None else self.perceptron.rate_bound()
        )
        if self.scheme == "ngpt":
            a = self.alpha_at(0.0) if not callable(self.alpha) else 1.0
            return max(rate, a * (1 + rate))
        return rate

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": "Normalized",
            "scheme": self.scheme,
            "attention": self.attention.to_dict(),
        }
        if self.tau is not None:
            out["tau"] = self.tau
        if self.scheme == "ngpt":
            if callable(self.alpha):
                out["alpha"] = (
                    f"function {getattr(self.alpha, '__name__', 'alpha')}(t) (not serializable)"
                )
            elif self.alpha_times is None or not isinstance(self.alpha, np.ndarray):
                out["alpha"] = self.alpha
            else:
                out["alpha"], out["alpha_times"] = self.alpha.tolist(), self.alpha_times.tolist()
        if self.perceptron is not None:
            out["perceptron"] = self.perceptron.to_dict()
        return out

    @classmethod
    def from_dict(cls, spec: dict[str, Any]) -> Normalized:
        alpha = spec.get("alpha")
        if isinstance(alpha, str):
            raise ValueError(
                f"this nGPT model used alpha = {alpha}: a function cannot be rebuilt from its "
                f"description; give alpha as values at alpha_times to make runs resumable"
            )
        return cls(
            model_from_dict(spec["attention"]),
            spec["scheme"],
            tau=spec.get("tau"),
            alpha=alpha,
            alpha_times=spec.get("alpha_times"),
            perceptron=None if "perceptron" not in spec else model_from_dict(spec["perceptron"]),
        )

    def __repr__(self) -> str:
        extra = f", tau={self.tau:g}" if self.tau is not None else ""
        if self.scheme == "ngpt":
            extra += ", alpha=" + (
                f"{self.alpha:g}" if isinstance(self.alpha, float) else "<varying>"
            )
        if self.perceptron is not None:
            extra += f", perceptron={self.perceptron!r}"
        return f"Normalized({self.attention!r}, {self.scheme!r}{extra})"


class Layered(Model):
    r"""Piecewise-constant parameters: model ``k`` acts on :math:`[t_0 + k\,\text{period}, t_0 + (k+1)\,\text{period})`.

    The last one continues after the end of the list.

    Parameters
    ----------
    layers : sequence of Model
        All in the same space (sphere or free) and dimension.
    period : float
        Depth of one layer.
    t0 : float
        Start of the first layer.

    Examples
    --------
    >>> import wflow
    >>> from wflow.schemes import Layered
    >>> m = Layered.random(3, 4, beta=2.0, seed=0)            # 4 layers of random Q, K, V
    >>> traj = wflow.simulate(m, wflow.sphere.uniform(10, 3, seed=1), 4.0, method="dopri5")
    >>> traj.status, [round(float(b), 6) for b in m.breakpoints(0.0, 4.0)]
    (0, [1.0, 2.0, 3.0])
    """

    def __init__(self, layers: Sequence[Model], *, period: float = 1.0, t0: float = 0.0):
        layers = list(layers)
        if not layers or not all(isinstance(m, Model) for m in layers):
            raise TypeError(
                f"layers must be a non-empty sequence of wflow Models, got {short_repr(layers)}"
            )
        spaces = {m.space for m in layers}
        if len(spaces) > 1:
            raise ValueError(
                f"layers must all act in one space (sphere or free), got {sorted(spaces)}"
            )
        dims = {m.dim for m in layers if m.dim is not None}
        if len(dims) > 1:
            raise ValueError(f"layers act on different dimensions: {sorted(dims)}")
        self.layers = layers
        self.period = check_positive(period, "period")
        self.t0 = float(t0)
        if not np.isfinite(self.t0):
            raise ValueError(f"t0 must be finite, got {t0!r}")
        self.space = spaces.pop()
        self.dim = dims.pop() if dims else None

    @classmethod
    def random(
        cls,
        d: int,
        n_layers: int,
        *,
        beta: float = 1.0,
        period: float = 1.0,
        attention: str = "SA",
        scale: float = 1.0,
        seed: Any = None,
        kernel: str = "plain",
    ) -> Layered:
        """Random weights redrawn every ``period``: Q, K, V with i.i.d. :math:`N(0, \\text{scale}^2/d)` entries."""
        from .sphere import as_generator

        rng = as_generator(seed)
        cls_ = SA if attention == "SA" else USA
        if attention not in ("SA", "USA"):
            raise ValueError(f"attention must be 'SA' or 'USA', got {attention!r}")
        s = check_positive(scale, "scale") / np.sqrt(d)
        return cls(
            [
                cls_(
                    beta,
                    Q=rng.normal(0, s, (d, d)),
                    K=rng.normal(0, s, (d, d)),
                    V=rng.normal(0, s, (d, d)),
                    kernel=kernel,
                )
                for _ in range(n_layers)
            ],
            period=period,
        )

    def index(self, t: float) -> int:
        return int(np.clip(np.floor((t - self.t0) / self.period + 1e-12), 0, len(self.layers) - 1))

    @property
    def time_dependent(self) -> bool:
        return True

    def at(self, t: float, *, piece: float | None = None) -> Model:
        """Layer :meth:`index` of ``t`` (of ``piece`` when given: a step ending on a boundary passes its
        midpoint and keeps its layer) at time ``t``."""
        return self.layers[self.index(t if piece is None else piece)].at(t, piece=piece)

    def breakpoints(self, t0: float, t_end: float) -> np.ndarray:
        edges = self.t0 + self.period * np.arange(1, len(self.layers))
        inner = [m.breakpoints(t0, t_end) for m in self.layers]
        pts = np.concatenate([edges, *inner]) if inner else edges
        return np.unique(pts[(pts > t0) & (pts < t_end)])

    def velocity(self, x: ArrayLike, mu: Atoms, *, backend: str = "auto") -> np.ndarray:
        """The first layer's velocity (solvers call ``at(t)`` first)."""
        return self.layers[0].velocity(x, mu, backend=backend)

    def gradient_obstruction(self) -> str | None:
        for m in self.layers:
            why = m.gradient_obstruction()
            if why is not None:
                return f"layer {m!r}: {why}"
        return None

    @property
    def metric(self) -> str:
        return self.layers[0].metric

    def _energy(self, mu: Atoms, backend: str) -> np.ndarray:
        return self.layers[0]._energy(mu, backend)

    def rate_bound(self) -> float:
        return max(m.rate_bound() for m in self.layers)

    @property
    def ordered(self) -> bool:
        return any(m.ordered for m in self.layers)

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "Layered",
            "period": self.period,
            "t0": self.t0,
            "layers": [m.to_dict() for m in self.layers],
        }

    @classmethod
    def from_dict(cls, spec: dict[str, Any]) -> Layered:
        return cls(
            [model_from_dict(m) for m in spec["layers"]],
            period=spec["period"],
            t0=spec.get("t0", 0.0),
        )

    def __repr__(self) -> str:
        return (
            f"Layered({len(self.layers)} layers of depth {self.period:g}, first {self.layers[0]!r})"
        )


class TimeDependent(Model):
    """Any model that is a function of time: ``fn(t) -> Model`` (not resumable from a store: functions do not serialize).

    Examples
    --------
    >>> import wflow
    >>> from wflow.schemes import TimeDependent
    >>> model = TimeDependent(lambda t: wflow.SA(1.0 + t))  # beta grows with depth
    >>> model.time_dependent, model.at(1.0)
    (True, SA(beta=2))
    """

    def __init__(
        self, fn: Callable[[float], Model], *, space: str = "sphere", dim: int | None = None
    ):
        if not callable(fn):
            raise TypeError(f"fn must be callable t -> Model, got {short_repr(fn)}")
        if space not in ("sphere", "free"):
            raise ValueError(f"space must be 'sphere' or 'free', got {space!r}")
        self.fn, self.space, self.dim = fn, space, dim

    @property
    def time_dependent(self) -> bool:
        return True

    def at(self, t: float, *, piece: float | None = None) -> Model:
        m = self.fn(t)
        if not isinstance(m, Model):
            raise TypeError(f"fn({t:g}) must return a wflow Model, got {short_repr(m)}")
        return m

    def velocity(self, x: ArrayLike, mu: Atoms, *, backend: str = "auto") -> np.ndarray:
        return self.at(0.0).velocity(x, mu, backend=backend)

    def rate_bound(self) -> float:
        return self.at(0.0).rate_bound()

    def to_dict(self) -> dict[str, Any]:
        return {"type": "TimeDependent", "fn": repr(self.fn)}

    def __repr__(self) -> str:
        return f"TimeDependent({self.fn!r})"


def layer_map(
    model: Normalized,
    x: ArrayLike,
    *,
    eta: float = 1.0,
    weights: ArrayLike | None = None,
    backend: str = "auto",
) -> np.ndarray:
    r"""One discrete layer on tokens ``x`` of shape ``(..., n, d)``: :math:`x \mapsto x + \eta\,U(\theta)` (a Pre-LN
    residual block) or :math:`\theta \mapsto (\theta + \eta U(\theta))/|\cdot|` (Post-LN).

    Equiangular inputs under ``SA(gamma=...)``: :func:`wflow.theory.long_context_cosine`.

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.schemes import Normalized, layer_map
    >>> x = wflow.sphere.uniform(5, 3, seed=0)
    >>> y = layer_map(Normalized(wflow.SA(1.0), "post-ln"), x, backend="numpy")
    >>> y.shape, bool(np.allclose(np.linalg.norm(y, axis=-1), 1.0))  # Post-LN lands on the sphere
    ((5, 3), True)
    """
    if not isinstance(model, Normalized) or model.scheme not in ("pre-ln", "post-ln"):
        raise TypeError(
            f"layer_map takes a Normalized model with scheme 'pre-ln' or 'post-ln', got {short_repr(model)}"
        )
    eta = check_positive(eta, "eta")
    x = np.asarray(x, dtype=float)
    theta = x / _norm(x)[..., None]
    mu = Atoms(theta, weights)
    u = model.update(theta, mu, backend)
    if model.scheme == "pre-ln":
        return x + eta * u
    y = theta + eta * u
    return y / _norm(y)[..., None]


register_model(
    "Normalized",
    {"type", "scheme", "attention", "tau", "alpha", "alpha_times", "perceptron"},
    Normalized.from_dict,
)
register_model("Layered", {"type", "period", "t0", "layers"}, Layered.from_dict)
