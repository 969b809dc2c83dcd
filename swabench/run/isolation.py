"""Points run in a worker process the run supervises, so that a library that crashes, hangs or poisons the GPU
costs one point, never the run (pyperf's workers, pytest-xdist's "worker crashed, replacing it").

One persistent worker (``python -m swabench.run.worker``) measures whole cases: it builds a case's workload once,
says when each point starts, and sends each row back; the supervisor records the start (``started.jsonl``), then the
row in the journal.
A worker that dies (a signal, an abort, an exit), answers nothing within the point's limit, or finds its CUDA
context unusable after a point gives that point the status ``crash``, with the signal or error and the last lines
of its output, and the sweep goes on in a fresh worker.  The JIT warm-up and the node's peaks run in the worker
too: a build that kills its process is a named skip of the points that need it.

Nothing here prints: the worker's own output (the libraries', faulthandler's stack at a fatal signal; ``run.worker``)
goes to a log file whose tail a crash row quotes.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Iterator

from swabench.store.schema import KEY

IN_PROCESS = "SWABENCH_IN_PROCESS"  # set (to anything but "" or 0): points run in the command's own process by default
POINT_LIMIT_S = 900.0  # a point (its workload's build included) that answers nothing for this long is hung
BUILD_LIMIT_S = 1800.0  # a JIT warm-up build, likewise
START_LIMIT_S = 600.0  # a worker's imports (torch, the libraries' registry) before it answers at all
TAIL_LINES, TAIL_CHARS, FRAMES = 8, 1000, 4  # how much of a dead worker's output a crash row quotes
STOP_WAIT_S = 5.0  # how long a worker asked to stop may take before it is killed


def isolated_by_default() -> bool:
    """Whether a run supervises a worker unless told otherwise: yes, but where ``SWABENCH_IN_PROCESS`` is set (a
    debugger, or a test that patches the sweep in its own process)."""
    return os.environ.get(IN_PROCESS, "") in ("", "0")


@dataclass(frozen=True)
class Limits:
    point_s: float = POINT_LIMIT_S
    build_s: float = BUILD_LIMIT_S


class WorkerDied(Exception):
    """The worker ended (or was ended) with ``reason`` while doing what the supervisor asked."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Worker:
    """One worker process, started at once (its imports overlap the supervisor's own setup), its output in a log."""

    def __init__(self):
        self.log = tempfile.NamedTemporaryFile(prefix="swabench-worker-", suffix=".log", delete=False)
        ours, theirs = socket.socketpair()
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "swabench.run.worker", str(theirs.fileno())], pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT, env=env, close_fds=True)
        theirs.close()
        self.connection = Connection(ours.detach())
        self.ready = self.stopping = False

    def wait_ready(self) -> None:
        """Wait for the worker to say it is ready: its imports are setup, never a point's time or the sweep's."""
        if not self.ready:
            self.receive(START_LIMIT_S, "starting (its imports)")
            self.ready = True

    def send(self, message: tuple) -> None:
        """Send a request once the worker is ready."""
        self.wait_ready()
        try:
            self.connection.send(message)
        except OSError:
            raise WorkerDied(self.death()) from None

    def receive(self, limit_s: float, doing: str) -> tuple:
        """The worker's next message; WorkerDied when it ends first or says nothing for ``limit_s`` seconds."""
        try:
            if self.connection.poll(limit_s):
                return self.connection.recv()
        except (EOFError, OSError):
            raise WorkerDied(self.death()) from None
        self.kill()
        raise WorkerDied(f"hung: it answered nothing in {limit_s:.0f} s while {doing} (killed){self.tail()}")

    def death(self) -> str:
        """How the worker ended, with the last lines of its output: 'was killed by SIGSEGV ...'."""
        try:
            code = self.process.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            return f"closed its pipe and did not exit (killed){self.tail()}"
        return f"{exit_words(code)}{self.tail()}"

    def tail(self) -> str:
        """'; last output: ...': what the worker said last (at a fatal signal, faulthandler's line and the innermost
        frames of the Python stack), where it said anything."""
        try:
            with open(self.log.name, "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - 8 * TAIL_CHARS))
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        said = last_words(text)
        return f"; last output: {said}" if said else ""

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        """Ask the worker to stop, and go on: its exit (the interpreter's and CUDA's teardown) overlaps what follows."""
        if not self.stopping and self.process.poll() is None:
            self.stopping = True
            try:
                self.connection.send(("stop",))
            except OSError:
                pass

    def close(self) -> None:
        """Ask the worker to stop, kill it where it does not, and remove its log."""
        self.stop()
        try:
            self.process.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            pass
        self.kill()
        self.connection.close()
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)


