"""``model.eval_metric``: does the validation metric represent the task?

The Setup's :class:`tropt.Metric` scores trivial predictors on the validation split: the majority class
(classification) or the constant label mean (regression), the model's own predictions shuffled across the samples of
each batch, and random outputs; plus the true labels themselves (the perfect score). Each predictor is a small
``nn.Module`` wrapping a copy of the model, so its outputs keep the model's format (logits, ``.logits``, dicts) and
the user's ``fn(model, val_data)`` runs unchanged.

- WARN when a trivial predictor scores within ``margin`` (relative) of the perfect score, e.g. accuracy 0.95 on
  95/5 labels; the advice names better metrics (balanced accuracy, AUROC, F1; MAE or R² against the constant mean).
- FAIL when the metric never runs the model it is given (it closes over the original model), gives the same score
  for every predictor (it ignores the predictions), or raises on the model's output. A metric that never runs its
  model is evaluated once more with random outputs: the ``metric_calls`` table lists each evaluation, what it was
  handed, the forward calls that got (0) and the score that came back (the same).
- A metric that reads the loss the model computes itself (``outputs.loss``: the Trainer's ``eval_loss``) is a
  function of the predictions: each predictor's output gets the loss of its own prediction, by the standard loss
  (against one of the model's arguments, ``labels=`` first; shifted by one position for a causal LM) that
  reproduces the model's. A loss no standard one reproduces is unknown (NaN) for the predictors: SKIP, saying so.
- ERROR (a clear :class:`tropt.errors.StepError`) when it returns no finite number (a tensor of several
  elements, NaN, a string).
- SKIP without a metric or ``val_data``, or when the metric bypasses ``model(...)`` so no predictor can be substituted.

Cost: one pass over the validation data through ``loss_fn`` (labels, the objective and the perfect predictor's
lookup) and five evaluations of the metric (model, constant, shuffled, random, perfect; no training step), each
running the model once over the validation data.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch
from torch import nn

from ..core.batch import get_leaf
from ..core.hashes import row_hashes
from ..core.objective import Capture, Objective, identify_objective, output_tensor
from ..errors import StepError, TroptError
from ..registry import register
from ..result import CheckResult, Status
from ..snapshot import preserved
from ._common import fmt
from ._outputs import own_loss, recompute_loss, replace_prediction, set_loss

if TYPE_CHECKING:
    from ..setup import Setup

CHECK = "model.eval_metric"
LOGIT = 10.0  # a confident logit: softmax/sigmoid of it is 0.99995
UNKNOWN_LOSS = ("the metric reads the loss the model computes itself (outputs.loss), and no standard loss (cross "
                "entropy, NLL, binary cross entropy, MSE, L1) of the model's prediction against one of its arguments "
                "reproduces it, so no other prediction's loss can be computed")


# ---------------------------------------------------------------------------------------------- trivial predictors
class TrivialPredictor(nn.Module):
    """Runs the wrapped model and replaces its prediction with :meth:`_trivial_output`'s, in the same output format.

    Attribute lookups the wrapper does not answer go to the wrapped model (``model.config``, custom attributes).
    """

    description = "trivial predictor"

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.inner = model
        self.calls = 0  # 0 after a metric evaluation: the metric bypassed the wrapper (e.g. model.predict)
        self.loss_unknown = False  # the model's own loss was asked for but cannot be recomputed (see forward)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["inner"], name)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        out = self.inner(*args, **kwargs)
        pred = output_tensor(out)
        if pred is None:
            raise TroptError(f"{CHECK}: the model's output holds no tensor",
                             "return a tensor, .logits or a dict of tensors")
        new = self._trivial_output(pred.detach(), args, kwargs)
        replaced = replace_prediction(out, new)
        loss = own_loss(out)
        if loss is None or replaced is new:
            return replaced
        # The model's own loss (outputs.loss, the Trainer's eval_loss) belongs to its prediction: recompute it for
        # this one by the rule that reproduces the model's, or make it unknown (NaN), never the model's own value.
        recomputed = recompute_loss(float(loss.detach().float()), pred.detach(), new, args, kwargs)
        if recomputed is None:
            self.loss_unknown = True
            recomputed = torch.full_like(loss, math.nan)
        return set_loss(replaced, recomputed.to(loss.dtype))

    def _trivial_output(self, pred: torch.Tensor, args: tuple,  # pragma: no cover - abstract
                        kwargs: dict) -> torch.Tensor:
        raise NotImplementedError


def _from_targets(objective: Objective, pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Confident predictions of the targets ``y`` in the model's output layout for ``objective``."""
    y = y.to(pred.device)
    if objective.kind in ("cross_entropy", "nll"):
        c = pred.shape[-1] if objective.layout == 0 else pred.shape[1]
        onehot = torch.nn.functional.one_hot(y.long().clamp(0, c - 1), c).to(pred.dtype) * LOGIT
        out = onehot if objective.layout == 0 else onehot.movedim(-1, 1)
        out = out.reshape(pred.shape)
        return out.log_softmax(-1 if objective.layout == 0 else 1) if objective.kind == "nll" else out
    y = y.to(pred.dtype).reshape(pred.shape)
    if objective.kind == "bce_logits":
        return (2 * y - 1) * LOGIT
    if objective.kind == "bce":
        return y.clamp(1e-4, 1 - 1e-4)
    return y


