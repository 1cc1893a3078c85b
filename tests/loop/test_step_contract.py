"""Known answers for the step contract's edges: state on ctx, batch layouts, hand-set LRs, step-owned scalers."""

from __future__ import annotations

import pytest
import torch
from support import ce_loss, make_classification
from support import real_loops as rl
from torch import nn

import tropt
from tropt.batching import BatchLayout, batch_size, split_batch
from tropt.core.capture import ScalerWatch
from tropt.errors import StepError, TroptError
from tropt.loop import check_resume, check_scheduler_cadence, check_zero_grad
from tropt.loop._verdicts import steps_per_call_note
from tropt.model import check_gradient_flow
from tropt.result import Status
from tropt.training import StepContext


# ------------------------------------------------------------------ batch layouts
def test_time_major_batch_with_flattened_target_splits_by_columns():
    data = torch.arange(6 * 8).reshape(6, 8)
    target = (data + 100).reshape(-1)
    layout = BatchLayout(batch_dim=1)
    assert layout.size((data, target)) == 8
    parts = layout.split((data, target), sizes=[5, 3])
    assert [p[0].shape for p in parts] == [(6, 5), (6, 3)]
    for d, t in parts:  # every target entry stays with its column and time step
        assert torch.equal(t.view(6, -1), d + 100)


def test_time_major_batch_keeps_per_sample_lengths_with_their_columns():
    data, lengths = torch.arange(5 * 6).reshape(5, 6), torch.tensor([5, 4, 3, 5, 2, 1])
    parts = BatchLayout(batch_dim=1).split((data, lengths), sizes=[4, 2])
    assert parts[1][1].tolist() == [2, 1] and torch.equal(parts[1][0], data[:, 4:])


def test_ambiguous_layout_says_which_option_to_pass():
    data, target = torch.zeros(6, 8), torch.zeros(48)
    with pytest.raises(TroptError) as info:
        batch_size((data, target))
    assert "batch_dim=1" in str(info.value) and "split_fn" in info.value.fix
    with pytest.raises(TroptError) as info:  # a tensor that fits neither dimension 1 nor the flattened shape
        split_batch((data, torch.zeros(5)), 2, layout=BatchLayout(batch_dim=1))
    assert "split_fn" in info.value.fix


def test_split_fn_output_is_checked_against_size_fn():
    layout = BatchLayout(split_fn=lambda b, sizes: [b, b], size_fn=lambda b: b.size(1))
    with pytest.raises(TroptError) as info:
        layout.split(torch.zeros(3, 4), sizes=[2, 2])
    assert "size_fn counts [4, 4]" in str(info.value)


def test_time_major_setup_without_batch_dim_is_an_error_naming_batch_dim():
    setup = rl.word_lm_setup().replace(batch_dim=0)
    r = tropt.diagnose(setup, checks=["loop.zero_grad"], progress=False).results[0]
    assert r.status is Status.ERROR and "batch_dim=1" in r.summary


# ------------------------------------------------------------------ state the step keeps on ctx
def test_user_state_copies_plain_data_restores_stateful_objects_in_place_and_keeps_others():
    ctx = StepContext(nn.Linear(2, 2), None, None, None, None, None, 1, torch.device("cpu"))
    scaler, other = torch.amp.GradScaler("cpu", init_scale=8.0), object()
    ctx.it, ctx.hidden, ctx.scaler_wrapper, ctx.handle = 3, (torch.ones(2), torch.zeros(2)), scaler, other
    saved = ctx.user_state()
    ctx.it, ctx.extra = 9, 1
    ctx.hidden[0].add_(1)
    scaler.scale(torch.ones(()))
    scaler.update(new_scale=2.0)
    ctx.load_user_state(saved)
    assert ctx.it == 3 and torch.equal(ctx.hidden[0], torch.ones(2)) and not hasattr(ctx, "extra")
    assert ctx.scaler_wrapper is scaler and scaler.get_scale() == 8.0 and ctx.handle is other


