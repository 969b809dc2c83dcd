"""Draft trees verified on sliding-window layers (docs/trees.md): which paths get which rows wrong, as their
semantics predict, and what the correct paths cost against the slot rule on a chain of the same size, where the
slot rule is exact."""

from __future__ import annotations

import pandas as pd

from swabench.analysis import versus
from swabench.core import trees
from swabench.impls.recipes import sglang_refuses
from swabench.publish.markdown import library_versions
from swabench.publish.sections.base import (Run, Section, figure_link, micros, of, path_of, path_order, ranged,
                                            ratio, topic_link)

SLOT = "tree-window-slot"  # the kernel's own window with a tree mask: exact on chains, timed there
CORRECT = ("tree-trim-depth", "tree-mask-depth", "tree-branches", "tree-branches-sink", "sglang-fa3-tree")
CHAIN_PATHS = (SLOT, "paged-trim", "sink-window")  # what a chain of the same size costs


def _verify_blocks(run: Run) -> pd.DataFrame:
    """The run's points whose verify block is declared a tree (a chain among them)."""
    t = run.table
    return t[t["tree"].notna()] if "tree" in t else t.iloc[:0]


def is_chain(t: pd.DataFrame) -> pd.Series:
    """Whether each row's tree is a chain, however it was written ('chain', 'eagle:1:D', a list without branches)."""
    shapes = {(spec, n): trees.is_chain(spec, int(n)) for spec, n in set(zip(t["tree"], t["qo_len"]))}
    return pd.Series([shapes[(spec, n)] for spec, n in zip(t["tree"], t["qo_len"])], index=t.index, dtype=bool)


def _yes(column: pd.Series) -> pd.Series:
    return column.astype(str).str.lower() == "true"


def rows_table(run: Run) -> pd.DataFrame:
    """Per path: its points on trees and on chains, its statuses, how many of the points it ran were wrong on
    exactly the rows its semantics predict, the most keys of its window one node misses and the largest share
    of a step's nodes that miss any; or why it skipped."""
    t = _verify_blocks(run)
    if t.empty:
        return pd.DataFrame()
    t = t.assign(path=path_of(t))
    rows = []
    for path, g in sorted(t.groupby("path"), key=lambda kv: path_order(kv[0])):
        ran = g[g["status"] != "skip"]
        predicted = ran["rows_as_predicted"].dropna()
        rows.append({"path": path, "kind": g["kind"].iloc[0],
                     "tree points": int((~is_chain(g)).sum()), "chain points": int(is_chain(g).sum()),
                     **{s: int((g["status"] == s).sum()) for s in ("pass", "xfail", "xpass", "fail", "skip")},
                     "rows as predicted": f"{int(_yes(predicted).sum())} of {len(predicted)}" if len(predicted) else "",
                     "most keys lost": int(ran["keys_lost"].max()) if len(ran) and ran["keys_lost"].max() > 0 else "",
                     "nodes losing keys": f"{ran['rows_losing'].max():.0%}" if len(ran) and ran["rows_losing"].max() > 0
                     else "",
                     "why it skips": "; ".join(dict.fromkeys(g["reason"])) if ran.empty else ""})
    return pd.DataFrame(rows)


def layer_of(t: pd.DataFrame) -> pd.Series:
    """Each row's layer as the pages name it: the model (or its heads), sinks, and the window."""
    heads = "h" + t["num_qo_heads"].astype(str) + "/" + t["num_kv_heads"].astype(str) + " d" + t["head_dim"].astype(str)
    layer = t["model"].astype(object).where(t["model"].notna(), heads) if "model" in t else heads
    return layer + _yes(t["sinks"]).map({True: " sinks", False: ""}) + " W" + t["window_left"].astype(str)


def _shape(t: pd.DataFrame) -> pd.Series:
    """A step's layer and shape, as a row of the cost table names it: its layer, batch, context and page size."""
    return (layer_of(t) + " b" + t["batch_size"].astype(str) + " p" + t["prefix_len"].astype("Int64").astype(str)
            + " ps" + t["page_size"].astype("Int64").astype(str))


