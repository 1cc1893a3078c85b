"""End-to-end cost of the demo report, broken down: kernel start, checks, notebook overhead, HTML conversion.

Goal (issue #6): the demo report (kernel start, all checks on the sample, HTML) in under a minute on 2 cores.

    .venv/bin/python benchmarks/bench_report.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import LoadWatch, spread

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "data" / "samples"
TROPT = Path(sys.executable).parent / "tropt"


def kernel_start_s() -> float:
    """Start a kernel of this interpreter, run one trivial cell, shut it down."""
    from jupyter_client.manager import start_new_kernel

    from tropt.report.runner import current_interpreter_kernel

    with current_interpreter_kernel() as name:
        t = time.perf_counter()
        km, kc = start_new_kernel(kernel_name=name)
        kc.execute_interactive("1 + 1", timeout=60, output_hook=lambda msg: None)
        elapsed = time.perf_counter() - t
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    return elapsed


def import_s() -> float:
    """Importing torch + tropt + the sample setup in a fresh interpreter (the notebook's first cell pays it)."""
    code = f"import sys; sys.path.insert(0, {str(SAMPLES)!r}); import torch, tropt, tropt.diagnosis, sample_setup"
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - t


def plot_s(findings: dict) -> float:
    """Drawing every result's picture to PNG, as the notebook does (Agg backend)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tropt.errors import TroptError
    from tropt.result import Report

    t = time.perf_counter()
    for r in Report.from_dict(findings):
        try:
            ax = r.plot()
        except TroptError:
            continue
        ax.figure.savefig(io.BytesIO(), format="png")
        plt.close(ax.figure)
    return time.perf_counter() - t


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=1, help="end-to-end runs (the breakdown is of the last)")
    args = ap.parse_args()
    watch = LoadWatch("bench_report")
    totals = []
    for _ in range(args.repeats):
        total, findings, html_s = one_report()
        totals.append(total)
    checks = {r["check"]: r["duration_s"] for r in findings["results"]}
    plots_s = plot_s(findings)
    kernel, imports = kernel_start_s(), import_s()
    checks_s = sum(checks.values())
    print(f"demo report end to end: {spread(totals, 1, ' s', 1)} (goal < 60 s)")
    print(f"  kernel start            {kernel:6.1f} s")
    print(f"  imports (torch, tropt)  {imports:6.1f} s")
    print(f"  checks                  {checks_s:6.1f} s")
    print(f"  plots to PNG            {plots_s:6.1f} s")
    print(f"  HTML conversion         {html_s:6.1f} s")
    print(f"  rest (papermill, notebook I/O) {total - kernel - imports - checks_s - plots_s - html_s:6.1f} s")
    print("slowest checks: "
          + ", ".join(f"{k} {v:.1f} s" for k, v in sorted(checks.items(), key=lambda kv: -kv[1])[:5]))
    watch.done()


def one_report() -> tuple[float, dict, float]:
    """One ``tropt report`` of the demo: (seconds end to end, findings, seconds of a second HTML conversion)."""
    splits = json.dumps({"train": str(SAMPLES / "train.csv"), "test": str(SAMPLES / "test.csv")})
    with tempfile.TemporaryDirectory() as out:
        t = time.perf_counter()
        proc = subprocess.run([str(TROPT), "report", "diagnose", "-p", "setup",
                               f"{SAMPLES / 'sample_setup.py'}:make_setup",
                               "-p", "splits", splits, "-p", "label", "churned", "-p", "group", "customer_id",
                               "-p", "time", "signup_date", "-o", out, "--fail-on", "never"],
                              capture_output=True, text=True)
        total = time.perf_counter() - t
        assert proc.returncode == 0, proc.stderr
        findings = json.loads(Path(out, "findings.json").read_text())
        html_t = time.perf_counter()
        from tropt.report.runner import to_html

        to_html(Path(out) / "report.ipynb", Path(out) / "again.html")
        html_s = time.perf_counter() - html_t
    return total, findings, html_s


if __name__ == "__main__":
    main()
