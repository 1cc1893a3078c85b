"""loop.train_mode with known answers: dropout and batch norm train in train mode, and the metric evaluates in eval."""

from __future__ import annotations

import pytest
import torch
from support import contract_cases as cc
from support.contract_support import caught_by_exactly
from torch import nn
from torch.nn import functional as F

import tropt
from tropt.loop import check_train_mode
from tropt.result import Status
from tropt.testing import untouched

MODE_CASES = ["model_left_in_eval_mode", "eval_inside_step", "frozen_backbone", "metric_in_train_mode"]


@pytest.mark.parametrize("case", MODE_CASES)
def test_each_case_is_caught_by_exactly_its_check(case):
    caught_by_exactly(case)


def run(setup, **kw):
    with untouched(setup):
        return check_train_mode(setup, **kw)


def verdicts(result):
    return dict(zip(result.tables["modules"]["module"], result.tables["modules"]["verdict"]))


def test_a_model_in_train_mode_passes_and_the_metric_in_eval_mode_too():
    r = run(cc.healthy())
    assert r.status is Status.PASS, r.summary
    assert verdicts(r) == {"1": "ok", "3": "ok"}  # BatchNorm1d and Dropout
    assert set(r.tables["modules"]["in_metric"]) == {"eval"} and r.metrics["metric_first"] == r.metrics["metric_second"]


def test_a_model_left_in_eval_mode_fails_naming_the_modules():
    s = cc.model_left_in_eval_mode()
    r = run(s)
    assert r.status is Status.FAIL and verdicts(r) == {"1": "eval while training", "3": "eval while training"}
    assert "'1', '3'" in r.summary and "handed over in eval mode" in r.summary and "model.train()" in r.advice[0]
    assert not s.model.training  # the user's model keeps its mode (untouched() checks every module too)
    r.plot()


def test_model_eval_inside_the_step_fails_and_says_so():
    r = run(cc.eval_inside_step())
    assert r.status is Status.FAIL and "your step switches them to eval mode" in r.summary
    assert set(r.tables["modules"]["handed_over"]) == {"train"} and set(r.tables["modules"]["in_step"]) == {"eval"}


def test_a_frozen_backbone_is_listed_not_failed():
    r = run(cc.frozen_backbone())
    assert r.status is Status.PASS, r.summary
    assert verdicts(r) == {"backbone.1": "frozen: listed", "head.0": "ok"}
    assert "1 frozen module(s) in eval mode on purpose: 'backbone.1'" in r.summary


def test_eval_mode_without_requires_grad_false_is_not_frozen():
    model = cc.FrozenBackbone()
    for p in model.backbone.parameters():
        p.requires_grad_(True)  # eval mode, but trained: the running statistics go stale while the weights move
    r = run(cc.make(model=model))
    assert r.status is Status.FAIL and verdicts(r)["backbone.1"] == "eval while training"


def test_a_metric_that_switches_to_train_mode_warns_with_the_differing_scores():
    r = run(cc.metric_in_train_mode())
    assert r.status is Status.WARN and "the metric runs '1', '3' in train mode" in r.summary
    assert r.metrics["metric_first"] != r.metrics["metric_second"] and "model.eval()" in r.advice[0]


def test_random_val_data_is_a_note_not_a_train_mode_warning():
    r = run(cc.random_val_transform())
    # noisy inputs, eval mode
    assert r.status is Status.PASS and r.metrics["metric_first"] != r.metrics["metric_second"]
    assert r.metrics["train_in_metric"] == 0 and "see data.eval_transforms" in r.summary


