"""timm's SwinTransformer as a family: stages and grids, window attention mapped onto the stage grid, exactly.

Oracles: timm's own non-fused window probabilities read at `attn_drop` by a hook of this file, put on the grid by
coordinates computed here from the shift and window size (not by the adapter's permutation); the attention module's
own output with its fused kernel on; v computed from the captured ln1 rows by the block's qkv Linear directly.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from vitcli.capture import block_site, caching, family_of, hooks

from conftest import RANDOM_CPU, result_files

SWIN = "swin_tiny_patch4_window7_224"
# What every command written for one token grid through every block says of Swin (capture.support).
GRIDS = (
    "no single token grid through every block (windows or patch merging); "
    "its stages have the grids 56x56, 28x28, 14x14, 7x7"
)
UNSHIFTED, SHIFTED = 3, 4  # blocks of stage 2 (28x28 grid): block 4 rolls its windows by (3, 3)


@pytest.fixture(scope="module")
def swin():
    import timm

    torch.manual_seed(0)
    return timm.create_model(SWIN, pretrained=False).eval()


@pytest.fixture(scope="module")
def inputs():
    torch.manual_seed(1)
    return torch.randn(1, 3, 224, 224)


def window_tokens(rows: int, cols: int, window: int, shift: int) -> torch.Tensor:
    """(windows, window area): the grid token (row-major) at each position of each window of timm's window order,
    from coordinates: window (wr, wc), position (a, b) sit at rolled coordinates (wr w + a, wc w + b), which hold the
    token at ((r + shift) mod rows, (c + shift) mod cols) of the unrolled grid."""
    tokens = torch.empty(rows * cols // window**2, window * window, dtype=torch.long)
    for index in range(tokens.shape[0]):
        window_row, window_col = divmod(index, cols // window)
        for position in range(window * window):
            a, b = divmod(position, window)
            row, col = (window_row * window + a + shift) % rows, (window_col * window + b + shift) % cols
            tokens[index, position] = row * cols + col
    return tokens


def timm_window_probabilities(net, block, inputs: torch.Tensor) -> torch.Tensor:
    """timm's non-fused softmax at attn_drop, (windows, heads, area, area) for one image."""
    kept = []
    attention = block.attn
    was = attention.fused_attn
    attention.fused_attn = False
    handle = attention.attn_drop.register_forward_hook(lambda _m, _i, output: kept.append(output))
    try:
        with torch.no_grad():
            net(inputs)
    finally:
        handle.remove()
        attention.fused_attn = was
    return kept[0]


def test_blocks_count_over_the_stages_with_each_stage_grid():
    from vitcli.loading import require_vit

    family = family_of(require_vit(SWIN))  # the meta skeleton: no weights needed
    places = family.places()
    assert len(family.blocks()) == len(places) == 12
    assert [place.stage for place in places] == [1, 1, 2, 2, 3, 3, 3, 3, 3, 3, 4, 4]
    assert [place.heads for place in places] == [3, 3, 6, 6, 12, 12, 12, 12, 12, 12, 24, 24]
    grids = {place.stage: (place.grid.rows, place.grid.cols, place.grid.patch_size) for place in places}
    assert grids == {1: (56, 56, 4), 2: (28, 28, 8), 3: (14, 14, 16), 4: (7, 7, 32)}
    assert all(place.grid.prefix_names == () for place in places)
    assert family.describe()["stages"] == ["56x56", "28x28", "14x14", "7x7"]
    assert family.refusal() is None and {"pattern", "heads", "replace"} <= family.features
    assert "explicit_forward" not in family.features and "plain_rows" not in family.features