class ConstantPredictor(TrivialPredictor):
    """Every sample gets the same target: the majority class (confident logits) or the label mean."""

    def __init__(self, model: nn.Module, objective: Objective, value: float, description: str) -> None:
        super().__init__(model)
        self.objective, self.value, self.description = objective, value, description

    def _trivial_output(self, pred: torch.Tensor, args: tuple, kwargs: dict) -> torch.Tensor:
        if self.objective.kind in ("cross_entropy", "nll"):
            shape = pred.shape[:-1] if self.objective.layout == 0 else pred.shape[:1] + pred.shape[2:]
            return _from_targets(self.objective, pred, torch.full(shape, int(self.value), device=pred.device))
        return _from_targets(self.objective, pred, torch.full(pred.shape, float(self.value), device=pred.device))


class ShuffledPredictor(TrivialPredictor):
    """The model's own predictions, permuted across the samples of each batch (seeded)."""

    description = "the model's predictions shuffled across samples"

    def __init__(self, model: nn.Module, seed: int) -> None:
        super().__init__(model)
        self.gen = torch.Generator().manual_seed(seed)

    def _trivial_output(self, pred: torch.Tensor, args: tuple, kwargs: dict) -> torch.Tensor:
        return pred[torch.randperm(pred.shape[0], generator=self.gen).to(pred.device)] if pred.ndim else pred


class RandomPredictor(TrivialPredictor):
    """Standard-normal outputs of the model's shape (seeded)."""

    description = "random outputs"

    def __init__(self, model: nn.Module, seed: int) -> None:
        super().__init__(model)
        self.gen = torch.Generator().manual_seed(seed)

    def _trivial_output(self, pred: torch.Tensor, args: tuple, kwargs: dict) -> torch.Tensor:
        out = torch.randn(pred.shape, generator=self.gen).to(pred.device, pred.dtype)
        return out.sigmoid() if pred.is_floating_point() and bool(((pred >= 0) & (pred <= 1)).all()) else out


def _first_tensor(args: tuple, kwargs: dict) -> torch.Tensor | None:
    return next((a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor) and a.ndim >= 1), None)


class PerfectPredictor(TrivialPredictor):
    """The true target of each sample, looked up by the content of the model's first tensor argument."""

    description = "the true labels (perfect predictions)"

    def __init__(self, model: nn.Module, objective: Objective, lookup: dict[bytes, torch.Tensor]) -> None:
        super().__init__(model)
        self.objective, self.lookup = objective, lookup

    def _trivial_output(self, pred: torch.Tensor, args: tuple, kwargs: dict) -> torch.Tensor:
        x = _first_tensor(args, kwargs)
        if x is None or x.shape[0] != pred.shape[0]:
            raise TroptError("the perfect predictor cannot match outputs to samples", "")
        keys = row_hashes(x)
        missing = sum(k not in self.lookup for k in keys)
        if missing:
            raise TroptError(f"the perfect predictor met {missing} sample(s) it has no label for", "")
        return _from_targets(self.objective, pred, torch.stack([self.lookup[k] for k in keys]))


