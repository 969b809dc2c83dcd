"""FlashInfer's Hopper shelf (docs/shelf.md): per step, each kernel family's fastest correct path beside the best
path the prefill, decode and sink wrappers give on the same cases, what it reaches of its floor and what it reads,
and the conventions the gate caught (XQA's window handed as its key count, BatchAttention's trimmed table)."""

from __future__ import annotations

import pandas as pd

from swabench.core.cases import MODES
from swabench.core.footprint import ELEMENT_BYTES
from swabench.impls import registry
from swabench.publish.markdown import library_versions, markdown_table
from swabench.publish.sections.base import (FLOOR, Run, Section, declared_upstream, extent, of, own_mistake_caught,
                                            path_of, points, ranged, ratio)
from swabench.publish.sections.machine import counted_points, trusted
from swabench.store import schema

SHELF = ("xqa", "fmha-v2", "pod", "holistic", "ranges")  # the families the shelf adds, by each path's wrapper
STATUSES = ("pass", "xfail", "xpass", "fail", "crash", "skip")
VS_EXISTING = "its time / the best wrapper path's"  # a column: the shelf path's time / the best existing path's
COVERAGE = 0.5  # a shelf path speaks for a step in the answers where it timed this share of the existing paths' cases


def family(impl: str) -> str:
    """The kernel family a path runs: its wrapper (prefill, decode, sink, recipe, xqa, fmha-v2, ...)."""
    try:
        impl_ = registry.get(impl)
    except KeyError:  # a path a later release of swabench dropped
        return "?"
    return impl_.wrapper or impl_.library


def _steps(t: pd.DataFrame) -> pd.Series:
    """Each row's step: its mode, and the visibility that sets it apart (chunked, blocks, non-causal)."""
    chunk = t["attention_chunk"].fillna(0).astype(int) > 0 if "attention_chunk" in t else False
    block = t["block"].fillna(0).astype(int) > 0 if "block" in t else False
    causal = t["causal"].astype(str).str.lower() != "false" if "causal" in t else True
    return (t["mode"].astype(str) + pd.Series(chunk, index=t.index).map({True: " chunked", False: ""})
            + pd.Series(block, index=t.index).map({True: " blocks", False: ""})
            + pd.Series(causal, index=t.index).map({True: "", False: " non-causal"}))


SHAPE = ("mode", "model", "batch_size", "prefix_len", "window_left", "page_size", "num_qo_heads", "num_kv_heads",
         "head_dim", "dtype", "sinks")  # what a block step and its non-causal twin share, beside the block itself


def _as_blocks(t: pd.DataFrame) -> pd.DataFrame:
    """The non-causal rows whose step is one block of all its queries, no wider than the window, moved onto the
    block step of the same shape: the same keys are seen (docs/semantics.md), so the plain wrappers planned
    causal=False compete there, named '(causal=False)'."""
    if "block" not in t or "qo_len" not in t:
        return t
    key = [c for c in SHAPE if c in t]
    block = t[(t["block"].fillna(0).astype(int) > 0)]
    block = block[block["block"].astype(float) == pd.to_numeric(block["qo_len"], errors="coerce")]
    noncausal = t["step"].str.endswith(" non-causal")
    twins = t[noncausal].reset_index(names="row").merge(
        block[key + ["qo_len", "case_id", "step"]].drop_duplicates(key + ["qo_len"]), on=key + ["qo_len"],
        suffixes=("", "_block"))
    twins = twins[pd.to_numeric(twins["qo_len"], errors="coerce") <= twins["window_left"].astype(float) + 1]
    if twins.empty:
        return t
    moved = twins.assign(case_id=twins["case_id_block"], step=twins["step_block"],
                         path=twins["path"] + " (causal=False)").drop(columns=["row", "case_id_block", "step_block"])
    return pd.concat([t.drop(index=twins["row"]), moved], ignore_index=True)