def test_skip_without_mode_dependent_modules(tiny_setup):
    r = run(tiny_setup)
    assert r.status is Status.SKIP and "no dropout or batch-norm" in r.summary


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_without_an_optimizer_the_modes_are_read_per_call_of_the_step(monkeypatch, mode):
    """A loop that updates parameters by hand (no optimizer: ctx.optimizer is None) is observed call by call."""
    import dataclasses

    def sgd_by_hand(ctx, micro_batches):
        getattr(ctx.model, mode)()
        for mb in micro_batches:
            ctx.loss_fn(ctx.model, mb).backward()
        with torch.no_grad():
            for p in ctx.model.parameters():
                if p.grad is not None:
                    p -= 0.01 * p.grad
                    p.grad = None

    build = tropt.Setup.build
    setup = cc.make(step=sgd_by_hand).validate()  # validated with its optimizer; the check's own copies get none
    monkeypatch.setattr(tropt.Setup, "build", lambda self, **kw: dataclasses.replace(build(self, **kw), optimizer=None))

    r = run(setup)
    assert r.metrics["grouped_by"] == "call of the step (no optimizer)" and r.metrics["updates_observed"] == 2
    assert r.status is (Status.FAIL if mode == "eval" else Status.PASS), r.summary
    assert set(r.tables["modules"]["in_step"]) == {mode} and set(r.tables["modules"]["at_optimizer_step"]) == {"n/a"}


def test_steps_must_be_positive():
    with pytest.raises(tropt.TroptError, match="steps >= 1"):
        check_train_mode(cc.healthy(), steps=0)


# ------------------------------------------------------------------ eval-mode determinism (issue 27, section 4)
class FunctionalDropout(nn.Module):
    """Dropout written as a call, not a module: no nn.Dropout for a mode switch to reach.

    ``how``: "default" calls F.dropout(h, 0.5) (its training flag defaults to True), "explicit" passes training=True,
    "follows_mode" passes training=self.training (correct), "attention" runs scaled_dot_product_attention with a
    dropout_p that ignores the mode.
    """

    def __init__(self, how: str, with_module: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.how = how
        self.inp, self.out = nn.Linear(cc.D, 64), nn.Linear(64, cc.C)
        self.drop = nn.Dropout(0.1) if with_module else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x))
        if self.how == "default":
            h = F.dropout(h, 0.5)
        elif self.how == "explicit":
            h = F.dropout(h, 0.5, training=True)
        elif self.how == "follows_mode":
            h = F.dropout(h, 0.5, training=self.training)
        elif self.how == "attention":
            q = h.view(len(h), 8, 8)
            h = F.scaled_dot_product_attention(q, q, q, dropout_p=0.3).reshape(len(h), 64)
        return self.out(self.drop(h))


@pytest.mark.parametrize("how", ["default", "explicit"])
def test_functional_dropout_that_ignores_eval_mode_warns_naming_it(how):
    r = run(cc.make(model=FunctionalDropout(how)))
    assert r.status is Status.WARN, r.summary  # it SKIPped: no nn.Dropout module
    assert "two evaluations of the model in eval mode on the same batch differ" in r.summary
    assert "F.dropout(p=0.5, training=True)" in r.summary and "in '(model)'" in r.summary
    table = r.tables["functional_dropout"]
    assert list(table["function"]) == ["F.dropout"] and list(table["calls"]) == [2]  # once per evaluation
    assert r.metrics["eval_loss_first"] != r.metrics["eval_loss_second"] and r.metrics["functional_dropout_calls"] == 2
    assert any("training=self.training" in a for a in r.advice)


def test_attention_dropout_that_ignores_eval_mode_warns_naming_it():
    r = run(cc.make(model=FunctionalDropout("attention")))
    assert r.status is Status.WARN and "F.scaled_dot_product_attention(dropout_p=0.3)" in r.summary, r.summary


def test_functional_dropout_next_to_a_dropout_module_is_still_found():
    """The step trains its nn.Dropout in train mode (PASS before), but eval mode is not deterministic."""
    r = run(cc.make(model=FunctionalDropout("explicit", with_module=True)))
    assert r.status is Status.WARN and verdicts(r) == {"drop": "ok"}, r.summary
    assert "F.dropout(p=0.5, training=True)" in r.summary


