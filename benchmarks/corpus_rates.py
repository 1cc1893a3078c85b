"""The corpus rates of issues 27 and 28: the false-alarm rate over healthy ports of public training loops, and the
flagged and cause-named rates over the bugs planted in them.

    .venv/bin/python benchmarks/corpus_rates.py [--only healthy|planted] [--json PATH]

The cases are the ports that exist today in ``tests/support`` (the full corpus of 40 ports of issue 28 does not
exist yet):

- healthy: every port in ``PORTS`` of ``tests/loop/test_real_loops.py`` (``support.real_loops``), and the family
  ports of ``support.family_ports`` (Adafactor with ``lr=None``, a tiny T5, a checkpointed dropout MLP, spectral /
  weight norm in its three forms);
- planted: every planted bug that ``tests/loop/test_real_loops.py`` asserts (each parametrisation a case), the ones
  the other loop and model tests plant in the same ports (``test_step_contract``: a checkpoint that forgets
  ``ctx.it``; ``test_gradient_flow``: an Adafactor group at lr 0; ``test_overfit_batch``: a T5 fed a constant source),
  each with the check id that must catch it and the cause text those tests assert (never invented here).

A healthy port is diagnosed with every check except ``perf.*`` (timing checks: their verdicts depend on the load of
the machine); a planted one with the stage 2-4 checks (objective, can it learn, is the update right). All under
``budget="quick"``, one torch thread.

- false-alarm rate: healthy ports with any FAIL or ERROR / healthy ports run;
- flagged rate: planted bugs whose expected check is FAIL or WARN / planted bugs run;
- cause-named rate: planted bugs flagged *and* whose result carries every expected cause text (searched in its
  summary, advice and metrics; expected metric values compared exactly) / planted bugs run.

A case whose support module or optional dependency (accelerate, transformers) cannot be imported is skipped and
listed as skipped: then the script also runs on older trees (run it with ``PYTHONPATH=<tree>``; the tree whose
``tropt`` and ``tests/support`` are used is the one this file sits in). The last line printed is one JSON object
with the three rates and their counts.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

import tropt  # noqa: E402
from tropt.result import Status  # noqa: E402

BUDGET = "quick"
FLAGGED = (Status.FAIL, Status.WARN)
BAD = (Status.FAIL, Status.ERROR)


# ------------------------------------------------------------------ the cases
@dataclass
class Healthy:
    name: str
    module: str  # the support module the builder comes from
    build: Callable[[Any], Any]  # build(module) -> Setup


@dataclass
class Planted:
    name: str
    module: str
    build: Callable[[Any], Any]
    check: str  # the check id that must catch it
    texts: tuple[str, ...] = ()  # each must appear in the summary, advice or metrics
    metrics: dict[str, Any] = field(default_factory=dict)  # each metric must equal this value
    advice: tuple[str, ...] = ()  # each must appear in the advice (as the test asserts)
    source: str = ""  # the test that asserts it


def _accelerate(rl):
    importlib.import_module("accelerate")  # an ImportError skips the case, as pytest.importorskip does
    return rl.accelerate_setup()


def _transformers():
    importlib.import_module("transformers")


def _unused_optimizer(rl):
    return rl.manual_sgd_setup().replace(optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=rl.LR_SGD))


def _t5(fp):
    _transformers()
    return fp.t5_setup()


def _adafactor(fp):
    _transformers()
    return fp.adafactor_setup()


HEALTHY = [
    # tests/loop/test_real_loops.py PORTS, in its order
    Healthy("nanogpt_hand_set_lr", "real_loops", lambda rl: rl.nanogpt_setup()),
    Healthy("manual_sgd", "real_loops", lambda rl: rl.manual_sgd_setup()),
    Healthy("manual_sgd_unused_optimizer", "real_loops", _unused_optimizer),
    Healthy("word_lm_time_major_batch_dim", "real_loops", lambda rl: rl.word_lm_setup()),
    Healthy("word_lm_time_major_split_fn", "real_loops", lambda rl: rl.word_lm_setup(layout="split_fn", k=2)),
    Healthy("accelerate_accumulate", "real_loops", _accelerate),
    Healthy("native_scaler_wrapper", "real_loops", lambda rl: rl.native_scaler_setup()),
    Healthy("hf_trainer_num_items", "real_loops", lambda rl: rl.hf_setup()),
    Healthy("lbfgs_closure", "real_loops", lambda rl: rl.lbfgs_setup()),
    Healthy("lbfgs_closure_dropout", "real_loops", lambda rl: rl.lbfgs_setup(dropout=0.2)),
    Healthy("sam_two_passes", "real_loops", lambda rl: rl.sam_setup()),
    # support.family_ports (issue 28)
    Healthy("adafactor_lr_none", "family_ports", _adafactor),
    Healthy("t5_seq2seq_eval_loss", "family_ports", _t5),
    Healthy("checkpointed_dropout_mlp", "family_ports", lambda fp: fp.checkpointed_dropout_setup()),
    Healthy("spectral_norm_hooks", "family_ports", lambda fp: fp.spectral_norm_setup("hooks")),
    Healthy("weight_norm_hooks", "family_ports", lambda fp: fp.spectral_norm_setup("weight_norm")),
    Healthy("spectral_norm_parametrization", "family_ports", lambda fp: fp.spectral_norm_setup("parametrization")),
]


def _forgets_ctx_it(rl):
    """tests/loop/test_step_contract.py: a user checkpoint of model and optimizer only, the counter on ctx left out."""
    def save(ctx):
        return {"model": ctx.model.state_dict(), "optimizer": ctx.optimizer.state_dict()}

    def load(ctx, state):
        ctx.model.load_state_dict(state["model"])
        ctx.optimizer.load_state_dict(state["optimizer"])

    return rl.nanogpt_setup().replace(save_state=save, load_state=load)


def _adafactor_lr_0(fp):
    """tests/model/test_gradient_flow.py: one group at a known learning rate of 0 next to Adafactor's lr=None."""
    _transformers()
    from transformers.optimization import Adafactor

    def opt(m):
        return Adafactor([{"params": m[0].parameters()}, {"params": m[2].parameters(), "lr": 0.0,
                                                          "relative_step": False}],
                         lr=None, relative_step=True, warmup_init=True, scale_parameter=True)

    return fp.adafactor_setup().replace(optimizer=opt)