def _shelf_rows(run: Run) -> pd.DataFrame:
    """The run's FlashInfer rows with their step and family; empty unless some row is on a shelf family."""
    t = run.table
    t = t.assign(family=t["impl"].map(family))
    if not t["family"].isin(SHELF).any():
        return t.iloc[:0]
    t = t[(t["library"] == "flashinfer") if "library" in t else t["family"] != "torch"]
    return _as_blocks(t.assign(step=_steps(t), path=path_of(t)))


def _step_order(step: str) -> tuple:
    mode = step.split()[0]
    return MODES.index(mode) if mode in MODES else len(MODES), step


def families_table(run: Run) -> pd.DataFrame:
    """Per step that a shelf family ran, per family: the fastest correct path (the lowest median time over the
    step's cases, as a multiple of the best existing wrapper's time on each case; a known mistake counts where it
    was timed because its semantics make it exact there), the cases that multiple covers, its median share of the
    floor and DRAM read / needed where the run counted bytes, and the family's statuses there."""
    t = _shelf_rows(run)
    if t.empty:
        return t
    timed = t[t["kind"].isin(("correct", "known-bug")) & (t["status"] == "pass") & t["median_us"].notna()]
    rows = []
    for step in sorted(set(t.loc[t["family"].isin(SHELF), "step"]), key=_step_order):
        here, ran = t[t["step"] == step], timed[timed["step"] == step]
        best = ran[~ran["family"].isin(SHELF) & (ran["kind"] == "correct")].groupby("case_id")["median_us"].min()
        families = sorted(set(here["family"]), key=lambda f: (f not in SHELF, SHELF.index(f) if f in SHELF else 0, f))
        for fam in families:
            mine, g = here[here["family"] == fam], ran[ran["family"] == fam]
            counts = ", ".join(f"{s} {n}" for s in STATUSES if (n := int((mine["status"] == s).sum())))
            row = {"step": step, "family": fam if fam in SHELF else f"{fam} (existing)", "fastest correct path": "",
                   "cases": "", VS_EXISTING: "", FLOOR: "", "DRAM read / needed": "",
                   "statuses": counts}
            if len(g):
                row.update(fastest(g.assign(versus=g["median_us"] / g["case_id"].map(best).astype(float)),
                                   VS_EXISTING))
            elif (mine["status"] == "skip").all() and len(mine):
                row["fastest correct path"] = skipped(mine)
            rows.append(row)
    return pd.DataFrame(rows)


def fastest(g: pd.DataFrame, against: str) -> dict:
    """The cells of the fastest of ``g``'s paths: the lowest median ``versus`` (its time / the best on each case,
    under the column ``against``), the cases that covers, its median share of the floor and DRAM read / needed."""
    per_path = g.groupby("path").agg(versus=("versus", "median"), us=("median_us", "median"),
                                     cases=("versus", "count"))
    pick = per_path.sort_values(["versus", "us"], na_position="last").iloc[0]
    picked = g[g["path"] == pick.name]
    floor = picked["pct_of_floor"].median() if "pct_of_floor" in picked else float("nan")
    amp = picked["read_amplification"].median() if "read_amplification" in picked else float("nan")
    return {"fastest correct path": f"`{pick.name}`", "cases": int(pick["cases"]) or "",
            against: ratio(pick["versus"]) if pick["versus"] == pick["versus"] else "",
            FLOOR: f"{floor:.0f}%" if floor == floor else "",
            "DRAM read / needed": f"{ratio(amp)}x" if amp == amp else ""}


def skipped(rows: pd.DataFrame) -> str:
    """A cell for a family or backend whose every point on a step skipped: the reasons, shortened."""
    why = "; ".join(dict.fromkeys(r for r in rows["reason"].fillna("") if r))
    return f"skips: {why[:160]}" if why else "skips"


