"""model.init_loss: the loss at initialisation against the objective's chance level; each planted fault is named."""

from __future__ import annotations

import math

import pytest
import torch
from support.model_fixtures import C, D, adam, data, mlp, run, setup_for
from torch import nn
from torch.nn import functional as F

import tropt
from tropt.model import check_init_loss
from tropt.result import Status


def badly_scaled_last() -> nn.Sequential:
    m = mlp()
    with torch.no_grad():
        m[4].weight.mul_(100.0)
    return m


def test_badly_scaled_last_layer_fails_init_loss_and_names_it():
    r = run(check_init_loss, setup_for(badly_scaled_last()))
    assert r.status is Status.FAIL
    assert r.metrics["ratio"] > 3 and r.metrics["last_layer"] == "4"
    assert "last layer (4)" in r.summary
    assert any("Scale down the weights of the last layer (4)" in a for a in r.advice)
    assert any("log class priors" in a for a in r.advice)


def test_mildly_scaled_last_layer_warns():
    m = mlp()
    with torch.no_grad():
        m[4].weight.mul_(12.0)
    r = run(check_init_loss, setup_for(m))
    assert r.status is Status.WARN, r.summary
    assert 1.5 < r.metrics["ratio"] <= 3


def test_init_loss_binary_and_regression_objectives():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(128, D, generator=g)
    yb = (x[:, 0] > 0).float()
    bce = setup_for(mlp(out=1), loss=lambda m, b: F.binary_cross_entropy_with_logits(m(b[0]).squeeze(1), b[1]),
                    batches=[(x[i:i + 32], yb[i:i + 32]) for i in range(0, 128, 32)])
    r = run(check_init_loss, bce)
    assert r.status is Status.PASS and r.metrics["objective"] == "bce_logits"
    assert r.metrics["expected_loss"] == pytest.approx(math.log(2))

    y = 50.0 + 2.0 * x[:, 0]  # label mean far from the near-zero outputs at init
    mse = lambda m, b: F.mse_loss(m(b[0]).squeeze(1), b[1])  # noqa: E731
    far = run(check_init_loss,
              setup_for(mlp(out=1), loss=mse, batches=[(x[i:i + 32], y[i:i + 32]) for i in range(0, 128, 32)]))
    assert far.status is Status.FAIL and far.metrics["objective"] == "mse"
    assert far.metrics["expected_loss"] == pytest.approx(float(y.var(unbiased=False)), rel=1e-4)
    assert any("bias of the last layer (4) to the label mean (49.9)" in a for a in far.advice)
    ys = (y - y.mean()) / y.std()
    near = run(check_init_loss,
               setup_for(mlp(out=1), loss=mse, batches=[(x[i:i + 32], ys[i:i + 32]) for i in range(0, 128, 32)]))
    assert near.status is Status.PASS


def test_init_loss_skips_with_reason_when_objective_unknown():
    weird = lambda m, b: (m(b[0]) ** 4).mean() + 0.123  # noqa: E731 - not a standard objective
    r = run(check_init_loss, setup_for(mlp(), loss=weird))
    assert r.status is Status.SKIP and "could not infer the objective" in r.summary


def test_init_loss_names_a_regression_offset_an_input_scale_and_a_class_count_mismatch():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(128, D, generator=g)
    y = 150 + 20 * torch.randn(128, generator=g)
    torch.manual_seed(0)
    reg = tropt.Setup(nn.Sequential(nn.Linear(D, 16), nn.ReLU(), nn.Linear(16, 1)),
                      lambda m, b: F.mse_loss(m(b[0]).squeeze(-1), b[1]), adam(),
                      [(x[i:i + 32], y[i:i + 32]) for i in range(0, 128, 32)])
    r = run(check_init_loss, reg)
    assert r.status is Status.FAIL and "target's mean (1" in r.summary and r.metrics["offset_share"] > 0.9
    raw = run(check_init_loss, setup_for(mlp(), batches=[(bx * 300, by) for bx, by in data()]))
    assert raw.advice[0].startswith("batch[0] has RMS") and "large" in raw.advice[0]
    assert raw.tables["input_scale"]["rms"].iloc[0] > 100
    wrong = run(check_init_loss, setup_for(mlp(), num_classes=C + 2))
    assert wrong.status is Status.WARN and wrong.metrics["output_classes"] == C
    assert wrong.summary.startswith(f"the model outputs {C} class scores but the Setup says num_classes={C + 2}")