def _t5_no_source(fp):
    """tests/model/test_overfit_batch.py: the T5 fed a constant source (the test runs 60 steps; quick runs its own)."""
    _transformers()

    def no_source(m, b):
        return m(input_ids=torch.full_like(b["input_ids"], 2), attention_mask=b["attention_mask"],
                 labels=b["labels"]).loss

    return fp.t5_setup(lr=1e-2).replace(loss_fn=no_source)


TRL = "tests/loop/test_real_loops.py"
PLANTED = [
    Planted("nanogpt_lr_counter_per_micro_batch", "real_loops", lambda rl: rl.nanogpt_setup(lr_per_micro=True),
            "loop.scheduler_cadence", ("advances per micro-batch",), {"per_micro_batch_confirmed": True},
            source=TRL),
    *[Planted(f"nanogpt_no_division_by_k_clip_{c}", "real_loops",
              partial(lambda rl, c: rl.nanogpt_setup(divide=False, clip=c), c=c),
              "loop.accumulation", ("4× the full-batch one: micro-batch losses are summed",), source=TRL)
      for c in (None, 1.0)],
    *[Planted(f"hf_per_micro_batch_token_mean_clip_{c}", "real_loops",
              partial(lambda rl, c: rl.hf_setup(per_micro_mean=True, clip=c), c=c),
              "loop.accumulation", ("average of per-micro-batch mean losses",), source=TRL)
      for c in (None, 1.0, 0.1)],
    *[Planted(f"nanogpt_zero_grad_inside_micro_loop_clip_{c}", "real_loops",
              partial(lambda rl, c: rl.nanogpt_setup(zero_inside=True, clip=c), c=c),
              "loop.accumulation", ("only the last micro-batch",), source=TRL)
      for c in (None, 1.0, 0.1)],
    *[Planted(f"nanogpt_double_optimizer_step_k{k}", "real_loops",
              partial(lambda rl, k: rl.nanogpt_setup(double_step=True, k=k), k=k),
              "loop.accumulation", ("2 times",), source=TRL)
      for k in (4, 1)],
    Planted("manual_sgd_without_zero_grad", "real_loops", lambda rl: rl.manual_sgd_setup(forget_zero_grad=True),
            "loop.zero_grad", ("update (parameter change) differs from a fresh one",),
            {"observed_at": "parameter change"}, source=TRL),
    Planted("native_scaler_clip_before_unscale", "real_loops",
            lambda rl: rl.native_scaler_setup(clip_before_unscale=True),
            "loop.loss_scaling", ("clip_grad_norm_ ran on still-scaled gradients",), source=TRL),
    Planted("lbfgs_closure_without_zero_grad", "real_loops", lambda rl: rl.lbfgs_setup(forget_zero_grad=True),
            "loop.zero_grad", ("plus the gradient left over from step 1",), source=TRL),
    Planted("sam_checkpoint_without_base_optimizer", "real_loops", lambda rl: rl.sam_setup(checkpoint_base=False),
            "loop.resume", ("first divergence: wrapped optimizer state",), advice=("base_optimizer",), source=TRL),
    Planted("nanogpt_checkpoint_forgets_ctx_it", "real_loops", _forgets_ctx_it,
            "loop.resume", ("step attributes",), source="tests/loop/test_step_contract.py"),
    Planted("adafactor_group_at_lr_0", "family_ports", _adafactor_lr_0,
            # the test asserts "learning rate 0" and that the problems are exactly 2.weight and 2.bias
            "model.gradient_flow", ("learning rate 0: 2.weight, 2.bias",), source="tests/model/test_gradient_flow.py"),
    Planted("t5_constant_source", "family_ports", _t5_no_source,
            "model.overfit_batch", ("ignores its input",), source="tests/model/test_overfit_batch.py"),
]


