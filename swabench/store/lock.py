"""One process writes a run folder at a time: the lock it holds while it does, taken over from a holder that died."""

from __future__ import annotations

import datetime
import fcntl
import os
import re
import socket
import stat
from pathlib import Path

from swabench.store.schema import LOCK
from swabench.store.tables import RunFolderError


HOLDER = re.compile(r"pid \d+ on \S+ since \S+\n?")  # what a holder writes in the lock file; empty once released


def _foreign(fd: int, path: Path) -> str | None:
    """Why the open file ``fd`` at ``path`` is not a lock swabench wrote (None when it is one, or new): only a
    regular file that is empty or names its holder is taken, truncated and written."""
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        return f"{path} is not a regular file"
    held = os.pread(fd, 4096, 0)
    if held and not HOLDER.fullmatch(held.decode(errors="replace")):
        return f"{path} exists and is not swabench's lock (it holds {held[:40]!r})"
    return None


class FolderLock:
    """An exclusive ``flock`` on the folder's lock file: released when the holder closes it or dies,
    so a crashed run never blocks the next; the file names the holder for whoever is refused."""

    def __init__(self, folder: Path):
        self.path = Path(folder) / LOCK
        self.fd: int | None = None
        self.took_over: str | None = None  # the previous holder, when it had died holding the folder

    def acquire(self) -> None:
        # never through a link, nor waiting on a FIFO or a device to open
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o666)
        foreign = _foreign(fd, self.path)
        if foreign:
            os.close(fd)
            raise RunFolderError(f"{foreign}: swabench keeps its lock there and would overwrite it; move the file, "
                                 f"or choose another --out")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip()
            os.close(fd)
            raise RunFolderError(f"{self.path.parent} is being written by another swabench process "
                                 f"({holder or 'holder unknown'}); wait for it or stop it, then --resume") from None
        # a holder that finished emptied the file; one that died holding the lock left its name
        self.took_over = os.pread(fd, 4096, 0).decode(errors="replace").strip() or None
        stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {stamp}\n".encode(), 0)
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None
