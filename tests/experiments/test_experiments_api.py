"""The public surface: lazy exports, no heavy imports until a comparison needs them."""

from __future__ import annotations

import subprocess
import sys


def test_exports_are_lazy_and_light():
    code = ("import sys, tropt; tropt.Budget, tropt.Guardrails, tropt.Comparison, tropt.compare, tropt.Metric;"
            "import tropt.experiments; tropt.experiments.dask_executor; tropt.experiments.EarlyStopping;"
            "heavy=[m for m in ('scipy', 'dask', 'distributed', 'mlflow', 'matplotlib', 'ipywidgets') "
            "if m in sys.modules];"
            "print(heavy, callable(tropt.compare), tropt.compare is tropt.experiments.compare, "
            "'experiments' in dir(tropt))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]", "True", "True", "True"]


def test_compare_stays_the_function_after_submodule_imports():
    import tropt
    import tropt.experiments.comparison
    import tropt.experiments.orchestration

    assert callable(tropt.compare) and callable(tropt.experiments.compare)
    assert tropt.compare.__module__ == "tropt.experiments.orchestration"