# ------------------------------------------------------------------ running them
def load_module(name: str, cache: dict) -> Any:
    if name not in cache:
        try:
            cache[name] = importlib.import_module(f"support.{name}")
        except Exception as exc:  # noqa: BLE001 - an older tree without the module: its cases are skipped
            cache[name] = exc
    return cache[name]


def check_ids(stages: set[int] | None = None, exclude_prefix: str | None = None) -> list[str]:
    df = tropt.list_checks()
    ids = [cid for cid, st in zip(df["id"], df["stage"]) if stages is None or int(st) in stages]
    return [cid for cid in ids if not (exclude_prefix and cid.startswith(exclude_prefix))]


def diagnose(setup: Any, checks: list[str]) -> dict:
    kw: dict[str, Any] = {"checks": checks, "budget": BUDGET, "progress": False}
    if "threads" in inspect.signature(tropt.diagnose).parameters:
        kw["threads"] = 1
    return {r.check: r for r in tropt.diagnose(setup, **kw).results}


def one_line(text: Any, limit: int = 300) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 1] + "…"


def build(case: Any, modules: dict) -> tuple[Any, str | None, str | None]:
    """(setup, skip reason, build error): an ImportError (module or optional dependency) skips the case; any other
    exception while building is tropt's or the port's, reported as an error of the case."""
    mod = load_module(case.module, modules)
    if isinstance(mod, BaseException):
        return None, f"support.{case.module} not importable here ({type(mod).__name__}: {one_line(mod, 120)})", None
    try:
        return case.build(mod), None, None
    except ImportError as exc:
        return None, f"{type(exc).__name__}: {one_line(exc, 120)}", None
    except Exception as exc:  # noqa: BLE001
        return None, None, f"{type(exc).__name__}: {one_line(exc)}"


