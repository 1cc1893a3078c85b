"""One run's rules: exact step and sample budgets, the seconds cap, early stopping applied identically, failed runs
recorded (raised or non-finite) while the others complete, and the Comparison's JSON round trip and renderings."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch
from support.compare_setups import adam, make_setup

import tropt
from tropt.experiments import Comparison, EarlyStopping
from tropt.experiments.stats import ESCALATE, INCONCLUSIVE, REJECT_INSTABILITY
from tropt.testing import untouched


def _counting_step(seen: list):
    """The standard step, recording every micro-batch's size (what the loop actually trained on)."""

    def step(ctx, micro_batches):
        seen.extend(len(mb[1]) for mb in micro_batches)
        return tropt.standard_step(ctx, micro_batches)

    return step


def test_step_budget_is_exact():
    comp = tropt.compare(make_setup(), {"adam": {"optimizer": adam()}}, budget=tropt.Budget(steps=23), seeds=(0, 1, 2),
                         progress=False)
    runs = comp.runs
    assert (runs["steps"] == 23).all() and (runs["stopped_by"] == "steps").all()
    assert (runs["samples"] == 23 * 32).all()
    assert all(len(comp.curves(r.candidate, r.seed)["train_loss"]) == 23 for r in runs.itertuples())


def test_sample_budget_is_exact_to_the_sample_with_accumulation():
    seen: list[int] = []
    setup = make_setup(step=_counting_step(seen), accumulation_steps=4)
    # A step takes 4 loader batches of 32 (128 samples); 1000 is not a multiple of it: the last step is cut to 104
    # samples (4 micro-batches of 26).
    comp = tropt.compare(setup, {"lr2": {"lr": 0.1}}, budget=tropt.Budget(samples=1000), seeds=(0,), progress=False)
    runs = comp.runs
    assert (runs["samples"] == 1000).all() and (runs["steps"] == 8).all()  # 7 full steps + one of 104
    assert (runs["stopped_by"] == "samples").all()
    assert sum(seen) == 2 * 1000  # what the user's step received, both runs together
    assert seen[-4:] == [26, 26, 26, 26]


def test_steps_and_samples_end_at_whichever_comes_first():
    comp = tropt.compare(make_setup(), {"lr2": {"lr": 0.1}, "big_batch": {"batch_size": 64}},
                         budget=tropt.Budget(steps=50, samples=960), seeds=(0,), progress=False)
    r = comp.runs.set_index("candidate")
    assert r.loc["baseline", "steps"] == 30 and r.loc["baseline", "samples"] == 960
    assert r.loc["big_batch", "steps"] == 15 and r.loc["big_batch", "samples"] == 960  # same samples, fewer steps


def test_seconds_cap_is_reported_and_escalates():
    def slow_step(ctx, micro_batches):
        time.sleep(0.02)
        return tropt.standard_step(ctx, micro_batches)

    setup = make_setup()
    comp = tropt.compare(setup, {"slow": {"step": slow_step}}, budget=tropt.Budget(steps=10_000, seconds=0.3),
                         seeds=(0, 1, 2), progress=False)
    runs = comp.runs.set_index("candidate")
    slow = runs.loc["slow"]
    assert (slow["stopped_by"] == "seconds").all() and (slow["steps"] < 10_000).all()
    assert (slow["seconds"] >= 0.3).all()  # what each run actually used is reported
    d = comp.decision().iloc[0]
    assert d["verdict"] == ESCALATE and "seconds cap" in d["reason"]


def test_early_stopping_is_the_same_rule_for_every_run():
    # lr=1e-7 cannot improve the validation loss by min_delta: it stops after `patience` evaluations; the baseline
    # keeps improving and runs its whole budget. The rule is recomputed here from each run's own eval curve.
    es = EarlyStopping(patience=2, min_delta=1e-3)
    comp = tropt.compare(make_setup(lr=0.2), {"frozen": {"lr": 1e-7}}, budget=tropt.Budget(steps=100), eval_every=10,
                         early_stopping=es, progress=False)
    for r in comp.runs.itertuples():
        c = comp.curves(r.candidate, r.seed)
        best, bad, stop_at = math.inf, 0, None
        for step, v in zip(c["eval_step"], c["val_loss"]):
            if v < best - es.min_delta:
                best, bad = v, 0
            else:
                bad += 1
            if bad >= es.patience and step < 100:
                stop_at = step
                break
        assert r.steps == (stop_at or 100), (r.candidate, r.seed)
        assert r.stopped_by == ("early_stopping" if stop_at else "steps")
        assert r.steps_saved == 100 - r.steps
    frozen = comp.runs.query("candidate == 'frozen'")
    assert (frozen["stopped_by"] == "early_stopping").all() and (frozen["steps"] == 30).all()
    assert comp.to_frame().loc["frozen", "steps_saved"] == 3 * 70
    assert any("saved 210 steps" in n for n in comp.notes)