@pytest.mark.slow
@pytest.mark.parametrize("number", [UNSHIFTED, SHIFTED])
def test_pattern_equals_timms_window_probabilities_put_on_the_grid(swin, inputs, number):
    family = family_of(swin)
    block, place = family.blocks()[number - 1], family.places()[number - 1]
    assert any(block.shift_size) == (number == SHIFTED)
    windows = timm_window_probabilities(swin, block, inputs)
    with torch.no_grad(), caching(swin, [block_site(number, "attn.hook_pattern")]) as cache:
        swin(inputs)
    pattern = cache[block_site(number, "attn.hook_pattern")][0]
    grid = place.grid
    assert pattern.shape == (place.heads, grid.num_patches, grid.num_patches)
    tokens = window_tokens(grid.rows, grid.cols, block.window_size[0], block.shift_size[0])
    on_grid = pattern[:, tokens[:, :, None], tokens[:, None, :]].transpose(0, 1)  # (windows, heads, area, area)
    torch.testing.assert_close(on_grid, windows, rtol=0, atol=1e-6)
    # Nothing outside a token's window: the entries read back above hold every row's whole mass.
    torch.testing.assert_close(pattern.sum(), windows.sum(), rtol=1e-6, atol=0)
    torch.testing.assert_close(pattern.sum(-1), torch.ones(place.heads, grid.num_patches), rtol=0, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("number", [UNSHIFTED, SHIFTED])
def test_pattern_times_v_projected_is_the_modules_fused_attention_output(swin, inputs, number):
    family = family_of(swin)
    attention = family.blocks()[number - 1].attn
    heads = family.places()[number - 1].heads
    was = attention.fused_attn
    attention.fused_attn = True  # the module's own output through scaled_dot_product_attention
    try:
        with torch.no_grad():
            with caching(
                swin, [block_site(number, "attn.hook_pattern"), block_site(number, "ln1.hook_normalized")]
            ) as c:
                swin(inputs)
            with caching(swin, [block_site(number, "hook_attn_out")]) as fused:
                swin(inputs)
            pattern, normed = c[block_site(number, "attn.hook_pattern")], c[block_site(number, "ln1.hook_normalized")]
            v = attention.qkv(normed).unflatten(-1, (3, heads, -1))[..., 2, :, :]  # per token: no windows needed
            explicit = attention.proj(torch.einsum("bhqk,bkhd->bqhd", pattern, v).flatten(-2))
    finally:
        attention.fused_attn = was
    module_output = fused[block_site(number, "hook_attn_out")]
    scale = module_output.abs().max()
    assert float((explicit - module_output).abs().max() / scale) <= 1e-5


@pytest.mark.slow
def test_sites_inside_windows_replace_exactly(swin, inputs):
    family = family_of(swin)
    attention = family.blocks()[SHIFTED - 1].attn
    head_dim = family.places()[SHIFTED - 1].head_dim
    with torch.no_grad():
        clean = swin(inputs)

        def without_head_2(z):
            z = z.clone()
            z[:, :, 1] = 0
            return z

        with hooks(swin, {block_site(SHIFTED, "attn.hook_z"): without_head_2}):
            by_hook = swin(inputs)
        weight = attention.proj.weight.data.clone()
        attention.proj.weight.data[:, head_dim : 2 * head_dim] = 0
        try:
            by_edit = swin(inputs)
        finally:
            attention.proj.weight.data = weight
        # Handing every windowed site back unchanged (through grid order and back) changes nothing.
        kinds = ("attn.hook_q", "attn.hook_k", "attn.hook_v", "hook_resid_pre", "hook_attn_out", "hook_resid_post")
        with hooks(swin, {block_site(SHIFTED, kind): lambda t: t.clone() for kind in kinds}):
            unchanged = swin(inputs)
        with caching(swin, [block_site(SHIFTED, "hook_resid_pre")]) as cache:
            swin(inputs)
        resumed = family.run_from(SHIFTED, cache[block_site(SHIFTED, "hook_resid_pre")])
    assert float((by_hook - clean).abs().max()) > 1e-3  # the head mattered
    torch.testing.assert_close(by_hook, by_edit, rtol=0, atol=1e-5)
    torch.testing.assert_close(unchanged, clean, rtol=0, atol=0)
    torch.testing.assert_close(resumed, clean, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_attend_shows_the_query_on_its_blocks_stage_grid(cli, workdir, newfoundland):
    import timm

    from vitcli.loading import load_model
    from vitcli.spec import WeightsSpec

    result = cli("attend", newfoundland, "--model", SWIN, *RANDOM_CPU, "--block", "3", "--head", "1", "--query", "74")
    assert result.exit_code == 0, result.stderr
    assert "block 3 (stage 2, 28x28 grid), head 1" in result.stdout
    body = json.loads(result_files(workdir / "outputs", "attention-b3-h1-q74")["json"].read_text())["result"]
    assert body["stage"] == 2 and (body["grid"]["rows"], body["grid"]["cols"], body["grid"]["patch_size"]) == (
        28,
        28,
        8,
    )
    assert body["query"] == {"token": 73, "name": "P74", "patch": 74, "row": 2, "col": 17}
    (shown,) = body["maps"]
    assert shown["cls_attention"] is None
    # The oracle: timm's window probabilities of the window holding P74 (rows 0-6, cols 14-20 of block 3's grid).
    model = load_model(WeightsSpec(SWIN, random=True, seed=0), "cpu")
    inputs = model.prepare(newfoundland).input[None]
    net = model.net
    assert isinstance(net, timm.models.swin_transformer.SwinTransformer)
    windows = timm_window_probabilities(net, net.layers[1].blocks[0], inputs)
    tokens = window_tokens(28, 28, 7, 0)
    window, position = (tokens == 73).nonzero()[0].tolist()
    expected = torch.zeros(28 * 28)
    expected[tokens[window]] = windows[window, 0, position]
    torch.testing.assert_close(torch.tensor(shown["attention"]), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--view", "rollout"], GRIDS),
        (["--view", "all-blocks", "--head", "1", "--query", "5"], GRIDS),
        (["--view", "summary", "--query", "5"], GRIDS),
        (["--block", "3", "--head", "1", "--query", "785"], "patches are P1..P784"),
        (["--block", "11", "--head", "25", "--query", "5"], "between 1 and 24"),
        (["--block", "3", "--head", "1"], "this model has no class token"),
    ],
)
def test_attend_refuses_what_swin_cannot_show_before_loading(cli, newfoundland, monkeypatch, arguments, message):
    import vitcli.loading

    monkeypatch.setattr(vitcli.loading, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))
    result = cli("attend", newfoundland, "--model", SWIN, *RANDOM_CPU, *arguments)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert message in result.stderr


