"""What the gate saw: points per status, whether any correct path ever failed (the one outcome that
must not happen), and the known bugs and planted mistakes: caught, and where they were not."""

from __future__ import annotations

import pandas as pd

from swabench.publish.markdown import environment_line, markdown_table
from swabench.publish.sections.base import FINDINGS, REPORT, SUMMARY, Run, Section, own_mistake_caught, points
from swabench.store import schema, tables

STATUS_ORDER = list(schema.STATUSES)


def correctness_matrix(table: pd.DataFrame) -> pd.DataFrame:
    """Per implementation and backend: how many points had each status, the worst error of the
    points that passed, and the smallest error of the known bugs the gate caught."""
    rows = []
    impl_order = {name: i for i, name in enumerate(dict.fromkeys(table["impl"]))}
    keys = sorted(table.groupby(["impl", "backend"]).groups, key=lambda k: (impl_order[k[0]], k[1]))
    for impl, backend in keys:
        group = table[(table["impl"] == impl) & (table["backend"] == backend)]
        counts = group["status"].value_counts()
        passed = group[group["status"] == "pass"]
        caught = group[own_mistake_caught(group) | ((group["status"] == "xfail") & (group["kind"] == "correct"))]
        rows.append({"impl": impl, "kind": group["kind"].iloc[0], "backend": backend,
                     **{s: int(counts.get(s, 0)) for s in STATUS_ORDER},
                     "worst rel-L2 (pass)": passed["rel_l2"].max(),
                     "worst probe row (pass)": passed["probe_rel_l2"].max(),
                     "lowest rel-L2 (xfail)": caught["rel_l2"].min(),
                     "lowest probe row (xfail)": caught["probe_rel_l2"].min()})
    return pd.DataFrame(rows)


def _summary_line(run: Run) -> list[str]:
    return [f"**{run.meta.get('scenario')}**: {tables.extent(run.meta, run.table)}. "
            f"{environment_line(run.meta, run.folder)}"]


def _failed(run: Run) -> pd.DataFrame:
    """The failed, crashed and xpass points, each with the command that writes its standalone script."""
    from swabench.repro import command

    bad = run.table[run.table["status"].isin(BAD)].head(50)
    repro = [f"`{command(run.folder, r.case_id, r.impl, r.backend)}`" for r in bad.itertuples()]
    return bad[["status", "impl", "backend", "case", "reason"]].assign(repro=repro)


def _failed_count(run: Run) -> list[str]:
    n = int(run.table["status"].isin(BAD).sum())
    return [f"{points(n)} failed the gate, crashed, or let a known bug through" +
            (" (the first 50):" if n > 50 else ":")]


BAD = ["fail", "crash", "xpass"]  # the statuses whose points a run lists one by one


def _first_reason(g: pd.DataFrame) -> str:
    """A crash's reason without the worker's last output, on one line, for a sentence: 'the worker was killed by
    SIGABRT (signal 6)'."""
    reason = str(g["reason"].iloc[0]).strip().splitlines()[0].removeprefix("crash: ")
    return reason.split("; last output:")[0].split("; the point said:")[0]


def _limits(meta: dict, table: pd.DataFrame) -> str:
    """The gate's limits (rel-L2 over the output / worst row) when the run has one dtype."""
    dtypes = set(table["dtype"].dropna())
    tol = meta.get("method", {}).get("tolerances", {}).get(dtypes.pop() if len(dtypes) == 1 else None)
    return f"{tol['rel_l2']:g} / {tol['row_rel_l2']:g}" if tol else ""


