"""`Job.plan(architecture)` returns a validated plan and changes nothing (issue 29): every architecture-dependent value
(parsed heads and blocks, resolved tokens, defaults fitted to the model) lives in the planned job it returns, never
in the job it was called on, so one job planned against two models gives two independent plans."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from vitcli.errors import UsageError

from conftest import EXAMPLES


def builds(tmp_path: Path) -> list[tuple[str, dict[str, Any]]]:
    """Each command with typical options (some needing files: a text bank, a data folder, a CORRUPT image)."""
    photo = EXAMPLES / "newfoundland_31.jpg"
    bank = tmp_path / "texts.txt"
    bank.write_text("a dog\na cat\nwater\n", encoding="utf-8")
    data = tmp_path / "data"
    for label, image in (("dog", "newfoundland_31.jpg"), ("cat", "Persian_98.jpg")):
        (data / label).mkdir(parents=True)
        shutil.copy(EXAMPLES / image, data / label / image)
    return [
        ("ablate", {}),
        ("ablate", {"heads": "1.1,2.2", "target": "3"}),
        ("ablate", {"blocks": "all", "heads": "all"}),
        ("anatomy", {}),
        ("anatomy", {"view": ["cka", "norms"]}),
        ("attend", {"block": 4, "all_heads": True}),
        ("attend", {"view": "all-blocks", "head": 1}),
        ("attend", {"view": "summary", "query": "all"}),
        ("attend", {"view": "rollout", "query": "5", "top_k": 3}),
        ("attribute", {}),
        ("bench", {"masks": str(tmp_path)}),
        ("bench", {"method": ["gradcam", "random"], "scores": "pointing,deletion", "masks": str(tmp_path)}),
        ("bench", {"method": ["ig", "smoothgrad"], "scores": "insertion,sensitivity,sanity", "block": 3, "steps": 5}),
        ("attribute", {"by": "token", "block": 2, "target": "5", "contrast": "7"}),
        ("compare", {}),
        ("compare", {"classes": ["3", "1"], "pairs": "all"}),
        ("compare-patch-size", {}),
        ("compare-patch-size", {"patch_sizes": "8,32", "adapt": str(photo)}),
        ("explain", {}),
        ("explain", {"method": ["gradcam", "rollout"], "block": 3, "faithfulness": True, "contrast": "4"}),
        ("explore", {}),
        ("explore", {"blocks": "1-2", "explain": True}),
        ("heads", {"texts": str(bank)}),
        ("heads", {"texts": str(bank), "blocks": 2}),
        ("lens", {}),
        ("lens", {"target": "7"}),
        ("occlude-patches", {}),
        ("occlude-patches", {"size": 32, "stride": 16, "target_feature": 3}),
        ("occlude-quadrants", {"target": "2"}),
        ("patch", {"corrupt": str(photo)}),
        ("patch", {"corrupt": str(photo), "target": "1", "contrast": "2"}),
        ("patches", {}),
        ("patches", {"patch": ["3", "r1c2"], "values": 4}),
        ("predict", {}),
        ("predict", {"top_k": 3}),
        ("probe", {"data_dir": str(data)}),
        ("trace", {}),
        ("trace", {"token": ["cls,5"], "blocks": ["all"]}),
    ]


def state(value: Any) -> Any:
    """A value as comparable plain data, looking into objects: a deep copy of what a job holds."""
    if isinstance(value, dict):
        return {key: state(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [state(item) for item in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if hasattr(value, "__dict__") and not isinstance(value, type) and not callable(value):
        return (type(value).__name__, state(vars(value)))
    return value


@pytest.fixture(scope="module")
def architectures():
    """The default ViT-Tiny (12 blocks of 3 heads) and timm's test_vit (6 blocks of 2 heads)."""
    from vitcli.loading import describe
    from vitcli.spec import WeightsSpec

    return describe(WeightsSpec(random=True)), describe(WeightsSpec(model_name="test_vit", random=True))


def test_planning_changes_nothing_and_plans_alike_twice(tmp_path, architectures):
    from vitcli.job_registry import job_builder

    tiny, _ = architectures
    for command, options in builds(tmp_path):
        for job in job_builder(command)(**options):
            before = state(job)
            first = job.plan(tiny)
            assert state(job) == before, f"{command} {options}: plan() changed the job it was called on"
            second = job.plan(tiny)
            assert state(job) == before, f"{command} {options}: planning again changed the job"
            planned = state(first)
            for count in (1, 2, 3):
                try:
                    first.check_images(count)
                except UsageError:
                    pass
            assert state(first) == planned, f"{command} {options}: check_images changed the job"
            first, second = first.plan_images(3), second.plan_images(3)
            assert state(job) == before and state(job.plan(tiny)) == planned, (command, options)
            assert first.name() == second.name(), (command, options)
            assert first.settings() == second.settings(), (command, options)
            assert first.plan(tiny).plan_images(3).name() == first.name(), f"{command}: a planned job plans alike"