# ----- explain and occlusion on the last stage's grid


@pytest.fixture(scope="module")
def swin_model():
    from vitcli.loading import load_model
    from vitcli.spec import WeightsSpec

    return load_model(WeightsSpec(SWIN, random=True, seed=0), "cpu")


@pytest.mark.slow
def test_gradcam_equals_pytorch_grad_cam_with_its_swin_recipe(swin_model, photo):
    """pytorch-grad-cam's documented Swin recipe: target layer layers[-1].blocks[-1].norm2, reshape_transform to
    (B, C, 7, 7); its raw map (before min-max scaling) against vitcli's, within 1e-5 of the largest value."""
    grad_cam = pytest.importorskip("pytorch_grad_cam")
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    from vitcli.experiments.explain import explain

    def reshape_transform(tensor, height=7, width=7):
        result = tensor.reshape(tensor.size(0), height, width, tensor.size(2))
        return result.transpose(2, 3).transpose(1, 2)

    prepared = swin_model.prepare(photo)
    result = explain(swin_model, prepared, ["gradcam"])
    assert result.block == 12 and (result.grid.rows, result.grid.cols, result.grid.patch_size) == (7, 7, 32)
    assert "layers[3].blocks[1].norm2" in result.maps[0].definition
    net = swin_model.net
    layer = net.layers[-1].blocks[-1].norm2
    targets = [ClassifierOutputTarget(result.target.index)]
    image = prepared.input[None]
    try:
        with grad_cam.GradCAM(model=net, target_layers=[layer], reshape_transform=reshape_transform) as cam:
            cam(input_tensor=image, targets=targets)
            stored = cam.activations_and_grads
            activations, gradients = stored.activations[0].numpy(), stored.gradients[0].numpy()
            raw = cam.get_cam_image(image, layer, targets, activations, gradients)
    finally:
        net.zero_grad(set_to_none=True)
    raw = np.maximum(raw, 0)[0]
    ours = result.maps[0].values
    assert ours.shape == raw.shape == (7, 7) and ours.max() > 0
    assert np.abs(ours - raw).max() <= 1e-5 * np.abs(raw).max()


