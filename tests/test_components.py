"""The named sites of vitcli.capture: what they hold adds up as a pre-norm block adds it, a hook's
return value replaces the activation, and hooks never outlive their `with`."""

from __future__ import annotations

import pytest
import torch

from vitcli.capture import Part, caching, hooks, logits_from, pre_norm_refusal, replaced

from conftest import small_vit


@pytest.fixture(scope="module")
def layer_scale():
    """ViT-Tiny, 2 blocks, 64x64, layer scale on (gamma 0.5), so hook_attn_out must include it."""
    return small_vit("vit_tiny_patch16_224.augreg_in21k_ft_in1k", depth=2, img_size=64, init_values=0.5)


def test_the_sites_add_up_as_the_block_adds_them(layer_scale, photo):
    """resid_post = resid_pre + attn_out + mlp_out; resid_post of block 1 is resid_pre of block 2; hook_z joined and
    projected is the attention module's output. Seen failing with hook_attn_out on ls1's input (layer scale lost)."""
    net = layer_scale.net
    sites = [f"blocks.{b}.{name}" for b in (1, 2) for name in ("hook_resid_pre", "hook_attn_out", "hook_mlp_out")]
    sites += ["blocks.1.hook_resid_post", "blocks.2.hook_resid_post", "blocks.1.attn.hook_z"]
    with torch.inference_mode(), caching(net, sites) as cache:
        net(layer_scale.prepare(photo).input[None])
    for block in (1, 2):
        added = cache[f"blocks.{block}.hook_resid_pre"] + cache[f"blocks.{block}.hook_attn_out"]
        added = added + cache[f"blocks.{block}.hook_mlp_out"]
        torch.testing.assert_close(added, cache[f"blocks.{block}.hook_resid_post"], atol=1e-6, rtol=0)
    assert torch.equal(cache["blocks.1.hook_resid_post"], cache["blocks.2.hook_resid_pre"])
    z = cache["blocks.1.attn.hook_z"]
    assert z.shape[-2:] == (3, 64)
    with torch.inference_mode():
        projected = net.blocks[0].ls1(net.blocks[0].attn.proj(z.flatten(-2)))
    torch.testing.assert_close(projected, cache["blocks.1.hook_attn_out"], atol=1e-6, rtol=0)


def test_a_returned_tensor_replaces_the_activation_and_hooks_leave_with_the_block(layer_scale, photo):
    """Zeroing the last MLP's output leaves the logits of (rows entering block 2 + its attention output). Seen
    failing with the hooks left registered on leaving the `with`."""
    net = layer_scale.net
    inputs = layer_scale.prepare(photo).input[None]
    with torch.inference_mode():
        with caching(net, ["blocks.2.hook_resid_pre", "blocks.2.hook_attn_out"]) as cache:
            clean = net(inputs)
        expected = net.forward_head(net.norm(cache["blocks.2.hook_resid_pre"] + cache["blocks.2.hook_attn_out"]))
        with pytest.raises(RuntimeError, match="inside"), hooks(net, {"blocks.2.hook_mlp_out": torch.zeros_like}):
            zeroed = net(inputs)
            raise RuntimeError("inside the with")
        assert not net.blocks[1].drop_path2._forward_hooks  # removed although the `with` ended in an error
        assert torch.equal(net(inputs), clean)
    torch.testing.assert_close(zeroed, expected, atol=1e-5, rtol=0)
    assert not torch.equal(zeroed, clean)


