import json
import os
import subprocess
import sys

import pytest
from support import SAMPLES

from tropt import registry
from tropt.cli import main
from tropt.result import CheckResult, Status

SAMPLE_SETUP = os.path.join(SAMPLES, "sample_setup.py")


@pytest.fixture
def one_failing_check(monkeypatch):
    def fails(setup):
        return CheckResult("loop.zero_grad", Status.FAIL, "gradients leak from step 1 into step 2",
                           advice=["Call optimizer.zero_grad() every step."])

    def warns(setup):
        return CheckResult("loop.resume", Status.WARN, "resume differs in RNG only")

    registry.load_checks()  # first: a check module imported under the fakes would register into them and be lost
    monkeypatch.setattr(registry, "_loaded", True)
    monkeypatch.setattr(registry, "_REGISTRY", {})  # only the fakes: real checks would change the selections
    monkeypatch.setitem(registry._REGISTRY, "loop.zero_grad",
                        registry.CheckSpec("loop.zero_grad", 4, "Zero grad", "t", fails, "setup"))
    monkeypatch.setitem(registry._REGISTRY, "loop.resume",
                        registry.CheckSpec("loop.resume", 4, "Resume", "t", warns, "setup"))


def test_cli_diagnose_prints_table_writes_json_and_gates(one_failing_check, tmp_path, capsys):
    out = tmp_path / "findings.json"
    code = main(["diagnose", "--setup", f"{SAMPLE_SETUP}:make_setup", "--checks", "loop.zero_grad,loop.resume",
                 "--json", str(out), "--no-progress"])
    printed = capsys.readouterr().out
    assert code == 1
    assert "FAIL   loop.zero_grad  gradients leak from step 1 into step 2" in printed
    assert "→ Call optimizer.zero_grad() every step." in printed and "report status: FAIL" in printed
    data = json.loads(out.read_text())
    assert data["status"] == "fail" and [r["check"] for r in data["results"]] == ["loop.zero_grad", "loop.resume"]
    assert main(["diagnose", "--setup", f"{SAMPLE_SETUP}:make_setup", "--checks", "loop.zero_grad", "--fail-on",
                 "never", "--no-progress"]) == 0
    assert main(["diagnose", "--setup", f"{SAMPLE_SETUP}:make_setup", "--checks", "loop.resume", "--fail-on", "warn",
                 "--no-progress"]) == 1
    assert main(["diagnose", "--setup", f"{SAMPLE_SETUP}:make_setup", "--checks", "loop.resume", "--no-progress"]) == 0


