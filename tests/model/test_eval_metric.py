"""model.eval_metric with known answers: trivial predictors scored by the Setup's own Metric."""

from __future__ import annotations

import pytest
import torch
from support import contract_cases as cc
from support.contract_support import caught_by_exactly
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import tropt
from tropt.errors import StepError
from tropt.model import check_eval_metric
from tropt.model.eval_metric import ConstantPredictor, PerfectPredictor
from tropt.result import Status
from tropt.testing import untouched

METRIC_CASES = ["accuracy_on_imbalanced_labels", "balanced_accuracy_on_imbalanced_labels",
                "metric_closing_over_the_original_model", "metric_that_raises"]


@pytest.mark.parametrize("case", METRIC_CASES)
def test_each_case_is_caught_by_exactly_its_check(case):
    caught_by_exactly(case)


def run(setup, **kw):
    with untouched(setup):
        return check_eval_metric(setup, **kw)


def test_balanced_labels_with_accuracy_pass_with_every_score():
    r = run(cc.healthy())
    assert r.status is Status.PASS, r.summary
    scores = r.tables["scores"].set_index("predictor")["score"]
    assert list(scores.index) == ["model", "majority_class", "shuffled", "random", "perfect"]
    assert scores["perfect"] == 1.0 and scores["majority_class"] == pytest.approx(0.25)
    assert r.metrics["perfect_basis"] == "the true labels" and r.metrics["objective"] == "cross_entropy"
    r.plot()


def test_accuracy_on_95_5_labels_warns_and_names_better_metrics():
    r = run(cc.accuracy_on_imbalanced_labels())
    assert r.status is Status.WARN
    share = r.metrics["majority_share"]
    assert share > 0.9 and r.metrics["majority_class_score"] == pytest.approx(share)
    assert "always class 0" in r.summary and "already scores" in r.summary
    assert all(word in r.advice[0] for word in ("balanced accuracy", "AUROC", "F1"))


def test_balanced_accuracy_on_the_same_labels_passes():
    r = run(cc.balanced_accuracy_on_imbalanced_labels())
    assert r.status is Status.PASS and r.metrics["majority_class_score"] == pytest.approx(0.5), r.summary


def test_a_metric_that_ignores_the_model_it_is_given_fails():
    r = run(cc.metric_closing_over_the_original_model())
    assert r.status is Status.FAIL and "never calls the model it is given" in r.summary
    assert "not a function of the model's predictions" in r.summary and r.metrics["model_calls"] == 0


def test_a_metric_that_runs_the_model_but_ignores_its_output_fails():
    r = run(cc.make(metric=tropt.Metric(cc.label_share)))
    assert r.status is Status.FAIL and "for every predictor" in r.summary and "not a function" in r.summary
    assert r.tables["scores"]["score"].nunique() == 1 and len(r.tables["scores"]) == 5


class WithPredict(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = cc.net()

    def forward(self, x):
        return self.net(x)

    def predict(self, x):
        return self.forward(x).argmax(1)  # bypasses model(...): no wrapper can replace what it returns


def predict_accuracy(model, loader):
    hits = total = 0
    for x, y in loader:
        hits += int((model.predict(x) == y).sum())
        total += len(y)
    return hits / total


def test_a_metric_calling_a_custom_predict_is_not_blamed():
    r = run(cc.make(model=WithPredict(), metric=tropt.Metric(predict_accuracy)))
    assert r.status is Status.SKIP and "no trivial predictor could be scored" in r.summary, r.summary
    assert "model_calls" not in r.metrics and "model(...)" in r.advice[0]
    table = r.tables["scores"].set_index("predictor")
    assert table.loc["majority_class", "error"].startswith("the metric did not call this predictor")


def test_a_metric_that_raises_on_the_output_fails_with_the_error():
    r = run(cc.metric_that_raises())
    assert r.status is Status.FAIL and "raises on the model's output" in r.summary and "TypeError" in r.summary


@pytest.mark.parametrize("fn, message", [
    (lambda m, d: torch.ones(3), r"returned a tensor of shape \(3,\), expected one number"),
    (lambda m, d: float("nan"), "returned nan, not a finite number"),
    (lambda m, d: "0.9", "returned a str"),
])
def test_a_metric_returning_no_finite_number_is_a_clear_error(fn, message):
    s = cc.make(metric=tropt.Metric(fn))
    with untouched(s), pytest.raises(StepError, match=message):
        check_eval_metric(s)
    r = tropt.diagnose(s, checks=["model.eval_metric"], progress=False)["model.eval_metric"]
    assert r.status is Status.ERROR and r.advice  # the fix travels with the message


def test_skip_without_metric_or_val_data():
    assert run(cc.make(metric=None)).status is Status.SKIP
    r = run(cc.make(val=None))
    assert r.status is Status.SKIP and "val_data" in r.summary


def _regression(y_std: float):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, cc.D, generator=g)
    y = 10 + y_std * x[:, 0]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(cc.D, 16), nn.ReLU(), nn.Linear(16, 1))
    loss = lambda m, b: F.mse_loss(m(b[0]).squeeze(1), b[1])  # noqa: E731
    return (model, loss, DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True),
            DataLoader(TensorDataset(x[:128], y[:128]), batch_size=64))


