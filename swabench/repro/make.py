"""What ``swabench repro`` does: find the point (a run's or a scenario's case, an implementation, a backend)
or the bug, trace its parts, render the script with its top comment, and check it makes the suite's
calls before it is written."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from swabench.core import gate, workloads
from swabench.errors import RunFailed, UserError
from swabench.impls import registry, upstream
from swabench.inputs import scenarios
from swabench.repro import brief, bugs, cliff, command, holistic, screen, script, trace, verify
from swabench.store import schema



def source_file(source: str) -> Path:
    """The scenario file a point's SOURCE names: a run folder's own copy, or a scenario (a file or a name)."""
    folder = Path(source)
    if folder.is_dir() and not os.path.lexists(folder / schema.SCENARIO):  # there but no file: load says what it is
        raise UserError(f"{source}: a folder without {schema.SCENARIO}, so not a run folder; give a run folder or a "
                        f"scenario")
    return folder / schema.SCENARIO if folder.is_dir() else scenarios.find(source)


def _run_rows(source: str):
    """The run folder's rows (case_id, impl, backend, status, reason), or None for a scenario."""
    if not (Path(source) / schema.SCENARIO).is_file():
        return None
    from swabench.store import run_folder

    table, _ = run_folder.load(source)
    return table[["case_id", "impl", "backend", "status", "reason"]]


def _quiet(stage: str) -> None:
    pass


def for_point(source: str, case_id: str, impl: str, backend: str | None, progress=_quiet) \
        -> tuple[str, list[script.Part]]:
    """(script, parts) for one point of a run folder's rows or a scenario's points; ``progress(stage)`` hears each
    stage begin (a full-size case takes a minute or two on the CPU)."""
    progress(f"reading {source}")
    if impl not in registry.names():
        raise UserError(f"--impl: unknown implementation {impl!r}; known: {', '.join(registry.names())}")
    s = scenarios.load(source_file(source))
    rows = _run_rows(source)
    where = f"run {source}" if rows is not None else s.name
    points = [p for p in s.points if rows is None or p.case.case_id in set(rows["case_id"])]
    cases = {p.case.case_id: p.case for p in points}
    if rows is not None and not cases:
        raise UserError(f"{source}: its {schema.SCENARIO} makes none of the cases its table holds: the folder's "
                        f"scenario and table disagree, so no point of it can be written as a script")
    matches = sorted(i for i in cases if i.startswith(case_id)) if case_id else []
    if len(matches) != 1:
        listed = matches or sorted(cases)
        said = f"matches {len(matches)}: " if matches else f"matches none of {where}'s {len(cases)} cases; known: "
        more = f" and {len(listed) - 8} more" if len(listed) > 8 else ""
        shown = case_id if len(case_id) <= 40 else f"{case_id[:40]}... ({len(case_id)} characters)"
        raise UserError(f"--case: {shown!r} {said}{', '.join(listed[:8])}{more} (give a case_id or a unique "
                        f"prefix; `swabench show {s.name} --cases` lists them)")
    case = cases[matches[0]]
    backends = [p.backend for p in points if p.case == case and p.impl == impl]
    if rows is not None:
        ran = rows[(rows["case_id"] == case.case_id) & (rows["impl"] == impl)]
        backends = [b for b in backends if b in set(ran["backend"])]
    if not backends:
        raise UserError(f"--impl: {where} has no point of {impl} on case {case.case_id}; it has "
                        f"{', '.join(sorted({p.impl for p in points if p.case == case}))}")
    backend = backend or ("fa2" if "fa2" in backends else backends[0])
    if backend not in backends:
        raise UserError(f"--backend: {where} runs {impl} on {case.case_id} on {', '.join(backends)}, not {backend!r}")
    obj = registry.get(impl)
    skipped = obj.skip_reason(case, backend, None)  # what the library cannot do, installed here or not
    if skipped:
        raise UserError(f"{impl} [{backend}] on {case.case_id}: the suite skips this point ({skipped}); nothing to "
                        f"reproduce")
    declared = upstream.speaks(impl, case, backend, obj.must_fail(case, *workloads.request_lengths(case), backend))
    said = ""
    if rows is not None:
        row = rows[(rows["case_id"] == case.case_id) & (rows["impl"] == impl) & (rows["backend"] == backend)].iloc[0]
        said = f"In {source}: {row['status']}" + (f" ({row['reason']})" if isinstance(row["reason"], str) and
                                                 row["reason"] else "")
    kind = {"known-bug": "a known bug", "planted": "a planted mistake"}.get(obj.kind, "a correct path")
    lines = [f"The path: {obj.summary}" + ("" if case.causal else " (planned with the case's causal=False)"),
             f"The case: {case.label}"]
    if obj.expected_to_fail or declared:
        lines.insert(0, "What is wrong: " + (declared.summary if declared else obj.summary))
    lines += [said] if said else []
    lines += [f"Upstream: {declared.url}"] if declared and declared.url else []
    header = script.Header(f"{impl} on {case.label} ({backend}): {kind}",
                           script.wrapped(lines + [f"Made by: {command(source, case.case_id, impl, backend)}",
                                             _run_line(obj.library, control=False)]))
    parts = [script.Part(case, impl, backend)]
    return _checked(parts, header, progress=progress), parts


