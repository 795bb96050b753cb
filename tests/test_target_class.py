"""One resolver of the class a command follows (vitcli.target_class): every option that takes a class resolves it
the same way, and a contrast class is refused the same way whichever command takes it."""

from __future__ import annotations

import pytest
import torch

from conftest import RANDOM_CPU


@pytest.fixture
def no_model_load(monkeypatch):
    import vitcli.loading

    monkeypatch.setattr(vitcli.loading, "load_model", lambda *args, **kwargs: pytest.fail("the model loaded"))


@pytest.mark.parametrize("command", [["explain", "-M", "ig"], ["attribute"]])
def test_a_contrast_class_out_of_range_is_named_as_the_contrast(cli, photo, no_model_load, command):
    """Seen failing before: explain resolved --contrast as if it were --target ("--target 5000 does not exist")."""
    result = cli(*command, photo, *RANDOM_CPU, "--contrast", "5000")
    assert result.exit_code == 2
    assert "--contrast 5000 does not exist: class indexes are 0..999" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("command", [["explain", "-M", "ig"], ["attribute"]])
def test_a_contrast_equal_to_the_target_is_refused_with_one_reason(cli, photo, no_model_load, command):
    result = cli(*command, photo, *RANDOM_CPU, "--target", "3", "--contrast", "3")
    assert result.exit_code == 2
    assert "--contrast 3 is the target class 3: logit(target) - logit(contrast) would be 0" in result.stderr


def test_target_or_top1_follows_the_given_class_else_the_clean_top1():
    from vitcli.target_class import target_or_top1

    clean = torch.tensor([0.1, 0.7, 0.2])
    assert target_or_top1(None, clean) == 1
    assert target_or_top1(2, clean) == 2
    assert target_or_top1(0, clean) == 0  # class 0 is a class, not "none given"
