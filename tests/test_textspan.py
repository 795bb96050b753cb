"""TextSpan's greedy algorithm (vitcli.experiments.textspan) against planted structure and a naive implementation."""

from __future__ import annotations

import numpy as np
import pytest

from vitcli.experiments.textspan import RANK_TOLERANCE, STOP_TOLERANCE, text_span


def unit_rows(generator: np.random.Generator, count: int, width: int) -> np.ndarray:
    rows = generator.normal(size=(count, width))
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def naive_text_span(contributions, texts, k, rank):
    """The paper's loop as its code writes it, in the full D dimensions: project the texts on the span of the top
    principal directions, then k times take the text whose current vector has the largest variance of C r, and
    project it out of C and of every text."""
    data = contributions - contributions.mean(axis=0)
    total = (data**2).sum() / data.shape[0]
    _, singular, vh = np.linalg.svd(data, full_matrices=False)
    vh = vh[: min(rank, int((singular > RANK_TOLERANCE * singular[0]).sum()))]
    texts = (vh.T @ np.linalg.inv(vh @ vh.T) @ vh @ texts.T).T
    picked, shares = [], []
    for _ in range(k):
        variances = (data @ texts.T).var(axis=0)
        best = int(np.argmax(variances))
        if variances[best] <= STOP_TOLERANCE * total:
            break
        text = texts[best]
        norm = text @ text
        along = data @ text / norm
        shares.append((along**2).sum() * norm / data.shape[0] / total)
        picked.append(best)
        data = data - np.outer(along, text)
        texts = texts - np.outer(texts @ text / norm, text)
    return picked, np.array(shares)


def test_planted_texts_come_first_with_their_variance_shares():
    generator = np.random.default_rng(0)
    images, width = 400, 48
    bank = unit_rows(generator, 30, width)
    first, second = 7, 19  # the head writes along these two texts, with standard deviations 2 and 1
    strong, weak = 2.0 * generator.normal(size=images), 1.0 * generator.normal(size=images)
    noise = 0.01 * generator.normal(size=(images, width))
    contributions = np.outer(strong, bank[first]) + np.outer(weak, bank[second]) + noise + 5.0  # an offset too
    span = text_span(contributions, bank, k=3)
    assert span.texts[:2].tolist() == [first, second]
    # Expected shares, from the data by Gram-Schmidt: the first text's direction, then the second's part
    # orthogonal to it; each as variance along it over the total variance.
    centred = contributions - contributions.mean(axis=0)
    total = (centred**2).sum()
    other = bank[second] - (bank[second] @ bank[first]) * bank[first]
    other /= np.linalg.norm(other)
    expected = [((centred @ bank[first]) ** 2).sum() / total, ((centred @ other) ** 2).sum() / total]
    np.testing.assert_allclose(span.shares[:2], expected, rtol=1e-9)
    # and they are about what was planted: variances 4 and 1 (less the overlap of two random texts)
    planted = np.array([strong.var(), weak.var()])
    assert span.shares[0] == pytest.approx(planted[0] / planted.sum(), abs=0.05)
    assert span.shares[1] == pytest.approx(planted[1] / planted.sum(), abs=0.05)
    assert span.shares[2] < 1e-3  # what is left is the noise


@pytest.mark.parametrize(
    ("images", "width", "bank", "k", "rank"),
    [(60, 32, 200, 10, 80), (60, 32, 200, 10, 12), (20, 32, 50, 25, 80), (100, 16, 10, 10, 80)],
)
def test_equal_to_the_naive_loop_on_random_data(images, width, bank, k, rank):
    generator = np.random.default_rng(images + width + bank + k + rank)
    contributions = generator.normal(size=(images, width)) * np.linspace(3, 0.1, width)
    texts = unit_rows(generator, bank, width)
    span = text_span(contributions, texts, k, rank)
    picked, shares = naive_text_span(contributions, texts, k, rank)
    assert span.texts.tolist() == picked
    np.testing.assert_allclose(span.shares, shares, rtol=1e-9, atol=1e-12)
    assert span.rank == min(rank, images - 1, width)  # centred: images - 1 directions at most


def test_shares_lie_in_0_1_and_add_up_to_at_most_1():
    generator = np.random.default_rng(3)
    for trial in range(20):
        width = int(generator.integers(4, 40))
        contributions = generator.normal(size=(int(generator.integers(3, 60)), width))
        texts = unit_rows(generator, int(generator.integers(1, 80)), width)
        span = text_span(contributions, texts, k=int(generator.integers(1, 50)))
        assert np.all(span.shares >= 0) and np.all(span.shares <= 1), trial
        assert span.explained <= 1 + 1e-12, trial
        assert len(set(span.texts.tolist())) == len(span.texts), trial  # a text is never chosen twice


def test_a_bank_that_spans_the_head_explains_all_of_it():
    generator = np.random.default_rng(4)
    contributions = generator.normal(size=(50, 8))
    span = text_span(contributions, np.eye(8), k=8)
    assert span.explained == pytest.approx(1.0, abs=1e-12)
    assert sorted(span.texts.tolist()) == list(range(8))


def test_a_constant_head_has_nothing_to_explain():
    span = text_span(np.ones((10, 4)), np.eye(4), k=3)
    assert span.total_variance == 0 and span.texts.size == 0 and span.explained == 0
