"""Every bug the runs caught, with the command that writes its standalone script (``swabench repro``), the
script committed under ``repro/`` where there is one, and what that script said on its own on the GPU
node beside the suite's verdict on the same case (``repro/h200-RELEASE/verdicts.json``)."""

from __future__ import annotations

import json

import pandas as pd

from swabench.publish.markdown import REPO, markdown_table
from swabench.publish.sections.base import FINDINGS, Run, Section

CLIFF = "decode-cliff"


def caught(runs: list[Run]) -> dict[str, list[str]]:
    """Bug reference -> the runs that caught it: known bugs and planted mistakes by their xfail rows, declared
    upstream bugs by the correct rows they turned wrong, the decode cliff where both its paths were timed."""
    found: dict[str, list[str]] = {}
    for r in runs:
        t = r.table
        wrong = t[t["status"] == "xfail"]
        refs = set(wrong.loc[wrong["kind"] != "correct", "impl"])
        if "upstream" in t:
            refs |= set(wrong.loc[wrong["kind"] == "correct", "upstream"].dropna())
        decode = t[(t["mode"] == "decode") & t["median_us"].notna()]
        if {"decode-window", "decode-trim"} <= set(decode["impl"]):
            refs.add(CLIFF)
        for ref in refs:
            found.setdefault(ref, []).append(r.name)
    return found


def _on_the_node(ref: str) -> str:
    """What the committed script said on each release the node ran it on, and whether the suite agreed."""
    said = []
    for path in sorted(REPO.glob("repro/h200-*/verdicts.json")):
        row = next((v for v in json.loads(path.read_text()) if v["ref"] == ref), None)
        if row:
            release = path.parent.name.removeprefix("h200-")
            said.append(f"{release}: exit {row['script_exit']}" + ("" if row["agree"] else " (the suite disagrees)"))
    return "; ".join(said)


def reproducers(runs: list[Run]) -> list[str]:
    from swabench.repro import bugs

    found = caught([r for r in runs if len(r.table)])
    rows = []
    for bug in bugs.catalogue():
        if bug.ref not in found:
            continue
        script = REPO / "repro" / f"{bug.ref.replace('#', '-')}.py"
        names = found[bug.ref]
        rows.append({"bug": f"`{bug.ref}`", "caught in": ", ".join(names[:2]) + (f" and {len(names) - 2} more"
                                                                                  if len(names) > 2 else ""),
                     "command": f"`swabench repro --bug {bug.ref}`",
                     "script": f"[`repro/{script.name}`](repro/{script.name})" if script.exists() else "",
                     "on the H200 (script exit; 1 = shows)": _on_the_node(bug.ref)})
    if not rows:
        return []
    return ["Each bug the runs caught, as a script that uses only torch and the library: it builds the case the "
            "suite builds, makes the path's own calls, checks against a reference written out in it and exits 1 "
            "where the output is wrong (the cliff: where the full table takes more than its threshold times the "
            "trimmed one). `swabench repro RUN --case ID --impl NAME` writes one for any point of a run.",
            markdown_table(pd.DataFrame(rows))]


TOPIC = "Reproducers: each bug as a script to file"

SECTIONS = [
    Section("repros", "Reproducers: each bug caught, as a script to file upstream", "", pages=frozenset({FINDINGS}),
            across=reproducers, every_release=True, profiled=True, trees=True),
]
