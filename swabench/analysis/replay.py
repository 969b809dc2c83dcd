"""A replay's weighted table: milliseconds of attention per 1000 steps of a trace's mix."""

from __future__ import annotations

from typing import TYPE_CHECKING

from swabench.spec.traces import MODES

if TYPE_CHECKING:
    import pandas as pd


def per_thousand_steps(table: pd.DataFrame, weights: dict[str, int], modes: dict[str, str] | None = None) \
        -> pd.DataFrame:
    """Per implementation and backend: milliseconds of attention per 1000 steps of the trace's mix,
    split by the mode of the step (a cell is left empty where the path did not time every step of that
    mode: the decode wrappers run no verify), their sum where the path timed every step, and the
    steps it covered.  A last row takes the fastest path of each mode: the mix served at its best.
    ``modes`` (case_id -> mode, from the run's meta) says the mode of a step that has no rows yet; without
    it, a replay missing whole steps leaves every mode cell empty rather than guess their modes."""
    import pandas as pd

    total = sum(weights.values())
    modes = {**dict(zip(table["case_id"], table["mode"])), **(modes or {})}
    known = all(c in modes for c in weights)
    order = [m for m in MODES if m in {modes[c] for c in weights if c in modes}]
    per_mode = {m: sum(w for c, w in weights.items() if modes.get(c) == m) for m in order}
    timed = table.dropna(subset=["median_us"]).assign(weight=lambda t: t["case_id"].map(weights).fillna(0))
    rows = []
    for (impl, backend), g in timed.groupby(["impl", "backend"], sort=False):
        covered = int(g["weight"].sum())
        if not covered:
            continue
        row = {"impl": impl, "backend": backend}
        for m in order:
            own = g[g["mode"] == m]
            row[f"{m} ms"] = float((own["median_us"] * own["weight"]).sum() / total) \
                if known and int(own["weight"].sum()) == per_mode[m] else float("nan")  # us/step x steps/1000 = ms
        row["all steps ms"] = sum(row[f"{m} ms"] for m in order) if covered == total else float("nan")
        row["steps covered"] = f"{covered}/{total}"
        rows.append(row)
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    best = {m: out[f"{m} ms"].idxmin() for m in order if out[f"{m} ms"].notna().any()}
    if known and len(best) == len(order):
        out.loc[len(out)] = {"impl": "fastest per mode",
                             "backend": ", ".join(f"{m}: {out.at[i, 'impl']} [{out.at[i, 'backend']}]"
                                                  for m, i in best.items()),
                             **{f"{m} ms": out.at[i, f"{m} ms"] for m, i in best.items()},
                             "all steps ms": sum(out.at[i, f"{m} ms"] for m, i in best.items()),
                             "steps covered": f"{total}/{total}"}
    return out
