"""What tropt puts in front of a person or on a user's disk, made safe: one definition each.

- :func:`terminal_text` / :func:`terminal_line`: text printed to a terminal, with control characters (escape
  sequences, BEL, carriage returns, bidi overrides, lone surrogates) shown as ``\\x1b``-style escapes, so a value
  from the user's data can neither drive the terminal nor fail to encode.
- :func:`md_text` / :func:`md_id` / :func:`md_lines`: text as inert Markdown (reports, TensorBoard).
- :func:`shorten` / :func:`cap_text` / :func:`shown_frame`: a value shown to a person is capped (an ellipsis and its
  length); the full value stays in the evidence tables and the JSON.
- :func:`write_text_atomic` / :func:`write_json`: a user's output file is written to a temporary file beside it and
  renamed into place, so a failed write leaves the earlier file intact; the error names the path.

A top-level core module: it imports nothing of tropt but its errors.
"""

from __future__ import annotations

import contextlib
import errno
import html
import json
import os
import re
import secrets
from collections.abc import Mapping
from typing import Any

from .errors import TroptError

# ---------------------------------------------------------------------------------------------------- terminal
# C0 controls but tab and newline, DEL and the C1 controls, lone surrogates, the bidi embeddings/overrides/isolates
# and marks, and the Unicode line/paragraph separators.
_UNSAFE_CHARS = "\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_UNSAFE_TEXT = re.compile(f"[{_UNSAFE_CHARS}]")
_UNSAFE_LINE = re.compile(f"[\n{_UNSAFE_CHARS}]")

