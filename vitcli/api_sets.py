"""The Python API's experiments about more than one image: anatomy and heads over images, compare over two or more,
patch's CLEAN and CORRUPT pair, and probe's data folder. Each builds the command's own Jobs and runs them through a
session into memory (vitcli.api.compute_and_publish), as the one-image functions of vitcli.api do."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitcli.api import (
    Result,
    architecture_of,
    call_text,
    check_model,
    command_line_options,
    command_options,
    compute_and_publish,
)
from vitcli.errors import UsageError

if TYPE_CHECKING:
    from vitcli.jobs import Job
    from vitcli.model import VitModel

__all__ = ["anatomy", "compare", "compare_patch_size", "heads", "patch", "probe"]


def anatomy(
    model: VitModel, images: str | Path | list[str | Path] | None = None, **options: Any
) -> Result | dict[str, Result]:
    """`vitcli anatomy`: filters, positions (the weights alone), distance, cka, pca, norms (over `images`: files,
    folders or globs). Options: view (one name: a Result; a list or none: a dict of Results by view), norm_factor,
    pca_threshold, cka_minibatch. Each Result's to_frame() is the view's CSV."""
    from vitcli.context import plan_jobs
    from vitcli.images import resolve_images
    from vitcli.jobs.anatomy import anatomy_jobs, check_image_count

    check_model(model)
    single = isinstance(options.get("view"), str)
    given = [images] if isinstance(images, (str, os.PathLike)) else list(images or [])
    if not all(isinstance(item, (str, os.PathLike)) for item in given):
        raise UsageError("images must be paths of image files or folders (str or pathlib.Path), or a list of them")
    paths = list(dict.fromkeys(resolve_images([str(item) for item in given]))) if given else []
    converted = command_options("anatomy", anatomy_jobs, options)
    jobs = plan_jobs(architecture_of(model), anatomy_jobs(**converted, with_images=bool(paths)))
    check_image_count([job.view for job in jobs], len(paths))  # type: ignore[attr-defined]
    call = call_text("anatomy", None, {"images": [str(item) for item in given], **options})
    results = {job.view.value: compute_and_publish(job, model, None, call, paths) for job in jobs}  # type: ignore[attr-defined]
    return next(iter(results.values())) if single else results


def heads(model: VitModel, images: str | Path | list[str | Path], **options: Any) -> Result:
    """`vitcli heads`: each head of the last blocks described by texts (TextSpan) over `images` (files, folders or
    globs). Options: texts (the bank file, required), blocks, k. The bank's embeddings are computed on each call."""
    return _over_images("heads", model, images, options, lambda job: job.check_texts(model))  # type: ignore[attr-defined]


def compare(model: VitModel, images: str | Path | list[str | Path], **options: Any) -> Result:
    """`vitcli compare`: two or more images side by side (`images`: files, folders or globs, in order: the first is
    A, the second B). Options: classes (indices or labels, one or a list), top_k, pairs ("A~C,B~D", "all")."""
    return _over_images("compare", model, images, options)


def compare_patch_size(model: VitModel, adapt: str | Path | None = None, **options: Any) -> Result:
    """`vitcli compare-patch-size`: the model's architecture at several patch sizes, counted (its weights are not
    read: the files are the command's, which loads none). Options: patch_sizes ("8,16,32"), image_size, pad, measure,
    runs, warmup; `adapt`, an image: the checkpoint resampled to each patch size and run on it (--adapt IMAGE)."""
    from vitcli.context import plan_jobs
    from vitcli.job_registry import job_builder

    check_model(model)
    if adapt is not None and not isinstance(adapt, (str, os.PathLike)):
        raise UsageError(f"adapt must be the path of an image file (a str or pathlib.Path), not {adapt!r}")
    builder = job_builder("compare-patch-size")
    (job,) = builder(
        **command_options("compare-patch-size", builder, options), adapt=None if adapt is None else str(adapt)
    )
    (job,) = plan_jobs(architecture_of(model), [job])
    call = call_text("compare-patch-size", None, options if adapt is None else {"adapt": str(adapt), **options})
    return compute_and_publish(job, model, adapt, call)


def patch(model: VitModel, clean: str | Path, corrupt: str | Path, **options: Any) -> Result:
    """`vitcli patch CLEAN CORRUPT`: CLEAN's activations put back into CORRUPT's run, site by site. Options: target,
    contrast, sites, method (one or a list), and the embedding targets (target_image, target_text, ...)."""
    from vitcli.context import plan_jobs
    from vitcli.jobs.patch import clean_and_corrupt, patch_pair_job

    check_model(model)
    for role, path in (("clean", clean), ("corrupt", corrupt)):
        if not isinstance(path, (str, os.PathLike)):
            raise UsageError(f"{role} must be the path of an image file (a str or pathlib.Path), not {path!r}")
    pair = [str(clean), str(corrupt)]
    known = [name for name in inspect.signature(patch_pair_job).parameters if name != "pair"]
    unknown = [key for key in options if key not in known]
    if unknown:
        raise UsageError(f"`patch` has no option {unknown[0]!r} (its options: {', '.join(sorted(known))})")
    (job,) = plan_jobs(architecture_of(model), [patch_pair_job(pair, **command_line_options("patch", options))])
    call = call_text("patch", None, {"clean": str(clean), "corrupt": str(corrupt), **options})
    return compute_and_publish(job, model, None, call, list(clean_and_corrupt(pair)))


def probe(model: VitModel, data_dir: str | Path, **options: Any) -> Result:
    """`vitcli probe DATA_DIR`: a linear probe on the frozen model's features of an ImageFolder (one subfolder of
    images per class). Options: val_fraction, split_seed, weight_decay. The command's files about the probe itself;
    unlike the command, it keeps no feature cache and writes no checkpoint (the command and `vitcli run` do)."""
    from vitcli.context import plan_jobs
    from vitcli.job_registry import job_builder

    check_model(model)
    if not isinstance(data_dir, (str, os.PathLike)):
        raise UsageError(f"data_dir must be the path of a folder (a str or pathlib.Path), not {data_dir!r}")
    builder = job_builder("probe")
    jobs = builder(**command_options("probe", builder, {"data_dir": str(data_dir), **options}))
    (job,) = plan_jobs(architecture_of(model), jobs)
    call = call_text("probe", None, {"data_dir": str(data_dir), **options})
    return compute_and_publish(job, model, None, call)


def _over_images(
    command: str,
    model: VitModel,
    images: str | Path | list[str | Path],
    options: dict[str, Any],
    check_against_model: Callable[[Job], None] | None = None,
) -> Result:
    """An experiment about `images` together (a Job of scope "set"), as the command runs it."""
    from vitcli.context import plan_jobs
    from vitcli.images import resolve_images
    from vitcli.job_registry import job_builder

    check_model(model)
    given = [images] if isinstance(images, (str, os.PathLike)) else list(images)
    if not all(isinstance(item, (str, os.PathLike)) for item in given):
        raise UsageError("images must be paths of image files or folders (str or pathlib.Path), or a list of them")
    paths = list(dict.fromkeys(resolve_images([str(item) for item in given])))
    builder = job_builder(command)
    (job,) = plan_jobs(architecture_of(model), builder(**command_options(command, builder, options)))
    job.check_images(len(paths))
    job = job.plan_images(len(paths))
    if check_against_model is not None:
        check_against_model(job)
    call = call_text(command, None, {"images": [str(item) for item in given], **options})
    return compute_and_publish(job, model, None, call, paths)