def test_functional_dropout_is_added_to_a_train_mode_failure():
    r = run(cc.make(model=FunctionalDropout("explicit", with_module=True).eval()))
    assert r.status is Status.FAIL and "handed over in eval mode" in r.summary, r.summary
    assert "F.dropout(p=0.5, training=True)" in r.summary and len(r.tables["functional_dropout"]) == 1


def test_functional_dropout_that_follows_the_mode_does_not_warn():
    """F.dropout(training=self.training) (pygcn, pyg's examples): no module to hook, but the forward reads the mode
    and the loss changes with it, so the model is watched and the step, in train mode, passes."""
    r = run(cc.make(model=FunctionalDropout("follows_mode")))
    assert r.status is Status.PASS and verdicts(r) == {"(model)": "ok"}, r.summary


def test_functional_dropout_that_follows_the_mode_catches_a_step_in_eval_mode():
    """pygcn's train() without its model.train(): from the second call on, the functional dropout is off."""
    def step_eval(ctx, micro_batches):
        ctx.model.eval()
        return tropt.standard_step(ctx, micro_batches)

    r = run(cc.make(model=FunctionalDropout("follows_mode")).replace(step=step_eval))
    assert r.status is Status.FAIL and "'(model)'" in r.summary, r.summary


def test_a_validation_forward_under_no_grad_after_the_step_is_not_training():
    """pygcn's train() (not fastmode): optimizer.step(), then model.eval() and a validation forward under no_grad;
    the next call starts with model.train(). Every forward that feeds an update ran in train mode."""
    def step_then_validate(ctx, micro_batches):
        ctx.model.train()
        loss = tropt.standard_step(ctx, micro_batches)
        ctx.model.eval()
        with torch.no_grad():
            ctx.loss_fn(ctx.model, micro_batches[0])
        return loss

    r = run(cc.make(model=FunctionalDropout("explicit", with_module=True)).replace(step=step_then_validate))
    assert r.status is not Status.FAIL and verdicts(r) == {"drop": "ok"}, r.summary


def noisy_loss(model, batch):
    """A diffusion-style objective: the loss draws its own noise; the model itself is deterministic."""
    x, y = batch
    return F.cross_entropy(model(x + 0.5 * torch.randn_like(x)), y)


def test_randomness_drawn_by_the_loss_is_a_note_not_a_warning():
    r = run(cc.make(model=cc.net(bn=False, dropout=0.0)).replace(loss_fn=noisy_loss))
    assert r.status is Status.SKIP, r.summary  # no dropout at all: nothing to warn about
    assert r.metrics["eval_rel_diff"] > 0 and r.metrics["eval_same_seed_agree"] is True
    assert "random draws" in r.summary and "the same RNG state" in r.summary


# ------------------------------------------------------------------ losses that differentiate inside themselves
def test_eval_mode_determinism_is_checked_for_a_loss_with_a_gradient_penalty():
    """The eval-mode probe evaluates WGAN-GP's loss (autograd.grad inside loss_fn) with gradients enabled instead of
    reporting it "not checked"; the dropout of the critic runs in train mode in the step."""
    from support.grad_penalty import D as GD
    from support.grad_penalty import wgan_gp_setup

    torch.manual_seed(0)
    critic = nn.Sequential(nn.Linear(GD, 64), nn.LeakyReLU(0.2), nn.Dropout(0.1), nn.Linear(64, 1))
    r = run(wgan_gp_setup(critic))
    assert r.status is Status.PASS, r.summary
    assert "not checked" not in r.summary and "eval_loss_first" in r.metrics, r.summary


# ------------------------------------------------------------------ BatchNorm held in eval mode on purpose
def test_norm_eval_batchnorm_held_in_eval_by_the_models_own_train_passes_naming_them():
    """mmdet's norm_eval=True: the backbone's train() puts every BatchNorm back in eval mode, on every call, while the
    affine weights of the later stages train. That is fine-tuning by design, not "model.eval() inside the step"."""
    from support.frozen_bn import norm_eval_setup

    r = run(norm_eval_setup())
    assert r.status is Status.PASS, r.summary
    v = verdicts(r)
    assert v["backbone.stem.1"] == "frozen: listed"  # frozen stage: requires_grad=False
    assert v["backbone.layer1.1"] == "frozen: listed"
    assert v["backbone.layer2.1"] == "held in eval by train(): listed"  # trainable affine weights, eval by design
    assert "held in eval mode by the model's own train()" in r.summary and "'backbone.layer2.1'" in r.summary
    assert r.metrics["held_in_eval"] == 1


