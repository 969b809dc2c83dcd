"""How a command reads a file that a user named or that a run folder holds: only a regular file (a FIFO waits
for a writer that may never come, a device reads without end), at most as many bytes as its kind of file ever
holds, and its JSON or TOML parsed so that what Python cannot hold (an integer past its int-string limit, lists
nested thousands deep) is an error naming the file and line, never a traceback.  ``paths`` rules where commands
write; this module, what they read.

Every function takes ``error``: what to raise, given the reason (its callers' own error classes name the file
their way); by default a ReadError naming the file."""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import tomllib
from pathlib import Path
from typing import Callable

from swabench.errors import UserError
from swabench.store.paths import file_kind

MiB = 1 << 20
# The most bytes each kind of file may hold: far above what one holds in use, far below what fills memory.
SCENARIO = MiB  # the shipped scenarios are a few KiB: a sweep of lists expands to its points, it does not list them
LOG = 16 * MiB  # a reproducer's output: a few KiB
META = 64 * MiB  # meta.json: a few KiB, a merge's shards' own included
TRACE = 256 * MiB  # a trace of a million steps is about 100 MiB; FlashInfer's API logs, FlashInfer-Bench's files
TABLE = 4096 * MiB  # rows.jsonl and a run folder's tables: some 10 KiB a point with its timing samples

Error = Callable[[str], Exception]


class ReadError(UserError):
    pass


def _named(path) -> Error:
    return lambda reason: ReadError(f"{path}: {reason}")


def _size(limit: int) -> str:
    return f"{limit >> 30} GiB" if limit >= 1 << 30 else f"{limit >> 20} MiB" if limit >= MiB else f"{limit} bytes"


def regular(path, limit: int, error: Error | None = None) -> Path:
    """``path`` where it is a regular file (or a link to one) of at most ``limit`` bytes."""
    error = error or _named(path)
    try:
        st = os.stat(path)
    except OSError as e:
        raise error(f"cannot read it ({e.strerror or e})") from None
    if not stat.S_ISREG(st.st_mode):
        raise error(f"not a regular file but {file_kind(st.st_mode)}; swabench reads regular files only")
    if st.st_size > limit:
        raise error(too_large(limit))
    return Path(path)


def too_large(limit: int) -> str:
    return f"larger than {_size(limit)}, the most swabench reads of this kind of file"


def read_bytes(path, limit: int, error: Error | None = None) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them (a file that grew past it while read too).
    The read asks for the file's own size (and more, a MiB at a time, only where it grew): Python allocates what a
    read asks for up front, and a read of ``limit`` bytes would need gigabytes for a file of a few KiB, which a
    memory limit (``ulimit -v``) refuses."""
    error = error or _named(path)
    regular(path, limit, error)
    try:
        with open(path, "rb") as f:
            data = f.read(min(os.fstat(f.fileno()).st_size, limit) + 1)
            while len(data) <= limit and (more := f.read(min(MiB, limit + 1 - len(data)))):
                data += more
    except OSError as e:
        raise error(f"cannot read it ({e.strerror or e})") from None
    if len(data) > limit:
        raise error(too_large(limit))
    return data


def read_text(path, limit: int, error: Error | None = None, errors: str = "strict") -> str:
    """``read_bytes`` as UTF-8 text (a byte-order mark dropped); ``errors="replace"`` for a log, which may hold
    anything."""
    error = error or _named(path)
    data = read_bytes(path, limit, error)
    try:
        return data.decode("utf-8-sig", errors)
    except UnicodeDecodeError as e:
        raise error(f"not UTF-8 text ({e.reason} at byte {e.start})") from None


class _LongInteger(Exception):
    pass


def _int(digits: str) -> int:
    if len(digits.lstrip("-")) > sys.get_int_max_str_digits():
        raise _LongInteger(len(digits.lstrip("-")))
    return int(digits)


def long_integer(text, digits: int | None = None) -> str:
    """Why ``text`` cannot be read: an integer of ``digits`` digits, on the line of its first such number where
    ``text`` has several lines."""
    limit = sys.get_int_max_str_digits()
    where = ""
    if isinstance(text, str) and "\n" in text.strip():
        found = re.search(rf"\d{{{limit + 1},}}", text)
        if found:
            where = f"line {text.count(chr(10), 0, found.start()) + 1}: "
            digits = digits or len(found.group())
    return where + f"an integer of {digits or 'over ' + str(limit)} digits; a number here has at most {limit}"


NESTED = "nested too deeply (arrays or tables inside one another thousands of levels down)"


def json_value(text: str | bytes, error: Error, hook=None):
    """``text`` parsed as JSON (``hook``: json's object_pairs_hook); json.JSONDecodeError where it is no JSON,
    for the caller to judge (a journal's last line may be cut short), and ``error(reason)`` where it is JSON that
    Python cannot hold."""
    try:
        return json.loads(text, object_pairs_hook=hook, parse_int=_int)
    except _LongInteger as e:
        raise error(long_integer(text, e.args[0])) from None
    except RecursionError:
        raise error(NESTED) from None


def toml_document(text: str, error: Error) -> dict:
    """``text`` parsed as TOML; ``error(reason)`` where it is no TOML or holds what Python cannot hold."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise error(f"not valid TOML ({e})") from None
    except RecursionError:
        raise error(NESTED) from None
    except ValueError:  # tomllib converts integers itself, past the int-string limit too
        raise error(long_integer(text)) from None


def json_file(path, limit: int, error: Error | None = None, hook=None):
    """The JSON document in the regular file ``path``."""
    error = error or _named(path)
    text = read_text(path, limit, error)
    try:
        return json_value(text, error, hook)
    except json.JSONDecodeError as e:
        raise error(f"not valid JSON ({e})") from None
