"""A whole model's attention per step, from a price run's table: each layer step served by its fastest
correct path that passed it, weighted by its count (model steps x that kind of layer), in milliseconds per
1000 model steps; the share the windowed layers take; what it costs when each kind of layer runs one path per
step (as an engine configures a backend per layer type, not per batch); and what the whole step costs if the
windowed layers used the naive custom mask, or, on decode, the CUDA-core decode kernel over the full table."""

from __future__ import annotations

from typing import TYPE_CHECKING

from swabench.impls import registry

if TYPE_CHECKING:
    import pandas as pd

NAIVE = "windowed layers by the custom mask (ms)"
FULL_TABLE_DECODE = "windowed decode by the CUDA-core kernel over the full table (ms)"  # the other steps at their best
PICKS = "one path per layer type (ms)"  # each kind of layer and step served by one path, the fastest over its steps
FULL_TABLE_IMPL, FULL_TABLE_BACKEND = "decode-window", "fa2"  # fa2's CUDA-core kernel, not auto's or cuDNN's pick


def _timed(rows: pd.DataFrame) -> pd.DataFrame:
    return rows[(rows["status"] == "pass") & rows["median_us"].notna()]


def _fastest(rows: pd.DataFrame) -> float:
    ok = _timed(rows)
    return float(ok["median_us"].min()) if len(ok) else float("nan")


def _slower_paths(table: pd.DataFrame) -> dict[str, pd.Series]:
    """Per slower choice for the windowed layers, which rows run it: the naive masks (the baselines), and fa2's
    CUDA-core decode over the full table."""
    baselines = [i.name for i in registry.all_implementations() if i.baseline]
    return {NAIVE: table["impl"].isin(baselines),
            FULL_TABLE_DECODE: (table["impl"] == FULL_TABLE_IMPL) & (table["backend"] == FULL_TABLE_BACKEND)}


def picks(table: pd.DataFrame, meta: dict) -> dict[tuple[str, str], tuple[str, str] | None]:
    """Per kind of layer and mode: the one correct path that passed every such step at the least weighted
    time, as (impl, backend); None where no one path passed them all."""
    price, weights, modes = meta["price"], meta["trace"]["weights"], meta["trace"]["modes"]
    timed = _timed(table[table["kind"] == "correct"])
    groups: dict[tuple[str, str], list[str]] = {}
    for case_id in weights:
        groups.setdefault((price["layers"][case_id], modes[case_id]), []).append(case_id)
    out = {}
    for key, ids in groups.items():
        rows = timed[timed["case_id"].isin(ids)]
        rows = rows.assign(weighted=rows["median_us"] * rows["case_id"].map(weights).astype(float))
        sums = rows.groupby(["impl", "backend"], sort=False).agg(steps=("case_id", "nunique"), us=("weighted", "sum"))
        whole = sums[sums["steps"] == len(ids)]
        out[key] = whole["us"].idxmin() if len(whole) else None
    return out


def per_mode(table: pd.DataFrame, meta: dict) -> pd.DataFrame:
    """One row per mode and one for all modes: windowed and global layers' milliseconds per 1000 model steps
    at their best, the whole model, the windowed share, the whole model with one path per layer type and
    mode (``picks``), and the two slower choices for the windowed layers."""
    import pandas as pd

    price, weights, modes = meta["price"], meta["trace"]["weights"], meta["trace"]["modes"]
    steps = price["model_steps"]
    correct = table[table["kind"] == "correct"]
    naive, full = _slower_paths(correct).values()
    chosen = picks(table, meta)
    rows = []
    for case_id, count in weights.items():
        mine = correct["case_id"] == case_id
        layer, mode = price["layers"][case_id], modes[case_id]
        best = _fastest(correct[mine])
        windowed_decode = layer == "window" and mode == "decode"
        pick = chosen[(layer, mode)]
        picked = _fastest(correct[mine & (correct["impl"] == pick[0]) & (correct["backend"] == pick[1])]) \
            if pick else float("nan")
        rows.append({"mode": mode, "layer": layer, "ms": best * count / steps, "picks": picked * count / steps,
                     "naive": (_fastest(correct[mine & naive]) if layer == "window" else best) * count / steps,
                     "full": (_fastest(correct[mine & full]) if windowed_decode else best) * count / steps})
    per = pd.DataFrame(rows)
    out = []
    for mode, g in [*per.groupby("mode", sort=False), ("all modes", per)]:
        window, global_ = g[g["layer"] == "window"], g[g["layer"] == "global"]
        windowed, whole = window["ms"].sum(min_count=len(window)), g["ms"].sum(min_count=len(g))
        out.append({"mode": mode, "windowed layers (ms)": windowed,
                    "global layers (ms)": global_["ms"].sum(min_count=len(global_)) if len(global_) else 0.0,
                    "whole model (ms)": whole, "windowed share": windowed / whole, PICKS: g["picks"].sum(min_count=len(g)),
                    NAIVE: g["naive"].sum(min_count=len(g)),
                    FULL_TABLE_DECODE: g["full"].sum(min_count=len(g)) if "decode" in set(g["mode"]) else float("nan")})
    return pd.DataFrame(out)


def blanks(table: pd.DataFrame, meta: dict) -> dict[str, list[str]]:
    """Why a slower choice has no time: per column left blank, the reasons its paths gave on the windowed
    layer steps where none of them timed a pass (a mask with no sink term, a decode kernel with no instance for
    the group)."""
    price, modes = meta["price"], meta["trace"]["modes"]
    windowed = [c for c, layer in price["layers"].items() if layer == "window"]
    steps = {NAIVE: windowed, FULL_TABLE_DECODE: [c for c in windowed if modes.get(c) == "decode"]}
    out = {}
    for column, paths in _slower_paths(table).items():
        rows = table[paths & table["case_id"].isin(steps[column])]
        untimed = set(steps[column]) - set(_timed(rows)["case_id"])
        if untimed:
            said = rows[rows["case_id"].isin(untimed)].dropna(subset=["reason"]).drop_duplicates(["impl", "reason"])
            out[column] = [f"{r.impl}: {r.reason}" for r in said.itertuples()] or ["no such path timed that step"]
    return out


def kv(meta: dict) -> pd.DataFrame:
    """The KV MiB a request holds per model step, every page kept and out-of-window pages evicted."""
    import pandas as pd

    return pd.DataFrame(meta["price"]["kv"])
