"""Which runs a page is made from: each run's folder and environment, and on a report how it was measured."""

from __future__ import annotations

import json

import pandas as pd

from swabench.publish.markdown import code_line, machine_line, published_command
from swabench.publish.sections.base import FINDINGS, REPORT, Run, Section, points
from swabench.store import tables

ENVIRONMENT = ["gpu", "nvidia_smi.driver_version", "cuda", "torch", "libraries", "swabench", "git_commit", "python",
               "cpu", "host", "time_utc", "command", "nvidia_smi.clocks.max.sm", "peaks"]


def run_lines(runs: list[Run]) -> list[str]:
    """Each run's folder, what it is and its environment, once, so the sections below can name the
    folder alone, under the machine and libraries it ran on (said once for the runs that share them); a run that did
    not finish says so here."""
    machines: dict[str, list[str]] = {}
    for r in runs:
        note, cases = tables.completeness(r.meta, r.table), r.table["case_id"].nunique()
        machines.setdefault(machine_line(r.meta), []).append(
            f"- {r.name}: {r.meta.get('what', 'run')} of scenario `{r.meta.get('scenario')}`"
            + (" made under a profiler" if r.profiled else "") + ", "
            f"{points(len(r.table))} over {cases} case{'s' * (cases != 1)}"
            + (f". **Incomplete run**: {note}" if note else "") + f"; {code_line(r.meta, r.folder)}")
    return [f"On {machine}:\n\n" + "\n".join(lines) for machine, lines in machines.items()]


def _as_text(value) -> str:
    return json.dumps(value) if isinstance(value, dict) else value


def environment(run: Run) -> pd.DataFrame:
    shown = {**run.meta, "command": published_command(run.meta, run.folder)}
    return pd.DataFrame([{"": k, "value": _as_text(shown[k])} for k in ENVIRONMENT if run.meta.get(k) is not None])


def method(run: Run) -> pd.DataFrame:
    return pd.DataFrame([{"what": k, "how": _as_text(v)} for k, v in run.meta.get("method", {}).items()])


SECTIONS = [
    Section("runs", "Runs", "", pages=frozenset({FINDINGS}), across=run_lines, every_release=True, profiled=True,
            trees=True),
    Section("environment", "Environment", "", environment, pages=frozenset({REPORT})),
    Section("method", "Method", "", method, pages=frozenset({REPORT})),
]
