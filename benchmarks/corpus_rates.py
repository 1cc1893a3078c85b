"""The corpus rates of issues 27 and 28: the false-alarm rate over the healthy ports of public training loops in
``tests/ports``, and the flagged and cause-named rates over the bugs planted in them.

    .venv/bin/python benchmarks/corpus_rates.py [--only healthy|planted] [--families a,b] [--json PATH]

The cases are the corpus (``tests/ports/__init__.py``): ``ports.all_ports()`` gives every ``Port`` of every family
module that exists; each port is one healthy case and each of its ``Bug`` records one planted case. They are judged
with the corpus's own runner functions, exactly as ``tests/ports/test_corpus.py`` judges them:

- healthy: every check except ``perf.*`` (timing checks: their verdicts depend on the load of the machine);
  a false alarm is any FAIL or ERROR (or a Setup that cannot be built, or ``tropt.diagnose`` raising);
- planted: the stage 2-4 checks (or ``Bug.checks``); *flagged* when ``Bug.check`` is FAIL or WARN, *cause named*
  when flagged and every text of ``Bug.causes`` appears in that result's summary, advice or metrics.

All under ``budget="quick"``, one torch thread. Rates:

- false-alarm rate: healthy ports with any FAIL or ERROR / healthy ports run;
- flagged rate: planted bugs whose check is FAIL or WARN / planted bugs run;
- cause-named rate: planted bugs flagged with every cause text / planted bugs run.

A port whose optional modules (``Port.needs``: transformers, accelerate) do not import, or whose builder raises an
ImportError, is skipped and listed. Older trees: run this file with ``PYTHONPATH=<tree>`` to judge that tree's
``tropt`` on this tree's corpus (the runner passes ``threads`` only where ``tropt.diagnose`` has it; a port that
needs a Setup feature the old tree lacks counts as that tree's false alarm or miss). The last line printed is one
JSON object with the rates, their counts and the counts per family.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))  # the corpus (tests/ports) and its support modules: this tree's
sys.path.append(ROOT)  # tropt: this tree's unless PYTHONPATH names another tree

try:
    import ports  # tests/ports: the corpus
except ModuleNotFoundError as _exc:  # a tree from before the corpus: run this file from a tree that has it
    if _exc.name != "ports":
        raise
    sys.exit(f"no corpus in {os.path.join(ROOT, 'tests', 'ports')}: run this file from a tree that has one, with "
             "PYTHONPATH=<older tree> to judge an older tropt on it")
import torch  # noqa: E402

import tropt  # noqa: E402
from tropt.result import Status  # noqa: E402

FLAGGED = (Status.FAIL, Status.WARN)
BAD = (Status.FAIL, Status.ERROR)

# The cases this script ran before the corpus existed (RESULTS.md's earlier rows): listed when absent from the corpus,
# so a comparison with those rows knows what it lacks.
FORMER_HEALTHY = (
    "nanogpt_hand_set_lr", "manual_sgd", "manual_sgd_unused_optimizer", "word_lm_time_major_batch_dim",
    "word_lm_time_major_split_fn", "accelerate_accumulate", "native_scaler_wrapper", "hf_trainer_num_items",
    "lbfgs_closure", "lbfgs_closure_dropout", "sam_two_passes", "adafactor_lr_none", "t5_seq2seq_eval_loss",
    "checkpointed_dropout_mlp", "spectral_norm_hooks", "weight_norm_hooks", "spectral_norm_parametrization",
)
FORMER_PLANTED = (
    "nanogpt_lr_counter_per_micro_batch", "nanogpt_no_division_by_k_clip_None", "nanogpt_no_division_by_k_clip_1.0",
    "hf_per_micro_batch_token_mean_clip_None", "hf_per_micro_batch_token_mean_clip_1.0",
    "hf_per_micro_batch_token_mean_clip_0.1", "nanogpt_zero_grad_inside_micro_loop_clip_None",
    "nanogpt_zero_grad_inside_micro_loop_clip_1.0", "nanogpt_zero_grad_inside_micro_loop_clip_0.1",
    "nanogpt_double_optimizer_step_k4", "nanogpt_double_optimizer_step_k1", "manual_sgd_without_zero_grad",
    "native_scaler_clip_before_unscale", "lbfgs_closure_without_zero_grad", "sam_checkpoint_without_base_optimizer",
    "nanogpt_checkpoint_forgets_ctx_it", "adafactor_group_at_lr_0", "t5_constant_source",
)


def one_line(text: Any, limit: int = 300) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 1] + "…"


def build(make: Any) -> tuple[Any, str | None, str | None]:
    """(setup, skip reason, build error): an ImportError skips the case; any other exception while building is the
    port's or tropt's, an error of the case."""
    try:
        return make(), None, None
    except ImportError as exc:
        return None, f"{type(exc).__name__}: {one_line(exc, 120)}", None
    except Exception as exc:  # noqa: BLE001
        return None, None, f"{type(exc).__name__}: {one_line(exc)}"


def run_one(make: Any, checks: list[str]) -> tuple[dict, str | None, str | None]:
    """(results by check id, skip reason, error): the Setup built and diagnosed under the corpus's settings."""
    torch.manual_seed(0)
    setup, skip, error = build(make)
    if skip or error:
        return {}, skip, error
    try:
        return ports.diagnose(setup, checks), None, None
    except Exception as exc:  # noqa: BLE001 - diagnose itself raised: an error of the case
        return {}, None, f"tropt.diagnose raised {type(exc).__name__}: {one_line(exc)}"


