"""A replay's weighted tables: milliseconds of attention per 1000 steps of a trace's mix.

A step's time is its median kernel time in microseconds; weighted by its share of the trace, the
sum over steps is microseconds per step of the mix, which is milliseconds per 1000 steps.  A server
picks a path per step of each layer type, so the mix "served at its best" is decided step by step:
each distinct step served by the fastest correct path that passed it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from swabench.inputs.traces import MODES

if TYPE_CHECKING:
    import pandas as pd

STEP_COLUMNS = ["case_id", "case", "mode", "layer", "count", "impl", "kind", "library", "backend", "status",
                "median_us", "ms_per_1000"]
SERVED = "served at its best"
# What makes a step's layer type: an engine picks one path per layer type (a sink layer and a plain one differ)
LAYER_COLUMNS = ("num_qo_heads", "num_kv_heads", "head_dim", "window_left", "attention_chunk", "causal", "sinks",
                 "logits_soft_cap", "dtype", "kv_dtype")


def layer_label(row) -> str:
    """'h64/8 d64 W127 sinks bfloat16': a step's layer type, from its heads, head_dim, window or chunk,
    causality, sinks, soft-cap and dtypes."""
    span = f"C{int(row['attention_chunk'])}" if row.get("attention_chunk") else f"W{int(row['window_left'])}"
    kv = row.get("kv_dtype")
    return (f"h{int(row['num_qo_heads'])}/{int(row['num_kv_heads'])} d{int(row['head_dim'])} {span}"
            + ("" if row.get("causal", True) in (True, "True", 1) else " non-causal")
            + (" sinks" if row.get("sinks") in (True, "True", 1) else "")
            + (f" cap{float(row['logits_soft_cap']):g}" if row.get("logits_soft_cap") else "")
            + f" {row['dtype']}" + (f" kv-{kv}" if isinstance(kv, str) and kv != row["dtype"] else ""))


def layers(table: pd.DataFrame) -> pd.Series:
    """Each case's layer type (``layer_label``), by case_id; empty where the table lacks the layer's columns."""
    import pandas as pd

    once = table.drop_duplicates("case_id").set_index("case_id")
    if not len(once) or not set(LAYER_COLUMNS[:4]) <= set(once.columns):
        return pd.Series("", index=once.index, dtype=object)
    return once.apply(layer_label, axis=1)


def steps(table: pd.DataFrame, weights: dict[str, int], modes: dict[str, str] | None = None) -> pd.DataFrame:
    """``replay.csv``: one row per step x implementation x backend, with the step's mode and count (the
    steps of the trace it stands for), the point's status and median time, and ``ms_per_1000``: its
    weighted share, milliseconds per 1000 steps of the mix (empty where the point has no time).  A step
    of the trace with no row yet (an interrupted replay) has one row of status ``not run``."""
    import pandas as pd

    total = sum(weights.values())
    modes = {**(modes or {}), **dict(zip(table["case_id"], table["mode"]))}
    own = table[table["case_id"].isin(weights)]
    rows = own.reindex(columns=[c for c in STEP_COLUMNS if c not in ("count", "ms_per_1000")]).assign(
        mode=own["case_id"].map(modes), layer=own["case_id"].map(layers(own)),
        count=own["case_id"].map(weights).astype("int64"))  # from an empty column of strings too
    missing = [c for c in weights if c not in set(own["case_id"])]
    if missing:
        rows = pd.concat([rows, pd.DataFrame({"case_id": missing, "mode": [modes.get(c) for c in missing],
                                              "count": [weights[c] for c in missing], "status": "not run"})],
                         ignore_index=True)
    rows["ms_per_1000"] = rows["median_us"] * rows["count"] / total
    return rows.reindex(columns=STEP_COLUMNS).reset_index(drop=True)


def engine_of(rows: pd.DataFrame) -> pd.Series:
    """The library an engine picks each row's path as: its backend where that is a library of its own (cuDNN reached
    through FlashInfer's entry points is cuDNN), else the path's library."""
    import pandas as pd

    from swabench.impls import registry

    return pd.Series([b if b != lib and registry.library(b) is not None else lib
                      for lib, b in zip(rows["library"], rows["backend"])], index=rows.index, dtype=object)


def per_thousand_steps(per_step: pd.DataFrame, libraries: tuple[str, ...] = ()) -> pd.DataFrame:
    """From ``steps``: per implementation and backend, milliseconds per 1000 steps of the trace's mix,
    split by the step's mode (empty where the path did not time every step of that mode: the decode
    wrappers run no verify), their sum where it timed every step, and the steps it covered.  Then, per
    library in ``libraries``, and then over every backend together, the best single path per mode (the fastest
    correct path that passed every step of the mode), one such row per layer type where the trace has several,
    with the mix those picks serve (what a server that picks one path per layer type gets), and last the mix
    served at its best, step by step."""
    import pandas as pd

    counts = dict(zip(per_step["case_id"], per_step["count"].astype(int)))
    total = sum(counts.values())
    step_modes = per_step.drop_duplicates("case_id").set_index("case_id")["mode"]
    order = [m for m in MODES if m in set(step_modes)]
    unknown = set(step_modes.index[step_modes.isna()])  # no rows and no mode: it may belong to any mode
    per_mode = {m: set(step_modes.index[step_modes == m]) | unknown for m in order}
    rows = [_path_row(impl, backend, g, per_mode, total)
            for (impl, backend), g in per_step.dropna(subset=["median_us"]).groupby(["impl", "backend"], sort=False)]
    out = pd.DataFrame(rows, columns=["impl", "backend", *(f"{m} ms" for m in order), "all steps ms",
                                      "steps covered"])
    if out.empty:
        return out
    correct = per_step[(per_step["kind"] == "correct") & (per_step["status"] == "pass")].dropna(subset=["median_us"])
    steps_once = per_step.drop_duplicates("case_id").set_index("case_id")
    step_layers = steps_once["layer"].fillna("") if "layer" in steps_once else \
        pd.Series("", index=steps_once.index, dtype=object)
    picked_from = engine_of(correct)
    choices = [(f"{library} path", f"{library}'s picks", correct[picked_from == library]) for library in libraries]
    engine = picked_from != "torch"  # not the suite's own PyTorch paths
    engines = correct[engine]
    if picked_from[engine].nunique() > 1:  # FlashInfer (TRT-LLM's kernels too), cuDNN, FA4, Flex
        choices.append(("path of any backend", "picks over every backend", engines))
    for path, picked, own in choices:
        if not len(own):
            continue
        if step_layers.nunique() <= 1:
            out.loc[len(out)] = {"impl": f"best single {path}", **_totals(*_best_single(own, per_mode), per_mode,
                                                                          counts)}
            continue
        picks = []
        for layer in step_layers.unique():
            ids = set(step_layers.index[step_layers == layer])
            scope = {m: steps & ids for m, steps in per_mode.items()}
            row, said = _best_single(own[own["case_id"].isin(ids)], {m: s for m, s in scope.items() if s})
            picks.append((layer, row, said))
            out.loc[len(out)] = {"impl": f"best single {path}, {layer}",
                                 **_totals({f"{m} ms": row.get(f"{m} ms", float("nan")) for m in per_mode}, said,
                                           scope, counts, {c: counts[c] for c in ids})}
        mixed = {f"{m} ms": sum(row.get(f"{m} ms", 0.0) for _, row, _ in picks) for m in per_mode}
        out.loc[len(out)] = {"impl": f"{picked}, one path per layer type",
                             **_totals(mixed, [f"{layer}: {', '.join(said)}" for layer, _, said in picks], per_mode,
                                       counts)}
    out.loc[len(out)] = {"impl": SERVED, **_totals(*_served(correct, per_step, per_mode), per_mode, counts)}
    return out


def _path_row(impl, backend, g, per_mode: dict[str, set], total: int) -> dict:
    covered = int(g["count"].sum())
    row = {"impl": impl, "backend": backend}
    for m, ids in per_mode.items():
        own = g[g["mode"] == m]
        row[f"{m} ms"] = float(own["ms_per_1000"].sum()) if set(own["case_id"]) == ids else float("nan")
    row["all steps ms"] = sum(row[f"{m} ms"] for m in per_mode) if covered == total else float("nan")
    row["steps covered"] = f"{covered}/{total}"
    return row


def _best_single(correct: pd.DataFrame, per_mode: dict[str, set]) -> tuple[dict, list[str]]:
    """Per mode, the fastest path of ``correct`` (its passing rows) that passed every step of the mode."""
    row, said = {}, []
    for m, ids in per_mode.items():
        sums = correct[correct["mode"] == m].groupby(["impl", "backend"], sort=False).agg(
            steps=("case_id", "nunique"), ms=("ms_per_1000", "sum"))
        whole = sums[sums["steps"] == len(ids)]
        if len(whole):
            impl, backend = whole["ms"].idxmin()
            row[f"{m} ms"] = float(whole["ms"].min())
            said.append(f"{m}: {impl} [{backend}]")
        else:
            row[f"{m} ms"] = float("nan")
            said.append(f"{m}: no one path passed every step")
    return row, said


def _served(correct: pd.DataFrame, per_step: pd.DataFrame, per_mode: dict[str, set]) -> tuple[dict, list[str]]:
    """Each step served by the fastest correct path that passed it; a mode is empty where one of its
    steps had none, and says which."""
    fastest = correct.sort_values("median_us").drop_duplicates("case_id").set_index("case_id")
    labels = per_step.drop_duplicates("case_id").set_index("case_id")["case"]
    row, said = {}, []
    for m, ids in per_mode.items():
        unserved = [c for c in per_step["case_id"].drop_duplicates() if c in ids and c not in fastest.index]
        if unserved:
            row[f"{m} ms"] = float("nan")
            said.append(f"{m}: no correct path passed step " + ", ".join(
                f"{c}" + (f" ({labels[c]})" if isinstance(labels.get(c), str) else "") for c in unserved))
            continue
        own = fastest.loc[sorted(ids)]
        row[f"{m} ms"] = float(own["ms_per_1000"].sum())
        used = own.groupby(["impl", "backend"], sort=False)["count"].sum().sort_values(ascending=False, kind="stable")
        said.append(f"{m}: " + ", ".join(f"{i} [{b}] {n}/{used.sum()}" for (i, b), n in used.items()))
    return row, said


def _totals(row: dict, said: list[str], per_mode: dict[str, set], counts: dict[str, int],
            scope: dict[str, int] | None = None) -> dict:
    """An aggregate row: what serves each mode in the backend column, the sum where every step in ``scope``
    (a layer type's steps; the whole trace by default) has a time, and the steps of the trace it fills."""
    filled = {c for m, ids in per_mode.items() if row[f"{m} ms"] == row[f"{m} ms"] for c in ids}
    covered = sum(counts[c] for c in filled)
    whole = covered == sum((scope or counts).values())
    return {**row, "backend": "; ".join(said), "steps covered": f"{covered}/{sum(counts.values())}",
            "all steps ms": sum(row[f"{m} ms"] for m in per_mode if per_mode[m]) if whole else float("nan")}