def test_zero_grad_restores_the_hidden_state_kept_on_ctx(monkeypatch):
    setup = rl.word_lm_setup()
    assert check_zero_grad(setup).status is Status.PASS
    # Without restoring ctx.hidden, run B starts from the state run A left: a difference that is no leftover
    # gradient, which the check reports as not isolated (issue 27 §2) instead of naming a leak.
    monkeypatch.setattr(StepContext, "load_user_state", lambda self, state: None)
    r = check_zero_grad(setup)
    assert r.status is Status.WARN and "cause not isolated" in r.summary, r.summary
    assert "left over" not in r.summary.split("cause not isolated")[0], r.summary


def test_resume_names_a_counter_on_ctx_that_the_users_checkpoint_forgets():
    def save(ctx):
        return {"model": ctx.model.state_dict(), "optimizer": ctx.optimizer.state_dict()}

    def load(ctx, state):
        ctx.model.load_state_dict(state["model"])
        ctx.optimizer.load_state_dict(state["optimizer"])

    assert check_resume(rl.nanogpt_setup()).status is Status.PASS  # tropt's checkpoint carries ctx.it
    r = check_resume(rl.nanogpt_setup().replace(save_state=save, load_state=load))
    assert r.status is Status.FAIL and "step attributes" in r.summary, r.summary


# ------------------------------------------------------------------ hand-set learning rates and optimizer-less steps
def _constant_lr_step(ctx, micro_batches):
    for g in ctx.optimizer.param_groups:
        g["lr"] = 0.05
    tropt.standard_step(ctx, micro_batches)


def _mlp_setup(**kw):
    x, y = make_classification(n=64, d=8, classes=3)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    return tropt.Setup(model, ce_loss, kw.pop("optimizer", lambda m: torch.optim.SGD(m.parameters(), lr=0.1)),
                       [(x[:32], y[:32]), (x[32:], y[32:])], num_classes=3, **kw)


def test_scheduler_cadence_skips_only_when_the_lr_never_changes():
    r = check_scheduler_cadence(_mlp_setup(step=_constant_lr_step, accumulation_steps=4))
    assert r.status is Status.SKIP and "never changed" in r.summary
    r = check_scheduler_cadence(rl.nanogpt_setup())  # no scheduler object, but the LR moves: compared
    assert r.status is Status.PASS and r.metrics["schedule"] == "set by hand in the step"
    assert check_scheduler_cadence(rl.manual_sgd_setup()).status is Status.SKIP


def test_a_counter_kept_outside_ctx_is_named_not_failed():
    state = {"it": 0}  # a module-level counter: every run continues where the last one stopped

    def step(ctx, micro_batches):
        for g in ctx.optimizer.param_groups:
            g["lr"] = rl.get_lr(state["it"])
        tropt.standard_step(ctx, micro_batches)
        state["it"] += 1

    r = check_scheduler_cadence(_mlp_setup(step=step, accumulation_steps=4))
    assert r.status is Status.WARN and "outside ctx" in r.summary, r.summary


def test_lr_range_skips_a_step_that_sets_its_own_lr_and_an_optimizer_less_step():
    r = tropt.diagnose(rl.nanogpt_setup(), checks=["dynamics.lr_range"], progress=False).results[0]
    assert r.status is Status.SKIP and "sets the learning rate itself" in r.summary
    r = tropt.diagnose(rl.manual_sgd_setup(), checks=["dynamics.lr_range"], progress=False).results[0]
    assert r.status is Status.SKIP and "optimizer=None" in r.summary


def test_dynamics_and_perf_run_on_an_optimizer_less_step():
    results = tropt.diagnose(rl.manual_sgd_setup(), checks=["dynamics.loss_curve", "perf"], progress=False).results
    assert all(r.status is not Status.ERROR for r in results), [(r.check, r.summary) for r in results]


def test_gradient_flow_sees_a_hand_update_that_clears_gradients_after_it():
    def step(ctx, micro_batches):
        for mb in micro_batches:
            (ctx.loss_fn(ctx.model, mb) / len(micro_batches)).backward()
        with torch.no_grad():
            for p in ctx.model.parameters():
                p -= 0.5 * p.grad
                p.grad = None  # cleared right after the update: the gradients are gone when the call returns

    r = tropt.diagnose(_mlp_setup(optimizer=None, step=step), checks=["model.gradient_flow", "model.overfit_batch"],
                       progress=False).results
    assert {x.check: x.status for x in r} == {"model.gradient_flow": Status.PASS, "model.overfit_batch": Status.PASS}, \
        [x.summary for x in r]