def run_healthy(cases: list[Healthy], modules: dict) -> tuple[list[dict], list[dict]]:
    checks = check_ids(exclude_prefix="perf.")
    print(f"== healthy ports: every check except perf.* (timing checks excluded), {len(checks)} checks, "
          f"budget={BUDGET!r}; a false alarm is any FAIL or ERROR")
    rows, skipped = [], []
    for case in cases:
        t0 = time.perf_counter()
        setup, skip, error = build(case, modules)
        if skip:
            skipped.append({"kind": "healthy", "name": case.name, "reason": skip})
            print(f"SKIP     {case.name}: {skip}")
            continue
        row: dict[str, Any] = {"name": case.name, "module": case.module}
        if error:
            alarms = [{"check": "(building the Setup)", "status": "ERROR", "summary": error}]
            counts: dict[str, int] = {}
            warns: list[str] = []
        else:
            try:
                results = diagnose(setup, checks)
            except Exception as exc:  # noqa: BLE001 - diagnose itself raised: an error of the case
                results = {}
                alarms = [{"check": "(tropt.diagnose raised)", "status": "ERROR",
                           "summary": f"{type(exc).__name__}: {one_line(exc)}"}]
            else:
                alarms = [{"check": cid, "status": r.status.value, "summary": one_line(r.summary)}
                          for cid, r in results.items() if r.status in BAD]
            counts = {}
            for r in results.values():
                counts[r.status.value] = counts.get(r.status.value, 0) + 1
            warns = [cid for cid, r in results.items() if r.status is Status.WARN]
        row.update(false_alarm=bool(alarms), alarms=alarms, counts=counts, warns=warns,
                   seconds=round(time.perf_counter() - t0, 1))
        rows.append(row)
        tally = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        head = "FALSE-ALARM" if alarms else "ok      "
        print(f"{head} {case.name}: {tally or 'no results'}"
              f"{'; WARN: ' + ', '.join(warns) if warns else ''} ({row['seconds']}s)")
        for a in alarms:
            print(f"           {a['check']} {a['status']}: {a['summary']}")
        sys.stdout.flush()
    return rows, skipped


def cause_named(case: Planted, r: Any) -> tuple[bool, list[str]]:
    """Whether the result carries every expected cause; the list of what is missing."""
    advice = " ".join(map(str, r.advice or []))
    metrics = r.metrics or {}
    try:
        metric_text = json.dumps(metrics, default=str, ensure_ascii=False)
    except (TypeError, ValueError):  # keys json cannot write
        metric_text = str(metrics)
    haystack = " ".join([str(r.summary), advice, metric_text])
    missing = [f"text {t!r}" for t in case.texts if t not in haystack]
    missing += [f"advice {t!r}" for t in case.advice if t not in advice]
    missing += [f"metric {k}={v!r} (got {metrics.get(k, '<absent>')!r})" for k, v in case.metrics.items()
                if metrics.get(k, object()) != v]
    return not missing, missing


def run_planted(cases: list[Planted], modules: dict) -> tuple[list[dict], list[dict]]:
    checks = check_ids(stages={2, 3, 4})
    print(f"== planted bugs: the stage 2-4 checks ({len(checks)} checks), budget={BUDGET!r}; flagged = the expected "
          "check is FAIL or WARN; cause named = flagged and every expected cause text/metric present")
    rows, skipped = [], []
    for case in cases:
        t0 = time.perf_counter()
        setup, skip, error = build(case, modules)
        if skip:
            skipped.append({"kind": "planted", "name": case.name, "reason": skip})
            print(f"SKIP     {case.name}: {skip}")
            continue
        row: dict[str, Any] = {"name": case.name, "module": case.module, "expected_check": case.check,
                               "expected_cause": [*case.texts, *(f"advice:{a}" for a in case.advice),
                                                  *(f"{k}={v!r}" for k, v in case.metrics.items())],
                               "source": case.source}
        status, summary, named, missing, others = "ERROR", "", False, [], []
        if error:
            summary = f"building the Setup raised {error}"
        else:
            try:
                results = diagnose(setup, checks)
            except Exception as exc:  # noqa: BLE001
                summary = f"tropt.diagnose raised {type(exc).__name__}: {one_line(exc)}"
            else:
                r = results.get(case.check)
                if r is None:
                    status, summary = "ABSENT", f"{case.check} not among the results"
                else:
                    status, summary = r.status.value, one_line(r.summary)
                    if r.status in FLAGGED:
                        named, missing = cause_named(case, r)
                others = [f"{cid} {x.status.value}" for cid, x in results.items()
                          if cid != case.check and x.status in BAD]
        flagged = status in {s.value for s in FLAGGED}
        row.update(status=status, flagged=flagged, cause_named=bool(flagged and named), missing=missing,
                   summary=summary, other_fail_or_error=others, seconds=round(time.perf_counter() - t0, 1))
        rows.append(row)
        verdict = "cause-named" if row["cause_named"] else ("flagged, cause NOT named" if flagged else "MISSED")
        print(f"{verdict:<24} {case.name} -> {case.check} {status} ({row['seconds']}s): {summary}")
        if flagged and missing:
            print(f"{'':<24}   missing: {'; '.join(missing)}")
        if others:
            print(f"{'':<24}   also FAIL/ERROR: {', '.join(others)}")
        sys.stdout.flush()
    return rows, skipped