@pytest.mark.slow
def test_occlusion_covers_the_last_stages_tokens_through_the_models_own_forward(swin_model, photo):
    from vitcli.experiments.covers import SlidingWindows
    from vitcli.experiments.occlusion import fill_image, occlude_patches

    prepared = swin_model.prepare(photo)
    grid = swin_model.map_grid
    windows = SlidingWindows(grid, 32, 32)
    covers = list(windows)
    result = occlude_patches(swin_model, prepared, windows, None, "gray")
    assert len(covers) == 49 and result.drop_grid.shape == (7, 7)
    # Oracle: the net's own forward on the image with cover P25 (row 3, col 3: pixels 96..128) painted by hand.
    fill = fill_image(swin_model, prepared, "gray")
    covered = prepared.input.clone()
    covered[:, 96:128, 96:128] = fill[:, 96:128, 96:128]
    with torch.no_grad():
        probability = swin_model.net(covered[None]).softmax(-1)[0, result.base.target.index]
    (outcome,) = [outcome for outcome in result.outcomes if outcome.cover.name == "P25"]
    assert abs(outcome.target_probability - float(probability)) <= 1e-6


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["-M", "rollout"], GRIDS),
        (["-M", "relevance"], GRIDS),
        (["-M", "attention"], "lacks: no class token"),
        (
            ["-M", "gradcam", "--block", "10"],
            "reads a block of the last stage, whose 7x7 grid every map is drawn on: 11..12",
        ),
    ],
)
def test_explain_refuses_what_swin_cannot_explain_before_loading(cli, newfoundland, monkeypatch, arguments, message):
    import vitcli.loading

    monkeypatch.setattr(vitcli.loading, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))
    result = cli("explain", newfoundland, "--model", SWIN, *RANDOM_CPU, *arguments)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert message in result.stderr


@pytest.mark.parametrize(
    "arguments",
    [
        ["patches"],
        ["trace"],
        ["lens"],
        ["attribute", "--by", "head"],  # by block it runs: the last stage's split (tests/test_pairs_swin.py)
        ["anatomy", "--view", "norms"],
        ["patch", "{image}"],
    ],
)
def test_commands_written_for_one_grid_refuse_swin_before_loading(cli, newfoundland, persian, monkeypatch, arguments):
    import vitcli.loading

    monkeypatch.setattr(vitcli.loading, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))
    command, *rest = [str(persian) if argument == "{image}" else argument for argument in arguments]
    result = cli(command, newfoundland, *rest, "--model", SWIN, *RANDOM_CPU)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert f"needs what {SWIN} (timm SwinTransformer) lacks: " in result.stderr
    assert GRIDS in result.stderr


def test_describe_gives_swins_stages_before_any_weights_load():
    from vitcli.grid import PatchGrid
    from vitcli.loading import describe
    from vitcli.spec import WeightsSpec

    architecture = describe(WeightsSpec(SWIN, random=True))
    assert (architecture.depth, architecture.num_heads, architecture.embed_dim) == (12, 3, 96)
    assert (architecture.num_classes, architecture.global_pool, architecture.mlp_hidden) == (1000, "avg", 384)
    assert architecture.family == "timm SwinTransformer" and architecture.staged
    assert architecture.grid == PatchGrid(224, 224, 4, ())
    assert architecture.map_grid == PatchGrid(224, 224, 32, ()) == architecture.place(12).grid
    assert architecture.place(3).grid == PatchGrid(224, 224, 8, ()) and architecture.place(3).heads == 6


@pytest.mark.slow
def test_attend_prints_nothing_when_the_captured_pattern_does_not_give_the_heads_outputs(
    swin_model, photo, monkeypatch
):
    from vitcli.capture.families import timm_swin
    from vitcli.errors import VitcliError
    from vitcli.experiments import attention

    grid = swin_model.family.places()[SHIFTED - 1].grid
    query = attention.parse_query(grid, "74")
    prepared = [swin_model.prepare(photo)]
    (shown,) = attention.attend(swin_model, prepared, query, [SHIFTED], [1])
    assert shown.stage == 2 and max(shown.self_check.values()) <= 1e-6
    right = timm_swin.WindowLayout.pattern
    # Rows moved one key along: still probabilities summing to 1, but no longer the ones the module used.
    monkeypatch.setattr(timm_swin.WindowLayout, "pattern", lambda self, windowed: right(self, windowed).roll(1, -1))
    with pytest.raises(
        VitcliError, match="self-check failed in block 4: the captured attention differs from the heads. outputs"
    ):
        attention.attend(swin_model, prepared, query, [SHIFTED], [1])