def cost_table(run: Run) -> pd.DataFrame:
    """Per tree step: each correct path's time, and the chain of the same size timed through the slot rule (exact
    there) and through the chain paths without a custom mask; the cheapest correct path's time / the slot rule's,
    and / the fastest path of the chain."""
    t = _verify_blocks(run)
    t = t[(t["status"] == "pass") & t["median_us"].notna()]
    if t.empty or not (~is_chain(t)).any():
        return pd.DataFrame()
    t = t.assign(_twin=versus.twin_key(t, "tree"), step=_shape(t), path=path_of(t))
    chains = t[is_chain(t) & t["impl"].isin(CHAIN_PATHS)].pivot_table(index="_twin", columns="path",
                                                                        values="median_us", aggfunc="first")
    rows = []
    for (step, tree), g in t[~is_chain(t)].groupby(["step", "tree"], sort=False):
        correct = g[g["impl"].isin(CORRECT)].sort_values("median_us")
        if correct.empty:
            continue
        twin = chains.loc[g["_twin"].iloc[0]].dropna() if g["_twin"].iloc[0] in chains.index else pd.Series(dtype=float)
        slot = next((v for p, v in twin.items() if p.startswith(SLOT)), None)
        best = correct["median_us"].iloc[0]
        rows.append({"step": step, "tree": trees.label(tree), "nodes": int(g["qo_len"].iloc[0]),
                     **{p: v for p, v in zip(correct["path"], correct["median_us"])},
                     **{f"chain: {p}": v for p, v in twin.items()},
                     "cheapest correct / the slot rule on the chain": ratio(best / slot) if slot else "",
                     "cheapest correct / the chain's fastest": ratio(best / twin.min()) if len(twin) else ""})
    if not rows:
        return pd.DataFrame()
    table = pd.DataFrame(rows)
    timed = sorted((c for c in table.columns if " [" in c), key=lambda c: (c.startswith("chain: "),
                                                                           path_order(c.removeprefix("chain: "))))
    table[timed] = table[timed].apply(lambda col: col.map(lambda v: micros(v) if v == v else ""))
    return table[["step", "tree", "nodes", *timed, *[c for c in table.columns if c.startswith("cheapest")]]]


def ratios_to_slot(run: Run, impl: str) -> pd.Series:
    """``impl``'s time on each tree step / the slot rule's on the chain of the same size."""
    t = _verify_blocks(run)
    t = t[(t["status"] == "pass") & t["median_us"].notna() & (t["backend"] == "fa2")]
    t = t.assign(_twin=versus.twin_key(t, "tree"))
    slot = t[is_chain(t) & (t["impl"] == SLOT)].set_index("_twin")["median_us"]
    own = t[~is_chain(t) & (t["impl"] == impl)]
    return (own["median_us"] / own["_twin"].map(slot).astype(float)).dropna()


def findings(run: Run) -> list[str]:
    """What the gate found on the tree points: each mistake wrong where its semantics predict, each correct path
    passing, and what the cheapest correct path costs."""
    t = _verify_blocks(run)
    if t.empty:
        return []
    said, release = [], library_versions(run.meta)
    for impl, g in t[t["kind"] != "correct"].groupby("impl", sort=False):
        ran = g[g["status"] != "skip"]
        chain = is_chain(ran)
        wrong = int((ran[~chain]["status"] == "xfail").sum())
        lost = ran.loc[ran["status"] == "xfail"]
        losses = (f"; where wrong, a node misses up to {int(lost['keys_lost'].max())} keys of its window and up to "
                  f"{lost['rows_losing'].max():.0%} of a step's nodes miss some"
                  if len(lost) and lost["keys_lost"].max() > 0 else "")
        chains = f" and {of(int((ran[chain]['status'] == 'xfail').sum()), int(chain.sum()), 'chain')}" \
            if chain.any() else ""
        said.append(f"`{impl}` is wrong on {of(wrong, int((~chain).sum()), 'tree point')}{chains}; on "
                    f"{of(int(_yes(ran['rows_as_predicted']).sum()), len(ran))} the rows it got wrong are "
                    f"exactly the ones its semantics predict{losses} ({release}, {run.name}).")
    recipe = t[t["impl"] == "sglang-verify-tree"]
    if "model" in recipe and recipe["model"].notna().any():  # a run of the served models, not of bare shapes
        said.append("`sglang-verify-tree` is SGLang's EAGLE target verify on SWA layers, which sglang#39160 (closed) "
                    "and sglang#39287 (open) report in words; the latter proposes the trimmed table and depth mask "
                    "`tree-trim-depth` measures. SGLang runs it on Gemma 2 and 3 alone: it refuses its FlashInfer "
                    "backend for GPT-OSS and runs Mistral's layers as full attention, so the answer counts Gemma's "
                    "points (docs/trees.md).")
    correct = t[t["kind"] == "correct"]
    failed = correct[correct["status"] == "fail"]
    ran = correct[correct["status"] != "skip"]
    said.append(f"{len(failed)} of {len(ran)} points of the correct paths fail ({run.name})." if len(failed) else
                f"Every correct path passes every tree and chain point it ran ({len(ran)} points, {run.name}).")
    trim = trim_cost(run)
    if trim:
        said.append(f"`tree-trim-depth` [fa2] takes {trim} the slot rule's time on the chain of the same size, where "
                    f"the slot rule is exact ({run.name}).")
    return said


