"""One answer per (family, command) pair: a command runs, or refuses in one line, exit 2, before the weights load,
naming the model, its family and what it lacks (vitcli/capture/support.py); token names a model lacks are refused."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import typer

from vitcli.capture.family import FEATURES
from vitcli.capture.support import COMMAND_NEEDS, LACKS, TARGET_COMMANDS, support_refusal

RANDOM = ("--weights", "random", "--device", "cpu")
# Commands that load no model: their checks are about files, not families.
WITHOUT_A_MODEL = {"report", "merge", "run", "scenes"}


@dataclass(frozen=True)
class Facts:
    name: str
    family: str
    features: frozenset[str]
    family_refusal: str | None = None


@pytest.fixture
def no_model_load(monkeypatch):
    import vitcli.loading

    monkeypatch.setattr(vitcli.loading, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))


def test_the_needs_name_features_and_every_feature_has_a_refusal_text():
    assert set(LACKS) == set(FEATURES)
    for command, needs in COMMAND_NEEDS.items():
        assert needs <= set(FEATURES), command


def test_every_command_that_loads_a_model_has_a_row():
    from vitcli.cli import app

    commands = set(typer.main.get_command(app).commands) - WITHOUT_A_MODEL
    assert commands == {key.split(" ", 1)[0] for key in COMMAND_NEEDS}


@pytest.mark.parametrize("command", list(COMMAND_NEEDS))
def test_each_lacking_feature_is_named_and_only_a_class_head_is_replaced_by_a_target(command):
    everything = frozenset(FEATURES)
    assert support_refusal(command, Facts("m", "some family", everything)) is None
    for feature in COMMAND_NEEDS[command]:
        model = Facts("some_model", "some family", everything - {feature})
        refusal = support_refusal(command, model)
        assert refusal is not None and "\n" not in refusal
        assert f"`{command}` needs what some_model (some family) lacks: {LACKS[feature]}" in refusal
        with_target = support_refusal(command, model, has_embedding_target=True)
        if feature in ("class_head", "linear_head") and command.split(" ", 1)[0] in TARGET_COMMANDS:
            assert with_target is None
            assert "--target-image" in refusal
        else:
            assert with_target == refusal


@pytest.mark.parametrize(
    ("arguments", "fragments"),
    [
        (
            ["predict", "--model", "vit_base_patch16_siglip_224"],
            [
                "`predict` needs what vit_base_patch16_siglip_224 (timm VisionTransformer) lacks: no classifier head "
                "(num_classes=0); it runs patches, attend",
            ],
        ),
        (
            ["explain", "--model", "vit_small_patch14_reg4_dinov2"],
            ["lacks: no classifier head", "give an embedding target (--target-image"],
        ),
        (
            ["compare", "{image}", "{image}", "--model", "vit_medium_patch16_gap_256"],
            ["`compare` needs what vit_medium_patch16_gap_256 (timm VisionTransformer) lacks: no class token"],
        ),
        (
            ["trace", "--model", "deit_tiny_distilled_patch16_224"],
            ["`trace` needs what deit_tiny_distilled_patch16_224", "no forward vitcli can write out by hand"],
        ),
        (
            ["compare-patch-size", "--model", "vit_base_patch16_siglip_224"],
            ["lacks: no head reading the CLS row or the mean of the final rows (it pools by attention)"],
        ),
        (
            ["attend", "--view", "rollout", "--model", "vit_small_patch16_18x2_224"],
            ["`attend --view rollout` needs what", "no attention probabilities", "(block 1 (ParallelThingsBlock)"],
        ),
    ],
    ids=["predict headless", "explain headless", "compare no CLS", "trace DIST", "counts map", "rollout"],
)
def test_a_family_lacking_what_a_command_needs_is_refused_before_loading(
    cli, photo, no_model_load, arguments, fragments
):
    """Seen to fail before support.py: `trace` on DeiT's distilled model loaded it and failed with exit 1, and
    `predict` on SigLIP said it "has no class token" whatever the command."""
    result = cli(*(argument.format(image=photo) for argument in arguments), *RANDOM)
    assert result.exit_code == 2, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in result.stderr


def test_a_run_config_is_checked_by_the_same_needs(cli, photo, workdir, no_model_load):
    config = workdir / "run.toml"
    config.write_text(
        '[model]\nname = "vit_base_patch16_siglip_224"\nweights = "random"\n\n[[experiments]]\ncommand = "predict"\n',
        encoding="utf-8",
    )
    result = cli("run", str(config), str(photo), "--device", "cpu")
    assert result.exit_code == 2, result.stderr
    assert "experiments[0]" in result.stderr and "lacks: no classifier head" in result.stderr


# ----- token names and patch numbers the model does not have (usage errors, before loading)


@pytest.mark.parametrize(
    ("arguments", "fragments"),
    [
        (
            ["attend", "--query", "60", "--block", "1", "--head", "1", "--model", "vit_base_patch32_224"],
            ["--query 60: patch 60 does not exist: patches are P1..P49"],
        ),
        (["trace", "--token", "60", "--model", "vit_base_patch32_224"], ["--token 60", "P1..P49"]),
        (["patches", "--patch", "60", "--model", "vit_base_patch32_224"], ["patch 60 does not exist", "P1..P49"]),
        (
            ["trace", "--token", "R2"],
            ["--token R2: this model has no register token R2; its tokens are CLS, P1..P196"],
        ),
        (["attend", "--query", "r2", "--block", "1", "--head", "1"], ["--query r2: this model has no register"]),
        (["trace", "--token", "dist"], ["--token dist: this model has no distillation token (DIST)"]),
        (
            ["attend", "--query", "R5", "--block", "1", "--head", "1", "--model", "vit_small_patch14_reg4_dinov2"],
            ["--query R5: this model has no register token R5; its tokens are CLS, R1..R4, P1..P1369"],
        ),
        (
            ["attend", "--block", "1", "--head", "1", "--model", "vit_base_patch16_siglip_224"],
            ["--query cls: this model has no class token (CLS); its tokens are P1..P196"],
        ),
    ],
    ids=["query 60 on 7x7", "token 60 on 7x7", "patch 60 on 7x7", "R2", "query r2", "DIST", "R5 of 4", "no CLS"],
)
def test_tokens_and_patches_the_model_lacks_are_refused_in_one_line(cli, photo, no_model_load, arguments, fragments):
    """Seen to fail before grid.prefix_token: `--token R2` said "cannot read patch 'R2'"."""
    result = cli(arguments[0], photo, *arguments[1:], *RANDOM)
    assert result.exit_code == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr


# ----- pairs that run: the timm forms without a class token (test_vit2: R1 then patches, mean pooling)


def test_trace_follows_a_model_without_a_class_token(cli, photo):
    """Seen to fail (an internal error reading cls_token) before the trace joined only the prefix tokens it has."""
    result = cli("trace", photo, "--model", "test_vit2", "--token", "r1,1", "-f", "json", *RANDOM)
    assert result.exit_code == 0, result.stderr
    (document,) = json.loads(result.stdout)["results"]
    assert document["experiment"]["settings"]["tokens"] == [{"name": "R1", "token": 0}, {"name": "P1", "token": 1}]
    checks = document["result"]["checks"]
    assert checks["max_abs_error_vs_forward_hooks"] < checks["tolerance"]
    assert checks["max_abs_error_logits_vs_model"] < checks["tolerance"]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["test_vit", "test_vit2", "test_vit3"])
@pytest.mark.parametrize(
    "arguments",
    [
        ["predict"],
        ["patches"],
        ["attend", "--query", "1", "--block", "1", "--head", "1"],
        ["attend", "--view", "rollout", "--query", "1"],
        ["occlude-quadrants"],
        ["trace", "--token", "1"],
        ["compare", "{other}"],
        ["explain", "--method", "gradcam", "--method", "rollout", "--method", "relevance"],
        ["lens"],
        ["explore"],
        ["anatomy", "--view", "distance"],
        ["attribute", "--by", "head"],
        ["ablate"],
        ["patch", "{other}"],
    ],
    ids=lambda arguments: " ".join(arguments[:3]),
)
def test_every_pair_runs_or_is_refused_as_the_table_says(cli, photo, newfoundland, model, arguments):
    """The table's answer (from the family's features) is what the command does: exit 0, or exit 2 naming it."""
    from vitcli.capture.support import facts_of, missing_features
    from vitcli.loading import require_vit

    option = arguments[1] if len(arguments) > 1 else None
    key = {"--view": "attend --view rollout", "--by": "attribute --by head"}.get(option, arguments[0])
    missing = missing_features(key, facts_of(require_vit(model)).features)
    rest = [argument.format(other=newfoundland) for argument in arguments[1:]]
    result = cli(arguments[0], photo, *rest, "--model", model, *RANDOM)
    if missing:
        assert result.exit_code == 2 and f"`{key}` needs what {model}" in result.stderr, result.stderr
    else:
        assert result.exit_code == 0, result.stderr
