"""The perf stage as a whole: option errors of its checks, and its three checks run by ``diagnose`` in order."""

from __future__ import annotations

import pytest
from support.perf_setups import quiet_machine  # noqa: F401 - quiet_machine is an autouse fixture

import tropt
from tropt.perf import check_precision, check_throughput
from tropt.result import Status
from tropt.testing import untouched


def test_bad_options_say_how_to_fix(tiny_setup):
    with pytest.raises(tropt.TroptError, match="unknown precision"):
        check_precision(tiny_setup, precisions=("fp8",), progress=False)
    with pytest.raises(tropt.TroptError, match="steps"):
        check_throughput(tiny_setup, steps=1, progress=False)


def test_registered_and_run_by_diagnose(sample_module):
    s = sample_module.make_setup()
    with untouched(s):
        rep = tropt.diagnose(s, checks=["perf"], progress=False)
    assert rep.checks == ["perf.throughput", "perf.precision", "perf.memory"]
    assert all(r.status in (Status.PASS, Status.WARN) for r in rep), [r.summary for r in rep]
