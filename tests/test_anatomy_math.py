"""The computations of `vitcli anatomy`, held to constructed inputs, direct numpy formulas and independent readings.

Models are small random-weight timm ViTs (64x64 pixels: a 4x4 grid of 16-pixel patches) so every test is fast.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import timm
import torch

from vitcli.capture import caching
from vitcli.experiments import anatomy_math as am
from vitcli.experiments.anatomy_accumulators import CkaAccumulator
from vitcli.experiments.anatomy_images import measure, read_batch
from vitcli.experiments.anatomy_weights import filters, positions
from vitcli.experiments.attention import attend, parse_query
from vitcli.grid import PatchGrid
from vitcli.images import ImageSource
from vitcli.model import PreparedImage, VitModel
from vitcli.spec import WeightsSpec


def small_model(name: str = "vit_tiny_patch16_224", seed: int = 0, **kwargs) -> VitModel:
    torch.manual_seed(seed)
    kwargs = {"depth": 2, "img_size": 64, **kwargs}
    return VitModel(
        timm.create_model(name, pretrained=False, **kwargs), WeightsSpec(random=True), torch.device("cpu"), 4
    )


def random_images(model: VitModel, count: int, seed: int = 1) -> list[PreparedImage]:
    """Inputs sharing a common pattern plus noise, so that blocks' representations are related but not equal."""
    generator = torch.Generator().manual_seed(seed)
    height, width = model.grid.image_height, model.grid.image_width
    common = torch.randn(3, height, width, generator=generator)
    return [
        PreparedImage(
            ImageSource(Path(f"image{index}.png"), f"{index:064x}", (width, height), "RGB"),
            torch.rand(3, height, width, generator=generator),
            common + torch.randn(3, height, width, generator=generator),
        )
        for index in range(count)
    ]


# ----- distance


def test_identity_attention_has_distance_zero():
    grid = PatchGrid(64, 64, 16)
    attention = np.eye(grid.num_tokens)[None, None]
    assert am.attention_distance(attention, grid) == pytest.approx(np.zeros((1, 1)), abs=1e-12)


def test_uniform_attention_over_patches_has_the_grids_mean_pairwise_distance():
    grid = PatchGrid(48, 64, 16, ("CLS", "REG1"))  # 3x4 grid, two prefix tokens
    attention = np.zeros((grid.num_tokens, grid.num_tokens))
    attention[:, grid.num_prefix :] = 1 / grid.num_patches
    cells = list(itertools.product(range(grid.rows), range(grid.cols)))
    pairs = [16 * math.dist(a, b) for a in cells for b in cells]
    assert am.attention_distance(attention, grid) == pytest.approx(sum(pairs) / len(pairs), rel=1e-12)


def test_attention_to_prefix_tokens_counts_as_distance_zero_not_renormalized():
    grid = PatchGrid(64, 64, 16)
    patches_only = np.zeros((grid.num_tokens, grid.num_tokens))
    patches_only[:, 1:] = 1 / grid.num_patches
    half_to_cls = patches_only / 2
    half_to_cls[:, 0] = 0.5
    assert am.attention_distance(half_to_cls, grid) == pytest.approx(am.attention_distance(patches_only, grid) / 2)


def test_distance_equals_an_independent_computation_from_attends_rows():
    model = small_model()
    images = random_images(model, 2)
    result = measure(model, images, ["distance"]).distance
    grid, blocks, heads = model.grid, [1, 2], list(range(1, model.num_heads + 1))
    expected = np.zeros((len(images), len(blocks), len(heads)))
    for patch in range(1, grid.num_patches + 1):
        left, top, _, _ = grid.pixel_box(patch)
        rows = attend(model, images, parse_query(grid, f"P{patch}"), blocks, heads)
        for image, shown in enumerate(rows):
            for row in shown.maps:
                total = 0.0
                for source in range(1, grid.num_patches + 1):
                    source_left, source_top, _, _ = grid.pixel_box(source)
                    weight = float(row.attention[grid.token_of_patch(source)])
                    total += weight * math.hypot(left - source_left, top - source_top)
                expected[image, row.block - 1, row.head - 1] += total / grid.num_patches
    assert result.per_image == pytest.approx(expected, rel=1e-5)
    assert result.mean == pytest.approx(expected.mean(axis=0), rel=1e-5)
    assert not result.renormalized and result.weights == model.spec.label


