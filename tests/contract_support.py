"""Assertions shared by the tests of the four contract checks (issue #20)."""

from __future__ import annotations

import tropt
from tropt.result import Status
from tropt.testing import untouched

from contract_cases import CASES, NEW

# Every check whose verdict does not depend on wall-clock time (perf.* measure it).
DETERMINISTIC = ["data", "model", "loop", "dynamics"]


def caught_by_exactly(case: str) -> tropt.Report:
    """Run every deterministic check on the case through ``diagnose``: the four new checks give the case's statuses
    and no other check FAILs or ERRORs; the user's objects stay untouched."""
    build, expected = CASES[case]
    setup = build()
    with untouched(setup):
        report = tropt.diagnose(setup, checks=DETERMINISTIC, progress=False)
    got = {r.check: r.status for r in report if r.check in NEW}
    assert got == expected, {r.check: r.summary for r in report if r.check in NEW and r.status is not expected[r.check]}
    others = {r.check: r.summary for r in report if r.check not in NEW and r.status in (Status.FAIL, Status.ERROR)}
    assert others == {}, others
    return report
