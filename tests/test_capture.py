"""The capture layer: identities its sites must hold on every form of timm's VisionTransformer, checked against the
modules' own computations (fused and non-fused paths, weight edits), and the rule that nothing outside
vitcli/capture hooks a network."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from vitcli.capture import (
    attention_output,
    attention_self_check,
    block_site,
    caching,
    caching_with_gradients,
    family_of,
    head_site,
    hooks,
    module_inputs_and_outputs,
    pattern_site,
    resid_pre_site,
    unfused_attention,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VITCLI = Path(__file__).resolve().parents[1] / "vitcli"
FORMS = {
    "vit_tiny_patch16_224": {},
    "vit_base_patch32_224": {},  # 7x7 grid
    "vit_base_patch16_siglip_224": {},  # no class token, attention pooling
    "vit_small_patch14_reg4_dinov2": {"img_size": 224},  # CLS, R1..R4
    "deit_tiny_distilled_patch16_224": {},  # CLS, DIST
}
RELATIVE = 1e-5  # pattern and v against the fused module: float32 along different operation orders
PATTERN_TOLERANCE = 1e-6  # the pattern against timm's own non-fused probabilities
ATTENTION_SITES = ("ln1.hook_normalized", "attn.hook_pattern", "attn.hook_v")


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


@pytest.fixture(scope="module", params=list(FORMS))
def form(request):
    """(name, net, inputs): the architecture cut to 2 blocks, seeded random weights, two random images."""
    import timm

    torch.manual_seed(0)
    net = timm.create_model(request.param, pretrained=False, depth=2, **FORMS[request.param]).eval()
    size = family_of(net).grid()
    inputs = torch.randn(2, 3, size.rows * size.patch_size, size.cols * size.patch_size)
    return request.param, net, inputs


def sites_of_every_block(net, kinds):
    return [block_site(number, kind) for number in range(1, len(net.blocks) + 1) for kind in kinds]


def test_pattern_and_v_reproduce_the_fused_attention_output(form):
    _, net, inputs = form
    with torch.no_grad():
        with caching(net, sites_of_every_block(net, ATTENTION_SITES)) as cache:
            net(inputs)
        assert all(block.attn.fused_attn for block in net.blocks), "the reference is the fused path"
        for number, block in enumerate(net.blocks, start=1):
            attention = block.attn
            pattern, v = cache[pattern_site(number)], cache[block_site(number, "attn.hook_v")]
            mixed = torch.einsum("bhqk,bkhd->bqhd", pattern, v).flatten(-2)
            by_hand = attention.proj(attention.norm(mixed))
            own = attention(cache[block_site(number, "ln1.hook_normalized")])
            assert relative(by_hand, own) < RELATIVE
            assert relative(attention_output(family_of(net), number, pattern, v), own) < RELATIVE


def test_pattern_equals_timms_non_fused_probabilities_at_attn_drop(form):
    _, net, inputs = form
    read = {}
    handles = [
        block.attn.attn_drop.register_forward_hook(lambda _m, _a, out, n=n: read.__setitem__(n, out))
        for n, block in enumerate(net.blocks, start=1)
    ]
    try:
        for block in net.blocks:
            block.attn.fused_attn = False
        with torch.no_grad():
            net(inputs)
    finally:
        for block in net.blocks:
            block.attn.fused_attn = True
        for handle in handles:
            handle.remove()
    with torch.no_grad(), caching(net, sites_of_every_block(net, ["attn.hook_pattern"])) as cache:
        net(inputs)
    for number in read:
        assert (cache[pattern_site(number)] - read[number]).abs().max() < PATTERN_TOLERANCE
    assert all(block.attn.fused_attn for block in net.blocks), "caching restores the fused path"


def test_the_written_out_attention_equals_the_sites_and_the_module(form):
    """The family's explicit attention (attend's and trace's) on a block's ln1 rows: its pattern is the captured one,
    its output the module's own, without calling the attention module."""
    _, net, inputs = form
    family = family_of(net)
    with torch.no_grad():
        with caching(net, sites_of_every_block(net, [*ATTENTION_SITES, "attn.hook_q", "attn.hook_k"])) as cache:
            net(inputs)
        for number in range(1, len(net.blocks) + 1):
            normed = cache[block_site(number, "ln1.hook_normalized")]
            q, k, v, pattern, output = family.explicit_attention(number, normed)
            for kind, written in (("q", q), ("k", k), ("v", v)):
                assert torch.equal(written.transpose(1, 2), cache[block_site(number, f"attn.hook_{kind}")])
            assert (pattern - cache[pattern_site(number)]).abs().max() < PATTERN_TOLERANCE
            assert relative(output, family.own_attention(number, normed)) < RELATIVE


def test_zero_ablation_at_z_equals_the_weight_edit(form):
    _, net, inputs = form
    attention = net.blocks[1].attn
    d = attention.head_dim

    def zero_head_2(z):
        z = z.clone()
        z[:, :, 1] = 0
        return z

    with torch.no_grad():
        with hooks(net, {head_site(2): zero_head_2}):
            by_hook = net(inputs)
        weight = attention.proj.weight.data.clone()
        try:
            attention.proj.weight.data[:, d : 2 * d] = 0
            by_edit = net(inputs)
        finally:
            attention.proj.weight.data = weight
    assert relative(by_hook, by_edit) < RELATIVE


def test_patching_every_resid_pre_with_clean_values_restores_the_clean_run(form):
    _, net, inputs = form
    sites = [resid_pre_site(number) for number in range(1, len(net.blocks) + 1)]
    with torch.no_grad():
        with caching(net, sites) as clean:
            clean_output = net(inputs)
        corrupted = inputs.flip(0) + 0.5
        assert not torch.equal(net(corrupted), clean_output)
        with hooks(net, {site: lambda _rows, site=site: clean[site] for site in sites}):
            patched = net(corrupted)
    assert torch.equal(patched, clean_output)