# ---------------------------------------------------------------------------------------------- reading the split
def _read_targets(setup: Setup, model: nn.Module) -> tuple[Objective | None, torch.Tensor | None, dict, str]:
    """One pass of the validation data through ``loss_fn``: the objective, every target, and input-row -> target."""
    objective, targets, why = None, [], ""
    lookup: dict[Any, Any] | None = {}
    seen: list = []

    def pre(module: nn.Module, args: tuple, kwargs: dict) -> None:
        if not seen:
            seen.append(_first_tensor(args, kwargs))

    handle = model.register_forward_pre_hook(pre, with_kwargs=True)
    try:
        for batch in setup.batches(which="val"):
            seen.clear()
            with torch.no_grad(), Capture(model) as cap:
                loss = float(setup.loss(model, batch).detach().float())
            if objective is None:
                objective = identify_objective(loss, cap.output, batch, setup.num_classes)
                if objective is None:
                    return None, None, {}, ("the loss on a validation batch is not cross entropy, NLL, "
                                            "binary cross entropy, "
                                            "MSE or L1 of the model's output against a tensor of the batch")
            y = get_leaf(batch, objective.target_path).detach().cpu()
            targets.append(y)
            x = seen[0] if seen else None
            if lookup is not None and x is not None and x.shape[0] == y.shape[0]:
                lookup.update(zip(row_hashes(x), y))
            else:
                lookup = None
    finally:
        handle.remove()
    # Flat: the targets are read only as a whole (class counts, the label mean), and validation batches padded to
    # their own longest sequence (token labels with dynamic padding) have different widths per sample.
    return objective, torch.cat([t.reshape(-1) for t in targets]), lookup or {}, why


# ---------------------------------------------------------------------------------------------- the check
def _score(metric: Any, model: nn.Module, data: Any, seed: int) -> float:
    torch.manual_seed(seed)  # the same data order (a shuffling val loader) for every predictor
    model.eval()
    with torch.no_grad():
        return metric(model, data)


@contextlib.contextmanager
def _counting(model: nn.Module) -> Any:
    """Counts the forward calls of ``model`` and of any of its modules (a custom predict() may call a submodule)."""
    calls = [0]
    counters = [m.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1)) for m in model.modules()]
    try:
        yield calls
    finally:
        for h in counters:
            h.remove()


def _score_model(metric: Any, model: nn.Module, data: Any, seed: int) -> tuple[float, CheckResult | None]:
    """The model's own score, or a FAIL when the metric raises on its output or never calls it."""
    try:
        with _counting(model) as calls:
            model_score = _score(metric, model, data, seed)
    except StepError as exc:
        if exc.__cause__ is None:  # it ran but returned no finite number: bad input, a clear error
            raise
        return math.nan, CheckResult(
            CHECK, Status.FAIL, f"the metric raises on the model's output: {exc.message}",
            {"metric": metric.name, "error_type": type(exc.__cause__).__name__},
            advice=[f"Fix the metric {metric.name}: tropt calls it as fn(model, val_data) with the model in "
                    "eval mode under torch.no_grad() (as tropt.compare does)."])
    if calls[0] == 0:
        return model_score, _never_called(metric, model, data, seed, model_score)
    return model_score, None


def _never_called(metric: Any, model: nn.Module, data: Any, seed: int, model_score: float) -> CheckResult:
    """The FAIL for a metric that never ran the model it was handed, with its evidence: each evaluation tropt ran,
    what it handed the metric, the forward calls that got, and the score that came back. A second evaluation with
    random outputs shows the score does not follow what the metric is given."""
    rows = [{"evaluation": "model", "handed": "the model as given (tropt's copy)", "forward_calls": 0,
             "score": model_score}]
    metrics: dict[str, Any] = {"metric": metric.name, "model_score": model_score, "model_calls": 0}
    random = RandomPredictor(model, seed)
    try:
        with _counting(random) as calls:
            score = _score(metric, random, data, seed)
        rows.append({"evaluation": "random", "handed": random.description, "forward_calls": calls[0],
                     "score": score})
        metrics.update(random_calls=calls[0], random_score=score)
    except TroptError:  # the model's own evaluation is the evidence; the second one only adds to it
        pass
    same = len(rows) == 2 and rows[1]["score"] == model_score
    return CheckResult(
        CHECK, Status.FAIL,
        f"the metric {metric.name} never calls the model it is given: it is not a function of the "
        "model's predictions (does it close over another model, or read stored predictions?)"
        + (f"; handed random outputs it returns the same {fmt(model_score)}" if same else ""),
        metrics,
        {"metric_calls": pd.DataFrame(rows, columns=["evaluation", "handed", "forward_calls", "score"])},
        advice=[f"Make {metric.name} evaluate the model it is given: fn(model, val_data) should call "
                "model(...) on the validation inputs."])


