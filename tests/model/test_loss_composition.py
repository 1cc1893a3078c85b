"""model.init_loss names how loss_fn composes the output with the loss: softmax/sigmoid before a loss that expects
logits (in the model or in loss_fn) and a target that broadcasts against the output. Each FAIL names the line."""

from __future__ import annotations

import warnings

import pytest
import torch
from support.model_fixtures import D, healthy, mlp, setup_for
from torch import nn
from torch.nn import functional as F

from tropt.model import check_init_loss
from tropt.result import Status
from tropt.testing import untouched


def run(setup):
    with untouched(setup), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the broadcasting loss warns on every call
        return check_init_loss(setup, progress=False)


def regression_batches(binary: bool = False):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(128, D, generator=g)
    y = 2.0 * x[:, 0]
    if binary:
        y = (y > 0).float()
    return [(x[i:i + 32], y[i:i + 32]) for i in range(0, 128, 32)]


def softmax_then_ce(m, b):
    x, y = b
    return F.cross_entropy(F.softmax(m(x), -1), y)


def sigmoid_then_bce_logits(m, b):
    return F.binary_cross_entropy_with_logits(torch.sigmoid(m(b[0])).squeeze(1), b[1])


def broadcast_mse(m, b):
    return F.mse_loss(m(b[0]), b[1])


def broadcast_by_hand(m, b):
    return ((m(b[0]) - b[1]) ** 2).mean()


def test_softmax_in_loss_fn_before_cross_entropy_fails_naming_the_line():
    r = run(setup_for(mlp(), loss=softmax_then_ce))
    assert r.status is Status.FAIL, r.summary
    assert "softmax is applied before cross_entropy" in r.summary
    assert r.metrics["double_squash_squash_in"] == "loss_fn"
    assert "F.cross_entropy(F.softmax(m(x), -1), y)" in r.metrics["double_squash_line"]
    assert "test_loss_composition.py:" in r.advice[0] and "drop the softmax" in r.advice[0]


def test_sigmoid_in_loss_fn_before_bce_with_logits_fails():
    r = run(setup_for(mlp(out=1), loss=sigmoid_then_bce_logits, batches=regression_batches(binary=True)))
    assert r.status is Status.FAIL and r.metrics["double_squash_squash"] == "sigmoid"
    assert r.metrics["double_squash_loss"] == "binary_cross_entropy_with_logits"
    assert "torch.sigmoid" in r.metrics["double_squash_line"]


def test_softmax_module_in_the_model_fails_naming_the_module():
    r = run(setup_for(nn.Sequential(mlp(), nn.Softmax(-1))))
    assert r.status is Status.FAIL and r.metrics["double_squash_squash_in"] == "model"
    assert "Softmax module `1`" in r.summary and "Remove the softmax" in r.advice[0]


@pytest.mark.parametrize("loss", [broadcast_mse, broadcast_by_hand], ids=["mse_loss", "by_hand"])
def test_broadcasting_regression_target_fails_naming_the_shapes(loss):
    r = run(setup_for(mlp(out=1), loss=loss, batches=regression_batches()))
    assert r.status is Status.FAIL, r.summary
    assert "(32, 1)" in r.summary and "(32,)" in r.summary and "(32, 32)" in r.summary
    assert "squeeze" in r.advice[0]
    if loss is broadcast_mse:
        assert "F.mse_loss(m(b[0]), b[1])" in r.metrics["broadcast_line"]


@pytest.mark.parametrize("width,loss", [
    (1, lambda m, b: F.mse_loss(m(b[0]).squeeze(-1), b[1])),
    (1, lambda m, b: F.binary_cross_entropy(torch.sigmoid(m(b[0])).squeeze(1), (b[1] > 0).float())),
    (2, lambda m, b: F.nll_loss(F.log_softmax(m(b[0]), -1), (b[1] > 0).long())),
], ids=["mse_same_shape", "bce_on_sigmoid", "nll_on_log_softmax"])
def test_correct_compositions_do_not_fail(width, loss):
    r = run(setup_for(mlp(out=width), loss=loss, batches=regression_batches()))
    assert r.status is not Status.FAIL, r.summary
    assert "composition" not in r.metrics


def test_healthy_cross_entropy_has_no_composition_finding():
    r = run(healthy())
    assert r.status is Status.PASS and "composition" not in r.metrics


class LossInside(nn.Module):
    """A Hugging Face-style model that computes its loss from labels=, with softmax before cross entropy."""

    def __init__(self):
        super().__init__()
        self.body = mlp()

    def forward(self, x, labels=None):
        logits = self.body(x)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = F.cross_entropy(logits.softmax(-1), labels)
        return out


def test_softmax_in_a_loss_computed_inside_the_model_names_its_forward_line():
    r = run(setup_for(LossInside(), loss=lambda m, b: m(b[0], labels=b[1])["loss"]))
    assert r.status is Status.FAIL and "loss computed in the model's forward" in r.summary
    assert "F.cross_entropy(logits.softmax(-1), labels)" in r.metrics["double_squash_line"]


@pytest.mark.parametrize("case", ["softmax_in_loss_fn", "broadcast"])
def test_overfit_batch_names_the_composition_as_the_cause_of_its_stall(case):
    from tropt.model import check_overfit_batch

    setup = (setup_for(mlp(), loss=softmax_then_ce) if case == "softmax_in_loss_fn"
             else setup_for(mlp(out=1), loss=broadcast_mse, batches=regression_batches()))
    with untouched(setup), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = check_overfit_batch(setup, progress=False)
    assert r.status is Status.FAIL, r.summary
    assert r.metrics["composition"] == ("double_squash" if case == "softmax_in_loss_fn" else "broadcast")
    assert "not one tropt recognises" not in r.summary and "ignores its input" not in r.summary


def test_a_sigmoid_on_the_target_of_bce_with_logits_is_not_flagged():
    """Distillation-style soft targets (a teacher's sigmoid, with gradient) are the target, not the prediction."""
    torch.manual_seed(1)
    teacher = nn.Linear(D, 1)

    def distil(m, b):
        return F.binary_cross_entropy_with_logits(m(b[0]).squeeze(1), torch.sigmoid(teacher(b[0])).squeeze(1))

    r = run(setup_for(mlp(out=1), loss=distil, batches=regression_batches()))
    assert "composition" not in r.metrics, r.summary


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(D, D)

    def forward(self, x):
        w = torch.softmax(self.q(x) @ x.T, dim=-1)  # a softmax that is not the output's
        return w @ x


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(D, 3)

    def forward(self, x):
        return torch.softmax(self.fc(x), dim=-1)


def test_a_softmax_inside_a_submodule_names_that_submodule_not_another_softmax():
    torch.manual_seed(0)
    model = nn.Sequential(Attention(), Head())
    r = run(setup_for(model))
    assert r.status is Status.FAIL and r.metrics["double_squash_squash_in"] == "model"
    assert "forward of `1`" in r.summary and "torch.softmax(self.fc(x), dim=-1)" in r.summary, r.summary
