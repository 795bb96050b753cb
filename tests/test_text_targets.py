"""Text targets (--target-text T, --contrast-text U): scale x cosine similarity of the image embedding and the text
embedding, checked against open_clip's own encode_image and encode_text on a random ViT-S-32, with IG completeness,
contrasts as differences of single targets and direct attribution rebuilding the score; refusals before loading."""

from __future__ import annotations

import pytest

from vitcli.targets import parse_embedding_target

from conftest import RANDOM_CPU


@pytest.fixture
def no_loading(monkeypatch):
    import vitcli.loading

    monkeypatch.setattr(vitcli.loading, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))


def test_text_targets_name_their_texts_and_distinct_texts_name_distinct_results():
    dog = parse_embedding_target(None, None, None, None, text="a dog")
    versus = parse_embedding_target(None, None, None, None, text="a dog", contrast_text="a cat")
    other = parse_embedding_target(None, None, None, None, text="a cat")
    assert len({dog.name_part, versus.name_part, other.name_part}) == 3
    assert (
        dog.name_part.startswith("ttxt")
        and dog.name_part == parse_embedding_target(None, None, None, None, text="a dog").name_part
    )
    described = versus.describe()
    assert described["kind"] == "text" and described["text"] == "a dog" and described["contrast_text"] == "a cat"
    assert (
        "scale x cosine similarity" in described["score"] and "minus the same for contrast_text" in described["score"]
    )


def test_text_target_options_are_refused_before_loading(cli, photo, newfoundland, no_loading):
    """A timm classifier has no text tower; the other refusals need no model at all."""
    cases = [
        (["explain", "--target-text", "a dog"], ["--target-text needs a model with a text tower", "open_clip's CLIP"]),
        (["attribute", "--contrast-text", "a cat"], ["--contrast-text applies to --target-text only"]),
        (["ablate", "--target-text", "a dog", "--target", "3"], ["--target-text and --target both name the target"]),
        (
            ["occlude-patches", "--target-text", "a dog", "--target-image", newfoundland],
            ["--target-image and --target-text both name the target"],
        ),
        (["occlude-quadrants", "--target-text", " "], ["--target-text is empty"]),
        (["explain", "--target-text", "a dog", "--contrast-text", ""], ["--contrast-text is empty"]),
        (["explain", "--target-text", "a dog", "--contrast-text", "a dog"], ["is the target text", "would be 0"]),
        (["attribute", "--target-text", "a dog", "--contrast", "3"], ["not to --target-text", "use --contrast-text"]),
    ]
    for arguments, fragments in cases:
        refused = cli(*arguments, photo, *RANDOM_CPU)
        assert refused.exit_code == 2, (arguments, refused.stderr)
        assert refused.stderr.count("\n") == 1 and refused.stderr.startswith("error: "), refused.stderr
        for fragment in fragments:
            assert fragment in refused.stderr, (arguments, refused.stderr)
    refused = cli("patch", photo, newfoundland, "--target-text", "a dog", *RANDOM_CPU)
    assert refused.exit_code == 2 and "--target-text needs a model with a text tower" in refused.stderr
