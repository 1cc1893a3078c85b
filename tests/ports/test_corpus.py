"""The corpus of ports (issue 28): every healthy port passes every check but ``perf.*`` without a FAIL or ERROR, and
every planted bug is flagged by its check id with its cause. See ``tests/ports/__init__.py``."""

from __future__ import annotations

import pytest
import torch

from ports import FAMILIES, Bug, Port, all_ports, available, diagnose, healthy_checks, missing_causes
from tropt.result import Status

PORTS = all_ports()
BUGS = [(p, b) for p in PORTS for b in p.bugs]


def _skip_unavailable(port: Port) -> None:
    reason = available(port)
    if reason:
        pytest.skip(reason)


@pytest.mark.parametrize("port", PORTS, ids=[p.name for p in PORTS])
def test_healthy_port_has_no_fail_or_error(port: Port) -> None:
    _skip_unavailable(port)
    torch.manual_seed(0)
    results = diagnose(port.build(), healthy_checks())
    alarms = {cid: f"{r.status.value}: {r.summary}" for cid, r in results.items()
              if r.status in (Status.FAIL, Status.ERROR)}
    assert not alarms, f"false alarms on the healthy port {port.name} ({port.upstream}): {alarms}"


@pytest.mark.parametrize(("port", "bug"), BUGS, ids=[f"{p.name}-{b.name}" for p, b in BUGS])
def test_planted_bug_is_flagged_with_its_cause(port: Port, bug: Bug) -> None:
    _skip_unavailable(port)
    torch.manual_seed(0)
    # Only the check that must flag it (and any the bug declares): what is asserted, at a fifth of the cost of all
    # of stages 2-4 (benchmarks/corpus_rates.py runs those, and reports the other checks' FAILs too).
    results = diagnose(bug.build(), list(bug.checks or (bug.check,)))
    r = results[bug.check]
    assert r.status in (Status.FAIL, Status.WARN), f"{bug.name}: {bug.check} is {r.status.value}: {r.summary}"
    assert not missing_causes(bug, r), f"{bug.name}: cause not named; missing {missing_causes(bug, r)} in {r.summary}"


def test_every_port_names_its_upstream_and_family() -> None:
    for p in PORTS:
        assert p.family in FAMILIES, p.name
        assert "/" in p.upstream, f"{p.name}: upstream must name the public file it paraphrases"
        assert p.build.__doc__, f"{p.name}: the builder's docstring says what the port follows"
    assert len({p.name for p in PORTS}) == len(PORTS), "port names are unique"
