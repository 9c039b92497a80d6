r"""Multi-head softmax attention as trained Transformers use it: :class:`MultiHead`.

Heads :math:`h = 1..H`, each with its own query and key maps :math:`Q_h, K_h \in \mathbb{R}^{p\times d}`
(and biases :math:`b^Q_h, b^K_h \in \mathbb{R}^p`) and a low-rank value map
:math:`W^O_h W^V_h` (:math:`W^V_h \in \mathbb{R}^{r\times d}`, :math:`W^O_h \in \mathbb{R}^{d\times r}`):

.. math::

    A(x_i) = \sum_h W^O_h\,\frac{\sum_{j\in J(i)} w_j\,e^{\beta\langle Q_h x_i + b^Q_h,\,K_h x_j + b^K_h\rangle}
    (W^V_h x_j + b^V_h)}{\sum_{j\in J(i)} w_j\,e^{\beta\langle Q_h x_i + b^Q_h,\,K_h x_j + b^K_h\rangle}} + b^O,
    \qquad v(x_i) = P_{x_i}A(x_i),

with :math:`J(i)` every token, or with ``causal=True`` the tokens :math:`j \le i` (Karagodin,
Polyanskiy & Rigollet, "Clustering in causal attention masking", 2024).  The value maps are applied
as two thin products, never as a :math:`d\times d` matrix.

With one head, no biases, :math:`r = d` and no mask it is ``SA(beta, Q, K, V=W_O @ W_V)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._typing import ArrayLike
from ..errors import check_nonnegative, short_repr
from ..measure import Atoms
from ..sphere import project
from .base import Model, as_matrix, register_model

__all__ = ["MultiHead"]

#: query rows per block, so that one head's (rows, n) logits stay near 1 million numbers
_BLOCK_NUMBERS = 1_000_000


class MultiHead(Model):
    r"""Multi-head softmax attention with per-head low-rank value maps, biases and an optional causal mask.

    Parameters
    ----------
    beta : float
        Inverse temperature (``>= 0``); a trained model's :math:`1/\sqrt{p}` when the tokens are its own.
    Q, K : array_like, shape (H, p, d)
        Per-head query and key maps.
    V : array_like, shape (H, r, d)
        Per-head value maps :math:`W^V_h`.
    O : array_like, shape (H, d, r)
        Per-head output maps :math:`W^O_h` (the value map of head h is :math:`W^O_h W^V_h`, rank ``<= r``).
    bias_q, bias_k : array_like, shape (H, p), optional
        Query and key biases (zero if omitted).
    bias_v : array_like, shape (H, r), optional
        Value bias; under softmax it adds the constant drift :math:`\sum_h W^O_h b^V_h`.
    bias_o : array_like, shape (d,), optional
        Output bias (a constant drift).
    causal : bool
        Token ``i`` attends to the tokens ``j <= i`` only (the velocity then depends on the tokens'
        order: :attr:`ordered`).

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.models import MultiHead
    >>> rng = np.random.default_rng(0)
    >>> H, p, d = 2, 3, 6
    >>> Q, K = rng.standard_normal((2, H, p, d))
    >>> V, O = rng.standard_normal((H, p, d)), rng.standard_normal((H, d, p))
    >>> x = wflow.sphere.uniform(5, d, seed=0)
    >>> mh = MultiHead(1.0, Q, K, V, O)
    >>> heads = wflow.SA(1.0, Q=Q[0], K=K[0], V=O[0] @ V[0]) + wflow.SA(1.0, Q=Q[1], K=K[1], V=O[1] @ V[1])
    >>> bool(np.allclose(mh.velocity(x, wflow.Atoms(x)), heads.velocity(x, wflow.Atoms(x))))
    True
    """

    def __init__(
        self,
        beta: float,
        Q: ArrayLike,
        K: ArrayLike,
        V: ArrayLike,
        O: ArrayLike,  # noqa: E741 - the output map's name in the literature
        *,
        bias_q: ArrayLike | None = None,
        bias_k: ArrayLike | None = None,
        bias_v: ArrayLike | None = None,
        bias_o: ArrayLike | None = None,
        causal: bool = False,
    ):
        self.beta = check_nonnegative(beta, "beta")
        Q_, K_ = as_matrix(Q, "Q", 3), as_matrix(K, "K", 3)
        V_, O_ = as_matrix(V, "V", 3), as_matrix(O, "O", 3)
        if Q_ is None or K_ is None or V_ is None or O_ is None:
            raise TypeError("MultiHead needs Q, K, V and O (per-head stacks), got None")
        H, p, d = Q_.shape
        if K_.shape != (H, p, d):
            raise ValueError(f"K must have the shape of Q {Q_.shape} (heads, p, d), got {K_.shape}")
        r = V_.shape[1]
        if V_.shape != (H, r, d):
            raise ValueError(f"V must have shape (heads, r, d) = ({H}, r, {d}), got {V_.shape}")
        if O_.shape != (H, d, r):
            raise ValueError(f"O must have shape (heads, d, r) = ({H}, {d}, {r}), got {O_.shape}")
        if d < 2:
            raise ValueError(f"Q must act on dimension d >= 2, got Q of shape {Q_.shape}")
        self.Q, self.K, self.V, self.O = Q_, K_, V_, O_
        self.heads, self.p, self.r, self.dim = H, p, r, d
        shapes = {"bias_q": (H, p), "bias_k": (H, p), "bias_v": (H, r), "bias_o": (d,)}
        given = {"bias_q": bias_q, "bias_k": bias_k, "bias_v": bias_v, "bias_o": bias_o}
        checked: dict[str, np.ndarray | None] = {}
        for name, b in given.items():
            bb = as_matrix(b, name, len(shapes[name]))
            if bb is not None and bb.shape != shapes[name]:
                raise ValueError(f"{name} must have shape {shapes[name]}, got {bb.shape}")
            checked[name] = bb
        self.bias_q, self.bias_k = checked["bias_q"], checked["bias_k"]
        self.bias_v, self.bias_o = checked["bias_v"], checked["bias_o"]
        if not isinstance(causal, (bool, np.bool_)):
            raise TypeError(f"causal must be True or False, got {short_repr(causal)}")
        self.causal = bool(causal)
        self._Os = np.concatenate(list(O_), axis=1)  # the output maps side by side, (d, H r)
        # the maps of every head stacked for one GEMM, each head's block followed by a row of
        # bias 1 (weights 0): queries (beta folded in), then keys, then values
        rows = []
        for M, bias in (
            (self.beta * Q_, None if self.bias_q is None else self.beta * self.bias_q),
            (K_, self.bias_k),
            (V_, None),
        ):
            w_ = M.shape[1]
            Wb = np.zeros((H, w_ + 1, d))
            Wb[:, :w_] = M
            bb = np.zeros((H, w_ + 1))
            bb[:, w_] = 1.0
            if bias is not None:
                bb[:, :w_] = bias
            rows.append((Wb.reshape(-1, d), bb.reshape(-1)))
        self._W = np.concatenate([r_[0] for r_ in rows])
        self._b = np.concatenate([r_[1] for r_ in rows])
        drift = np.zeros(d)
        if self.bias_v is not None:
            drift = drift + np.einsum("hdr,hr->d", O_, self.bias_v)
        if self.bias_o is not None:
            drift = drift + self.bias_o
        #: the constant part of the output, :math:`\sum_h W^O_h b^V_h + b^O` (softmax weights sum to 1)
        self.drift = drift

    @classmethod
    def from_dense(
        cls, beta: float, Q: ArrayLike, K: ArrayLike, V: ArrayLike, **kw: Any
    ) -> MultiHead:
        """Heads with dense value matrices ``V`` of shape ``(H, d, d)`` (``O`` the identity, ``r = d``)."""
        V_ = as_matrix(V, "V", 3)
        if V_ is None:
            raise TypeError("V must be given")
        eye = np.broadcast_to(np.eye(V_.shape[-1]), V_.shape)
        return cls(beta, Q, K, V_, eye, **kw)

    @property
    def ordered(self) -> bool:
        """True with the causal mask: the velocity depends on the tokens' order."""
        return self.causal

    # -- the field ----------------------------------------------------------------
    def update(
        self, x: ArrayLike, weights: ArrayLike | None = None, keys: ArrayLike | None = None
    ) -> np.ndarray:
        r"""The attention output :math:`A(x_i)` before projection at queries ``x`` of shape ``(..., n, d)``
        (any points of :math:`\mathbb{R}^d`) attending to ``keys`` of shape ``(..., m, d)`` (default
        ``x``) with weights of shape ``(..., m)`` (uniform if omitted); shape ``(..., n, d)``.  With
        the causal mask query ``i`` attends to the keys ``j <= i`` (then ``m = n``)."""
        x = np.asarray(x, dtype=np.float64)
        if x.ndim < 2 or x.shape[-1] != self.dim:
            raise ValueError(f"x must have shape (..., n, {self.dim}), got {x.shape}")
        n = x.shape[-2]
        H, p, r = self.heads, self.p, self.r
        batch = x.shape[:-2]
        # one GEMM for the queries (beta folded in), keys and values of every head
        qkv = x @ self._W.T
        qkv += self._b
        if keys is None:
            kv = qkv
        else:
            y = np.asarray(keys, dtype=np.float64)
            if y.ndim != x.ndim or y.shape[-1] != self.dim or y.shape[:-2] != batch:
                raise ValueError(f"keys must have shape {(*batch, 'm', self.dim)}, got {y.shape}")
            kv = y @ self._W.T
            kv += self._b
        m = kv.shape[-2]
        if self.causal and m != n:
            raise ValueError(
                f"causal attention needs one key per query (token i attends to tokens j <= i), got {n} "
                f"queries and {m} keys"
            )
        w = None
        if weights is not None:
            w = np.broadcast_to(np.asarray(weights, np.float64), kv.shape[:-1])
        heads = np.empty((*batch, n, H * r))
        block = max(1, _BLOCK_NUMBERS // max(1, m * int(np.prod(batch, dtype=int))))
        cols = np.arange(m)
        for h in range(H):
            # augmented columns: q_i -> (q_i, -c_i) and k_j -> (k_j, 1) give the shifted logits
            # <q_i, k_j> - c_i in one GEMM; v_j -> w_j (v_j, 1) gives the softmax's numerator and
            # denominator in the second (atoms of weight 0 contribute exactly nothing)
            q = qkv[..., h * (p + 1) : (h + 1) * (p + 1)]
            k = kv[..., (H + h) * (p + 1) : (H + h + 1) * (p + 1)]
            lo = 2 * H * (p + 1) + h * (r + 1)
            v = kv[..., lo : lo + r + 1]
            if w is not None:
                v = v * w[..., None]
            # shift c_i: the bound |q_i| max_j |k_j| of row i's logits while it stays below 300
            # (no subnormal term); else each row's maximum, terms under e^-700 of it dropped
            bound = np.linalg.norm(q[..., :p], axis=-1) * np.max(
                np.linalg.norm(k[..., :p], axis=-1), axis=-1, keepdims=True
            )
            exact = bool(np.any(bound > 300.0))
            q[..., p] = 0.0 if exact else -bound
            kT = np.swapaxes(k, -1, -2)
            for s in range(0, n, block):
                e = min(n, s + block)
                L = q[..., s:e, :] @ kT  # (..., rows, n), shifted
                mask = cols[None, :] > np.arange(s, e)[:, None] if self.causal else None
                if exact:
                    if mask is not None:
                        L[..., mask] = -np.inf
                    np.subtract(L, np.max(L, axis=-1, keepdims=True), out=L)
                    np.maximum(L, -700.0, out=L)  # exp of subnormals is slow
                P = np.exp(L, out=L)
                if mask is not None:
                    P[..., mask] = 0.0
                num = P @ v  # (..., rows, r + 1)
                np.divide(num[..., :r], num[..., r:], out=heads[..., s:e, h * r : (h + 1) * r])
        return heads @ self._Os.T + self.drift

    def velocity(self, x: ArrayLike, mu: Atoms, *, backend: str = "auto") -> np.ndarray:
        r""":math:`P_{x_i}A(x_i)` at points ``x`` of shape ``(..., n, d)`` attending to the measure's atoms
        (causal: ``x`` are the measure's own tokens, in order; ``backend`` is not used)."""
        x = self._check_query(x, mu)
        if self.causal and x.shape[-2] != mu.n:
            raise ValueError(
                f"causal attention moves the measure's own {mu.n} tokens in their order, got "
                f"{x.shape[-2]} query points (passive tracers are not supported)"
            )
        same = x.shape == mu.points.shape and (x is mu.points or np.array_equal(x, mu.points))
        return project(x, self.update(x, mu.weights, None if same else mu.points))

    def rate_bound(self) -> float:
        r""":math:`\sum_h |W^O_h||W^V_h|(1 + 2\beta|Q_h||K_h|) + |\text{drift}|` (spectral norms)."""
        total = float(np.linalg.norm(self.drift))
        for h in range(self.heads):
            nq, nk = np.linalg.norm(self.Q[h], 2), np.linalg.norm(self.K[h], 2)
            nv = np.linalg.norm(self.O[h], 2) * np.linalg.norm(self.V[h], 2)
            total += float(nv * (1.0 + 2.0 * self.beta * nq * nk))
        return total

    def plain_attention(self) -> bool:
        """False: general Q, K, V (the span coordinates and fused steps do not apply)."""
        return False

    def gradient_obstruction(self) -> str | None:
        return "multi-head attention with general Q_h, K_h, value maps and biases has no energy"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": "MultiHead",
            "beta": self.beta,
            "Q": self.Q.tolist(),
            "K": self.K.tolist(),
            "V": self.V.tolist(),
            "O": self.O.tolist(),
        }
        for name in ("bias_q", "bias_k", "bias_v", "bias_o"):
            b = getattr(self, name)
            if b is not None:
                out[name] = b.tolist()
        if self.causal:
            out["causal"] = True
        return out

    def __repr__(self) -> str:
        mask = ", causal" if self.causal else ""
        return (
            f"MultiHead(beta={self.beta:g}, heads={self.heads}, d={self.dim}, p={self.p}, "
            f"r={self.r}{mask})"
        )


register_model(
    "MultiHead",
    {"type", "beta", "Q", "K", "V", "O", "bias_q", "bias_k", "bias_v", "bias_o", "causal"},
    lambda spec: MultiHead(**{k: v for k, v in spec.items() if k != "type"}),
)
