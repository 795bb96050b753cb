"""`vitcli heads` (TextSpan over an image-text model's heads): the direct contributions' identity, the command's
files, its text-embedding cache and its refusals. The algorithm itself: test_textspan.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from vitcli.hashing import file_sha256

from conftest import RANDOM_CPU, result_files

open_clip = pytest.importorskip("open_clip")

from tiny_open_clip import TINY_CLIP, TINY_SIGMOID, register  # noqa: E402

CLIP = ["--model", f"open_clip:{TINY_CLIP}"]
BANK = [
    "a dog",
    "a cat",
    "a red car",
    "the sea at night",
    "a bowl of [bold]soup[/bold]",
    "stripes",
    "<i>kites</i> & co",
]


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """Eight small images that differ (noise with a coloured block in a different place each)."""
    folder = tmp_path_factory.mktemp("heads-images")
    generator = np.random.default_rng(0)
    for number in range(8):
        pixels = generator.integers(0, 256, size=(64, 64, 3), dtype=np.uint8)
        pixels[5 * number : 5 * number + 24, 10:40] = generator.integers(0, 256, 3)
        Image.fromarray(pixels).save(folder / f"image{number}.png")
    return folder


@pytest.fixture
def bank(workdir):
    path = workdir / "bank.txt"
    path.write_text("\n".join(BANK) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def no_model_load(monkeypatch):
    import vitcli.loading

    monkeypatch.setattr(vitcli.loading, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ([*CLIP], "heads needs a text bank: --texts FILE"),
        ([*CLIP, "--texts", "blank.txt"], "--texts blank.txt holds no text: write one text per line"),
        ([*CLIP, "--texts", "missing.txt"], "--texts missing.txt: no such file"),
        ([*CLIP, "--texts", "bank.txt", "--k", "0"], "--k must be at least 1, not 0"),
        ([*CLIP, "--texts", "bank.txt", "--blocks", "0"], "--blocks must be at least 1, not 0"),
        ([*CLIP, "--texts", "bank.txt", "--blocks", "3"], f"--blocks 3: open_clip:{TINY_CLIP} has 2 blocks"),
        (["--texts", "bank.txt"], "`heads` needs what vit_tiny_patch16_224.augreg_in21k_ft_in1k (timm "),
        (["--texts", "bank.txt"], "lacks: no text tower (open_clip models (--model open_clip:NAME"),
    ],
)
def test_usage_errors_exit_2_before_the_model_loads(cli, images, bank, no_model_load, options, message):
    register()
    (bank.parent / "blank.txt").write_text("\n  \n\n", encoding="utf-8")
    result = cli("heads", images, *options, *RANDOM_CPU)
    assert result.exit_code == 2, result.stderr
    assert message in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_one_image_is_refused_before_loading(cli, images, bank, no_model_load):
    register()
    result = cli("heads", images / "image0.png", *CLIP, "--texts", bank, *RANDOM_CPU)
    assert result.exit_code == 2
    assert "heads describes what varies over the images: give at least 2 (dozens or more), not 1" in result.stderr


@pytest.fixture(scope="module")
def clip_pair():
    """vitcli's tiny CLIP and open_clip's own model with the same random weights (seed 3)."""
    import torch

    from vitcli.loading import load_model
    from vitcli.spec import WeightsSpec

    register()
    model = load_model(WeightsSpec(model_name=f"open_clip:{TINY_CLIP}", random=True, seed=3), "cpu")
    torch.manual_seed(3)
    return model, open_clip.create_model(TINY_CLIP, pretrained=None).eval()


@pytest.mark.parametrize("first_block", [1, 2])
def test_every_components_direct_contribution_adds_up_to_open_clips_image_embedding(clip_pair, first_block):
    import torch

    from vitcli.experiments.heads import embedding_parts

    model, reference = clip_pair
    inputs = torch.randn(3, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = reference.encode_image(inputs).double()
    parts = embedding_parts(model, inputs, first_block)
    for image, found in enumerate(parts):
        assert found.heads.shape == (3 - first_block, 2, expected.shape[-1])
        torch.testing.assert_close(found.rebuilt(), expected[image], atol=1e-4, rtol=0)
        assert float(found.heads.abs().sum()) > 0


def test_heads_writes_a_table_per_head_json_csv_and_figure_as_textspan_of_the_contributions(cli, images, bank, workdir):
    import torch

    from vitcli.experiments.heads import embedding_parts
    from vitcli.experiments.textspan import text_span
    from vitcli.loading import load_model
    from vitcli.spec import WeightsSpec

    register()
    result = cli("heads", images, *CLIP, "--texts", bank, "--k", "7", *RANDOM_CPU)
    assert result.exit_code == 0, result.stderr
    files = result_files(workdir / "outputs", "heads-b2-k7-t" + file_sha256(bank)[:10])
    assert {"json", "csv", "png"} <= set(files)
    document = json.loads(files["json"].read_text(encoding="utf-8"))["result"]
    assert document["texts"] == {
        "path": str(bank), "sha256": file_sha256(bank), "count": len(BANK), "embeddings": "computed",
    }  # fmt: skip
    assert [(head["block"], head["head"]) for head in document["heads"]] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    # The oracle: the same model's contributions, computed here, and TextSpan of each head against the bank.
    model = load_model(WeightsSpec(model_name=f"open_clip:{TINY_CLIP}", random=True, seed=0), "cpu")
    inputs = torch.stack([model.prepare(path).input for path in sorted(images.iterdir())])
    contributions = torch.stack([parts.heads for parts in embedding_parts(model, inputs, 1)]).numpy()
    texts = model.text.encode(BANK).double().numpy()
    for head in document["heads"]:
        span = text_span(contributions[:, head["block"] - 1, head["head"] - 1], texts, 7)
        assert [text["text"] for text in head["texts"]] == [BANK[index] for index in span.texts]
        np.testing.assert_allclose([text["share"] for text in head["texts"]], span.shares, rtol=1e-4, atol=1e-6)
        assert 0 <= head["explained"] <= 1 + 1e-9
    lines = files["csv"].read_text(encoding="utf-8").splitlines()
    assert len(lines) == 1 + sum(len(head["texts"]) for head in document["heads"])
    assert "block,head,rank,text,share,cumulative_share,head_variance" in lines[0]
    assert len(document["heads"][0]["texts"]) == len(BANK)  # 7 directions over 8 images: room for every text
    for text in BANK:
        assert text in result.stdout  # the tables show each text as written ("[bold]" is not markup)


def test_the_banks_embeddings_are_computed_once_and_read_back_from_the_store(cli, images, bank, workdir):
    from safetensors.torch import load_file

    from vitcli.loading import load_model
    from vitcli.spec import WeightsSpec

    register()
    name = "heads-b2-k2-t" + file_sha256(bank)[:10]
    arguments = ("heads", images, *CLIP, "--texts", bank, "--k", "2", *RANDOM_CPU)
    assert cli(*arguments).exit_code == 0
    first = json.loads(result_files(workdir / "outputs", name)["json"].read_text(encoding="utf-8"))["result"]
    assert cli(*arguments).exit_code == 0
    second = json.loads(result_files(workdir / "outputs", name)["json"].read_text(encoding="utf-8"))["result"]
    assert (first["texts"]["embeddings"], second["texts"]["embeddings"]) == ("computed", "from the cache")
    assert first["heads"] == second["heads"]
    (cached,) = (workdir / "outputs").glob(f"*/text-embeddings/texts-{file_sha256(bank)[:16]}-*.safetensors")
    model = load_model(WeightsSpec(model_name=f"open_clip:{TINY_CLIP}", random=True, seed=0), "cpu")
    assert np.array_equal(load_file(str(cached))["embeddings"].numpy(), model.text.encode(BANK).numpy())
    bank.write_text("a dog\na kite\n", encoding="utf-8")  # another bank: other embeddings
    assert cli("heads", images, *CLIP, "--texts", bank, "--k", "2", *RANDOM_CPU).exit_code == 0
    assert len(list((workdir / "outputs").glob("*/text-embeddings/*.safetensors"))) == 2


@pytest.mark.slow
def test_the_identity_holds_through_siglips_attention_pooling():
    """A SigLIP-like pair (timm ViT-Tiny trunk pooled by attention, 12 blocks): the parts, the pooling MLP's term and
    the constant add up to open_clip's own image embedding."""
    import torch

    from vitcli.experiments.heads import embedding_parts
    from vitcli.loading import load_model
    from vitcli.spec import WeightsSpec

    register()
    model = load_model(WeightsSpec(model_name=f"open_clip:{TINY_SIGMOID}", random=True, seed=1), "cpu")
    assert model.family.pooling == "map"
    inputs = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model.net(inputs).double()  # the open_clip tower's own forward: encode_image
    for image, found in enumerate(embedding_parts(model, inputs, 9)):
        assert found.heads.shape == (4, 3, expected.shape[-1])
        assert float(found.pool_mlp.abs().max()) > 0
        torch.testing.assert_close(found.rebuilt(), expected[image], atol=1e-4, rtol=0)


