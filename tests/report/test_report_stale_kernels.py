"""A `tropt report` killed outright (SIGKILL) leaves its private kernelspec and connection file in $TMPDIR; the
next run sweeps them, by whether the run that made them still lives, and leaves live runs' and others' alone."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tropt.report.runner import _private_kernel
from tropt.report.stale import PREFIX, mark_owner, sweep_stale

KILLED_RUN = """
import os, signal
from tropt.report.runner import _private_kernel
with _private_kernel():
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_next_run_sweeps_what_a_killed_run_left(tmp_path, monkeypatch):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", KILLED_RUN], env=env, capture_output=True)
    assert done.returncode == -9
    left = [p for p in tmp_path.iterdir() if p.name.startswith(PREFIX)]
    assert len(left) == 1 and (left[0] / "kernels").is_dir()  # what SIGKILL leaves behind
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with _private_kernel():
        live = [p for p in tmp_path.iterdir() if p.name.startswith(PREFIX)]
        assert left[0] not in live and len(live) == 1  # swept; this run's own directory is there
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(PREFIX)]


def test_only_directories_of_dead_runs_are_swept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    gone, mine, foreign = (tmp_path / f"{PREFIX}{n}" for n in ("gone", "mine", "foreign"))
    for d in (gone, mine, foreign):
        d.mkdir()
    (gone / "owner").write_text(f"{dead_pid} \n")
    mark_owner(mine)
    (tmp_path / f"{PREFIX}reused").mkdir()
    (tmp_path / f"{PREFIX}reused" / "owner").write_text(f"{os.getpid()} 1\n")  # our pid, another start time
    removed = sweep_stale(tmp_path)
    names = sorted(Path(p).name for p in removed)
    assert names == sorted([gone.name] + ([f"{PREFIX}reused"] if Path("/proc/self/stat").exists() else []))
    assert mine.is_dir() and foreign.is_dir()
