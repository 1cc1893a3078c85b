"""One contract suite over the whole registry (issue #29), like scikit-learn's ``parametrize_with_checks``.

For every registered check, on a healthy case and on a planted-defect case (tests/contract_suite_cases.py), one test
``<check id>-<case>`` asserts the contract every check owes its callers:

1. the result names its check;
2. the verdict: the case's expected status, for the right reason (the case's ``why``: a distinctive metric, or the
   planted cause in the summary);
3. every non-PASS, non-SKIP result has advice and evidence (non-empty tables, unless the case says where else);
4. the JSON round trip (strict JSON, as findings.json is written) keeps check, status, summary, metric keys,
   table shapes, advice and series names;
5. ``plot()`` returns a matplotlib Axes, or (for a result the case declares has nothing to draw) raises TroptError
   with a message;
6. with ``progress=False`` nothing is printed, to sys.stdout/sys.stderr or to file descriptors 1 and 2;
7. nothing the user handed over is mutated (``tropt.testing.untouched``: the Setup, or every split's table);
8. its budget options are accepted: every check runs with ``budget_options("quick", id)`` merged in.

Checks are reached only through the registry. A check registered without cases fails
``test_every_registered_check_has_a_healthy_and_a_defect_case``.
"""

from __future__ import annotations

import inspect
import json

import matplotlib.axes
import pytest
from support.contract_suite_cases import CASES, Case

import tropt
from tropt import registry
from tropt.budgets import budget_options
from tropt.result import CheckResult, Status
from tropt.testing import untouched

REQUIRED_KINDS = {"healthy", "defect"}


def run_case(case: Case) -> CheckResult:
    """Build the case's subject and run its check through the registry with the quick budget, under untouched()."""
    spec = registry.find_spec(case.check)
    assert spec is not None, f"{case.check} is not registered"
    subject = case.build()
    if spec.needs == "splits":
        assert isinstance(subject, dict), f"{case.id}: a 'splits' check takes a mapping of splits"
        watched = tuple(subject.values())  # untouched() compares each table (values, dtypes, index, attrs)
    else:
        assert isinstance(subject, tropt.Setup), f"{case.id}: a 'setup' check takes a tropt.Setup"
        watched = (subject,)
    params = inspect.signature(spec.func).parameters
    options = {**case.options, **budget_options("quick", case.check)}
    unknown = sorted(set(options) - set(params))
    assert not unknown, f"8. {case.check} does not take the options {unknown} (its signature: {list(params)})"
    if "progress" in params:
        options["progress"] = False
    with untouched(*watched):  # 7. raises AssertionError listing what changed
        result = spec.func(subject, **options)
    return result


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=c.marks) for c in CASES])
def test_check_contract(case: Case, capfd):
    capfd.readouterr()  # drop what building the fixtures printed
    r = run_case(case)
    out, err = capfd.readouterr()
    assert (out, err) == ("", ""), f"6. progress=False printed: stdout={out!r} stderr={err!r}"

    assert isinstance(r, CheckResult), type(r)
    assert r.check == case.check, f"1. result says {r.check!r}"

    got = r.status.value.upper()
    assert r.status in case.expect, f"2. {got} (expected {[s.value for s in case.expect]}): {r.summary}"
    assert case.why(r), f"2. {got} for another reason than the planted one: {r.summary} | {r.metrics}"
    assert isinstance(r.summary, str) and r.summary.strip(), "a result must have a one-line summary"

    if r.status not in (Status.PASS, Status.SKIP):
        assert r.advice and all(isinstance(a, str) and a.strip() for a in r.advice), f"3. no advice: {r.summary}"
        if case.evidence is None:
            assert any(len(df) for df in r.tables.values()), \
                f"3. no evidence table (tables: { {k: v.shape for k, v in r.tables.items()} }): {r.summary}"
        else:
            assert r.metrics or r.series, f"3. evidence declared in metrics/series ({case.evidence}) but both are empty"

    text = json.dumps(r.to_dict(), allow_nan=False)  # strict JSON: findings.json is written with allow_nan=False
    back = CheckResult.from_dict(json.loads(text))
    assert (back.check, back.status, back.summary) == (r.check, r.status, r.summary), "4. identity lost in JSON"
    assert set(back.metrics) == set(r.metrics), "4. metric keys changed in JSON"
    assert {k: v.shape for k, v in back.tables.items()} == {k: v.shape for k, v in r.tables.items()}, "4. table shapes"
    for name, df in r.tables.items():
        assert list(back.tables[name].columns) == [str(c) for c in df.columns], f"4. columns of table {name!r}"
    assert back.advice == list(r.advice) and set(back.series) == set(r.series), "4. advice or series names changed"

    for shown in (r, back):  # a report read back from findings.json draws the same picture
        if case.plot is True:
            ax = shown.plot()
            assert isinstance(ax, matplotlib.axes.Axes), f"5. plot() returned {type(ax).__name__}"
        else:
            with pytest.raises(tropt.TroptError) as info:
                shown.plot()
            assert str(info.value).strip(), "5. plot() raised TroptError without a message"


def test_every_registered_check_has_a_healthy_and_a_defect_case():
    """A new check without cases fails here (the contract suite is driven by the registry, not by a list)."""
    ids = [s.id for s in registry.specs()]
    assert ids, "the registry lists no checks"
    kinds: dict[str, set[str]] = {}
    for c in CASES:
        kinds.setdefault(c.check, set()).add(c.kind)
    missing = {cid: sorted(REQUIRED_KINDS - kinds.get(cid, set())) for cid in ids
               if REQUIRED_KINDS - kinds.get(cid, set())}
    assert not missing, f"registered checks without contract cases: {missing}"
    stale = sorted(set(kinds) - set(ids))
    assert not stale, f"cases for checks that are not registered: {stale}"
    case_ids = [c.id for c in CASES]
    assert len(case_ids) == len(set(case_ids)), "two cases share an id"


@pytest.mark.parametrize("budget", ["quick", "standard", "thorough"])  # the documented budgets
def test_every_budget_gives_only_options_the_check_takes(budget):
    """diagnose passes a budget's options by keyword: each must be a parameter of its check (all budgets, not only
    the quick one the contract cases run with)."""
    wrong = {}
    for spec in registry.specs():
        params = inspect.signature(spec.func).parameters
        extra = sorted(set(budget_options(budget, spec.id)) - set(params))
        if extra:
            wrong[spec.id] = extra
    assert not wrong, f"budget {budget!r} gives options the checks do not take: {wrong}"