def _predictors(model: nn.Module, objective: Objective | None, y: torch.Tensor | None, lookup: dict, seed: int,
                metrics: dict[str, Any]) -> tuple[list[tuple[str, Callable[[], TrivialPredictor]]], str | None]:
    """The trivial predictors to score (and the perfect one when inputs map to labels), and the constant's name."""
    predictors: list[tuple[str, Callable[[], TrivialPredictor]]] = []
    constant_name = None
    if objective is not None and y is not None and y.numel():
        metrics["objective"] = objective.kind
        if objective.is_classification:
            flat = y.reshape(-1).long()
            flat = flat[flat >= 0]
            counts = torch.bincount(flat)
            top = int(counts.argmax())
            share = float(counts[top] / counts.sum())
            constant_name = "majority_class"
            metrics.update(majority_class=top, majority_share=share)
            text = f"always class {top} ({share:.0%} of the labels)"
            predictors.append((constant_name, lambda: ConstantPredictor(model, objective, top, text)))
        else:
            mean = float(y.double().mean())
            constant_name = "constant_mean"
            metrics["label_mean"] = mean
            text = f"always the label mean {fmt(mean)}"
            predictors.append((constant_name, lambda: ConstantPredictor(model, objective, mean, text)))
    predictors.append(("shuffled", lambda: ShuffledPredictor(model, seed)))
    predictors.append(("random", lambda: RandomPredictor(model, seed)))
    if objective is not None and lookup:
        predictors.append(("perfect", lambda: PerfectPredictor(model, objective, lookup)))
    return predictors, constant_name


def _score_predictors(metric: Any, predictors: list, data: Any, seed: int, rows: list[dict]) -> None:
    for name, make in predictors:
        wrapped = make()
        try:
            score = _score(metric, wrapped, data, seed)
            if wrapped.calls == 0:
                raise TroptError("the metric did not call this predictor as model(...) (a method such as "
                                 "model.predict bypasses it), so its score is the model's own")
            rows.append({"predictor": name, "description": wrapped.description, "score": score, "error": ""})
        except TroptError as exc:
            rows.append({"predictor": name, "description": wrapped.description, "score": math.nan,
                         "error": UNKNOWN_LOSS if wrapped.loss_unknown else exc.message})


def _degenerate(metric: Any, table: pd.DataFrame, scored: pd.DataFrame, metrics: dict) -> CheckResult | None:
    """SKIP when nothing but the model could be scored; FAIL when every predictor scores the same."""
    if len(scored) < 2:  # only the model itself: the metric cannot be compared with anything
        first = next((e for e in table["error"] if e), "")
        advice = (["Let the metric compute its loss from the prediction (e.g. cross entropy of outputs.logits against "
                   "the labels), so tropt can score trivial predictions with it."] if first == UNKNOWN_LOSS else
                  ["Let the metric call model(...) on the validation inputs, so tropt can substitute trivial "
                   "predictors."])
        return CheckResult(CHECK, Status.SKIP, f"no trivial predictor could be scored with {metric.name}: {first}",
                           metrics, {"scores": table}, advice)
    # Not a function of the predictions: every predictor, from random outputs to the true labels, scores the same.
    values = scored["score"].to_numpy(dtype=float)
    if len(values) >= 3 and float(values.max() - values.min()) <= 1e-9 * max(1.0, float(abs(values).max())):
        return CheckResult(CHECK, Status.FAIL,
                           f"the metric {metric.name} gives {fmt(float(values[0]))} for every predictor "
                           f"({', '.join(scored['predictor'])}): it is not a function of the model's predictions",
                           metrics, {"scores": table},
                           [f"Make {metric.name} use the model it is given (fn(model, val_data)), not a model it "
                            "closes over, and compare its predictions with the labels."])
    return None