def test_replaced_parts_equal_explicitly_edited_runs(layer_scale, photo, newfoundland):
    """Part(row, token) at hook_resid_pre equals the rows edited by hand and run on by logits_from; Part(row, head) at
    hook_z zeroed equals a copy of the net whose attn.proj columns of that head are 0; other rows are untouched.
    Seen failing with Part's head counted from zero (`self.head`) and with the token index ignored."""
    import copy

    net = layer_scale.net
    inputs = torch.stack([layer_scale.prepare(photo).input, layer_scale.prepare(newfoundland).input])
    token, head, width = 3, 2, net.blocks[0].attn.head_dim
    with torch.inference_mode():
        with caching(net, ["blocks.2.hook_resid_pre"]) as cache:
            clean = net(inputs)
        rows = cache["blocks.2.hook_resid_pre"]
        edited = rows[:1].clone()
        edited[0, token] = rows[1, token]
        explicit = logits_from(net, 2, edited)
        edit = (Part(0, token=token), lambda _running: rows[1, token])
        with hooks(net, {"blocks.2.hook_resid_pre": lambda value: replaced(value, [edit])}):
            hooked = net(inputs)
        zeroed_net = copy.deepcopy(net)
        zeroed_net.blocks[0].attn.proj.weight[:, (head - 1) * width : head * width] = 0
        zeroed = zeroed_net(inputs[1:])
        with hooks(
            net, {"blocks.1.attn.hook_z": lambda value: replaced(value, [(Part(1, head=head), torch.zeros_like)])}
        ):
            ablated = net(inputs)
    torch.testing.assert_close(hooked[0], explicit[0], atol=1e-5, rtol=0)
    assert not torch.allclose(hooked[0], clean[0], atol=1e-3)
    torch.testing.assert_close(ablated[1], zeroed[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.stack([ablated[0], hooked[1]]), clean, atol=1e-5, rtol=0)
    with torch.inference_mode():
        torch.testing.assert_close(logits_from(net, 1, layer_scale.embed(inputs)), clean, atol=1e-5, rtol=0)


def test_unknown_sites_and_other_block_layouts_are_named():
    import timm

    net = timm.create_model("vit_small_patch16_18x2_224", pretrained=False, device="meta", depth=2)
    refusal = pre_norm_refusal(net, "vit_small_patch16_18x2_224")
    assert "block 1 (ParallelThingsBlock) has no norm1, attn, attn.qkv, attn.proj" in refusal
    with pytest.raises(ValueError, match="unknown site"), hooks(net, {"blocks.1.hook_q": print}):
        pass


def test_the_attention_pattern_site_reproduces_the_fused_attention_and_leaves_the_model_fused(layer_scale, photo):
    """blocks.B.attn.hook_pattern holds softmax(q k^T * scale): pattern x v per head equals the head outputs of the
    model's own fused forward (hook_z), it equals vitcli's explicit trace, and fused attention is back after the
    `with`, also when two captures of one block nest. Seen failing with fused attention left off after the `with`."""
    net = layer_scale.net
    inputs = layer_scale.prepare(photo).input[None]
    with torch.inference_mode(), caching(net, ["blocks.1.ln1.hook_normalized", "blocks.1.attn.hook_z"]) as fused:
        fused_logits = net(inputs)
    patterns = ["blocks.1.attn.hook_pattern", "blocks.2.attn.hook_pattern"]
    with torch.inference_mode(), caching(net, patterns) as outer, caching(net, patterns[:1]) as inner:
        logits = net(inputs)
    assert all(block.attn.fused_attn for block in net.blocks)
    torch.testing.assert_close(logits, fused_logits, atol=1e-5, rtol=0)
    assert torch.equal(outer[patterns[0]], inner[patterns[0]])
    attention = net.blocks[0].attn
    width = attention.qkv.in_features
    with torch.inference_mode():
        v = torch.nn.functional.linear(fused["blocks.1.ln1.hook_normalized"], *(p[2 * width :] for p in (
            attention.qkv.weight, attention.qkv.bias)))  # fmt: skip
    v = v.unflatten(-1, (attention.num_heads, -1)).transpose(1, 2)  # (batch, heads, tokens, d)
    head_outputs = (outer[patterns[0]] @ v).transpose(1, 2)  # (batch, tokens, heads, d), as hook_z
    torch.testing.assert_close(head_outputs, fused["blocks.1.attn.hook_z"], atol=1e-5, rtol=1e-5)
    trace = layer_scale.trace(inputs, keep=range(2))
    for block, site in enumerate(patterns):
        torch.testing.assert_close(outer[site], trace.blocks[block].attention.to(outer[site].dtype), atol=1e-6, rtol=0)
        torch.testing.assert_close(outer[site].sum(-1), torch.ones_like(outer[site].sum(-1)), atol=1e-6, rtol=0)
