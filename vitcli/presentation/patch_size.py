"""compare-patch-size as people and programs see it: tables, CSV rows, the JSON document, the chart, a summary."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from vitcli.experiments.patch_size import PatchSizeComparison, PatchSizeRow
from vitcli.experiments.patch_size_adapt import ADAPTED_NOTE, AdaptedRun
from vitcli.experiments.patch_size_measure import Measurement
from vitcli.experiments.patch_size_variants import Dimensions, Variant
from vitcli.model import software_versions
from vitcli.render import weights_caption

PAD_NOTE = (
    "zero padding on the right and bottom up to a multiple of the patch size, "
    "as timm's PatchEmbed(dynamic_img_pad=True)"
)
CLOSED_FORM_METHOD = (
    "matrix products only: n * 3p^2 * D (patch embedding) + blocks * (N * D * 3A + 2 * heads * N^2 * head_dim "
    "+ N * A * D + 2 * N * D * M) + D * classes; n patches, N = n + prefix tokens, A = heads * head_dim, M = MLP width"
)
FLOP_METHOD = (
    "torch.utils.flop_counter.FlopCounterMode over one forward of a batch of one on the meta device (shapes only), "
    "attention written as explicit matmuls; FLOPs / 2 = MACs; counts matmul, addmm, bmm and convolution, "
    "not softmax, layer norm, GELU or additions"
)


def table(result: PatchSizeComparison) -> Group:
    """Tokens, attention scores and compute per patch size; with --measure and --adapt, a table each."""
    arch = result.dimensions
    native = arch.native_patch
    padding = " (--pad: zero-padded to a multiple of p)" if result.pad else ""
    tokens = Table(
        title=f"{arch.name} at {result.image_size}x{result.image_size}{padding}: tokens\n{result.note}",
        caption=f"* = patch {native}, the size the checkpoint was trained at",
    )
    for column in (
        "patch",
        "grid",
        "patch tokens n",
        "rows N (+prefix)",
        "values/patch 3p²",
        "patch-embed params",
        "all params",
    ):
        tokens.add_column(column, justify="right")
    for row in result.entries:
        variant = row.variant
        tokens.add_row(
            _patch_label(variant),
            f"{variant.grid_side}x{variant.grid_side}",
            f"{variant.patch_tokens:,}",
            f"{variant.tokens:,}",
            f"{variant.values_per_patch:,}",
            f"{variant.patch_embedding_parameters:,}",
            f"{row.parameters:,}",
        )
    scores = Table(title=f"attention scores (N² with prefix rows, n² patches only)\n{result.note}")
    for column in (
        "patch",
        "N² per head·block",
        "n² per head·block",
        f"whole model (x{arch.num_heads} heads x{arch.depth} blocks)",
        f"N² vs p{native}",
        f"n² vs p{native}",
    ):
        scores.add_column(column, justify="right")
    for row in result.entries:
        variant = row.variant
        scores.add_row(
            _patch_label(variant),
            f"{variant.scores_per_head_block:,}",
            f"{variant.patch_scores_per_head_block:,}",
            f"{variant.scores_whole_model:,}",
            f"{result.ratio(row, 'scores_per_head_block'):.2f}",
            f"{result.ratio(row, 'patch_scores_per_head_block'):.2f}",
        )
    largest_difference = max(abs(row.relative_difference) for row in result.entries)
    compute = Table(
        title="millions of multiply-accumulates per image\nclosed form, and counted = FlopCounterMode FLOPs / 2\n"
        f"{result.note}",
        caption="attention = q kᵀ and attention·v (grows with N²); rest = patch embedding, qkv, proj, MLP, head "
        f"(grows with N); largest |counted - closed| / closed: {largest_difference:.1e}",
    )
    for column in ("patch", "attention", "counted", "rest", "counted", "total", "counted", f"vs p{native}"):
        compute.add_column(column, justify="right")
    for row in result.entries:
        compute.add_row(
            _patch_label(row.variant),
            _millions(row.closed_form.attention),
            _millions(row.counted.attention),
            _millions(row.closed_form.rest),
            _millions(row.counted.rest),
            _millions(row.closed_form.total),
            _millions(row.counted.total),
            f"{result.mac_ratio(row):.2f}",
        )
    tables: list[Table] = [tokens, scores, compute]
    if result.entries[0].measurement is not None:
        first = result.entries[0].measurement
        measured = Table(
            title=f"measured on {result.device} (torch threads: {result.threads}): batch {first.batch_size}, median of "
            f"{first.runs} runs after {first.warmup} warm-up, random-init variants\n{result.note}",
            caption=f"peak memory: {first.memory_method}",
        )
        for column in (
            "patch",
            "rows N",
            "MMACs",
            f"vs p{native}",
            "ms / image",
            f"vs p{native}",
            "peak MiB",
            f"vs p{native}",
        ):
            measured.add_column(column, justify="right")
        for row in result.entries:
            measurement = row.measurement
            measured.add_row(
                _patch_label(row.variant),
                f"{row.variant.tokens:,}",
                _millions(row.closed_form.total),
                f"{result.mac_ratio(row):.2f}",
                f"{measurement.latency_ms_per_image:.3f}",
                f"{result.latency_ratio(row):.2f}",
                f"{measurement.peak_memory_bytes / 2**20:.2f}",
                f"{result.memory_ratio(row):.2f}",
            )
        tables.append(measured)
    if result.adapted is not None:
        run = result.adapted
        adapted = Table(
            title=f"{run.image.path}: the checkpoint at each patch size, {ADAPTED_NOTE}\n"
            f"(patch embedding resampled by pseudo-inverse, position embeddings resized{_native_check(result)})",
            caption=f"p(native top-1) = probability of class {run.native_top1_index} ({run.native_top1_label}), "
            f"the unmodified checkpoint's top-1 at {arch.native_image} px, patch {native}",
        )
        for column in ("patch", "top-1 class", "label", "probability", "p(native top-1)"):
            adapted.add_column(column, justify="left" if column == "label" else "right")
        for row in result.entries:
            prediction = row.adapted
            adapted.add_row(
                _patch_label(row.variant),
                str(prediction.top1_index),
                prediction.top1_label,
                f"{prediction.top1_probability:.4f}",
                f"{prediction.native_top1_probability:.4f}",
            )
        tables.append(adapted)
    caption, weights = tables[-1].caption, weights_caption(result.weights)
    tables[-1].caption = Text.assemble(caption, "\n", weights) if caption else weights
    return Group(*tables)


def _native_check(result: PatchSizeComparison) -> str:
    difference = result.adapted.native_logit_difference
    if math.isnan(difference):
        return ""
    return f"; at p{result.dimensions.native_patch} the logits differ from the checkpoint's by {difference:.2e}"


def rows(result: PatchSizeComparison) -> list[dict[str, Any]]:
    return [_row(result, row) for row in result.entries]


def _row(result: PatchSizeComparison, row: PatchSizeRow) -> dict[str, Any]:
    variant = row.variant
    record: dict[str, Any] = {
        "comparison": result.note,
        "image_size": result.image_size,
        "patch_size": variant.patch_size,
        "native": variant.patch_size == result.dimensions.native_patch,
        "padding_pixels": variant.padding,
        "grid_rows": variant.grid_side,
        "grid_cols": variant.grid_side,
        "patch_tokens": variant.patch_tokens,
        "tokens_with_prefix": variant.tokens,
        "values_per_patch": variant.values_per_patch,
        "patch_embedding_parameters": variant.patch_embedding_parameters,
        "position_embedding_parameters": variant.position_embedding_parameters,
        "parameters": row.parameters,
        "scores_per_head_block": variant.scores_per_head_block,
        "patch_scores_per_head_block": variant.patch_scores_per_head_block,
        "scores_whole_model": variant.scores_whole_model,
        "patch_scores_whole_model": variant.patch_scores_whole_model,
        "scores_ratio_vs_native": result.ratio(row, "scores_per_head_block"),
        "patch_scores_ratio_vs_native": result.ratio(row, "patch_scores_per_head_block"),
        "macs_attention_closed_form": row.closed_form.attention,
        "macs_rest_closed_form": row.closed_form.rest,
        "macs_total_closed_form": row.closed_form.total,
        "macs_attention_counted": row.counted.attention,
        "macs_rest_counted": row.counted.rest,
        "macs_total_counted": row.counted.total,
        "macs_relative_difference": row.relative_difference,
        "macs_ratio_vs_native": result.mac_ratio(row),
    }
    if row.measurement is not None:
        record |= {
            "device": result.device,
            "threads": result.threads,
            "batch_size": row.measurement.batch_size,
            "runs": row.measurement.runs,
            "warmup": row.measurement.warmup,
            "latency_ms_per_image_median": row.measurement.latency_ms_per_image,
            "latency_ratio_vs_native": result.latency_ratio(row),
            "peak_memory_bytes": row.measurement.peak_memory_bytes,
            "peak_memory_ratio_vs_native": result.memory_ratio(row),
        }
    if row.adapted is not None:
        record |= {
            "adapted": ADAPTED_NOTE,
            "top1_class_index": row.adapted.top1_index,
            "top1_label": row.adapted.top1_label,
            "top1_probability": row.adapted.top1_probability,
            "native_top1_probability": row.adapted.native_top1_probability,
        }
    return record


def document(result: PatchSizeComparison) -> dict[str, Any]:
    body: dict[str, Any] = {
        "comparison": result.note,
        "weights": result.weights,
        "architecture": _dimensions_json(result.dimensions),
        "image_size": result.image_size,
        "pad": PAD_NOTE if result.pad else False,
        "macs_method": {"closed_form": CLOSED_FORM_METHOD, "counted": FLOP_METHOD},
        "variants": [],
    }
    if result.adapted is not None:
        body["adapted"] = _adapted_json(result.adapted)
    for row in result.entries:
        entry = {key: value for key, value in _row(result, row).items() if key != "comparison"}
        if row.measurement is not None:
            entry["measurement"] = _measurement_json(row.measurement)
        body["variants"].append(entry)
    return body


def _patch_label(variant: Variant) -> str:
    native = "*" if variant.patch_size == variant.dimensions.native_patch else ""
    return f"{variant.patch_size}{native}"


def _millions(macs: int) -> str:
    return f"{macs / 1e6:,.1f}"


def figure(comparison: PatchSizeComparison) -> Any:
    """Tokens and attention scores (left) and multiply-accumulates (right) against patch size, log scales."""
    from vitcli.figures import plt, title

    patches = [row.variant.patch_size for row in comparison.entries]
    fig, (counts, compute) = plt.subplots(1, 2, figsize=(13, 5.6))
    series = [
        ("patch tokens n", [row.variant.patch_tokens for row in comparison.entries], "o-"),
        ("rows N = n + prefix", [row.variant.tokens for row in comparison.entries], "s--"),
        ("scores per head per block N²", [row.variant.scores_per_head_block for row in comparison.entries], "o-"),
        ("patch-only scores n²", [row.variant.patch_scores_per_head_block for row in comparison.entries], "s--"),
        ("scores whole model (x heads x blocks)", [row.variant.scores_whole_model for row in comparison.entries], "^-"),
    ]
    for label, values, style in series:
        counts.plot(patches, values, style, label=label)
        for patch, value in zip(patches, values, strict=True):
            if style.endswith("-") and not style.endswith("--"):
                counts.annotate(f"{value:,}", (patch, value), textcoords="offset points", xytext=(5, 5), fontsize=7)
    counts.set_ylabel("count per image")
    counts.set_title("tokens and attention scores")
    closed = [
        (
            "attention q kᵀ and attention·v (∝ N²)",
            [row.closed_form.attention for row in comparison.entries],
            [row.counted.attention for row in comparison.entries],
        ),
        (
            "rest: embedding, qkv, proj, MLP, head (∝ N)",
            [row.closed_form.rest for row in comparison.entries],
            [row.counted.rest for row in comparison.entries],
        ),
        (
            "total",
            [row.closed_form.total for row in comparison.entries],
            [row.counted.total for row in comparison.entries],
        ),
    ]
    for label, formula, counted in closed:
        line = compute.plot(patches, formula, "-", label=f"{label}: closed form")[0]
        compute.plot(
            patches, counted, "x", color=line.get_color(), markersize=10, label=f"{label}: FlopCounterMode / 2"
        )
    for patch, total in zip(patches, closed[-1][1], strict=True):
        compute.annotate(f"{total / 1e6:,.1f} M", (patch, total), textcoords="offset points", xytext=(5, 5), fontsize=7)
    compute.set_ylabel("multiply-accumulates per image")
    compute.set_title("compute per image")
    for panel in (counts, compute):
        panel.set_xscale("log", base=2)
        panel.set_yscale("log")
        panel.set_xticks(
            patches,
            [f"{patch}{' (trained)' if patch == comparison.dimensions.native_patch else ''}" for patch in patches],
        )
        panel.minorticks_off()
        padded = ", zero-padded to a multiple of p" if comparison.pad else ""
        panel.set_xlabel(f"patch size p (pixels) on a {comparison.image_size}x{comparison.image_size} image{padded}")
        panel.grid(True, which="major", alpha=0.3)
        # Room for the value labels beside the outermost points, and legends below the axes, clear of the data.
        panel.margins(x=0.15, y=0.1)
        panel.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    title(fig, f"{comparison.dimensions.name}: {comparison.note}", comparison.weights)
    fig.tight_layout()
    return fig


def summary(result: PatchSizeComparison) -> dict[str, Any]:
    """Headline numbers: the smallest and largest patch size against the native one."""
    smallest, largest = result.entries[0], result.entries[-1]
    return {
        "patch_size_native": result.dimensions.native_patch,
        "patch_size_smallest": smallest.variant.patch_size,
        "patch_size_smallest_tokens": smallest.variant.tokens,
        "patch_size_smallest_macs_ratio": result.mac_ratio(smallest),
        "patch_size_largest": largest.variant.patch_size,
        "patch_size_largest_tokens": largest.variant.tokens,
        "patch_size_largest_macs_ratio": result.mac_ratio(largest),
        "patch_size_macs_max_relative_difference": max(abs(row.relative_difference) for row in result.entries),
    }


def dimensions_provenance(dimensions: Dimensions) -> dict[str, Any]:
    """Provenance of a run that loaded no weights: the counts depend on the architecture and the versions only."""
    return {
        "model": dimensions.name,
        "weights": {"source": "none", "note": "architecture only: the counts need no weights"},
        "versions": software_versions(),
    }


def _dimensions_json(dimensions: Dimensions) -> dict[str, Any]:
    return {
        "model": dimensions.name,
        "native_patch_size": dimensions.native_patch,
        "native_image_size": dimensions.native_image,
        "in_chans": dimensions.in_chans,
        "embed_dim": dimensions.embed_dim,
        "depth": dimensions.depth,
        "num_heads": dimensions.num_heads,
        "head_dim": dimensions.head_dim,
        "mlp_hidden": dimensions.mlp_hidden,
        "prefix_tokens": dimensions.num_prefix,
        "classifier_outputs": dimensions.head_outputs,
    }


def _measurement_json(measurement: Measurement) -> dict[str, Any]:
    return {
        "batch_size": measurement.batch_size,
        "runs": measurement.runs,
        "warmup": measurement.warmup,
        "median_latency_ms_per_image": measurement.latency_ms_per_image,
        "latencies_ms_per_batch": measurement.latencies_ms,
        "peak_memory_bytes": measurement.peak_memory_bytes,
        "memory_method": measurement.memory_method,
    }


def _adapted_json(run: AdaptedRun) -> dict[str, Any]:
    return {
        "note": ADAPTED_NOTE,
        "native_top1_class_index": run.native_top1_index,
        "native_top1_label": run.native_top1_label,
        "native_logit_max_abs_difference": run.native_logit_difference,
    }
