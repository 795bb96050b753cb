"""Patch and token numbering: P1..PN row by row, zero-based grid rows and columns, prefix tokens first.

For a ViT with only a class token, patch Pn is token n and CLS is token 0. Models with more prefix tokens
(distillation or register tokens) put them after CLS, so Pn is token n + (prefix tokens - 1).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vitcli.errors import UsageError

# [0-9], not \d: \d also matches digits of other scripts ("٣"), which int() reads and no name should carry.
_GRID_POSITION = re.compile(r"r([0-9]+)c([0-9]+)")
_PATCH_NUMBER = re.compile(r"p?([0-9]+)")
# Names a prefix token may have on some model: the class token, the distillation token, registers R1..Rn.
_PREFIX_NAME = re.compile(r"cls|dist|r[1-9][0-9]*")


@dataclass(frozen=True)
class PatchGrid:
    image_height: int
    image_width: int
    patch_size: int
    prefix_names: tuple[str, ...] = ("CLS",)

    @property
    def rows(self) -> int:
        return self.image_height // self.patch_size

    @property
    def cols(self) -> int:
        return self.image_width // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.rows * self.cols

    @property
    def num_prefix(self) -> int:
        return len(self.prefix_names)

    @property
    def num_tokens(self) -> int:
        return self.num_prefix + self.num_patches

    def token_of_patch(self, patch: int) -> int:
        return self.num_prefix - 1 + patch

    def patch_of_token(self, token: int) -> int | None:
        """The patch number of a token, or None for a prefix token."""
        return token - self.num_prefix + 1 if token >= self.num_prefix else None

    def position(self, patch: int) -> tuple[int, int]:
        """Zero-based (row, col) of patch Pn."""
        return divmod(patch - 1, self.cols)

    def patch_at(self, row: int, col: int) -> int:
        return row * self.cols + col + 1

    def pixel_box(self, patch: int) -> tuple[int, int, int, int]:
        """(left, top, right, bottom) in crop pixels; right and bottom are exclusive."""
        row, col = self.position(patch)
        size = self.patch_size
        return col * size, row * size, (col + 1) * size, (row + 1) * size

    def token_name(self, token: int) -> str:
        patch = self.patch_of_token(token)
        return self.prefix_names[token] if patch is None else f"P{patch}"

    def token_names(self) -> str:
        """Every token's name in order, registers and patches as runs: "CLS, R1..R4, P1..P1369"."""
        registers = [name for name in self.prefix_names if _PREFIX_NAME.fullmatch(name.lower()) and name[0] == "R"]
        others = [name for name in self.prefix_names if name not in registers]
        runs = [f"{registers[0]}..{registers[-1]}"] if len(registers) > 2 else registers
        return ", ".join([*others, *runs, f"P1..P{self.num_patches}"])

    def prefix_token(self, text: str) -> int | None:
        """The token of a prefix token's name (`cls`, `dist`, `r2`, any letter case), or None when `text` names none;
        UsageError when it names a prefix token this model does not have (R2 on a model without registers)."""
        cleaned = text.strip().lower()
        names = [name.lower() for name in self.prefix_names]
        if cleaned in names:
            return names.index(cleaned)
        if _PREFIX_NAME.fullmatch(cleaned):
            kind = {"cls": "class token (CLS)", "dist": "distillation token (DIST)"}.get(cleaned)
            lacking = kind or f"register token {cleaned.upper()}"
            raise UsageError(f"this model has no {lacking}; its tokens are {self.token_names()}")
        return None

    def describe_patch(self, patch: int) -> dict[str, int | str]:
        """The numbering facts of one patch, in the order every table and file uses."""
        row, col = self.position(patch)
        left, top, right, bottom = self.pixel_box(patch)
        return {
            "patch": f"P{patch}",
            "token": self.token_of_patch(patch),
            "row": row,
            "col": col,
            "row_1based": row + 1,
            "col_1based": col + 1,
            "left": left,
            "top": top,
            "right": right,
            "bottom": bottom,
        }

    def parse_patch(self, text: str) -> int:
        """A patch given as `74`, `P74` or a zero-based grid position `r5c3`; returns the patch number."""
        cleaned = text.strip().lower()
        valid = f"patches are P1..P{self.num_patches} or r0c0..r{self.rows - 1}c{self.cols - 1}"
        position = _GRID_POSITION.fullmatch(cleaned)
        if position:
            row, col = int(position.group(1)), int(position.group(2))
            if row >= self.rows or col >= self.cols:
                raise UsageError(f"grid position {text} is outside the {self.rows}x{self.cols} grid: {valid}")
            return self.patch_at(row, col)
        number = _PATCH_NUMBER.fullmatch(cleaned)
        if not number:
            raise UsageError(f"cannot read patch {text!r}: {valid}")
        patch = int(number.group(1))
        if not 1 <= patch <= self.num_patches:
            raise UsageError(f"patch {text} does not exist: {valid}")
        return patch
