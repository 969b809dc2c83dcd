"""What a reproducer printed, read back (``Observed``), and the issue body a maintainer files with it: the title,
what happens on each release run, what was expected, the control, the script, its output and the environment it
printed.  For a bug already reported upstream the body is a comment on that issue."""

from __future__ import annotations

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
         comment_on: str = "") -> str:
    """The Markdown to file: ``header`` is the script's top comment (its Call, Shape, Expected, Fault and Control
    lines are quoted); ``comment_on``: the upstream issue the body comments on, where there is one."""
    said = _fields(header)
    runs = [f"- On {o.where}: {_code(o.verdict)}" + (f"; {_code(o.control)}" if o.control else "") for o in observed]
    lines = [f"Reproducer for {comment_on}, as a comment there." if comment_on else f"# {title}", ""]
    lines += ["**What happens.**", *runs, ""] if runs else ["**What happens.** Not yet run.", ""]
    lines += [f"**{name}.** {_sentence(said[name])}\n"
              for name in ("Expected", "Call", "Shape", "Matters", "Control", "Fault") if said.get(name)]
    lines += ["**Reproducer.** Torch and flashinfer only; it builds the inputs, makes the call, checks it against a "
              f"float32 reference written out in it, and exits 1 when the bug shows: `python3 {script_name}`.", "",
              f"<details><summary>{script_name}</summary>", "", *_fenced(script_text.rstrip(), "python"), "",
              "</details>", ""]
    for o in observed:
        quoted, left_out = excerpt(o.text)
        said = "the environment last, FlashInfer's collect_env report included" if not left_out else \
            (f"its verdicts and environment lines, {len(quoted)} of its {len(quoted) + left_out:,} lines: "
             f"{left_out:,} left out")
        lines += [f"**Its output on {o.where}** ({said}):", "", "<details><summary>output</summary>", "",
                  *_fenced("\n".join(quoted)), "", "</details>", ""]
    return "\n".join(lines)


def excerpt(text: str) -> tuple[list[str], int]:
    """(the lines of a reproducer's output to quote, how many were left out): a short output whole; of a longer one
    (a log with a server's or a build's output around it), each verdict with the lines printed under it, the
    CONTROL lines and the environment lines, each bounded, every line cut at ``LINE_CHARS``."""
    lines = text.splitlines()
    if len(lines) <= WHOLE_LINES and len(text) <= WHOLE_CHARS:
        return lines, 0
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
    return [_cut(lines[at]) for at in picked], len(lines) - len(picked)


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