def timed_table(run: Run, runs: list[Run], table, said) -> list[str]:
    """Of a timed run (not one made under a profiler): ``said`` and its ``table`` with bytes from its counted twin
    among ``runs``, where the table has rows."""
    if run.profiled or not run.timed:
        return []
    frame = table(with_counted_bytes(run, runs))
    return said(run) + [f"From {run.name}:", markdown_table(frame)] if len(frame) else []


def conventions_said(run: Run) -> list[str]:
    """Per known mistake on a shelf family and step: where the gate caught it (xfail), where its semantics make it
    exact and it was right (pass), where it was not caught (xpass) or wrong though exact (fail), and whether the
    wrong rows were those its semantics predict."""
    t = _shelf_rows(run)
    if t.empty:
        return []
    return mistakes_said(t[(t["kind"] == "known-bug") & t["family"].isin(SHELF) & (t["status"] != "skip")], run)


def mistakes_said(bugs: pd.DataFrame, run: Run) -> list[str]:
    """``conventions_said`` of these known-bug rows (each with its step)."""
    said = []
    for (impl, step), g in sorted(bugs.groupby(["impl", "step"]), key=lambda kv: (kv[0][0], _step_order(kv[0][1]))):
        count = {s: int((g["status"] == s).sum()) for s in ("pass", "xpass", "fail")}
        own = g[own_mistake_caught(g)]
        upstream = declared_upstream(g)[g["status"] == "xfail"].dropna()
        predicted = own["rows_as_predicted"].dropna().astype(str).str.lower() if "rows_as_predicted" in own else []
        rows = f"; the wrong rows as predicted on {int((predicted == 'true').sum())} of {len(predicted)}" \
            if len(predicted) else ""
        said.append(f"- `{impl}`, {step}: caught on {of(len(own), len(g))}"
                    + (f", right on {count['pass']} where its semantics make it exact" if count["pass"] else "")
                    + "".join(f", wrong on {n} where it should be exact, inside upstream bug `{ref}`"
                              for ref, n in upstream.value_counts().items())
                    + (f", NOT caught on {count['xpass']}" if count["xpass"] else "")
                    + (f", wrong on {count['fail']} where it should be exact" if count["fail"] else "")
                    + f"{rows} ({run.name}).")
    return ["\n".join(said)] if said else []


def in_words(pick: tuple[str, str] | None) -> str:
    """A ``shelf_pick`` with its run, as a table cell says it; '' for none."""
    return f"{pick[0]} ({pick[1]})" if pick else ""


def shelf_pick(runs: list[Run], mode: str) -> tuple[str, str] | None:
    """For the answers' step table: of the run that timed the most shelf points on plain causal ``mode`` steps, the
    shelf path with the lowest median time / the best existing path's, over at least COVERAGE of the cases the
    existing paths timed there, with the cases it covers, and that run's name; None where none did."""
    found = []
    for i, r in enumerate(runs):
        t = _shelf_rows(r)
        if t.empty:
            continue
        t = t[(t["step"] == mode) & (t["status"] == "pass") & t["median_us"].notna()]
        best = t[~t["family"].isin(SHELF) & (t["kind"] == "correct")].groupby("case_id")["median_us"].min()
        mine = t[t["family"].isin(SHELF)]
        mine = mine.assign(versus=mine["median_us"] / mine["case_id"].map(best).astype(float)).dropna(subset=["versus"])
        if mine.empty:
            continue
        per_path = mine.groupby("path")["versus"].agg(["median", "count"])
        per_path = per_path[per_path["count"] >= COVERAGE * len(best)]
        if len(per_path):
            found.append((len(mine), -i, r, per_path.sort_values("median").iloc[0]))
    if not found:
        return None
    _, _, run, pick = max(found, key=lambda x: x[:2])
    return f"`{pick.name}` {ratio(pick['median'])}x over {points(int(pick['count']))}", run.name