def for_bug(ref: str, progress=_quiet, observed=()) -> tuple[str, list[script.Part]]:
    """(script, parts) for a declared upstream bug, a known-bug or planted implementation, or the decode cliff,
    on the smallest shipped case where it shows; ``observed``: what runs of the script printed (issue.Observed),
    for its top comment; ``progress(stage)`` hears each stage begin."""
    bug = bugs.get(ref)
    if bug is None:
        raise UserError(f"--bug: unknown bug {ref!r}; known: {', '.join(b.ref for b in bugs.catalogue())}")
    progress(f"finding the smallest shipped case where {ref} shows ({', '.join(bugs.SEARCHED)})")
    try:
        parts, where = bugs.parts(bug)
    except LookupError as e:  # the shipped scenarios hold no case that shows it (a scenario file was edited)
        raise UserError(f"--bug {ref}: {e}") from None
    template = TEMPLATES.get(bug.ref)
    one = _one_screen(bug, parts, progress) if template is None and not bug.twin else None
    if one:
        return one
    fixed = f"; fixed in {bug.fixed_in}" if bug.fixed_in else ""
    control = next((p for p in parts if p.role == "control"), None)
    lines = [f"What is wrong: {bug.summary}", f"Where it shows: {where}{fixed}"]
    rows = bugs.rows_off(next(p for p in parts if p.role in ("checked", "timed")))
    lines += [f"Rows, as the suite models the path: {rows}"] if rows else []
    lines += [f"Matters: {bug.filing.matters}"] if bug.filing.matters else []
    lines.append(f"Expected: {EXPECTED}")
    lines += observed_lines(observed) or ["Observed: not yet run"]
    lines += [f"Fault: {bug.filing.kind}: {bug.filing.fault}"] + ([f"Upstream: {bug.url}"] if bug.url else [])
    said = control.says if control else bug.filing.control_said
    lines.append(f"Control: {said}; its verdict is printed beside the bug's" if said else
                 "Control: none in one process" + ("; the same script on the release that fixed it is right"
                                                   if bug.fixed_in else ""))
    lines += [f"Made by: swabench repro --bug {ref}", _run_line(registry.get(bug.impl).library, control is not None)]
    lines = getattr(template, "header_lines", list)(lines)
    header = script.Header(bug.filing.title, script.wrapped(lines, getattr(template, "WIDTH", 110)))
    if template:
        progress("checking the script's calls against the suite's")
        try:
            template.check(parts, header)
        except verify.Drift as e:
            raise RunFailed(f"the script would not make the suite's calls ({e}); nothing written: please report it") \
                from None
        return template.render(parts[0].case, header), parts
    return _checked(parts, header, progress), parts


# bugs whose script is written from a template, not traced: holistic-offset's case is too large to build on the CPU,
# and #4972's is a comment on its upstream issue, which reads best on one screen
TEMPLATES = {holistic.REF: holistic, brief.REF: brief, cliff.REF: cliff}


