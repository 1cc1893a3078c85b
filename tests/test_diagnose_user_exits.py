"""A user's step that calls sys.exit() is an ERROR of that check; the others run. Ctrl-C still stops (#16)."""

from __future__ import annotations

import sys

import pandas as pd
import pytest

import tropt
from tropt.training import standard_step


def _exiting_step(ctx, micro_batches):
    sys.exit(3)


def _splits():
    train = pd.DataFrame({"x": range(20), "y": [0, 1] * 10})
    return {"train": train, "test": train.iloc[:5]}  # 5 copied rows: a FAIL the data checks must still report


def test_systemexit_in_the_step_is_error_and_the_rest_run(tiny_setup):
    setup = tiny_setup.replace(step=_exiting_step)
    report = tropt.diagnose(setup, _splits(), label="y",
                            checks=["data.exact_duplicates", "loop.zero_grad", "loop.accumulation"],
                            progress=False)
    assert report["data.exact_duplicates"].status.value == "fail"
    for check in ("loop.zero_grad", "loop.accumulation"):
        r = report[check]
        assert r.status.value == "error" and "SystemExit(3)" in r.summary and "sys.exit()" in r.advice[0], r


def test_a_healthy_step_still_passes(tiny_setup):
    report = tropt.diagnose(tiny_setup.replace(step=standard_step), checks=["loop.zero_grad"], progress=False)
    assert report["loop.zero_grad"].status.value == "pass"


def test_keyboardinterrupt_still_stops_the_run(tiny_setup):
    def interrupted(ctx, micro_batches):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tropt.diagnose(tiny_setup.replace(step=interrupted), checks=["loop.zero_grad", "loop.accumulation"],
                       progress=False)
