"""Output paths: validated before anything runs, locked while a run writes them, filled only when complete.

A report run writes into a hidden ``.tropt-incomplete-*`` directory inside its output directory and moves the files
into place when they are all there, under a lock, so two runs never mix and an interrupted run leaves the previous
report intact (only a killed run can leave the hidden directory behind, named for what it is).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import TroptError

LOCK_NAME = ".tropt-report.lock"
PARTIAL_PREFIX = ".tropt-incomplete-"


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _probe_writable(directory: Path, what: str) -> None:
    """Create and remove a file in ``directory`` (os.access says yes to root even where a write fails)."""
    try:
        fd, name = tempfile.mkstemp(prefix=".tropt-probe-", dir=directory)
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        raise TroptError(f"{what}: cannot write in {directory} ({exc.strerror or exc})",
                         "choose a writable location, or fix its permissions") from None


def check_output_dir(path: str | os.PathLike, flag: str = "-o") -> Path:
    """The absolute output directory, after checking it is (or can be created as) a writable directory."""
    out = Path(path).expanduser().absolute()
    if out.exists() and not out.is_dir():
        raise TroptError(f"{flag} {path} is an existing file, not a directory",
                         f"give {flag} a directory (it is created when missing)")
    base = _nearest_existing(out)
    if not base.is_dir():
        raise TroptError(f"{flag} {path} cannot be created: {base} is a file", f"give {flag} a path under a directory")
    _probe_writable(base, f"{flag} {path}")
    return out


def check_output_file(path: str | os.PathLike, flag: str) -> Path:
    """The absolute path of an output file, after checking it names no directory and can be written."""
    target = Path(path).expanduser().absolute()
    if target.is_dir():
        raise TroptError(f"{flag} {path} is a directory, not a file",
                         f"give {flag} a file name, e.g. {Path(path) / 'findings.json'}")
    if target.exists() and not os.access(target, os.W_OK):
        raise TroptError(f"{flag} {path} exists and is read-only", "choose another file, or fix its permissions")
    base = _nearest_existing(target.parent)
    if not base.is_dir():
        raise TroptError(f"{flag} {path} cannot be created: {base} is a file", f"give {flag} a path under a directory")
    _probe_writable(base, f"{flag} {path}")
    return target


def _try_lock(fd: int) -> bool:
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        import msvcrt

        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)  # type: ignore[attr-defined]  # typeshed: win32 only
            return True
        except OSError:
            return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


@contextmanager
def output_lock(out: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``out`` for the block; a second run refuses at once, naming the holder.

    The lock is the OS's (flock), so it is released when its holder exits, however it exits: a stale lock file
    never blocks a later run.
    """
    try:
        fd = os.open(out / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise TroptError(f"cannot lock {out} ({exc.strerror or exc})", "choose a writable output directory") from None
    try:
        if not _try_lock(fd):
            holder = os.read(fd, 32).decode(errors="replace").strip()
            raise TroptError(f"another tropt report{f' (pid {holder})' if holder else ''} is writing to {out}",
                             "wait for it to finish, or choose another -o directory")
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        yield
    finally:
        os.close(fd)  # releases the lock; the file stays (removing it would race a run that is opening it)


@contextmanager
def staging_dir(out: Path) -> Iterator[Path]:
    """A fresh hidden directory inside ``out`` for one run's files; removed on every exit path."""
    work = Path(tempfile.mkdtemp(prefix=PARTIAL_PREFIX, dir=out))
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


def move_into_place(work: Path, out: Path, names: Iterable[str]) -> None:
    """Replace each named file in ``out`` by this run's (os.replace, atomic per file); drop the ones it lacks, so no
    file of an earlier run is left to be read as this run's."""
    for name in names:
        if (work / name).exists():
            os.replace(work / name, out / name)
        elif (out / name).exists():
            (out / name).unlink()
