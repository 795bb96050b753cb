"""The model wrapper every command shares: a loaded timm ViT with its preprocessing, facts, provenance and forwards.

`VitModel.logits` runs the model's own (fused) forward; `VitModel.trace` the explicit forward written out by hand
(vitcli.explicit_forward), which shows every intermediate row.
"""

from __future__ import annotations

import hashlib
import math
import platform
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from itertools import chain, islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

import timm
import torch
import torch.nn.functional as F  # noqa: N812  (the usual name)
from timm.layers import Attention, PatchEmbed
from timm.models.vision_transformer import Block, VisionTransformer
from torch import Tensor, nn

from vitcli import explicit_forward
from vitcli.capture import attention_self_check, family_of
from vitcli.errors import VitcliError
from vitcli.explicit_forward import BlockTrace, Trace
from vitcli.filenames import escaped_path
from vitcli.grid import PatchGrid
from vitcli.images import ImageSource, load_rgb
from vitcli.spec import WeightsSpec
from vitcli.text_tower import TextTower

if TYPE_CHECKING:
    from vitcli.zero_shot import ZeroShot


@dataclass
class PreparedImage:
    """An image as the model sees it."""

    source: ImageSource
    crop: Tensor  # (3, H, W) in [0, 1]: the resized, centre-cropped image before normalization
    input: Tensor  # (3, H, W): `crop` normalized with the checkpoint's mean and std

    def crop_uint8(self):
        """The crop as an (H, W, 3) uint8 array, for figures."""
        return (self.crop.permute(1, 2, 0) * 255).round().clamp(0, 255).to(torch.uint8).numpy()


