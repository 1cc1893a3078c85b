"""model.overfit_batch at a bounded cost (issue 32) and with several optimizers (issue 28): a step of any optimizer
is the step (D then G is one user step), and a memorised batch is not followed by a baseline as long as the model's
run, whose answer no baseline changes; the result says how many steps each run took and why it stopped."""

from __future__ import annotations

import torch
from support.model_fixtures import IgnoresInput, data, mlp, run, setup_for
from torch import nn

import tropt
from tropt.model import check_overfit_batch
from tropt.model._overfit_samples import BASELINE_STEPS_AFTER_PASS
from tropt.result import Status
from tropt.testing import untouched


class TwoHeads(nn.Module):
    """Two halves a GAN-like step updates with two optimizers (``d`` first, ``g`` second)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.d, self.g = mlp(seed=0), mlp(seed=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.d(x) + self.g(x)


def _two_optimizer_setup(step_d_every: int) -> tropt.Setup:
    calls = [0]

    def step(ctx, micro_batches):  # the second optimizer steps every call, the first every ``step_d_every``-th
        opt_d, opt_g = ctx.optimizers
        loss = ctx.loss_fn(ctx.model, micro_batches[0])
        loss.backward()
        calls[0] += 1
        if step_d_every and calls[0] % step_d_every == 0:
            opt_d.step()
        opt_g.step()
        opt_d.zero_grad()
        opt_g.zero_grad()
        return loss.detach()

    return setup_for(TwoHeads(), opt=(lambda m: torch.optim.Adam(m.d.parameters(), 1e-2),
                                      lambda m: torch.optim.Adam(m.g.parameters(), 1e-2)), step=step)


def test_overfit_counts_a_step_of_any_optimizer_as_the_step():
    """Only ``ctx.optimizer`` (D) was counted: stepping it every other call gave half the steps, and never stepping
    it gave 0 optimizer steps, read as a hand-written update. Now D then G is one step, G alone is one step."""
    for every in (1, 2, 0):
        r = run(check_overfit_batch, _two_optimizer_setup(every), steps=6)
        assert r.metrics["optimizer_steps"] == r.metrics["steps_run"], (every, r.metrics)
        assert r.metrics["observed_at"] == "optimizer.step", every


def test_overfit_one_optimizer_stepped_twice_is_two_steps():
    """The count is that of the optimizer that stepped most in a call: one optimizer stepped twice is 2 per call."""
    def step(ctx, micro_batches):
        for _ in range(2):
            ctx.loss_fn(ctx.model, micro_batches[0]).backward()
            ctx.optimizer.step()
            ctx.optimizer.zero_grad()

    r = run(check_overfit_batch, setup_for(mlp(), step=step), steps=3)
    assert r.metrics["optimizer_steps"] == 2 * r.metrics["steps_run"]


def test_overfit_memorised_runs_a_short_baseline_and_says_why():
    """A memorised batch PASSes whatever the baseline does: the baseline ran as many steps as the model; now it runs
    BASELINE_STEPS_AFTER_PASS, compared with the model at that same step, and the metrics say so."""
    r = run(check_overfit_batch, setup_for(mlp()))
    assert r.status is Status.PASS, r.summary
    k = BASELINE_STEPS_AFTER_PASS
    assert r.metrics["stopped"] == "target reached" and r.metrics["steps_run"] > k
    assert r.metrics["baseline_steps_run"] == k and len(r.series["baseline_loss"]) == k + 1
    assert "memorised" in r.metrics["baseline_stopped"]
    assert f"after {k} steps the model's loss was" in r.summary


def test_overfit_ignored_input_still_runs_the_full_baseline():
    """Control: without memorisation the baseline decides the verdict, so it runs every step."""
    r = run(check_overfit_batch, setup_for(IgnoresInput()), steps=60)
    assert r.status is Status.FAIL and "ignores its input" in r.summary
    assert r.metrics["baseline_steps_run"] == 60 and r.metrics["stopped"] == "step limit"
    assert "baseline decides" in r.metrics["baseline_stopped"]



def _quick(setup: tropt.Setup):
    with untouched(setup):
        return tropt.diagnose(setup, checks=["model.overfit_batch"], budget="quick", progress=False)[
            "model.overfit_batch"]


def test_quick_budget_overfits_two_samples():
    """budget="quick" took the same 32 samples as the default (its cost barely cut); now it takes 2."""
    r = _quick(setup_for(mlp(), batches=data(seed=3)))  # the first two labels differ (1, 2)
    assert r.status is Status.PASS and r.metrics["samples"] == 2, (r.summary, r.metrics["samples"])
    assert r.metrics["samples_taken"] == "samples=2"


def test_quick_budget_takes_more_samples_when_the_first_share_one_target():
    """Two samples of one class are memorised by a model that ignores its input: the samples double until the
    targets differ (labels 2, 2, 1, 2: four), and the metrics say why; the ignored input is still caught."""
    healthy = _quick(setup_for(mlp()))
    assert healthy.status is Status.PASS and healthy.metrics["samples"] == 4, healthy.summary
    assert "same target" in healthy.metrics["samples_taken"]
    r = _quick(setup_for(IgnoresInput()))
    assert r.status is Status.FAIL and "ignores its input" in r.summary, r.summary
    assert r.metrics["first_samples"] == 4 and r.metrics["first_status"] == "fail"


def test_quick_budget_judges_a_verdict_other_than_pass_on_the_default_samples():
    """Two samples decide a PASS; anything else is judged again on 32, as before the shortcut: a stall from softmax
    before cross entropy is the same FAIL, with the cheaper run's evidence in the metrics."""
    r = _quick(setup_for(nn.Sequential(*mlp(), nn.Softmax(-1)), batches=data(seed=3)))
    assert r.status is Status.FAIL and "stalls at a floor" in r.summary, r.summary
    assert r.metrics["samples"] == 32 and r.metrics["first_samples"] == 2 and "escalated" in r.metrics
