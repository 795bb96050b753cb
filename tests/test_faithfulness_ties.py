"""Faithfulness ranks: equal AUCs share a rank (competition ranking), whatever the methods' list order."""

from __future__ import annotations

import numpy as np
from scipy.stats import rankdata

from vitcli.experiments.faithfulness import RANDOM, Curve, Faithfulness, MethodCurves, RandomBaseline


def curve(auc: float) -> Curve:
    return Curve(np.array([0.0, 1.0]), np.array([auc, auc]), auc)


def result(aucs: list[tuple[float, float]], random: tuple[float, float] | None) -> Faithfulness:
    methods = [MethodCurves(f"m{index}", [], curve(low), curve(high)) for index, (low, high) in enumerate(aucs)]
    baseline = None
    if random is not None:
        spread, per_order = np.zeros(2), np.zeros(1)
        baseline = RandomBaseline(1, 0, curve(random[0]), curve(random[1]), spread, spread, per_order, per_order)
    return Faithfulness(0, 0.5, 0.5, 1, 4, methods, baseline)


def test_equal_scores_share_rank_one():
    """Before the fix: ranks 1..7 in list order though every AUC was equal."""
    ranking = result([(0.3, 0.3)] * 6, (0.3, 0.3)).ranking()
    assert [(deletion, insertion) for _, deletion, insertion in ranking] == [(1, 1)] * 7
    assert ranking[-1][0] == RANDOM


def test_ranks_equal_scipys_min_ranking_with_ties():
    """Oracle: scipy's rankdata(method="min"), lower deletion and higher insertion AUC best."""
    aucs = [(0.2, 0.6), (0.1, 0.6), (0.2, 0.5), (0.4, 0.9), (0.1, 0.6)]
    ranking = result(aucs[:-1], aucs[-1]).ranking()
    deletion = rankdata([low for low, _ in aucs], method="min").astype(int).tolist()
    insertion = rankdata([-high for _, high in aucs], method="min").astype(int).tolist()
    assert [entry[1] for entry in ranking] == deletion == [3, 1, 3, 5, 1]
    assert [entry[2] for entry in ranking] == insertion == [2, 2, 5, 1, 2]
