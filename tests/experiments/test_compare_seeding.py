"""Issue #30: seeds that vary what they can (a list of batches' order per seed), a comparison whose seeds change
nothing refused before the budget is spent, instability judged without seed noise, and the thread policy of
diagnose applied to every run with the time per step measured inside it."""

from __future__ import annotations

import pytest
import torch
from support.compare_setups import adam, make_setup, sgd

import tropt
from tropt.errors import TroptError
from tropt.experiments.seeding import PROBE_STEPS
from tropt.experiments.stats import REJECT_INSTABILITY


def _fixed_loader_setup(**kw) -> tropt.Setup:
    """make_setup's problem with a DataLoader that does not shuffle: with the Setup's model instance, nothing varies."""
    base = make_setup(shuffled=True)
    loader = torch.utils.data.DataLoader(base.train_data, batch_size=32, shuffle=False)
    return base.replace(train_data=loader, **kw)


def _counting(seen: list):
    def step(ctx, micro):
        seen.append(torch.get_num_threads())
        return tropt.standard_step(ctx, micro)
    return step


def test_a_list_of_batches_is_read_in_a_seeded_order():
    # Before: a list of batches was read in one order for every seed, so all three baseline runs were identical.
    comp = tropt.compare(make_setup(lr=0.1, shuffled=False), {"adam": {"optimizer": adam(3e-3)}},
                         budget=tropt.Budget(steps=40), progress=False)
    base = comp.runs.query("candidate == 'baseline'")
    assert base["status"].eq("ok").all() and base["score"].nunique() == 3
    # paired: candidate and baseline on one seed read the same order, so a rerun of one seed is identical
    again = tropt.compare(make_setup(lr=0.1, shuffled=False), {"adam": {"optimizer": adam(3e-3)}},
                          budget=tropt.Budget(steps=40), seeds=(1, 2, 0), progress=False)
    assert dict(zip(base["seed"], base["score"])) == dict(
        zip(*again.runs.query("candidate == 'baseline'")[["seed", "score"]].to_numpy().T))


def test_seeds_that_change_nothing_are_refused_before_the_budget_is_spent():
    seen: list = []
    setup = _fixed_loader_setup(step=_counting(seen))
    with pytest.raises(TroptError) as err:
        tropt.compare(setup, {"lr_x30": {"lr": 1.5}}, budget=tropt.Budget(steps=200), progress=False)
    assert "the seeds change nothing" in err.value.message and "reinit=True" in err.value.fix
    assert len(seen) == 3 * PROBE_STEPS  # a probe of two steps per seed; not one step of the 200-step budget


def test_a_short_list_of_batches_is_never_refused():
    # Two batches: two seeds can draw the same first order, but every pass is permuted anew, so the runs differ.
    comp = tropt.compare(make_setup(n_train=64, shuffled=False), {"adam": {"optimizer": adam(3e-3)}},
                         budget=tropt.Budget(steps=20), progress=False)
    assert comp.runs.query("candidate == 'baseline'")["score"].nunique() == 3


def test_reinit_or_one_seed_is_not_refused():
    comp = tropt.compare(_fixed_loader_setup(), {"adam": {"optimizer": adam(3e-3)}}, budget=tropt.Budget(steps=20),
                         reinit=True, progress=False)
    assert comp.runs.query("candidate == 'baseline'")["score"].nunique() == 3
    one = tropt.compare(_fixed_loader_setup(), {"adam": {"optimizer": adam(3e-3)}}, budget=tropt.Budget(steps=20),
                        seeds=(0,), progress=False)
    assert len(one.records) == 2


def test_a_diverging_candidate_is_rejected_for_instability_without_seed_noise():
    # One seed (nothing varies): seed noise cannot be measured, but a non-finite run is still rejected.
    comp = tropt.compare(_fixed_loader_setup(), {"lr_huge": {"lr": 1e6}}, budget=tropt.Budget(steps=30),
                         seeds=(0,), progress=False)
    d = comp.decision().iloc[0]
    assert d["verdict"] == REJECT_INSTABILITY and "non-finite" in d["reason"]


def test_every_run_follows_diagnose_s_thread_policy(monkeypatch):
    import tropt.budgets as budgets

    monkeypatch.setattr(budgets, "busy_cores", lambda: 1000.0)  # a machine whose every core is busy
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen: list = []
        setup = make_setup(step=_counting(seen))
        comp = tropt.compare(setup, {"sgd_fast": {"optimizer": sgd(0.1)}}, budget=tropt.Budget(steps=5),
                             progress=False)
        assert set(seen) == {1} and torch.get_num_threads() == 2  # the user's setting restored
    finally:
        torch.set_num_threads(before)
    assert comp.meta["threads"] == 1 and set(comp.runs["threads"]) == {1}
    runs = comp.runs
    assert (runs["seconds_per_step"] - runs["train_seconds"] / runs["steps"]).abs().max() < 1e-12
    assert any("oversubscribed" in n for n in comp.notes)


