"""Assertions shared by the tests of the four contract checks (issue #20)."""

from __future__ import annotations

import tropt
from support.contract_cases import CASES, NEW
from tropt.result import Status
from tropt.testing import untouched

# Every check whose verdict does not depend on wall-clock time (perf.* measure it).
DETERMINISTIC = ["data", "model", "loop", "dynamics"]
# Stages 1-4 judge the setup itself; stage 5 (dynamics) shows symptoms, which a planted defect may rightly cause
# (a validation split without the normalisation does not generalise), so it must stay quiet on healthy controls only.
CORRECTNESS = ("data.", "model.", "loop.")


def caught_by_exactly(case: str) -> tropt.Report:
    """Run every deterministic check on the case through ``diagnose``: the four new checks give the case's statuses,
    no other stage 1-4 check FAILs or ERRORs, nothing at all FAILs on a healthy control, and the user's objects stay
    untouched."""
    build, expected = CASES[case]
    setup = build()
    with untouched(setup):
        report = tropt.diagnose(setup, checks=DETERMINISTIC, progress=False)
    got = {r.check: r.status for r in report if r.check in NEW}
    assert got == expected, {r.check: r.summary for r in report if r.check in NEW and r.status is not expected[r.check]}
    healthy = all(s is Status.PASS for s in expected.values())
    others = {r.check: r.summary for r in report if r.check not in NEW and r.status in (Status.FAIL, Status.ERROR)
              and (healthy or r.check.startswith(CORRECTNESS))}
    assert others == {}, others
    return report
