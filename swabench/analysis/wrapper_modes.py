"""CUDA-graph mode against plain wrappers: a step timed both ways, each path paired with itself, and the
fastest path of each step in each mode (a graph's padded schedule can cost one path more than another)."""

from __future__ import annotations

import pandas as pd

from swabench.analysis import versus
from swabench.core.cases import WRAPPER_MODES

GRAPH, PLAIN = WRAPPER_MODES


def timed_both_ways(table: pd.DataFrame) -> pd.DataFrame:
    """The correct points that passed and were timed, with their ``step``, of each path timed on its step in both
    modes (a path without a wrapper has no plain point, so it is left out of both)."""
    if "wrapper_mode" not in table.columns or not {GRAPH, PLAIN} <= set(table["wrapper_mode"]):
        return table.iloc[0:0]
    t = table[(table["kind"] == "correct") & (table["status"] == "pass") & table["median_us"].notna()]
    t = t.assign(step=versus.twin_key(t, "wrapper_mode"))
    both = t.groupby(["step", "impl", "backend"])["wrapper_mode"].transform("nunique") == 2
    return t[both]


def pairs(table: pd.DataFrame) -> pd.DataFrame:
    """Every path timed on a step in both modes: its graph-mode row with ``plain_us``, ``plain_plan_us`` and
    ``plain_noise``, ``cost_us`` = graph - plain and ``cost`` = graph / plain."""
    t = timed_both_ways(table)
    if t.empty:
        return pd.DataFrame()
    graph, plain = t[t["wrapper_mode"] == GRAPH], t[t["wrapper_mode"] == PLAIN]
    plain = plain.reindex(columns=["step", "impl", "backend", "median_us", "plan_us", "noise"]).rename(
        columns={"median_us": "plain_us", "plan_us": "plain_plan_us", "noise": "plain_noise"})
    m = graph.merge(plain, on=["step", "impl", "backend"])
    return m.assign(cost_us=m["median_us"] - m["plain_us"], cost=m["median_us"] / m["plain_us"])


def fastest(table: pd.DataFrame) -> pd.DataFrame:
    """Per step timed both ways: the fastest correct path in each mode (``graph_path``, ``graph_us``,
    ``plain_path``, ``plain_us``) and whether they differ (``changes``), in the run's order."""
    t = timed_both_ways(table)
    if t.empty:
        return pd.DataFrame()
    best = t.sort_values("median_us", kind="stable").drop_duplicates(["step", "wrapper_mode"])
    best = best.assign(path=best["impl"] + " [" + best["backend"] + "]").set_index(["step", "wrapper_mode"])
    order = list(dict.fromkeys(t["step"]))
    rows = []
    for step in order:
        g, p = best.loc[(step, GRAPH)], best.loc[(step, PLAIN)]
        rows.append({"step": step, "case": g["case"], "mode": g["mode"], "batch_size": g["batch_size"],
                     "graph_path": g["path"], "graph_us": g["median_us"], "plain_path": p["path"],
                     "plain_us": p["median_us"], "changes": g["path"] != p["path"]})
    return pd.DataFrame(rows)