def across_runs(runs: list[Run]) -> list[str]:
    runs = [r for r in runs if len(r.table)]
    counts, bugs, failures, notes = [], [], [], []
    for r in runs:
        t, matrix = r.table, correctness_matrix(r.table)
        good = matrix[matrix["kind"] == "correct"]
        status = t["status"].value_counts()
        counts.append({"run": r.name, "state": r.meta.get("state", "complete"), "cases": t["case_id"].nunique(),
                       "points": len(t), **{s: int(status.get(s, 0)) for s in STATUS_ORDER},
                       "worst rel-L2 (correct, pass)": good["worst rel-L2 (pass)"].max(),
                       "worst probe row (correct, pass)": good["worst probe row (pass)"].max(),
                       "limits (rel-L2 / row)": _limits(r.meta, t)})
        failed = t[(t["kind"] == "correct") & (t["status"] == "fail")]
        failures += [f"**`{impl}` [{backend}], a correct implementation, failed the gate on {points(len(g))}** "
                     f"({r.name})." for (impl, backend), g in failed.groupby(["impl", "backend"])]
        crashed = t[t["status"] == "crash"]
        for (impl, backend, kind), g in crashed.groupby(["impl", "backend", "kind"]):
            said = f"crashed on {points(len(g))}: {_first_reason(g)} ({r.name})."
            if kind == "correct":
                failures.append(f"**`{impl}` [{backend}], a correct implementation, {said}**")
            else:
                notes.append(f"`{impl}` [{backend}], a {kind} path, {said}")
        wrong = matrix[matrix["kind"] != "correct"]
        columns = ["impl", "kind", "backend", "xfail", "xpass", "pass", "fail", "crash", "lowest probe row (xfail)"]
        bugs += [{"run": r.name, **row} for row in wrong[columns].to_dict("records")]
        notes += _xpass(r)
        odd = t[(t["kind"] != "correct") & (t["status"] == "fail")]
        if len(odd):
            notes.append(f"{points(len(odd))} of known bugs or planted mistakes failed where their mistake changes "
                         f"nothing: the suite's model of the mistake is wrong there ({r.name}).")
    if not runs:
        return []
    parts = [" ".join(failures) or "Every correct implementation passed every point it ran: no correct path has "
                                   "a `fail` or `crash` row in any run.",
             "Points per status, and the worst error of a correct implementation's passing point against the "
             "gate's limits:", markdown_table(pd.DataFrame(counts))]
    if bugs:
        missed = any(b["xpass"] for b in bugs)
        parts += ["The gate caught every known bug and planted mistake on every point where its mistake changes "
                  "what some query sees (`xfail`)" + (", except the `xpass` points below" if missed else "")
                  + ". They are run for correctness only; `pass` is a point where the mistake changes nothing. "
                  "`lowest probe row (xfail)` is the smallest probe-pass row error of a caught point: the thinnest "
                  "margin over the row limit above.", markdown_table(pd.DataFrame(bugs))]
    return parts + notes


def _xpass(r: Run) -> list[str]:
    """A known bug the gate did not catch, with what its points share, so a reader can tell a bug
    fixed upstream from a blind spot of the gate (or a case that does not exercise the bug)."""
    out = []
    for impl, g in r.table[r.table["status"] == "xpass"].groupby("impl", sort=False):
        shared, varied = [], []
        for col, same in (("qo_len", "qo_len = {}"), ("backend", "backend {}")):
            values = g[col].value_counts()
            if len(values) == 1:
                shared.append(same.format(values.index[0]))
            else:
                varied.append(f"{col}: " + ", ".join(f"{v} ({n})" for v, n in values.items()))
        modes = g["mode"].value_counts()
        varied.append("modes: " + ", ".join(f"{m} {n}" for m, n in modes.items()))
        t = r.table
        same_cases = t[(t["impl"] == impl) & t["case_id"].isin(set(g["case_id"]))]
        for backend, e in same_cases[~same_cases["backend"].isin(set(g["backend"]))].groupby("backend"):
            seen = e["status"].value_counts()
            varied.append(f"the same cases on {backend}: " + ", ".join(f"{s} {n}" for s, n in seen.items()))
        out.append(f"`{impl}` was not caught: xpass on {points(len(g))}"
                   + (f", all with {', '.join(shared)}" if shared else "") + f"; {'; '.join(varied)} ({r.name}).")
    return out


TOPIC = "Correctness: what the gate saw"

SECTIONS = [
    Section("correctness", "Correctness", "", pages=frozenset({FINDINGS}), across=across_runs, profiled=True, trees=True),
    Section("correctness-matrix", "Correctness", "Points per status for each implementation and backend, the worst "
            "error of a passing point, and the smallest error of a caught known bug.",
            lambda run: correctness_matrix(run.table), _summary_line, pages=frozenset({REPORT, SUMMARY}), trees=True),
    Section("failed", "Failed points", "", _failed, _failed_count, pages=frozenset({REPORT, SUMMARY}), trees=True),
]
