"""What each path costs against the others on the same cases: the window's speedup over the naive
custom mask (the headline), every path against the reference path, and the decode wrappers."""

from __future__ import annotations

import pandas as pd

from swabench.analysis import versus
from swabench.impls import registry
from swabench.publish.markdown import markdown_table
from swabench.analysis.derived import with_span
from swabench.publish.sections.base import (FINDINGS, TIE, Run, Section, folded, mode_order, path_of, path_order,
                                            points, ratio, span, span_words, spread)

MEDIAN, CELL = "time / reference (median)", ["mode", "storage", "window (keys)"]


def _headline_cells(table: pd.DataFrame) -> pd.DataFrame:
    """The headline's medians as numbers, one row per mode, window and path."""
    t = with_span(versus.headline_paths(table.dropna(subset=["median_us", "speedup_vs_mask"])))
    return t.groupby(["mode", "span", "impl"], sort=False)["speedup_vs_mask"].median().reset_index()


def headline(run: Run) -> pd.DataFrame:
    """Speedup of the headline paths (the reference library's window and trim paths) over their
    baseline, per mode and window: the median over the run's cases, with the cases each cell holds."""
    t = with_span(versus.headline_paths(run.table.dropna(subset=["median_us", "speedup_vs_mask"])))
    if t.empty:
        return pd.DataFrame()
    grid = t.groupby(["mode", "span", "impl"])["speedup_vs_mask"].agg(["median", "count"]).reset_index()
    grid["cell"] = grid.apply(lambda r: f"{r['median']:.1f}x ({int(r['count'])})", axis=1)
    wide = grid.pivot_table(index=["mode", "span"], columns="impl", values="cell", aggfunc="first")
    wide = wide.reset_index().sort_values(["mode", "span"], key=mode_order)
    cols = ["mode", "span"] + sorted(set(t["impl"]), key=registry.order)
    return wide[cols].rename(columns={"span": "window (keys)"})


def _speedup(cell: pd.Series) -> str:
    return f"{cell['speedup_vs_mask']:.1f}x ({cell['mode']}, {span_words(cell['span'])})"


def _against_mask(c: pd.DataFrame) -> str:
    """One path's headline cells in words: the least and the most (said once where they read alike), and whether it
    is faster than the custom mask in them."""
    lo, hi = c.loc[c["speedup_vs_mask"].idxmin()], c.loc[c["speedup_vs_mask"].idxmax()]
    slower, cells = int((c["speedup_vs_mask"] < 1).sum()), len(c)
    if cells == 1:
        value = _speedup(lo)
    elif f"{lo['speedup_vs_mask']:.1f}" == f"{hi['speedup_vs_mask']:.1f}":
        value = f"{lo['speedup_vs_mask']:.1f}x"
    else:
        value = f"{_speedup(lo)} to {_speedup(hi)}"
    every = " in every cell" if cells > 1 else ""
    if not slower:
        return f"{value} faster than the custom mask{every}"
    if slower == cells:
        return f"{value}, slower than the custom mask{every}"
    return f"{value} over the custom mask; slower than it in {slower} of {cells} cells"


def headline_said(run: Run) -> list[str]:
    cells = _headline_cells(run.table)
    said = [(f"`{impl}`", f"{_against_mask(cells[cells['impl'] == impl])} ({run.name}).")
            for impl in sorted(set(cells["impl"]), key=registry.order)]
    return ["\n".join(folded(said))] if said else []


def headline_caption() -> str:
    ref = registry.reference_path("paged") or registry.reference_path("ragged")
    if ref is None:
        return ""
    baselines = sorted({i.name for i in registry.all_implementations()
                        if i.baseline and i.library == registry.get(ref[0]).library})
    return (f"Median over a run's cases of the baseline's time ({', '.join(f'`{b}`' for b in baselines)}: the "
            f"custom-mask path of the same storage, same case) / the path's time, on {ref[1]}; window = keys a "
            f"query sees (W + 1); (n) = cases in the cell.")


def against_reference_long(table: pd.DataFrame) -> pd.DataFrame:
    """versus.against_reference summarised per mode, storage, window and path: median, best and worst
    time / the reference path's time over the cases; the reference library's baselines are left out."""
    per_point = with_span(versus.against_reference(table, baselines=False))
    if per_point.empty:
        return pd.DataFrame()
    keys = ["mode", "storage", "span", "impl", "backend"]
    r = per_point.groupby(keys)["ratio"]
    out = r.agg(cases="count", median="median", best="min", worst="max")
    out["faster in"] = r.apply(lambda x: f"{int((x < 1).sum())}/{len(x)}")
    out = out.reset_index()
    return out.sort_values(keys, key=mode_order).rename(columns={"span": "window (keys)",
                                                                 "median": MEDIAN}).reset_index(drop=True)


