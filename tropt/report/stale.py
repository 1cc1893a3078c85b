"""Sweep what a killed ``tropt report`` left in ``$TMPDIR``: its private kernelspec directory (``tropt-kernel-*``,
which holds the kernel's connection file and so its HMAC key) and the kernel still running from it.

Each run writes its pid (and, on Linux, the process start time, so a reused pid is not taken for the run) into
``owner`` in its directory; a later run removes every directory whose owner is gone. Directories without an owner
file (another program's, or an older tropt's) are left alone."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path

PREFIX = "tropt-kernel-"
OWNER = "owner"


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (Linux), or "" where /proc cannot tell."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def mark_owner(directory: str | os.PathLike) -> None:
    """Write this process's identity into ``directory`` (the run's private kernel directory)."""
    Path(directory, OWNER).write_text(f"{os.getpid()} {_start_time(os.getpid())}\n")


def _alive(pid: int, started: str) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive, and not ours to judge
    return not started or _start_time(pid) in ("", started)


def _kill_kernels_of(directory: Path) -> None:
    """Kill kernels whose command line names a connection file in ``directory`` (orphans of the killed run)."""
    proc = Path("/proc")
    if not proc.is_dir():
        return
    needle = str(directory).encode()
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            if needle in cmdline and b"ipykernel" in cmdline:
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, ValueError):
            continue


def sweep_stale(tmp: str | os.PathLike | None = None) -> list[Path]:
    """Remove the kernel directories of tropt runs that no longer run (and kill their kernels); returns them."""
    root = Path(tmp if tmp is not None else tempfile.gettempdir())
    removed: list[Path] = []
    try:
        candidates = [p for p in root.iterdir() if p.name.startswith(PREFIX) and p.is_dir()]
    except OSError:
        return removed
    for d in candidates:
        try:
            pid_text, _, started = (d / OWNER).read_text().strip().partition(" ")
            pid = int(pid_text)
        except (OSError, ValueError):
            continue  # no owner file: not a run of this tropt, left alone
        if _alive(pid, started):
            continue
        _kill_kernels_of(d)
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed
