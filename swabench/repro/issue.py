"""What a reproducer printed, read back (``Observed``), and the issue body a maintainer files with it: the title,
what happens on each release run, what was expected, the control, the script, its output and the environment it
printed.  For a bug already reported upstream the body is a comment on that issue."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from swabench.errors import UserError
from swabench.store import reading

VERDICTS = ("REPRODUCED", "NOT REPRODUCED")
# the scripts' own environment lines, or FlashInfer's collect_env report ("GPU 0 (CUDA order)   : NVIDIA H200 | SM90 |
# 132 SMs | 139.8 GiB", "flashinfer                   : 0.7.4")
GPU_LINE = re.compile(r"^(?:(?P<name>.+): compute capability [\d.]+, |GPU 0 \(CUDA order\)\s*: (?P<listed>[^|]+?) \| "
                      r"SM\w+ \| )(?P<sms>\d+) SMs")
PACKAGE_LINE = re.compile(r"^(?:flashinfer[-_]python |flashinfer\s+: )(?P<version>\S+)$", re.IGNORECASE)
TORCH_LINE = re.compile(r"^python \S+, torch \S+")  # the scripts' first environment line
# FlashInfer's log of a module it builds on first use ("2026-12-05 04:08:06,000 - INFO - core.py:635 -
# flashinfer.jit: Building JIT module ..."): what the node did, not what the call does
BUILD_LINE = re.compile(r"^\S+ \S+ - INFO - \S+ - flashinfer\.jit: ")
WHOLE_LINES, WHOLE_CHARS = 200, 16_000  # a log within both is quoted whole (a script's output is 120 lines, 8 KB)
REPORT_LINES = 30  # of a longer log: at most this many verdict, detail and CONTROL lines
DETAIL_LINES = 4  # the lines a script prints under its verdict (the worst row)
ENVIRONMENT_LINES = 10  # and at most this many environment lines
LINE_CHARS = 400  # a quoted line is cut here


@dataclass(frozen=True)
class Observed:
    where: str  # "flashinfer 0.7.4, NVIDIA H200 (132 SMs)"
    verdict: str  # the script's first verdict line
    control: str  # its CONTROL line, or ""
    text: str  # everything it printed


def script_code(script: str) -> str:
    """A script without its top comment, which carries what runs of it printed."""
    return script.split('"""', 2)[2]


def script_digest(script: str) -> str:
    """What identifies a script's code across the Observed lines written into it: a run records it, so a page can
    tell a run of the script committed now from a run of an older form."""
    return hashlib.sha256(script_code(script).encode()).hexdigest()[:16]


def read(log) -> Observed:
    """A reproducer's output, as its run saved it (stdout, maybe stderr after it); UserError naming the file when it
    holds no verdict line."""
    text = reading.read_text(log, reading.LOG, lambda reason: UserError(f"--observed {log}: {reason}"), "replace")
    lines = text.splitlines()
    verdict = next((line for line in lines if line.startswith(VERDICTS)), None)
    if verdict is None:
        raise UserError(f"--observed {log}: no line starts with REPRODUCED or NOT REPRODUCED; give the output of a "
                        f"script `swabench repro` wrote")
    gpu = next((m for m in map(GPU_LINE.match, lines) if m), None)
    version = next((m["version"] for m in map(PACKAGE_LINE.match, lines) if m), None)
    where = ", ".join(x for x in (f"flashinfer {version}" if version else "",
                                  f"{gpu['name'] or gpu['listed']} ({gpu['sms']} SMs)" if gpu else "") if x) \
        or "an unnamed machine"
    control = next((line for line in lines if line.startswith("CONTROL")), "")
    return Observed(_cut(where), _cut(verdict), _cut(control), text.rstrip())


def body(title: str, header: list[str], script_name: str, script_text: str, observed: list[Observed],
         comment_on: str = "", ask: str = "", measured: list[str] = ()) -> str:
    """The Markdown to file: the title and one paragraph (whose fault, when it shows, what is asked), what was
    expected against what each run printed, the suite's own rows (``measured``, a table), then the script and each
    run's output with its environment, collapsed.  ``header`` is the script's top comment.  A comment on an
    upstream issue (``comment_on``) is the paragraph's first and last sentences: where it reproduces, and what to
    do until it is fixed."""
    said = _fields(header)
    runs = [f"on {where}: {_code(verdict)}" + (f"; {_code(control)}" if control else "")
            for where, verdict, control in said_once(observed)]
    seen = "Observed " + "; ".join(runs) + "." if runs else "Not yet run on a GPU."
    fix = f" {_sentence(ask)}." if ask else ""
    if comment_on:  # a paragraph, the script and one environment
        lines, observed = [f"{_sentence(title)}. {seen}{fix}", ""], observed[:1]
    else:
        from swabench.repro.filings import CITES, KINDS, LIBRARY_KINDS, SOURCE_RELEASE

        kind, _, fault = said.get("Fault", "").partition(": ")
        fault = fault if kind in KINDS else said.get("Fault", "")  # an issue filed upstream needs no party named
        when = f" It shows with {said['Matters']}." if said.get("Matters") else ""
        when += f" The script needs {said['Needs']}." if said.get("Needs") else ""
        lines_of = f" (Files and lines: the flashinfer-python {SOURCE_RELEASE} wheel.)" \
            if kind in LIBRARY_KINDS and CITES.search(fault) else ""
        lines = [f"# {title}", "", f"{_sentence(fault)}.{when}{fix}{lines_of}", "",
                 f"Expected: {said.get('Expected', 'the float32 reference')}. {seen}", ""]
    lines += [*measured, ""] if measured else []
    lines += [f"<details><summary>{script_name}: torch and flashinfer only, exits 1 when it reproduces</summary>", "",
              *_fenced(script_text.rstrip(), "python"), "", "</details>", ""]
    for o in observed:
        quoted, left_out = excerpt(o.text)
        more = f": {len(quoted)} of its {len(quoted) + left_out:,} lines, {left_out:,} left out" if left_out else ""
        lines += [f"<details><summary>its output and environment on {o.where}{more}</summary>", "",
                  *_fenced("\n".join(quoted)), "", "</details>", ""]
    return "\n".join(lines)


def said_once(observed) -> list[tuple[str, str, str]]:
    """(where, verdict, control) with the runs on one GPU that printed the same verdict said once: 'flashinfer 0.7.4
    and 0.7.2.post1, NVIDIA H200 (132 SMs)'."""
    said: dict[tuple[str, str], tuple[list[str], str]] = {}
    for o in observed:  # where: "flashinfer 0.7.4, NVIDIA H200 (132 SMs)", or without one of the two
        release, _, gpu = o.where.partition(", ") if o.where.startswith("flashinfer ") else ("", "", o.where)
        said.setdefault((gpu, o.verdict), ([], o.control))[0].append(release.removeprefix("flashinfer "))
    out = []
    for (gpu, verdict), (releases, control) in said.items():
        named = " and ".join(filter(None, releases))
        out.append((", ".join(filter(None, (f"flashinfer {named}" if named else "", gpu))), verdict, control))
    return out


def excerpt(text: str) -> tuple[list[str], int]:
    """(the lines of a reproducer's output to quote, how many were left out): a short output whole; of a longer one
    (a log with a server's or a build's output around it), each verdict with the lines printed under it, the
    CONTROL lines and the environment lines, each bounded; in either, every line cut at ``LINE_CHARS`` (the
    container's NVIDIA_REQUIRE_CUDA is 2 KB).  FlashInfer's log of the modules it built is not the script's output:
    left out of either, and not counted in a short one."""
    every = text.splitlines()
    lines = [line for line in every if not BUILD_LINE.match(line)]
    if len(lines) <= WHOLE_LINES and len("\n".join(lines)) <= WHOLE_CHARS:
        return [_cut(line) for line in lines], 0
    report, environment, under = [], [], 0
    for at, line in enumerate(lines):
        if line.startswith(VERDICTS):
            under = DETAIL_LINES + 1
        if GPU_LINE.match(line) or PACKAGE_LINE.match(line) or TORCH_LINE.match(line):
            under = 0
            if len(environment) < ENVIRONMENT_LINES:
                environment.append(at)
        elif (under or line.startswith("CONTROL")) and len(report) < REPORT_LINES:
            report.append(at)
        under = 0 if line.startswith("CONTROL") else max(0, under - 1)  # a verdict's lines end at its control
    picked = sorted(report + environment)
    return [_cut(lines[at]) for at in picked], len(every) - len(picked)


def _cut(line: str) -> str:
    return line if len(line) <= LINE_CHARS else f"{line[:LINE_CHARS]} [... {len(line) - LINE_CHARS:,} more characters]"


def _fenced(text: str, language: str = "") -> list[str]:
    """A Markdown code block whose fence is longer than any run of backticks in ``text``, so no line of it ends it."""
    fence = "`" * max(3, _longest_backticks(text) + 1)
    return [fence + language, text, fence]


def _code(text: str) -> str:
    """``text`` as inline code, delimited by more backticks than any run in it."""
    ticks = "`" * (_longest_backticks(text) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def _longest_backticks(text: str) -> int:
    return max(map(len, re.findall(r"`+", text)), default=0)


def _sentence(text: str) -> str:
    """``text`` with a capital first letter where it begins with a plain word, not with code ('backend=...')."""
    return text[:1].upper() + text[1:] if re.match(r"[a-z]+[,;:]?( |$)", text) else text


def _fields(header: list[str]) -> dict[str, str]:
    """'Name: text' lines of a top comment (continuations indented) as {name: text}."""
    fields, name = {}, None
    for line in header:
        if line.startswith("    ") and name:
            fields[name] += " " + line.strip()
            continue
        name, _, text = line.partition(": ")
        fields[name] = text
    return fields
