"""The stage 5 checks together: both are exported and registered, and diagnose runs them on the sample Setup."""

from __future__ import annotations

import tropt
from tropt.result import Status
from tropt.testing import untouched


def test_both_dynamics_checks_are_exported():
    import tropt.dynamics as dynamics

    assert {"check_loss_curve", "check_lr_range"} <= set(dynamics.__all__)
    assert dynamics.check_lr_range.__module__ == "tropt.dynamics.lr_range"


def test_registered_and_run_by_diagnose(sample_module):
    s = sample_module.make_setup()
    with untouched(s):
        rep = tropt.diagnose(s, checks=["dynamics"], progress=False)
    assert rep.checks == ["dynamics.loss_curve", "dynamics.lr_range"]
    assert all(r.status in (Status.PASS, Status.WARN) for r in rep), [r.summary for r in rep]
