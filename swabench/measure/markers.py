"""NVTX ranges: one ``swabench`` domain, nested run > case > implementation > phase (plan, check,
capture, replay, eager), so an Nsight Systems timeline reads like the results table.  The
implementation range is named ``<impl> [<backend>] #<case_id>``, which is how ``profiling`` ties the
kernels seen inside a replay range back to a row.  A start/end range (``start_range``) marks the one
call Nsight Compute counts (``counters``).  Without the nvtx package the ranges are no-ops."""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

try:
    import nvtx as _nvtx
except ImportError:  # pragma: no cover - nvtx is a dependency, but keep the suite importable without it
    _nvtx = None

DOMAIN = "swabench"


def point_range_name(impl: str, backend: str, case_id: str) -> str:
    return f"{impl} [{backend}] #{case_id}"


def parse_point(range_name: str) -> tuple[str, str, str]:
    """'<impl> [<backend>] #<case_id>' -> (case_id, impl, backend)."""
    head, _, case_id = range_name.rpartition(" #")
    impl, _, backend = head.partition(" [")
    return case_id, impl, backend.rstrip("]")


@contextmanager
def nvtx_range(message: str, payload: int | float | None = None):
    """An NVTX range (and a torch.profiler range while a torch profiler is recording)."""
    import torch

    torch_range = torch.profiler.record_function(message) if torch.autograd.profiler._is_profiler_enabled \
        else nullcontext()
    with torch_range:
        if _nvtx is None:
            yield
            return
        _nvtx.push_range(message=message, domain=DOMAIN, payload=payload)
        try:
            yield
        finally:
            _nvtx.pop_range(domain=DOMAIN)


def start_range(message: str):
    """A start/end range in the swabench domain (not nested: Nsight Compute selects kernels by its name
    alone); hand what it returns to ``end_range``."""
    return None if _nvtx is None else _nvtx.start_range(message=message, domain=DOMAIN)


def end_range(handle) -> None:
    if _nvtx is not None:
        _nvtx.end_range(handle)
