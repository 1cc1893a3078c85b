"""The decision layer on synthetic paired scores whose answer is known (issue 30): the paired confidence interval
against a stated minimum effect, non-inferiority for quality, Holm's correction across the candidates of one
comparison, and a ranking that timing cannot flip."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps
from support.synthetic_comparisons import comparison, false_adopt_rate

import tropt
from tropt.errors import TroptError
from tropt.experiments.stats import ADOPT, INCONCLUSIVE, MIN_EFFECT, REJECT_QUALITY, holm


def _spread_seeds(n: int, shift: float, jitter: float, seed: int = 1) -> tuple[dict, dict]:
    """A baseline whose seeds spread by 0.1 and a candidate ``shift`` above it on every seed (± ``jitter``)."""
    rng = np.random.default_rng(seed)
    base = 1.0 + rng.normal(0.0, 0.1, n)
    cand = base + shift + rng.normal(0.0, jitter, n)
    return dict(enumerate(base.tolist())), dict(enumerate(cand.tolist()))


def test_a_consistent_small_gain_over_a_large_seed_spread_is_adopted():
    # Lower loss by 0.01 on 10 of 10 seeds, while the seeds themselves spread by 0.1: the pairing removes the spread.
    base, cand = _spread_seeds(10, -0.01, 0.002)
    assert all(cand[s] < base[s] for s in base)
    d = comparison({"baseline": base, "cand": cand}).decision().iloc[0]
    assert d["p_value"] < 1e-4 and d["noise"] > 5 * d["gain"]  # the unpaired seed spread dwarfs the gain
    assert d["verdict"] == ADOPT, d["reason"]
    # The interval is scipy's paired t interval, and its lower bound clears the stated minimum effect.
    ci = sps.ttest_rel(list(base.values()), list(cand.values())).confidence_interval()
    assert math.isclose(d["ci_low"], ci.low) and math.isclose(d["ci_high"], ci.high)
    assert d["ci_low"] > d["min_effect"] > 0
    assert "min_effect" in d["reason"]


def test_a_consistent_drop_beyond_the_guardrail_is_rejected_for_quality():
    # Higher loss by 0.02 on 5 of 5 seeds; the guardrail allows 0.005; the seeds spread by 0.1.
    base, cand = _spread_seeds(5, 0.02, 0.002)
    g = tropt.Guardrails(max_quality_drop=0.005)
    d = comparison({"baseline": base, "worse": cand}, guardrails=g).decision().iloc[0]
    assert d["ci_high"] < -0.005 and d["noise"] > 2 * abs(d["gain"])
    assert d["verdict"] == REJECT_QUALITY, d["reason"]
    assert "guardrail" in d["reason"]


def test_a_drop_whose_interval_reaches_inside_the_guardrail_is_not_rejected():
    # Non-inferiority: rejected only when the whole interval lies beyond the allowed drop.
    base, cand = _spread_seeds(5, 0.004, 0.003)
    d = comparison({"baseline": base, "worse": cand},
                   guardrails=tropt.Guardrails(max_quality_drop=0.005)).decision().iloc[0]
    assert d["ci_low"] < -0.005 < d["ci_high"]
    assert d["verdict"] == INCONCLUSIVE, d["reason"]


def test_a_gain_below_the_stated_minimum_effect_is_not_adopted():
    base, cand = _spread_seeds(10, -0.01, 0.002)
    d = comparison({"baseline": base, "cand": cand},
                   guardrails=tropt.Guardrails(min_effect=0.02)).decision().iloc[0]
    assert d["ci_low"] > 0 and d["ci_high"] < 0.02
    assert d["verdict"] == INCONCLUSIVE and "min_effect" in d["reason"]
    # Relative: a fraction of the baseline's mean (about 1.0 here), like max_quality_drop.
    rel = comparison({"baseline": base, "cand": cand},
                     guardrails=tropt.Guardrails(min_effect=0.002, relative=True)).decision().iloc[0]
    assert rel["verdict"] == ADOPT and math.isclose(rel["min_effect"], 0.002 * abs(rel["baseline_mean"]))


def test_the_default_minimum_effect_is_stated_and_never_the_seed_spread():
    base, cand = _spread_seeds(10, -0.01, 0.002)
    d = comparison({"baseline": base, "cand": cand}).decision().iloc[0]
    assert tropt.Guardrails().min_effect is None
    assert math.isclose(d["min_effect"], MIN_EFFECT * abs(d["baseline_mean"]))
    assert d["min_effect"] < d["noise"] / 5


def test_identical_candidates_are_never_adopted():
    base, _ = _spread_seeds(10, 0.0, 0.0)
    same = comparison({"baseline": base, "same": dict(base)}).decision().iloc[0]
    assert same["verdict"] == INCONCLUSIVE and same["gain"] == 0
    # A deterministic, consistent but negligible difference (1e-9 on every seed) is below the minimum effect.
    tiny = comparison({"baseline": base, "tiny": {s: v - 1e-9 for s, v in base.items()}}).decision().iloc[0]
    assert tiny["verdict"] == INCONCLUSIVE, tiny["reason"]


def test_one_null_candidate_is_rarely_adopted():
    assert false_adopt_rate(1, 200) <= 0.05


def test_holm_known_answer():
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    out = holm([0.02, math.nan, 0.5])  # a candidate with no test does not count in the family
    assert out[0] == pytest.approx(0.04) and math.isnan(out[1]) and out[2] == pytest.approx(0.5)
    assert holm([0.6, 0.7]) == pytest.approx([1.0, 1.0])  # capped at 1
    multitest = pytest.importorskip("statsmodels.stats.multitest")
    p = np.random.default_rng(0).uniform(0, 0.2, 8).tolist()
    assert holm(p) == pytest.approx(list(multitest.multipletests(p, method="holm")[1]))


def test_eight_null_candidates_keep_the_family_wise_false_adopt_rate_at_5_percent():
    # Without a correction each candidate is judged alone and the chance that one of 8 is adopted is far above 5%.
    uncorrected = false_adopt_rate(8, 200, corrected=False)
    corrected = false_adopt_rate(8, 200)
    assert corrected <= 0.05 < uncorrected, (corrected, uncorrected)


def test_corrected_p_values_are_reported_in_the_decision_and_the_table():
    rng = np.random.default_rng(3)
    base = dict(enumerate((1.0 + rng.normal(0, 0.05, 5)).tolist()))
    scores = {"baseline": base, **{f"c{i}": {s: v - 0.01 * i + rng.normal(0, 0.01) for s, v in base.items()}
                                   for i in range(4)}}
    comp = comparison(scores)
    d = comp.decision().set_index("candidate")
    assert d["p_adjusted"].tolist() == pytest.approx(holm(d["p_value"].tolist()))
    assert (d["p_adjusted"] >= d["p_value"]).all() and (d["family_size"] == 4).all()
    frame = comp.to_frame()
    assert frame.loc[d.index, "p_adjusted"].tolist() == pytest.approx(d["p_adjusted"].tolist())
    assert math.isnan(frame.loc["baseline", "p_adjusted"])
    adopted = d[d["verdict"] == ADOPT]
    assert len(adopted) and (adopted["p_adjusted"] < 0.05).all()
    assert all("Holm" in r for r in adopted["reason"])


def test_a_candidate_adopted_alone_is_not_adopted_among_many_nulls():
    # p ≈ 0.02 alone; among 8 candidates, Holm's threshold for the smallest p is 0.05 / 8.
    base = {0: 1.00, 1: 1.10, 2: 0.95, 3: 1.05}
    cand = {0: 0.97, 1: 1.09, 2: 0.93, 3: 1.03}
    alone = comparison({"baseline": base, "cand": cand}).decision().iloc[0]
    assert alone["p_value"] < 0.05 and alone["verdict"] == ADOPT, alone["reason"]
    nulls = {f"null_{i}": {s: v + (0.03 if (s + i) % 2 else -0.03) for s, v in base.items()} for i in range(7)}
    among = comparison({"baseline": base, "cand": cand, **nulls}).decision().set_index("candidate").loc["cand"]
    assert among["p_value"] == pytest.approx(alone["p_value"]) and among["p_adjusted"] > 0.05
    assert among["verdict"] == INCONCLUSIVE


def test_guardrails_min_effect_is_checked_and_round_trips():
    with pytest.raises(TroptError, match="min_effect"):
        tropt.Guardrails(min_effect=-0.1)
    with pytest.raises(TroptError, match="min_effect"):
        tropt.Guardrails(min_effect=math.nan)
    g = tropt.Guardrails(max_quality_drop=0.01, min_effect=0.002)
    assert tropt.Guardrails.from_dict(g.to_dict()) == g
    assert tropt.Guardrails.from_dict({k: v for k, v in tropt.Guardrails().to_dict().items()
                                       if k != "min_effect"}) == tropt.Guardrails()  # older comparison.json files