def within_one(model, loader):
    """Share of predictions within 1.0 of the target: loose when the targets barely vary."""
    hits = total = 0
    for x, y in loader:
        hits += int(((model(x).squeeze(1) - y).abs() < 1.0).sum())
        total += len(y)
    return hits / total


def mse(model, loader):
    return (sum(float(F.mse_loss(model(x).squeeze(1), y, reduction="sum")) for x, y in loader)
            / sum(len(y) for _, y in loader))


def test_regression_constant_mean():
    model, loss, train, val = _regression(0.1)
    s = tropt.Setup(model, loss, lambda m: torch.optim.SGD(m.parameters(), lr=0.01), train, val_data=val,
                    metric=tropt.Metric(within_one))
    r = run(s)
    assert r.status is Status.WARN and r.metrics["constant_mean_score"] == 1.0 and "MAE" in r.advice[0]
    model, loss, train, val = _regression(2.0)
    s = tropt.Setup(model, loss, lambda m: torch.optim.SGD(m.parameters(), lr=0.01), train, val_data=val,
                    metric=tropt.Metric(mse, higher_is_better=False))
    r = run(s)
    assert r.status is Status.PASS, r.summary
    assert r.metrics["perfect_score"] == 0.0 and r.metrics["constant_mean_score"] == pytest.approx(4.0, rel=0.3)


def test_trivial_predictors_keep_the_output_format():
    """Dict outputs and a model whose first argument is not the only input: the wrappers replace the logits only."""

    class DictModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(cc.D, 2)
            self.config = "kept"

        def forward(self, x):
            return {"logits": self.lin(x), "hidden": x}

    from tropt.core.objective import Objective

    m = DictModel()
    x = torch.randn(5, cc.D)
    obj = Objective("cross_entropy", (1,), 2, 0)
    out = ConstantPredictor(m, obj, 1, "always 1")(x)
    assert set(out) == {"logits", "hidden"} and out["logits"].argmax(1).tolist() == [1] * 5
    assert torch.equal(out["hidden"], x) and ConstantPredictor(m, obj, 1, "").config == "kept"
    from tropt.core.hashes import row_hashes

    y = torch.tensor([0, 1, 1, 0, 1])
    perfect = PerfectPredictor(m, obj, dict(zip(row_hashes(x), y)))
    assert perfect(x)["logits"].argmax(1).tolist() == y.tolist()


def test_the_sample_setup_runs_the_new_checks(sample_module):
    """The bundled sample (data/samples/README.md): balanced accuracy, shuffled batches, the test split prepared with
    the training statistics; its MLP has no dropout or batch norm, so loop.train_mode has nothing to check."""
    s = sample_module.make_setup()
    with untouched(s):
        report = tropt.diagnose(s, checks=cc.NEW, progress=False)
    assert {r.check: r.status for r in report} == {"data.sampling": Status.PASS, "data.eval_transforms": Status.PASS,
                                                   "model.eval_metric": Status.PASS, "loop.train_mode": Status.SKIP}
    scores = report["model.eval_metric"].tables["scores"].set_index("predictor")["score"]
    assert scores["majority_class"] == 0.5 and scores["perfect"] == 1.0  # balanced accuracy cannot be gamed


# ------------------------------------------------------------------ metrics that read the model's own loss (issue 28)
class OwnLoss(nn.Module):
    """A Hugging Face-style classifier: ``model(x=..., labels=...)`` returns ``{"loss", "logits"}``, its loss cross
    entropy (``smoothing``: with label smoothing, a rule tropt does not reproduce)."""

    def __init__(self, smoothing: float = 0.0):
        super().__init__()
        torch.manual_seed(0)
        self.lin, self.smoothing = nn.Linear(cc.D, 3), smoothing

    def forward(self, x, labels=None):
        logits = self.lin(x)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = F.cross_entropy(logits, labels, label_smoothing=self.smoothing)
        return out