def test_norm_eval_backbone_with_a_step_that_calls_eval_still_fails_on_the_rest():
    """The same backbone, but the step calls model.eval(): the head's dropout is not held in eval by train()."""
    from support.frozen_bn import norm_eval_setup

    def step_eval(ctx, micro_batches):
        ctx.model.eval()
        return tropt.standard_step(ctx, micro_batches)

    r = run(norm_eval_setup(step=step_eval, dropout=0.2))
    assert r.status is Status.FAIL and "model.eval() inside the step" in r.summary, r.summary
    v = verdicts(r)
    assert v["head.0"] == "eval while training" and v["backbone.layer2.1"] == "held in eval by train(): listed"
    assert "'head.0'" in r.summary and "backbone.layer2.1" not in r.summary.split(";")[0]


def test_without_norm_eval_the_trainable_batchnorm_runs_in_train_mode():
    from support.frozen_bn import norm_eval_setup

    r = run(norm_eval_setup(norm_eval=False))
    assert r.status is Status.PASS and verdicts(r)["backbone.layer2.1"] == "ok", r.summary
    assert r.metrics["held_in_eval"] == 0


def test_batchnorm_put_in_eval_by_the_step_fails_unless_declared():
    """faster-rcnn.pytorch's model.apply(set_bn_eval) inside the step, with trainable affine weights: from the modes
    alone it is a model.eval() in the step (FAIL); declared with held_in_eval it is listed (PASS)."""
    from support.frozen_bn import norm_eval_setup, step_with_bn_eval

    s = norm_eval_setup(step=step_with_bn_eval, norm_eval=False)
    r = run(s)
    assert r.status is Status.FAIL and verdicts(r)["backbone.layer2.1"] == "eval while training", r.summary
    ok = run(s, held_in_eval=["backbone.layer2"])
    assert ok.status is Status.PASS, ok.summary
    assert verdicts(ok)["backbone.layer2.1"] == "declared held in eval: listed"
    assert "declared held in eval" in ok.summary


def test_held_in_eval_must_name_modules_of_the_model():
    from support.frozen_bn import norm_eval_setup

    with pytest.raises(tropt.TroptError, match="held_in_eval"):
        check_train_mode(norm_eval_setup(), held_in_eval=["no_such_module"])


def test_batchnorm_frozen_by_intent_but_in_train_mode_warns_its_statistics_still_update():
    """requires_grad=False on a stage whose BatchNorm runs in train mode: the weights are frozen, the running
    statistics are not. mmdet's frozen_stages puts those stages in eval; without it, a WARN names the modules."""
    from support.frozen_bn import norm_eval_setup

    class NoFreezeInTrain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            from support.frozen_bn import conv_bn

            torch.manual_seed(0)
            self.stem, self.layer1 = conv_bn(3, 8), conv_bn(8, 16)
            for p in self.stem.parameters():
                p.requires_grad = False  # frozen by intent, but model.train() puts its BatchNorm in train mode

        def forward(self, x):
            return self.layer1(self.stem(x))

    s = norm_eval_setup()
    from support.frozen_bn import Classifier

    r = run(s.replace(model=Classifier(NoFreezeInTrain()).train()))
    assert r.status is Status.WARN, r.summary
    assert verdicts(r)["backbone.stem.1"] == "frozen, statistics still updating"
    assert "'backbone.stem.1'" in r.summary and "running statistics still update" in r.summary
    assert r.metrics["frozen_in_train"] == 1
    assert run(s).metrics["frozen_in_train"] == 0  # mmdet's frozen_stages: the frozen stem is in eval
