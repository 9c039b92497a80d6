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

Energy convention (derived on the conventions page).  ``energy(mu)`` is the functional :math:`F`
that the flow *ascends*: :math:`\pm E_\beta`, :math:`E_\beta(\mu) = \frac{1}{2\beta}\iint
e^{\beta\langle x,y\rangle}d\mu\,d\mu`, for USA and SA with :math:`Q = K = I`, :math:`V = \pm I`,
plus :math:`\tfrac12\int v_\omega\,d\mu` for a conservative perceptron.  At :math:`\beta = 0`:
:math:`E_0(\mu) = \tfrac12|\int x\,d\mu|^2`.  A model that is not a gradient flow raises
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
