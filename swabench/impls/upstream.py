"""Library bugs on correct calls, declared in one place: each with its upstream issue, the paths it
hits and the condition where it shows.

A correct path that fails the gate where a declared bug's condition holds is recorded ``xfail`` with
that issue in the ``upstream`` column; where the condition holds and it passes, the row records the
issue too (the release at hand does not show it there), so a release matrix can say which release
has which bug.  A failure outside every declared condition is still a failure, and exits 1.

A known-bug *implementation* (registry kind ``known-bug``) is a wrong call a user or an engine makes;
an upstream bug is the library's own mistake on a call made right.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class UpstreamBug:
    ref: str  # "flashinfer#4972": the upstream issue (or pull request) that reports or fixes it
    url: str
    library: str
    summary: str
    impls: frozenset[str]  # the correct paths it can hit
    shows: Callable[..., bool]  # (case, backend) -> whether the condition holds on this point
    fixed_in: str | None = None  # the first release with the fix, where upstream has one


_DECLARED: list[UpstreamBug] = []


def declare(bug: UpstreamBug) -> UpstreamBug:
    assert bug.ref not in {b.ref for b in _DECLARED}, bug.ref
    _DECLARED.append(bug)
    return bug


def declared() -> list[UpstreamBug]:
    from swabench.impls import registry

    registry.all_implementations()  # the implementation modules declare their library's bugs on import
    return list(_DECLARED)


def hit(impl_name: str, case, backend: str) -> UpstreamBug | None:
    """The declared bug whose condition holds on this point of a correct path, or None."""
    return next((b for b in declared() if impl_name in b.impls and b.shows(case, backend)), None)


def get(ref: str) -> UpstreamBug | None:
    return next((b for b in declared() if b.ref == ref), None)
