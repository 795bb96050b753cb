"""Counts, seeds and shards: every one range-checked before the model loads (exit 2, one line), and defaults that
depend on the model always fit it.

Each case here failed before its fix with exit 1 "internal error" or no refusal at all (a count with no upper
bound ran for minutes); checked by running the cases on the code before the fix.
"""

from __future__ import annotations

import json

import pytest
import torch

from conftest import RANDOM_CPU

SEED_RANGE = "-9223372036854775808 to 18446744073709551615"


@pytest.fixture
def no_model_load(monkeypatch):
    import vitcli.loading

    monkeypatch.setattr(vitcli.loading, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["predict", "--shard", "²/2"], "--shard '²/2': write it as K/N"),
        (["predict", "--shard", "1/٢"], "write it as K/N"),  # an Arabic-Indic two: a digit to str.isdigit
        (["explain", "--faithfulness", "--order-seed", "99999999999999999999"], f"--order-seed 99999999999999999999 "
         f"is outside the range torch accepts: {SEED_RANGE}"),
        (["explain", "--faithfulness", "--random-orders", "300000"],
         "--random-orders must be between 0 and 1000 (each costs 2 x --steps forwards per image), not 300000"),
        (["trace", "--values", "1000000"],
         "--values must be between 1 and 1000 (the longest vector of the forward), not 1000000"),
        (["patches", "--values", "100000"], "--values must be between 1 and 768"),
    ],
)  # fmt: skip
def test_counts_and_seeds_out_of_range_exit_2_in_one_line_before_the_model_loads(
    cli, photo, no_model_load, args, message
):
    command, *options = args
    result = cli(command, photo, *RANDOM_CPU, *options)
    assert result.exit_code == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "internal error" not in result.stderr, result.stderr
    assert result.stderr.startswith("error: ") and message in result.stderr, result.stderr


SUPERSCRIPT_TWO, ARABIC_THREE = "\u00b2", "\u0663"  # digits to str.isdigit; int() refuses the first, reads the second


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["lens", "--target", SUPERSCRIPT_TWO], f"--target '{SUPERSCRIPT_TWO}' matches no class label"),
        (["lens", "--target", ARABIC_THREE], f"--target '{ARABIC_THREE}' matches no class label"),
        (
            ["explore", "--blocks", SUPERSCRIPT_TWO],
            f"--blocks {SUPERSCRIPT_TWO}: write blocks as 4, 1-4, 1,6,12 or all",
        ),
        (["explore", "--blocks", f"1-{ARABIC_THREE}"], "write blocks as 4, 1-4, 1,6,12 or all"),
        (["trace", "--blocks", SUPERSCRIPT_TWO], f"--blocks {SUPERSCRIPT_TWO}: give block numbers 1..12"),
        (["trace", "--blocks", ARABIC_THREE], f"--blocks {ARABIC_THREE}: give block numbers 1..12"),
        (["trace", "--blocks", "1_2"], "--blocks 1_2: give block numbers 1..12"),  # int() reads it as 12
        (["trace", "--token", ARABIC_THREE], f"--token {ARABIC_THREE}: cannot read patch"),
        (["patches", "--patch", ARABIC_THREE], f"cannot read patch '{ARABIC_THREE}'"),
        (["patches", "--patch", f"r{ARABIC_THREE}c1"], "cannot read patch"),
        (["attend", "--query", SUPERSCRIPT_TWO], "cannot read patch"),
    ],
)
def test_numbers_in_other_scripts_are_refused_in_one_line_before_the_model_loads(
    cli, photo, no_model_load, args, message
):
    """Issue 27 item 7's audit: every option that reads a number from text takes ASCII digits only."""
    command, *options = args
    result = cli(command, photo, *RANDOM_CPU, *options)
    assert result.exit_code == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "internal error" not in result.stderr, result.stderr
    assert result.stderr.startswith("error: ") and message in result.stderr, result.stderr


def test_compare_pairs_read_ascii_numbers_only():
    from vitcli.errors import UsageError
    from vitcli.experiments.compare import parse_pairs

    assert (0, 2) in parse_pairs("1~3", 3)
    for text in (f"1~{ARABIC_THREE}", f"{SUPERSCRIPT_TWO}~1"):
        with pytest.raises(UsageError, match="no image"):
            parse_pairs(text, 3)


def test_natural_order_and_terminal_width_take_ascii_digits_only(monkeypatch):
    from vitcli.batch.manifest import natural_key
    from vitcli.output import _pipe_width

    assert sorted(["attention-b12", "attention-b6", f"x{SUPERSCRIPT_TWO}"], key=natural_key)[:2] == [
        "attention-b6",
        "attention-b12",
    ]
    monkeypatch.setenv("COLUMNS", SUPERSCRIPT_TWO)
    assert _pipe_width() > 0