def test_capturing_every_site_adds_no_forward(form):
    _, net, inputs = form
    family = family_of(net)
    calls = []
    handle = net.patch_embed.register_forward_hook(lambda *_: calls.append(1))
    try:
        sites = sites_of_every_block(net, sorted(family.block_sites)) + sorted(family.model_sites)
        with torch.no_grad(), caching(net, sites) as cache:
            net(inputs)
    finally:
        handle.remove()
    assert calls == [1] and set(cache) == set(sites)


def test_pool_pattern_reproduces_attention_pooling():
    """SigLIP's attention pooling: its latent's probabilities over the final rows, times the values its kv makes of
    them, through proj and the pool's MLP, give the pooled vector."""
    import timm

    torch.manual_seed(0)
    net = timm.create_model("vit_base_patch16_siglip_224", pretrained=False, depth=1).eval()
    pool = net.attn_pool
    with torch.no_grad(), caching(net, ["pool.hook_pattern", "ln_final.hook_normalized", "pool.hook_out"]) as cache:
        net(torch.randn(2, 3, 224, 224))
        rows = cache["ln_final.hook_normalized"]
        v = pool.kv(rows).unflatten(-1, (2, pool.num_heads, pool.head_dim))[:, :, 1].transpose(1, 2)
        latent = (cache["pool.hook_pattern"] @ v).transpose(1, 2).flatten(-2)
        latent = pool.proj(latent)
        pooled = (latent + pool.mlp(pool.norm(latent)))[:, 0]
    assert cache["pool.hook_pattern"].shape == (2, pool.num_heads, 1, 196)
    assert relative(pooled, cache["pool.hook_out"]) < RELATIVE


def test_self_check_finds_a_spoiled_image_in_one_module_call(form):
    _, net, inputs = form
    family = family_of(net)
    with torch.no_grad(), caching(net, [block_site(1, kind) for kind in ATTENTION_SITES]) as cache:
        net(inputs)
        output = attention_output(family, 1, cache[pattern_site(1)], cache[block_site(1, "attn.hook_v")])
    output[1, 3, 5] += 0.5
    calls = []
    handle = net.blocks[0].attn.register_forward_hook(lambda _m, args, _out: calls.append(args[0].shape[0]))
    try:
        differences = attention_self_check(family, 1, cache[block_site(1, "ln1.hook_normalized")], output)
    finally:
        handle.remove()
    assert calls == [2] and differences.shape == (2,)
    assert differences[0] < 1e-4 and differences[1] == pytest.approx(0.5, abs=1e-4)


def test_gradients_at_sites_equal_autograd_through_the_same_tensors(form):
    """Gradients kept at the pattern and ln1 sites equal those of the model's forward recomputed from the kept
    tensors: d(score)/d(site) by autograd.grad on a forward that hooks nothing but replaces the site."""
    _, net, inputs = form
    sites = [pattern_site(2), block_site(2, "ln1.hook_normalized")]
    with caching_with_gradients(net, sites) as kept:
        score = net(inputs)[:, 0].sum()
        score.backward()
    assert set(kept.gradients) == set(sites) and all(not t.requires_grad for t in kept.activations.values())
    net.zero_grad(set_to_none=True)
    # A leaf holding the kept pattern, put back at its site: its gradient is the site's.
    leaf = kept.activations[pattern_site(2)].clone().requires_grad_(True)
    with hooks(net, {pattern_site(2): lambda _pattern: leaf}):
        net(inputs)[:, 0].sum().backward()
    net.zero_grad(set_to_none=True)
    assert relative(kept.gradients[pattern_site(2)], leaf.grad) < RELATIVE


def test_unfused_attention_and_module_capture_come_off_after_an_error(form):
    _, net, inputs = form
    with pytest.raises(RuntimeError), unfused_attention(net):
        assert not any(block.attn.fused_attn for block in net.blocks)
        raise RuntimeError("inside")
    assert all(block.attn.fused_attn for block in net.blocks)
    with torch.no_grad(), module_inputs_and_outputs(net, ["blocks.0", "norm"]) as kept:
        output = net.forward_features(inputs)
    assert torch.equal(kept["norm"][1], output) and kept["blocks.0"][0].shape == output.shape
    assert all(not module._forward_hooks and not module._forward_pre_hooks for module in net.modules())


# ----- nothing outside vitcli/capture hooks a network

HOOKING_CALLS = frozenset(
    {"register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook", "register_backward_hook"}
)


def hooking_places(source: str) -> list[str]:
    """Calls that put a module hook on, and assignments to `fused_attn`, in one module's source."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            if node.attr in HOOKING_CALLS or (node.attr == "fused_attn" and isinstance(node.ctx, ast.Store)):
                found.append(f"line {node.lineno}: {node.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
            if any(isinstance(arg, ast.Constant) and arg.value == "fused_attn" for arg in node.args):
                found.append(f"line {node.lineno}: setattr fused_attn")
    return found


def test_the_scan_finds_hooks_and_fused_flags():
    source = "m.register_forward_hook(f)\nm.attn.fused_attn = False\nsetattr(m, 'fused_attn', 0)\nx = m.fused_attn"
    assert len(hooking_places(source)) == 3


def test_only_the_capture_layer_hooks_a_network():
    capture = VITCLI / "capture"
    outside = {
        str(path.relative_to(VITCLI)): places
        for path in sorted(VITCLI.rglob("*.py"))
        if capture not in path.parents and (places := hooking_places(path.read_text(encoding="utf-8")))
    }
    assert outside == {}
