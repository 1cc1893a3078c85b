"""dynamics.loss_curve: synthetic curves of every class (diagnose_curves on curves a user already has), and short
runs of Setups with known answers (check_loss_curve); the user's objects are never touched. Reading each log format
is tested in test_log_readers.py."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from support import curves as cf
from support.dynamics_setups import KNOWN_GOOD_LR, linreg_setup

import tropt
from tropt.dynamics import check_loss_curve, diagnose_curves
from tropt.errors import TroptError
from tropt.result import CheckResult, Status
from tropt.testing import untouched


@pytest.mark.parametrize("name", list(cf.CASES))
@pytest.mark.parametrize("n", [300, 5000])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_class_is_classified(name, n, seed):
    r = diagnose_curves(cf.CASES[name](n, seed))
    assert r.check == "dynamics.loss_curve"
    assert r.metrics["class"] == name
    assert r.metrics["classes"] == name  # and nothing else is flagged
    expected = {"healthy": Status.PASS, "flat": Status.FAIL, "diverging": Status.FAIL, "non_finite": Status.FAIL}
    assert r.status == expected.get(name, Status.WARN)
    if name != "healthy":
        assert r.advice and r.tables["findings"]["flagged"].any()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_fall_inside_the_first_tenth_is_not_flat_but_heavy_noise_alone_is(seed):
    """A loss that halves in its first ~40 of 300 steps and then sits at a noisy floor (like a small regression
    problem) fell; the same noise around a constant did not."""
    assert diagnose_curves(cf.fast_fall_then_floor(300, seed)).metrics["class"] == "healthy"
    assert diagnose_curves(cf.flat_noisy(300, seed)).metrics["class"] == "flat"


def test_healthy_curve_is_not_flagged_even_with_validation():
    y = cf.healthy(2000, 3)
    vt = np.linspace(0, 1999, 30)
    r = diagnose_curves(y, val=0.4 + 2.0 * np.exp(-vt / (2000 / 12)), val_steps=vt)
    assert r.status == Status.PASS and r.advice == []


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_overfitting_reports_the_best_step(seed):
    train, vt, val = cf.overfitting(2000, seed)
    r = diagnose_curves(train, val=val, val_steps=vt)
    assert r.status == Status.WARN and r.metrics["class"] == "overfitting"
    best = r.metrics["val_best_step"]
    assert 0.3 * 2000 <= best <= 0.5 * 2000  # the validation minimum was built at 40% of the run
    assert any(f"stop at step {round(best)}" in a for a in r.advice)


def test_non_finite_names_the_first_bad_step_and_diverging_advice_names_a_clip_value():
    y = cf.non_finite(1000)
    norms = np.linspace(1, 10, 1000)
    r = diagnose_curves(y, grad_norms=norms)
    assert r.metrics["first_non_finite_step"] == 700
    assert any("Clip gradients at about" in a and f"{np.percentile(norms, 90):.3g}" in a for a in r.advice)
    assert "non_finite_steps" in r.tables


def test_spikes_are_listed_as_evidence():
    r = diagnose_curves(cf.unstable(2000))
    assert r.metrics["spikes"] == 3
    assert sorted(r.tables["spikes"]["step"].astype(int)) == [600, 1100, 1600]


def test_losses_that_go_negative_still_classify():
    y = cf.healthy(2000) - 1.0  # a negative log-likelihood can be below zero
    assert diagnose_curves(y).metrics["class"] == "healthy"
    assert diagnose_curves(cf.flat(2000) - 3.0).metrics["class"] == "flat"


def test_bad_inputs_say_how_to_fix():
    with pytest.raises(TroptError, match="at least"):
        diagnose_curves([1.0, 0.9, 0.8])
    with pytest.raises(TroptError, match="training loss"):
        diagnose_curves(pd.DataFrame({"a": [1.0] * 20, "b": [2.0] * 20}))
    with pytest.raises(TroptError, match="does not exist"):
        diagnose_curves("/nonexistent/metrics.csv")
    with pytest.raises(TroptError, match="steps has"):
        diagnose_curves(np.ones(20), steps=np.arange(10))


def test_summaries_read_well():
    """No label repeated as its own evidence, and counts agree with their nouns."""
    r = diagnose_curves(cf.still_improving(2000))
    assert (r.summary.startswith("still improving at the end: the loss fell a further ")
            and r.summary.count("still improving") == 1)
    assert r.summary.endswith("% over the last tenth of the run"), r.summary
    one_spike = cf.healthy(2000)
    one_spike[1000:1003] *= 4.0
    assert "1 loss spike (" in diagnose_curves(one_spike).summary
    assert "3 loss spikes (" in diagnose_curves(cf.unstable(2000)).summary
    one_nan = cf.healthy(500)
    one_nan[-1] = np.nan
    assert "(1 non-finite value)" in diagnose_curves(one_nan).summary


def test_json_round_trip_and_plot():
    import matplotlib.pyplot as plt

    train, vt, val = cf.overfitting(1000, 0)
    for r in (diagnose_curves(train, val=val, val_steps=vt), diagnose_curves(cf.unstable(1000)),
              diagnose_curves(cf.non_finite(500))):
        back = CheckResult.from_dict(r.to_dict())
        assert back.status == r.status and back.metrics["class"] == r.metrics["class"]
        for res in (r, back):
            ax = res.plot()
            assert ax.get_title(loc="left").startswith("dynamics.loss_curve")
            plt.close(ax.figure)


def test_logged_warm_restarts_are_explained_by_the_logged_learning_rate():
    """An SGDR run's log: the loss jumps right after each restart. Without the learning rates that reads as
    instability; with ``lrs=`` (the logged lr column) the jumps are listed against the restarts and not counted."""
    rng = np.random.default_rng(0)
    t = np.arange(600)
    phase = t % 150
    lr = 0.5 * (1 + np.cos(np.pi * phase / 150)) * 0.1
    # lr[i] is used by the step after loss[i]: the jump shows from the first loss after a restart on
    jump = np.where((t >= 150) & (phase >= 1), np.exp(-(phase - 1) / 3.0), 0.0)
    loss = (0.3 + 1.5 * np.exp(-t / 200)) * (1 + 0.8 * jump) * np.exp(rng.normal(0, 0.03, t.size))
    plain = diagnose_curves(loss)
    assert "unstable" in plain.metrics["classes"], plain.summary
    logged = diagnose_curves(pd.DataFrame({"step": t, "loss": loss}), lrs=lr)
    assert ("unstable" not in logged.metrics["classes"]
            and logged.metrics["spikes_after_lr_increase"] == 3), logged.summary


def test_known_good_lr_is_healthy():
    s = linreg_setup(KNOWN_GOOD_LR, val=True)
    with untouched(s):
        r = check_loss_curve(s, steps=100, progress=False)
    assert r.status == Status.PASS, r.summary
    assert r.metrics["loss_from"] == "step return" and r.metrics["val_points"] >= 10


@pytest.mark.parametrize("lr", [1.5, 50.0])
def test_far_too_high_lr_is_diverging(lr):
    s = linreg_setup(lr)
    with untouched(s):
        r = check_loss_curve(s, steps=100, progress=False)
    assert r.status == Status.FAIL
    assert r.metrics["class"] in ("non_finite", "diverging")  # the issue: diverging = rising or non-finite
    assert any("Lower the learning rate" in a for a in r.advice)
    assert any("Clip gradients at about" in a for a in r.advice)  # the norms were observed
    r.plot()


def test_sample_setup_diverges_with_a_far_too_high_lr(sample_module):
    s = sample_module.make_setup()
    bad = s.replace(optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=1e4), grad_clip=None, scheduler=None)
    with untouched(bad):
        r = check_loss_curve(bad, steps=60, progress=False)
    assert r.status == Status.FAIL and r.metrics["class"] in ("non_finite", "diverging")


def sgdr_like_step(n=300, period=60):
    """Trains with the standard step but returns a loss that doubles after each warm restart of a
    CosineAnnealingWarmRestarts(T_0=period) schedule (the loss of step t reflects the LR of update t-1)."""
    rng = np.random.default_rng(0)
    t = np.arange(n)
    lr_share = 0.5 * (1 + np.cos(np.pi * (np.maximum(t - 1, 0) % period) / period))
    losses = (0.3 + 2.0 * np.exp(-t / 100)) * (1 + lr_share) * np.exp(rng.normal(0, 0.03, n))
    calls = iter(range(n))

    def step(ctx, micro):
        tropt.standard_step(ctx, micro)
        return float(losses[next(calls)])

    return step


def test_loss_jumps_right_after_a_warm_restart_are_not_instability():
    def restarts(o):
        return torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(o, T_0=60)

    s = linreg_setup(KNOWN_GOOD_LR, scheduler=restarts, step=sgdr_like_step())
    with untouched(s):  # the evidence of all 300 steps (min_steps=None: no sequential stop)
        r = check_loss_curve(s, steps=300, min_steps=None, progress=False)
    assert "unstable" not in r.metrics["classes"] and r.status == Status.PASS, r.summary
    assert r.metrics["spikes"] == 0 and r.metrics["spikes_after_lr_increase"] == 4
    assert list(r.tables["spikes"]["step"]) == [61, 121, 181, 241] and r.tables["spikes"]["after_lr_increase"].all()
    assert np.isclose(r.series["lr"][60], KNOWN_GOOD_LR) and r.series["lr"][59] < 0.01 * KNOWN_GOOD_LR
    # the same jumps under a constant learning rate have no schedule to explain them
    r = check_loss_curve(linreg_setup(KNOWN_GOOD_LR, step=sgdr_like_step()), steps=300, min_steps=None,
                         progress=False)
    assert r.metrics["class"] == "unstable" and r.metrics["spikes"] == 4, r.summary


def test_a_one_cycle_schedule_shorter_than_the_probe_is_a_clear_skip():
    sched = lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=50)  # noqa: E731
    s = linreg_setup(KNOWN_GOOD_LR, scheduler=sched)
    with untouched(s):
        r = check_loss_curve(s, steps=300, progress=False)
    assert r.status == Status.SKIP, r.summary
    assert "total_steps (50)" in r.summary and "300-step probe" in r.summary
    assert "steps=50" in r.advice[0] and "longer schedule" in r.advice[0]
    assert r.metrics["scheduler_total_steps"] == 50
    r = check_loss_curve(s, steps=50, progress=False)  # the advised probe runs
    assert r.status in (Status.PASS, Status.WARN) and r.metrics["steps_run"] == 50, r.summary


def test_step_returning_none_reads_the_loss_from_loss_fn_calls():
    def my_step(ctx, micro):
        for mb in micro:
            ctx.loss_fn(ctx.model, mb).backward()
        ctx.optimizer.step()
        ctx.optimizer.zero_grad()

    s = linreg_setup(KNOWN_GOOD_LR, step=my_step)
    with untouched(s):
        r = check_loss_curve(s, steps=60, progress=False)
    assert r.metrics["loss_from"] == "loss_fn calls" and r.metrics["steps_run"] == 60


# ------------------------------------------------------------------ flat while the learning rate still warms up
def _warmup(total):
    """A linear warm-up (LambdaLR) that is still far from its peak when the probe ends."""
    return lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda t: min(1.0, (t + 1) / total))


def test_a_flat_curve_under_a_rising_logged_lr_is_a_warm_up_warn_not_a_fail():
    y = cf.flat(600)
    r = diagnose_curves(y, lrs=1e-6 * np.arange(1, 601))
    assert r.metrics["class"] == "flat" and r.status == Status.WARN, r.summary
    assert "still warming up" in r.summary and "run longer than the warm-up" in r.summary
    assert r.metrics["lr_warming_up"] is True and r.advice
    # the same curve at a constant or decaying learning rate stays a FAIL
    for lrs in (np.full(600, 1e-3), 1e-3 / np.arange(1, 601)):
        r = diagnose_curves(y, lrs=lrs)
        assert r.status == Status.FAIL and "warming up" not in r.summary, r.summary


def test_a_flat_run_at_a_constant_tiny_lr_stays_a_fail():
    s = linreg_setup(1e-9)
    with untouched(s):
        r = check_loss_curve(s, steps=100, progress=False)
    assert r.status == Status.FAIL and r.metrics["class"] == "flat", r.summary
    assert "warming up" not in r.summary and not r.metrics.get("lr_warming_up")
    decaying = lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda t: 1.0 / (t + 1))  # noqa: E731
    r = check_loss_curve(linreg_setup(1e-9, scheduler=decaying), steps=100, progress=False)
    assert r.status == Status.FAIL and "warming up" not in r.summary, r.summary


def test_a_run_flat_during_a_linear_lambdalr_warm_up_is_a_warn():
    s = linreg_setup(KNOWN_GOOD_LR, scheduler=_warmup(100_000))
    with untouched(s):
        r = check_loss_curve(s, steps=100, progress=False)
    assert r.metrics["class"] == "flat" and r.status == Status.WARN, r.summary
    assert "flat while the learning rate is still warming up" in r.summary
    assert r.metrics["lr_end"] > 1.5 * r.metrics["lr_mid"]


def test_adafactor_warm_up_init_port_is_not_a_false_flat_fail():
    """transformers' Adafactor(relative_step=True, warmup_init=True) steps 1e-6·t: flat over a quick probe."""
    pytest.importorskip("transformers")
    from support.family_ports import adafactor_setup

    r = tropt.diagnose(adafactor_setup(), checks=["dynamics.loss_curve"], budget="quick", progress=False)
    res = next(x for x in (r.results if hasattr(r, "results") else r) if x.check == "dynamics.loss_curve")
    assert res.status == Status.WARN, res.summary
    assert "still warming up" in res.summary and "lr " in res.summary


