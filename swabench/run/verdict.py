"""A gated point's status and the note its reason starts with, from what the gate saw and what the path was expected
to compute there (docs/gate.md): ``verdict``, and for an xpass, which of its two meanings happened (``xpass_note``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from swabench.core import gate
from swabench.errors import first_line

if TYPE_CHECKING:
    from swabench.core.workloads import Workload
    from swabench.impls.implementation import Implementation
    from swabench.impls.upstream import UpstreamBug

CAUGHT, NOT_CAUGHT = "known bug caught", "KNOWN BUG NOT CAUGHT"  # xpass_note says which of two things happened
EXACT_HERE, WRONG_HERE = "case does not exercise the bug", "failed where its known bug should not show"
NOTES = (CAUGHT, NOT_CAUGHT, EXACT_HERE, WRONG_HERE)  # what a known-bug row's reason starts with, before the gate's


def verdict(expected_to_fail: bool, must_fail: bool, passed: bool, bug: UpstreamBug | None = None) \
        -> tuple[str, str]:
    """(status, note) from what the gate saw and what was expected; ``bug``: the upstream bug declared on this
    point, which speaks where the path's own mistake (if it has one) does not show."""
    if expected_to_fail and must_fail:
        return ("xfail", CAUGHT) if not passed else ("xpass", NOT_CAUGHT)
    if bug:
        return ("pass", f"{bug.ref} declared here, not shown") if passed else \
            ("xfail", bug.describe())
    if not expected_to_fail:
        return ("pass", "") if passed else ("fail", "")
    return ("pass", EXACT_HERE) if passed else ("fail", WRONG_HERE)


def xpass_note(impl: Implementation, w: Workload, backend: str) -> str:
    """Which of the two things an xpass can mean happened here: the gate fails the output the path is predicted to
    compute and passed this one, so the library computes otherwise than its source did (it changed); or the gate
    passes the predicted output too, so it cannot see the mistake on this case (blind)."""
    said = NOT_CAUGHT
    if any(rows.any() for rows in impl.garbled_rows(w.case, w.qo_lens, w.kv_lens, backend)):
        return f"{said}: the library changed (predicted to write rows out of step, every row came out right)"
    from swabench.impls.embedded import as_predicted  # the sweep itself loads no implementation module

    try:
        caught = not gate.check(as_predicted(impl, w, backend), w).passed
    except Exception as e:  # the predicted output is a check on the verdict, not the verdict
        return f"{said}: the predicted output could not be computed to say why ({first_line(e)})"
    return f"{said}: the library changed (the gate fails the predicted output; this one passed)" if caught else \
        f"{said}: the gate is blind here (it passes the predicted output too)"
