"""Importing tropt and its integration modules imports no framework, logger or index library (they are extras)."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEAVY = ("lightning", "pytorch_lightning", "transformers", "tensorboard", "wandb", "faiss", "datasketch", "mlflow")


def test_importing_tropt_and_the_integration_modules_imports_no_framework():
    code = ("import sys, tropt, tropt.integrations, tropt.integrations.lightning, tropt.integrations.hf, "
            "tropt.integrations.accelerate, tropt.data, tropt.dynamics.logs; "
            f"heavy = {HEAVY!r}; "
            "print(sorted({m.split('.')[0] for m in sys.modules if m.split('.')[0] in heavy}))")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout
