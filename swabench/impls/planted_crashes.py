"""Paths planted to crash, so that a run can show what its supervisor does when a library kills its process, hangs
or poisons the GPU (``run.isolation``): each computes the right answer at ``plan()`` and crashes at its first
``run()``, inside the gate.  Opt-in (``registry.OPT_IN``): only a scenario that names one loads them, and no listing,
replay or price sees them.

- ``crash-abort``: ``os.abort()`` (SIGABRT, as a C++ library's failed check ends its process);
- ``crash-segfault``: a read of address 0 (SIGSEGV);
- ``crash-exit``: ``os._exit(0)``, a process that ends quietly without answering;
- ``crash-hang``: a sleep past every limit (killed at ``--point-timeout``);
- ``crash-illegal-address``: a kernel that stores far outside its buffer (CUDA's sticky "illegal memory access",
  which leaves the context unusable; a device-side assert where Triton is missing), on a GPU only.
"""

from __future__ import annotations

import ctypes
import os
import time

from .embedded import BOTH, GatherRunner
from .implementation import exact
from .registry import Implementation, register


class CrashRunner(GatherRunner):
    """The gather path, whose ``run()`` crashes the way its implementation says."""

    def __init__(self, workload, crash):
        super().__init__(workload, lambda case, prefix: exact(case.window_left, prefix, case.page_size or 1), True)
        self.crash = crash

    def run(self) -> None:
        self.crash(self.w)
        super().run()


def _abort(w) -> None:
    os.abort()


def _segfault(w) -> None:
    ctypes.string_at(0)


def _exit(w) -> None:
    os._exit(0)


def _hang(w) -> None:
    time.sleep(1e9)


def _illegal_address(w) -> None:
    import torch

    target = torch.zeros(16, device=w.device)
    try:
        from swabench.impls._illegal_store import store_far_away
    except ImportError:  # no Triton: an out-of-range index trips a device-side assert, as sticky
        target[torch.tensor([1 << 40], device=w.device)] = 1.0
    else:
        store_far_away(target)
    torch.cuda.synchronize(w.device)


def _register(name: str, summary: str, crash, needs_cuda: bool = False) -> None:
    register(Implementation(name, "torch", BOTH, summary, lambda w, backend: CrashRunner(w, crash), kind="planted",
                            needs_cuda=needs_cuda, tree=True, block=True, chunked=True, noncausal=True), __name__)


_register("crash-abort", "aborts its process at its first run (SIGABRT): the point is a crash, the sweep goes on",
          _abort)
_register("crash-segfault", "reads address 0 at its first run (SIGSEGV): the point is a crash, the sweep goes on",
          _segfault)
_register("crash-exit", "exits with status 0 at its first run, without an answer: the point is a crash", _exit)
_register("crash-hang", "sleeps at its first run until --point-timeout kills it: the point is a crash", _hang)
_register("crash-illegal-address", "a kernel that stores outside its buffer (an illegal memory access poisons the "
          "CUDA context): the point is a crash, the next runs in a fresh worker", _illegal_address, needs_cuda=True)