# ------------------------------------------------------------------ a schedule that ends inside the probe
def _ends_at(end: int):
    """A linear decay to 0 at step ``end`` (a Trainer's max_steps, a short fine-tuning run), held at 0 after."""
    return lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1 - s / end))


def test_a_flat_curve_after_the_schedule_reached_lr_0_is_a_warn_naming_the_schedule():
    """The quick probe runs 150 steps; a schedule sized for 12 leaves every later step at LR 0, so a slow learner
    reads "flat" from a 12-step run. The FAIL ("raise the learning rate") becomes a WARN that says the schedule
    ended; the same slow learner at a constant LR keeps its FAIL."""
    ended = tropt.diagnose(linreg_setup(1e-4, scheduler=_ends_at(12)), checks=["dynamics.loss_curve"],
                           budget="quick", progress=False).results[0]
    assert ended.status is Status.WARN and "reaches learning rate 0 at step" in ended.summary, ended.summary
    assert ended.metrics["schedule_end_step"] == 13 and ended.metrics["class"] == "flat"  # step 13 runs at LR 0
    assert "so only 12 steps trained" in ended.summary
    constant = tropt.diagnose(linreg_setup(1e-6), checks=["dynamics.loss_curve"], budget="quick",
                              progress=False).results[0]
    assert constant.status is Status.FAIL and constant.metrics["class"] == "flat", constant.summary
    assert "schedule_end_step" not in constant.metrics
