"""Issue #30, the winner's curse: the best of many candidates is adopted only when fresh seeds confirm it."""

from __future__ import annotations

from support.compare_setups import adam, make_setup
from support.synthetic_comparisons import comparison, records

import tropt
from tropt.experiments.stats import ADOPT, INCONCLUSIVE

SEL = {0: 1.00, 1: 1.02, 2: 0.98}


def _with_confirmation(winner_scores: dict, base_scores: dict):
    """Eight candidates: 'lucky' clearly better on the selection seeds, 'second' better too, six equal; the
    confirmation re-ran lucky and the baseline on seeds 3..5 with the given scores."""
    scores = {"baseline": SEL, "lucky": {s: v - 0.10 for s, v in SEL.items()},
              "second": {s: v - 0.05 for s, v in SEL.items()},
              **{f"null_{i}": {s: v + 0.001 * (i - 3) for s, v in SEL.items()} for i in range(6)}}
    comp = comparison(scores)
    for name, sc in (("baseline", base_scores), ("lucky", winner_scores)):
        for r in records(name, sc):
            r["phase"] = "confirm"
            comp.records.append(r)
    comp.meta["confirmation"] = {"candidate": "lucky", "seeds": [3, 4, 5]}
    return comp


FRESH = {3: 1.01, 4: 0.99, 5: 1.03}


def test_a_winner_that_fresh_seeds_do_not_confirm_is_not_adopted():
    comp = _with_confirmation({3: 1.015, 4: 0.985, 5: 1.03}, FRESH)  # equal to the baseline on fresh seeds
    d = comp.decision().set_index("candidate")
    assert d.loc["lucky", "verdict"] == INCONCLUSIVE and "winner's curse" in d.loc["lucky", "reason"]
    assert d.loc["lucky", "confirmed"] == False  # noqa: E712 - a numpy bool
    assert abs(d.loc["lucky", "gain"] - 0.10) < 1e-9 and abs(d.loc["lucky", "confirm_gain"]) < 0.01  # both shown
    assert d.loc["second", "verdict"] == INCONCLUSIVE and "not confirmed" in d.loc["second", "reason"]
    assert not (d["verdict"] == ADOPT).any()


def test_a_confirmed_winner_is_adopted_with_both_results():
    comp = _with_confirmation({s: v - 0.09 for s, v in FRESH.items()}, FRESH)
    d = comp.decision().set_index("candidate")
    assert d.loc["lucky", "verdict"] == ADOPT and "confirmed against the winner's curse" in d.loc["lucky", "reason"]
    assert d.loc["lucky", "confirmed"] == True  # noqa: E712
    assert abs(d.loc["lucky", "confirm_gain"] - 0.09) < 1e-9


def test_compare_reruns_the_winner_of_many_on_fresh_seeds():
    setup = make_setup(lr=0.005)  # a learning rate far too low for 60 steps: 10x is clearly better
    comp = tropt.compare(setup, {"lr_x10": {"lr": 0.05}, "lr_x2": {"lr": 0.01}},
                         budget=tropt.Budget(steps=60), seeds=(0, 1, 2), reinit=True, progress=False)
    assert comp.meta["confirmation"] == {"candidate": "lr_x10", "seeds": [3, 4, 5]}
    confirm = comp.runs.query("phase == 'confirm'")
    assert sorted(confirm["candidate"].unique()) == ["baseline", "lr_x10"] and len(confirm) == 6
    d = comp.decision().set_index("candidate")
    assert d.loc["lr_x10", "verdict"] == ADOPT and bool(d.loc["lr_x10", "confirmed"])
    assert comp.to_frame().loc["lr_x10", "runs"] == 3  # the table reads the selection runs only


def test_one_candidate_or_confirm_0_runs_no_confirmation():
    setup = make_setup(lr=0.05, momentum=0.9)
    one = tropt.compare(setup, {"adam": {"optimizer": adam(1e-2)}}, budget=tropt.Budget(steps=40), reinit=True,
                        progress=False)
    assert "confirmation" not in one.meta and len(one.records) == 6


def test_the_plan_s_baseline_reads_the_selection_seeds_only():
    from tropt.experiments.plan import OptimizationPlan

    comp = _with_confirmation({s: v - 0.09 for s, v in FRESH.items()}, FRESH)
    rep = tropt.Report([tropt.CheckResult("dynamics.loss_curve", "pass", "healthy")], {"tropt": tropt.__version__})
    plan = OptimizationPlan.from_report(rep, comp)
    assert plan.baseline["final_metric"].endswith("over 3 seeds")  # not 6: the fresh seeds confirm, they do not pool
    assert plan.outcome == "adopt" and "confirmation_seeds" in plan.interventions[0]["identity"]