def run_healthy(corpus: list, skipped: list) -> list[dict]:
    checks = ports.healthy_checks()
    print(f"== healthy ports: every check except perf.* ({len(checks)} checks), budget={ports.BUDGET!r}; a false "
          "alarm is any FAIL or ERROR")
    rows = []
    for port in corpus:
        reason = ports.available(port)
        t0 = time.perf_counter()
        results, skip, error = ({}, reason, None) if reason else run_one(port.build, checks)
        if skip:
            skipped.append({"kind": "healthy", "name": port.name, "family": port.family, "reason": skip})
            print(f"SKIP        {port.name}: {skip}")
            continue
        alarms = [{"check": "(building or diagnosing)", "status": "ERROR", "summary": error}] if error else [
            {"check": cid, "status": r.status.value, "summary": one_line(r.summary)}
            for cid, r in results.items() if r.status in BAD]
        counts: dict[str, int] = {}
        for r in results.values():
            counts[r.status.value] = counts.get(r.status.value, 0) + 1
        warns = [cid for cid, r in results.items() if r.status is Status.WARN]
        row = {"name": port.name, "family": port.family, "upstream": port.upstream, "false_alarm": bool(alarms),
               "alarms": alarms, "counts": counts, "warns": warns,
               "unexplained_warns": [w for w in warns if w not in port.notes],
               "seconds": round(time.perf_counter() - t0, 1)}
        rows.append(row)
        tally = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        noted = [f"{w}{'' if w in port.notes else ' (not noted)'}" for w in warns]
        print(f"{'FALSE-ALARM' if alarms else 'ok':<11} {port.name} [{port.family}]: {tally or 'no results'}"
              f"{'; WARN: ' + ', '.join(noted) if warns else ''} ({row['seconds']}s)")
        for a in alarms:
            print(f"              {a['check']} {a['status']}: {a['summary']}")
        sys.stdout.flush()
    return rows


def run_planted(corpus: list, skipped: list) -> list[dict]:
    print(f"== planted bugs: the stage 2-4 checks (or Bug.checks), budget={ports.BUDGET!r}; flagged = the bug's check "
          "is FAIL or WARN; cause named = flagged with every cause text")
    rows = []
    for port in corpus:
        reason = ports.available(port)
        for bug in port.bugs:
            t0 = time.perf_counter()
            results, skip, error = ({}, reason, None) if reason else run_one(bug.build, ports.bug_checks(bug))
            if skip:
                skipped.append({"kind": "planted", "name": bug.name, "family": port.family, "reason": skip})
                print(f"SKIP                     {bug.name}: {skip}")
                continue
            r = results.get(bug.check)
            status = "ERROR" if error else ("ABSENT" if r is None else r.status.value)
            summary = error or (f"{bug.check} not among the results" if r is None else one_line(r.summary))
            flagged = r is not None and r.status in FLAGGED
            missing = ports.missing_causes(bug, r) if flagged else []
            others = [f"{cid} {x.status.value}" for cid, x in results.items() if cid != bug.check and x.status in BAD]
            row = {"name": bug.name, "port": port.name, "family": port.family, "expected_check": bug.check,
                   "expected_cause": list(bug.causes), "source": bug.source, "status": status, "flagged": flagged,
                   "cause_named": flagged and not missing, "missing": missing, "summary": summary,
                   "other_fail_or_error": others, "seconds": round(time.perf_counter() - t0, 1)}
            rows.append(row)
            verdict = "cause-named" if row["cause_named"] else ("flagged, cause NOT named" if flagged else "MISSED")
            print(f"{verdict:<24} {bug.name} -> {bug.check} {status} ({row['seconds']}s): {summary}")
            if missing:
                print(f"{'':<24}   missing: {'; '.join(map(repr, missing))}")
            if others:
                print(f"{'':<24}   also FAIL/ERROR: {', '.join(others)}")
            sys.stdout.flush()
    return rows


def rate(n: int, d: int) -> float | None:
    return round(n / d, 4) if d else None


def pct(n: int, d: int) -> str:
    return f"{n}/{d} = {100 * n / d:.1f}%" if d else f"{n}/0 = n/a"


