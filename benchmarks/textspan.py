"""What TextSpan costs after the forwards (issue 30: 1,000 images and a 3,000-text bank under a minute): `vitcli heads`
on a CLIP ViT-B's last 4 blocks (48 heads, D = 512) runs the greedy algorithm once per head. Random contributions of
the right shape stand in for the heads' (each head writes in about head_dim = 64 directions, plus a little noise),
random unit vectors for the texts. Prints the seconds for all heads at the default k and at the paper's largest.

    .venv/bin/python benchmarks/textspan.py [IMAGES TEXTS]   (default 1000 3000)
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from vitcli.experiments.textspan import text_span

HEADS, WIDTH, HEAD_DIM = 4 * 12, 512, 64
K_VALUES = (5, 60)  # vitcli's default, and the most texts per head the paper reconstructs with


def main() -> None:
    images, bank = (int(value) for value in sys.argv[1:3]) if len(sys.argv) > 2 else (1000, 3000)
    generator = np.random.default_rng(0)
    texts = generator.normal(size=(bank, WIDTH))
    texts /= np.linalg.norm(texts, axis=1, keepdims=True)
    heads = [
        generator.normal(size=(images, HEAD_DIM)) @ generator.normal(size=(HEAD_DIM, WIDTH))
        + 0.01 * generator.normal(size=(images, WIDTH))
        for _ in range(HEADS)
    ]
    print(f"load average {os.getloadavg()[0]:.1f}; {HEADS} heads, {images} images, {bank} texts, D = {WIDTH}")
    for k in K_VALUES:
        started = time.perf_counter()
        for contributions in heads:
            text_span(contributions, texts, k)
        seconds = time.perf_counter() - started
        print(f"k = {k:>2}: {seconds:.1f} s for all heads ({seconds / HEADS * 1000:.0f} ms per head)")


if __name__ == "__main__":
    main()