def against_reference(run: Run) -> pd.DataFrame:
    """One row per mode, storage and window, one column per path: median (best-worst, cases)."""
    v = against_reference_long(run.table)
    if not len(v):
        return pd.DataFrame()
    v = v.assign(path=path_of(v))
    v["cell"] = [ratio(m) if n == 1 else f"{ratio(m)} ({ratio(b)}-{ratio(w)}, {n})" if ratio(b) != ratio(w) else
                 f"{ratio(m)} (each of {n})" for m, b, w, n in zip(v[MEDIAN], v["best"], v["worst"], v["cases"])]
    wide = v.pivot_table(index=CELL, columns="path", values="cell", aggfunc="first", sort=False).reset_index()
    wide = wide.sort_values(CELL, key=mode_order)
    return wide[CELL + sorted(set(v["path"]), key=path_order)].fillna("")


def against_reference_said(run: Run) -> list[str]:
    v = against_reference_long(run.table)
    if not len(v):
        return []
    v = v.assign(path=path_of(v))
    uniform: dict[str, list[str]] = {}  # paths with one verdict in every cell, by that verdict
    mixed = []
    for path in sorted(set(v["path"]), key=path_order):
        p = v[v["path"] == path]
        name, verdicts = f"`{p['impl'].iloc[0]}` [{p['backend'].iloc[0]}]", _verdicts(p)
        if len(verdicts) == 1:
            uniform.setdefault(verdicts[0][0], []).append(f"{name} ({span(verdicts[0][1][MEDIAN])})")
        else:
            mixed.append(f"- {name}: " + "; ".join(f"{word} in {_cells(list(g[CELL].itertuples(index=False)), len(p))} "
                                                   f"({span(g[MEDIAN])})" for word, g in verdicts) + f" ({run.name}).")
    lines = mixed + [f"- {word[0].upper()}{word[1:]} in every cell: {', '.join(paths)} ({run.name})."
                     for word, paths in uniform.items()]
    return ["\n".join(lines), _resolved(versus.against_reference(run.table, baselines=False), run)]


def _cells(keys: list[tuple], every: int) -> str:
    """'every cell', or 'extend paged at 128/1024 keys, verify ragged at 128 keys' from (mode, storage,
    window) keys, grouped so that a sentence stays short."""
    if len(keys) == every:
        return "every cell"
    grouped: dict[tuple, list] = {}
    for mode, storage, window in keys:
        grouped.setdefault((mode, storage), []).append(window)
    return ", ".join(f"{mode} {storage} " + " and ".join(
        ([f"at {'/'.join(w for w in ws if w.isdigit())} keys"] if any(w.isdigit() for w in ws) else [])
        + [span_words(w) for w in ws if not w.isdigit()]) for (mode, storage), ws in grouped.items())