def _one_screen(bug, parts: list[script.Part], progress) -> tuple[str, list[script.Part]] | None:
    """(script, parts) on one screen, on the case's first request alone where the bug shows there; None where one
    screen cannot write the parts (the traced script is written instead).  What runs of it printed goes in its
    issue body, not in the script."""
    one = next((one for one in (screen.one_request(parts, mode) for mode in screen.WRAPPER_MODES)
                if one and bugs.shows(bug, one)), None)
    if one is None:
        return None
    tol = gate.TOLERANCES[one[0].case.dtype]
    control = next((p for p in one if p.role == "control"), None)
    designed = bug.filing.kind == "FlashInfer docs gap"
    bounds = f"rel-L2 <= {tol.rel_l2:g}, <= {tol.row_rel_l2:g} per row; else exit 1"
    apart = screen.rows_apart(script.case_literals(one[0].case)) if designed else []
    expected = f"the call is the window from each query's row, as designed, which differs from the window by depth " \
        f"on rows {apart[0]}-{apart[-1]} ({len(apart)} of {one[0].case.qo_len}): {bounds}" if apart else \
        f"float32 softmax over the keys each query should see, in main(): {bounds}"
    lines = [f"Fault: {bug.filing.kind}: {bug.filing.fault}",
             f"Control: {control.says}" if control else "Control: none in one process", f"Expected: {expected}"]
    header = script.Header(bug.filing.title, script.wrapped(lines, screen.WIDTH))
    progress(f"tracing {', '.join(p.impl for p in one)} on one request, on the CPU against a stand-in FlashInfer")
    try:
        text = screen.render(one, header, designed)
    except trace.Unrenderable:
        return None
    progress("checking the script against the suite, call by call")
    try:
        verify.check(one, text, sequential=True)
    except verify.Drift as e:
        raise RunFailed(f"the script would not make the suite's calls ({e}); nothing written: please report it") \
            from None
    return text, one


def observed_lines(observed) -> list[str]:
    """'Observed on flashinfer 0.7.4 and 0.7.2.post1, NVIDIA H200 (132 SMs): ...': runs on one GPU that printed the
    same verdict said once."""
    from swabench.repro import issue

    lines = [f"Observed on {where}: {verdict}" for where, verdict, _ in issue.said_once(observed)]
    # a log's text inside the script's docstring: its backslashes and triple quotes escaped, so it reads as printed
    return [line.replace("\\", "\\\\").replace('"""', '\\"\\"\\"') for line in lines]


def measured_table(ref: str, runs) -> list[str]:
    """The table of bug ``ref``'s gated points in ``runs``, as its issue body quotes them (UserError naming a run
    that holds none)."""
    from swabench.repro import measured

    bug = bugs.get(ref)
    if bug is None:
        raise UserError(f"--bug: unknown bug {ref!r}; known: {', '.join(b.ref for b in bugs.catalogue())}")
    if not runs:
        return []
    if bug.twin:  # a performance request: the counts at the very case its script times
        case = bugs.parts(bug)[0][0].case
        return measured.table(measured.rows(runs, {impl: said for impl, _, said in cliff.CALLS}, case), one_case=True)
    return measured.table(measured.rows(runs, {bug.impl: "the call"}))


def issue_body(ref: str, text: str, name: str, observed, table=()) -> str:
    """The issue body for bug ``ref``'s script ``text`` (filed as ``name``): a comment on the upstream issue or pull
    request that reports it, where one does; ``table``: the suite's own rows it quotes (``measured_table``)."""
    from swabench.repro import fixes, issue

    bug = bugs.get(ref)
    header = text.split('"""')[1].splitlines()[2:]
    if bug.filing.matters and not any(line.startswith("Matters: ") for line in header):
        header.append(f"Matters: {bug.filing.matters}")
    comment_on = bug.filing.comment_on or (bug.ref if "/issues/" in bug.url else "")
    fix = fixes.lines(ref)  # the patch that fixes it and the gate's verdict, read from the published runs
    quoted = list(table) + ([""] if table and fix else []) + fix
    return issue.body(bug.filing.title, header, name, text, list(observed), bug.filing, comment_on, quoted)


EXPECTED = ("every row is float32 softmax attention over the keys its mask allows (reference() below), within "
            "swabench's gate: rel-L2 at most 0.01 overall and 0.05 in every row and head")


def _run_line(library: str, control: bool) -> str:
    needs = "torch, flashinfer and a CUDA GPU (kernels build on first use: minutes)" \
        if library == script.FLASHINFER else "torch (and a CUDA GPU where there is one)"
    return f"Run: python3 with {needs}. It prints REPRODUCED or NOT REPRODUCED" + \
        (", the control's verdict" if control else "") + ", the environment; exits 1 when reproduced."


def _checked(parts: list[script.Part], header: script.Header, progress=_quiet) -> str:
    progress(f"tracing {', '.join(p.impl for p in parts)} on the CPU against a stand-in FlashInfer "
             f"({parts[-1].case.label})")
    try:
        text = script.render(parts, header)
    except trace.Unrenderable as e:
        raise UserError(str(e)) from None
    progress("checking the script against the suite, call by call")
    try:
        verify.check(parts, text)
    except verify.Drift as e:
        raise RunFailed(f"the script would not make the suite's calls ({e}); nothing written: please report it") \
            from None
    return text
