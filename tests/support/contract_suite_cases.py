"""Cases for the contract suite over the whole registry (tests/test_check_contract.py, issue #29).

Every registered check gets a healthy case and a planted-defect case. Each case builds its subject (a
:class:`tropt.Setup` or a mapping of data splits) afresh, names the statuses it accepts, the keyword options the
check is called with (the "quick" budget is merged in by the suite), and a ``why`` predicate that confirms the
verdict has the right reason: a distinctive metric, or the planted cause named in the summary.

The subjects are those the check-by-check tests already use (tiny MLPs, generated data, a few hundred rows), built by
the same support modules (``support.split_tables``, ``contract_cases``, ``model_fixtures``, ``loop_cases``,
``dynamics_setups``, ``perf_setups``); only the planted defects those lack are built here. Checks are reached only
through the registry (``registry.find_spec(id).func``), never by module path.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

import tropt
from support import ce_loss
from support import contract_cases as cc
from support.dynamics_setups import KNOWN_GOOD_LR, linreg_setup
from support.loop_cases import (
    ddp_setup,
    mlp_setup,
    step_dividing_by_world_size,
    step_loss_not_divided,
    step_scheduler_per_micro_batch,
)
from support.model_fixtures import C, Detached, IgnoresInput, mlp, setup_for
from support.perf_setups import mlp_setup as small_mlp_setup
from support.split_tables import clean_tables, with_copies
from tropt.result import CheckResult, Status

P, W, FAIL = Status.PASS, Status.WARN, Status.FAIL


@dataclass(frozen=True)
class Case:
    """One (check, healthy|defect) case.

    build
        Returns a fresh subject: a Setup for ``needs == "setup"`` checks, a dict of splits for ``"splits"``.
    expect
        The statuses accepted (one, except where a healthy case may rightly WARN as the check documents).
    why
        A predicate on the result: the verdict is there for the right reason (the planted cause).
    evidence
        None: a non-PASS result must carry non-empty ``tables``. Otherwise the check reports this verdict's evidence
        only in metrics/series: the string says where and why (kept few).
    plot
        True: ``plot()`` returns an Axes. A string: this result has nothing to draw and ``plot()`` raises TroptError;
        the string says why.
    """

    check: str
    kind: str
    build: Callable[[], Any]
    expect: tuple[Status, ...]
    why: Callable[[CheckResult], bool]
    options: dict[str, Any] = field(default_factory=dict)
    evidence: str | None = None
    plot: bool | str = True
    marks: tuple = ()

    @property
    def id(self) -> str:
        return f"{self.check}-{self.kind}"


# =============================================================================================== stage 1: split tables
def clean_splits() -> dict[str, pd.DataFrame]:
    train, test = clean_tables()
    return {"train": train, "test": test}


TABLE_OPTS = {"label": "y", "group": "uid", "time": "ts"}


def exact_copies() -> dict[str, pd.DataFrame]:
    train, test = clean_tables()
    test, _ = with_copies(train, test, 7)  # 7 of 300 test rows: 2.3 % > 1 %
    return {"train": train, "test": test}


def near_copies() -> dict[str, pd.DataFrame]:
    """12 test rows that are train rows with their continuous features nudged by 1e-4 (re-exported, re-rounded)."""
    train, test = clean_tables()
    test, _ = with_copies(train, test, 12)
    rng = np.random.default_rng(4)
    test.loc[test.index[:12], "f_float"] += rng.normal(0, 1e-4, 12)
    test.loc[test.index[:12], "f_more"] += rng.normal(0, 1e-4, 12)
    return {"train": train, "test": test}


def shared_groups() -> dict[str, pd.DataFrame]:
    train, test = clean_tables()
    test.loc[test.index[:5], "uid"] = train["uid"].iloc[[1, 2, 3, 4, 4]].to_numpy()  # 4 ids in both, 5 rows
    return {"train": train, "test": test}


def overlapping_dates() -> dict[str, pd.DataFrame]:
    train, test = clean_tables()
    test.loc[test.index[:6], "ts"] = pd.Timestamp("2023-06-01")  # 6 test rows inside train's period
    return {"train": train, "test": test}


def label_copy_feature() -> dict[str, pd.DataFrame]:
    train, test = clean_tables()
    rng = np.random.default_rng(0)
    return {"train": train.assign(leak=train.y * 2.0 + rng.normal(0, 0.01, len(train))),
            "test": test.assign(leak=test.y * 2.0 + rng.normal(0, 0.01, len(test)))}


def label_shares(p_train: float, p_test: float, n: int = 2000) -> dict[str, pd.DataFrame]:
    a = pd.DataFrame({"x": np.arange(n), "y": (np.arange(n) < p_train * n).astype(int)})
    b = pd.DataFrame({"x": np.arange(n), "y": (np.arange(n) < p_test * n).astype(int)})
    return {"train": a, "test": b}


def unseen_class() -> dict[str, pd.DataFrame]:
    a = pd.DataFrame({"x": range(40), "y": [0] * 20 + [1] * 17 + [2] * 3})
    c = pd.DataFrame({"x": range(20), "y": [0] * 10 + [1] * 5 + [3] * 5})  # class 3 never seen in train
    return {"train": a, "test": c}


def labels(values: list) -> dict[str, pd.DataFrame]:
    return {"train": pd.DataFrame({"x": range(len(values)), "y": values}),
            "test": pd.DataFrame({"x": range(6), "y": [0, 1, 0, 1, 0, 1]})}


# =============================================================================================== stages 1-4: the
# data pipeline, the metric and train/eval modes: support.contract_cases (an MLP with BatchNorm and Dropout on raw
# features the training transform standardises)
def metric_ignoring_the_output() -> tropt.Setup:
    return cc.make(metric=tropt.Metric(cc.label_share))


# =============================================================================================== stages 2-3: the model
# support.model_fixtures: a 8-64-64-3 MLP on teacher-labelled batches
def model_setup(model: nn.Module | None = None) -> tropt.Setup:
    return setup_for(mlp() if model is None else model, num_classes=C)


def badly_scaled_last_layer() -> tropt.Setup:
    m = mlp()
    with torch.no_grad():
        m[4].weight.mul_(100.0)  # logits 100x too large at init
    return model_setup(m)


def dead_relus() -> tropt.Setup:
    m = mlp()
    with torch.no_grad():
        m[0].bias.fill_(-10.0)  # every unit of the first ReLU is off for every input
    return model_setup(m)


# =============================================================================================== stage 4: the loop
def loop_setup(step=None, **kw) -> tropt.Setup:
    """support.loop_cases' 10-32-4 MLP, without its Dropout layer."""
    return mlp_setup(step, dropout=None, **kw)


