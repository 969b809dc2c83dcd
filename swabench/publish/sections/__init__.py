"""The section registry: every published table declared once (title, caption, builder, thresholds,
the findings page's sentences), in page order.  ``swabench report``, ``swabench findings`` and
``swabench summary`` draw their sections from here; adding a table is one Section in one module."""

from __future__ import annotations

from swabench.publish.sections import (answers, compiles, correctness, kernels, machine, method, modes, neighbours,
                                       releases, repros, runs, serving, speed, trees)
from swabench.publish.sections.base import FINDINGS, REPORT, SUMMARY, Run, Section
from swabench.publish.sections.releases import older_releases

SECTIONS: list[Section] = [s for module in (answers, runs, correctness, repros, speed, machine, modes, compiles,
                                            kernels, serving, neighbours, trees, releases, method)
                           for s in module.SECTIONS]
assert len({s.key for s in SECTIONS}) == len(SECTIONS), "two sections share a key"


def by_key(key: str) -> Section:
    return next(s for s in SECTIONS if s.key == key)


def on(page: str) -> list[Section]:
    """The sections of one page (REPORT, FINDINGS or SUMMARY), in order."""
    return [s for s in SECTIONS if page in s.pages]


__all__ = ["FINDINGS", "REPORT", "SUMMARY", "Run", "Section", "SECTIONS", "by_key", "on", "older_releases"]
