"""Loading weights and images robustly: header checks before reading, checkpoint formats and heads, labels,
architecture facts without weights, and the hub when it cannot be reached. Refusals themselves are in
test_bad_input.py."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from test_bad_input import hub_env, image_file, safetensors_file, sparse_file, tiny_state, with_value

from vitcli.errors import UsageError, VitcliError
from vitcli.grid import PatchGrid
from vitcli.images import load_rgb, resolve_images
from vitcli.loading import Architecture, describe, load_model, read_checkpoint, require_vit
from vitcli.spec import WeightsSpec

MODEL = "vit_tiny_patch16_224.augreg_in21k_ft_in1k"
MiB = 1 << 20


def measure_in_subprocess(code: str, warm_up: Path) -> dict[str, float | str]:
    """Run `code` (which sets `outcome`) in a fresh interpreter; its outcome, the bytes it read and the process's
    peak RSS (VmHWM: getrusage's ru_maxrss would include this large pytest process, which the child is forked from).
    Pillow's plugins are imported and `warm_up` loaded first: their files would count as bytes read."""
    script = f"""
import json
import os
from pathlib import Path
from PIL import Image
from vitcli.images import load_rgb
from vitcli.errors import VitcliError

def proc(file, field):
    for line in open(file):
        if line.startswith(field):
            return int(line.split()[1])

Image.init()
load_rgb(Path({str(warm_up)!r}))
before = proc("/proc/self/io", "rchar:")
{code}
print(json.dumps({{
    "outcome": outcome,
    "read_mib": (proc("/proc/self/io", "rchar:") - before) / {MiB},
    "peak_rss_mib": proc("/proc/self/status", "VmHWM:") / 1024,
}}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout)


needs_proc_io = pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="measures through /proc (Linux)")


# ----- images


@needs_proc_io
def test_a_huge_file_that_is_not_an_image_is_refused_from_its_header(tmp_path):
    huge = sparse_file(tmp_path / "zeros.jpg", 1 << 30)
    measured = measure_in_subprocess(
        f"""
try:
    load_rgb(Path({str(huge)!r}))
    outcome = "accepted"
except VitcliError as error:
    outcome = str(error)
""",
        image_file(tmp_path, "warm.jpg"),
    )
    assert "is not an image that Pillow can read as" in measured["outcome"]
    # Reading the file whole took 1 GiB of reads and about 1.1 GB of RSS; the header is a few bytes.
    assert measured["read_mib"] < 1
    assert measured["peak_rss_mib"] < 200


@needs_proc_io
def test_an_image_is_hashed_in_chunks_after_its_header_is_checked(tmp_path):
    path = image_file(tmp_path, "padded.png", "PNG")
    small = path.read_bytes()
    padding = 256 * MiB  # trailing bytes after IEND: Pillow ignores them, the SHA-256 covers them
    with path.open("r+b") as handle:
        handle.truncate(len(small) + padding)
    measured = measure_in_subprocess(
        f"""
rgb, source = load_rgb(Path({str(path)!r}))
outcome = source.sha256
""",
        image_file(tmp_path, "warm.jpg"),
    )
    expected = hashlib.sha256(small)
    zeros = bytes(MiB)
    for _ in range(padding // MiB):
        expected.update(zeros)
    assert measured["outcome"] == expected.hexdigest()
    assert measured["peak_rss_mib"] < 200, "the whole file was held in memory"


def test_image_suffixes_are_found_in_any_letter_case(tmp_path):
    for name, fmt in (("a.JPG", "JPEG"), ("b.Png", "PNG"), ("c.jpeg", "JPEG"), ("d.TIFF", "TIFF")):
        image_file(tmp_path, name, fmt)
    (tmp_path / "e.TXT").write_text("not an image")
    assert [path.name for path in resolve_images([str(tmp_path)])] == ["a.JPG", "b.Png", "c.jpeg", "d.TIFF"]
    rgb, source = load_rgb(tmp_path / "a.JPG")
    assert rgb.size == (64, 48) and source.sha256 == hashlib.sha256((tmp_path / "a.JPG").read_bytes()).hexdigest()


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "GIF", "BMP", "TIFF", "WEBP"])
def test_damaged_images_fail_only_with_one_line_errors(tmp_path, fmt):
    """Cut and corrupted files of every accepted format: decoded, or refused with a VitcliError, nothing else."""
    whole = image_file(tmp_path, f"whole.{fmt.lower()}", fmt).read_bytes()
    rng = np.random.default_rng(sum(map(ord, fmt)))
    variants = [whole[:cut] for cut in (0, 8, 16, 40, len(whole) // 3, len(whole) - 5)]
    for _ in range(12):
        damaged = bytearray(whole)
        for position in rng.integers(0, len(whole), 6):
            damaged[position] = int(rng.integers(0, 256))
        variants.append(bytes(damaged))
    for index, content in enumerate(variants):
        path = tmp_path / f"variant{index}.{fmt.lower()}"
        path.write_bytes(content)
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            try:
                rgb, _ = load_rgb(path)
            except VitcliError as error:
                assert "\n" not in str(error) and str(path) in str(error)
            else:
                assert rgb.mode == "RGB"
        assert [str(warning.message) for warning in warned] == [], "a warning would be a second line on stderr"


# ----- checkpoints


@pytest.mark.parametrize("name", ["W.SAFETENSORS", "w.SafeTensors", "W.PTH", "w.Pt"])
def test_checkpoint_suffixes_in_any_letter_case(tmp_path, vit, name):
    path = tmp_path / name
    state = vit.net.state_dict()
    if "safetensors" in name.lower():
        safetensors_file(path, state)
    else:
        torch.save(state, path)
    loaded = load_model(WeightsSpec(model_name=MODEL, checkpoint=path), "cpu")
    assert loaded.parameter_sha256 == vit.parameter_sha256


def test_damaged_checkpoints_fail_only_with_one_line_errors(tmp_path):
    state = {"head.weight": torch.randn(2, 8), "head.bias": torch.randn(2)}
    files = [safetensors_file(tmp_path / "w.safetensors", state), tmp_path / "w.pth", tmp_path / "legacy.pt"]
    torch.save(state, files[1])
    torch.save(state, files[2], _use_new_zipfile_serialization=False)
    rng = np.random.default_rng(0)
    for source in files:
        whole = source.read_bytes()
        variants = [whole[:cut] for cut in (1, 7, 9, 30, len(whole) // 2, len(whole) - 1)]
        for _ in range(10):
            damaged = bytearray(whole)
            for position in rng.integers(0, len(whole), 4):
                damaged[position] = int(rng.integers(0, 256))
            variants.append(bytes(damaged))
        for index, content in enumerate(variants):
            path = tmp_path / f"variant{index}{source.suffix}"
            path.write_bytes(content)
            with warnings.catch_warnings(record=True) as warned:
                warnings.simplefilter("always")
                try:
                    read = read_checkpoint(path)
                except VitcliError as error:
                    assert "\n" not in str(error) and str(path) in str(error)
                else:
                    assert set(read) <= set(state)
            assert [str(warning.message) for warning in warned] == [], "a warning would be a second line on stderr"


def test_a_checkpoint_head_with_other_classes_builds_that_head(tmp_path):
    state = tiny_state()
    state["head.weight"], state["head.bias"] = state["head.weight"][:2].clone(), state["head.bias"][:2].clone()
    path = safetensors_file(tmp_path / "probe.safetensors", state)
    model = load_model(WeightsSpec(model_name=MODEL, checkpoint=path), "cpu")
    assert model.num_classes == 2 and model.labels == ["class 0", "class 1"]
    # Oracle: timm's own model with a 2-class head and the same state gives the same logits.
    own = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=2)
    own.load_state_dict(state)
    inputs = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        # logits() may split the batch over CPU threads: float32 sums then differ in the last bits, far below 1e-5.
        assert (model.logits(inputs) - own.eval()(inputs)).abs().max() < 1e-5


def test_a_checkpoint_without_a_head_loads_headless(tmp_path):
    state = {name: tensor for name, tensor in tiny_state().items() if not name.startswith("head.")}
    path = safetensors_file(tmp_path / "features.safetensors", state)
    model = load_model(WeightsSpec(model_name=MODEL, checkpoint=path), "cpu")
    assert model.num_classes == 0 and model.labels == []
    assert model.logits(torch.zeros(1, 3, 224, 224)).shape == (1, 192), "headless: the pooled CLS features"
    architecture = describe(WeightsSpec(model_name=MODEL, checkpoint=path))
    assert architecture.num_classes == 0 and architecture.labels == ()


def test_checkpoint_labels_come_from_the_first_file_found(tmp_path):
    state = tiny_state()
    state["head.weight"], state["head.bias"] = state["head.weight"][:2].clone(), state["head.bias"][:2].clone()
    path = safetensors_file(tmp_path / "probe.safetensors", state)
    explicit, beside, folder = tmp_path / "mine.txt", tmp_path / "probe.labels.txt", tmp_path / "labels.txt"
    explicit.write_text("cat\ndog\n", encoding="utf-8")
    beside.write_text("chat\r\nchien", encoding="utf-8")
    folder.write_text("Katze\n Hund \n\n", encoding="utf-8-sig")  # with a byte-order mark
    spec = WeightsSpec(model_name=MODEL, checkpoint=path)
    assert describe(WeightsSpec(model_name=MODEL, checkpoint=path, labels=explicit)).labels == ("cat", "dog")
    assert describe(spec).labels == ("chat", "chien")
    assert load_model(spec, "cpu").labels == ["chat", "chien"], "the loaded model names its classes the same way"
    beside.unlink()
    assert describe(spec).labels == ("Katze", "Hund")
    folder.unlink()
    assert describe(spec).labels == ("class 0", "class 1")


def test_imagenet_names_when_the_head_matches_the_pretrained_config(tmp_path, vit):
    path = safetensors_file(tmp_path / "full.safetensors", vit.net.state_dict())
    names = timm.data.ImageNetInfo().label_descriptions()
    assert describe(WeightsSpec(model_name=MODEL, checkpoint=path)).labels == tuple(names)
    assert (
        load_model(WeightsSpec(model_name=MODEL, checkpoint=path), "cpu").labels[256]
        == "Newfoundland, Newfoundland dog"
    )
    assert vit.labels == names


def test_a_labels_file_names_the_classes_of_random_weights(tmp_path):
    names = [f"name {index} ü" for index in range(1000)]
    path = tmp_path / "names.txt"
    path.write_text("\n".join(names) + "\n", encoding="utf-8")
    spec = WeightsSpec(random=True, seed=5, labels=path)
    assert load_model(spec, "cpu").labels == names and describe(spec).labels == tuple(names)


# ----- architecture facts without weights


DESCRIBED = [
    WeightsSpec(random=True),
    WeightsSpec(model_name="deit_tiny_distilled_patch16_224", random=True),
    WeightsSpec(model_name="vit_tiny_patch16_384.augreg_in21k_ft_in1k", random=True),
    WeightsSpec(model_name="vit_small_patch14_reg4_dinov2.lvd142m", random=True),
    WeightsSpec(model_name="vit_small_patch16_224.dino", random=True),
]


@pytest.mark.parametrize("spec", DESCRIBED, ids=[spec.model_name for spec in DESCRIBED])
def test_describe_gives_the_loaded_models_facts(spec):
    from vitcli.capture.support import family_features

    architecture = describe(spec)
    model = load_model(spec, "cpu")
    assert architecture == Architecture(
        name=spec.model_name,
        depth=model.depth,
        num_heads=model.num_heads,
        embed_dim=model.embed_dim,
        grid=model.grid,
        num_classes=model.num_classes,
        labels=tuple(model.labels),
        global_pool=model.net.global_pool,
        mlp_hidden=model.net.blocks[0].mlp.fc1.out_features,
        family="timm VisionTransformer",
        features=family_features(model.family) - ({"class_head"} if model.num_classes == 0 else set()),
        family_refusal=None,
        places=tuple(model.family.places()),
        embedding_width=len(model.family.pooled(torch.zeros(1, *model.data_config["input_size"]))[0]),
    )


def test_describe_default_and_headless_models():
    tiny = describe(WeightsSpec())
    assert (tiny.depth, tiny.num_heads, tiny.embed_dim, tiny.num_classes) == (12, 3, 192, 1000)
    assert tiny.grid == PatchGrid(224, 224, 16, ("CLS",)) and tiny.grid.num_tokens == 197
    assert tiny.labels[256] == "Newfoundland, Newfoundland dog" and tiny.global_pool == "token"
    dino = describe(WeightsSpec(model_name="vit_small_patch16_224.dino"))
    assert dino.num_classes == 0 and dino.labels == ()
    registers = describe(WeightsSpec(model_name="vit_small_patch14_reg4_dinov2.lvd142m"))
    assert registers.grid.prefix_names == ("CLS", "R1", "R2", "R3", "R4") and registers.num_classes == 0


def test_describe_reads_no_weights_and_is_quick(tmp_path, monkeypatch):
    # The checkpoint's values are NaN: loading refuses it, describing never reads a value.
    path = safetensors_file(tmp_path / "nan.safetensors", with_value("blocks.1.norm1.weight", float("nan")))
    spec = WeightsSpec(model_name=MODEL, checkpoint=path)
    with pytest.raises(VitcliError, match="NaN"):
        load_model(spec, "cpu")
    real_create = timm.create_model
    devices = []
    monkeypatch.setattr(timm, "create_model", lambda *a, **k: devices.append(k.get("device")) or real_create(*a, **k))
    require_vit.cache_clear()  # the loader above built the skeleton already: make describe build its own
    started = time.perf_counter()
    architecture = describe(spec)
    elapsed = time.perf_counter() - started
    assert architecture.num_classes == 1000 and architecture.depth == 12
    assert devices and set(devices) == {"meta"}
    assert elapsed < 2.0, f"describe took {elapsed:.2f} s"


# ----- usage errors before any weights load


def test_the_seed_range_is_torchs():
    for seed in (-(2**63), 0, 2**64 - 1):
        torch.manual_seed(seed)
        assert WeightsSpec(random=True, seed=seed).seed == seed
    for seed in (-(2**63) - 1, 2**64):
        with pytest.raises((RuntimeError, ValueError)):
            torch.manual_seed(seed)
        with pytest.raises(UsageError, match="-9223372036854775808 to 18446744073709551615"):
            WeightsSpec(random=True, seed=seed)
    torch.manual_seed(0)


def test_an_unknown_tag_is_refused_before_any_weights_load(monkeypatch):
    monkeypatch.setattr(timm, "create_model", lambda *args, **kwargs: pytest.fail("a model was built"))
    with pytest.raises(UsageError, match=r"unknown pretrained tag 'nope' for vit_tiny_patch16_224"):
        describe(WeightsSpec(model_name="vit_tiny_patch16_224.nope"))


# ----- the Hugging Face hub


def write_hub_cache(home: Path, state: dict[str, torch.Tensor]) -> None:
    """The cache tree timm's pretrained loading reads (see NOTES.md): snapshots/<rev>/model.safetensors, refs/main."""
    repo = home / "hub" / f"models--timm--{MODEL}"
    (repo / "snapshots" / "0123abc").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abc")
    safetensors_file(repo / "snapshots" / "0123abc" / "model.safetensors", state)


@pytest.mark.slow
def test_cached_weights_load_while_the_hub_refuses_connections(tmp_path, vit):
    write_hub_cache(tmp_path / "hf-home", vit.net.state_dict())
    code = (
        "from vitcli.loading import load_model; from vitcli.spec import WeightsSpec; "
        "model = load_model(WeightsSpec(), 'cpu'); print(model.parameter_sha256, model.labels[256])"
    )
    env = hub_env(tmp_path, HF_ENDPOINT="http://127.0.0.1:9")
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split(maxsplit=1) == [vit.parameter_sha256, "Newfoundland, Newfoundland dog\n"]
    assert time.perf_counter() - started < 30


def test_the_hub_check_connects_where_the_hub_client_would(monkeypatch):
    from vitcli.weights import hub_connection_problem as _hub_connection_problem

    for name in [key for key in os.environ if "proxy" in key.lower()]:
        monkeypatch.delenv(name)
    assert _hub_connection_problem("http://127.0.0.1:9") == "connection refused"
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    assert _hub_connection_problem("http://localhost:9") == "the proxy http://127.0.0.1:9: connection refused"
    monkeypatch.setenv("NO_PROXY", "localhost")
    assert _hub_connection_problem("http://localhost:9") == "connection refused", "NO_PROXY bypasses the proxy"