_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match) -> str:
    char = match.group()
    if char in _SHORT:
        return _SHORT[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_text(text: Any) -> str:
    """``text`` safe to print: every control character but newline and tab written as its escape (``\\x1b``)."""
    return _UNSAFE_TEXT.sub(_escape, str(text))


def terminal_line(text: Any) -> str:
    """``text`` safe to print as one line: :func:`terminal_text`, newlines escaped too (a value cannot forge a
    line of its own)."""
    return _UNSAFE_LINE.sub(_escape, str(text))


# ---------------------------------------------------------------------------------------------------- size caps
MAX_VALUE_CHARS = 300  # a value (a run of non-space characters) longer than this is shortened where it is shown
SHOWN_VALUE_CHARS = 200  # how much of a shortened value is shown
MAX_TEXT_CHARS = 2000  # a summary or advice sentence longer than this is shortened
SHOWN_TEXT_CHARS = 1500


def shorten(value: Any, limit: int = MAX_VALUE_CHARS, shown: int = SHOWN_VALUE_CHARS) -> str:
    """``str(value)``, or its first ``shown`` characters, an ellipsis and its length when longer than ``limit``."""
    text = str(value)
    if len(text) <= limit:
        return text
    return f"{text[:shown]}… ({len(text):,} chars)"


_LONG_VALUE = re.compile(rf"\S{{{MAX_VALUE_CHARS + 1},}}")
_WRAPPED = re.compile(r"([\"'(\[{]*)(.*?)([\"')\]}]*)([,;:.!?]*)", re.S)  # quotes, the value, quotes, punctuation


def _shorten_word(match: re.Match) -> str:
    """A long run of non-space characters as ``'first 200 chars…' (N chars),``: the length is the value's own,
    outside its quotes and the punctuation after it."""
    word = match.group()
    opening, value, closing, punct = _WRAPPED.fullmatch(word).groups()  # type: ignore[union-attr]  # always matches
    if len(value) <= MAX_VALUE_CHARS:
        return shorten(word)
    return f"{opening}{value[:SHOWN_VALUE_CHARS]}…{closing} ({len(value):,} chars){punct}"


def cap_text(text: str) -> str:
    """A sentence a person reads (a summary, an advice), each long value in it shortened (``'ZZZ…' (1,000,000
    chars)``) and the whole capped at :data:`MAX_TEXT_CHARS`. Idempotent: capping capped text changes nothing."""
    if len(text) <= MAX_VALUE_CHARS:
        return text
    text = _LONG_VALUE.sub(_shorten_word, text)
    return shorten(text, MAX_TEXT_CHARS, SHOWN_TEXT_CHARS)


def _shown(value: Any) -> Any:
    return shorten(value) if isinstance(value, str) else value


def shown_frame(df: Any) -> Any:
    """The rows of an evidence table as shown: long strings (cells, index, column names) shortened (:func:`shorten`);
    a new frame, its text columns of dtype object (so any string, a lone surrogate too, stays as it is)."""
    import pandas as pd

    out = df.copy()
    for i in range(out.shape[1]):
        col = out.iloc[:, i]
        if col.dtype == object or pd.api.types.is_string_dtype(col.dtype):
            out.isetitem(i, pd.Series([_shown(v) for v in col], index=out.index, dtype=object))
    index = out.index
    if not isinstance(index, pd.MultiIndex) and (index.dtype == object or pd.api.types.is_string_dtype(index.dtype)):
        out.index = pd.Index([_shown(v) for v in index], dtype=object, name=_shown(index.name))
    if not isinstance(out.columns, pd.MultiIndex):
        out.columns = pd.Index([_shown(c) for c in out.columns], dtype=object)
    return out


# ---------------------------------------------------------------------------------------------------- markdown
# Markdown syntax that could turn text into links, images, code or emphasis; backslash-escaped (renders invisibly).
_MD_SPECIAL = str.maketrans({c: "\\" + c for c in "\\`*_[]"})
_PLAIN_ID = re.compile(r"[a-z0-9_.]+")
_BLOCK_START = re.compile(r"([#>+=|-])|(\d+)([.)])")


def md_text(value: Any) -> str:
    """User text as inert Markdown: HTML escaped (``<script>`` shows as text), Markdown syntax backslash-escaped,
    and line breaks folded so the text cannot start a new block (a heading, a raw HTML block)."""
    text = html.escape(str(value), quote=False).translate(_MD_SPECIAL)  # quotes matter only inside tags
    return " ".join(text.splitlines())


def md_id(check: str) -> str:
    """A check id as inline code when it is a plain id (it may come from an untrusted findings.json)."""
    return f"`{check}`" if _PLAIN_ID.fullmatch(check) else md_text(check)


def md_lines(text: str) -> str:
    """Plain text as inert Markdown that keeps its lines: each line :func:`md_text`, stripped, and kept from starting
    a block (a heading, a quote, a list), joined by hard line breaks."""
    out = []
    for line in str(text).splitlines():
        escaped = md_text(line.strip())
        match = _BLOCK_START.match(escaped)
        if match and match.group(1):
            escaped = "\\" + escaped
        elif match:
            escaped = f"{match.group(2)}\\{escaped[match.end(2):]}"
        out.append(escaped)
    return "  \n".join(out)


# ---------------------------------------------------------------------------------------------------- files
_WRITE_FIX = {
    errno.ENOSPC: "free space on that disk, or choose another location",
    errno.EFBIG: "free space (the file size limit was reached), or choose another location",
    errno.EDQUOT: "free space in your disk quota, or choose another location",
    errno.EACCES: "choose a writable location, or fix its permissions",
    errno.EPERM: "choose a writable location, or fix its permissions",
    errno.EROFS: "choose a location on a writable file system",
    errno.EISDIR: "give a file name, not a directory",
}


def write_text_atomic(path: Any, text: str, *, encoding: str = "utf-8") -> str:
    """Write ``text`` to ``path`` (its directory created) through a temporary file in the same directory and
    ``os.replace``: readers see the old file or the new one, never a part. On failure (a full disk, a read-only
    directory) the earlier file is intact, the temporary file removed, and a :class:`TroptError` names the path.

    Characters the encoding cannot hold (a lone surrogate from a non-UTF-8 file name) are written as backslash
    escapes. A symlink is written through (its target is replaced); an existing file keeps its permissions.
    Returns ``text``.
    """
    target = os.path.realpath(os.fspath(path))
    parent = os.path.dirname(target)
    tmp = None
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = os.path.join(parent, f".{os.path.basename(target)}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as for open(..., "w")
        with open(fd, "w", encoding=encoding, errors="backslashreplace") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        if os.path.exists(target):
            os.chmod(tmp, os.stat(target).st_mode & 0o7777)
        os.replace(tmp, target)
        tmp = None
    except OSError as exc:
        raise TroptError(f"cannot write {os.fspath(path)}: {exc.strerror or exc}",
                         f"{_WRITE_FIX.get(exc.errno or 0, 'choose another location')}; the earlier file there, if "
                         "any, is unchanged") from exc
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return text


def write_json(data: Any, path: Any = None, *, indent: int = 2, allow_nan: bool = False) -> str:
    """``data`` as JSON text, also written to ``path`` (atomically, its directory created) when given: one writer for
    every object tropt saves (reports, comparisons, plans). The text is ASCII (``\\u`` escapes), so any string,
    a lone surrogate too, is written."""
    text = json.dumps(data, indent=indent, allow_nan=allow_nan)
    if path is not None:
        write_text_atomic(path, text)
    return text


def read_json(text_or_path: str) -> Any:
    """The JSON in ``text_or_path``: the text itself when it is an object literal, else the file it names."""
    text = text_or_path
    if not text_or_path.lstrip().startswith("{"):
        with open(text_or_path, encoding="utf-8") as fh:
            text = fh.read()
    return json.loads(text)


def cost_line(identity: Mapping[str, Any]) -> str | None:
    """A report's footer: what the diagnosis cost in steps of the user's own step (``tropt.core.step_cost``)."""
    steps, step_s = identity.get("cost_steps"), identity.get("step_seconds")
    if not isinstance(steps, (int, float)) or not isinstance(step_s, (int, float)) or step_s <= 0:
        return None
    return (f"This diagnosis cost {steps:,.0f} step-equivalents of your step (one step: {1e3 * step_s:.3g} ms, "
            "timed on tropt's copy before the checks; each check's share is its cost_steps metric).")