def test_the_identity_holds_through_timms_attention_pooling():
    """A timm ViT pooled by attention ('map', as SigLIP's trunk): the pooling MLP is one more term."""
    import torch

    from vitcli.experiments.heads import embedding_parts

    from conftest import small_vit

    model = small_vit("vit_tiny_patch16_224.augreg_in21k_ft_in1k", depth=3, img_size=64, global_pool="map")
    inputs = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model.net.forward_head(model.net.forward_features(inputs), pre_logits=True).double()
    for image, found in enumerate(embedding_parts(model, inputs, 2)):
        assert float(found.pool_mlp.abs().max()) > 0
        torch.testing.assert_close(found.rebuilt(), expected[image], atol=1e-4, rtol=0)


@pytest.mark.slow
def test_the_identity_holds_on_open_clips_vit_s_32_over_every_block():
    import torch

    from vitcli.experiments.heads import embedding_parts
    from vitcli.loading import load_model
    from vitcli.spec import WeightsSpec

    model = load_model(WeightsSpec(model_name="open_clip:ViT-S-32", random=True, seed=0), "cpu")
    inputs = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model.net(inputs).double()  # the tower's own forward: open_clip's encode_image
    for image, found in enumerate(embedding_parts(model, inputs, 1)):
        assert found.heads.shape[:2] == (model.depth, model.num_heads)
        torch.testing.assert_close(found.rebuilt(), expected[image], atol=1e-4, rtol=0)