def rate(n: int, d: int) -> float | None:
    return round(n / d, 4) if d else None


def pct(n: int, d: int) -> str:
    return f"{n}/{d} = {100 * n / d:.1f}%" if d else f"{n}/0 = n/a"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=["healthy", "planted"])
    ap.add_argument("--json", metavar="PATH", help="write every case's record and the rates here")
    args = ap.parse_args(argv)

    torch.set_num_threads(1)
    here = os.path.dirname(os.path.abspath(tropt.__file__))
    started, load0 = time.time(), os.getloadavg()
    print(f"tropt from {here}; support from {os.path.join(ROOT, 'tests', 'support')}; torch {torch.__version__}, "
          f"1 thread; load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} ({os.cpu_count()} cores)")
    if not here.startswith(ROOT + os.sep):
        print(f"warning: tropt is not the one of this tree ({ROOT}): run with PYTHONPATH={ROOT}")
    modules: dict = {}
    healthy, planted, skipped = [], [], []
    if args.only in (None, "healthy"):
        healthy, s = run_healthy(HEALTHY, modules)
        skipped += s
    if args.only in (None, "planted"):
        planted, s = run_planted(PLANTED, modules)
        skipped += s

    alarms = sum(r["false_alarm"] for r in healthy)
    flagged = sum(r["flagged"] for r in planted)
    named = sum(r["cause_named"] for r in planted)
    elapsed = time.time() - started
    print("== summary")
    if args.only in (None, "healthy"):
        print(f"false-alarm rate: {pct(alarms, len(healthy))} healthy ports with a FAIL or ERROR "
              "(every check but perf.*)")
        for r in healthy:
            for a in r["alarms"]:
                print(f"  false alarm: {r['name']}: {a['check']} {a['status']}: {a['summary']}")
    if args.only in (None, "planted"):
        print(f"flagged rate: {pct(flagged, len(planted))} planted bugs with the expected check FAIL or WARN")
        print(f"cause-named rate: {pct(named, len(planted))} planted bugs flagged with the expected cause "
              f"({pct(named, flagged)} of those flagged)")
    for s in skipped:
        print(f"skipped ({s['kind']}): {s['name']}: {s['reason']}")
    load1 = os.getloadavg()
    print(f"elapsed {elapsed:.0f}s; load average at the end {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    summary = {
        "false_alarm_rate": rate(alarms, len(healthy)), "false_alarms": alarms, "healthy": len(healthy),
        "flagged_rate": rate(flagged, len(planted)), "flagged": flagged,
        "cause_named_rate": rate(named, len(planted)), "cause_named": named, "planted": len(planted),
        "skipped": len(skipped), "budget": BUDGET, "healthy_checks": "all but perf.*", "planted_checks": "stages 2-4",
        "elapsed_s": round(elapsed, 1), "load_start": round(load0[0], 2), "load_end": round(load1[0], 2),
        "tree": ROOT,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "healthy": healthy, "planted": planted, "skipped": skipped}, f, indent=1,
                      default=str, ensure_ascii=False)
    print(json.dumps(summary, ensure_ascii=False, default=lambda v: None if isinstance(v, float) and math.isnan(v)
                     else str(v)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