def per_family(corpus: list, healthy: list[dict], planted: list[dict]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for fam in dict.fromkeys(p.family for p in corpus):
        h = [r for r in healthy if r["family"] == fam]
        b = [r for r in planted if r["family"] == fam]
        out[fam] = {"ports": sum(p.family == fam for p in corpus), "bugs": sum(len(p.bugs) for p in corpus
                                                                                 if p.family == fam),
                    "healthy_run": len(h), "false_alarms": sum(r["false_alarm"] for r in h),
                    "planted_run": len(b), "flagged": sum(r["flagged"] for r in b),
                    "cause_named": sum(r["cause_named"] for r in b)}
    return out


def print_summary(args: Any, fams: tuple, corpus: list, healthy: list, planted: list, skipped: list,
                  families: dict) -> None:
    print("== per family (ports, bugs; false alarms / healthy run; flagged and cause named / planted run)")
    for fam, c in families.items():
        print(f"  {fam:<22} {c['ports']:>2} ports {c['bugs']:>2} bugs | false alarms {c['false_alarms']}/"
              f"{c['healthy_run']} | flagged {c['flagged']}/{c['planted_run']} | named {c['cause_named']}/"
              f"{c['planted_run']}")
    absent = [f for f in fams if f not in families]
    if absent:
        print(f"  families with no port yet: {', '.join(absent)}")
    alarms = sum(r["false_alarm"] for r in healthy)
    flagged = sum(r["flagged"] for r in planted)
    named = sum(r["cause_named"] for r in planted)
    print("== summary")
    if args.only in (None, "healthy"):
        print(f"false-alarm rate: {pct(alarms, len(healthy))} healthy ports with a FAIL or ERROR (every check but "
              "perf.*)")
        for r in healthy:
            for a in r["alarms"]:
                print(f"  false alarm: {r['name']}: {a['check']} {a['status']}: {a['summary']}")
    if args.only in (None, "planted"):
        print(f"flagged rate: {pct(flagged, len(planted))} planted bugs with their check FAIL or WARN")
        print(f"cause-named rate: {pct(named, len(planted))} planted bugs flagged with their cause "
              f"({pct(named, flagged)} of those flagged)")
        for r in planted:
            if not r["cause_named"]:
                print(f"  {'missed' if not r['flagged'] else 'cause not named'}: {r['name']}: {r['expected_check']} "
                      f"{r['status']}: {r['summary']}")
    for s in skipped:
        print(f"skipped ({s['kind']}): {s['name']}: {s['reason']}")
    names = {p.name for p in corpus} | {b.name for p in corpus for b in p.bugs}
    former = [n for n in (*FORMER_HEALTHY, *FORMER_PLANTED) if n not in names]
    if former and not args.families:
        print(f"former cases not in the corpus (yet): {', '.join(former)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--only", choices=["healthy", "planted"])
    ap.add_argument("--families", help="comma-separated families (default: all of ports.FAMILIES)")
    ap.add_argument("--json", metavar="PATH", help="write every case's record and the rates here")
    args = ap.parse_args(argv)

    torch.set_num_threads(1)
    fams = tuple(f for f in args.families.split(",") if f) if args.families else ports.FAMILIES
    unknown = [f for f in fams if f not in ports.FAMILIES]
    if unknown:
        ap.error(f"unknown families {unknown}; the corpus has {', '.join(ports.FAMILIES)}")
    here = os.path.dirname(os.path.abspath(tropt.__file__))
    started, load0 = time.time(), os.getloadavg()
    print(f"tropt from {here}; corpus from {os.path.dirname(os.path.abspath(ports.__file__))}; torch "
          f"{torch.__version__}, 1 thread; load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} "
          f"({os.cpu_count()} cores)")
    if not here.startswith(ROOT + os.sep):
        print(f"note: tropt is not the one of this tree ({ROOT}): judging that tropt on this tree's corpus")
    corpus = ports.all_ports(fams)
    skipped: list[dict] = []
    healthy = run_healthy(corpus, skipped) if args.only in (None, "healthy") else []
    planted = run_planted(corpus, skipped) if args.only in (None, "planted") else []
    families = per_family(corpus, healthy, planted)
    print_summary(args, fams, corpus, healthy, planted, skipped, families)
    elapsed, load1 = time.time() - started, os.getloadavg()
    print(f"elapsed {elapsed:.0f}s; load average at the end {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    alarms = sum(r["false_alarm"] for r in healthy)
    flagged = sum(r["flagged"] for r in planted)
    named = sum(r["cause_named"] for r in planted)
    summary = {
        "false_alarm_rate": rate(alarms, len(healthy)), "false_alarms": alarms, "healthy": len(healthy),
        "flagged_rate": rate(flagged, len(planted)), "flagged": flagged,
        "cause_named_rate": rate(named, len(planted)), "cause_named": named, "planted": len(planted),
        "skipped": len(skipped), "families": families, "budget": ports.BUDGET, "healthy_checks": "all but perf.*",
        "planted_checks": "stages 2-4 (or Bug.checks)", "elapsed_s": round(elapsed, 1),
        "load_start": round(load0[0], 2), "load_end": round(load1[0], 2), "tree": ROOT,
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