def test_a_step_that_raises_is_a_failed_run_and_the_others_complete():
    def broken(ctx, micro_batches):
        ctx.calls = getattr(ctx, "calls", 0) + 1  # counted on the run's own context (ids of dead objects repeat)
        if ctx.calls == 2:  # fails on the second step
            raise RuntimeError("shape mismatch in my loop")
        return tropt.standard_step(ctx, micro_batches)

    setup = make_setup()
    with untouched(setup):
        comp = tropt.compare(setup, {"broken": {"step": broken}, "adam": {"optimizer": adam()}},
                             budget=tropt.Budget(steps=20), progress=False)
    runs = comp.runs.set_index("candidate")
    assert (runs.loc["broken", "status"] == "failed").all()
    assert runs.loc["broken", "reason"].str.contains("RuntimeError: shape mismatch in my loop").all()
    assert (runs.loc[["baseline", "adam"], "status"] == "ok").all()
    assert (runs.loc[["baseline", "adam"], "steps"] == 20).all()
    d = comp.decision().set_index("candidate")
    assert d.loc["broken", "verdict"] == INCONCLUSIVE and "raised" in d.loc["broken", "reason"]
    assert comp.to_frame().loc["broken", "failed"] == 3


def test_a_run_that_goes_non_finite_is_failed_and_unstable():
    def step(ctx, micro_batches):  # the loss turns NaN from the 7th step on
        ctx.calls = getattr(ctx, "calls", 0) + 1
        loss = tropt.standard_step(ctx, micro_batches)
        return loss * math.nan if ctx.calls >= 7 else loss

    comp = tropt.compare(make_setup(), {"nan": {"step": step}}, budget=tropt.Budget(steps=30), eval_every=10,
                         seeds=(0,), progress=False)
    r = comp.runs.set_index("candidate").loc["nan"]
    assert r["status"] == "failed" and r["stopped_by"] == "non_finite" and "step 7" in r["reason"]
    assert r["unstable"] and r["non_finite"] > 0
    assert comp.decision().iloc[0]["verdict"] == REJECT_INSTABILITY


def test_json_round_trip_html_and_plots(tmp_path):
    comp = tropt.compare(make_setup(), {"adam": {"optimizer": adam()}},
                         budget=tropt.Budget(steps=20, cost_per_hour=3.6),
                         seeds=(0, 1, 2), splits={"test": make_setup(n_val=32).val_data}, progress=False)
    again = Comparison.from_json(comp.to_json(tmp_path / "c.json") and str(tmp_path / "c.json"))
    assert json.loads(comp.to_json()) == json.loads(again.to_json())
    import pandas as pd

    pd.testing.assert_frame_equal(comp.to_frame(), again.to_frame())
    pd.testing.assert_frame_equal(comp.decision(), again.decision())
    runs = comp.runs
    assert (runs["cost"] - runs["seconds"] / 1000).abs().max() < 1e-12  # 3.6 per hour = 0.001 per second
    d = comp.decision().iloc[0]
    assert d["cost_per_run"] == pytest.approx(runs.query("candidate == 'adam'")["cost"].mean())
    assert "test_loss" in runs.columns and "never used for selection" in " ".join(comp.notes)
    html = comp._repr_html_()
    assert "adam" in html and comp.decision().iloc[0]["verdict"] in html
    ax = comp.plot_curves()
    assert len(ax.lines) >= 2
    ax2 = comp.plot_tradeoff()
    assert len(ax2.collections) >= 1


def test_model_factory_is_seeded_per_run_and_best_selection():
    from torch import nn

    built = []

    def wide():
        m = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 3))
        built.append(m[0].weight.detach().clone())
        return m

    comp = tropt.compare(make_setup(), {"wide": {"model": wide}}, budget=tropt.Budget(steps=20), eval_every=5,
                         select="best", progress=False)
    assert len(built) == 3  # one model per seed, built with that seed set: different starts, reproducible
    assert not torch.equal(built[0], built[1])
    torch.manual_seed(1)
    assert torch.equal(wide()[0].weight, built[1])
    for r in comp.runs.itertuples():
        c = comp.curves(r.candidate, r.seed)
        assert r.score == r.best == min(c["val_loss"])
        assert r.best_step == c["eval_step"][c["val_loss"].index(r.best)]


def _hand_sgd(lr: float):
    """A loop that updates the parameters by hand: no optimizer object at all (Setup(optimizer=None))."""

    def step(ctx, micro_batches):
        ctx.model.zero_grad(set_to_none=True)
        loss = sum(ctx.loss_fn(ctx.model, mb) for mb in micro_batches) / len(micro_batches)
        loss.backward()
        with torch.no_grad():
            for p in ctx.model.parameters():
                p -= lr * p.grad
        return loss.detach()

    return step


def test_a_hand_written_update_without_an_optimizer_is_compared():
    base = make_setup()
    setup = tropt.Setup(base.model, base.loss_fn, None, base.train_data, base.val_data, step=_hand_sgd(0.02),
                        batch_size=32, num_classes=3)
    with untouched(setup):
        comp = tropt.compare(setup, {"faster_lr": {"step": _hand_sgd(0.5)}}, budget=tropt.Budget(steps=40),
                             reinit=True, progress=False)
    runs = comp.runs
    assert (runs["status"] == "ok").all(), runs["reason"].tolist()
    assert (runs["steps"] == 40).all() and (runs["optimizer"] == "none (hand-written update)").all()
    assert all(math.isnan(x) for x in comp.curves("baseline", 0)["lr"])  # no learning rate to read
    d = comp.decision().iloc[0]
    assert d["verdict"] == "adopt", d["reason"]  # 25x the learning rate of a plain SGD that barely moves