@pytest.mark.parametrize(
    "args",
    [
        ["compare-patch-size", "--measure", "--runs", "99999999999"],
        ["compare-patch-size", "--measure", "--warmup", "99999999999"],
        ["compare-patch-size", "--image-size", "99999999"],
        ["predict", "--batch-size", "99999999999999999999"],
    ],
)
def test_counts_bounded_by_their_option_are_parse_errors(cli, no_model_load, args):
    """Bounds fixed by the option itself: the parser refuses (exit 2; the installed entry point prints one line)."""
    command, *options = args
    result = cli(command, *RANDOM_CPU, *options)
    assert result.exit_code == 2 and f"Invalid value for '{options[-2]}'" in result.stderr, result.stderr


def test_a_huge_split_seed_is_a_usage_error(cli, workdir, no_model_load):
    result = cli("probe", workdir, *RANDOM_CPU, "--split-seed", "99999999999999999999")
    assert result.exit_code == 2, result.stderr
    assert f"--split-seed 99999999999999999999 is outside the range torch accepts: {SEED_RANGE}" in result.stderr


@pytest.mark.parametrize(
    ("case", "content", "message"),
    [
        ("a command given as a list", b"[[experiments]]\ncommand = ['predict']\n",
         "experiments[0].command: ['predict'] is not an experiment vitcli can run"),
        ("a file that is not UTF-8", b"name = 'caf\xe9'\n[[experiments]]\ncommand = 'predict'\n",
         "is not UTF-8 text"),
        ("arrays nested deeper than the parser goes", b"x = " + b"[" * 5000 + b"]" * 5000 + b"\n",
         "is not valid TOML: values nested too deeply"),
        ("inline tables nested deeper than the parser goes", b"x = " + b"{a=" * 2000 + b"1" + b"}" * 2000 + b"\n",
         "is not valid TOML: values nested too deeply"),
        ("one option in both spellings", b"[[experiments]]\ncommand = 'predict'\ntop-k = 3\ntop_k = 4\n",
         "experiments[0]: `top-k` and `top_k` are the same option: give it once"),
        ("one model option in both spellings", b"[model]\nbatch-size = 2\nbatch_size = 4\n"
         b"[[experiments]]\ncommand = 'predict'\n",
         "model: `batch-size` and `batch_size` are the same option: give it once"),
    ],
)  # fmt: skip
def test_config_usage_errors_exit_2_not_internal_errors(cli, photo, workdir, no_model_load, case, content, message):
    path = workdir / "bad.toml"
    path.write_bytes(content)
    result = cli("run", path, photo, *RANDOM_CPU)
    assert result.exit_code == 2, (case, result.stderr)
    assert message in result.stderr and result.stderr.count("\n") == 1, (case, result.stderr)


# ----- defaults that depend on the model


def two_class_checkpoint(folder):
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(0)
    net = timm.create_model("vit_tiny_patch16_224.augreg_in21k_ft_in1k", pretrained=False, num_classes=2)
    path = folder / "two.safetensors"
    save_file({name: tensor.contiguous() for name, tensor in net.state_dict().items()}, str(path))
    (folder / "two.labels.txt").write_text("cat\ndog\n")
    return path


def test_a_default_top_k_fits_a_two_class_model_and_an_explicit_one_must(cli, photo, workdir):
    """Before the fix: exit 2 "--top-k must be between 1 and 2 ... not 5" though no --top-k was given."""
    checkpoint = two_class_checkpoint(workdir)
    result = cli("predict", photo, "--checkpoint", checkpoint, "--device", "cpu", "-f", "json", "-q")
    assert result.exit_code == 0, result.stderr
    top = json.loads(result.stdout)["results"][0]["result"]["top"]
    assert sorted(entry["label"] for entry in top) == ["cat", "dog"]
    refused = cli("predict", photo, "--checkpoint", checkpoint, "--device", "cpu", "--top-k", "3")
    assert refused.exit_code == 2
    assert "--top-k must be between 1 and 2 (the model's classes), not 3" in refused.stderr


def test_model_dependent_defaults_are_resolved_against_the_architecture():
    from vitcli.jobs.attend import AttendJob, View
    from vitcli.jobs.compare import CompareJob
    from vitcli.jobs.predict import PredictJob
    from vitcli.loading import describe
    from vitcli.spec import WeightsSpec

    architecture = describe(WeightsSpec(random=True))
    few = type(architecture)(**{**architecture.__dict__, "num_classes": 3, "labels": ("a", "b", "c")})
    for job in (PredictJob(), CompareJob()):
        assert job.plan(few).planned.top_k == 3
        assert job.plan(architecture).planned.top_k == 5
    attend = AttendJob(View.map, 1, 1, False, "cls", "mean", 0.0, None).plan(architecture)
    assert attend.planned.top_k == 10 and "-k" not in attend.name()
