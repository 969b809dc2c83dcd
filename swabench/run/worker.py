"""The worker a run's supervisor (``run.isolation``) starts: it measures what it is sent (whole cases, the JIT
warm-up, the node's peaks) and answers over its socket, one message a step, so that the supervisor knows which point
or build was in flight when it died.  Its output goes where the supervisor pointed it (a log whose tail a crash row
quotes); faulthandler writes the Python stack there at a fatal signal.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from multiprocessing.connection import Connection

import torch


def _serve(connection: Connection) -> None:
    """Answer the supervisor until it says stop or goes away."""
    from swabench.run import sweep
    from swabench.store.run_folder import _json_default

    connection.send(("ready",))
    while True:
        try:
            message = connection.recv()
        except (EOFError, OSError):
            return
        if message[0] == "stop":
            return
        if message[0] == "case":
            _, case, points, options, case_index = message
            for row in sweep.case_rows(case, points, options, case_index,
                                       on_start=lambda p: connection.send(("started", p.key))):
                unusable = unusable_gpu(options.device)
                if unusable:
                    row = {**row, "status": "crash",
                           "reason": f"crash: the GPU context is unusable after this point ({unusable})"
                                     + (f"; the point said: {first_of(row['reason'])}" if row.get("reason") else "")}
                connection.send(("row", json.loads(json.dumps(row, default=_json_default))))
                if unusable:
                    connection.send(("retire",))
                    return
            connection.send(("case done",))
        elif message[0] == "warm up":
            _, points, device, jobs = message
            warm = sweep.warm_up(points, device, jobs,
                                 on_built=lambda label, s, error: connection.send(("built", label, s, error)),
                                 on_start=lambda label: connection.send(("building", label)))
            unusable = unusable_gpu(device)
            connection.send(("done", warm, unusable))
            if unusable:
                return
        elif message[0] == "peaks":
            from swabench.measure import peaks

            connection.send(("done", peaks.measure(message[1])))


def unusable_gpu(device: torch.device) -> str | None:
    """Why the process's CUDA context can no longer run anything (an illegal address or a device-side assert poisons
    it for good), or None: a synchronize and a one-element kernel, after every point."""
    if device.type != "cuda":
        return None
    try:
        torch.cuda.synchronize(device)
        torch.ones(1, device=device).add_(1).item()
    except Exception as e:  # what the context answers is the verdict: any error here means it is gone
        from swabench.errors import first_line

        return first_line(e)
    return None


def first_of(text: str) -> str:
    return str(text).strip().splitlines()[0] if str(text).strip() else ""


def _main(fd: int) -> None:
    import faulthandler

    for name in ("SIGINT", "SIGTERM", "SIGHUP"):  # sent to the process group (Ctrl-C, a scheduler, a closed terminal):
        signal.signal(getattr(signal, name), signal.SIG_IGN)  # the supervisor answers them, and stops the worker
    faulthandler.enable(all_threads=True)  # a fatal signal leaves the Python stack in the log
    _die_with_parent()
    connection = Connection(fd)
    try:
        _serve(connection)
    finally:
        connection.close()


def _die_with_parent() -> None:
    """Linux's parent-death signal: a supervisor killed outright (kill -9) takes its worker with it."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            return
    if os.getppid() == 1:  # the supervisor was already gone
        os._exit(1)


if __name__ == "__main__":
    _main(int(sys.argv[1]))
