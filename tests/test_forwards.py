"""The forwards for many copies of one image, each held to the model's own forward:

- rows_logits: the last block computes row 0 alone when the head reads nothing else;
- covers applied to block 1's input rows instead of the pixels, when each cover is exactly one patch;
- stream: batches spread over the CPU's threads, one thread each, in order and bounded.
"""

from __future__ import annotations

import threading

import pytest
import torch

from vitcli.experiments.covers import SlidingWindows
from vitcli.experiments.occlusion import baseline, covered_batches, covered_copy, covered_row_batches, measure_covers
from vitcli.model import VitModel

from conftest import small_vit

# float32 sums in another order (one row instead of 197, another batch size): far below this in logits.
LOGIT_TOLERANCE = 1e-5
ROW_TOLERANCE = 1e-6
PROBABILITY_TOLERANCE = 1e-6

PRUNED = {
    "tiny": {},
    "registers": {"reg_tokens": 4},
    "no_embed_class": {"no_embed_class": True},
    "qknorm_layerscale": {"qk_norm": True, "init_values": 1e-3},
    "no_qkv_bias": {"qkv_bias": False},
    "patch8_64": {"patch_size": 8, "img_size": 64},
}
FULL = {  # heads that read more than row 0: the last block runs whole
    "avg_pool": ("vit_tiny_patch16_224", {"global_pool": "avg"}),
    "map_pool": ("vit_tiny_patch16_224", {"global_pool": "map"}),
    "distilled": ("deit_tiny_distilled_patch16_224", {}),
}


def tiny(**kwargs) -> VitModel:
    return small_vit("vit_tiny_patch16_224", seed=3, depth=2, **kwargs)


def random_batch(model: VitModel, batch: int = 3) -> torch.Tensor:
    generator = torch.Generator().manual_seed(11)
    height, width = model.data_config["input_size"][1:]
    return torch.randn(batch, 3, height, width, generator=generator)


