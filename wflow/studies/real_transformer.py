r"""A real Transformer beside the dynamics wflow solves: ``wflow validate real-transformer [--quick]``.

all-MiniLM-L6-v2 (BERT, :mod:`wflow.pretrained`) reads :data:`TEXT`; its token states layer by
layer are set beside (a) wflow's discrete BERT layer (:meth:`wflow.models.BertLayer.step`), checked
against the independent :func:`dense_forward`; (b) the continuous-time idealisations of
:data:`VARIANTS` (:meth:`wflow.models.BertLayer.velocity`), run by :func:`wflow.simulate` from the
real layer-0 tokens through depth, and one layer at a time (:func:`one_layer_alignment`); (c) the
survey's figure (Rigollet 2025, Figure 1) for each (:func:`wflow.pretrained.layer_measures`).
Without ``safetensors``, ``tokenizers`` or the weights the study is skipped with a one-line message
naming the install command.  What matches and why: docs/real_transformers.md.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from .. import pretrained
from ..kernels.threads import blas_threads
from ..models import PARTS, BertLayer, LayerNorm
from ..solvers.particles import simulate
from ..solvers.saveat import SaveAt
from .progress import numbered, phase
from .report import StudyReport, register, save_figure, subplots

__all__ = ["TEXT", "VARIANTS", "dense_forward", "one_layer_alignment", "directions_of"]

#: the text the model reads (262 tokens with [CLS] and [SEP])
TEXT = (
    "The river begins as a thin stream in the mountains, where snow melts slowly under the spring "
    "sun. It gathers water from small brooks and hidden springs, and by the time it reaches the "
    "valley it is wide enough to carry boats. Farmers along its banks have used it for centuries to "
    "water their fields, and towns grew up wherever the current was gentle enough for a bridge. In "
    "summer children swim in the shallow bends, while fishermen wait patiently in the early morning "
    "mist. In autumn the leaves of the trees on either side turn yellow and red, and the water "
    "carries them down towards the sea. Winter brings floods in some years, when heavy rain falls "
    "for days and the river rises over the meadows. The old stone mill near the village still "
    "stands, although its wheel stopped turning long ago. Historians say that the first settlers "
    "chose this place because the soil was rich and the river provided fish, transport and power. "
    "Today the river is quieter. Most goods travel by road or rail, and the mill has become a small "
    "museum where visitors learn how flour was made. Scientists measure the water every week to "
    "check its temperature, its flow and the health of the creatures that live in it. They have "
    "found that the river is cleaner now than it was fifty years ago, when factories poured their "
    "waste into it."
)

#: the idealisations: name -> parts switched on
VARIANTS: dict[str, tuple[str, ...]] = {
    "attention": ("attention",),
    "+feed-forward": ("attention", "feed_forward"),
    "+biases": ("attention", "feed_forward", "biases"),
    "+layernorm": PARTS,
}


def dense_forward(t: dict[str, np.ndarray], ids: np.ndarray, cfg: dict[str, Any]) -> np.ndarray:
    """BERT's forward pass from the raw tensors with dense d x d projections (independent of
    :class:`~wflow.models.MultiHead` and :class:`~wflow.models.BertLayer`), shape ``(layers + 1, n, d)``."""
    from scipy.special import erf

    eps, H = float(cfg.get("layer_norm_eps", 1e-12)), int(cfg["num_attention_heads"])

    def ln(y: np.ndarray, name: str) -> np.ndarray:
        c = y - y.mean(-1, keepdims=True)
        return (
            t[name + ".weight"] * c / np.sqrt((c * c).mean(-1, keepdims=True) + eps)
            + t[name + ".bias"]
        )

    def lin(y: np.ndarray, name: str) -> np.ndarray:
        return y @ t[name + ".weight"].T + t[name + ".bias"]

    n = ids.size
    x = ln(
        t["embeddings.word_embeddings.weight"][ids]
        + t["embeddings.position_embeddings.weight"][:n]
        + t["embeddings.token_type_embeddings.weight"][0],
        "embeddings.LayerNorm",
    )
    d = x.shape[-1]
    p = d // H
    out = [x]
    for i in range(int(cfg["num_hidden_layers"])):
        pre = f"encoder.layer.{i}."
        q, k, v = (lin(x, pre + "attention.self." + s).reshape(n, H, p).transpose(1, 0, 2)
                   for s in ("query", "key", "value"))  # fmt: skip
        a = q @ k.transpose(0, 2, 1) / math.sqrt(p)
        a = np.exp(a - a.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        ctx = (a @ v).transpose(1, 0, 2).reshape(n, d)
        h = ln(x + lin(ctx, pre + "attention.output.dense"), pre + "attention.output.LayerNorm")
        g = lin(h, pre + "intermediate.dense")
        f = lin(0.5 * g * (1 + erf(g / math.sqrt(2))), pre + "output.dense")
        x = ln(h + f, pre + "output.LayerNorm")
        out.append(x)
    return np.stack(out)


def _unit(z: np.ndarray) -> np.ndarray:
    return z / np.linalg.norm(z, axis=-1, keepdims=True)


def directions_of(x: np.ndarray, ln: LayerNorm | None) -> np.ndarray:
    r"""Tokens ``x`` as directions: LayerNorm ``ln``'s normalized coordinate :math:`(x - \beta)/(\sqrt d\gamma)`
    (centred, unit), or :math:`x/|x|` when ``ln`` is ``None``."""
    if ln is None:
        return _unit(x)
    z = (x - ln.beta) / (math.sqrt(x.shape[-1]) * ln.gamma)
    return _unit(z - z.mean(axis=-1, keepdims=True))


def _out_norm(layers: list[BertLayer], ell: int) -> LayerNorm:
    """The LayerNorm whose output the real layer-``ell`` tokens are."""
    return layers[ell].ln_in if ell < len(layers) else layers[-1].ln2


def one_layer_alignment(
    layers: list[BertLayer], states: np.ndarray, parts: tuple[str, ...], radius: float
) -> tuple[np.ndarray, np.ndarray]:
    r"""For each layer :math:`\ell`: the cosine between the idealisation's velocity at the real tokens and the
    real displacement :math:`\theta_{\ell+1} - \theta_\ell` (all tokens stacked), and the best step
    :math:`\langle v, \Delta\rangle/|v|^2`; directions in LayerNorm's coordinate with the LayerNorm part,
    else :math:`x/|x|`."""
    from ..measure import Atoms

    use_ln = "layernorm" in parts
    align, step = [], []
    for ell, layer in enumerate(layers):
        m = layer.with_parts(parts, radius=radius)
        th0 = directions_of(states[ell], _out_norm(layers, ell) if use_ln else None)
        th1 = directions_of(states[ell + 1], _out_norm(layers, ell + 1) if use_ln else None)
        v, D = m.velocity(th0, Atoms(th0)), th1 - th0
        vv, vd = float(np.sum(v * v)), float(np.sum(v * D))
        align.append(vd / math.sqrt(vv * float(np.sum(D * D))))
        step.append(vd / vv)
    return np.array(align), np.array(step)


def _run(
    layers: list[BertLayer],
    states: np.ndarray,
    parts: tuple[str, ...],
    radius: float,
    speeds: np.ndarray,
    dt: float,
) -> np.ndarray:
    """The idealisation through depth from the real layer-0 tokens; the tokens at t = 0..L as the next layer
    reads them (the readout), shape ``(L + 1, n, d)``."""
    L = len(layers)
    use_ln = "layernorm" in parts
    # one run per layer, each over [0, 1] with that layer's (time-independent) field and speed (a single
    # run of the Layered model is the same, bit for bit: every stage of a step sees the step's layer)
    th = directions_of(states[0], _out_norm(layers, 0) if use_ln else None)
    out = [th]
    for m, s in zip(layers, speeds):
        model = m.with_parts(parts, radius=radius, speed=float(s))
        traj = simulate(
            model, th, 1.0, method="rk4", dt=dt, save_at=SaveAt([0.0, 1.0], diagnostics=())
        )
        th = np.asarray(traj.points)[-1]
        out.append(th)
    P = np.stack(out)
    if not use_ln:
        return P
    d = P.shape[-1]
    return np.stack(
        [
            math.sqrt(d) * _out_norm(layers, k).gamma * P[k] + _out_norm(layers, k).beta
            for k in range(L + 1)
        ]
    )


def _figure(measures: dict[str, Any], out: Path) -> Path:
    from matplotlib import colormaps

    names = list(measures)
    ncols = 4
    nrows = -(-(len(names) + 2) // ncols)
    fig, axes = subplots(nrows, ncols, figsize=(3.2 * ncols, 2.8 * nrows), squeeze=False)
    flat = list(axes.ravel())
    ax_m, ax_c = flat[0], flat[1]
    for name in names:
        ds = measures[name]
        style = dict(lw=2.5, color="k") if name == "real" else dict(lw=1.2)
        ax_m.plot(ds.layer, ds.mean_cosine, marker="o", ms=3, label=name, **style)
        ax_c.plot(ds.layer, ds.clusters.sel(threshold=0.9), marker="o", ms=3, label=name, **style)
    ax_m.set(xlabel="layer (depth)", ylabel="mean pairwise cosine")
    ax_c.set(xlabel="layer (depth)", ylabel="clusters at cosine 0.9")
    ax_m.legend(fontsize=6)
    cmap = colormaps["viridis"]
    for ax, name in zip(flat[2:], names):
        ds = measures[name]
        L = ds.layer.size - 1
        for ell in ds.layer.values:
            ax.plot(ds.cosine, ds.cosine_hist.sel(layer=ell), color=cmap(ell / max(L, 1)), lw=1)
        ax.set_title(f"{name} (layer 0 dark, {L} bright)", fontsize=8)
        ax.set_xlabel("pairwise cosine")
    for ax in flat[2 + len(names) :]:
        ax.axis("off")
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    return save_figure(fig, out / "real-transformer.png", dpi=110)


@register("real-transformer")
def real_transformer(out: Path, quick: bool) -> StudyReport:
    rep = StudyReport("real-transformer")
    why = pretrained.available()
    if why is not None:
        rep.skipped = why
        return rep
    # these products are small (n <= 262 tokens): BLAS threads only add overhead
    with blas_threads(1):
        _study(rep, out, quick)
    return rep


def _study(rep: StudyReport, out: Path, quick: bool) -> None:
    label = numbered(4)
    phase(rep.name, label("the pretrained model: loading, forward pass, dense check"))
    bert = pretrained.Bert()
    ids = bert.tokenize(TEXT)
    if quick:
        ids = np.concatenate([ids[:63], ids[-1:]])  # [CLS] + 62 tokens + [SEP]
    dt = 0.1 if quick else 0.05
    states = bert.forward(ids)
    layers = bert.layers()
    L, n = len(layers), ids.size
    # (a) the discrete model against the independent dense forward pass
    ref = dense_forward(bert.tensors, ids, bert.config)
    err = max(float(np.abs(layers[k].step(ref[k]) - ref[k + 1]).max()) for k in range(L))
    rep.expect(
        "discrete model (BertLayer.step, eta = 1) vs dense forward, max |error|", err, 0.0, 1e-5
    )
    radius = float(np.sqrt(np.mean(np.sum(states[0] ** 2, axis=-1))))
    measures = {"real": pretrained.layer_measures(states)}
    rows: list[dict[str, Any]] = []
    align, best = {}, {}
    phase(rep.name, label(f"one layer at a time, {len(VARIANTS)} idealisations, {L} layers"))
    for name, parts in VARIANTS.items():
        align[name], best[name] = one_layer_alignment(layers, states, parts, radius)
        for ell in range(L):
            rows.append(
                {"kind": "one-layer", "model": name, "layer": ell, "alignment": align[name][ell],
                 "best_step": best[name][ell]}
            )  # fmt: skip
    phase(rep.name, label(f"the idealisations through depth, {n} tokens, RK4 dt = {dt:g}"))
    for name, parts in VARIANTS.items():
        measures[name] = pretrained.layer_measures(
            _run(layers, states, parts, radius, np.ones(L), dt)
        )
        if not quick or name == "+layernorm":
            fitted = np.clip(best[name], 0.0, None)
            measures[name + " (fitted time)"] = pretrained.layer_measures(
                _run(layers, states, parts, radius, fitted, dt)
            )
    # the stiffest idealisation (the feed-forward block without LayerNorm) under step halving
    ff = VARIANTS["+feed-forward"]
    phase(rep.name, label("the +feed-forward run under step halving"))
    fine = _run(layers, states, ff, radius, np.ones(L), dt / 2)
    coarse = _run(layers, states, ff, radius, np.ones(L), dt)
    rep.expect(f"RK4 dt = {dt:g} against dt/2, +feed-forward run, max |change| / max |x|",
               float(np.abs(fine - coarse).max() / np.abs(fine).max()), 0.0, 5e-3)  # fmt: skip
    for name, ds in measures.items():
        for ell in range(L + 1):
            row = {"kind": "depth", "model": name, "layer": ell,
                   "mean_cosine": float(ds.mean_cosine[ell]),
                   "w2_from_previous": float(ds.w2_step.sel(step=ell)) if ell else 0.0}  # fmt: skip
            for t in ds.threshold.values:
                row[f"fraction_above_{t:g}"] = float(ds.fraction_above.sel(layer=ell, threshold=t))
                row[f"clusters_{t:g}"] = int(ds.clusters.sel(layer=ell, threshold=t))
                row[f"effective_clusters_{t:g}"] = float(
                    ds.effective_clusters.sel(layer=ell, threshold=t)
                )
            rows.append(row)
    rep.rows = rows
    real = measures["real"].mean_cosine.values
    gain = real[L - 1] - real[0]
    rep.expect("real tokens concentrate: mean cosine, layer L-1 minus layer 0", gain, 0.05, 1.0)
    rep.expect(
        "attention alone clusters too fast: its mean cosine at depth L minus the real one",
        float(measures["attention"].mean_cosine[L]) - real[L], 0.2, 2.0,
    )  # fmt: skip
    inner = slice(0, L - 1)  # the last layer's output LayerNorm suppresses an outlier coordinate
    rep.expect("one layer at a time, +layernorm: mean alignment, layers 0..L-2",
               float(align["+layernorm"][inner].mean()), 0.5, 1.0)  # fmt: skip
    rep.expect("alignment gain of all parts over attention alone, mean over layers 0..L-2",
               float(np.mean(align["+layernorm"][inner] - align["attention"][inner])), 0.15, 2.0)  # fmt: skip
    rep.figures.append(_figure(measures, out))
    lines = ["## One layer at a time from the real tokens", "",
             "| idealisation | " + " | ".join(f"layer {k}" for k in range(L)) + " |",
             "|---|" + "---|" * L]  # fmt: skip
    for name in VARIANTS:
        lines.append(f"| {name}: alignment | " + " | ".join(f"{a:.2f}" for a in align[name]) + " |")
        lines.append(f"| {name}: best step | " + " | ".join(f"{s:.2f}" for s in best[name]) + " |")
    lines += ["", "## Through depth from the real layer-0 tokens", "",
              "| model | mean cosine, layers 0..L | clusters at 0.9 | W2 between layers |", "|---|---|---|---|"]  # fmt: skip
    for name, ds in measures.items():
        lines.append(
            f"| {name} | {' '.join(f'{c:.3f}' for c in ds.mean_cosine.values)} | "
            f"{' '.join(str(int(c)) for c in ds.clusters.sel(threshold=0.9).values)} | "
            f"{' '.join(f'{w:.3f}' for w in ds.w2_step.values)} |"
        )
    rep.sections.append("\n".join(lines))
    rep.notes += [
        f"all-MiniLM-L6-v2 from {bert.source}; {n} tokens; tokens' radius at layer 0 rho = {radius:.3f} "
        f"(sqrt(d) = {math.sqrt(bert.d):.3f}); RK4 step {dt}; one unit of time per layer unless 'fitted time' "
        "(then layer l runs its field at the speed of its best step, clipped at 0)",
        "the continuous models are idealisations, not limits of the Post-LN layer: each real layer "
        "renormalizes the whole stream (docs: Real Transformers)",
    ]
