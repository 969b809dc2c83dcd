"""The section registry: every published table declared once (title, caption, builder, thresholds,
the findings page's sentences), in page order.  ``swabench report``, ``swabench findings`` and
``swabench summary`` draw their sections from here; adding a table is one Section in one module.

The findings page holds the decision table, the answers, a link per topic and the runs (INDEX); every other module
is a topic (its ``TOPIC`` is the title) with a page of its own under findings/, which the answers link."""

from __future__ import annotations

from types import ModuleType

from swabench.publish.sections import (answers, backends, compiles, correctness, decisions, kernels, machine, method,
                                       modes, neighbours, releases, repros, runs, serving, shelf, speed, trees)
from swabench.publish.sections.base import FINDINGS, REPORT, SUMMARY, Run, Section, topic_name
from swabench.publish.sections.releases import older_releases

INDEX = (decisions, answers, runs)
TOPICS = (correctness, repros, speed, machine, modes, compiles, kernels, serving, shelf, backends, neighbours, trees,
          releases, method)
SECTIONS: list[Section] = [s for module in INDEX + TOPICS for s in module.SECTIONS]
assert len({s.key for s in SECTIONS}) == len(SECTIONS), "two sections share a key"


def by_key(key: str) -> Section:
    return next(s for s in SECTIONS if s.key == key)


def on(page: str, modules: tuple[ModuleType, ...] = INDEX + TOPICS) -> list[Section]:
    """The sections of one page (REPORT, FINDINGS or SUMMARY) that ``modules`` declare, in order."""
    return [s for module in modules for s in module.SECTIONS if page in s.pages]


__all__ = ["FINDINGS", "REPORT", "SUMMARY", "Run", "Section", "SECTIONS", "INDEX", "TOPICS", "by_key", "on",
           "older_releases", "topic_name"]