def step_without_zero_grad(ctx, micro_batches):
    for mb in micro_batches:
        (ctx.loss_fn(ctx.model, mb) / len(micro_batches)).backward()
    ctx.optimizer.step()  # gradients never cleared: step t also applies step t-1's gradient
    if ctx.scheduler is not None:
        ctx.scheduler.step()


def step_clip_before_unscale(ctx, micro_batches):
    for mb in micro_batches:
        with ctx.autocast():
            loss = ctx.loss_fn(ctx.model, mb) / len(micro_batches)
        ctx.scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(ctx.model.parameters(), ctx.grad_clip)  # still scaled: clips at 1/scale
    ctx.scaler.step(ctx.optimizer)
    ctx.scaler.update()
    ctx.optimizer.zero_grad()
    ctx.scheduler.step()


def save_model_only(ctx):
    return {"model": ctx.model.state_dict()}


def load_model_only(ctx, state):
    ctx.model.load_state_dict(state["model"])


def resume_losing_optimizer_state() -> tropt.Setup:
    return loop_setup(save_state=save_model_only, load_state=load_model_only)


# =============================================================================================== stage 6: perf
class SlowDataset(Dataset):
    """Each sample sleeps ``delay`` s to "decode": a batch of 8 waits >= 40 ms for a step that computes in ~1 ms."""

    def __init__(self, n: int = 128, delay: float = 0.005) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y, self.delay = torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g), delay

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        time.sleep(self.delay)
        return self.x[i], self.y[i]


def in_memory_batches(n: int = 4, b: int = 64):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(b, 8, generator=g), torch.randint(0, 3, (b,), generator=g)) for _ in range(n)]


def compute_bound() -> tropt.Setup:
    """In-memory batches (waiting for one is a pointer copy) and a 512-wide MLP step on 256 samples (milliseconds)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 3))
    return tropt.Setup(model, ce_loss, lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3), in_memory_batches(b=256))


def slow_loader() -> tropt.Setup:
    return small_mlp_setup(DataLoader(SlowDataset(), batch_size=8))


def offset_regression(precision: str) -> tropt.Setup:
    """Targets around 1000 with a signal of size ~1: bf16 holds 8 significant bits, so outputs near 1000 round to
    multiples of 4 and the squared error bf16 trains on is far from fp32's (a precision too coarse for this model)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=g)
    y = 1000.0 + x @ torch.randn(8, 1, generator=g) * 0.5
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    with torch.no_grad():
        model.bias.fill_(1000.0)
    return tropt.Setup(model, lambda m, b: F.mse_loss(m(b[0]).float(), b[1]),
                       lambda m: torch.optim.SGD(m.parameters(), lr=0.05),
                       [(x[i:i + 64], y[i:i + 64]) for i in range(0, 256, 64)], precision=precision)


