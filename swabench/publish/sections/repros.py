"""Every bug the runs caught, with the command that writes its standalone script (``swabench repro``), the
script committed under ``repro/`` where there is one, and what that script said on its own on the GPU
node beside the suite's verdict on the same case (``repro/GPU-RELEASE/verdicts.json``: h200-0.7.4, h100-0.7.4...)."""

from __future__ import annotations

import json
import re

import pandas as pd

from swabench.publish.markdown import REPO, markdown_table
from swabench.publish.sections.base import FINDINGS, Run, Section

CLIFF = "decode-cliff"
VERDICTS = REPO / "repro"  # where the node's runs of the committed scripts are: GPU-RELEASE/verdicts.json


def caught(runs: list[Run]) -> dict[str, list[str]]:
    """Bug reference -> the runs that caught it: known bugs and planted mistakes by their xfail rows, declared
    upstream bugs by the rows they turned wrong (a known-bug path's where its own mistake does not show), the decode
    cliff where both its paths were timed."""
    found: dict[str, list[str]] = {}
    for r in runs:
        t = r.table
        wrong = t[t["status"] == "xfail"]
        declared = wrong["upstream"].notna() if "upstream" in t else pd.Series(False, index=wrong.index)
        refs = set(wrong.loc[(wrong["kind"] != "correct") & ~declared, "impl"]) | set(wrong.loc[declared, "upstream"])
        decode = t[(t["mode"] == "decode") & t["median_us"].notna()]
        if {"decode-window", "decode-trim"} <= set(decode["impl"]):
            refs.add(CLIFF)
        for ref in refs:
            found.setdefault(ref, []).append(r.name)
    return found


def _on_the_node(ref: str) -> str:
    """What the committed script said on each GPU and release the node ran it on, and whether the suite agreed."""
    return "; ".join(f"{release}: exit {row['script_exit']}" + ("" if row["agree"] else " (the suite disagrees)")
                     for release, row in _verdicts() if row["ref"] == ref)


def _verdicts() -> list[tuple[str, dict]]:
    """('H200 0.7.4', row) for each row of each GPU's and release's ``repro/GPU-RELEASE/verdicts.json``."""
    return [(_where(path.parent.name), row) for path in sorted(VERDICTS.glob("*/verdicts.json"))
            for row in json.loads(path.read_text())]


def _where(folder: str) -> str:
    """'h100-0.7.2.post1' -> 'H100 0.7.2.post1'."""
    gpu, _, release = folder.partition("-")
    return f"{gpu.upper()} {release}"


def _control_said(line: str) -> str:
    """A script's CONTROL line without the control's description: its verdict only."""
    m = re.search(r": (right \(|every row right|\d+ of \d+ rows|requests? \d|crash: |no row)", line)
    return line[m.start() + 2:] if m else line


def _suite_said(suite: dict) -> str:
    """The suite's verdict on the same parts: the cliff's ratio under its graph timer, else the checked part's gate
    (with the error where the call crashed)."""
    if "ratio" in suite:
        slow, fast, *others = suite["times_us"]  # the cliff's arms: the full table, the trimmed one, tensor cores
        read = f"; a read of every page {suite['every_page_us']:.1f} us" if "every_page_us" in suite else ""
        return f"{suite['ratio']:.2f}x ({slow:.1f} vs {fast:.1f} us" + "".join(f", {t:.1f}" for t in others) + \
            f"{read})"
    checked = [p for p in suite.get("parts", []) if p["role"] == "checked"]
    if not checked:
        return suite.get("error", "no verdict")[-80:]
    failed = next((p for p in checked if not p["passed"]), None)
    crashed = failed and re.match(r"\w+Error: ", failed["reason"])  # as the driver records an exception
    said = "right" if failed is None else f"crashed (`{failed['reason']}`)" if crashed else "wrong"
    controls = [p for p in suite.get("parts", []) if p["role"] == "control"]
    return said + ("; control " + ("right" if all(p["passed"] for p in controls) else "wrong") if controls else "")


def _which_script(row: dict) -> str:
    """Whether a row ran the script committed now: its code's digest against the run's, where the run recorded it."""
    from swabench.repro import issue, script_stem

    script = REPO / "repro" / f"{script_stem(row['ref'])}.py"
    if "script_digest" not in row or not script.exists():
        return "not recorded"
    return "this one" if issue.script_digest(script.read_text()) == row["script_digest"] else "**an older form**"


def on_the_node() -> list[str]:
    """Each committed script's own output on the node beside the suite's verdict on the same case, and whether the
    row ran the script committed now."""
    rows = [{"bug": f"`{row['ref']}`", "GPU, flashinfer": release, "script run": _which_script(row),
             "the script printed": f"`{row['script_said'][0]}`",
             "its control": f"`{_control_said(row['script_said'][1])}`" if row["script_said"][1] else "",
             "the suite, same case": _suite_said(row["suite"]), "agree": "yes" if row["agree"] else "**no**"}
            for release, row in sorted(_verdicts(), key=lambda v: (v[1]["ref"], v[0]))]
    if not rows:
        return []
    return ["What each committed script printed on the GPU node, run on its own, beside the suite's verdict on the "
            "same parts in a fresh process (`scripts/repro_verdicts.py`; the logs and `verdicts.json` are in "
            "`repro/GPU-RELEASE/`). The cliff's script and the suite both time under CUDA graphs with L2 flushed; "
            "a row agrees where the case, the exit status and the control's verdict are the same. 'script run': the "
            "script committed now, an older form of it (its code has changed since), or not recorded by the run.",
            markdown_table(pd.DataFrame(rows))]


def reproducers(runs: list[Run]) -> list[str]:
    from swabench.repro import bugs, script_stem

    found = caught([r for r in runs if len(r.table)])
    rows = []
    for bug in bugs.catalogue():
        if bug.ref not in found:
            continue
        script = REPO / "repro" / f"{script_stem(bug.ref)}.py"
        names = found[bug.ref]
        rows.append({"bug": f"`{bug.ref}`", "caught in": ", ".join(names[:2]) + (f" and {len(names) - 2} more"
                                                                                  if len(names) > 2 else ""),
                     "command": f"`swabench repro --bug {bug.ref}`",
                     "script": (f"[`repro/{script.name}`](repro/{script.name})" if script.exists() else "")
                     + (f" ([issue body](repro/{script.stem}.md))" if script.with_suffix(".md").exists() else ""),
                     "on the node (script exit; 1 = shows)": _on_the_node(bug.ref)})
    if not rows:
        return []
    return ["Each bug the runs caught, as a script that uses only torch and the library: it builds the case the "
            "suite builds, makes the path's own calls, checks against a reference written out in it and exits 1 "
            "where the output is wrong (the cliff: where the full table's time is nearer, in ratio, a plain read of "
            "every page's than the trimmed table's). `swabench repro RUN --case ID --impl NAME` writes one for any "
            "point of a run.",
            markdown_table(pd.DataFrame(rows))] + on_the_node()


TOPIC = "Reproducers: each bug as a script to file"

SECTIONS = [
    Section("repros", "Reproducers: each bug caught, as a script to file upstream", "", pages=frozenset({FINDINGS}),
            across=reproducers, every_release=True, profiled=True, trees=True),
]
