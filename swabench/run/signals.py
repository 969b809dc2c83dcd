"""The signals that end a run: each one the process would die of is taken over while a run folder is open, and
ends the run the way Ctrl-C does (``Interrupted``, a KeyboardInterrupt), so the finished rows are kept, the folder
says ``interrupted`` and the same command resumes it.  Nothing here prints or exits."""

from __future__ import annotations

import contextlib
import signal
import threading

# The signals whose default action ends the process and that a sender means as "stop": a scheduler's SIGTERM, a closed
# terminal's SIGHUP, SIGQUIT, the user signals, timers, CPU limits, power failure (not the faults a bad memory access
# raises, after which nothing more can be written)
ENDING = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGVTALRM", "SIGPROF", "SIGXCPU",
          "SIGIO", "SIGPWR", "SIGSTKFLT", "SIGPIPE", "SIGXFSZ")


class Interrupted(KeyboardInterrupt):
    """A signal that ends a run, raised where the run was, so it ends like Ctrl-C: rows kept, resumable."""

    def __init__(self, name: str):
        super().__init__(name)
        self.signal = name


_ACTIVE: list = []  # the Signals of the run open in this process, innermost last


def raise_if_received(cause: BaseException) -> None:
    """``Interrupted`` where an ending signal came while ``cause`` was raised: a library that catches the
    KeyboardInterrupt and raises its own error (Inductor compiling a FlexAttention kernel) must not turn Ctrl-C into
    a failed point."""
    if _ACTIVE and _ACTIVE[-1].received:
        raise Interrupted(_ACTIVE[-1].received) from cause


class Signals:
    """The ending signals this process would die of, taken over while a run is open: the first raises
    ``Interrupted`` where the run is; one that comes while a folder is made or written down (``hold``) is only
    noted, so nothing leaves meta.json "running" with a dead pid, and none after the first raises."""

    def __init__(self):
        self.received: str | None = None
        self.holding = False
        self.raised = False

    def handle(self, signum, frame):
        self.received = self.received or name_of(signum)
        self._interrupt()

    def _interrupt(self):
        if self.received and not self.holding and not self.raised:
            self.raised = True
            raise Interrupted(self.received)

    def hold(self) -> None:
        """From now on a signal is only noted (while a folder is made, or written down)."""
        self.holding = True

    def release(self) -> None:
        """A signal noted while held is raised now; later ones as they come."""
        self.holding = False
        self._interrupt()


def name_of(number: int) -> str:
    """'SIGHUP', or 'SIGRTMIN+3' for a real-time signal the enum does not name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"SIGRTMIN+{number - signal.SIGRTMIN}"


def ending_signals() -> list[signal.Signals]:
    """The ending signals that would end this process now: those left at the default action (SIGPIPE and SIGXFSZ
    only where Python's ignoring them was undone), and SIGINT where it raises KeyboardInterrupt; a handler someone
    else installed (a profiler's) is left alone."""
    taken = []
    for name in ENDING:
        number = getattr(signal, name, None)
        if number is not None and signal.getsignal(number) in (signal.SIG_DFL, signal.default_int_handler):
            taken.append(number)
    if hasattr(signal, "SIGRTMIN"):  # the real-time signals end a process too
        taken += [n for n in range(signal.SIGRTMIN, signal.SIGRTMAX + 1) if signal.getsignal(n) == signal.SIG_DFL]
    return taken


@contextlib.contextmanager
def interrupt_on_signals():
    """Every signal that would end the process ends what runs inside like Ctrl-C; yields the ``Signals`` (which
    never raise off the main thread, where no handler can be set)."""
    signals = Signals()
    main = threading.current_thread() is threading.main_thread()
    previous = {number: signal.signal(number, signals.handle) for number in ending_signals()} if main else {}
    _ACTIVE.append(signals)
    try:
        yield signals
    finally:
        _ACTIVE.remove(signals)
        for number, handler in previous.items():
            signal.signal(number, handler)