def with_counted_bytes(run: Run, runs: list[Run]) -> Run:
    """``run`` with each point's DRAM read / needed from the trusted Nsight Compute runs of the same scenario, GPU,
    releases and L2 state (a counted run's own times are lengthened by the profiler: the times stay the timed
    run's); where two counted one point, the first given."""
    l2 = (run.meta.get("selection") or {}).get("l2", "cold")
    counted = [counted_points(r.table) for r in runs if r.profiled and trusted(r)
               and r.meta.get("scenario") == run.meta.get("scenario") and r.meta.get("gpu") == run.meta.get("gpu")
               and library_versions(r.meta) == library_versions(run.meta)
               and (r.meta.get("counters") or {}).get("l2", "cold") == l2]
    counted = [c for c in counted if len(c) and "read_amplification" in c]
    if not counted:
        return run
    found = pd.concat([c[[*schema.KEY, "read_amplification"]] for c in counted]).drop_duplicates(list(schema.KEY))
    table = run.table.drop(columns=["read_amplification"], errors="ignore").merge(found, on=list(schema.KEY),
                                                                                   how="left")
    return Run(run.folder, table, run.meta)


def xqa_tiles_said(run: Run) -> list[str]:
    """XQA's counted decode reads against its tile rule (``xqa.tokens_read``): K and V of the tokens the rule says
    each request's KV heads load, beside what the window needs."""
    from swabench.impls import xqa

    t = counted_points(run.table)
    if t.empty or not {"prefix_len", "length_dist", "kv_dtype", "num_kv_heads"} <= set(t):
        return []
    width = t["kv_dtype"].fillna(t["dtype"]).map(ELEMENT_BYTES)  # an fp8 cache runs mha_sm90.cu: other tiles
    t = t[(t["impl"] == "xqa-window") & (t["mode"] == "decode") & t["length_dist"].isna() & (width == 2)
          & t["read_amplification"].notna()]
    if t.empty:
        return []
    kv_len = t["prefix_len"].astype(int) + 1
    tokens = [xqa.tokens_read(n, int(w)) for n, w in zip(kv_len, t["window_left"])]
    side = t["batch_size"] * t["num_kv_heads"] * t["head_dim"] * width[t.index]
    said = (t["dram_read_bytes"] / (2 * side * pd.Series(tokens, index=t.index))).sort_values()
    span = extent(f"{said.iloc[0]:.2f}", f"{said.iloc[-1]:.2f}") + "x"
    return [f"XQA's decode reads against its 256-token tile rule (docs/shelf.md): DRAM read / the rule's K and V "
            f"{span} over {points(len(said))}, at contexts {', '.join(map(str, sorted(set(kv_len))))} and windows "
            f"{', '.join(str(w + 1) for w in sorted(set(t['window_left'])))}, where the read / needed is "
            f"{ranged(t['read_amplification'], '{:.2f}'.format)}x ({run.name})."]


def across(runs: list[Run]) -> list[str]:
    """The findings page's section: per timed run that holds the shelf, its table (bytes from its counted twin) and
    the conventions caught; per counted run, XQA's reads against its tile rule."""
    return [s for r in runs for s in (xqa_tiles_said(r) if r.profiled else []) +
            timed_table(r, runs, families_table, conventions_said)]


TOPIC = "FlashInfer's Hopper shelf"

SECTIONS = [
    Section("shelf", "FlashInfer's Hopper shelf",
            "Per step, each kernel family FlashInfer ships for Hopper beyond the prefill, decode and sink wrappers "
            "(TRT-LLM's XQA and fmha v2, POD, the holistic BatchAttention kernel, the bidirectional-range wrapper; "
            "docs/shelf.md), beside the existing wrappers on the same cases: the family's fastest correct path, the "
            "cases it timed, the median of its time / the best existing path's on each case, its median share of "
            "the floor, DRAM read / needed where the run counted bytes, and the family's statuses on the step. "
            "Below: the conventions the gate caught.",
            families_table, conventions_said, across=across, profiled=True),
]