def last_words(log: str) -> str:
    """The end of a worker's output, short: where faulthandler reported a fatal signal, its line and the innermost
    frames ('Fatal Python error: Aborted at planted_crashes.py:37 _abort < planted_crashes.py:32 run < ...'), else its
    last lines."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    fatal = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].startswith("Fatal Python error")), None)
    if fatal is None:
        return " | ".join(lines[-TAIL_LINES:])[-TAIL_CHARS:]
    frames = [re.sub(r'^File "(?:.*/)?([^"]+)", line (\d+) in (.*)$', r"\1:\2 \3", line)
              for line in lines[fatal + 1:] if line.startswith("File ")][:FRAMES]
    before = " | ".join(lines[max(0, fatal - 2):fatal])  # what the library said as it died (a C++ check's message)
    return ((before + " | " if before else "") + lines[fatal] + (" at " + " < ".join(frames) if frames else ""))[
        -TAIL_CHARS:]


def exit_words(code: int) -> str:
    """'was killed by SIGSEGV (signal 11)', 'exited with status 3', 'exited with status 0 without an answer'."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name} (signal {-code})"
    return f"exited with status {code}" + (" without an answer" if code == 0 else "")


class Supervisor:
    """Hands cases to a worker and replaces it when it dies; one worker lives at a time."""

    def __init__(self, options, limits: Limits = Limits()):
        self.options, self.limits = options, limits
        self.worker: Worker | None = Worker()
        self.replaced = 0  # workers that died (or were retired) and were replaced

    def _current(self) -> Worker:
        if self.worker is not None and self.worker.process.poll() is not None:  # died between two requests
            self._retire()
        if self.worker is None:
            self.worker, self.replaced = Worker(), self.replaced + 1
        return self.worker

    def _retire(self, now: bool = False) -> None:
        if self.worker is not None:
            if now:
                self.worker.kill()
            self.worker.close()
            self.worker = None

    def close(self, now: bool = False) -> None:
        """Stop the worker (``now``: kill it, as an interrupted run does, without waiting for its point)."""
        self._retire(now)

    def ready(self) -> None:
        """Wait for the worker's imports (before the sweep's clock starts); one that dies there is replaced later."""
        try:
            self._current().wait_ready()
        except WorkerDied:
            self._retire()

    def ask(self, message: tuple, limit_s: float, doing: str):
        """One request answered by one ("done", value) message: the node's peaks."""
        worker = self._current()
        try:
            worker.send(message)
            return worker.receive(limit_s, doing)[1]
        except WorkerDied:
            self._retire()
            raise

    def cases(self, todo: dict, store) -> Iterator[dict]:
        """Each case's points measured in the worker (``todo``: case -> points), every start and row recorded in
        ``store``; yields each row once it is recorded."""
        for case_index, (case, points) in enumerate(todo.items()):
            left, unstarted_deaths = list(points), 0
            while left:
                current = None
                try:
                    for message in self._case(case, left, case_index):
                        if message[0] == "started":
                            current = message[1]
                            store.start(current)
                        else:
                            store.append(message[1])
                            left = [p for p in left if p.key != tuple(message[1][k] for k in KEY)]
                            current = None
                            yield message[1]
                except WorkerDied as e:
                    self._retire()
                    if current is None and not unstarted_deaths:  # a worker that died between cases, or at the
                        unstarted_deaths += 1                     # case's workload: once more in a fresh one
                        continue
                    crashed = [current] if current is not None else left
                    where = "" if current is not None else " while building the case's workload (twice)"
                    for point in crashed:
                        row = crash_row(point, self.options.device, f"crash: the worker {e.reason}{where}")
                        store.append(row)
                        yield row
                    left = [p for p in left if p not in crashed]

    def _case(self, case, points, case_index: int) -> Iterator[tuple]:
        """("started", point) and ("row", row) for one case, from the worker's messages, until it is done or
        retires."""
        worker, current = self._current(), None
        worker.send(("case", case, points, self.options, case_index))
        while True:
            message = worker.receive(self.limits.point_s, f"running {describe(current or case)}")
            if message[0] == "started":
                current = next(p for p in points if p.key == message[1])
                yield "started", current
            elif message[0] == "retire":  # its GPU context is unusable: it can run nothing more
                self._retire()
                return
            elif message[0] == "case done":
                return
            else:
                yield message

    def warm_up(self, points, jobs: int, on_built=None):
        """``sweep.warm_up`` in the worker; a build that kills it (or hangs) is a failed signature, named.  Where
        several builds were in flight when it died, each is built again on its own, so the one named is the one
        that kills."""
        from swabench.run import sweep

        left, suspects, parts = dict(sweep.modules_needed(points, self.options.device)), set(), []
        while left:
            alone = next((label for label in left if label in suspects), None)
            batch = {alone: left[alone]} if alone else dict(left)
            building, errored = set(), set()
            try:
                worker = self._current()
                worker.send(("warm up", list(batch.values()), self.options.device, 1 if alone else jobs))
                while True:
                    message = worker.receive(self.limits.build_s,
                                             f"building {', '.join(sorted(building)) or 'JIT modules'}")
                    if message[0] == "building":
                        building.add(message[1])
                    elif message[0] == "built":
                        building.discard(message[1])
                        if message[3]:
                            errored.add(message[1])
                        if on_built:
                            on_built(*message[1:])
                    else:
                        break
                _, warm, unusable = message
                parts.append(warm)
                for label in set(batch) - (errored if unusable else set()):
                    left.pop(label)
                if unusable:  # one of the builds that raised left the GPU unusable: found as a killer is
                    building, batch = errored, {label: batch[label] for label in errored}
                    raise WorkerDied(f"left the GPU unusable ({unusable})")
            except WorkerDied as e:
                self._retire()
                guilty = building if len(building) == 1 else set(batch) if len(batch) == 1 else set()
                for label in guilty:
                    left.pop(label)
                    said = f"crash: the build {e.reason}" if e.reason.startswith("left the GPU") else \
                        f"crash: the build killed its process (the worker {e.reason})"
                    parts.append(sweep.WarmUp({label: 0.0}, [], 0.0, 1, None, {label: said}))
                    if on_built:
                        on_built(label, 0.0, said)
                suspects |= (building or set(batch)) - guilty
        return merged(parts, jobs)