def _judge(metric: Any, table: pd.DataFrame, metrics: dict[str, Any], objective: Objective | None, why: str,
           constant_name: str | None, margin: float, model_score: float) -> CheckResult:
    """How close the trivial predictors come to the perfect score."""
    scores = dict(zip(table["predictor"], table["score"]))
    for name, value in scores.items():
        if name != "model":
            metrics[f"{name}_score"] = value
    scored = table[table["score"].notna()]
    notes = [] if objective is not None else [f"majority/mean and perfect predictors not scored: {why}"]
    if objective is not None and "perfect" not in scores:
        notes.append("the perfect predictor could not match the model's inputs to their labels")
    degenerate = _degenerate(metric, table, scored, metrics)
    if degenerate is not None:
        return degenerate
    values = scored["score"].to_numpy(dtype=float)
    perfect, basis = None, None
    if not math.isnan(scores.get("perfect", math.nan)):
        perfect, basis = float(scores["perfect"]), "the true labels"
    elif len(values) and ((values >= 0) & (values <= 1)).all():
        perfect, basis = (1.0 if metric.higher_is_better else 0.0), "the metric's [0, 1] range"
    if perfect is not None:
        metrics.update(perfect_score=perfect, perfect_basis=basis)
        gap = [abs(perfect - s) / max(abs(perfect), abs(s), 1e-12) if not math.isnan(s) else math.nan
               for s in table["score"]]
        table["relative_gap_to_perfect"] = gap
    trivial = (table[table["predictor"].isin([constant_name, "shuffled"]) & table["score"].notna()]
               if perfect is not None else table.iloc[:0])
    close = trivial[trivial["relative_gap_to_perfect"] <= margin] if len(trivial) else trivial
    if len(close):
        assert perfect is not None  # trivial (hence close) is empty without a perfect score
        worst = close.sort_values("relative_gap_to_perfect").iloc[0]
        summary = (f"{worst['description']} already scores {fmt(float(worst['score']))} with {metric.name} (perfect "
                   f"{fmt(perfect)}, from {basis}): the metric barely separates a useful model from a trivial one")
        if objective is not None and objective.is_classification:
            advice = [f"Report balanced accuracy, AUROC (binary) or macro F1 instead of (or next to) {metric.name}; "
                      f"a constant prediction of class {metrics.get('majority_class')} cannot game them."]
        else:
            advice = [f"Report the error relative to the constant mean (R², or MAE next to the constant mean's MAE) "
                      f"instead of {metric.name} alone."]
        status = Status.WARN
    else:
        parts = [f"{r.predictor} {fmt(float(r.score))}" for r in scored.itertuples() if r.predictor != "model"]
        summary = (f"{metric.name} separates trivial predictors from a perfect one (model {fmt(model_score)}; "
                   f"{', '.join(parts)})")
        advice, status = [], Status.PASS
    if notes:
        summary += " (" + "; ".join(notes) + ")"
    return CheckResult(CHECK, status, summary, metrics, {"scores": table}, advice)


@register(CHECK, title="Validation metric represents the task",
          description="the Metric's score for trivial predictors (majority class, constant mean, shuffled) vs the "
                      "perfect score",
          plot="tropt.plots.contract")
def check_eval_metric(setup: Setup, *, margin: float = 0.1, progress: bool = True) -> CheckResult:
    """Score trivial predictors with the Setup's metric on the validation split.

    Parameters
    ----------
    setup
        The :class:`tropt.Setup`; SKIP without ``metric`` or ``val_data``.
    margin
        WARN when a trivial predictor's score is within this relative distance of the perfect score
        (``|perfect - score| / max(|perfect|, |score|)``; accuracy 0.95 vs 1.0 is 0.05).
    progress
        Unused (the check is quick); accepted for uniformity.
    """
    metric = setup.metric
    if metric is None:
        return CheckResult(CHECK, Status.SKIP,
                           "no metric: pass Setup(metric=tropt.Metric(fn, higher_is_better=...)) to check it")
    if setup.val_data is None:
        return CheckResult(CHECK, Status.SKIP,
                           "no val_data: the metric is scored on the validation split; pass Setup(val_data=...)")
    seed = setup.seed
    rows: list[dict] = []
    with preserved(setup.model):
        ctx = setup.build()
        model = ctx.model
        model_score, failed = _score_model(metric, model, setup.val_data, seed)
        if failed is not None:
            return failed
        rows.append({"predictor": "model", "description": "the model as given", "score": model_score, "error": ""})
        try:
            objective, y, lookup, why = _read_targets(setup, model)
        except TroptError as exc:  # loss_fn cannot read validation batches: score what needs no labels
            objective, y, lookup, why = None, None, {}, f"loss_fn failed on validation data ({exc.message})"
        metrics: dict[str, Any] = {"metric": metric.name, "higher_is_better": metric.higher_is_better,
                                   "model_score": model_score, "margin": margin}
        predictors, constant_name = _predictors(model, objective, y, lookup, seed, metrics)
        _score_predictors(metric, predictors, setup.val_data, seed, rows)
    table = pd.DataFrame(rows, columns=["predictor", "description", "score", "error"])
    return _judge(metric, table, metrics, objective, why, constant_name, margin, model_score)
