"""The command line's standard streams, which may fail under any command: closed (``swabench list >&-``), full
(``> /dev/full``), read-only (``1</dev/null``) or a pipe whose reader has gone (``| head -1``).  One rule for them
all: a write that fails ends that stream's output, never the command.  The work goes on, its folder is finished as
if nothing had been printed, and the exit status says the output was lost (1, unless the command's own status is
already an error); a reader that closed the pipe is no error, since it asked for no more."""

from __future__ import annotations

import os
import sys

LOST_STATUS = 1


class Guarded:
    """A standard stream that goes quiet at its first failed write or flush: what is left of the output is dropped,
    and ``lost`` keeps why (None while it works, or when the reader closed the pipe)."""

    def __init__(self, stream, name: str):
        self._stream, self.stream_name = stream, name
        self.gone, self.lost = False, None

    def write(self, text):
        if not self.gone:
            try:
                return self._stream.write(text)
            except (OSError, ValueError) as e:  # ValueError: a stream someone closed
                self._drop(e)
        return len(text)

    def flush(self):
        if not self.gone:
            try:
                self._stream.flush()
            except (OSError, ValueError) as e:
                self._drop(e)

    def _drop(self, error: Exception) -> None:
        """From now on nothing reaches the stream; its descriptor points at /dev/null, so that the interpreter's last
        flush of the stream it wraps finds somewhere to write."""
        self.gone = True
        if not isinstance(error, BrokenPipeError):
            self.lost = getattr(error, "strerror", None) or str(error)
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):  # a stream with no descriptor of its own
            pass

    def __getattr__(self, name):
        return getattr(self._stream, name)


def guard() -> None:
    """Wrap stdout and stderr in ``Guarded`` (once).  A standard descriptor that is closed gets /dev/null opened
    read-only in its place: no file the command opens later takes its number (and with it the output meant for the
    terminal), and a write to it fails as any unwritable stream's does."""
    if isinstance(sys.stdout, Guarded):
        return
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDONLY)  # the lowest free descriptor: this one
    for fd, name in ((1, "stdout"), (2, "stderr")):
        if getattr(sys, name) is None:  # the interpreter found it closed
            setattr(sys, name, open(fd, "w", closefd=False))
    sys.stdout, sys.stderr = Guarded(sys.stdout, "stdout"), Guarded(sys.stderr, "stderr")


def exit_status(status):
    """The command's exit status once both streams are flushed: ``LOST_STATUS`` where its output could not be
    written and it would otherwise have succeeded, said on stderr while stderr still works."""
    streams = [s for s in (sys.stdout, sys.stderr) if isinstance(s, Guarded)]
    for stream in streams:
        stream.flush()
    lost = [s for s in streams if s.lost]
    for stream in lost:
        sys.stderr.write(f"swabench: could not write to {stream.stream_name} ({stream.lost}): its output is lost\n")
    sys.stderr.flush()
    return LOST_STATUS if lost and status in (0, None) else status
