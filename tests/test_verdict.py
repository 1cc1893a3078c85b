"""The verdict first: one ordering (FAIL by contract stage, ERROR, WARN; severity within) used by every surface."""

import os
import re

import pytest
import torch

import tropt
from tropt.budgets import BUDGETS, budget_options, choose_threads, oversubscribed, tropt_threads
from tropt.cli import format_report
from tropt.result import CheckResult, Report
from tropt.verdict import severity, summary_html, verdict

# Contract order on purpose: the verdict must reorder it.
RESULTS = [
    CheckResult("data.exact_duplicates", "warn", "2 leaked rows", {"leaked_fraction": 0.002}, advice=["Drop them."]),
    CheckResult("data.group_leakage", "fail", "5% of test rows share a customer", {"affected_fraction": 0.05},
                advice=["Re-split by customer."]),
    CheckResult("data.near_duplicates", "fail", "30% of test rows are near copies", {"leaked_fraction": 0.3},
                advice=["Group near copies."]),
    CheckResult("data.label_shift", "pass", "labels agree"),
    CheckResult("model.init_loss", "error", "could not run: bad loss", advice=["Return a scalar."]),
    CheckResult("loop.accumulation", "fail", "gradient differs with K", {"max_rel_error": 3.0},
                advice=["Divide the loss by K."]),
    CheckResult("loop.loss_scaling", "skip", "no scaler"),
    CheckResult("perf.precision", "warn", "bf16 is 2x faster", {"speedup_vs_fp32": 2.0}, advice=["Use bf16."]),
]
ORDER = ["data.near_duplicates", "data.group_leakage", "loop.accumulation", "model.init_loss", "data.exact_duplicates",
         "perf.precision"]


def test_fails_by_stage_then_errors_then_warns_with_severity_inside_a_stage():
    v = verdict(Report(RESULTS))
    assert [f.check for f in v.findings] == ORDER  # the larger leak first inside stage 1; a leak before the loop
    assert v.passed == ["data.label_shift"] and v.skipped == ["loop.loss_scaling"]
    assert [f.first_fix for f in v.findings][:3] == ["Group near copies.", "Re-split by customer.",
                                                     "Divide the loss by K."]
    assert v.status.value == "fail" and v.headline.startswith("3 FAIL, 1 ERROR, 2 WARN of 8 checks")


def test_severity_is_normalised_per_kind():
    assert severity(RESULTS[2]) == (0.3, "leaked_fraction")
    assert severity(RESULTS[5]) == (0.75, "max_rel_error")  # e / (1 + e)
    assert severity(RESULTS[7]) == (0.5, "speedup_vs_fp32")  # 1 - 1/s
    assert severity(CheckResult("loop.resume", "fail", "s")) == (0.5, None)


def _positions(text, ids):
    return [text.index(i) for i in ids]


def test_every_surface_opens_with_the_same_order():
    report = Report(RESULTS)
    md = report.to_markdown()
    head = md.split("## All checks")[0]
    assert _positions(head, ORDER) == sorted(_positions(head, ORDER))
    assert "→ Group near copies." in head and "1 PASS (data.label\\_shift)" in head
    text = format_report(report)
    assert text.startswith("verdict: FAIL") and _positions(text, ORDER) == sorted(_positions(text, ORDER))
    page = report._repr_html_()
    assert page.index("tropt-verdict") < page.index("tropt-all")  # the summary before the per-check details
    found = re.findall(r'class="tropt-finding" data-check="([^"]+)"', page)
    assert found == ORDER
    assert re.findall(r'class="tropt-finding" data-check="([^"]+)"', summary_html(report)) == ORDER


def test_report_notebook_display_opens_with_the_verdict(monkeypatch):
    import IPython.display as ipd

    from tropt.report import display as shown

    items = []
    monkeypatch.setattr(ipd, "display", lambda *objs, **k: items.extend(objs))
    shown.show_report(Report(RESULTS), plots=False)
    assert "tropt-verdict" in items[0].data
    assert all("<details open" not in getattr(o, "data", "") for o in items)  # evidence collapsed


def test_unknown_budget_is_refused_before_any_check():
    with pytest.raises(tropt.TroptError, match="budget='fast' is not one of quick, standard, thorough"):
        tropt.diagnose(splits={"train": [[1]]}, budget="fast")
    assert budget_options("standard", "model.overfit_batch") == {}


def test_budget_reaches_the_checks_it_names(monkeypatch):
    from tropt import registry

    seen = {}
    spec = registry.find_spec("data.label_sanity")

    def fake(splits, *, label=None, max_evidence=10, progress=True):
        seen["max_evidence"] = max_evidence
        return CheckResult("data.label_sanity", "pass", "ok")

    monkeypatch.setitem(registry._REGISTRY, "data.label_sanity",
                        registry.CheckSpec(spec.id, spec.stage, spec.title, spec.description, fake, spec.needs))
    monkeypatch.setitem(BUDGETS, "quick", {**BUDGETS["quick"], "data.label_sanity": {"max_evidence": 3}})
    import pandas as pd

    splits = {"train": pd.DataFrame({"a": [1.0, 2.0], "y": [0, 1]})}
    tropt.diagnose(splits=splits, checks=["data.label_sanity"], budget="quick", progress=False)
    assert seen == {"max_evidence": 3}
    tropt.diagnose(splits=splits, checks=["data.label_sanity"], budget="standard", progress=False)
    assert seen == {"max_evidence": 10}


def test_every_budget_option_is_accepted_by_its_check():
    import inspect

    from tropt.registry import find_spec

    for budget, table in BUDGETS.items():
        for check, opts in table.items():
            spec = find_spec(check)
            if spec is None:
                continue
            params = inspect.signature(spec.func).parameters
            assert set(opts) <= set(params), f"{budget}: {check} does not take {set(opts) - set(params)}"


