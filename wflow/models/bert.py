r"""BERT's layer as a normalization scheme: :class:`LayerNorm` and :class:`BertLayer`.

The discrete layer (Post-LN; Devlin et al. 2019), tokens :math:`x_i \in \mathbb{R}^d`:

.. math::

    h_i = \mathrm{LN}_1\big(x_i + \eta\,A(x)_i\big), \qquad
    x_i^+ = \mathrm{LN}_2\big(h_i + \eta\,F(h_i)\big),

with :math:`A` multi-head attention with biases (:class:`~wflow.models.MultiHead`, :math:`\beta = 1/\sqrt{p}`),
:math:`F(h) = W_2\,\mathrm{gelu}(W_1 h + b_1) + b_2` the feed-forward block (a non-conservative
:class:`~wflow.models.Perceptron` plus the drift :math:`b_2`), and
:math:`\mathrm{LN}(y) = \gamma\odot\frac{y - \bar y}{\sqrt{\mathrm{var}(y) + \epsilon}} + \beta` (centring over the
coordinates, then :math:`\gamma, \beta`).  :meth:`BertLayer.step` with :math:`\eta = 1` is the trained layer.

The continuous-time idealisation (:meth:`BertLayer.velocity`) moves a direction :math:`\theta_i` on the sphere:
the blocks read the token :math:`x_i = \rho\,\theta_i` (without the LayerNorm part) or
:math:`x_i = \sqrt d\,\gamma\odot\theta_i + \beta` (with it: :math:`\theta_i` is LayerNorm's normalized
coordinate :math:`(y - \bar y)/(\sqrt d\,\mathrm{std}\,y)`, on the unit sphere of the hyperplane
:math:`\mathbf 1^\perp`), and

.. math::

    \theta_i' = P_{\theta_i} C\,U(x)_i / s, \qquad U = [A] + [F],

with :math:`C` the centring (LayerNorm part) or the identity, :math:`s = \sqrt d` or :math:`\rho`.  Each part
(attention, feed-forward, biases, LayerNorm's centring and :math:`\gamma, \beta`) switches on or off
(``parts``); attention alone without biases is the sum of the heads' ``SA(beta, Q_h, K_h, W_O,h W_V,h)``
read at radius :math:`\rho`.  This is an idealisation, not a limit of the discrete layer (the docs page
"Real Transformers" says what matches and what does not).
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from .._typing import ArrayLike
from ..errors import check_int, check_positive, short_repr
from ..measure import Atoms
from ..sphere import project
from .base import Model, register_model
from .multihead import MultiHead
from .perceptron import ACTIVATIONS, Perceptron

__all__ = ["LayerNorm", "BertLayer", "PARTS"]

#: the parts of a BERT layer the continuous idealisation can switch on
PARTS = ("attention", "feed_forward", "biases", "layernorm")


def _parts(parts: Any) -> tuple[str, ...]:
    if isinstance(parts, str) or not all(p in PARTS for p in parts):
        raise ValueError(f"parts must be a list of names among {PARTS}, got {short_repr(parts)}")
    return tuple(p for p in PARTS if p in parts)


def _nonnegative(value: Any, name: str) -> float:
    if not isinstance(value, (int, float)) or not np.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {short_repr(value)}")
    return float(value)


def _vector(v: Any, name: str, d: int) -> np.ndarray:
    a = np.asarray(v, dtype=np.float64)
    if a.shape != (d,) or not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must be a finite vector of shape ({d},), got {short_repr(v)}")
    return a


class LayerNorm:
    r"""LayerNorm over the last axis: :math:`\gamma\odot(y - \bar y)/\sqrt{\mathrm{var}\,y + \epsilon} + \beta`.

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.models.bert import LayerNorm
    >>> y = LayerNorm(np.ones(4), np.zeros(4), eps=0.0)(np.array([1.0, 2.0, 3.0, 6.0]))
    >>> float(y.mean()), float((y ** 2).mean())
    (0.0, 1.0)
    """

    def __init__(self, gamma: ArrayLike, beta: ArrayLike, eps: float = 1e-12):
        g = np.asarray(gamma, dtype=np.float64)
        if g.ndim != 1 or g.size < 2:
            raise ValueError(f"gamma must be a vector of length d >= 2, got {short_repr(gamma)}")
        self.gamma = _vector(g, "gamma", g.size)
        self.beta = _vector(beta, "beta", g.size)
        self.eps = _nonnegative(eps, "eps")

    def normalize(self, y: np.ndarray) -> np.ndarray:
        """:math:`(y - \\bar y)/\\sqrt{\\mathrm{var}\\,y + \\epsilon}` (before gamma, beta)."""
        c = y - y.mean(axis=-1, keepdims=True)
        return c / np.sqrt(np.mean(c * c, axis=-1, keepdims=True) + self.eps)

    def __call__(self, y: ArrayLike) -> np.ndarray:
        return self.gamma * self.normalize(np.asarray(y, dtype=np.float64)) + self.beta

    def to_dict(self) -> dict[str, Any]:
        return {"gamma": self.gamma.tolist(), "beta": self.beta.tolist(), "eps": self.eps}


class BertLayer(Model):
    r"""One BERT encoder layer: the discrete Post-LN map (:meth:`step`) and its continuous idealisation on the
    sphere (:meth:`velocity`, module docstring).

    Parameters
    ----------
    attention : MultiHead
        Multi-head attention with its biases (not causal).
    W1 : array_like, shape (m, d)
    b1 : array_like, shape (m,)
    W2 : array_like, shape (d, m)
    b2 : array_like, shape (d,)
        Feed-forward block :math:`W_2\,\sigma(W_1 h + b_1) + b_2`.
    ln1, ln2 : LayerNorm
        After attention and after the feed-forward block.
    activation : str
        :math:`\sigma` (BERT: ``"gelu"``, the erf form).
    parts : sequence of str
        What the continuous velocity includes, among :data:`PARTS` (default all).
    radius : float
        :math:`\rho`, the tokens' radius the blocks read without the LayerNorm part (default :math:`\sqrt d`).
    speed : float
        A factor on the continuous velocity (``>= 0``): the time a layer takes is ``1/speed`` units of
        the layer's own field (a fitted time per layer).

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.models.bert import BertLayer
    >>> layer = BertLayer.random(d=8, heads=2, m=16, seed=0)
    >>> x = np.random.default_rng(1).standard_normal((5, 8))
    >>> y = layer.step(x)                           # one trained-style layer, eta = 1
    >>> bool(np.allclose(y.mean(axis=-1), layer.ln2.beta.mean(), atol=0.5)), y.shape
    (True, (5, 8))
    >>> theta = wflow.sphere.uniform(5, 8, seed=2)
    >>> v = layer.with_parts(["attention"]).velocity(theta, wflow.Atoms(theta))
    >>> bool(np.allclose((v * theta).sum(-1), 0))    # tangent to the sphere
    True
    """

    def __init__(
        self,
        attention: MultiHead,
        W1: ArrayLike,
        b1: ArrayLike,
        W2: ArrayLike,
        b2: ArrayLike,
        ln1: LayerNorm,
        ln2: LayerNorm,
        *,
        activation: str = "gelu",
        parts: Any = PARTS,
        radius: float | None = None,
        speed: float = 1.0,
    ):
        if not isinstance(attention, MultiHead):
            raise TypeError(f"attention must be a wflow MultiHead, got {short_repr(attention)}")
        if attention.causal:
            raise ValueError("BERT's attention is not causal; got a MultiHead with causal=True")
        if not isinstance(ln1, LayerNorm) or not isinstance(ln2, LayerNorm):
            raise TypeError(
                f"ln1 and ln2 must be LayerNorm, got {short_repr(ln1)}, {short_repr(ln2)}"
            )
        d = int(attention.Q.shape[2])
        self.dim: int | None = d
        self.d = d
        self.attention = attention
        self.ffn = Perceptron(W2, W1, b1, activation)
        if self.ffn.dim != d:
            raise ValueError(
                f"W1 must have shape (m, {d}) to match the attention, got {np.shape(W1)}"
            )
        self.b2 = _vector(b2, "b2", d)
        for name, ln in (("ln1", ln1), ("ln2", ln2)):
            if ln.gamma.size != d:
                raise ValueError(f"{name} acts on dimension {ln.gamma.size}, the attention on {d}")
        self.ln1, self.ln2 = ln1, ln2
        self.parts_on = _parts(parts)
        self.radius = float(np.sqrt(d)) if radius is None else check_positive(radius, "radius")
        self.speed = _nonnegative(speed, "speed")
        #: what the copies of :meth:`with_parts` share: the bias-free attention, the weights' description
        self._cache: dict[str, Any] = {}
        self._bare = self._bare_attention() if "biases" not in self.parts_on else attention

    @classmethod
    def random(cls, d: int, heads: int, m: int, *, seed: Any = None, **kw: Any) -> BertLayer:
        """A layer with random weights of BERT's initial scale (for examples and tests)."""
        d = check_int(d, "d", minimum=1)
        heads = check_int(heads, "heads", minimum=1)
        m = check_int(m, "m", minimum=1)
        if d % heads:
            raise ValueError(
                f"heads must divide d (BERT's head size is d / heads), got d={d}, heads={heads}"
            )
        rng = np.random.default_rng(seed)
        p = d // heads
        s = 1.0 / np.sqrt(d)
        att = MultiHead(
            1.0 / np.sqrt(p),
            rng.normal(0, s, (heads, p, d)),
            rng.normal(0, s, (heads, p, d)),
            rng.normal(0, s, (heads, p, d)),
            rng.normal(0, s, (heads, d, p)),
            bias_q=rng.normal(0, 0.1, (heads, p)),
            bias_k=rng.normal(0, 0.1, (heads, p)),
            bias_v=rng.normal(0, 0.1, (heads, p)),
            bias_o=rng.normal(0, 0.1, d),
        )
        ln = lambda: LayerNorm(1 + rng.normal(0, 0.1, d), rng.normal(0, 0.1, d))  # noqa: E731
        return cls(
            att,
            rng.normal(0, s, (m, d)),
            rng.normal(0, 0.1, m),
            rng.normal(0, 1 / np.sqrt(m), (d, m)),
            rng.normal(0, 0.1, d),
            ln(),
            ln(),
            **kw,
        )

    def with_parts(
        self, parts: Any, *, radius: float | None = None, speed: float | None = None
    ) -> BertLayer:
        """The same weights with other ``parts`` switched on (and another ``radius``, ``speed``); the input
        LayerNorm is kept."""
        parts_on = _parts(parts)
        layer = copy.copy(self)  # the same (checked) weights, shared: no copy, no re-validation
        layer.parts_on = parts_on
        if radius is not None:
            layer.radius = check_positive(radius, "radius")
        if speed is not None:
            layer.speed = _nonnegative(speed, "speed")
        layer._bare = self._bare_attention() if "biases" not in layer.parts_on else self.attention
        return layer

    def _bare_attention(self) -> MultiHead:
        """The attention without its biases (made once, shared by the copies of :meth:`with_parts`)."""
        if self._cache.get("bare") is None:
            a = self.attention
            self._cache["bare"] = MultiHead(a.beta, a.Q, a.K, a.V, a.O)
        return self._cache["bare"]

    # -- the discrete layer ------------------------------------------------------------
    def feed_forward(self, h: np.ndarray, *, biases: bool = True) -> np.ndarray:
        r""":math:`W_2\sigma(W_1 h + b_1) + b_2` (``biases=False``: :math:`W_2\sigma(W_1 h)`), shape of ``h``."""
        if biases:
            return self.ffn.raw(h) + self.b2
        return ACTIVATIONS[self.ffn.activation][0](h @ self.ffn.A.T) @ self.ffn.W.T

    def step(self, x: ArrayLike, eta: float = 1.0, weights: ArrayLike | None = None) -> np.ndarray:
        r"""The discrete Post-LN layer :math:`x \mapsto \mathrm{LN}_2(h + \eta F(h))`,
        :math:`h = \mathrm{LN}_1(x + \eta A(x))`, on tokens ``x`` of shape ``(..., n, d)``; ``eta = 1`` is BERT."""
        eta = check_positive(eta, "eta")
        x = np.asarray(x, dtype=np.float64)
        if x.ndim < 2 or x.shape[-1] != self.dim:
            raise ValueError(f"x must have shape (..., n, {self.dim}), got {x.shape}")
        h = self.ln1(x + eta * self.attention.update(x, weights))
        return self.ln2(h + eta * self.feed_forward(h))

    # -- the continuous idealisation --------------------------------------------------------
    def readout(self, theta: np.ndarray) -> np.ndarray:
        r"""The tokens the blocks read: :math:`\sqrt d\,\gamma_2\odot\theta + \beta_2` (LayerNorm part; the layer's
        input is the previous layer's :math:`\mathrm{LN}_2` output) or :math:`\rho\,\theta`."""
        if "layernorm" in self.parts_on:
            return np.sqrt(self.d) * self.ln_in.gamma * theta + self.ln_in.beta
        return self.radius * theta

    def directions(self, x: ArrayLike) -> np.ndarray:
        r"""The directions whose :meth:`readout` is the tokens ``x`` (shape ``(..., n, d)``): LayerNorm's
        normalized coordinate :math:`(x - \beta)/(\sqrt d\,\gamma)` with the LayerNorm part (unit vectors of
        :math:`\mathbf 1^\perp` when ``x`` is that LayerNorm's output), else :math:`x/|x|`."""
        x = np.asarray(x, dtype=np.float64)
        if "layernorm" in self.parts_on:
            g = self.ln_in.gamma
            if np.any(g == 0):
                raise ValueError(
                    "the input LayerNorm has gamma = 0 on some coordinate: no inverse readout"
                )
            z = (x - self.ln_in.beta) / (np.sqrt(self.d) * g)
            z = z - z.mean(axis=-1, keepdims=True)
        else:
            z = x
        return z / np.linalg.norm(z, axis=-1, keepdims=True)

    @property
    def ln_in(self) -> LayerNorm:
        """The LayerNorm whose output this layer reads (set by :func:`wflow.pretrained` to the previous
        layer's; its own ``ln2`` by default)."""
        return getattr(self, "_ln_in", self.ln2)

    def set_input_norm(self, ln: LayerNorm) -> None:
        """Read tokens through ``ln`` (the previous layer's output LayerNorm, or the embeddings')."""
        if not isinstance(ln, LayerNorm) or ln.gamma.size != self.dim:
            raise TypeError(f"ln must be a LayerNorm of dimension {self.dim}, got {short_repr(ln)}")
        self._ln_in = ln

    def update(
        self,
        theta: np.ndarray,
        weights: np.ndarray | None = None,
        keys: np.ndarray | None = None,
    ) -> np.ndarray:
        """:math:`U(x)` at the readout of directions ``theta`` (the parts switched on), attending to the
        readout of the directions ``keys`` (default ``theta``) with ``weights``, shape ``(..., n, d)``."""
        x = self.readout(theta)
        u = np.zeros_like(x)
        biases = "biases" in self.parts_on
        if "attention" in self.parts_on:
            u += self._bare.update(x, weights, None if keys is None else self.readout(keys))
        if "feed_forward" in self.parts_on:
            u += self.feed_forward(x, biases=biases)
        return u

    def velocity(self, x: ArrayLike, mu: Atoms, *, backend: str = "auto") -> np.ndarray:
        theta = self._check_query(x, mu)
        pts = mu.points
        same = theta.shape == pts.shape and (theta is pts or np.array_equal(theta, pts))
        u = self.update(theta, mu.weights, None if same else pts)
        if "layernorm" in self.parts_on:
            u = (u - u.mean(axis=-1, keepdims=True)) / np.sqrt(self.d)
        else:
            u = u / self.radius
        return project(theta, self.speed * u if self.speed != 1.0 else u)

    def rate_bound(self) -> float:
        scale = np.sqrt(self.d) * float(np.max(np.abs(self.ln_in.gamma)))
        r = scale if "layernorm" in self.parts_on else self.radius
        s = np.sqrt(self.d) if "layernorm" in self.parts_on else self.radius
        total = 0.0
        if "attention" in self.parts_on:
            total += self.attention.rate_bound() * r * r / s
        if "feed_forward" in self.parts_on:
            total += self.ffn.rate_bound() * r / s
        return float(total * self.speed)

    def gradient_obstruction(self) -> str | None:
        return (
            "a BERT layer (general attention, a non-conservative feed-forward block) has no energy"
        )

    def to_dict(self) -> dict[str, Any]:
        if "weights" not in self._cache:  # lists of ~10^6 numbers: formed once per set of weights
            self._cache["weights"] = {
                "attention": self.attention.to_dict(),
                "W1": self.ffn.A.tolist(),
                "b1": self.ffn.b.tolist(),
                "W2": self.ffn.W.tolist(),
                "b2": self.b2.tolist(),
                "ln1": self.ln1.to_dict(),
                "ln2": self.ln2.to_dict(),
            }
        out = {
            "type": "BertLayer",
            **self._cache["weights"],
            "activation": self.ffn.activation,
            "parts": list(self.parts_on),
            "radius": self.radius,
            "speed": self.speed,
        }
        if hasattr(self, "_ln_in"):
            out["ln_in"] = self._ln_in.to_dict()
        return out

    @classmethod
    def from_dict(cls, spec: dict[str, Any]) -> BertLayer:
        from .base import model_from_dict

        att = model_from_dict(spec["attention"])
        if not isinstance(att, MultiHead):
            raise TypeError(f"a BertLayer's attention must be a MultiHead, got {short_repr(att)}")
        layer = cls(
            att,
            spec["W1"],
            spec["b1"],
            spec["W2"],
            spec["b2"],
            LayerNorm(**spec["ln1"]),
            LayerNorm(**spec["ln2"]),
            activation=spec.get("activation", "gelu"),
            parts=spec.get("parts", PARTS),
            radius=spec.get("radius"),
            speed=spec.get("speed", 1.0),
        )
        if "ln_in" in spec:
            layer.set_input_norm(LayerNorm(**spec["ln_in"]))
        return layer

    def __repr__(self) -> str:
        return (
            f"BertLayer(d={self.dim}, heads={self.attention.heads}, m={self.ffn.A.shape[0]}, "
            f"parts={list(self.parts_on)})"
        )


#: a BertLayer's description: its weights, then its options
_WEIGHTS = {"attention", "W1", "b1", "W2", "b2", "ln1", "ln2", "ln_in"}
_OPTIONS = {"type", "activation", "parts", "radius", "speed"}
register_model("BertLayer", _WEIGHTS | _OPTIONS, BertLayer.from_dict)