def _verdicts(p: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """One path's cells where it is faster than the reference, the same, slower (those it has)."""
    groups = (("faster", p[p[MEDIAN] < 1 - TIE]), (f"the same within {TIE:.0%}", p[(p[MEDIAN] - 1).abs() <= TIE]),
              ("slower", p[p[MEDIAN] > 1 + TIE]))
    return [(word, g) for word, g in groups if len(g)]


def _resolved(v: pd.DataFrame, r: Run) -> str:
    """Which backend a choice such as `auto` ran on (resolved_backend, when it names another backend
    of the table), so a reader knows what its column measures."""
    said = []
    chosen = v[(v["backend"] != v["resolved_backend"]) & v["resolved_backend"].isin(set(v["backend"]))]
    for backend, g in chosen.groupby("backend"):
        ran, total = g["resolved_backend"].value_counts(), int((v["backend"] == backend).sum())
        said.append(f"`{backend}` ran on {ran.index[0]} on all {total} of its points in the table below"
                    if ran.iloc[0] == total else
                    f"`{backend}` ran on " + ", ".join(f"{b} ({points(n)})" for b, n in ran.items())
                    + f" of its {total} points in the table below")
    return f"{'; '.join(said)} ({r.name})." if said else ""


def _numeric_first(text: str) -> tuple:
    """Sort key: plain numbers in numeric order, then summaries of per-request mixes."""
    return (0, int(text), "") if text.isdigit() else (1, 0, text)


def decode_against_reference(table: pd.DataFrame) -> pd.DataFrame:
    """versus.against_reference's decode rows of plain cases, with ``path`` ('impl [backend]') and
    ``context`` (the keys before the query, however the case gave them)."""
    per_point = with_span(versus.against_reference(versus.plain(table), baselines=False))
    per_point = per_point[per_point["mode"] == "decode"]
    uniform = per_point["prefix_len"].fillna(per_point["seq_len"] - 1)
    drawn = per_point.reindex(columns=["length_dist"])["length_dist"].astype(object).fillna("").astype(str) \
        .str.replace(r"^prefix_len=", "", regex=True)  # a drawn seq_len keeps its name: it counts the query too
    context = [str(int(u)) if u == u else d for u, d in zip(uniform, drawn)]  # a per-request mix by its summary
    return per_point.assign(path=path_of(per_point),
                            context=context)


def decode(run: Run) -> pd.DataFrame:
    """Decode steps per window and context: the reference path's median time, and each decode path's
    time / the reference's on the same cases (median (best-worst, cases) over batch, page size, GQA
    group and head_dim).  Cases with sinks, a soft-cap or an fp8 cache are left to the feature table."""
    per_point = decode_against_reference(run.table)
    if per_point.empty:
        return pd.DataFrame()
    index = ["span", "context"]
    cells = per_point.groupby(index + ["path"])["ratio"].apply(spread).reset_index()
    wide = cells.pivot_table(index=index, columns="path", values="ratio", aggfunc="first").reset_index()
    reference = per_point.groupby(index)["reference_us"].median().rename("reference us (median)").reset_index()
    wide = reference.merge(wide, on=index)
    wide = wide.sort_values(index, key=lambda c: c.map(_numeric_first) if c.name == "context" else mode_order(c)) \
        .reset_index(drop=True)
    columns = index + ["reference us (median)"] + sorted(set(per_point["path"]), key=path_order)
    return wide[columns].rename(columns={"span": "window (keys)"}).fillna("")


def decode_said(run: Run) -> list[str]:
    per_point = decode_against_reference(run.table)
    said = [f"`{impl}` [{backend}] {spread(g['ratio'])}"
            for (impl, backend), g in sorted(per_point.groupby(["impl", "backend"]),
                                             key=lambda kv: (registry.order(kv[0][0]), kv[0][1]))]
    return [f"- Time / the reference's over each path's decode points, median (least-most, points): "
            f"{'; '.join(said)} ({run.name})."] if said else []




PEER_BATCH, PEER_CONTEXT, PEER_BOUND = 32, 8192, 10  # where a peer is held to 10x the reference (serving sizes)
LAYOUT = "layout (one case)"


def peer_points(table: pd.DataFrame) -> pd.DataFrame:
    """Per point: every correct path of a library other than the reference paths', against the reference."""
    library = versus.reference_library()
    per_point = versus.against_reference(table)
    return per_point[per_point["library"] != library]


def at_serving_sizes(per_point: pd.DataFrame) -> pd.DataFrame:
    """The decode and verify points a peer is held to 10x at: batch >= 32, context >= 8k."""
    context = per_point["prefix_len"].fillna(per_point["seq_len"] - 1) if "seq_len" in per_point \
        else per_point["prefix_len"]
    return per_point[per_point["mode"].isin(("decode", "verify")) & (per_point["batch_size"] >= PEER_BATCH)
                     & (context >= PEER_CONTEXT)]


def peers(run: Run) -> pd.DataFrame:
    """Each peer per mode: its time / the reference path's (median over cases), how often it comes within
    10x at serving sizes (batch >= 32, context >= 8k, decode and verify), and how it was laid out."""
    p = peer_points(run.table)
    if p.empty:
        return pd.DataFrame()
    rows = []
    for (impl, mode), g in p.groupby(["impl", "mode"]):
        big = at_serving_sizes(g)
        layouts = g["layout"].dropna()
        rows.append({"peer": impl, "mode": mode, MEDIAN: spread(g["ratio"]),
                     f"within {PEER_BOUND}x at batch >= {PEER_BATCH}, context >= {PEER_CONTEXT // 1024}k":
                         f"{int((big['ratio'] <= PEER_BOUND).sum())} of {len(big)}" if len(big) else "",
                     LAYOUT: layouts.iloc[0] if len(layouts) else ""})
    out = pd.DataFrame(rows)
    return out.sort_values(["peer", "mode"], key=lambda c: c.map(registry.order) if c.name == "peer"
                           else mode_order(c)).reset_index(drop=True)


def peers_said(run: Run) -> list[str]:
    """What the page table costs FlexAttention: flex-window / flex-contiguous on the same cases."""
    t = run.table[(run.table["status"] == "pass") & run.table["median_us"].notna()]
    paged = t[t["impl"] == "flex-window"].set_index("case_id")["median_us"]
    dense = t[t["impl"] == "flex-contiguous"].set_index("case_id")["median_us"]
    both = paged.index.intersection(dense.index)
    if not len(both):
        return []
    r = (paged[both] / dense[both]).rename("ratio").to_frame().join(t.drop_duplicates("case_id").set_index("case_id")["mode"])
    parts = [f"{mode} {spread(g['ratio'])}" for mode, g in r.groupby("mode", sort=False)]
    return [f"- What the page table costs FlexAttention (`flex-window` / `flex-contiguous` on the same cases): "
            f"{', '.join(parts)} ({run.name})."]


def peers_across(runs: list[Run]) -> list[str]:
    """Every run's peers in one table, each peer's layout on a step said once, in the first row that has it."""
    said = [s for r in runs for s in peers_said(r)]
    frames = [f.assign(run=r.name) for r in runs if len(f := peers(r))]
    if not frames:
        return said
    table = pd.concat([f[["run", *f.columns[:-1]]] for f in frames], ignore_index=True)
    told = table.assign(told=table[LAYOUT] != "").groupby(["peer", "mode"])["told"].cumsum()
    table[LAYOUT] = table[LAYOUT].where((table[LAYOUT] != "") & (told == 1), "")
    return said + [markdown_table(table)]


REBUILT = {"flex-flat": "flex-window"}  # a peer rebuilt since older runs: its old form -> the name it has now


def peers_rebuilt(runs: list[Run]) -> list[str]:
    """A peer rebuilt since an older run of the same scenario: the old form's time / reference beside the
    new one's, per mode, on the cases both ran (the first older run given, for each newer one)."""
    said = []
    for old_name, new_name in REBUILT.items():
        for new in runs:
            n = peer_points(new.table)
            n = n[n["impl"] == new_name]
            older = [o for o in runs if o is not new and o.meta.get("scenario") == new.meta.get("scenario")]
            for old in older:
                o = peer_points(old.table)
                o = o[(o["impl"] == old_name) & o["case_id"].isin(n["case_id"])].sort_values("mode", key=mode_order)
                if o.empty:
                    continue
                cells = [f"{mode} {spread(g['ratio'])} then {spread(n[n['case_id'].isin(g['case_id'])]['ratio'])}"
                         for mode, g in o.groupby("mode", sort=False)]
                said.append(f"- `{old_name}` ({old.name}) then `{new_name}` ({new.name}), time / reference on the "
                            f"{o['case_id'].nunique()} cases both ran: {'; '.join(cells)}.")
                break
    return said


TOPIC = "Speed: the window against the mask, the reference path and the peers"

SECTIONS = [
    Section("headline", "Headline: speedup over the custom-mask path", headline_caption, headline, headline_said,
            timed=True),
    Section("against-reference", lambda: f"Against the reference path ({registry.describe_reference()})",
            "Time of each path / time of the reference path of its storage on the same case; below 1 is faster. "
            "A cell is the median over the run's cases, with (best-worst, cases) where it holds more than one; "
            f"a median within {TIE:.0%} of 1 counts as the same time. The reference library's custom-mask "
            "baselines are in the headline instead.", against_reference, against_reference_said, timed=True),
    Section("decode", lambda: f"Decode: each wrapper against {registry.describe_reference()}",
            "Time of each decode path / time of the reference path on the same decode step, per window and "
            "context: median (best-worst, cases) over batch, page size, GQA group and head_dim; cases with sinks, a "
            "soft-cap or an fp8 cache are in the feature table.", decode, decode_said, timed=True),
    Section("peers", "Peers: how each is built, and what it costs",
            "Each correct path of another library (FlexAttention, PyTorch SDPA) against the reference path of "
            "its storage on the same cases: time / reference (median (best-worst, cases)), how many of the "
            f"decode and verify cases at batch >= {PEER_BATCH} and context >= {PEER_CONTEXT // 1024}k it serves "
            f"within {PEER_BOUND}x of it, and the layout one of its rows states (`layout`; on this page once a peer "
            "and step, in the first row that states it). Runs of a scenario on older releases stay in this table, so "
            "that a peer rebuilt since shows beside its old numbers (format-5 folders name the flattened "
            "FlexAttention peer `flex-flat`).", peers, peers_said, timed=True, across=peers_across,
            every_release=True),
    Section("peers-rebuilt", "Peers rebuilt: the old numbers beside the new",
            "A peer built differently since an older run of the same scenario, on the cases both runs hold: its "
            "time / the reference path's then and now, median (best-worst, cases) per mode. `flex-flat` is "
            "FlexAttention over one flattened sequence of every query; `flex-window` batches the requests as "
            "FlexAttention's users do.", pages=frozenset({FINDINGS}), timed=True, across=peers_rebuilt,
            every_release=True),
]
