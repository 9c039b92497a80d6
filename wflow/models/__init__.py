r"""Models: what moves.  A model gives the velocity field :math:`v[\mu](x)` and, when the
dynamics is a gradient flow, the energy it ascends and its first variation.

Blocks (the conventions page of the documentation):

* :class:`SA` -- softmax self-attention ("Post-LN"),
  :math:`v[\mu](x) = P_x\big(\int e^{\beta\langle Qx, Ky\rangle} V y\,d\mu(y) / \int e^{\beta\langle Qx, Ky\rangle}\,d\mu(y)\big)`;
* :class:`USA` -- unnormalized self-attention,
  :math:`v[\mu](x) = P_x\big(\int e^{\beta\langle Qx, Ky\rangle} V y\,d\mu(y)\big)`;
* :class:`Perceptron` -- feed-forward block :math:`u(x) = P_x(W\sigma(Ax + b))`;
* :class:`MultiHead` -- multi-head softmax attention with low-rank value maps, biases and an
  optional causal mask (:mod:`wflow.models.multihead`);
* :class:`BertLayer` -- BERT's Post-LN layer (LayerNorm, attention and feed-forward with their
  residuals) and its continuous idealisation on the sphere (:mod:`wflow.models.bert`).

Models add: ``SA(beta=4) + Perceptron(W, A)`` has the sum of the velocities.

Energy convention.  ``energy(mu)`` is the functional :math:`F` that the flow *ascends*
(:math:`dF/dt \ge 0`): :math:`\pm E_\beta`, :math:`E_\beta(\mu) = \frac{1}{2\beta}\iint
e^{\beta\langle x,y\rangle}d\mu\,d\mu`, for USA and SA with :math:`Q = K = I`, :math:`V = \pm I`
(SA in the metric reweighted by :math:`Z_\mu`), plus :math:`\tfrac12\int v_\omega\,d\mu` for a
conservative perceptron :math:`W = A^\top\mathrm{diag}(\omega)`,
:math:`v_\omega(x) = \sum_j \omega_j\varphi(a_j\cdot x + b_j)`, :math:`\varphi' = 2\sigma` (the
conventions page derives each).
So for the repulsive choice :math:`V = -I` the interaction energy :math:`E_\beta`
*decreases* and ``energy`` returns :math:`-E_\beta`.  At :math:`\beta = 0` the constant
:math:`1/(2\beta)` is dropped: :math:`E_0(\mu) = \tfrac12|\int x\,d\mu|^2`, the limit of
:math:`E_\beta - 1/(2\beta)`.  A model that is not a gradient flow raises
:class:`~wflow.errors.NotAGradientFlowError` saying which condition fails.
"""

from __future__ import annotations

from .attention import KERNELS, SA, USA, Attention
from .base import (
    MODEL_TYPES,
    REWEIGHTED,
    WASSERSTEIN,
    FusedAttention,
    Model,
    SumModel,
    model_from_dict,
    register_model,
)
from .bert import PARTS, BertLayer, LayerNorm
from .multihead import MultiHead
from .perceptron import ACTIVATIONS, Perceptron

__all__ = [
    "Model",
    "SA",
    "USA",
    "Perceptron",
    "MultiHead",
    "BertLayer",
    "LayerNorm",
    "PARTS",
    "SumModel",
    "Attention",
    "FusedAttention",
    "ACTIVATIONS",
    "KERNELS",
    "WASSERSTEIN",
    "REWEIGHTED",
    "MODEL_TYPES",
    "register_model",
    "model_from_dict",
]
