"""Running a Setup check in the stage-1 tests: the Setup must come back untouched."""

from __future__ import annotations

from typing import Any

from tropt.testing import untouched


def run(check: Any, setup: Any, **kw: Any) -> Any:
    with untouched(setup):
        return check(setup, **kw)