def test_thread_count_is_chosen_and_restored():
    assert (choose_threads(cores=2, load=5.0) == 1 and choose_threads(cores=8, load=2.0) == 6
            and choose_threads(cores=4, load=None) == 4)
    before = torch.get_num_threads()
    with tropt_threads(1) as used:
        assert used == 1 and torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    torch.set_num_threads(64)  # torch's default on a big host, in a container allowed fewer cores
    try:
        with tropt_threads() as used:
            cores = os.cpu_count() if not hasattr(os, "sched_getaffinity") else len(os.sched_getaffinity(0))
            assert 1 <= used <= min(64, cores) and torch.get_num_threads() == used
        assert torch.get_num_threads() == 64
    finally:
        torch.set_num_threads(before)
    assert oversubscribed(cores=2, load=5.0).startswith("the machine is oversubscribed (load 5.0 on 2 cores)")
    assert oversubscribed(cores=8, load=1.0) is None


def test_diagnose_hands_each_result_over_as_it_finishes():
    seen = []
    report = tropt.diagnose(splits={"train": [[1, 0]], "test": [[2, 1]]},
                            checks=["data.exact_duplicates", "data.group_leakage"],
                            progress=False, on_result=seen.append)
    assert [r.check for r in seen] == report.checks and report.identity["budget"] == "standard"


def test_checks_that_could_not_run_for_one_reason_are_one_finding():
    """A Setup every check rejects for one reason (a batch layout tropt cannot split) reads once, naming the checks,
    not as a wall of identical ERRORs; other ERRORs and the counts stay."""
    why, fix = "could not run: the tensors of this batch disagree on the batch dimension", "Pass Setup(split_fn=...)."
    results = [CheckResult(cid, "error", why, advice=[fix])
               for cid in ("model.init_loss", "loop.zero_grad", "perf.memory")]
    results += [CheckResult("loop.resume", "error", "could not run: save_state failed", advice=["Fix save_state."]),
                CheckResult("data.label_shift", "fail", "labels shifted", {"fraction": 0.4}, advice=["Re-split."])]
    v = verdict(Report(results))
    assert [f.check for f in v.findings] == ["data.label_shift", "model.init_loss", "loop.resume"]
    grouped = v.findings[1]
    assert grouped.same == ("loop.zero_grad", "perf.memory")
    assert grouped.summary == f"{why} (the same error in 2 more check(s): loop.zero_grad, perf.memory)"
    assert v.headline.startswith("1 FAIL, 4 ERROR of 5 checks")
    from tropt.verdict import summary_lines

    assert sum(why in line for line in summary_lines(Report(results))) == 1  # the CLI's verdict names it once
    head = Report(results).to_markdown().split("## All checks")[0]
    assert head.count("disagree on the batch dimension") == 1 and "perf.memory" in head


def test_the_headline_says_how_many_checks_ran_and_which_stages_were_not_examined():
    """A data-only run (no Setup): 5 data checks PASS, every other check SKIPs. The headline counted the skipped checks
    as if they had found nothing ("nothing to fix in 27 checks"): it must say 5 ran and stages 2-6 were not examined."""
    import numpy as np
    import pandas as pd

    from tropt.verdict import summary_lines

    rng = np.random.default_rng(0)
    splits = {name: pd.DataFrame({"a": rng.normal(size=n), "b": rng.normal(size=n), "y": rng.integers(0, 2, n)})
              for name, n in (("train", 200), ("test", 100))}
    report = tropt.diagnose(splits=splits, label="y", progress=False)
    v = verdict(report)
    ran = sum(r.status.value != "skip" for r in report)
    assert ran == 5 and len(report.results) == 27, [(r.check, r.status) for r in report]
    assert v.headline == ("nothing to fix in the 5 checks that ran (22 of 27 skipped; not examined: stage 2 "
                          "objective, stage 3 can it learn, stage 4 is the update right, stage 5 dynamics, "
                          "stage 6 throughput)")
    assert v.ran == 5 and [s for s, _ in v.unexamined_stages] == [2, 3, 4, 5, 6]
    assert summary_lines(report)[0] == f"verdict: PASS: {v.headline}"  # every surface shows it
    assert v.headline in report._repr_html_() and v.headline in report.to_markdown()


def test_the_headline_counts_only_the_checks_that_ran_and_names_a_stage_only_when_all_its_checks_skipped():
    v = verdict(Report(RESULTS))  # loop.loss_scaling skipped, but loop.accumulation ran: stage 4 was examined
    assert v.headline == "3 FAIL, 1 ERROR, 2 WARN of 8 checks (7 ran, 1 skipped); fix them in this order"
    assert v.unexamined_stages == []
    ok = [CheckResult("data.label_shift", "pass", "labels agree"), CheckResult("model.init_loss", "skip", "no Setup"),
          CheckResult("model.eval_metric", "skip", "no metric"), CheckResult("loop.zero_grad", "pass", "ok")]
    assert verdict(Report(ok)).headline == ("nothing to fix in the 2 checks that ran (2 of 4 skipped; not examined: "
                                            "stage 2 objective)")
    assert verdict(Report(ok[:1])).headline == "nothing to fix in the 1 check that ran"
    skipped = [CheckResult("loop.resume", "skip", "no save_state")]
    assert verdict(Report(skipped)).headline == ("nothing was checked: the 1 check skipped (not examined: stage 4 is "
                                                 "the update right)")
    assert verdict(Report([])).headline == "nothing was checked: no checks in the report"
