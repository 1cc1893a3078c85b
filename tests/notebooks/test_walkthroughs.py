"""Teaching walkthroughs execute top to bottom; each asserts its own story (broken -> FAIL, fixed -> PASS)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from support import ROOT

pytestmark = pytest.mark.slow  # a kernel per notebook
WALKTHROUGHS = sorted(Path(ROOT, "notebooks").glob("walkthrough_*.ipynb"))


def test_there_are_walkthroughs():
    assert WALKTHROUGHS, "notebooks/walkthrough_*.ipynb not found"


@pytest.mark.parametrize("path", WALKTHROUGHS, ids=lambda p: p.stem)
def test_walkthrough_runs_and_tells_its_story(path, tmp_path):
    import papermill

    from tropt.report.runner import current_interpreter_kernel

    out = tmp_path / path.name
    with current_interpreter_kernel() as kernel:
        papermill.execute_notebook(str(path), str(out), kernel_name=kernel, progress_bar=False, cwd=str(tmp_path))
    nb = nbformat.read(out, as_version=4)
    html = "".join(o.get("data", {}).get("text/html", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    images = sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert 'data-status="fail"' in html and 'data-status="pass"' in html  # the broken setup, then the fix
    assert images >= 2  # the symptom and the evidence are pictures
