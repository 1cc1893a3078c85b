"""`tropt report` under hostile input and faults: no injection, no lost report, no mixed output (issue #16)."""

from __future__ import annotations

import json
import os

import pytest
from support import SAMPLES

from tropt.cli import main

SPLITS = json.dumps({"train": os.path.join(SAMPLES, "train.csv"), "test": os.path.join(SAMPLES, "test.csv")})


@pytest.fixture
def no_kernel(monkeypatch):
    """Fail the test if a notebook would be executed (papermill.execute_notebook is the only way a kernel starts)."""
    import papermill

    calls = []
    monkeypatch.setattr(papermill, "execute_notebook",
                        lambda *a, **k: calls.append(a) or (_ for _ in ()).throw(AssertionError("a kernel started")))
    return calls


@pytest.mark.parametrize("name",
                         ["__import__('pathlib').Path('{marker}').touch();x", "lable", "output_dir", "1x", "label "])
def test_parameter_names_must_be_declared_identifiers(name, no_kernel, tmp_path, capsys):
    marker = tmp_path / "pwned"
    code = main(["report", "data", "-p", "splits", SPLITS, "-p", name.format(marker=marker), "1", "-o",
                 str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and no_kernel == [] and not marker.exists()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tropt: error: "), err
    assert "splits, label, group, time" in lines[0] or "-o OUT_DIR" in lines[0], err


def test_declared_parameters_are_the_notebooks_own():
    from tropt.report.runner import declared_parameters, notebook_path

    assert declared_parameters(notebook_path("data"))[:4] == ["splits", "label", "group", "time"]


def _tropt_report(*args, env=None, timeout=600):
    import subprocess
    import sys

    exe = os.path.join(os.path.dirname(sys.executable), "tropt")
    return subprocess.run([exe, "report", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


@pytest.mark.slow
def test_report_draws_inline_whatever_mplbackend_says(tmp_path):
    proc = _tropt_report("data", "-p", "splits", SPLITS, "-p", "label", "churned", "-p", "group", "customer_id",
                         "-o", str(tmp_path), env={"MPLBACKEND": "Agg"})
    assert proc.returncode == 1, proc.stderr  # the sample's planted leaks
    page = (tmp_path / "report.html").read_text()
    assert page.count("data:image/png;base64") >= 5  # one per data check that has a picture (1 with the Agg backend)


# ---- outputs: validated first, locked, whole or untouched -------------------------------------------------------

def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tropt: error: ") and "Traceback" not in err, err
    return lines[0]


def _read_only_dir(tmp_path):
    """A directory no one may write in: chmod works for users; root writes anywhere except a read-only mount."""
    if os.geteuid() == 0:
        return "/sys"
    path = tmp_path / "ro"
    path.mkdir()
    path.chmod(0o555)
    return str(path)


@pytest.mark.parametrize("where, message", [
    ("file", "is an existing file, not a directory"),
    ("read-only", "cannot write in"),
    ("under-file", "is a file"),
])
def test_report_output_dir_is_validated_before_a_kernel(where, message, no_kernel, tmp_path, capsys):
    (tmp_path / "f.txt").write_text("mine")
    target = {"file": str(tmp_path / "f.txt"), "read-only": os.path.join(_read_only_dir(tmp_path), "out"),
              "under-file": str(tmp_path / "f.txt" / "out")}[where]
    assert main(["report", "data", "-p", "splits", SPLITS, "-o", target]) == 2
    assert message in _one_error_line(capsys) and no_kernel == []
    assert (tmp_path / "f.txt").read_text() == "mine"


@pytest.mark.parametrize("flag", ["--json", "--html"])
@pytest.mark.parametrize("where, message", [("dir", "is a directory, not a file"), ("read-only", "cannot write in")])
def test_diagnose_output_files_are_validated_before_any_check(flag, where, message, tmp_path, capsys, monkeypatch):
    import tropt.diagnosis

    ran = []
    monkeypatch.setattr(tropt.diagnosis, "diagnose", lambda *a, **k: ran.append(a))
    target = str(tmp_path) if where == "dir" else os.path.join(_read_only_dir(tmp_path), "findings.out")
    train = os.path.join(SAMPLES, "train.csv")
    assert main(["diagnose", "--split", f"train={train}", "--label", "churned", flag, target, "--no-progress"]) == 2
    assert message in _one_error_line(capsys) and ran == []


def test_a_second_report_into_a_locked_directory_refuses(no_kernel, tmp_path, capsys):
    import subprocess
    import sys

    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom pathlib import Path\n"
                               "from tropt.report.outputs import output_lock\n"
                               f"with output_lock(Path({str(out)!r})):\n"
                               "    print('locked', flush=True)\n    time.sleep(60)\n"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert main(["report", "data", "-p", "splits", SPLITS, "-o", str(out)]) == 2
        line = _one_error_line(capsys)
        assert f"another tropt report (pid {holder.pid}) is writing to {out}" in line and no_kernel == []
    finally:
        holder.kill()
        holder.wait()
    assert sorted(p.name for p in out.iterdir()) == [".tropt-report.lock"]  # the refused run wrote nothing


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as fh:
            return "\nState:\tZ" not in fh.read()  # a zombie has exited
    except FileNotFoundError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_interrupted_report_leaves_the_previous_one_and_no_secrets(signame, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    marker = tmp_path / "kernel.pid"
    setup_py = tmp_path / "slow_setup.py"
    setup_py.write_text(f"import os, time\ndef make_setup():\n    open({str(marker)!r}, 'w').write(str(os.getpid()))\n"
                        "    time.sleep(120)\n")
    out, tmpdir = tmp_path / "out", tmp_path / "tmpdir"
    out.mkdir()
    tmpdir.mkdir()
    previous = {"report.html": "<p>previous</p>", "report.ipynb": "{}", "findings.json": '{"previous": true}'}
    for name, text in previous.items():
        (out / name).write_text(text)
    exe = os.path.join(os.path.dirname(sys.executable), "tropt")
    proc = subprocess.Popen([exe, "report", "diagnose", "-p", "setup", f"{setup_py}:make_setup", "-o", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "TMPDIR": str(tmpdir)})
    deadline = time.monotonic() + 300
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert marker.exists(), proc.communicate()
    time.sleep(0.5)
    if signame == "SIGINT":
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal reaches the whole process group
    else:
        proc.send_signal(signal.SIGTERM)  # kill PID reaches tropt alone
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == (130 if signame == "SIGINT" else 143), err
    assert "holds the previous report, unchanged" in err.strip().splitlines()[-1], err
    assert "Traceback" not in err, err  # not even the killed kernel's cell task, logged by asyncio at exit
    assert {p.name: p.read_text() for p in out.iterdir() if p.name in previous} == previous
    assert not [p for p in out.iterdir() if p.name.startswith(".tropt-incomplete-")]
    assert sorted(p.name for p in tmpdir.iterdir()) == []  # no kernelspec, no connection file (its HMAC key)
    kernel = int(marker.read_text())
    for _ in range(50):
        if not _alive(kernel):
            break
        time.sleep(0.2)
    assert not _alive(kernel)


def test_findings_written_before_a_later_cell_failed_are_printed(monkeypatch, tmp_path, capsys):
    from tropt import CheckResult, Report
    from tropt.report import runner

    # the notebook wrote its findings, then a display cell failed
    def execute(papermill, source, params, work, **kwargs):
        Report([CheckResult("data.exact_duplicates", "fail", "30 rows of test are in train")]).to_json(
            str(work / "findings.json"))
        return "cell 3 ('show_report(report)') failed: ValueError: cannot draw", {}

    monkeypatch.setattr(runner, "_execute", execute)
    out = tmp_path / "out"
    assert main(["report", "data", "-p", "splits", SPLITS, "-o", str(out)]) == 2  # a failed cell is still exit 2
    printed = capsys.readouterr()
    assert "FAIL   data.exact_duplicates  30 rows of test are in train" in printed.out
    assert printed.err.strip() == "tropt: report failed: cell 3 ('show_report(report)') failed: ValueError: cannot draw"
    assert (out / "findings.json").is_file()