def crash_row(point, device, reason: str) -> dict:
    """The row of a point whose worker died, hung or left the GPU unusable: its axes and counts, status crash."""
    from swabench.core import workloads
    from swabench.run import sweep

    return {**sweep.base_row(point, None, device, workloads.request_lengths(point.case)), "status": "crash",
            "reason": reason}


def merged(parts: list, jobs: int):
    """One ``WarmUp`` of the warm-ups the workers made between them."""
    from swabench.run import sweep

    caches = [p.cache_dir for p in parts if p.cache_dir]
    return sweep.WarmUp({k: v for p in parts for k, v in p.seconds.items()},
                        sorted({m for p in parts for m in p.built}), sum(p.wall_s for p in parts), jobs,
                        caches[0] if caches else None, {k: v for p in parts for k, v in p.failed.items()})


def describe(what) -> str:
    """'point CASE impl/backend' or 'case CASE'."""
    if hasattr(what, "impl"):
        return f"point {what.case.label} {what.impl}/{what.backend}"
    return f"case {what.label}"


def run(points, store, options, name: str = "", limits: Limits = Limits(), supervisor: Supervisor | None = None) \
        -> Iterator[dict]:
    """``sweep.run`` with every case measured in a supervised worker (``supervisor``: one already started, for the
    warm-up; asked to stop at the end, and killed where the sweep is cut short; its caller closes it)."""
    from swabench.run import sweep

    supervisor = supervisor or Supervisor(options, limits)
    supervisor.options = options
    ended = False
    try:
        yield from supervisor.cases(sweep.points_by_case(points), store)
        ended = True
    finally:
        if ended and supervisor.worker:  # its exit overlaps the tables being written; the caller closes it
            supervisor.worker.stop()
        else:
            supervisor.close(now=True)