@pytest.mark.parametrize("args, message", [
    (["diagnose"], "needs --setup and/or --split"),
    (["diagnose", "--setup", "nowhere/missing.py:make"], "the file nowhere/missing.py does not exist"),
    (["diagnose", "--setup", f"{SAMPLE_SETUP}:nope"], "has no function 'nope'"),
    (["diagnose", "--setup", "no_such_module_xyz:f"], "is not importable"),
    (["diagnose", "--setup", "json:dumps"], "dumps raised TypeError"),
    (["diagnose", "--setup", "os:getcwd"], "returned a str, expected a tropt.Setup"),
    (["diagnose", "--setup", f"{SAMPLE_SETUP}:make_setup", "--checks", "loop.bogus"], "unknown check 'loop.bogus'"),
    (["diagnose", "--split", "train.csv"], "is not NAME=PATH"),
])
def test_cli_bad_input_is_one_line_exit_2(args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("tropt: error: ") and message in err and "Traceback" not in err


def test_console_script_lists_checks():
    exe = os.path.join(os.path.dirname(sys.executable), "tropt")
    out = subprocess.run([exe, "checks"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    for spec in registry.specs():
        assert spec.id in out.stdout


def test_version_and_every_help_has_an_example(capsys):
    import pytest as _pytest

    from tropt import __version__
    from tropt.cli import build_parser, main

    with _pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == f"tropt {__version__}"
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    assert set(sub.choices) == {"checks", "diagnose", "report", "suggest", "plan", "rerun"}
    for name, p in sub.choices.items():
        assert "example" in p.format_help() and f"tropt {name}" in p.format_help(), name
    help_text = sub.choices["report"].format_help()
    for name in ("setup", "splits", "label", "group", "time", "task", "checks", "budget", "seed"):
        assert name in help_text.split("report kinds and their parameters")[1]


def test_diagnose_prints_each_line_as_its_check_finishes(monkeypatch, capsys):
    import tropt.diagnosis as D
    from tropt.cli import main

    printed_before = []
    real = D.run_check

    def spy(spec, subject, options):  # what was printed when the next check starts
        printed_before.append(capsys.readouterr().out)
        return real(spec, subject, options)

    monkeypatch.setattr(D, "run_check", spy)
    main(["diagnose", "--split", f"train={SAMPLES}/train.csv", "--split", f"test={SAMPLES}/test.csv", "--label",
          "churned", "--checks", "data.exact_duplicates,data.label_sanity", "--fail-on", "never"])
    assert "data.exact_duplicates" in printed_before[1]  # the first check's line was out before the second ran


# ---------------------------------------------------------------------------------------------- hostile values (#31)
TERMINAL_PAYLOAD = "\x1b]0;pwned\x07\x1b[2J\x1b[31mred\rFAIL forged\nline"


def _hostile_label_splits(tmp_path, value):
    import pandas as pd

    train = pd.DataFrame({"x": range(40), "y": ["a", "b"] * 20})
    test = pd.DataFrame({"x": range(12), "y": ["a", "b"] * 4 + [value] * 4})
    train.to_csv(tmp_path / "train.csv", index=False)
    test.to_csv(tmp_path / "test.csv", index=False)
    return ["--split", f"train={tmp_path / 'train.csv'}", "--split", f"test={tmp_path / 'test.csv'}", "--label", "y"]


def test_diagnose_prints_no_control_character_from_a_label_value(tmp_path, capsys):
    splits = _hostile_label_splits(tmp_path, TERMINAL_PAYLOAD)
    code = main(["diagnose", *splits, "--checks", "data.class_coverage,data.label_shift", "--json",
                 str(tmp_path / "findings.json")])
    out, err = capsys.readouterr()
    assert code == 1
    for stream in (out, err):
        assert not any(c in stream for c in "\x1b\x07\r"), repr(stream)
    # the value is still shown, as escapes, and on the check's own line (it forges no line of its own)
    line = next(ln for ln in out.splitlines() if ln.startswith("FAIL   data.class_coverage"))
    assert "\\x1b]0;pwned\\x07\\x1b[2J" in line and "\\rFAIL forged\\nline" in line
    assert not any(ln.startswith("line") for ln in out.splitlines())
    # the findings keep the value itself
    saved = json.loads((tmp_path / "findings.json").read_text())
    cells = [v for r in saved["results"] for t in r["tables"].values() for row in t["data"] for v in row]
    assert TERMINAL_PAYLOAD in cells


def test_cli_error_messages_print_no_control_character(tmp_path, capsys):
    code = main(["diagnose", "--setup", f"{tmp_path}/\x1b]0;pwned\x07.py:make"])
    err = capsys.readouterr().err
    assert code == 2 and "\x1b" not in err and "\x07" not in err and "\\x1b]0;pwned\\x07" in err


def test_a_failed_json_write_keeps_the_earlier_file_and_exits_2_naming_it(tmp_path):
    """A disk that fills during --json (RLIMIT_FSIZE): the earlier findings.json is intact, exit 2 names the path."""
    splits = _hostile_label_splits(tmp_path, "c")
    target = tmp_path / "findings.json"
    target.write_text('{"earlier": "findings"}')
    script = ("import resource, signal, sys\n"
              "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
              "resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))\n"
              "from tropt.cli import main\n"
              f"sys.exit(main({['diagnose', *splits, '--checks', 'data.class_coverage', '--json', str(target)]!r}))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert str(target) in done.stderr and "Traceback" not in done.stderr
    assert json.loads(target.read_text()) == {"earlier": "findings"}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left
