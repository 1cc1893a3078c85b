"""Scoring a run's model on a split: the user's :class:`tropt.Metric`, or the default (validation loss through
``loss_fn``, plus accuracy when the Setup declares a classification task)."""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING, Any

import torch

from ..core.batch import batch_size, to_device
from ..errors import StepError
from ..metric import Metric, as_score

if TYPE_CHECKING:
    from ..setup import Setup

DEFAULT_METRIC = "val_loss"


def metric_name(metric: Metric | None) -> str:
    return DEFAULT_METRIC if metric is None else str(metric.name)


def higher_is_better(metric: Metric | None) -> bool:
    return False if metric is None else metric.higher_is_better


class _EvalMode:
    """Eval mode, no gradients, and the global RNG put back: scoring never changes the training run."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def __enter__(self) -> None:
        self.modes = {m: m.training for m in self.model.modules()}
        self.rng = torch.get_rng_state()
        self.grad = torch.no_grad()
        self.grad.__enter__()
        self.model.eval()

    def __exit__(self, *exc: Any) -> None:
        self.grad.__exit__(*exc)
        for m, mode in self.modes.items():
            m.training = mode
        torch.set_rng_state(self.rng)


def _default_scores(setup: Setup, ctx: Any, prefix: str, cache: dict | None = None) -> dict[str, float]:
    """Sample-weighted mean loss over one pass of the split, and accuracy when ``num_classes`` is set and the
    loss is recognisably a classification objective of the model's output.

    ``cache`` (one dict per run) keeps the objective identified at the first evaluation: a run's loss and output
    layout do not change between evaluations, and identifying it again costs as much as a small forward pass.
    """
    from ..core.objective import Capture, identify_objective

    total, count, correct, counted = 0.0, 0, 0, 0
    cache = {} if cache is None else cache
    objective, classify = cache.get("objective"), setup.num_classes is not None and cache.get("classify", True)
    # The split is read as it is (no reseeding per evaluation: the order does not change a mean, and _EvalMode
    # puts back whatever RNG state a shuffling loader draws from).
    for _i, raw in enumerate(setup.loader("val")):
        batch = to_device(raw, ctx.device)
        with (Capture(ctx.model) if classify else contextlib.nullcontext()) as cap, ctx.autocast():
            loss = float(setup.loss(ctx.model, batch).float())
        n = batch_size(batch)
        total += loss * n
        count += n
        if classify:
            assert cap is not None  # classify was true when the with statement entered a Capture
            out = cap.output
            if objective is None:
                objective = identify_objective(loss, out, batch, setup.num_classes)
                classify = objective is not None and objective.is_classification
                cache.update(objective=objective if classify else None, classify=classify)
            if classify and out is not None:
                from ..core.batch import get_leaf

                assert objective is not None  # classify is only true with an identified objective
                got = objective.correct(out, get_leaf(batch, objective.target_path).to(out.device))
                if got is not None:
                    correct, counted = correct + got[0], counted + got[1]
    scores = {f"{prefix}_loss": total / count if count else math.nan}
    if classify and counted:
        scores[f"{prefix}_accuracy"] = correct / counted
    return scores


def score(setup: Setup, ctx: Any, metric: Metric | None, data: Any = None, prefix: str = "val",
          cache: dict | None = None) -> dict[str, float]:
    """Scores of ``ctx.model`` on ``data`` (default: the Setup's val_data). The first key is the selection metric.
    ``cache``: a dict kept for one run and one split, so what the first evaluation learnt is not redone.

    Raises :class:`StepError` when the metric fails or is not a finite number.
    """
    target = setup if data is None else setup.replace(val_data=data)
    with _EvalMode(ctx.model):
        if metric is None:
            scores = _default_scores(target, ctx, prefix, cache)
            name = f"{prefix}_loss"
            if not math.isfinite(scores[name]):
                raise StepError(f"the validation loss is {scores[name]} (non-finite)",
                                "the run diverged or the split has NaNs")
            return scores
        raw = target.val_data
        value = metric(ctx.model, raw)
        assert metric.name is not None  # Metric.__post_init__ always sets a name
        return {metric.name if prefix == "val" else f"{prefix}_{metric.name}": as_score(value, metric.name)}