# ------------------------------------------------------------------ scalers
def test_fp32_with_a_scaler_is_accepted_and_warned_about():
    setup = _mlp_setup(use_scaler=True, precision="fp32", accumulation_steps=2)
    results = {r.check: r for r in tropt.diagnose(setup, checks=["loop"], progress=False).results}
    assert results["loop.loss_scaling"].status is Status.WARN and "unnecessary" in results["loop.loss_scaling"].summary
    assert not [c for c, r in results.items() if r.status in (Status.FAIL, Status.ERROR)]


def test_scaler_watch_puts_gradscaler_back_even_on_error():
    original = torch.amp.GradScaler.__dict__["scale"]
    with pytest.raises(RuntimeError), ScalerWatch(init_scale=4.0) as watch:
        s = torch.amp.GradScaler("cpu")
        s.scale(torch.ones(()))
        assert watch.current is s and s.get_scale() == 4.0
        raise RuntimeError("boom")
    assert torch.amp.GradScaler.__dict__["scale"] is original


def test_steps_per_call_note_names_the_count():
    assert steps_per_call_note([1, 1, 0]) is None
    assert "ran 3 times" in steps_per_call_note([1, 3])


def test_setup_without_an_optimizer_argument_needs_only_the_step():
    x, y = make_classification(n=32, d=8, classes=3)

    def step(ctx, micro_batches):
        assert ctx.optimizer is None
        ctx.model.zero_grad()
        for mb in micro_batches:
            (ctx.loss_fn(ctx.model, mb) / len(micro_batches)).backward()
        for p in ctx.model.parameters():
            p.data.add_(p.grad, alpha=-0.1)

    setup = tropt.Setup(nn.Linear(8, 3), ce_loss, train_data=[(x, y)], step=step)
    assert setup.optimizer is None and setup.validate().describe()["optimizer"] is None
    r = check_zero_grad(setup)
    assert r.status is Status.PASS and r.metrics["observed_at"] == "parameter change"


# ------------------------------------------------------------------ an optimizer over frozen parameters only
def _frozen_backbone_setup(**kw):
    """The optimizer is built over the frozen backbone; the trainable head is in no optimizer (a TrainCheck error)."""
    setup = _mlp_setup(optimizer=lambda m: torch.optim.SGD(m[0].parameters(), lr=0.1), **kw)
    for p in setup.model[0].parameters():
        p.requires_grad_(False)
    return setup


def test_an_optimizer_holding_only_frozen_parameters_is_named_by_zero_grad_and_gradient_flow():
    setup = _frozen_backbone_setup()
    results = {"loop.zero_grad": check_zero_grad(setup), "model.gradient_flow": check_gradient_flow(setup,
                                                                                                    progress=False)}
    for cid, r in results.items():
        assert r.status is Status.FAIL, (cid, r.summary)
        assert "never called optimizer.step()" not in r.summary, (cid, r.summary)  # it did call it
        assert "every parameter the optimizer holds (2: '0.weight', '0.bias') has requires_grad=False" in r.summary
        assert "the 2 trainable parameter(s) ('2.weight', '2.bias') are in no optimizer" in r.summary
        assert any("p.requires_grad" in a for a in r.advice), r.advice
        assert r.tables["optimizer_parameters"]["in_optimizer"].tolist() == [True, True, False, False]
    assert results["loop.zero_grad"].metrics["frozen_in_optimizer"] == 2


def test_a_step_that_skips_the_update_of_a_frozen_optimizer_names_it_in_the_error():
    def step_if_any_gradient(ctx, micro_batches):
        for mb in micro_batches:
            (ctx.loss_fn(ctx.model, mb) / len(micro_batches)).backward()
        if any(p.grad is not None for g in ctx.optimizer.param_groups for p in g["params"]):
            ctx.optimizer.step()  # skipped: the parameters the optimizer holds never get a gradient
        ctx.optimizer.zero_grad()

    with pytest.raises(StepError) as info:
        check_zero_grad(_frozen_backbone_setup(step=step_if_any_gradient))
    assert "never called optimizer.step()" in info.value.message  # true here
    assert "every parameter the optimizer holds (2: '0.weight', '0.bias') has requires_grad=False" in info.value.message
    assert "p.requires_grad" in info.value.fix
