"""dynamics.lr_range on Setups with known answers: the suggested range brackets the LR known to work, and the
user's objects are never touched; the suggestion methods on textbook curves."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support.dynamics_setups import KNOWN_GOOD_LR, MAX_STABLE_LR, linreg_setup
from torch import nn
from torch.nn import functional as F

import tropt
from tropt.dynamics.lr_range import CHECK_ID, centred_median, check_lr_range, ema_smooth, suggest
from tropt.result import CheckResult, Status
from tropt.testing import untouched


def test_lr_range_brackets_the_lr_known_to_work_and_restores_the_setup():
    s = linreg_setup(KNOWN_GOOD_LR)
    before = [p.detach().clone() for p in s.model.parameters()]
    rng = torch.get_rng_state()
    with untouched(s):
        r = check_lr_range(s, settle=False, progress=False)  # both seeds, each sweep to 4x its best
    assert all(torch.equal(a, b) for a, b in zip(before, s.model.parameters()))
    assert torch.equal(rng, torch.get_rng_state())
    low, high = r.metrics["suggested_low"], r.metrics["suggested_high"]
    assert KNOWN_GOOD_LR / 10 <= low <= high < MAX_STABLE_LR, r.summary  # LRs that train, short of divergence
    assert r.status == Status.PASS and r.metrics["sweeps"] == 2
    assert set(r.tables["suggestions"]["method"]) == {"steepest", "valley", "min_div_10"}
    assert r.metrics["steps_per_sweep"] < 100  # stopped at 4x the best loss
    back = CheckResult.from_dict(r.to_dict())
    for res in (r, back):
        res.plot()


@pytest.mark.parametrize("lr", [1e-5, 100.0])
def test_lr_range_warns_when_the_setup_lr_is_far_outside(lr):
    s = linreg_setup(lr)
    with untouched(s):
        r = check_lr_range(s, repeats=1, progress=False)
    assert r.status == Status.WARN and r.metrics["setup_lr_in_range"] == "no"
    assert ("higher" if lr < 1 else "lower") in r.advice[0]


def test_lr_range_respects_accumulation_scheduler_and_group_ratios():
    seen = []

    def my_step(ctx, micro):
        seen.append((len(micro), [g["lr"] for g in ctx.optimizer.param_groups]))
        loss = sum(ctx.loss_fn(ctx.model, mb) for mb in micro) / len(micro)
        loss.backward()
        ctx.optimizer.step()
        ctx.optimizer.zero_grad()
        ctx.scheduler.step()  # a held stand-in: must not move the swept LR
        return loss

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(256, 4, generator=g), torch.randn(256, 1, generator=g)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = lambda m: torch.optim.SGD([{"params": m[0].parameters(), "lr": 0.01},  # noqa: E731
                                     {"params": m[2].parameters(), "lr": 0.1}])
    s = tropt.Setup(model, lambda m, b: F.mse_loss(m(b[0]), b[1]), opt,
                    torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32),
                    scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, 1, gamma=0.5), step=my_step,
                    accumulation_steps=4)
    with untouched(s):
        r = check_lr_range(s, num_steps=30, repeats=1, progress=False)
    assert all(k == 4 for k, _ in seen)
    lrs = np.array([lr for _, lr in seen])
    assert np.allclose(lrs[:, 1] / lrs[:, 0], 10.0)  # the user's 1:10 group ratio is kept
    assert np.all(np.diff(lrs[:, 0]) > 0)  # exponential sweep, not halved by StepLR
    assert r.metrics["setup_lr"] == 0.01


def test_lr_range_sweeps_a_setup_whose_warmup_starts_at_zero():
    # A linear warmup from 0 (the Hugging Face Trainer's default shape) leaves every group's LR at 0 when the
    # scheduler is built; the sweep must take the groups' ratios from their base LRs, or it sweeps nothing.
    warmup = lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: min(1.0, s / 10))  # noqa: E731
    s = linreg_setup(KNOWN_GOOD_LR, scheduler=warmup)
    with untouched(s):
        r = check_lr_range(s, progress=False)
    assert r.metrics["setup_lr"] == pytest.approx(KNOWN_GOOD_LR)  # the base LR, not the warmup's 0
    assert r.metrics["best_relative_drop"] > 0.5, r.summary
    assert r.status == Status.PASS, r.summary
    assert KNOWN_GOOD_LR / 10 <= r.metrics["suggested_low"] <= r.metrics["suggested_high"] < MAX_STABLE_LR


def test_lr_range_restores_on_error():
    calls = {"n": 0}

    def exploding_step(ctx, micro):
        calls["n"] += 1
        if calls["n"] == 5:
            raise RuntimeError("boom")
        return tropt.standard_step(ctx, micro)

    s = linreg_setup(KNOWN_GOOD_LR, step=exploding_step)
    with untouched(s), pytest.raises(tropt.TroptError, match="boom"):
        check_lr_range(s, progress=False)


def test_suggestions_on_a_textbook_curve():
    lrs = np.logspace(-6, 1, 100)
    loss = 2.0 - 1.5 / (1 + np.exp(-(np.log10(lrs) + 2) * 3))  # falls around 1e-2 ...
    loss[lrs > 0.3] += (np.log10(lrs[lrs > 0.3]) + 0.6) * 10  # ... and blows up past 0.3
    sm = ema_smooth(loss, 0.0)
    out = suggest(lrs, sm)
    assert 3e-3 < out["steepest"] < 3e-2
    assert 1e-6 < out["valley"] < lrs[np.argmin(sm)]  # fastai's valley: down the longest decreasing stretch
    assert 3e-3 < out["min_div_10"] < 0.05


def test_suggestions_ignore_a_lucky_first_batch_and_noise_at_tiny_lrs():
    """A noisy sweep (per-batch noise ±20%) whose first batch happens to be low: the real descent (1e-3..1e-1) must
    win over the noise at LRs far too small to learn, and the minimum is not the first point."""
    rng = np.random.default_rng(0)
    lrs = np.logspace(-7, 1, 100)
    trend = 1.0 - 0.45 / (1 + np.exp(-(np.log10(lrs) + 2) * 3))
    trend[lrs > 0.2] *= np.exp((np.log10(lrs[lrs > 0.2]) + 0.7) * 6)
    loss = trend * np.exp(0.2 * rng.standard_normal(lrs.size))
    loss[0] = 0.5  # the lucky first batch
    out = suggest(lrs, centred_median(loss, 11), skip_start=10)
    assert 1e-3 < out["steepest"] < 0.3 and 1e-3 < out["min_div_10"] < 0.1, out
    # the old reading (the EMA's minimum over every point) took the lucky first batch for the minimum
    assert suggest(lrs, ema_smooth(loss, 0.98))["min_div_10"] == lrs[0] / 10


def test_identical_sweeps_report_no_seed_spread_and_shuffled_ones_do():
    fixed = linreg_setup(KNOWN_GOOD_LR)
    fixed = fixed.replace(train_data=list(fixed.batches(16)))  # a fixed list: every seed sees the same batches
    r = check_lr_range(fixed, settle=False, progress=False)
    assert np.isnan(r.metrics["seed_spread_x"]) and "identical" in r.metrics["seed_note"]
    shuffled = check_lr_range(linreg_setup(KNOWN_GOOD_LR), settle=False, progress=False)
    assert np.isfinite(shuffled.metrics["seed_spread_x"]) and "seed_note" not in shuffled.metrics


def test_suggestions_orders_of_magnitude_apart_are_inconclusive():
    from tropt.dynamics.lr_range import _result

    lrs = np.logspace(-7, 1, 60)
    smooth = np.r_[np.linspace(1.0, 0.2, 10), np.full(40, 0.9), np.linspace(0.9, 0.8, 5), np.linspace(0.8, 5.0, 5)]
    sweep = {"seed": 0, "lr": lrs, "raw": smooth, "smooth": smooth, "steps": 60,
             "suggest": {"steepest": 3e-7, "valley": 1e-2, "min_div_10": 1e-3}, "stopped_at": 10.0}
    r = _result(linreg_setup(KNOWN_GOOD_LR), [sweep], [0.1], 60, 10.0, 100.0, 0.05, 4.0, "step return")
    assert r.status is Status.WARN and r.summary.startswith("inconclusive: the suggestions span 33333×")
    assert "too noisy" in r.advice[0]


def test_a_sweep_whose_loss_barely_moves_gives_no_range():
    """2.34 -> 2.30 over the sweep (a CNN that needs more than 100 steps to start learning): no range, WARN."""
    from tropt.dynamics.lr_range import _result

    lrs = np.logspace(-7, 1, 100)
    smooth = np.r_[np.linspace(2.34, 2.30, 70), np.linspace(2.31, 2.8, 30)]
    sweep = {"seed": 0, "lr": lrs, "raw": smooth, "smooth": smooth, "steps": 100,
             "suggest": suggest(lrs, smooth, skip_start=10), "stopped_at": 10.0}
    assert np.isfinite(list(sweep["suggest"].values())).all()  # the methods alone would still name LRs
    r = _result(linreg_setup(KNOWN_GOOD_LR), [sweep], [0.05], 100, 10.0, 100.0, 0.05, 4.0, "step return")
    assert r.status is Status.WARN and "lowered the loss by more than 5%" in r.summary
    assert abs(r.metrics["best_relative_drop"] - (2.34 - 2.30) / 2.34) < 1e-9 and "suggested_low" not in r.metrics


# ------------------------------------------------------------------ optimizers with no learning rate to sweep
def test_adafactor_with_relative_step_is_skipped_not_an_error():
    """Adafactor(relative_step=True, lr=None) derives its own step size: a sweep cannot set it, so SKIP with why
    and what to do (it raised ``float(None)`` -> TypeError, an ERROR in a report)."""
    pytest.importorskip("transformers")
    from support import family_ports as fp

    s = fp.adafactor_setup()
    with untouched(s):
        r = check_lr_range(s, num_steps=20, repeats=1, progress=False)
    assert r.status is Status.SKIP, r.summary
    assert "relative_step" in r.summary and "no learning rate" in r.summary, r.summary
    assert any("explicit lr" in a for a in r.advice), r.advice
    [report] = tropt.diagnose(s, checks=[CHECK_ID], progress=False).results
    assert report.status is Status.SKIP, report.summary  # through the runner too, not ERROR


def test_a_group_whose_lr_is_not_a_number_is_skipped_not_an_error():
    """Any group lr that group_lr cannot read (here None, with no relative step) is no rate to sweep: SKIP."""
    def no_lr(m):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        opt.param_groups[0]["lr"] = None  # e.g. a custom optimizer that schedules its own step size
        return opt

    s = linreg_setup(KNOWN_GOOD_LR).replace(optimizer=no_lr)
    with untouched(s):
        r = check_lr_range(s, num_steps=20, repeats=1, progress=False)
    assert r.status is Status.SKIP and "no learning rate to sweep" in r.summary, r.summary
    assert r.metrics["lr"] == "None" and r.metrics["relative_step"] is False
