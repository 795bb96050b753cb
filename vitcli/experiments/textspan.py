"""TextSpan (Gandelsman et al., ICLR 2024, Algorithm 1): a few texts that span what one head writes.

C (images, D) is one head's direct contributions to the image embedding, centred over the images; T (texts, D) the
text bank's unit embeddings. As the paper's code does, the texts are first projected onto the span of C's top
principal directions (at most SPAN_RANK of them), so only what the head can write counts. Then, k times: the text
whose current vector r maximises the variance of C r over the images is chosen; the variance its direction
u = r / |r| carries, |C u|^2 / images, is its share of the head's total variance |C|^2 / images; and u is projected
out of C and out of every text vector. The chosen directions are orthonormal, so the shares lie in [0, 1] and add up
to at most 1 (the rest is what the k texts leave unexplained).

The score is the paper's: Var(C r) with the remaining (not renormalized) text vector r, which weighs a text's
direction by how much of the text is left after the earlier picks and after the projection onto the head's span (a
near-copy of a chosen text, or a text the head cannot write, scores little).

Everything runs in the coordinates of the head's span (r <= SPAN_RANK numbers per text and per image, from one
SVD), and each step updates the scores in O(texts x r): a bank of thousands of texts costs little per head.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SPAN_RANK = 80  # the paper's code's default rank of the head's span (head outputs have head_dim <= 80 directions)
RANK_TOLERANCE = 1e-10  # singular values below this fraction of the largest are noise: not part of the span
STOP_TOLERANCE = 1e-12  # a best score below this fraction of the total variance: nothing left the texts can explain


@dataclass(frozen=True)
class Span:
    texts: np.ndarray  # (picked,) int: indices into the bank, in the order chosen (picked <= k)
    shares: np.ndarray  # (picked,) float: each text's direction's share of the head's total variance
    total_variance: float  # trace of the covariance of the head's contributions over the images
    rank: int  # dimension of the head's span the texts were projected onto

    @property
    def explained(self) -> float:
        """The share of the head's variance the chosen texts explain together."""
        return float(self.shares.sum())


def text_span(contributions: np.ndarray, texts: np.ndarray, k: int, rank: int = SPAN_RANK) -> Span:
    """The greedy TextSpan of one head: `contributions` (images, D), `texts` (bank, D) unit embeddings, k picks.

    Fewer than k texts come back when the texts can explain nothing more of the head (its variance in their span is
    spent, or the bank is used up)."""
    centred = np.asarray(contributions, dtype=np.float64)
    centred = centred - centred.mean(axis=0)
    images = centred.shape[0]
    total = float(np.sum(centred**2)) / images
    empty = Span(np.zeros(0, dtype=np.int64), np.zeros(0), total, 0)
    if total == 0.0:
        return empty
    _, singular, basis = np.linalg.svd(centred, full_matrices=False)
    kept = min(rank, int(np.sum(singular > RANK_TOLERANCE * singular[0])))
    singular, basis = singular[:kept], basis[:kept]
    # In span coordinates: C becomes U S, so the variance of C along a (span) vector a is |S a|^2 / images.
    coordinates = np.asarray(texts, dtype=np.float64) @ basis.T  # (bank, kept)
    gram = np.diag(singular**2) / images  # covariance of the head in span coordinates: C's directions are fixed
    # score_j = a_j' G a_j with the remaining a_j and the first G: C's projections commute with the texts' (the
    # chosen directions are orthonormal), so the remaining C never has to be formed.
    weighted = coordinates @ gram
    scores = np.einsum("ij,ij->i", coordinates, weighted)
    chosen, shares = [], []
    for _ in range(min(k, coordinates.shape[0])):
        best = int(np.argmax(scores))
        if scores[best] <= STOP_TOLERANCE * total:
            break
        vector = coordinates[best]
        direction = vector / np.linalg.norm(vector)
        chosen.append(best)
        shares.append(float(direction @ gram @ direction) / total)
        along = coordinates @ direction  # (bank,)
        coordinates = coordinates - np.outer(along, direction)
        weighted = weighted - np.outer(along, gram @ direction)
        scores = np.einsum("ij,ij->i", coordinates, weighted)
    return Span(np.array(chosen, dtype=np.int64), np.array(shares), total, kept)
