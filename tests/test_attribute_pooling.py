"""Direct attribution through attention pooling (timm's AttentionPoolLatent, SigLIP's 'map' head): with the pooling's
probabilities and every LayerNorm's deviation frozen at the image's values, the terms, the pooling MLP's term and the
constant rebuild the model's own logit or embedding score, and the pooled embedding itself (embedding_readout).

timm's `test_vit3` (9 blocks of width 96, a class token, attention pooling, 1,000 classes) is built with every
parameter redrawn at a scale where each block's term matters: its own initialisation (layer scale 1e-5) leaves the
blocks' terms near 1e-9, which would let a decomposition that ignored them pass.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import RANDOM_CPU
from vitcli.spec import WeightsSpec

MODEL = "test_vit3"
TOLERANCE = 1e-4


def redraw(net: torch.nn.Module, seed: int) -> None:
    """Scales and layer scales near 1, every other parameter small and random: all terms of one order."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in net.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            scale_like = name.endswith("gamma") or ("norm" in name and name.endswith("weight"))
            parameter.copy_(1.0 + 0.3 * noise if scale_like else 0.08 * noise)


@pytest.fixture(scope="module")
def pooling_model():
    from vitcli.loading import load_model

    model = load_model(WeightsSpec(model_name=MODEL, random=True, seed=0), "cpu")
    redraw(model.net, 1)
    return model


def own_forward(model, prepared) -> dict[str, torch.Tensor]:
    """The model's own logits and pooled vector, and its pooling's attention output and output, read by hooks
    registered here (no vitcli code between)."""
    pool, seen = model.net.attn_pool, {}
    handles = [
        pool.proj.register_forward_hook(lambda _m, _i, output: seen.__setitem__("attended", output)),
        pool.register_forward_hook(lambda _m, _i, output: seen.__setitem__("pooled", output)),
    ]
    try:
        with torch.no_grad():
            seen["logits"] = model.net(prepared.input[None])
    finally:
        for handle in handles:
            handle.remove()
    return {name: value[0].double() for name, value in seen.items()}


@pytest.mark.parametrize("by", ["block", "head", "token"])
def test_the_terms_rebuild_the_class_logit_through_attention_pooling(pooling_model, photo, by):
    from vitcli.experiments.attribution import attribute

    prepared = pooling_model.prepare(photo)
    own = own_forward(pooling_model, prepared)
    target, contrast = 17, 401
    result = attribute(pooling_model, prepared, target, contrast, by, 4 if by == "token" else None)
    expected = float(own["logits"][target] - own["logits"][contrast])
    assert result.model_metric == pytest.approx(expected, abs=1e-6)
    assert abs(result.reconstruction - expected) < TOLERANCE
    blocks = [abs(term.value) for term in result.block_terms[1:]]
    assert max(blocks) > 100 * TOLERANCE  # the blocks carry the metric: dropping them would fail the test


def test_the_pool_mlp_term_is_the_poolings_own_mlp_output_read_by_the_head(pooling_model, photo):
    """pooled = attended + mlp(norm(attended)): the head reads the difference the module itself computed."""
    from vitcli.experiments.attribution import POOL_MLP, attribute

    prepared = pooling_model.prepare(photo)
    own = own_forward(pooling_model, prepared)
    result = attribute(pooling_model, prepared, 17, None, "head")
    weight = pooling_model.net.head.weight[17].detach().double()
    expected = float((own["pooled"] - own["attended"][0]) @ weight)  # fc_norm is an Identity on test_vit3
    assert result.pool_mlp == pytest.approx(expected, abs=1e-5)
    assert [term.value for term in result.terms if term.component == POOL_MLP] == [result.pool_mlp]