def neg_eval_loss(model, batches):
    """The Trainer's eval_loss (negated: higher is better): the mean of outputs.loss over the validation batches."""
    return -float(torch.stack([model(**b)["loss"] for b in batches]).mean())


def own_loss_setup(smoothing: float = 0.0) -> tropt.Setup:
    g = torch.Generator().manual_seed(0)
    teacher = torch.randn(cc.D, 3, generator=g)
    batches = []
    for _ in range(4):
        x = torch.randn(32, cc.D, generator=g)
        batches.append({"x": x, "labels": (x @ teacher).argmax(1)})
    return tropt.Setup(OwnLoss(smoothing), lambda m, b: m(**b)["loss"], lambda m: torch.optim.Adam(m.parameters()),
                       batches[:2], val_data=batches[2:], metric=tropt.Metric(neg_eval_loss, higher_is_better=True))


def test_a_metric_reading_the_models_own_loss_is_a_function_of_its_predictions():
    """The trivial predictors replaced the logits but left outputs.loss as the model computed it: every predictor
    scored the same and the Trainer's eval_loss was 'not a function of the model's predictions'. The loss is now
    recomputed for each predictor's prediction, by the rule that reproduces the model's own."""
    r = run(own_loss_setup())
    assert r.status is Status.PASS, r.summary
    scores = r.tables["scores"].set_index("predictor")["score"]
    assert scores["perfect"] == pytest.approx(0.0, abs=1e-3)  # confident true labels: cross entropy ~0
    assert scores["majority_class"] < scores["model"] - 1.0 and scores["random"] < scores["model"]


def test_the_trainers_eval_loss_on_a_seq2seq_model_is_a_function_of_its_predictions():
    pytest.importorskip("transformers")
    from support import family_ports as fp

    r = run(fp.t5_setup())
    assert r.status is not Status.FAIL and "not a function" not in r.summary, r.summary
    assert r.tables["scores"]["score"].nunique() == len(r.tables["scores"])  # every predictor scored differently


def test_a_loss_tropt_cannot_reproduce_is_not_scored_for_the_predictors():
    """Label smoothing inside the model: no standard loss reproduces outputs.loss, so a predictor's loss is unknown.
    Rather than score every predictor with the model's own loss, the check says it could not score them."""
    r = run(own_loss_setup(smoothing=0.1))
    assert r.status is Status.SKIP and "not a function" not in r.summary, r.summary
    assert "outputs.loss" in r.summary


def test_a_metric_that_reads_only_the_labels_next_to_a_models_own_loss_still_fails():
    """Recomputing the loss does not hide a metric that ignores the predictions."""
    def label_share_of_0(model, batches):
        for b in batches:
            model(**b)
        return float(torch.cat([b["labels"] for b in batches]).eq(0).float().mean())

    r = run(own_loss_setup().replace(metric=tropt.Metric(label_share_of_0)))
    assert r.status is Status.FAIL and "not a function" in r.summary, r.summary


def test_a_metric_that_ignores_the_model_it_is_given_shows_its_calls_and_scores():
    """The FAIL for a metric closing over another model carries its evidence: one row per evaluation tropt ran, what
    it handed the metric, how many forward calls that got (none), and the score that came back (the same for random
    outputs as for the model: the score does not depend on what the metric is given)."""
    import matplotlib.axes
    import matplotlib.pyplot as plt

    r = run(cc.metric_closing_over_the_original_model())
    assert r.status is Status.FAIL and r.metrics["model_calls"] == 0
    table = r.tables["metric_calls"]
    assert list(table.columns) == ["evaluation", "handed", "forward_calls", "score"]
    assert table["evaluation"].tolist() == ["model", "random"]
    assert table["forward_calls"].tolist() == [0, 0]
    assert table["score"].tolist() == [r.metrics["model_score"]] * 2 and 0.0 <= r.metrics["model_score"] <= 1.0
    assert r.metrics["random_calls"] == 0 and r.metrics["random_score"] == r.metrics["model_score"]
    ax = r.plot()
    assert isinstance(ax, matplotlib.axes.Axes) and len(ax.patches) == 2  # one bar per evaluation
    assert "0 forward calls" in [t.get_text() for t in ax.texts]
    plt.close(ax.figure)