def trim_cost(run: Run) -> str:
    """'1.02x (0.99-1.07, 36 tree steps)': tree-trim-depth's time on each tree step / the slot rule's on its chain."""
    r = ratios_to_slot(run, "tree-trim-depth")
    return f"{ratio(r.median())}x ({ranged(r)}, {len(r)} tree steps)" if len(r) else ""


def bytes_table(run: Run) -> pd.DataFrame:
    """Per path, under Nsight Compute: DRAM bytes read / the bytes the window needs, median (least-most), over its
    tree and chain points."""
    t = _verify_blocks(run)
    if t.empty or "read_amplification" not in t or t["read_amplification"].isna().all():
        return pd.DataFrame()
    t = t[t["read_amplification"].notna()].assign(path=path_of(t))
    rows = [{"path": path, "on": "chains" if chain else "trees", "points": len(g),
             "DRAM read / needed": f"{ratio(g['read_amplification'].median())}x ({ranged(g['read_amplification'])})"}
            for (path, chain), g in t.groupby(["path", is_chain(t)])]
    return pd.DataFrame(rows).sort_values("path", key=lambda c: c.map(path_order), kind="stable")


def across_releases(runs: list[Run]) -> list[str]:
    """Per release set that ran the slot rule: the releases where it was caught, out of those it ran on."""
    from swabench.publish.sections.releases import release_sets

    said = []
    for library, group in release_sets(runs):
        ran = [(r, r.table[(r.table["impl"] == SLOT) & (r.table["status"] != "skip")]) for r in group]
        ran = [(r, g) for r, g in ran if len(g)]
        if len(ran) < 2:
            continue
        caught = [(r.meta.get("libraries") or {}).get(library) for r, g in ran if (g["status"] == "xfail").any()]
        wrong = {frozenset(g.loc[g["status"] == "xfail", "case_id"]) for _, g in ran}
        said.append(f"The slot rule is caught on {len(caught)} of the {len(ran)} {library} releases it ran on "
                    f"({', '.join(map(str, caught))}), " + ("the same points on each" if len(wrong) == 1 else
                                                           "not the same points on each") + " ("
                    + ", ".join(r.name for r, _ in ran) + ").")
    return said


def answer(runs: list[Run]) -> list[str]:
    """The findings' answer for draft trees, from the run that timed the most tree points, with its figure."""
    timed = [(int(_verify_blocks(r)["median_us"].notna().sum()), -i, r) for i, r in enumerate(runs)
             if r.timed and not r.profiled]
    best = max(timed, key=lambda x: x[:2], default=None)
    if not best or not best[0]:
        return []
    said = in_short(best[2])
    lead = f"**Draft trees**, EAGLE/MTP with topk > 1 ({topic_link(__name__)}):\n"
    return [lead + "\n".join(f"- {s}" for s in said), figure_link(best[2], "tree_cost")] if said else []


