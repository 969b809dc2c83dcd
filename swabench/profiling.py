"""NVTX ranges in one ``swabench`` domain, nested run > case > implementation > phase, so an Nsight
Systems timeline reads like the results table.  Without the nvtx package they are no-ops."""

from __future__ import annotations

from contextlib import contextmanager

try:
    import nvtx as _nvtx
except ImportError:  # pragma: no cover - nvtx is a dependency, but keep the suite importable without it
    _nvtx = None

DOMAIN = "swabench"


@contextmanager
def nvtx_range(message: str, payload: int | float | None = None):
    if _nvtx is None:
        yield
        return
    _nvtx.push_range(message=message, domain=DOMAIN, payload=payload)
    try:
        yield
    finally:
        _nvtx.pop_range(domain=DOMAIN)