def own_logits(model: VitModel, inputs: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model.net(inputs)


def rows_of_last_mlp(model: VitModel, inputs: torch.Tensor) -> tuple[torch.Tensor, int]:
    """image_logits, and how many rows the last block's MLP was given (a forward hook counts them)."""
    seen = []
    handle = model.net.blocks[-1].mlp.register_forward_hook(lambda _m, args, _out: seen.append(args[0].shape[1]))
    try:
        with torch.inference_mode():
            logits = model.image_logits(inputs)
    finally:
        handle.remove()
    return logits, seen[0]


@pytest.mark.parametrize("variant", PRUNED.values(), ids=PRUNED.keys())
def test_last_block_computes_row_0_alone_and_the_logits_are_the_models_own(variant):
    model = tiny(**variant)
    inputs = random_batch(model)
    logits, rows = rows_of_last_mlp(model, inputs)
    assert rows == 1
    assert (logits - own_logits(model, inputs)).abs().max() < LOGIT_TOLERANCE


@pytest.mark.parametrize("name, variant", FULL.values(), ids=FULL.keys())
def test_heads_reading_more_rows_run_the_whole_last_block(name, variant):
    model = small_vit(name, seed=3, depth=2, **variant)
    inputs = random_batch(model)
    logits, rows = rows_of_last_mlp(model, inputs)
    assert rows == model.grid.num_tokens
    assert (logits - own_logits(model, inputs)).abs().max() < LOGIT_TOLERANCE


def test_default_architecture_rows_logits_equal_its_own_forward(vit, newfoundland):
    inputs = vit.prepare(newfoundland).input[None]
    logits, rows = rows_of_last_mlp(vit, inputs)
    assert rows == 1
    assert (logits - own_logits(vit, inputs)).abs().max() < LOGIT_TOLERANCE


@pytest.mark.parametrize("variant", [{}, {"reg_tokens": 4}, {"no_embed_class": True}], ids=["tiny", "reg", "noembed"])
def test_a_covered_patch_changes_exactly_its_own_row(variant):
    """The rows built from the clean and fill rows equal the embedding of the covered pixels; with 4 registers
    patch Pn is row n + 4."""
    model = tiny(**variant)
    assert model.embeds_patches_alone
    image, fill = random_batch(model, 2)
    covers = list(SlidingWindows(model.grid, model.grid.patch_size, model.grid.patch_size))
    with torch.inference_mode():
        clean_rows, fill_rows = model.embed(torch.stack([image, fill])).split(1)
        built = torch.cat(list(covered_row_batches(clean_rows, fill_rows, covers, model.grid, 8)))
        embedded = torch.cat([model.embed(batch) for batch in covered_batches(image, fill, covers, 8)])
    assert (built - embedded).abs().max() < ROW_TOLERANCE
    changed = (built != clean_rows).any(dim=-1)
    assert changed.sum(dim=1).tolist() == [1] * len(covers)
    assert changed.float().argmax(dim=1).tolist() == [model.grid.token_of_patch(cover.patch) for cover in covers]


@pytest.mark.parametrize(
    "name, variant",
    [("vit_tiny_patch16_224", {"reg_tokens": 4}), ("vit_tiny_r_s16_p8_224", {})],
    ids=["registers_rows", "hybrid_stem_pixels"],
)
def test_patch_covers_equal_the_models_own_forward_of_each_covered_copy(name, variant):
    """Covers on the rows (registers: token n + 4) and, for a convolutional stem whose rows mix neighbouring
    patches, covers on the pixels: both equal the network's own forward of each hand-covered copy."""
    model = small_vit(name, seed=3, depth=2, **variant)
    assert model.embeds_patches_alone == (name == "vit_tiny_patch16_224")
    image, fill = random_batch(model, 2)
    size = model.grid.patch_size
    covers = list(SlidingWindows(model.grid, size, size))[::7]
    prepared = type("Prepared", (), {"input": image, "source": None})()
    base = baseline(model, prepared, None, "gray")
    outcomes = measure_covers(model, image, fill, covers, base)
    copies = torch.stack([covered_copy(image, fill, cover) for cover in covers])
    reference = own_logits(model, copies).softmax(dim=-1)[:, base.target.index]
    ours = torch.tensor([outcome.target_probability for outcome in outcomes])
    assert (ours - reference).abs().max() < PROBABILITY_TOLERANCE


def test_a_normalized_zero_patch_row_is_the_patch_bias_plus_its_position():
    """Gray (the default fill) is normalized 0: its rows are b_E plus the position embedding, as the lecture says."""
    model = tiny()
    height, width = model.data_config["input_size"][1:]
    with torch.inference_mode():
        rows = model.embed(torch.zeros(1, 3, height, width))[0]
        expected = model.patch_projection[1] + model.net.pos_embed[0, 1:]
    assert (rows[1:] - expected).abs().max() < ROW_TOLERANCE


# ----- stream


@pytest.fixture(params=[2])
def two_threads(request):
    threads = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(threads)


def test_stream_returns_each_batch_in_order_equal_to_one_batch_at_a_time(two_threads):
    model = tiny()
    batches = list(random_batch(model, 10).split(3))
    streamed = list(model.stream(model.image_logits, batches))
    with torch.inference_mode():
        alone = [model.image_logits(batch) for batch in batches]
    assert [len(logits) for logits in streamed] == [3, 3, 3, 1]
    assert all((ours - theirs).abs().max() < LOGIT_TOLERANCE for ours, theirs in zip(streamed, alone, strict=True))
    assert torch.get_num_threads() == two_threads


@pytest.mark.parametrize("two_threads", [2, 4], indirect=True, ids=["2threads", "4threads"])
def test_stream_runs_two_batches_with_half_the_threads_each_without_gradients_and_looks_ahead_two(two_threads):
    model = tiny()
    seen = []
    taken = 0

    def forward(batch: torch.Tensor) -> torch.Tensor:
        seen.append((threading.current_thread().name, torch.get_num_threads(), torch.is_inference_mode_enabled()))
        return batch.sum(dim=(1, 2, 3))[:, None]

    def batches():
        nonlocal taken
        for index in range(6):
            taken += 1
            yield torch.full((1, 1, 1, 1), float(index))

    results = []
    for result in model.stream(forward, batches()):
        results.append(float(result))
        assert taken <= len(results) + 2, "at most two batches beyond the one returned"
    assert results == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert {(name[:14], threads, inference) for name, threads, inference in seen} == {
        ("vitcli-forward", two_threads // 2, True)
    }
    assert torch.get_num_threads() == two_threads


def test_stream_passes_a_failure_on_and_restores_the_thread_count(two_threads):
    model = tiny()

    def forward(batch: torch.Tensor) -> torch.Tensor:
        if float(batch.sum()) == 2.0:
            raise RuntimeError("batch 2 failed")
        return batch.flatten(1)

    with pytest.raises(RuntimeError, match="batch 2 failed"):
        list(model.stream(forward, (torch.full((1, 1), float(index)) for index in range(5))))
    assert torch.get_num_threads() == two_threads


def test_a_lone_batch_keeps_every_thread_and_logits_give_each_stream_a_share(two_threads, vit, newfoundland):
    seen = []

    def forward(batch: torch.Tensor) -> torch.Tensor:
        seen.append((threading.current_thread() is threading.main_thread(), torch.get_num_threads()))
        return batch.flatten(1)

    list(vit.stream(forward, [torch.zeros(8, 1)]))
    assert seen == [(True, two_threads)]

    sizes = []
    handle = vit.net.register_forward_pre_hook(lambda _module, args: sizes.append(len(args[0])))
    try:
        image = vit.prepare(newfoundland).input
        logits = vit.logits(image.expand(8, *image.shape))
    finally:
        handle.remove()
    assert sizes == [4, 4]
    assert (logits - own_logits(vit, image[None])).abs().max() < LOGIT_TOLERANCE