def in_short(run: Run) -> list[str]:
    """What the slot rule and SGLang's recipe get wrong on ``run``, and what the correct paths cost."""
    t = _verify_blocks(run)
    said = []
    slot = t[(t["impl"] == SLOT) & (t["status"] != "skip")]
    if len(slot):
        wrong, chain = slot[slot["status"] == "xfail"], is_chain(slot)
        inside = slot[~chain & (slot["prefix_len"] + slot["qo_len"] - 1 <= slot["window_left"])]
        losses = (f" (up to {wrong['rows_losing'].max():.0%} of a step's nodes, each missing up to "
                  f"{int(wrong['keys_lost'].max())} keys)" if len(wrong) else "")
        said.append(f"FlashInfer's window with a tree mask sits by a node's slot, not its depth (`{SLOT}`): wrong on "
                    f"{len(wrong)} of {int((~chain).sum())} tree points, on exactly the predicted rows on "
                    f"{int(_yes(slot['rows_as_predicted']).sum())} of {len(slot)}{losses}; right on "
                    f"{int((slot[chain]['status'] == 'pass').sum())} of {int(chain.sum())} chains and "
                    f"{int((inside['status'] == 'pass').sum())} of {len(inside)} trees inside the window "
                    f"({library_versions(run.meta)}, {run.name}).")
    recipe = t[(t["impl"] == "sglang-verify-tree") & (t["status"] != "skip")]
    if "model" in recipe:  # the models SGLang runs through that path (its FlashInfer backend, SWA layers)
        recipe = recipe[recipe["model"].fillna("").map(lambda m: sglang_refuses(m) is None)]
    if len(recipe):
        past = recipe[recipe["prefix_len"] > recipe["window_left"]]
        caught, wrong = int((past["status"] == "xfail").sum()), int((recipe["status"] == "xfail").sum())
        models = ", ".join(sorted(set(recipe["model"].dropna()))) if "model" in recipe else ""
        beyond = f"all {caught}" if caught == len(past) else f"{caught} of the {len(past)}"
        said.append(f"SGLang's EAGLE verify on an SWA layer (`sglang-verify-tree`{f', {models}' if models else ''}) "
                    f"is wrong on {wrong} of {len(recipe)} points, {beyond} past the window, chains too: greedy "
                    f"speculative output can differ from non-speculative ({run.name}).")
    trim = trim_cost(run)
    sink = t[(t["impl"] == "tree-sink-mask") & (t["status"] != "skip")]
    branches = t[(t["impl"] == "tree-branches-sink") & (t["status"] == "pass") & ~is_chain(t)]
    sinks = (f"on a sink layer the sink wrapper drops the tree mask (`tree-sink-mask` wrong on "
             f"{int((sink['status'] == 'xfail').sum())} of {len(sink)}) and `tree-branches-sink` is correct, "
             f"{ranged(branches['median_us'], micros)} us"
             if len(sink) and len(branches) else "")
    if trim or sinks:
        said.append("; ".join(x for x in (f"`tree-trim-depth` [fa2] is correct at {trim} the slot rule's time on a "
                                           f"chain of the same size" if trim else "", sinks) if x)
                    + f" ({run.name}).")
    return said


TOPIC = "Draft trees"

SECTIONS = [
    Section("trees", "Draft trees: which rows each path gets wrong",
            "Verify blocks laid out as draft trees (EAGLE/MTP with topk > 1) and chains of the same size, per path: "
            "points, statuses, on how many of the points it ran its wrong rows were exactly the ones its semantics "
            "predict (a known mistake's: a node whose slot is past its depth, under the slot rule), the most keys of "
            "its window one node misses and the largest share of a step's nodes that miss any; or why it cannot run.",
            rows_table, findings, trees=True),
    Section("tree-releases", "Draft trees on each release", "Where the slot rule was caught, per library release "
            "that ran it.", across=across_releases, every_release=True, trees=True),
    Section("tree-cost", "Draft trees: what the correct paths cost",
            "Per tree step (layer, batch, context, page size): each correct path's kernel time in us on each backend "
            "it ran (FlashInfer's on fa2; SGLang's FA3 call on its own build), the chain of the same size through "
            "the slot rule (where it is exact) and through paged-trim (no custom mask at all), and the cheapest "
            "correct path's time / the slot rule's on that chain.", cost_table, timed=True,
            trees=True),
    Section("tree-bytes", "Draft trees: the bytes each path reads",
            "Under Nsight Compute, per path: DRAM bytes read / the bytes the window needs (Q and the K/V rows some "
            "node sees, once), median (least-most), on trees and on chains of the same size.", bytes_table,
            profiled=True, one_table=True, trees=True),
]
