"""Where a command may write, checked before any work on the path the system will open (``_real``), which is the
path the command then writes: a file goes only where nothing is or over a regular file (by rename, so never
through a link, a device or a FIFO), a folder only where nothing is or a folder is, and never inside what the
command reads."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

from swabench.errors import UserError

NAME_MAX = 255  # bytes in one name of a path (Linux, macOS)
PATH_MAX = 4096  # bytes in a whole path, its terminating NUL included (Linux)
UMASK = os.umask(0)  # the process's umask, read once (reading it sets it): what a file made private is opened to
os.umask(UMASK)


class OutputError(UserError):
    pass


def file_kind(mode: int) -> str:
    kinds = [(stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
             (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"), (stat.S_ISREG, "a regular file")]
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def _checked(value, what: str) -> Path:
    """``value`` as a path, unless it is ``-`` (stdout) or has a name too long to create."""
    text = os.fspath(value)
    if text == "-":
        raise OutputError(f"{what} -: writing to stdout is not supported; give a path")
    if not text:
        raise OutputError(f"{what}: the path is empty; give a path")
    if too_long(text):
        raise OutputError(f"{what}: {too_long(text)}")
    return _real(text, what)


def too_long(text: str) -> str | None:
    """Why no file system here holds the path ``text`` (a name in it over NAME_MAX bytes, or the whole over PATH_MAX),
    or None."""
    long = next((part for part in text.split(os.sep) if len(os.fsencode(part)) > NAME_MAX), None)
    if long is not None:
        return (f"the name {long[:40]}... is {len(os.fsencode(long))} bytes long; a name in a path may be at most "
                f"{NAME_MAX} bytes")
    if len(os.fsencode(text)) >= PATH_MAX:
        return f"the path is {len(os.fsencode(text))} bytes long; a path may be at most {PATH_MAX - 1} bytes"
    return None


def _real(text: str, what: str) -> Path:
    """``text`` as the system opens it: a ``..`` is taken only after a folder that exists (the system opens no
    ``nope/..``, and a check of such a path would see nothing where the write, once it has made ``nope``, lands on
    what is there), and everything up to the last ``..`` is resolved, links and all, so that every later check and
    write sees one path; the names after it are kept as typed."""
    parts = text.split(os.sep)
    if ".." not in parts:
        return Path(text)
    for i, part in enumerate(parts):
        before = os.sep.join(parts[:i]) or (os.sep if text.startswith(os.sep) else os.curdir)
        if part == ".." and not os.path.isdir(before):
            raise OutputError(f"{what} {text}: {before} is not a folder that exists, so the system cannot open "
                              f"{before}{os.sep}..; give the path without {before}{os.sep}..")
    last = len(parts) - 1 - parts[::-1].index("..")
    return Path(os.path.realpath(os.sep.join(parts[:last + 1]) or os.sep), *parts[last + 1:])


def _lstat(path: Path, what: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        reason = "the path is too long" if e.errno == errno.ENAMETOOLONG else e.strerror or str(e)
        raise OutputError(f"{what} {path}: {reason}") from None


def file_out(value, what: str = "--out") -> Path:
    """The path of a file to write: not ``-``, not ending in ``/``, and either absent or a regular file
    (never a link, which the rename would replace, nor a device, a FIFO or a folder)."""
    path = _checked(value, what)
    if os.fspath(value).endswith(os.sep):
        raise OutputError(f"{what} {os.fspath(value)}: ends with {os.sep}, so names a folder; give the path of the "
                          f"file to write")
    st = _lstat(path, what)
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise OutputError(f"{what} {path} is a symbolic link (to {os.readlink(path)}): swabench writes a file by "
                          f"renaming over it, which would replace the link; give the file itself or another path")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise OutputError(f"{what} {path} exists and is {file_kind(st.st_mode)}, not a regular file; give another path")
    return path


def folder_out(value, what: str = "--out") -> Path:
    """The path of a folder to write into: not ``-``, and either absent or a folder (a link to one is
    written through, never replaced)."""
    path = _checked(value, what)
    st = _lstat(path, what)
    if st is None:
        return path
    try:
        mode = os.stat(path).st_mode
    except OSError:
        raise OutputError(f"{what} {path} is a broken symbolic link (to {os.readlink(path)}); give another path") \
            from None
    if not stat.S_ISDIR(mode):
        raise OutputError(f"{what} {path} exists and is {file_kind(mode)}, not a folder; give a folder or a new path")
    return path


def makeable_folder(folder, what: str = "--out") -> Path:
    """``folder`` checked, not made: a folder, or one that its nearest existing ancestor can hold (probed with
    a folder made and removed there).  The writer makes it when it writes, so a command that fails first
    leaves nothing behind."""
    folder = Path(folder)
    above = next(p for p in (folder, *folder.parents) if _lstat(p, what) is not None or p == p.parent)
    if not above.is_dir():
        kind = file_kind(os.stat(above).st_mode) if above.exists() else "a broken symbolic link"
        raise OutputError(f"{what}: cannot write to {folder}: {above} is {kind}, not a folder; give another path")
    try:
        os.rmdir(tempfile.mkdtemp(dir=above, prefix=".write-test."))
    except OSError as e:
        raise OutputError(f"{what}: cannot write to {folder}: {e.strerror or e}") from None
    return folder


def refuse_inside(out, inputs, what: str = "--out") -> None:
    """OutputError when ``out`` is one of ``inputs`` or lies inside one: a command never writes over
    what it reads."""
    target = Path(out).resolve()
    for source in inputs:
        folder = Path(source).resolve()
        if target == folder or folder in target.parents:
            raise OutputError(f"{what} {out} is inside {source}, which this command reads; write outside it")