def test_a_job_with_nothing_to_resolve_plans_to_itself(tmp_path, architectures):
    from vitcli.jobs.anatomy import anatomy_jobs

    tiny, _ = architectures
    for job in anatomy_jobs():
        assert job.plan(tiny) is job


def test_one_job_planned_against_two_models_gives_two_plans(architectures):
    """`ablate --heads all` on a 12-block model of 3 heads and on a 6-block model of 2: each plan its own heads."""
    from vitcli.jobs.ablate import ablate_jobs

    tiny, six_blocks = architectures
    assert (tiny.depth, six_blocks.depth) == (12, 6)
    (job,) = ablate_jobs(heads="all")
    on_tiny = job.plan(tiny)
    on_six = job.plan(six_blocks)
    assert len(on_tiny.planned.ablations) == 12 * 3
    assert len(on_six.planned.ablations) == 6 * 2
    assert {ablation.block for ablation in on_tiny.planned.ablations} == set(range(1, 13))
    assert on_tiny.name() == on_six.name()  # both `all`


def test_blocks_in_range_on_one_model_are_refused_on_another(architectures):
    from vitcli.jobs.ablate import ablate_jobs

    tiny, six_blocks = architectures
    (job,) = ablate_jobs(blocks="9.attn")
    planned = job.plan(tiny)
    with pytest.raises(UsageError, match="block 9 does not exist; blocks are 1..6"):
        job.plan(six_blocks)
    assert [ablation.label for ablation in planned.planned.ablations] == [
        ablation.label for ablation in job.plan(tiny).planned.ablations
    ]


def test_a_job_named_before_it_is_planned_fails_loudly(tmp_path, architectures):
    """Naming or computing a job whose settings depend on the architecture before planning it is a bug of the caller:
    a clear internal error, never a name made of defaults."""
    from vitcli.job_registry import job_builder
    from vitcli.jobs import JobNotPlanned

    tiny, _ = architectures
    for command, options in builds(tmp_path):
        for job in job_builder(command)(**options):
            if job.plan(tiny) is job:
                continue
            with pytest.raises(JobNotPlanned, match=f"{command}.*before plan"):
                job.name()


def test_explore_plans_its_explain_job_without_touching_it(architectures):
    from vitcli.jobs.explore import explore_jobs

    tiny, six_blocks = architectures
    (job,) = explore_jobs(explain=True)
    before = state(job.explain)
    on_tiny, on_six = job.plan(tiny), job.plan(six_blocks)
    assert state(job.explain) == before
    assert on_tiny.explain.planned.block == 12 and on_six.explain.planned.block == 6


def test_compare_pairs_wait_for_the_number_of_images(architectures):
    """`--pairs all` names the pairs among the images given: planned for 3 and for 4 images, two plans; named before
    plan_images, a clear internal error."""
    from vitcli.jobs import JobNotPlanned
    from vitcli.jobs.compare import compare_jobs

    tiny, _ = architectures
    (job,) = compare_jobs(pairs="all")
    planned = job.plan(tiny)
    with pytest.raises(JobNotPlanned, match="plan_images"):
        planned.name()
    three, four = planned.plan_images(3), planned.plan_images(4)
    assert three.pairs == [(0, 1), (0, 2), (1, 2)]
    assert len(four.pairs) == 6 and three.name() != four.name()
    assert planned.planned.pairs is None


def test_bench_plans_which_methods_run_without_touching_its_job(architectures):
    """A method that cannot run on the model (attention without a class token) is a reason in the plan, not a
    refusal; the job keeps the methods asked for, and one job planned for two models gives two plans."""
    from vitcli.jobs.bench import bench_jobs
    from vitcli.loading import describe
    from vitcli.spec import WeightsSpec

    tiny, _ = architectures
    without_class_token = describe(WeightsSpec(model_name="vit_medium_patch16_gap_256", random=True))
    (job,) = bench_jobs(method=["attention", "edge"], scores="deletion")
    before = state(job)
    on_tiny, on_gap = job.plan(tiny), job.plan(without_class_token)
    assert state(job) == before
    assert on_tiny.planned.methods == ("attention", "edge") and on_tiny.planned.unavailable == ()
    assert on_gap.planned.methods == ("edge",)
    ((method, why),) = on_gap.planned.unavailable
    assert method == "attention" and "no class token" in why
    assert on_tiny.planned.steps == 14 and on_gap.planned.steps == 14  # bench's default, at most the patches
    assert on_gap.settings()["methods"] == ["attention", "edge"] and on_gap.settings()["run_methods"] == ["edge"]
    (attention_only,) = bench_jobs(method=["attention"], scores="deletion")
    with pytest.raises(UsageError, match="no method of bench runs on .*: attention: .*no class token"):
        attention_only.plan(without_class_token)