# ----- positions


def mae_sincos(width: int, size: int) -> np.ndarray:
    """MAE's fixed 2D sine-cosine position embedding (He et al. 2022, get_2d_sincos_pos_embed), class token 0."""

    def one_axis(dims: int, positions: np.ndarray) -> np.ndarray:
        omega = 1.0 / 10000 ** (np.arange(dims // 2) / (dims / 2))
        angles = np.outer(positions.reshape(-1), omega)
        return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)

    cols, rows = np.meshgrid(np.arange(size, dtype=float), np.arange(size, dtype=float))
    table = np.concatenate([one_axis(width // 2, cols), one_axis(width // 2, rows)], axis=1)
    return np.concatenate([np.zeros((1, width)), table])


def test_positions_on_maes_sincos_fall_with_grid_distance_along_rows_and_columns():
    model = small_model("vit_small_patch16_224", depth=1, img_size=224)  # 14x14, width 384
    with torch.no_grad():
        model.net.pos_embed.copy_(torch.tensor(mae_sincos(384, 14))[None])
    model.net.pos_embed.requires_grad_(False)
    result = positions(model)
    grid = model.grid
    assert result.reason is None and result.fixed
    assert np.diag(result.similarity) == pytest.approx(np.ones(grid.num_patches))
    for patch in range(1, grid.num_patches + 1):
        similarity = result.patch_map(patch)
        row, col = grid.position(patch)
        for line, at in ((similarity[row], col), (similarity[:, col], row)):
            assert np.all(np.diff(line[at:]) < 0) and np.all(np.diff(line[: at + 1]) > 0)


def test_positions_equal_a_direct_cosine_of_pos_embed(vit):
    table = vit.net.pos_embed[0, 1:].detach()
    direct = torch.nn.functional.cosine_similarity(table[:, None], table[None, :], dim=-1)
    assert positions(vit).similarity == pytest.approx(direct.double().numpy(), abs=1e-6)


def test_positions_leave_out_registers_and_refuse_models_without_absolute_embeddings():
    dinov2 = small_model("vit_small_patch14_reg4_dinov2", depth=1, img_size=56)
    table = dinov2.net.pos_embed[0, -16:].detach().double()
    direct = torch.nn.functional.cosine_similarity(table[:, None], table[None, :], dim=-1)
    assert positions(dinov2).similarity == pytest.approx(direct.numpy(), abs=1e-9)
    result = positions(small_model(pos_embed="none"))
    assert result.similarity is None and "no learned absolute position embeddings" in result.reason
    assert "\n" not in result.reason


# ----- filters


def test_filters_are_numpys_svd_of_the_centred_kernel_up_to_sign(vit):
    kernel = vit.net.patch_embed.proj.weight.detach().double().numpy()  # (D, 3, p, p): one filter per row
    samples = kernel.reshape(len(kernel), -1)
    _, singular, right = np.linalg.svd(samples - samples.mean(axis=0), full_matrices=False)
    result = filters(vit)
    assert result.components.shape == (28, 3, 16, 16) and result.filters == 192
    for index, component in enumerate(result.components.reshape(28, -1)):
        sign = np.sign(component @ right[index])
        assert component == pytest.approx(sign * right[index], abs=1e-8)
    assert result.explained_variance_ratio == pytest.approx(singular[:28] ** 2 / (singular**2).sum())
    assert result.explained_variance_ratio.sum() <= 1 + 1e-12
    assert np.all(np.diff(result.explained_variance_ratio) <= 0)


# ----- CKA


def direct_linear_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Kornblith et al.'s formula in feature space: ||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F), centred columns."""
    x, y = x - x.mean(axis=0), y - y.mean(axis=0)
    return np.linalg.norm(y.T @ x) ** 2 / (np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y))


def direct_unbiased_hsic(k: np.ndarray, l: np.ndarray) -> float:  # noqa: E741
    """Song et al. 2012's unbiased HSIC written as the paper's sum over distinct index tuples (n^4 terms)."""
    n = len(k)
    k, l = k.copy(), l.copy()  # noqa: E741
    np.fill_diagonal(k, 0)
    np.fill_diagonal(l, 0)
    ones = np.ones(n)
    trace = np.trace(k @ l)
    return (trace + (ones @ k @ ones) * (ones @ l @ ones) / ((n - 1) * (n - 2)) - 2 / (n - 2) * ones @ k @ l @ ones) / (
        n * (n - 3)
    )


@pytest.fixture
def features():
    generator = np.random.default_rng(0)
    x = generator.normal(size=(40, 12))
    return x, x @ generator.normal(size=(12, 7)) + generator.normal(size=(40, 7))


def test_cka_is_1_on_itself_under_rotation_and_under_scaling_with_shift(features):
    x, _ = features
    rotation, _ = np.linalg.qr(np.random.default_rng(1).normal(size=(12, 12)))
    for cka in (am.linear_cka, am.unbiased_linear_cka):
        assert cka(x, x) == pytest.approx(1)
        assert cka(x, x @ rotation) == pytest.approx(1)
        assert cka(x, -2.5 * x + 3.0) == pytest.approx(1)


def test_cka_equals_the_direct_formulas(features):
    x, y = features
    assert am.linear_cka(x, y) == pytest.approx(direct_linear_cka(x, y), rel=1e-10)
    assert am.linear_cka(x, y) < 0.99
    k, l = x @ x.T, y @ y.T  # noqa: E741
    assert am.unbiased_hsic(k, l) == pytest.approx(direct_unbiased_hsic(k, l), rel=1e-10)
    expected = direct_unbiased_hsic(k, l) / math.sqrt(direct_unbiased_hsic(k, k) * direct_unbiased_hsic(l, l))
    assert am.unbiased_linear_cka(x, y) == pytest.approx(expected, rel=1e-10)


def test_minibatch_cka_of_one_minibatch_is_the_full_unbiased_estimator(features):
    x, y = features
    minibatch = am.MinibatchCka(2)
    minibatch.add([am.gram(x), am.gram(y)])
    assert minibatch.matrix()[0, 1] == pytest.approx(am.unbiased_linear_cka(x, y), rel=1e-12)


def test_minibatch_cka_over_a_folder_matches_the_full_unbiased_estimator_within_1e_3():
    """64 images in minibatches of 32 (measured difference 4e-4) against unbiased CKA over all 64 at once, read
    independently with the model's own forward. The biased full estimator differs by about 0.016 at this size."""
    model = small_model(depth=3)
    images = random_images(model, 64)
    result = measure(model, images, ["cka"], cka_minibatch=32).cka
    sites = [f"blocks.{block}.hook_resid_post" for block in (1, 2, 3)]
    with torch.inference_mode(), caching(model.net, sites) as cache:
        model.net.forward_features(torch.stack([image.input for image in images]))
        rows = [cache[site].double().numpy() for site in sites]
    full = np.array([[am.unbiased_linear_cka(a, b) for b in rows] for a in rows])
    assert result.matrix == pytest.approx(full, abs=1e-3)
    assert (result.used, result.minibatches) == (64, 2)


def test_cka_leaves_out_a_last_minibatch_too_small_for_unbiased_hsic():
    model = small_model()
    result = measure(model, random_images(model, 11), ["cka"], cka_minibatch=4).cka
    assert (result.images, result.used, result.minibatches) == (11, 8, 2)
    with pytest.raises(ValueError, match="at least 4 images"):
        measure(model, random_images(model, 3), ["cka"])


def test_cka_keeps_at_most_one_minibatch_of_rows_whatever_the_folder():
    model = small_model()
    accumulator = CkaAccumulator(model.depth, 8)
    for batch in range(10):
        reading = read_batch(model, torch.stack([image.input for image in random_images(model, 3, seed=batch)]), False)
        accumulator.add(reading)
        assert accumulator.filled < 8 and accumulator.rows.shape[1] == 8  # one minibatch buffer, never more
    assert accumulator.estimator.hsic_sums.shape == (2, 2)
    assert accumulator.finish().used == 24 + 6


# ----- norms


def scale_row(block, token: int, factor: float):
    """Hooks that multiply one token's row leaving `block` by `factor`, in the model's own forward and in
    VitModel.trace alike (both call norm2 on the rows after attention, then drop_path2 on the MLP's share)."""
    after_attention = {}

    def keep(_module, inputs):
        after_attention["rows"] = inputs[0]

    def scale(_module, _inputs, output):
        output = output.clone()
        output[:, token] += (factor - 1) * (after_attention["rows"][:, token] + output[:, token])
        return output

    return [block.norm2.register_forward_pre_hook(keep), block.drop_path2.register_forward_hook(scale)]


def test_a_token_scaled_by_10_is_listed_and_no_other():
    model = small_model(depth=3)
    images = random_images(model, 2)
    assert measure(model, images, ["norms"]).norms.outliers == []
    handles = scale_row(model.net.blocks[1], token=7, factor=10)
    try:
        result = measure(model, images, ["norms"]).norms
    finally:
        for handle in handles:
            handle.remove()
    assert {(outlier.token, outlier.name) for outlier in result.outliers} == {(7, "P7")}
    assert {(outlier.image, outlier.block) for outlier in result.outliers} >= {(0, 2), (1, 2)}
    trace = model.trace(torch.stack([image.input for image in images]), keep=[1])
    for outlier in result.outliers:
        if outlier.block == 2:
            expected = trace.blocks[1].attention[outlier.image, :, 0, 7].double().mean()
            assert outlier.cls_attention == pytest.approx(float(expected), rel=1e-5)
            assert outlier.norm > 3 * outlier.median


# ----- PCA


def test_pca_components_are_numpys_svd_and_the_mask_thresholds_the_first():
    model = small_model()
    images = random_images(model, 5)
    result = measure(model, images, ["pca"], pca_threshold=0.6).pca
    with torch.inference_mode():
        rows = model.net.forward_features(torch.stack([image.input for image in images]))[:, 1:].double().numpy()
    samples = rows.reshape(-1, rows.shape[-1])
    _, singular, right = np.linalg.svd(samples - samples.mean(axis=0), full_matrices=False)
    for index in range(3):
        sign = np.sign(result.components[index] @ right[index])
        assert result.components[index] == pytest.approx(sign * right[index], abs=1e-6)
    assert result.explained_variance_ratio == pytest.approx(singular[:3] ** 2 / (singular**2).sum(), rel=1e-6)
    assert result.rgb.shape == (5, 4, 4, 3)
    assert result.rgb.reshape(-1, 3).min(axis=0) == pytest.approx(np.zeros(3))
    assert result.rgb.reshape(-1, 3).max(axis=0) == pytest.approx(np.ones(3))
    assert np.array_equal(result.mask, result.rgb[..., 0] > 0.6)
    assert 0 < result.mask.sum() < result.mask.size
    higher = measure(model, images, ["pca"], pca_threshold=0.8).pca.mask
    assert np.all(higher <= result.mask)


# ----- every family vitcli loads


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("vit_small_patch14_reg4_dinov2", {"img_size": 56}),
        ("deit_tiny_distilled_patch16_224", {}),
        ("vit_base_patch16_clip_224", {"embed_dim": 96, "num_heads": 2}),
    ],
)
def test_every_view_runs_on_prefix_tokens_of_other_families(name, kwargs):
    model = small_model(name, **kwargs)
    images = random_images(model, 4)
    result = measure(model, images, ["distance", "cka", "pca", "norms"], cka_minibatch=4)
    grid = model.grid
    assert result.distance.mean.shape == (2, model.num_heads)
    assert result.cka.matrix.shape == (2, 2) and np.diag(result.cka.matrix) == pytest.approx(np.ones(2))
    assert result.pca.rgb.shape == (4, grid.rows, grid.cols, 3)
    assert result.norms.norms.shape == (4, 2, grid.num_tokens)
    assert result.norms.token_names[: grid.num_prefix] == list(grid.prefix_names)
    assert filters(model).components.shape[1:] == (3, grid.patch_size, grid.patch_size)
