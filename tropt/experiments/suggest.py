"""``tropt.suggest``: candidate interventions derived from a diagnosis, each with its hypothesis and its finding.

A suggestion is a hypothesis until :func:`tropt.compare` has run it against the baseline. Correctness findings
(a FAIL of any ``data.*``, ``model.*`` or ``loop.*`` check) are never candidates: a leak or a broken update is not
repaired by another optimizer, so they *block* the comparison (:func:`blocking_findings`).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ..errors import TroptError
from ..result import CheckResult, Report, Status

if TYPE_CHECKING:
    from ..setup import Setup

CORRECTNESS = ("data.", "model.", "loop.")
UNSTABLE = ("unstable", "noisy_late", "diverging", "non_finite")
ADAM_LIKE = ("Adam", "AdamW", "NAdam", "RAdam", "Adamax", "Adagrad", "RMSprop", "Adafactor")


class FindingsError(TroptError):
    """findings.json (or a report) that cannot be planned from: wrong format, other tropt version, empty."""


@dataclass
class Suggestion:
    """One intervention: ``overrides`` of Setup keywords (empty when it cannot be compared as an override)."""

    name: str
    overrides: dict[str, Any]
    hypothesis: str
    finding: str  # the check id that motivated it
    evidence: str  # that finding's summary
    changed: list[str] = field(default_factory=list)  # the factors it changes, in words
    comparable: bool = True
    why_not_compared: str = ""
    goal: str = "quality"  # "quality": a better score; "speed": faster at an unchanged score

    def to_dict(self) -> dict[str, Any]:
        from .candidates import describe_overrides

        d = asdict(self)
        d["overrides"] = describe_overrides(self.overrides)
        return d


class Suggestions(dict):
    """``{name: overrides}`` ready for :func:`tropt.compare`, plus what stands behind each.

    Attributes
    ----------
    details
        ``{name: Suggestion}`` for every comparable candidate (hypothesis, finding, changed factors).
    hypotheses
        Suggestions that cannot be expressed as Setup overrides (or need the Setup to build): reported as
        hypotheses, never compared.
    blocking
        Correctness FAILs; when any, there are no candidates: fix these first.
    """

    def __init__(self) -> None:
        super().__init__()
        self.details: dict[str, Suggestion] = {}
        self.hypotheses: list[Suggestion] = []
        self.blocking: list[CheckResult] = []

    def add(self, s: Suggestion) -> None:
        if s.comparable:
            self[s.name] = s.overrides
            self.details[s.name] = s
        else:
            self.hypotheses.append(s)

    def __repr__(self) -> str:
        if self.blocking:
            return f"Suggestions(blocked by {', '.join(r.check for r in self.blocking)})"
        return f"Suggestions({list(self)}; {len(self.hypotheses)} hypotheses not comparable)"


# ---------------------------------------------------------------------------------------------- input
def load_report(report: Any) -> Report:
    """A :class:`Report` from a Report, a dict, JSON text or a findings.json path; refuses other tropt versions."""
    from .. import __version__

    if isinstance(report, Report):
        rep = report
    else:
        data = report
        if isinstance(report, (str, os.PathLike)):
            text = str(report)
            if not text.lstrip().startswith("{"):
                if not os.path.exists(text):
                    raise FindingsError(f"findings file {text!r} does not exist",
                                        "run `tropt diagnose ... -o OUT` first; it writes OUT/findings.json")
                with open(text, encoding="utf-8") as fh:
                    text = fh.read()
            try:
                data = json.loads(text)
            except json.JSONDecodeError as exc:
                raise FindingsError(f"findings are not JSON ({exc})",
                                    "pass the findings.json a tropt report wrote") from None
        if not isinstance(data, dict) or not isinstance(data.get("results"), list):
            raise FindingsError("these are not tropt findings (no 'results' list)",
                                "pass the findings.json that `tropt diagnose` or Report.to_json() wrote")
        version = (data.get("identity") or {}).get("tropt")
        if version is not None and str(version) != __version__:
            raise FindingsError(f"the findings were written by tropt {version}, this is tropt {__version__}; check ids "
                                "and metrics may differ between versions, so a plan from them could be wrong",
                                f"re-run the diagnosis with tropt {__version__} (tropt diagnose ... -o OUT)")
        try:
            rep = Report.from_dict(data)
        except (KeyError, ValueError, TypeError) as exc:
            raise FindingsError(f"the findings are damaged ({type(exc).__name__}: {exc})",
                                "re-run the diagnosis to write a fresh findings.json") from None
    if not len(rep) or all(r.status is Status.SKIP for r in rep):
        raise FindingsError("the report holds no findings (every check was skipped or none ran), so there is nothing "
                            "to plan from", "diagnose with a Setup (tropt.diagnose(setup, ...)) so the model, loop, "
                            "dynamics and perf checks run")
    return rep


def blocking_findings(report: Report) -> list[CheckResult]:
    """Correctness FAILs (data.*, model.*, loop.*), in the verdict's order (data first, then by stage; a symptom of a
    broken step after its root cause, :func:`tropt.verdict.rank_stage`): they block any comparison."""
    from ..verdict import rank_stage

    fails = [r for r in report if r.status is Status.FAIL and r.check.startswith(CORRECTNESS)]
    return sorted(fails, key=rank_stage)  # stable: contract order within a stage


# ---------------------------------------------------------------------------------------------- helpers
def _get(report: Report, check: str) -> CheckResult | None:
    return report[check] if check in report else None  # noqa: SIM401 - Report has no .get()


def _num(m: dict, key: str) -> float | None:
    v = m.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _setup_optimizer(setup: Setup | None) -> torch.optim.Optimizer | None:
    """An optimizer built on a copy of the model (the user's model is untouched), or None."""
    if setup is None or setup.optimizer is None:
        return None
    from ..snapshot import preserved

    with preserved():
        return setup.build().optimizer


def _setup_lr(report: Report, setup: Setup | None) -> float | None:
    r = _get(report, "dynamics.lr_range")
    lr = _num(r.metrics, "setup_lr") if r is not None else None
    if lr is None:
        opt = _setup_optimizer(setup)
        if opt is not None and opt.param_groups:
            lr = float(opt.param_groups[0].get("lr", math.nan))
    return lr if lr is not None and math.isfinite(lr) and lr > 0 else None


def loader_like(loader: Any, **changes: Any) -> torch.utils.data.DataLoader | None:
    """A new DataLoader over the same dataset with ``changes`` (batch_size, num_workers, pin_memory), or None when
    ``loader`` uses a sampler that cannot be rebuilt faithfully (a custom batch sampler or sampler)."""
    from torch.utils.data import DataLoader, RandomSampler, SequentialSampler

    if not isinstance(loader, DataLoader) or loader.batch_size is None:
        return None
    if not isinstance(loader.sampler, (RandomSampler, SequentialSampler)):
        return None
    kw = dict(batch_size=loader.batch_size, shuffle=isinstance(loader.sampler, RandomSampler),
              num_workers=loader.num_workers, collate_fn=loader.collate_fn, pin_memory=loader.pin_memory,
              drop_last=loader.drop_last, generator=loader.generator)
    kw.update(changes)
    if kw["num_workers"] > 0:
        kw["persistent_workers"] = True  # workers restarted every epoch would cost more than they hide
    return DataLoader(loader.dataset, **kw)


class WithWeightDecay:
    """An optimizer factory whose param groups get ``weight_decay`` (module level so it pickles)."""

    def __init__(self, factory: Any, weight_decay: float) -> None:
        self.factory, self.weight_decay = factory, weight_decay
        self.__qualname__ = (f"{getattr(factory, '__qualname__', type(factory).__name__)} "
                             f"with weight_decay={weight_decay:g}")

    def __call__(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        opt = self.factory(model)
        for g in opt.param_groups:
            g["weight_decay"] = self.weight_decay
        return opt


# ---------------------------------------------------------------------------------------------- rules
def _from_lr_range(report: Report, setup: Setup | None) -> list[Suggestion]:
    r = _get(report, "dynamics.lr_range")
    if r is None or r.status not in (Status.PASS, Status.WARN):
        return []
    low, high, cur = _num(r.metrics, "suggested_low"), _num(r.metrics, "suggested_high"), _num(r.metrics, "setup_lr")
    if low is None or high is None or cur is None:
        return []
    mid = math.sqrt(low * high)
    if r.status is Status.PASS and max(mid / cur, cur / mid) < 2:
        return []  # the Setup's LR already sits in the range: nothing to test
    return [Suggestion(
        "lr_range", {"lr": float(f"{mid:.3g}")},
        f"the LR range test found learning {low:.2g}–{high:.2g} while the Setup uses {cur:.2g}: the range's geometric "
        f"middle {mid:.3g} should reach a better validation score in the same budget",
        r.check, r.summary, [f"learning rate {cur:.3g} → {mid:.3g} (every param group scaled alike)"])]


def _from_precision(report: Report, setup: Setup | None) -> list[Suggestion]:
    r = _get(report, "perf.precision")
    if r is None or r.status is not Status.WARN:
        return []
    rec, cur = r.metrics.get("recommended"), r.metrics.get("setup_precision")
    if not isinstance(rec, str) or rec == cur:
        return []
    a, b = _num(r.metrics, f"{cur}_step_ms"), _num(r.metrics, f"{rec}_step_ms")
    speed = f" ({a:.3g} ms → {b:.3g} ms per step measured)" if a and b else ""
    return [Suggestion(
        f"precision_{rec}", {"precision": rec},
        f"training in {rec} instead of {cur} should cut the time per step{speed} without moving the validation score "
        "beyond seed noise", r.check, r.summary, [f"precision {cur} → {rec}"], goal="speed")]


def _from_throughput(report: Report, setup: Setup | None) -> list[Suggestion]:
    r = _get(report, "perf.throughput")
    if r is None or r.status is Status.ERROR or r.metrics.get("limited_by") != "data loading":
        return []
    wait = _num(r.metrics, "data_wait_ms") or 0.0
    share = _num(r.metrics, "data_wait_share") or 0.0
    if wait < 1.0:
        return [Suggestion(
            "whole_batch_indexing", {},
            f"waiting for data is {share:.0%} of the step but under a millisecond per batch ({wait:.2g} ms): it is "
            "per-sample collation overhead, so indexing whole batches at once (tensors sliced by a batch of indices) "
            "should raise samples/s; worker processes would cost more than they save", r.check, r.summary,
            ["how batches are built (whole-batch indexing)"], comparable=False, goal="speed",
            why_not_compared="it changes the user's data code, which no Setup keyword expresses")]
    cuda = "cuda" in str(r.metrics.get("device", ""))
    workers = max(1, min(4, (os.cpu_count() or 2) - 1))
    changes = {"num_workers": workers, **({"pin_memory": True} if cuda else {})}
    words = [f"DataLoader num_workers → {workers}"] + (["pin_memory → True"] if cuda else [])
    hyp = (f"data loading takes {share:.0%} of each step ({wait:.3g} ms): {workers} worker processes"
           + (" and pinned memory" if cuda else "") + " should hide it behind compute and raise samples/s, with "
           "the same samples in the same order (the score must not move beyond seed noise)")
    loader = loader_like(setup.train_data, **changes) if setup is not None else None
    if setup is None or loader is None or getattr(setup.train_data, "num_workers", 1) >= workers:
        why = ("no Setup was given to rebuild its DataLoader" if setup is None else
               "the Setup's train_data is not a plain DataLoader tropt can rebuild, or it already has the workers")
        return [Suggestion("loader_workers", {}, hyp, r.check, r.summary, words, False, why, goal="speed")]
    return [Suggestion("loader_workers", {"train_data": loader}, hyp, r.check, r.summary, words, goal="speed")]


def _from_loss_curve(report: Report, setup: Setup | None) -> list[Suggestion]:
    r = _get(report, "dynamics.loss_curve")
    if r is None or r.status not in (Status.WARN, Status.FAIL):
        return []
    classes = str(r.metrics.get("classes", "")).split(",")
    out: list[Suggestion] = []
    spikes = int(r.metrics.get("spikes") or 0)
    if any(c in UNSTABLE for c in classes) or spikes:
        what = ", ".join(c for c in classes if c in UNSTABLE) or f"{spikes} loss spikes"
        p90 = _num(r.metrics, "grad_norm_p90")
        current = getattr(setup, "grad_clip", None) if setup is not None else None
        clip = (current / 2 if current else (p90 if p90 else 1.0))
        out.append(Suggestion(
            "grad_clip", {"grad_clip": float(f"{clip:.3g}")},
            f"the loss curve is {what}: clipping the gradient norm at {clip:.3g}"
            + (" (the 90th percentile of the measured norms)" if p90 and not current else "")
            + " should bound the steps that cause it and give fewer unstable runs", r.check, r.summary,
            [f"gradient clipping {current or 'none'} → {clip:.3g}"]))
        lr = _setup_lr(report, setup)
        if lr is not None:
            out.append(Suggestion(
                "lower_lr", {"lr": float(f"{lr / 3:.3g}")},
                f"the loss curve is {what}: a learning rate 3× lower ({lr / 3:.3g} instead of {lr:.3g}) should steady "
                "it, at the price of slower progress per step", r.check, r.summary,
                [f"learning rate {lr:.3g} → {lr / 3:.3g}"]))
        else:
            out.append(Suggestion(
                "lower_lr", {}, f"the loss curve is {what}: a learning rate 3× lower should steady it", r.check,
                r.summary, ["learning rate ÷ 3"], False,
                "the Setup's learning rate is unknown (no Setup and no dynamics.lr_range result): pass the Setup"))
    if "overfitting" in classes:
        opt = _setup_optimizer(setup)
        wd_now = float(opt.param_groups[0].get("weight_decay", 0.0) or 0.0) if opt is not None else 0.0
        wd = max(10 * wd_now, 0.01)
        hyp = (f"the validation loss rises while the training loss falls (overfitting): weight decay {wd:g} "
               f"(now {wd_now:g}) should shrink the gap and lower the final validation loss")
        if opt is not None:
            assert setup is not None  # an optimizer is only built from a setup
            out.append(Suggestion("weight_decay", {"optimizer": WithWeightDecay(setup.optimizer, wd)}, hyp, r.check,
                                  r.summary, [f"weight decay {wd_now:g} → {wd:g}"]))
        else:
            out.append(Suggestion("weight_decay", {}, hyp, r.check, r.summary, [f"weight decay → {wd:g}"], False,
                                  "no Setup (with an optimizer) was given to build the candidate from"))
        best = _num(r.metrics, "val_best_step")
        out.append(Suggestion(
            "early_stopping", {},
            "stopping when the validation metric stops improving"
            + (f" (its best was at step {best:.0f})" if best is not None else "")
            + " should keep the best validation score and save the rest of the budget", r.check, r.summary,
            ["training length (early stopping on the validation metric)"], False,
            "early stopping is a rule of the comparison, not a Setup keyword: compare(..., early_stopping=3) applies "
            "it to every run alike"))
    return out


def _from_batch(report: Report, setup: Setup | None) -> list[Suggestion]:
    thr = _get(report, "perf.throughput")
    if thr is None or thr.status is not Status.PASS or thr.metrics.get("limited_by") == "data loading":
        return []
    mem = _get(report, "perf.memory")
    if mem is not None and mem.status in (Status.WARN, Status.FAIL):
        return []  # memory is already tight: a larger batch would not fit
    headroom = _num(mem.metrics, "headroom") if mem is not None else None
    if headroom is not None and headroom < 2:
        return []
    bs = _num(thr.metrics, "batch_size")
    bs = int(bs) if bs else None
    opt = _setup_optimizer(setup)
    lr = _setup_lr(report, setup)
    adaptive = opt is not None and type(opt).__name__ in ADAM_LIKE
    factor = math.sqrt(2) if adaptive else 2.0
    rule = "square-root scaling for an adaptive optimizer" if adaptive else "the linear scaling rule"
    hyp = (f"the step is compute-bound ({thr.metrics.get('samples_per_s', math.nan):.4g} samples/s at batch "
           f"{bs or '?'}), so a 2× batch should raise samples/s; the LR is scaled ×{factor:.3g} ({rule}). The "
           "effective batch changes the optimization statistics (gradient noise, steps per epoch), so the quality "
           "must be compared, not assumed; compare runs it at equal samples (half the steps of a steps budget), so the "
           "larger batch never wins by seeing more data")
    words = [f"batch size {bs or '?'} → {2 * bs if bs else '2×'}", f"learning rate ×{factor:.3g}"]
    # bs is the step's batch (K loader batches with accumulation="batches"): the loader's batch doubles to double it
    loader = (loader_like(setup.train_data, batch_size=2 * bs // setup.loader_batches_per_step)
              if setup is not None and bs else None)
    if loader is None or lr is None:
        why = ("no Setup was given" if setup is None
               else "the Setup's train_data is not a plain DataLoader tropt can rebuild")
        return [Suggestion("batch_x2", {}, hyp, thr.check, thr.summary, words, False, why, goal="speed")]
    return [Suggestion("batch_x2", {"train_data": loader, "lr": float(f"{lr * factor:.3g}")}, hyp, thr.check,
                       thr.summary, words, goal="speed")]


RULES = (_from_lr_range, _from_loss_curve, _from_precision, _from_throughput, _from_batch)


def suggest(report: Any, setup: Setup | None = None) -> Suggestions:
    """Candidate interventions derived from the findings, ready for :func:`tropt.compare`.

    Parameters
    ----------
    report
        A :class:`tropt.Report`, or the path / JSON text / dict of a findings.json.
    setup
        The :class:`tropt.Setup` the report diagnosed; needed for candidates that rebuild its DataLoader or
        optimizer (without it those are listed as hypotheses).

    Returns
    -------
    Suggestions
        A dict ``{name: overrides}``; ``.details[name]`` holds each one's hypothesis, motivating finding and changed
        factors, ``.hypotheses`` the suggestions that cannot be compared as overrides, ``.blocking`` the
        correctness FAILs that block any comparison (then the dict is empty).
    """
    rep = load_report(report)
    out = Suggestions()
    out.blocking = blocking_findings(rep)
    if out.blocking:
        return out
    for rule in RULES:
        for s in rule(rep, setup):
            if s.name not in out.details and s.name not in {h.name for h in out.hypotheses}:
                out.add(s)
    return out
