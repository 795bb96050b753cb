"""explain's methods are named once (vitcli.explain_methods): the command's choices, the experiment's check, the
--contrast refusal and the support table all read the one registry."""

from __future__ import annotations

import pytest

from vitcli.capture.support import COMMAND_NEEDS
from vitcli.errors import UsageError
from vitcli.experiments.explain import check_methods
from vitcli.explain_methods import CONTRAST_METHODS, DEFAULT_METHODS, EXPLAIN_METHODS, METHOD_NAMES
from vitcli.jobs.explain import Method, explain_jobs


def test_the_command_and_the_experiment_offer_the_registry_s_methods():
    assert [member.value for member in Method] == list(METHOD_NAMES)
    assert check_methods(METHOD_NAMES) == list(METHOD_NAMES)
    assert set(DEFAULT_METHODS) <= set(METHOD_NAMES)


def test_the_support_table_has_a_row_for_each_method_that_needs_more():
    rows = {key.removeprefix("explain --method "): needs for key, needs in COMMAND_NEEDS.items()}
    needing = {name: method.needs for name, method in EXPLAIN_METHODS.items() if method.needs is not None}
    assert {name: rows[name] for name in needing} == needing
    assert not {key for key in COMMAND_NEEDS if key.startswith("explain --method ")} - {
        f"explain --method {name}" for name in needing
    }
    # explain's dla map sums attribute --by token's parts: it needs what they need.
    assert COMMAND_NEEDS["attribute --by token"] == EXPLAIN_METHODS["dla"].needs


def test_contrast_is_refused_without_a_method_of_a_logit_difference():
    with pytest.raises(UsageError) as refused:
        explain_jobs(method=["occlusion", "attention", "rollout"], contrast="3")
    assert str(refused.value).endswith(", ".join(CONTRAST_METHODS))
    assert "occlusion" not in CONTRAST_METHODS and "dla" in CONTRAST_METHODS and "gradcam" in CONTRAST_METHODS
    for name in CONTRAST_METHODS:
        assert explain_jobs(method=[name], contrast="3")


def test_the_uses_of_a_job_are_the_table_s_rows_of_its_methods():
    (job,) = explain_jobs(method=["gradcam", "dla", "ig", "rollout"])
    assert job.uses() == ("explain", "explain --method dla", "explain --method rollout")
