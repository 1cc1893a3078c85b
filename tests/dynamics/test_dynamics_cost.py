"""The sequential tests of dynamics.loss_curve and dynamics.lr_range (issue 32): each stops once its verdict is
settled, says how many steps ran and why it stopped, and still catches what the full run catches."""

from __future__ import annotations

import numpy as np
import pytest
from support.dynamics_setups import KNOWN_GOOD_LR, MAX_STABLE_LR, linreg_setup

import tropt
from tropt.budgets import BUDGETS
from tropt.dynamics import check_loss_curve
from tropt.dynamics.lr_range import check_lr_range
from tropt.result import Status
from tropt.testing import untouched


def test_a_healthy_probe_stops_once_two_checkpoints_agree():
    s = linreg_setup(KNOWN_GOOD_LR, val=True)
    with untouched(s):
        r = check_loss_curve(s, steps=300, progress=False)
    assert r.status == Status.PASS, r.summary
    assert r.metrics["steps_run"] == 60 and r.metrics["planned_steps"] == 300, r.metrics["stopped"]
    assert r.metrics["stopped"].startswith("settled at step 60") and r.metrics["verdicts"].startswith("40: pass")
    assert r.metrics["val_points"] >= 3  # evaluated at every checkpoint too
    full = check_loss_curve(s, steps=300, min_steps=None, progress=False)
    assert full.status == r.status and full.metrics["steps_run"] == 300 and "planned" in full.metrics["stopped"]


@pytest.mark.parametrize("lr", [1.5, 50.0])
def test_a_diverging_probe_is_still_a_fail(lr):
    r = check_loss_curve(linreg_setup(lr), steps=300, progress=False)
    assert r.status == Status.FAIL and r.metrics["class"] in ("non_finite", "diverging"), r.summary
    assert r.metrics["steps_run"] < 300 and r.metrics["stopped"]


def test_a_flat_fail_is_never_settled_early():
    """A slow start can still turn: a flat FAIL runs every planned step (each checkpoint said flat)."""
    r = check_loss_curve(linreg_setup(1e-9), steps=300, progress=False)
    assert r.status == Status.FAIL and r.metrics["class"] == "flat", r.summary
    assert r.metrics["steps_run"] == 300 and "planned" in r.metrics["stopped"], r.metrics["verdicts"]
    assert r.metrics["verdicts"].startswith("40: fail flat; 60: fail flat")


def test_an_instability_is_never_settled_early():
    """A loss that jumps every 25 steps at a constant learning rate: WARN classes are judged on the whole run, so the
    checkpoints that see the jumps do not stop it and the verdict is the full run's (unstable, every jump)."""
    rng = np.random.default_rng(0)
    t = np.arange(300)
    jump = (t % 25 == 0) & (t > 0)
    losses = (0.3 + 1.5 * np.exp(-t / 200)) * (1 + 0.8 * jump) * np.exp(rng.normal(0, 0.03, t.size))
    calls = iter(range(300))

    def step(ctx, micro):
        tropt.standard_step(ctx, micro)
        return float(losses[next(calls)])

    r = check_loss_curve(linreg_setup(KNOWN_GOOD_LR, step=step), steps=300, progress=False)
    assert r.metrics["class"] == "unstable" and r.status == Status.WARN, r.summary
    assert r.metrics["steps_run"] == 300 and r.metrics["spikes"] == 11


def test_a_probe_inside_its_warm_up_is_not_settled_early():
    warmup = lambda o: __import__("torch").optim.lr_scheduler.LambdaLR(o, lambda t: min(1.0, (t + 1) / 1e5))  # noqa: E731
    r = check_loss_curve(linreg_setup(KNOWN_GOOD_LR, scheduler=warmup), steps=100, progress=False)
    assert r.status == Status.WARN and "warming up" in r.summary, r.summary
    assert r.metrics["steps_run"] == 100 and "planned" in r.metrics["stopped"]


def test_quick_budget_cuts_the_probe_and_the_sweep():
    assert BUDGETS["quick"]["dynamics.loss_curve"]["min_steps"] <= 10
    assert BUDGETS["thorough"]["dynamics.loss_curve"]["min_steps"] is None  # thorough runs every step


def test_one_lr_sweep_settles_a_clear_verdict_and_says_so():
    s = linreg_setup(KNOWN_GOOD_LR)
    with untouched(s):
        r = check_lr_range(s, progress=False)
    full = check_lr_range(s, settle=False, progress=False)
    assert r.status == full.status == Status.PASS, (r.summary, full.summary)
    assert r.metrics["sweeps"] == 1 and r.metrics["sweeps_planned"] == 2 and "inside" in r.metrics["settled"]
    assert np.isnan(r.metrics["seed_spread_x"]) and "not run" in r.metrics["seed_note"]
    assert KNOWN_GOOD_LR / 10 <= r.metrics["suggested_low"] <= r.metrics["suggested_high"] < MAX_STABLE_LR
    assert r.metrics["steps_per_sweep"] <= full.metrics["steps_per_sweep"]
    assert full.metrics["sweeps"] == 2 and full.metrics["settled"].startswith("no")


@pytest.mark.parametrize("lr", [1e-5, 100.0])
def test_a_setup_lr_far_outside_stays_a_warn_with_the_sequential_sweep(lr):
    r = check_lr_range(linreg_setup(lr), progress=False)
    assert r.status == Status.WARN and r.metrics["setup_lr_in_range"] == "no", r.summary
    assert r.metrics["stopped_by"]


def _scripted(losses):
    calls = iter(range(10_000))

    def step(ctx, micro):
        tropt.standard_step(ctx, micro)
        return float(losses[next(calls) % len(losses)])

    return step


def test_a_sweep_stops_once_the_loss_rose_back_above_its_start():
    """A loss that falls to half and rises to 1.5x its start never reaches 4x its best (as AdamW on a language model
    often does not): the median rule ends the sweep past its minimum instead of running to the last LR."""
    rng = np.random.default_rng(0)
    i = np.arange(100)
    shape = np.where(i < 30, 1.0, np.where(i < 60, 1.0 - 0.5 * (i - 30) / 30, np.minimum(1.5, 0.5 + (i - 60) / 20)))
    losses = shape * np.exp(rng.normal(0, 0.02, i.size))
    s = linreg_setup(KNOWN_GOOD_LR, step=_scripted(losses))
    r = check_lr_range(s, repeats=1, progress=False)
    full = check_lr_range(linreg_setup(KNOWN_GOOD_LR, step=_scripted(losses)), repeats=1, settle=False,
                          progress=False)
    assert "rose back above its start" in r.metrics["stopped_by"], r.metrics["stopped_by"]
    assert full.metrics["steps_per_sweep"] == 100 and r.metrics["steps_per_sweep"] < 90
    assert r.status == full.status
    assert r.metrics["suggested_min_div_10"] == pytest.approx(full.metrics["suggested_min_div_10"])
