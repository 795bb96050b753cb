"""Small pieces of presentation that every table and figure shares."""

from __future__ import annotations


def is_random(weights: str) -> bool:
    return weights.startswith("RANDOM")


def weights_caption(weights: str) -> str:
    """A table caption naming the weights; random weights are called out so nobody reads meaning into them."""
    if is_random(weights):
        return f"[bold red]{weights} WEIGHTS: untrained model, the numbers mean nothing[/bold red]"
    return f"weights: {weights}"


def weights_note(weights: str) -> str:
    """The same, as plain text for figure titles."""
    return f"{weights} WEIGHTS: untrained model" if is_random(weights) else f"weights: {weights}"
