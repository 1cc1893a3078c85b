"""Early stopping that prunes losers by rank on Optuna's pruners (issue #30): every evaluation is reported as an
intermediate value, losers stop at a rung and skip the later seeds, the compute saved against the full grid is
reported, a pruned candidate is never adopted, and the fixed budget stays the default."""

from __future__ import annotations

import pytest
from support.compare_setups import make_setup

import tropt
from tropt.errors import TroptError

optuna = pytest.importorskip("optuna")

SEEDS = (0, 1, 2)
STEPS, EVERY = 60, 6


def _compare(**kw):
    """lr 0.5 trains; lr 1e-4 and 3e-4 barely move: the two losers."""
    return tropt.compare(make_setup(lr=0.5), {"tiny": {"lr": 1e-4}, "small": {"lr": 3e-4}},
                         budget=tropt.Budget(steps=STEPS), seeds=SEEDS, reinit=True, eval_every=EVERY, confirm=0,
                         progress=False, **kw)


@pytest.fixture(scope="module")
def pruned():
    return _compare(prune="halving")


def test_losers_are_pruned_by_rank_and_skip_the_later_seeds(pruned):
    runs = pruned.runs.set_index(["candidate", "seed"])
    assert set(pruned.meta["pruning"]["pruned"]) == {"tiny", "small"}
    for name in ("tiny", "small"):
        first = runs.loc[(name, 0)]
        assert first["stopped_by"] == "pruned" and first["steps"] < STEPS
        assert all(runs.loc[(name, s), "steps"] == 0 for s in (1, 2))  # not run after being pruned
    assert set(runs.loc["baseline", "steps"]) == {STEPS}  # the yardstick is never pruned


def test_the_compute_saved_against_the_full_grid_is_reported(pruned):
    p = pruned.meta["pruning"]
    assert p["steps_full_grid"] == 3 * 3 * STEPS and p["steps_run"] == int(pruned.runs["steps"].sum())
    assert p["saved_fraction"] == pytest.approx(1 - p["steps_run"] / p["steps_full_grid"]) and p["saved_fraction"] > 0.4
    assert any("pruned by rank (halving, Optuna)" in n for n in pruned.notes)


def test_a_pruned_candidate_is_never_adopted(pruned):
    d = pruned.decision().set_index("candidate")
    assert set(d["verdict"]) == {"inconclusive"} and all("pruned by halving" in r for r in d["reason"])


def test_each_evaluation_is_reported_to_the_trial(monkeypatch):
    reported = []
    real = optuna.trial.Trial.report

    def spy(self, value, step):
        reported.append((self.user_attrs.get("candidate"), step))
        return real(self, value, step)

    monkeypatch.setattr(optuna.trial.Trial, "report", spy)
    tropt.compare(make_setup(lr=0.5), {"tiny": {"lr": 1e-4}}, budget=tropt.Budget(steps=24), seeds=(0, 1),
                  reinit=True, eval_every=6, confirm=0, progress=False, prune="hyperband")
    assert [s for c, s in reported if c == "baseline"][:4] == [6, 12, 18, 24]


def test_a_winner_is_not_pruned_and_the_fixed_budget_is_the_default():
    comp = tropt.compare(make_setup(lr=1e-3), {"good": {"lr": 0.5}}, budget=tropt.Budget(steps=STEPS), seeds=SEEDS,
                         reinit=True, eval_every=EVERY, confirm=0, progress=False, prune="halving")
    assert set(comp.runs["steps"]) == {STEPS} and comp.decision().iloc[0]["verdict"] == "adopt"
    fixed = _compare()
    assert "pruning" not in fixed.meta and set(fixed.runs["steps"]) == {STEPS}


def test_bad_prune_values_fail_before_any_run():
    with pytest.raises(TroptError, match="not a pruner"):
        _compare(prune="asha")
    with pytest.raises(TroptError, match="in this process"):
        _compare(prune="halving", executor=__import__("concurrent.futures").futures.ThreadPoolExecutor(1))