def test_token_terms_sum_to_each_heads_term_over_the_pooled_tokens(pooling_model, photo):
    from vitcli.experiments.attribution import TOKEN, attribute

    prepared = pooling_model.prepare(photo)
    by_head = attribute(pooling_model, prepared, 17, None, "head")
    by_token = attribute(pooling_model, prepared, 17, None, "token", 6)
    heads = by_head.head_terms.shape[1]
    sums = [sum(t.value for t in by_token.terms if t.component == TOKEN and t.head == h) for h in range(1, heads + 1)]
    assert sums == pytest.approx(by_head.head_terms[5].tolist(), abs=1e-8)


@pytest.mark.parametrize("name", [MODEL, "test_vit"])
def test_embedding_readout_rebuilds_the_pooled_embedding(photo, name):
    """Attention pooling (test_vit3) and CLS-row pooling (test_vit): the parts of the embedding, every block's
    attention and MLP outputs, plus the constant and the pooling MLP, equal the model's own pooled embedding."""
    from vitcli.capture import caching
    from vitcli.experiments.readout import embedding_readout
    from vitcli.loading import load_model

    model = load_model(WeightsSpec(model_name=name, random=True, seed=0), "cpu")
    redraw(model.net, 2)
    net, depth = model.net, model.depth
    components = ["blocks.1.hook_resid_pre"]
    components += [f"blocks.{b}.hook_{kind}_out" for b in range(1, depth + 1) for kind in ("attn", "mlp")]
    inputs = model.prepare(photo).input[None]
    with torch.no_grad(), caching(net, [*components, f"blocks.{depth}.hook_resid_post"]) as cache:
        net(inputs)
        pooled = net.forward_head(net.forward_features(inputs), pre_logits=True)[0].double()
    readout = embedding_readout(net, cache[f"blocks.{depth}.hook_resid_post"][0])
    rebuilt = sum(readout.part(cache[site][0]) for site in components) + readout.constant + readout.pool_mlp
    torch.testing.assert_close(rebuilt, pooled, atol=TOLERANCE * float(pooled.abs().max()), rtol=0)
    assert (readout.pool_mlp != 0).any() == (name == MODEL)


def test_attribute_follows_an_embedding_target_through_attention_pooling(cli, photo):
    """The command as a user runs it, on the pooled embedding's feature 3 (the model's own initialisation)."""
    from vitcli.loading import load_model

    result = cli("attribute", photo, "--model", MODEL, "--target-feature", "3", *RANDOM_CPU, "-f", "json")
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)["results"][0]["result"]
    model = load_model(WeightsSpec(model_name=MODEL, random=True, seed=0), "cpu")
    with torch.no_grad():
        inputs = model.prepare(photo).input[None]
        pooled = model.net.forward_head(model.net.forward_features(inputs), pre_logits=True)[0]
    reconstruction = document["reconstruction"]
    assert reconstruction["model_metric"] == pytest.approx(float(pooled[3]), abs=1e-6)
    assert reconstruction["abs_difference"] < TOLERANCE
    assert [term["name"] for term in document["terms"]][-1] == "pool mlp"
    assert document["pool_mlp_term"] == document["terms"][-1]["term"]


def test_the_dla_map_rebuilds_the_logit_through_attention_pooling(pooling_model, photo):
    """explain --method dla on the same model: its token parts per block are attribute's head terms summed over
    heads, and with the pool MLP's term the whole rebuilds the model's own logit."""
    from vitcli.experiments.attribution import attribute
    from vitcli.experiments.dla import direct_decomposition

    prepared = pooling_model.prepare(photo)
    own = own_forward(pooling_model, prepared)
    decomposition = direct_decomposition(pooling_model, prepared, 17)
    by_head = attribute(pooling_model, prepared, 17, None, "head")
    assert abs(decomposition.reconstruction - float(own["logits"][17])) < TOLERANCE
    assert decomposition.pool_mlp == pytest.approx(by_head.pool_mlp, abs=1e-9)
    assert decomposition.token_parts.sum(axis=1) == pytest.approx(by_head.head_terms.sum(axis=1), abs=1e-8)
