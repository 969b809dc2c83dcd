"""What a reproducer printed, read back (``Observed``), and the issue body a maintainer files with it: the title,
what happens on each release run, what was expected, the control, the script, its output and the environment it
printed.  For a bug already reported upstream the body is a comment on that issue."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from swabench.errors import UserError
from swabench.store import reading

VERDICTS = ("REPRODUCED", "NOT REPRODUCED", "DOCUMENTATION GAP")  # a docs gap's call is as designed
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
        raise UserError(f"--observed {log}: no line starts with {', '.join(VERDICTS[:-1])} or {VERDICTS[-1]}; give the "
                        f"output of a script `swabench repro` wrote")
    gpu = next((m for m in map(GPU_LINE.match, lines) if m), None)
    version = next((m["version"] for m in map(PACKAGE_LINE.match, lines) if m), None)
    where = ", ".join(x for x in (f"flashinfer {version}" if version else "",
                                  f"{gpu['name'] or gpu['listed']} ({gpu['sms']} SMs)" if gpu else "") if x) \
        or "an unnamed machine"
    control = next((line for line in lines if line.startswith("CONTROL")), "")
    return Observed(_cut(where), _cut(verdict), _cut(control), text.rstrip())


FACTS = (("affected", "Who reaches it"), ("origin", "First appears in"), ("workaround", "What to do today"),
         ("ask", "What would close it"))  # a filing's one-line facts, in the order a body lists them


def body(title: str, header: list[str], script_name: str, script_text: str, observed: list[Observed], filing,
         comment_on: str = "", measured: list[str] = ()) -> str:
    """The Markdown to file: the title and one paragraph (whose fault, when it shows), the filing's facts a line each
    (who reaches it, the release it first appears in, what to do today, what would close it), what was expected
    against what each run printed, the suite's own rows (``measured``, a table), then the script and one run's output
    with the environment it printed, collapsed (``outputs``).  ``header`` is the script's top comment.  A comment on
    an upstream issue (``comment_on``) opens with the title as a sentence and where it reproduces."""
    said = _fields(header)
    runs = [f"on {where}: {_code(verdict)}" + (f"; {_code(control)}" if control else "")
            for where, verdict, control in said_once(observed)]
    seen = "Observed " + "; ".join(runs) + "." if runs else "Not yet run on a GPU."
    from swabench.repro.filings import CITES, KINDS, SOURCE_RELEASE

    facts = [f"- **{name}:** {_sentence(getattr(filing, field))}." for field, name in FACTS if getattr(filing, field)]
    facts += ["", f"{_sentence(filing.note)}."] if filing.note else []
    facts += [""] if facts else []
    kind, _, fault = said.get("Fault", "").partition(": ")
    fault = fault if kind in KINDS else said.get("Fault", "")  # an issue filed upstream needs no party named
    cited = CITES.search(" ".join([fault, *facts]))
    lines_of = f" (Files and lines: the flashinfer-python {SOURCE_RELEASE} wheel.)" if cited else ""
    if comment_on:
        lines = [f"{_sentence(title)}. {seen}{lines_of}", "", *facts]
    else:
        when = f" It shows with {said['Matters']}." if said.get("Matters") else ""
        when += f" The script needs {said['Needs']}." if said.get("Needs") else ""
        lines = [f"# {title}", "", f"{_sentence(fault)}.{when}{lines_of}", "", *facts,
                 f"Expected: {said.get('Expected', 'the float32 reference')}. {seen}", ""]
    lines += [*measured, ""] if measured else []
    exits = "exits 0 where the call is as designed, else 1" if kind == "FlashInfer docs gap" else \
        "exits 1 when it reproduces"
    said_above = (("Observed",) if comment_on else SAID_ABOVE) + (("Control",) if any(o.control for o in observed)
                                                                   else ())  # quoted in the Observed sentence
    shown = quoted_script(script_text, said_above)
    lines += [f"<details><summary>{script_name}: torch and flashinfer only, {exits}</summary>", "",
              *_fenced(shown.rstrip(), "python"), "", "</details>", ""]
    return "\n".join(lines + outputs(observed, one=bool(comment_on)))


# the fields of a script's top comment an issue's own text says (its paragraph, the Expected and Observed sentence,
# the script's summary line), left out of the script it quotes
SAID_ABOVE = ("Fault", "Matters", "Needs", "Expected", "Observed", "Run")


def quoted_script(script_text: str, said: tuple[str, ...]) -> str:
    """The script as a body quotes it: its code whole, its top comment without the fields the body says itself
    (``said``: a field's name, or its first word for 'Observed on ...'), which would read twice."""
    before, doc, code = script_text.split('"""', 2)
    kept, keep = [], True
    for line in doc.split("\n"):
        if not line.startswith("    "):  # a field's first line (a continuation follows its field)
            keep = not (": " in line and line.split(": ")[0].split(" ")[0] in said)
        if keep:
            kept.append(line)
    return before + '"""' + "\n".join(kept) + '"""' + code


def outputs(observed: list[Observed], one: bool = False) -> list[str]:
    """One run's output with the environment it printed, collapsed: the run on the release the faults were read in
    where there is one, without the verdict and CONTROL lines the Observed sentence quotes.  The other runs on its GPU
    are said in a sentence each: the same lines or theirs, and the environment the same but for the lines that differ
    (a release's own version and commit); runs on another GPU, and every other run of a comment (``one``), are in
    the Observed sentence alone."""
    if not observed:
        return []
    from swabench.repro.filings import SOURCE_RELEASE

    said = {line for o in observed for line in (o.verdict, o.control) if line}
    first = next((o for o in observed if o.where.startswith(f"flashinfer {SOURCE_RELEASE},")), observed[0])
    printed, environment = split(first.text)
    quoted, left_out = unsaid(printed, said)
    kept, report = environment_excerpt(environment)
    what = "its other output and its environment" if quoted else "its environment"
    cuts = [f"{len(quoted)} of its {len(quoted) + left_out:,} other lines, {left_out:,} left out"] if left_out else []
    cuts += [f"{'the environment in ' * bool(quoted)}{len(kept)} of its {report} lines"] if report > len(kept) else []
    lines = [f"<details><summary>{what} on {first.where}" + (f": {'; '.join(cuts)}" if cuts else "") +
             "</summary>", "", *_fenced("\n".join(quoted + kept)), ""]
    gpu = first.where.partition(", ")[2]
    for o in observed if not one else ():
        if o is first or not (gpu and o.where.endswith(f", {gpu}")):  # another GPU's: in the Observed sentence
            continue
        other, theirs = split(o.text)
        differ = [" ".join(line.split()) for line in environment_excerpt(theirs)[0] if line not in kept]
        env = "no environment" if not theirs else "the environment the same" + \
            (" but for " + ", ".join(map(_code, differ)) if differ else "")
        theirs_quoted = unsaid(other, said)
        where = f"{o.where.partition(', ')[0]} (the same GPU)"
        if theirs_quoted == (quoted, left_out):
            lines += [f"On {where}: the same lines; {env}.", ""]
        elif _numbers_out(theirs_quoted[0]) == _numbers_out(quoted):  # the cliff's timings
            lines += [f"On {where}: the same lines with their own numbers; {env}.", ""]
        else:
            lines += [f"On {where}, {env}:", "", *_fenced("\n".join(theirs_quoted[0])), ""]
    return lines + ["</details>", ""]


REPORT = "### FlashInfer environment report"  # the first line of FlashInfer's collect_env
# the lines of collect_env's report a body keeps: the release, the GPU, the driver, CUDA and torch (the first of each)
REPORT_KEYS = ("flashinfer", "flashinfer commit", "Driver version", "CUDA toolkit resolved by flashinfer JIT", "torch")


def split(text: str) -> tuple[str, str]:
    """(what a script printed, the environment it printed after): the environment starts at FlashInfer's report or
    at the scripts' own first environment line."""
    lines = text.splitlines()
    at = next((i for i, line in enumerate(lines) if line.startswith(REPORT) or TORCH_LINE.match(line)), len(lines))
    return "\n".join(lines[:at]), "\n".join(lines[at:])


def unsaid(printed: str, said: set[str]) -> tuple[list[str], int]:
    """``excerpt`` of what a script printed, without the lines already quoted (``said``)."""
    quoted, left_out = excerpt(printed)
    return [line for line in quoted if line not in said], left_out


def environment_excerpt(environment: str) -> tuple[list[str], int]:
    """(the environment lines a body quotes, how many lines the environment has): the scripts' own environment
    lines, and of FlashInfer's report the first line of each of ``REPORT_KEYS`` and every GPU's, each cut at
    ``LINE_CHARS``; a report of 106 lines is quoted in 6."""
    lines = [line for line in environment.splitlines() if line.strip()]
    kept, keys = [], set()
    for line in lines:
        key = line.partition(" : ")[0].strip() if " : " in line else None
        if GPU_LINE.match(line) or PACKAGE_LINE.match(line) and key is None or TORCH_LINE.match(line) or \
                key in REPORT_KEYS and key not in keys:
            kept.append(_cut(line))
            keys.add(key)
    return kept, len(lines)


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


def _numbers_out(lines: list[str]) -> list[str]:
    return [re.sub(r"\d+(?:\.\d+)?", "#", line) for line in lines]


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
