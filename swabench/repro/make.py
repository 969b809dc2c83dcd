"""What ``swabench repro`` does: find the point (a run's or a scenario's case, an implementation, a backend)
or the bug, trace its parts, render the script with its top comment, and check it makes the suite's
calls before it is written."""

from __future__ import annotations

import shlex
import textwrap
from pathlib import Path

from swabench.errors import UserError
from swabench.impls import registry, upstream
from swabench.inputs import scenarios
from swabench.repro import bugs, script, trace, verify
from swabench.store import schema

RUN_LINE = "Run it with python3 on a machine with torch{lib}{gpu}. It prints the versions and the GPU, the "


def command(source: str, case_id: str, impl: str, backend: str) -> str:
    """The ``swabench repro`` command for one point (what a failed point's line prints)."""
    return "swabench repro " + shlex.join([source, "--case", case_id, "--impl", impl, "--backend", backend])


def for_point(source: str, case_id: str, impl: str, backend: str | None) -> tuple[str, list[script.Part]]:
    """(script, parts) for one point of a run folder's or a scenario's cases."""
    if impl not in registry.names():
        raise UserError(f"--impl: unknown implementation {impl!r}; known: {', '.join(registry.names())}")
    folder = Path(source)
    path = folder / schema.SCENARIO if (folder / schema.SCENARIO).is_file() else scenarios.find(source)
    s = scenarios.load(path)
    cases = {p.case.case_id: p.case for p in s.points}
    matches = [c for i, c in cases.items() if i.startswith(case_id)] if case_id else []
    if len(matches) != 1:
        said = "matches none" if not matches else f"matches {len(matches)}"
        known = sorted(cases)
        more = f" and {len(known) - 8} more" if len(known) > 8 else ""
        raise UserError(f"--case: {case_id!r} {said} of {s.name}'s {len(known)} cases (give a case_id or a unique "
                        f"prefix); known: {', '.join(known[:8])}{more} (`swabench show {s.name} --cases` lists them)")
    case = matches[0]
    points = [p for p in s.points if p.case == case and p.impl == impl]
    backends = [p.backend for p in points]
    if not backends:
        raise UserError(f"--impl: {s.name} makes no point of {impl} on case {case.case_id}; it has "
                        f"{', '.join(sorted({p.impl for p in s.points if p.case == case}))}")
    backend = backend or ("fa2" if "fa2" in backends else backends[0])
    if backend not in backends:
        raise UserError(f"--backend: {impl} runs {case.case_id} on {', '.join(backends)} in {s.name}, not {backend!r}")
    obj = registry.get(impl)
    kind = {"known-bug": "a known bug", "planted": "a planted mistake"}.get(obj.kind, "a correct path")
    parts = [script.Part(case, impl, backend)]
    declared = upstream.hit(impl, case, backend)
    header = script.Header(f"{impl} on {case.label} ({backend}): {kind}", _lines(
        obj.summary + (f". {declared.summary}" if declared else ""), case.label,
        declared.url if declared else "", command(source, case.case_id, impl, backend), obj.library))
    return _checked(parts, header), parts


def for_bug(ref: str) -> tuple[str, list[script.Part]]:
    """(script, parts) for a declared upstream bug, a known-bug or planted implementation, or the decode cliff,
    on the smallest shipped case where it shows."""
    bug = bugs.get(ref)
    if bug is None:
        raise UserError(f"--bug: unknown bug {ref!r}; known: {', '.join(b.ref for b in bugs.catalogue())}")
    try:
        parts, where = bugs.parts(bug)
    except LookupError as e:  # the shipped scenarios hold no case that shows it (a scenario file was edited)
        raise UserError(f"--bug {ref}: {e}") from None
    fixed = f"; fixed in {bug.fixed_in}" if bug.fixed_in else ""
    title = bug.ref + (f" on {bug.impl}" if bug.impl != bug.ref else "") + (f" against {bug.twin}" if bug.twin else "")
    header = script.Header(title, _lines(
        bug.summary, where + fixed, bug.url, f"swabench repro --bug {ref}", registry.get(bug.impl).library,
        timed=bool(bug.twin)))
    return _checked(parts, header, bugs.CLIFF_THRESHOLD if bug.twin else None), parts


def _lines(wrong: str, where: str, url: str, made_by: str, library: str, timed: bool = False) -> list[str]:
    lib = ", flashinfer" if library == script.FLASHINFER else ""
    gpu = " and a CUDA GPU" if lib else " (a CUDA GPU where there is one)"
    verdict = ("errors of each path, both times and their ratio, and exits 1 when a path is wrong or the first "
               "takes more than THRESHOLD times its twin's time, else 0.") if timed else \
        "errors and the wrong (request, rows) ranges, and exits 1 when the output is wrong, 0 when it is right."
    lines = [f"What is wrong: {wrong}", f"Where it shows: {where}"] + ([f"Upstream: {url}"] if url else []) \
        + [f"Made by: {made_by}", RUN_LINE.format(lib=lib, gpu=gpu) + verdict]
    return [wrapped for line in lines for wrapped in textwrap.wrap(line, 110, subsequent_indent="    ")]


def _checked(parts: list[script.Part], header: script.Header, threshold: float | None = None) -> str:
    try:
        text = script.render(parts, header, threshold)
    except trace.Unrenderable as e:
        raise UserError(str(e)) from None
    verify.check(parts, text)
    return text