def keeps_every_graph(ctx, micro_batches):
    """The standard update, plus a forward whose graph is kept on ctx every step: memory grows for good."""
    loss = tropt.standard_step(ctx, micro_batches)
    kept = ctx.loss_fn(ctx.model, micro_batches[0])
    if not hasattr(ctx, "history"):
        ctx.history = []
    ctx.history.append(kept)
    return loss


def memory_setup(step=None) -> tropt.Setup:
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(256, 8, generator=g), torch.randint(0, 3, (256,), generator=g)) for _ in range(4)]
    return small_mlp_setup(data, width=256, step=step)


# =============================================================================================== the case table
def has(text: str) -> Callable[[CheckResult], bool]:
    return lambda r: text in r.summary


SLOW = (pytest.mark.slow,)

CASES: list[Case] = [
    # ------------------------------------------------------------------------------------------ stage 1: splits
    Case("data.exact_duplicates", "healthy", clean_splits, (P,), lambda r: r.metrics["leaked_rows"] == 0, TABLE_OPTS,
         plot="two splits are one pair: its count is in the summary, not a one-bar chart (#15)"),
    Case("data.exact_duplicates", "defect", exact_copies, (FAIL,),
         lambda r: r.metrics["leaked_rows"] == 7 and len(r.tables["leaked_rows"]) == 7, TABLE_OPTS,
         plot="two splits are one pair: its count is in the summary, not a one-bar chart (#15)"),
    Case("data.near_duplicates", "healthy", clean_splits, (P,), lambda r: r.metrics["leaked_rows"] == 0, TABLE_OPTS),
    Case("data.near_duplicates", "defect", near_copies, (FAIL,),
         lambda r: r.metrics["leaked_rows"] == 12 and sorted(r.tables["near_duplicates"]["row"]) == list(range(12)),
         TABLE_OPTS),
    Case("data.group_leakage", "healthy", clean_splits, (P,), lambda r: r.metrics["shared_groups"] == 0, TABLE_OPTS,
         plot="two splits are one pair: its count is in the summary, not a one-bar chart (#15)"),
    Case("data.group_leakage", "defect", shared_groups, (FAIL,),
         lambda r: r.metrics["shared_groups"] == 4 and r.metrics["affected_rows"] == 5, TABLE_OPTS,
         plot="two splits are one pair: its count is in the summary, not a one-bar chart (#15)"),
    Case("data.temporal_leakage", "healthy", clean_splits, (P,), lambda r: r.metrics["overlap_rows"] == 0, TABLE_OPTS),
    Case("data.temporal_leakage", "defect", overlapping_dates, (FAIL,),
         lambda r: r.metrics["overlap_rows"] == 6 and r.metrics["pattern"] == "partial overlap", TABLE_OPTS),
    Case("data.target_leakage", "healthy", clean_splits, (P,), lambda r: r.metrics["leaky_features"] == 0, TABLE_OPTS),
    Case("data.target_leakage", "defect", label_copy_feature, (FAIL,),
         lambda r: r.metrics["top_feature"] == "leak" and r.metrics["max_power"] > 0.99, TABLE_OPTS),
    Case("data.label_shift", "healthy", lambda: label_shares(0.5, 0.5), (P,), lambda r: r.metrics["max_effect"] == 0.0,
         {"label": "y"}),
    Case("data.label_shift", "defect", lambda: label_shares(0.5, 0.85), (FAIL,),  # Cramér's V 0.37
         lambda r: r.metrics["task"] == "classification" and "test" in r.summary, {"label": "y"}),
    Case("data.class_coverage", "healthy", clean_splits, (P,),
         lambda r: r.metrics["classes"] == 2 and r.metrics["unseen_in_first"] == 0, TABLE_OPTS),
    Case("data.class_coverage", "defect", unseen_class, (FAIL,),
         lambda r: r.metrics["unseen_in_first"] == 1 and "3" in r.summary, {"label": "y"}),
    Case("data.label_sanity", "healthy", clean_splits, (P,), has("valid classification targets"), TABLE_OPTS,
         plot="label sanity lists problems in tables; it has no series or picture"),
    Case("data.label_sanity", "defect", lambda: labels([0, 1, np.nan, 1, 0, 2]), (FAIL,), has("missing label"),
         {"label": "y"}, plot="label sanity lists problems in tables; it has no series or picture"),
    # ------------------------------------------------------------------------------------------ stage 1: pipeline
    Case("data.sampling", "healthy", cc.healthy, (P,), lambda r: r.metrics["one_class_batches"] == 0.0),
    Case("data.sampling", "defect", cc.class_sorted, (FAIL,),
         lambda r: "hold a single class" in r.summary and r.metrics["same_order_every_pass"] is True),
    Case("data.eval_transforms", "healthy", cc.healthy, (P,), lambda r: r.metrics["features_fail"] == 0),
    Case("data.eval_transforms", "defect", cc.val_without_normalisation, (FAIL,),
         lambda r: r.metrics["features_fail"] == cc.D and "far beyond sampling noise" in r.summary),
    # ------------------------------------------------------------------------------------------ stage 2
    Case("model.init_loss", "healthy", model_setup, (P,), lambda r: r.metrics["objective"] == "cross_entropy"),
    Case("model.init_loss", "defect", badly_scaled_last_layer, (FAIL,),
         lambda r: r.metrics["ratio"] > 3 and r.metrics["last_layer"] == "4" and "last layer (4)" in r.summary),
    Case("model.eval_metric", "healthy", cc.healthy, (P,), lambda r: r.metrics["majority_class_score"] == 0.25),
    Case("model.eval_metric", "defect", metric_ignoring_the_output, (FAIL,),
         lambda r: "for every predictor" in r.summary and r.tables["scores"]["score"].nunique() == 1),
    Case("model.eval_metric", "defect_closure", cc.metric_closing_over_the_original_model, (FAIL,),
         lambda r: "never calls the model it is given" in r.summary and r.metrics["model_calls"] == 0),
    # ------------------------------------------------------------------------------------------ stage 3
    Case("model.overfit_batch", "healthy", model_setup, (P,), lambda r: r.metrics["final_accuracy"] == 1.0),
    Case("model.overfit_batch", "defect", lambda: model_setup(IgnoresInput()), (FAIL,), has("ignores its input")),
    Case("model.gradient_flow", "healthy", model_setup, (P,), lambda r: r.metrics["parameters"] == 6),
    Case("model.gradient_flow", "defect", lambda: model_setup(Detached()), (FAIL,),
         lambda r: "never get a gradient" in r.summary
         and set(r.tables["problems"]["name"]) == {"side.0.weight", "side.0.bias", "side.2.weight", "side.2.bias"}),
    Case("model.activation_stats", "healthy", model_setup, (P,), lambda r: r.metrics["max_dead_fraction"] < 0.4),
    Case("model.activation_stats", "defect", dead_relus, (FAIL,), has("1 (ReLU) 100% never active [init]")),
    # ------------------------------------------------------------------------------------------ stage 4
    Case("loop.zero_grad", "healthy", loop_setup, (P,), lambda r: r.metrics["max_rel_error"] <= r.metrics["tolerance"]),
    Case("loop.zero_grad", "defect", lambda: loop_setup(step_without_zero_grad, k=2), (FAIL,),
         lambda r: "left over from step 1" in r.summary and r.metrics["leak_equals_leftover_gradient"] is True),
    Case("loop.accumulation", "healthy", lambda: loop_setup(k=4), (P,),
         lambda r: r.metrics["k"] == 4 and r.metrics["max_rel_error"] <= r.metrics["tolerance"]),
    Case("loop.accumulation", "defect", lambda: loop_setup(step_loss_not_divided, k=4), (FAIL,),
         lambda r: "summed, not averaged" in r.summary and abs(r.metrics["grad_norm_ratio"] - 4) < 0.01),
    Case("loop.loss_scaling", "healthy", lambda: loop_setup(clip=0.5, scaler=True), (P,),
         lambda r: r.metrics["max_rel_error"] <= r.metrics["tolerance"]),
    Case("loop.loss_scaling", "defect", lambda: loop_setup(step_clip_before_unscale, clip=0.5, scaler=True), (FAIL,),
         has("clip_grad_norm_ ran on still-scaled gradients")),
    Case("loop.scheduler_cadence", "healthy", lambda: loop_setup(k=4), (P,),
         lambda r: r.metrics["max_lr_rel_diff"] == 0.0),
    Case("loop.scheduler_cadence", "defect", lambda: loop_setup(step_scheduler_per_micro_batch, k=4), (FAIL,),
         lambda r: "stepped per micro-batch" in r.summary and list(r.tables["schedule"]["position_k4"]) == [4],
         marks=(pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler"),)),  # torch's, on the planted step
    Case("loop.resume", "healthy", loop_setup, (P,), lambda r: r.metrics["not_restored"] == "none"),
    Case("loop.resume", "defect", resume_losing_optimizer_state, (FAIL,),
         lambda r: "first divergence: optimizer moments" in r.summary
         and not r.tables["components"].set_index("component").loc["optimizer moments", "restored"]),
    Case("loop.ddp", "healthy", ddp_setup, (P,), lambda r: r.metrics["samples_per_process"] == 16, marks=SLOW),
    Case("loop.ddp", "defect", lambda: ddp_setup(step_dividing_by_world_size), (FAIL,),
         lambda r: "averaging is applied twice" in r.summary and r.tables["parameters"]["rel_error"].min() > 0.4,
         marks=SLOW),
    Case("loop.train_mode", "healthy", cc.healthy, (P,), lambda r: set(r.tables["modules"]["verdict"]) == {"ok"}),
    Case("loop.train_mode", "defect", cc.model_left_in_eval_mode, (FAIL,), has("handed over in eval mode")),
    # ------------------------------------------------------------------------------------------ stage 5
    Case("dynamics.loss_curve", "healthy", lambda: linreg_setup(KNOWN_GOOD_LR, val=True), (P,),
         lambda r: r.metrics["class"] == "healthy" and r.metrics["val_points"] >= 10),
    Case("dynamics.loss_curve", "defect", lambda: linreg_setup(50.0), (FAIL,),
         lambda r: r.metrics["class"] in ("non_finite", "diverging")
         and any("Lower the learning rate" in a for a in r.advice)),
    Case("dynamics.lr_range", "healthy", lambda: linreg_setup(KNOWN_GOOD_LR), (P,),
         lambda r: KNOWN_GOOD_LR / 10 <= r.metrics["suggested_low"] <= r.metrics["suggested_high"] < 1.0),
    Case("dynamics.lr_range", "defect", lambda: linreg_setup(100.0), (W,),
         lambda r: r.metrics["setup_lr_in_range"] == "no" and "lower" in r.advice[0]),
    # ------------------------------------------------------------------------------------------ stage 6
    Case("perf.throughput", "healthy", compute_bound, (P,), lambda r: r.metrics["limited_by"] == "compute"),
    # Timing, but not a race: the loader sleeps >= 40 ms per batch by construction, against ~1 ms of compute.
    Case("perf.throughput", "defect", slow_loader, (W,),
         lambda r: r.metrics["limited_by"] == "data loading" and any("num_workers" in a for a in r.advice)),
    # Which precision is faster is timing; bf16 on CPU is rarely 1.2x faster than fp32 on this MLP. A WARN here is
    # only the documented "train in <faster precision>" recommendation, which `why` then requires.
    Case("perf.precision", "healthy", lambda: small_mlp_setup(in_memory_batches(8)), (P, W),
         lambda r: r.metrics["fp32_loss_deviation"] == 0
         and (r.status is P or (r.metrics["timing_verdict"] == "clear" and r.metrics["recommended"] == "bf16")),
         {"precisions": ("fp32", "bf16")}),
    # Stability is decided from losses, not times: an unstable Setup precision is a WARN whatever the timings.
    Case("perf.precision", "defect", lambda: offset_regression("bf16"), (W,),
         lambda r: r.metrics["timing_verdict"] == "unstable" and r.metrics["recommended"] == "fp32"
         and "(unstable)" in r.summary and r.metrics["bf16_loss_deviation"] > 0.05, {"precisions": ("fp32", "bf16")}),
    Case("perf.memory", "healthy", memory_setup, (P,), lambda r: abs(r.metrics["growth_per_step_mib"]) < 1e-6),
    Case("perf.memory", "defect", lambda: memory_setup(keeps_every_graph), (W,),
         lambda r: "grows by" in r.summary  # one kept forward a step: its activations, 256 x (256 + 3) floats
         and abs(r.metrics["growth_per_step_mib"] / (256 * (256 + 3) * 4 / 2**20) - 1) < 0.05),
]