def test_a_run_config_runs_heads_and_the_report_shows_its_texts_as_text(cli, images, bank, workdir):
    register()
    config = workdir / "heads.toml"
    config.write_text(
        f'name = "textspan"\nimages = ["{images}"]\n[model]\nname = "open_clip:{TINY_CLIP}"\nweights = "random"\n'
        'device = "cpu"\n[[experiments]]\ncommand = "heads"\ntexts = "bank.txt"\nk = 7\n',
        encoding="utf-8",
    )
    assert cli("run", config).exit_code == 0
    run = workdir / "outputs" / "textspan"
    manifest = json.loads((run / "manifest.json").read_text(encoding="utf-8"))
    (entry,) = [entry for entry in manifest["results"] if entry["command"] == "heads"]
    assert entry["experiment"] == "heads-b2-k7-t" + file_sha256(bank)[:10]
    assert len(list(run.glob("*/text-embeddings/*.safetensors"))) == 1  # cached with the run
    result = cli("report", run, "--rows", "100")
    assert result.exit_code == 0, result.stderr
    page = (run / "report.html").read_text(encoding="utf-8")
    assert "a bowl of [bold]soup[/bold]" in page  # the CSV excerpt's texts, as text
    assert "&lt;i&gt;kites&lt;/i&gt; &amp; co" in page and "<i>kites" not in page
    assert "data:image/png;base64," in page  # the figure


def test_a_text_longer_than_the_context_is_refused_in_one_line(cli, images, workdir):
    register()
    bank = workdir / "long.txt"
    bank.write_text("a dog\n" + " ".join(["word"] * 15) + "\n", encoding="utf-8")  # 17 tokens with start and end
    result = cli("heads", images, *CLIP, "--texts", bank, *RANDOM_CPU)
    assert result.exit_code == 2
    assert "is 17 tokens long, but the text tower of" in result.stderr and "reads at most 16" in result.stderr
    assert result.stderr.count("\n") == 1


def test_the_python_api_gives_the_commands_result(cli, images, bank, workdir):
    import vitcli

    register()
    assert cli("heads", images, *CLIP, "--texts", bank, "--k", "2", *RANDOM_CPU).exit_code == 0
    written = json.loads(
        result_files(workdir / "outputs", "heads-b2-k2-t" + file_sha256(bank)[:10])["json"].read_text()
    )
    model = vitcli.load_model(f"open_clip:{TINY_CLIP}", weights="random", seed=0, device="cpu")
    result = vitcli.heads(model, images, texts=str(bank), k=2)
    assert result.to_dict()["result"]["heads"] == written["result"]["heads"]
    frame = result.to_frame()
    assert {"block", "head", "rank", "text", "share", "cumulative_share"} <= set(frame.columns)
    assert len(frame) == sum(len(head["texts"]) for head in written["result"]["heads"])
    with pytest.raises(vitcli.UsageError, match="heads needs a text bank"):
        vitcli.heads(model, images)


def test_unreadable_images_are_left_out_and_named(cli, images, bank, workdir):
    register()
    broken = workdir / "broken.png"
    broken.write_text("not an image", encoding="utf-8")
    result = cli("heads", images / "image0.png", images / "image1.png", broken, *CLIP, "--texts", bank, *RANDOM_CPU)
    assert result.exit_code == 0, result.stderr
    document = json.loads(
        result_files(workdir / "outputs", "heads-b2-k5-t" + file_sha256(bank)[:10])["json"].read_text()
    )
    assert len(document["result"]["images"]) == 2
    (skipped,) = document["result"]["skipped"]
    assert "broken.png" in skipped
    alone = cli("heads", images / "image0.png", broken, *CLIP, "--texts", bank, *RANDOM_CPU)
    assert alone.exit_code == 1
    assert "1 image could be read: a head's variance over the images needs at least 2" in alone.stderr
