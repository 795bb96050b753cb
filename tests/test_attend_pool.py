"""`attend --pool`: the attention pooling's attention (timm's AttentionPoolLatent, SigLIP's 'map' head) over the final
rows, held to softmax(q k^T * scale) written out here from the pooling's own q and kv weights, and to the pooling's
own attention output; refused in one line before loading on models that pool otherwise."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import RANDOM_CPU
from vitcli.spec import WeightsSpec

MODEL = "test_vit3"  # timm's registered small ViT with attention pooling (160x160, 10x10 patches, one prefix row)


@pytest.fixture(scope="module")
def pooled_model():
    from vitcli.loading import load_model

    return load_model(WeightsSpec(model_name=MODEL, random=True, seed=0), "cpu")


def independent_pattern_and_v(pool, rows):
    """softmax(q k^T * scale) and v per head, from the pooling's Linear weights alone (no timm forward code)."""
    heads, dim = pool.num_heads, pool.head_dim
    q = pool.latent[0] @ pool.q.weight.T + pool.q.bias  # (latents, D)
    kv = rows @ pool.kv.weight.T + pool.kv.bias  # (B, N, 2D): keys first, then values
    k, v = kv[..., : heads * dim], kv[..., heads * dim :]
    q = q.reshape(-1, heads, dim).transpose(0, 1)  # (heads, latents, d)
    k = k.reshape(*k.shape[:2], heads, dim).transpose(1, 2)  # (B, heads, N, d)
    v = v.reshape(*v.shape[:2], heads, dim).transpose(1, 2)
    pattern = torch.softmax(q @ k.transpose(-2, -1) * dim**-0.5, dim=-1)  # (B, heads, latents, N)
    return pattern, v


def test_each_heads_row_is_the_softmax_of_the_poolings_weights_and_reproduces_its_output(
    cli, newfoundland, pooled_model
):
    result = cli("attend", newfoundland, "--pool", "--model", MODEL, *RANDOM_CPU, "-f", "json")
    assert result.exit_code == 0, result.stderr
    (document,) = json.loads(result.stdout)["results"]
    shown = torch.tensor([entry["attention"] for entry in document["result"]["maps"]], dtype=torch.float64)
    net = pooled_model.net
    pool = net.attn_pool
    assert [entry["head"] for entry in document["result"]["maps"]] == list(range(1, pool.num_heads + 1))
    outputs = []
    handle = pool.proj.register_forward_hook(lambda _module, _inputs, output: outputs.append(output))
    try:
        with torch.no_grad():
            inputs = pooled_model.prepare(newfoundland).input.unsqueeze(0)
            rows = net.forward_features(inputs)  # what the pooling reads: the final norm's rows
            net.forward_head(rows)
            pattern, v = independent_pattern_and_v(pool, rows)
    finally:
        handle.remove()
    torch.testing.assert_close(shown, pattern[0, :, 0].double(), atol=1e-5, rtol=0)
    # The shown pattern @ v, joined over heads and projected, is the pooling's own (fused) attention output.
    joined = (shown.float()[None, :, None, :] @ v).transpose(1, 2).flatten(-2)
    torch.testing.assert_close(pool.proj(joined).detach(), outputs[0], atol=1e-5, rtol=0)
    assert document["result"]["self_check"]["max_abs_difference"] < 1e-5


def test_head_selects_one_heads_row(cli, newfoundland):
    result = cli("attend", newfoundland, "--pool", "--head", "2", "--model", MODEL, *RANDOM_CPU, "-f", "json")
    assert result.exit_code == 0, result.stderr
    (document,) = json.loads(result.stdout)["results"]
    assert [entry["head"] for entry in document["result"]["maps"]] == [2]
    assert document["experiment"]["name"] == "pool-attention-h2"


def test_a_spoiled_pattern_prints_nothing(cli, newfoundland, monkeypatch):
    import vitcli.experiments.attention_pool as experiment

    written = experiment.explicit_latent_attention

    def spoiled(pool, rows):
        pattern, output = written(pool, rows)
        return pattern, output + 1e-3

    monkeypatch.setattr(experiment, "explicit_latent_attention", spoiled)
    result = cli("attend", newfoundland, "--pool", "--model", MODEL, *RANDOM_CPU)
    assert result.exit_code == 1 and "self-check failed in the attention pooling" in result.stderr
    assert "wrote" not in result.stdout


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        (["--model", "test_vit"], "`attend --pool` needs what test_vit (timm VisionTransformer) lacks: no attention "),
        (
            ["--model", MODEL, "--view", "summary"],
            "--pool shows the attention pooling's attention: drop --view summary",
        ),
        (["--model", MODEL, "--block", "1"], "--pool reads the attention pooling after the last block: drop --block 1"),
        (["--model", MODEL, "--query", "5"], "--pool's query is the pooling's latent query: drop --query 5"),
        (["--model", MODEL, "--head", "9"], "--head must be between 1 and"),
    ],
    ids=["no pooling", "view", "block", "query", "head"],
)
def test_pool_is_refused_in_one_line_before_loading(cli, newfoundland, monkeypatch, arguments, fragment):
    import vitcli.loading

    monkeypatch.setattr(vitcli.loading, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))
    result = cli("attend", newfoundland, "--pool", *arguments, *RANDOM_CPU)
    assert result.exit_code == 2, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: "), result.stderr
    assert fragment in result.stderr
