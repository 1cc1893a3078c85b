"""The shipped diagnose notebook works on first touch: Run All with its empty parameters diagnoses the bundled
sample, says so, and shows progress (#15)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from support import ROOT

pytestmark = pytest.mark.slow  # a kernel


def test_diagnose_notebook_runs_all_on_its_empty_parameters(tmp_path):
    import papermill

    from tropt.report.runner import current_interpreter_kernel

    out = tmp_path / "diagnose.ipynb"
    with current_interpreter_kernel() as kernel:  # as JupyterLab opens it: cwd is notebooks/
        papermill.execute_notebook(str(Path(ROOT, "notebooks", "diagnose.ipynb")), str(out), kernel_name=kernel,
                                   parameters={"budget": "quick", "output_dir": str(tmp_path)}, progress_bar=False,
                                   cwd=str(Path(ROOT, "notebooks")))
    nb = nbformat.read(out, as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    text = "".join(str(o.get("data", {}).get("text/markdown", "")) + str(o.get("data", {}).get("text/html", "")) for o in outputs)
    assert "diagnosing the bundled sample" in text
    progress = [o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
                or (o.get("name") == "stderr" and "tropt diagnose" in o.get("text", ""))]
    assert progress, "no progress shown while the checks ran"
    assert text.index("tropt-verdict") < text.index("tropt-result")  # the verdict first
    assert 'data-check="data.group_leakage" data-status="fail"' in text  # the sample's planted leak
    assert (tmp_path / "findings.json").is_file()


def test_bundled_sample_is_found_from_a_subdirectory_and_not_elsewhere(tmp_path):
    from tropt.report.display import bundled_sample

    sample = bundled_sample(str(Path(ROOT, "notebooks")))
    assert sample["setup"].endswith("sample_setup.py:make_setup") and sample["label"] == "churned"
    assert bundled_sample(str(tmp_path)) is None


def test_diagnose_notebook_explains_instead_of_raising_without_the_sample(tmp_path):
    import papermill

    from tropt.report.runner import current_interpreter_kernel

    out = tmp_path / "diagnose.ipynb"
    with current_interpreter_kernel() as kernel:  # an installed package: no data/samples anywhere above
        papermill.execute_notebook(str(Path(ROOT, "notebooks", "diagnose.ipynb")), str(out), kernel_name=kernel,
                                   parameters={"output_dir": str(tmp_path)}, progress_bar=False, cwd=str(tmp_path))
    nb = nbformat.read(out, as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any("Nothing to diagnose yet" in str(o.get("data", {}).get("text/markdown", "")) for o in outputs)