# ------------------------------------------------------------------ losses that differentiate inside themselves
def test_a_gradient_penalty_inside_the_loss_is_evaluated_with_gradients():
    """WGAN-GP's critic loss calls autograd.grad(create_graph=True) inside loss_fn: it cannot run under no_grad. The
    probe evaluates it with gradients enabled (a custom loss: SKIP, never ERROR) and leaves grad mode as it was."""
    from support.grad_penalty import wgan_gp_setup

    r = run(check_init_loss, wgan_gp_setup())
    assert r.status is Status.SKIP, r.summary
    assert "could not infer the objective" in r.summary and math.isfinite(r.metrics["init_loss"])
    assert torch.is_grad_enabled()


def test_double_backprop_loss_is_judged_and_its_softmax_before_cross_entropy_still_found():
    """Cross entropy plus an input-gradient penalty: its chance level is judged (PASS), and a softmax before the cross
    entropy is still named."""
    from support.grad_penalty import classifier, double_backprop_setup

    r = run(check_init_loss, double_backprop_setup())
    assert r.status is Status.PASS and "ln C = ln 3" in r.summary, r.summary
    bad = run(check_init_loss, double_backprop_setup(classifier(softmax=True)))
    assert bad.status is Status.FAIL and "softmax is applied before cross_entropy" in bad.summary, bad.summary


# ------------------------------------------------------------------ dynamic padding: batches of different widths
class _Tagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.out = nn.Embedding(20, 16), nn.Linear(16, 4)

    def forward(self, ids):
        return self.out(self.emb(ids))  # (batch, length, classes)


def _tagging_setup(metric=None) -> tropt.Setup:
    """Token classification with every batch padded to its own longest sequence (a HF token-classification or MLM
    collator): the outputs and labels of two batches have different widths."""
    g = torch.Generator().manual_seed(0)
    batches = []
    for length in (7, 11, 9, 5):
        ids = torch.randint(1, 20, (8, length), generator=g)
        labels = ids % 4
        labels[:, -2:] = -100  # padding and subword continuations ignored
        batches.append({"ids": ids, "labels": labels})

    def loss_fn(m, b):
        return F.cross_entropy(m(b["ids"]).transpose(1, 2), b["labels"], ignore_index=-100)

    return tropt.Setup(_Tagger(), loss_fn, adam(1e-3), batches[:3], val_data=batches[3:] + batches[:1],
                       num_classes=4, metric=metric)


def test_token_outputs_of_batches_padded_to_different_widths_are_read_whole():
    """The init-loss statistics read the outputs' mean, spread and largest value only: batches of 7, 11 and 9 tokens
    used to be concatenated per sample and ERRORed (torch.cat size mismatch). 4 classes at init: ln 4."""
    r = run(check_init_loss, _tagging_setup())
    assert r.status is Status.PASS, r.summary
    assert r.metrics["expected_loss"] == pytest.approx(math.log(4), rel=1e-6)


def test_eval_metric_reads_token_labels_of_different_widths():
    from tropt.model import check_eval_metric

    def token_accuracy(model, val_data):
        with torch.no_grad():
            hits = [(model(b["ids"]).argmax(-1) == b["labels"])[b["labels"] != -100].float() for b in val_data]
        return float(torch.cat(hits).mean())

    r = run(check_eval_metric, _tagging_setup(tropt.Metric(token_accuracy, higher_is_better=True)))
    assert r.status is Status.PASS, r.summary  # it used to ERROR on torch.cat before any predictor was scored
    scores = r.tables["scores"].set_index("predictor")["score"]
    assert scores["perfect"] == 1.0 and {"majority_class", "shuffled", "random"} <= set(scores.index)