class VitModel:
    """One loaded timm ViT with its preprocessing, labels and provenance."""

    def __init__(self, net: VisionTransformer, spec: WeightsSpec, device: torch.device, batch_size: int):
        self.net = net.eval().to(device)
        self.spec = spec
        self.device = device
        self.batch_size = batch_size
        self.data_config = timm.data.resolve_data_config(model=net)
        if net.patch_embed.img_size is not None:
            # A net built with img_size=... keeps its checkpoint's pretrained_cfg: the net's own size wins.
            self.data_config["input_size"] = (3, *net.patch_embed.img_size)
        transform = timm.data.create_transform(**self.data_config, is_training=False)
        steps = list(transform.transforms)
        self._to_crop = type(transform)(steps[:-1])
        self._normalize = steps[-1]
        self.family = family_of(net)
        self.grid = self.family.grid()
        # Decided once per model: trace() asks for every batch.
        self._attention_refusal = _attention_refusal(net, spec.model_name)
        # The text side of an image-text model (open_clip's CLIP and SigLIP), set by its loader; None for the rest.
        self.text: TextTower | None = None
        # With zero-shot labels (vitcli.zero_shot): the labels, templates and how probabilities are made.
        self.zero_shot: ZeroShot | None = None

    # ----- facts about the architecture

    @property
    def name(self) -> str:
        return self.spec.model_name

    @property
    def depth(self) -> int:
        return len(self.family.blocks())

    @property
    def num_heads(self) -> int:
        return self.family.places()[0].heads

    @property
    def embed_dim(self) -> int:
        return self.family.width

    @property
    def num_classes(self) -> int:
        return self.family.num_classes

    @property
    def map_grid(self) -> PatchGrid:
        """The grid explanation maps, their curves and occlusion's covers use: the input's patch grid, or for
        families of stages (Swin) the last stage's grid, where the final rows and Grad-CAM are (7x7 of 32 pixels)."""
        if "plain_rows" in self.family.features:
            return self.grid
        return self.family.places()[-1].grid

    @property
    def mean(self) -> tuple[float, float, float]:
        return tuple(self.data_config["mean"])

    @property
    def std(self) -> tuple[float, float, float]:
        return tuple(self.data_config["std"])

    @property
    def patch_projection(self) -> tuple[Tensor, Tensor]:
        """(W_E, b_E): W_E is (3 p^2, D) for channel-major rows, the Conv2d kernel reshaped."""
        proj = self.net.patch_embed.proj
        weight = proj.weight.detach().reshape(proj.out_channels, -1).T
        bias = proj.bias.detach() if proj.bias is not None else torch.zeros(proj.out_channels, device=weight.device)
        return weight, bias

    @cached_property
    def labels(self) -> list[str]:
        """One name per class, by the loader's rule (labels files, ImageNet's names, "class N"); load_model fills it
        before the weights load, so a bad labels file fails early."""
        from vitcli.classes import class_names

        return list(class_names(self.spec, self.num_classes, self.net.pretrained_cfg))

    @cached_property
    def parameter_sha256(self) -> str:
        """SHA-256 over the state dict sorted by name: each name's UTF-8 bytes, then the tensor's bytes as stored."""
        return state_dict_sha256(self.net.state_dict())

    def provenance(self) -> dict[str, Any]:
        return {
            "model": self.name,
            "weights": self.weights_provenance(),
            "parameters_sha256": self.parameter_sha256,
            "device": str(self.device),
            "preprocessing": {key: _plain(value) for key, value in self.data_config.items()},
            "versions": software_versions(),
        }

    def weights_provenance(self) -> dict[str, Any]:
        if self.spec.random:
            return {"source": "random", "seed": self.spec.seed, "note": "untrained weights: outputs are meaningless"}
        if self.spec.checkpoint is not None:
            checkpoint: dict[str, Any] = {"source": "checkpoint", "path": escaped_path(self.spec.checkpoint.resolve())}
            if self.spec.recorded is not None:
                checkpoint["recorded"] = dict(self.spec.recorded)  # the backbone and settings it was made with
            if self.spec.untrained_backbone_seed is not None:
                checkpoint["note"] = "untrained (random) backbone: outputs are meaningless"
            return checkpoint
        cfg = self.net.pretrained_cfg
        return {"source": "pretrained", "hf_hub_id": cfg.get("hf_hub_id"), "tag": cfg.get("tag")}

    def backbone_record(self) -> dict[str, Any]:
        """These weights as a checkpoint made from them records its backbone: model, weights source, the seed of
        random weights (also through a checkpoint that records one), parameter hash and label."""
        seed = self.spec.seed if self.spec.random else self.spec.untrained_backbone_seed
        return {
            "model": self.name,
            "weights": self.weights_provenance(),
            "weights_label": self.spec.label,
            "untrained_seed": seed,
            "parameters_sha256": self.parameter_sha256,
        }

    # ----- images

    def prepare(self, path: Path) -> PreparedImage:
        """Load an image and preprocess it exactly as timm's eval transform for this checkpoint."""
        image, source = load_rgb(path)
        crop = self._to_crop(image)
        return PreparedImage(source, crop, self._normalize(crop))

    def crop_mask(self, labels: Tensor) -> Tensor:
        """An (h, w) label mask at the decoded image's size through the eval transform's resize and centre crop, with
        nearest-neighbour interpolation (labels stay labels): (H, W) like the model's input."""
        from torchvision.transforms import CenterCrop, InterpolationMode, Resize
        from torchvision.transforms import functional as transforms

        mask = labels[None]
        for step in self._to_crop.transforms:
            if isinstance(step, Resize):
                mask = transforms.resize(mask, step.size, InterpolationMode.NEAREST, step.max_size, antialias=False)
            elif isinstance(step, CenterCrop):
                mask = transforms.center_crop(mask, list(step.size))
            elif "ToTensor" not in type(step).__name__:
                raise VitcliError(f"cannot follow the eval transform's {type(step).__name__} with a mask")
        return mask[0]

    # ----- forwards

    def logits(self, inputs: Tensor) -> Tensor:
        """The model's own forward over (B, 3, H, W) normalized inputs, in chunks of at most batch_size; CPU float32."""
        # Fewer images than batch_size x streams: split them evenly, so that every stream has a share.
        size = max(1, min(self.batch_size, math.ceil(len(inputs) / self.streams)))
        return torch.cat(list(self.stream(self.net, inputs.split(size))))

    def probabilities(self, logits: Tensor) -> Tensor:
        """Class probabilities of (..., classes) logits as the model defines them: a softmax over the classes, or,
        for SigLIP's zero-shot labels, an independent sigmoid per label (vitcli.zero_shot)."""
        return self.zero_shot.probabilities(logits) if self.zero_shot is not None else logits.softmax(dim=-1)

    # ----- forwards of many copies of one image (covers, deletion curves)

    def embed(self, inputs: Tensor) -> Tensor:
        """Block 1's input rows (B, N, D) for (B, 3, H, W) normalized inputs, by the model's own layers."""
        net = self.net
        if not isinstance(net, VisionTransformer):
            return self.family.embed(inputs)
        return net.norm_pre(net.patch_drop(net._pos_embed(net.patch_embed(inputs))))

    @cached_property
    def embeds_patches_alone(self) -> bool:
        """Whether row n of embed() depends on patch n's pixels alone (a plain patch projection, kernel = stride):
        then a covered patch changes exactly one row, and covers can be applied to the rows instead of the pixels."""
        embed = self.net.patch_embed
        size = self.grid.patch_size
        return (
            "plain_rows" in self.family.features  # rows_logits runs plain blocks on one grid
            and type(embed) is PatchEmbed
            and embed.proj.kernel_size == embed.proj.stride == (size, size)
            and not embed.dynamic_img_pad
        )

    def rows_logits(self, rows: Tensor) -> Tensor:
        """Logits (B, classes) from block 1's input rows (B, N, D).

        When the head reads the class token alone, the last block computes only that row: its keys and values need
        every row, but its query, attention output, MLP and the final norm only row 0. That skips about 7% of a
        ViT-Tiny forward; tests hold the logits equal to the model's own forward.
        """
        net = self.net
        if not self._head_reads_row_0:
            return self.family.run_from(1, rows)
        return net.forward_head(net.norm(row_0_of_block(net.blocks[-1], net.blocks[:-1](rows))))

    def image_logits(self, inputs: Tensor) -> Tensor:
        """Logits of (B, 3, H, W) normalized inputs through embed() and rows_logits(), or the family's own forward
        where rows_logits cannot follow the blocks (Swin's windows and stages; hf: and open_clip: towers)."""
        if not isinstance(self.net, VisionTransformer) or "plain_rows" not in self.family.features:
            return self.family.forward(inputs)
        return self.rows_logits(self.embed(inputs))

    @cached_property
    def _head_reads_row_0(self) -> bool:
        net = self.net
        return (
            type(net) is VisionTransformer
            and net.attn_pool is None
            and net.global_pool == "token"
            and self._attention_refusal is None
        )

    def stream(self, forward: Callable[[Tensor], Any], batches: Iterable[Tensor]) -> Iterator[Any]:
        """forward(batch) as CPU float32 (a tensor or a tuple of tensors), without gradients, for each batch in order.

        On a CPU with T >= 2 torch threads, two batches run at once with T / 2 threads each: one batch's serial
        parts (small element-wise operations, Python between operations, the threads waiting on each other) then
        overlap the other's products. On 2 cores this ran ViT-Tiny's forward 5-12% faster than one batch on both
        threads (benchmarks/occlusion.py); more streams were not measured. At most two batches are taken from
        `batches` ahead of the one being returned, so memory stays bounded. A lone batch runs on every thread.
        """
        waiting = iter(batches)
        first = list(islice(waiting, self.streams))
        if len(first) < 2:  # one batch (or one stream): every thread on it
            yield from (self._forward(forward, batch) for batch in chain(first, waiting))
            return
        threads = torch.get_num_threads()
        torch.set_num_threads(threads // len(first))
        try:
            with ThreadPoolExecutor(len(first), thread_name_prefix="vitcli-forward") as pool:
                running = deque(pool.submit(self._forward, forward, batch) for batch in first)
                while running:
                    done = running.popleft().result()
                    running.extend(pool.submit(self._forward, forward, batch) for batch in islice(waiting, 1))
                    yield done
        finally:
            torch.set_num_threads(threads)

    @property
    def streams(self) -> int:
        """How many batches stream() runs at once: two on a CPU with two or more torch threads, else one."""
        return 2 if self.device.type == "cpu" and torch.get_num_threads() >= 2 else 1

    def _forward(self, forward: Callable[[Tensor], Any], batch: Tensor) -> Any:
        """forward(batch) as CPU float32: a tensor, or a tuple of tensors (several activations of one forward)."""
        with torch.inference_mode():  # per thread: inference mode does not cross into the pool's threads
            output = forward(batch.to(self.device))
            if isinstance(output, tuple):
                return tuple(part.float().cpu() for part in output)
            return output.float().cpu()

    def flatten_patches(self, inputs: Tensor) -> Tensor:
        """(B, 3, H, W) -> (B, patches, 3 p^2), each patch channel-major: all R rows, then G, then B."""
        return explicit_forward.flatten_patches(inputs, self.grid.patch_size)

    def trace(self, inputs: Tensor, keep: Collection[int] = (), logits: bool = False) -> Trace:
        """The explicit forward over (B, 3, H, W) inputs, keeping every intermediate of the zero-based blocks in `keep`
        (vitcli.explicit_forward): it stops after the last kept block (with nothing kept, after the embedding);
        logits=True runs every block and the head as well and fills Trace.logits."""
        return explicit_forward.trace(self, inputs, keep, logits)

    def attention_self_check(self, block: BlockTrace) -> Tensor:
        """Per image of a traced batch, the largest |explicit - model's own| attention-module output: (B,) float64,
        by the capture layer's check (one call of the module over the whole batch)."""
        return attention_self_check(self.family, block.index + 1, block.normed, block.attention_output)

    def require_standard_blocks(self) -> None:
        """Refuse models whose blocks the explicit forward cannot reproduce (decided once, when the model was built)."""
        if self._attention_refusal is not None:
            raise VitcliError(self._attention_refusal)


def row_0_of_block(block: Block, rows: Tensor) -> Tensor:
    """A standard block's output row 0 alone, (B, 1, D): keys and values from every input row, all else from row 0."""
    attention = block.attn
    batch, tokens, _ = rows.shape
    heads, head_dim, width = attention.num_heads, attention.head_dim, attention.attn_dim
    normed = block.norm1(rows)
    weight, bias = attention.qkv.weight, attention.qkv.bias
    q = F.linear(normed[:, :1], weight[:width], None if bias is None else bias[:width])
    kv = F.linear(normed, weight[width:], None if bias is None else bias[width:])
    q = q.reshape(batch, 1, heads, head_dim).transpose(1, 2)
    k, v = kv.reshape(batch, tokens, 2, heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    q, k = attention.q_norm(q), attention.k_norm(k)
    mixed = F.scaled_dot_product_attention(q, k, v, scale=attention.scale).transpose(1, 2).reshape(batch, 1, width)
    row = rows[:, :1] + block.drop_path1(block.ls1(attention.proj(attention.norm(mixed))))
    return row + block.drop_path2(block.ls2(block.mlp(block.norm2(row))))


def state_dict_sha256(state: dict[str, Tensor]) -> str:
    digest = hashlib.sha256()
    for name in sorted(state):
        digest.update(name.encode("utf-8"))
        tensor = state[name].detach().cpu().contiguous()
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _attention_refusal(net: nn.Module, name: str) -> str | None:
    """Why the explicit forward cannot follow this model's blocks, or None: it writes out timm's standard ones."""
    if not isinstance(net, VisionTransformer):
        return f"cannot write out the forward of {name} ({type(net).__name__}): the explicit forward follows timm's ViT"
    for index, block in enumerate(net.blocks):
        attention = getattr(block, "attn", None)
        if type(block) is not Block or type(attention) is not Attention or attention.gate is not None:
            return (
                f"cannot capture attention in {name}: block {index + 1} is a {type(block).__name__} "
                f"with {type(attention).__name__}; vitcli follows timm's standard Block and Attention"
            )
    return None


def patch_grid(net: nn.Module) -> PatchGrid:
    """The patch grid of a net (loaded or a meta skeleton) with the names of its prefix tokens, by its family."""
    return family_of(net).grid()


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def software_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        vitcli_version = version("vitcli")
    except PackageNotFoundError:
        vitcli_version = "unknown"
    return {
        "vitcli": vitcli_version,
        "timm": timm.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
